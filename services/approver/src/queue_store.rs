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
