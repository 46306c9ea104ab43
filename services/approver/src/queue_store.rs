//! The approval queue's one seam: [`QueueStore`], the durable pending/answered queue, with two
//! backends — sled (`queue_sled.rs`, one approver) and PostgreSQL (`queue_pg.rs`, replicas on
//! one database). Both keep the same promises: a request is held once per supervisor request
//! id, is decided once (the first resolution wins; a later one is told the decision that
//! stands), and everything is durable before anyone is told. The types every layer shares are
//! here too.

use std::time::{SystemTime, UNIX_EPOCH};

use warden_proto::v1 as pb;
use warden_store::StoreError;

/// Queue errors.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("approval database: {0}")]
    Pg(#[from] warden_pgstate::PgError),
    #[error("stored approval {key} cannot be decoded: {source}")]
    Decode {
        key: String,
        #[source]
        source: prost::DecodeError,
    },
}

/// Why a resolution did not take effect.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no approval request with id {0:?}")]
    NotFound(String),
    #[error("already decided: {}", describe(.0))]
    AlreadyDecided(Box<pb::Approval>),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// What holding a request did.
#[derive(Debug)]
pub enum Held {
    /// Stored as given.
    New,
    /// A request with the same supervisor request id was already held (by this replica or
    /// another one, a moment earlier): this one was not stored.
    Exists(Box<pb::Approval>),
}

/// "approved by uid:1000 (alice) at <ms>: reason" — what a second operator is shown.
pub fn describe(a: &pb::Approval) -> String {
    let how = match a.state() {
        pb::ApprovalState::Pending => "pending",
        pb::ApprovalState::Approved => "approved",
        pb::ApprovalState::Denied => "denied",
        pb::ApprovalState::NoResponse => "no response before the deadline",
        pb::ApprovalState::Revoked => "revoked by the caller",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Withdrawn => "approved",
    };
    let mut s = format!("{how} by {} at {} ms", a.answered_by, a.answered_unix_ms);
    if !a.reason.is_empty() {
        s.push_str(": ");
        s.push_str(&a.reason);
    }
    if a.state() == pb::ApprovalState::Withdrawn {
        s.push_str(&format!(
            "; NOT enforced: the caller withdrew it at {} ms ({})",
            a.withdrawn_unix_ms, a.withdrawn_reason
        ));
    }
    s
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A resolution to apply.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub state: pb::ApprovalState,
    pub by: String,
    pub reason: String,
    pub rule: &'static str,
}

impl Resolution {
    /// `a` (pending) as decided by this resolution at `now`.
    pub fn apply(&self, mut a: pb::Approval, now: u64) -> pb::Approval {
        a.set_state(self.state);
        a.answered_by = self.by.clone();
        a.reason = self.reason.clone();
        a.rule = self.rule.to_string();
        a.answered_unix_ms = now.max(a.created_unix_ms);
        a
    }
}

/// `a` (approved) as withdrawn by its caller.
pub fn withdrawn(mut a: pb::Approval, reason: &str, now: u64) -> pb::Approval {
    a.set_state(pb::ApprovalState::Withdrawn);
    a.withdrawn_reason = reason.to_string();
    a.withdrawn_unix_ms = now.max(a.answered_unix_ms);
    a
}

/// The request's subject, or an empty one.
pub fn subject(a: &pb::Approval) -> pb::Subject {
    a.request
        .as_ref()
        .and_then(|r| r.subject.clone())
        .unwrap_or_default()
}

/// The shares of the queue an escalation must fit in (`[approval]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    pub total: usize,
    pub per_principal: usize,
    pub per_conversation: usize,
}

/// Why an escalation is not held: the rule and what a person reading the audit is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: &'static str,
    pub reason: String,
}

/// Whether a new escalation of `who` fits beside `pending` (every request waiting now): its
/// conversation's share, its principal's share, then the whole queue. A principal at its share
/// is refused while every other principal's requests are still held, so one caller flooding
/// the queue cannot deny another's requests a person.
pub fn admit(pending: &[pb::Approval], who: &pb::Subject, shares: Shares) -> Result<(), Refusal> {
    let mut principal = 0;
    let mut conversation = 0;
    for a in pending {
        let s = subject(a);
        if s.principal == who.principal {
            principal += 1;
            if s.context_id == who.context_id {
                conversation += 1;
            }
        }
    }
    if conversation >= shares.per_conversation {
        return Err(Refusal {
            rule: "approval.conversation-share-full",
            reason: format!(
                "this conversation already has {conversation} requests waiting for a person (approval.max_pending_per_conversation = {})",
                shares.per_conversation
            ),
        });
    }
    if principal >= shares.per_principal {
        return Err(Refusal {
            rule: "approval.principal-share-full",
            reason: format!(
                "this caller already has {principal} requests waiting for a person (approval.max_pending_per_principal = {})",
                shares.per_principal
            ),
        });
    }
    if pending.len() >= shares.total {
        return Err(Refusal {
            rule: "approval.queue-full",
            reason: format!(
                "{} requests already wait for a person (approval.max_pending)",
                pending.len()
            ),
        });
    }
    Ok(())
}

/// `pending` (newest first) in the order people are shown it: one request of each principal in
/// turn, each principal's newest first, principals in the order of their newest request. A
/// principal with a thousand requests waiting takes one place of each round, not the page.
pub fn round_robin(pending: Vec<pb::Approval>) -> Vec<pb::Approval> {
    let mut order: Vec<String> = Vec::new();
    let mut by: std::collections::HashMap<String, std::collections::VecDeque<pb::Approval>> =
        std::collections::HashMap::new();
    for a in pending {
        let p = subject(&a).principal;
        if !by.contains_key(&p) {
            order.push(p.clone());
        }
        by.entry(p).or_default().push_back(a);
    }
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for p in &order {
            if let Some(a) = by.get_mut(p).and_then(|q| q.pop_front()) {
                out.push(a);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

/// The durable queue.
#[tonic::async_trait]
pub trait QueueStore: Send + Sync {
    /// Holds a new (pending) request, durably, unless its request id is already held.
    async fn hold(&self, a: &pb::Approval) -> Result<Held, QueueError>;

    async fn get(&self, id: &str) -> Result<Option<pb::Approval>, QueueError>;

    /// The approval held for the supervisor's `request_id`, if any (a retried call).
    async fn by_request(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError>;

    /// Pending requests, newest first.
    async fn pending(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError>;

    async fn pending_count(&self) -> Result<usize, QueueError>;

    /// Decided requests, newest first.
    async fn history(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError>;

    /// Decides a pending request, durably; the first resolution wins, across replicas.
    async fn resolve(&self, id: &str, r: &Resolution) -> Result<pb::Approval, ResolveError>;

    /// An approval its caller did not act on becomes WITHDRAWN; `None` when `id` is not an
    /// approval (pending, refused, unknown).
    async fn supersede(&self, id: &str, reason: &str) -> Result<Option<pb::Approval>, QueueError>;

    /// `sled` or `postgres`.
    fn backend(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(principal: &str, context: &str, n: usize) -> Vec<pb::Approval> {
        (0..n)
            .map(|i| pb::Approval {
                id: format!("{principal}-{context}-{i}"),
                request: Some(pb::DecideRequest {
                    subject: Some(pb::Subject {
                        principal: principal.into(),
                        context_id: context.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    }

    fn who(principal: &str, context: &str) -> pb::Subject {
        pb::Subject {
            principal: principal.into(),
            context_id: context.into(),
            ..Default::default()
        }
    }

    const SHARES: Shares = Shares {
        total: 10,
        per_principal: 4,
        per_conversation: 2,
    };

    #[test]
    fn a_principal_at_its_share_is_refused_and_another_is_held() {
        let mut q = held("bob", "b1", 2);
        q.extend(held("bob", "b2", 2));
        assert_eq!(
            admit(&q, &who("bob", "b3"), SHARES).map_err(|r| r.rule),
            Err("approval.principal-share-full")
        );
        assert_eq!(admit(&q, &who("alice", "a1"), SHARES), Ok(()));
        assert_eq!(
            admit(&q, &who("bob", "b1"), SHARES).map_err(|r| r.rule),
            Err("approval.conversation-share-full")
        );
        // The same context id under another principal is another conversation.
        assert_eq!(admit(&q, &who("alice", "b1"), SHARES), Ok(()));
    }

    #[test]
    fn the_whole_queue_is_the_last_bound() {
        let mut q = Vec::new();
        for p in ["a", "b", "c", "d", "e"] {
            q.extend(held(p, "x", 2));
        }
        assert_eq!(
            admit(&q, &who("f", "x"), SHARES).map_err(|r| r.rule),
            Err("approval.queue-full")
        );
    }

    #[test]
    fn people_see_one_request_of_each_principal_in_turn() {
        let mut q = held("bob", "b", 5);
        q.extend(held("alice", "a", 1));
        q.extend(held("carol", "c", 2));
        let ids: Vec<String> = round_robin(q).into_iter().map(|a| a.id).collect();
        assert_eq!(
            ids,
            [
                "bob-b-0",
                "alice-a-0",
                "carol-c-0",
                "bob-b-1",
                "carol-c-1",
                "bob-b-2",
                "bob-b-3",
                "bob-b-4"
            ]
        );
    }
}
