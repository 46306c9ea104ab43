//! The pending queue and the approver's audit: every held request and every decision about it,
//! in the approver's own sled store (`warden-store`), written and flushed before anyone is told.
//!
//! A request is held once (keyed by its approval id, indexed by the supervisor's request id so a
//! caller that retries after a restart finds it again) and decided once: the first resolution
//! wins, later ones get [`ResolveError::AlreadyDecided`] with the decision that stands.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use tokio::sync::{broadcast, watch};
use warden_proto::v1 as pb;
use warden_store::{Batch, Store, StoreError, Tree};

/// Queue errors.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error(transparent)]
    Store(#[from] StoreError),
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

struct Held {
    tx: watch::Sender<pb::Approval>,
}

/// The queue. One per daemon.
pub struct Queue {
    store: Store,
    approvals: Tree,
    requests: Tree,
    history: Tree,
    held: Mutex<HashMap<String, Held>>,
    events: broadcast::Sender<pb::Approval>,
    keep: usize,
}

fn history_key(a: &pb::Approval) -> Vec<u8> {
    let mut k = a.answered_unix_ms.to_be_bytes().to_vec();
    k.extend_from_slice(a.id.as_bytes());
    k
}

impl Queue {
    /// Opens the queue and returns it with the requests that were pending when the previous run
    /// stopped (the caller decides which have expired).
    /// The approver's store, for the web page's sessions (their own tree).
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn open(store: Store, keep: usize) -> Result<(Self, Vec<pb::Approval>), QueueError> {
        let approvals = store.tree("approvals")?;
        let requests = store.tree("requests")?;
        let history = store.tree("history")?;
        let (events, _) = broadcast::channel(256);
        let q = Queue {
            store,
            approvals,
            requests,
            history,
            held: Mutex::new(HashMap::new()),
            events,
            keep,
        };
        let mut pending = Vec::new();
        for (k, v) in q.approvals.scan_prefix([])? {
            let a = decode(&k, &v)?;
            if a.state() == pb::ApprovalState::Pending {
                pending.push(a);
            }
        }
        {
            let mut held = q.lock();
            for a in &pending {
                let (tx, _) = watch::channel(a.clone());
                held.insert(a.id.clone(), Held { tx });
            }
        }
        Ok((q, pending))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        // The map holds senders only; a panic elsewhere cannot leave one half-written.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes as they happen (new pending requests, decisions).
    pub fn subscribe(&self) -> broadcast::Receiver<pb::Approval> {
        self.events.subscribe()
    }

    /// How many requests are held.
    pub fn pending_count(&self) -> usize {
        self.lock().len()
    }

    /// Holds a new request: written and flushed before this returns.
    pub fn hold(&self, a: pb::Approval) -> Result<watch::Receiver<pb::Approval>, QueueError> {
        let request_id = a.request.as_ref().map(|r| r.request_id.clone());
        let (tx, rx) = watch::channel(a.clone());
        {
            let mut held = self.lock();
            self.approvals.put(a.id.as_bytes(), a.encode_to_vec())?;
            if let Some(r) = request_id.filter(|r| !r.is_empty()) {
                self.requests.put(r.as_bytes(), a.id.as_bytes())?;
            }
            self.store.flush()?;
            held.insert(a.id.clone(), Held { tx });
        }
        let _ = self.events.send(a);
        Ok(rx)
    }

    /// The approval held for the supervisor's `request_id`, if any (a retried call).
    pub fn by_request(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError> {
        if request_id.is_empty() {
            return Ok(None);
        }
        match self.requests.get(request_id.as_bytes())? {
            Some(id) => self.get(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// A receiver that sees the approval's decision; `None` when it is no longer pending.
    pub fn watch(&self, id: &str) -> Option<watch::Receiver<pb::Approval>> {
        self.lock().get(id).map(|h| h.tx.subscribe())
    }

    pub fn get(&self, id: &str) -> Result<Option<pb::Approval>, QueueError> {
        match self.approvals.get(id.as_bytes())? {
            Some(v) => Ok(Some(decode(id.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    /// Pending requests, newest first.
    pub fn pending(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(a) = self.get(&id)?
                && a.state() == pb::ApprovalState::Pending
            {
                out.push(a);
            }
        }
        out.sort_by_key(|a| std::cmp::Reverse(a.created_unix_ms));
        out.truncate(limit);
        Ok(out)
    }

    /// Decided requests, newest first.
    pub fn history(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let mut out = Vec::new();
        for (_, id) in self.history.scan_rev(limit)? {
            if let Some(a) = self.get(&String::from_utf8_lossy(&id))? {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Decides a pending request. The record is written and flushed before the waiting caller
    /// (and anyone watching) is told; the first resolution wins.
    pub fn resolve(&self, id: &str, r: Resolution) -> Result<pb::Approval, ResolveError> {
        let mut held = self.lock();
        let Some(mut a) = self.get(id)? else {
            return Err(ResolveError::NotFound(id.to_string()));
        };
        if a.state() != pb::ApprovalState::Pending {
            return Err(ResolveError::AlreadyDecided(Box::new(a)));
        }
        a.set_state(r.state);
        a.answered_by = r.by;
        a.reason = r.reason;
        a.rule = r.rule.to_string();
        a.answered_unix_ms = now_ms().max(a.created_unix_ms);
        let mut batch = Batch::default();
        batch.put(a.id.as_bytes(), a.encode_to_vec());
        self.approvals.apply(batch).map_err(QueueError::from)?;
        self.history
            .put(history_key(&a), a.id.as_bytes())
            .map_err(QueueError::from)?;
        self.store.flush().map_err(QueueError::from)?;
        if let Some(h) = held.remove(id) {
            h.tx.send_replace(a.clone());
        }
        drop(held);
        self.trim();
        tracing::info!(
            decision_id = %a.id,
            request_id = %a.request.as_ref().map(|r| r.request_id.as_str()).unwrap_or(""),
            context_id = %subject(&a).context_id,
            task_id = %subject(&a).task_id,
            rule = %a.rule,
            answered_by = %a.answered_by,
            time_to_decide_ms = a.answered_unix_ms.saturating_sub(a.created_unix_ms),
            reason = %a.reason,
            "approval decided"
        );
        let _ = self.events.send(a.clone());
        Ok(a)
    }

    /// The caller did not act on an approval (`PolicyService.Withdraw` after the answer): the
    /// record is changed to WITHDRAWN, keeping who approved, so history says what was enforced.
    /// `Ok(None)` when the request is not an approval (pending, refused, or unknown): nothing to
    /// supersede.
    pub fn supersede(&self, id: &str, reason: &str) -> Result<Option<pb::Approval>, QueueError> {
        let held = self.lock();
        let Some(mut a) = self.get(id)? else {
            return Ok(None);
        };
        if a.state() != pb::ApprovalState::Approved {
            return Ok(None);
        }
        a.set_state(pb::ApprovalState::Withdrawn);
        a.withdrawn_reason = reason.to_string();
        a.withdrawn_unix_ms = now_ms().max(a.answered_unix_ms);
        self.approvals.put(a.id.as_bytes(), a.encode_to_vec())?;
        self.store.flush()?;
        drop(held);
        tracing::warn!(
            decision_id = %a.id,
            context_id = %subject(&a).context_id,
            task_id = %subject(&a).task_id,
            answered_by = %a.answered_by,
            reason = %reason,
            "an approval was not acted on by the caller: recorded as withdrawn"
        );
        let _ = self.events.send(a.clone());
        Ok(Some(a))
    }

    /// Drops the oldest decided requests beyond `keep`.
    fn trim(&self) {
        let over = self.history.len().saturating_sub(self.keep);
        if over == 0 {
            return;
        }
        let Ok(oldest) = self.history.scan_prefix([]) else {
            return;
        };
        for (k, id) in oldest.into_iter().take(over) {
            if let Ok(Some(a)) = self.get(&String::from_utf8_lossy(&id))
                && let Some(r) = a.request.as_ref()
            {
                let _ = self.requests.delete(r.request_id.as_bytes());
            }
            let _ = self.approvals.delete(&id);
            let _ = self.history.delete(&k);
        }
    }
}

/// The request's subject, or an empty one.
pub fn subject(a: &pb::Approval) -> pb::Subject {
    a.request
        .as_ref()
        .and_then(|r| r.subject.clone())
        .unwrap_or_default()
}

fn decode(key: &[u8], v: &[u8]) -> Result<pb::Approval, QueueError> {
    pb::Approval::decode(v).map_err(|source| QueueError::Decode {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(id: &str, request_id: &str) -> pb::Approval {
        pb::Approval {
            id: id.into(),
            request: Some(pb::DecideRequest {
                request_id: request_id.into(),
                ..Default::default()
            }),
            created_unix_ms: now_ms(),
            deadline_unix_ms: now_ms() + 60_000,
            ..Default::default()
        }
    }

    fn res(state: pb::ApprovalState, by: &str) -> Resolution {
        Resolution {
            state,
            by: by.into(),
            reason: "because".into(),
            rule: "approval.test",
        }
    }

    #[test]
    fn first_answer_wins_and_pending_survives_reopen() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let (q, pending) = Queue::open(Store::open(dir.path())?, 10)?;
            assert!(pending.is_empty());
            let mut rx = q.hold(approval("a1", "r1"))?;
            q.hold(approval("a2", "r2"))?;
            let got = q.resolve("a1", res(pb::ApprovalState::Approved, "alice"))?;
            assert_eq!(got.answered_by, "alice");
            assert_eq!(rx.borrow_and_update().state(), pb::ApprovalState::Approved);
            match q.resolve("a1", res(pb::ApprovalState::Denied, "bob")) {
                Err(ResolveError::AlreadyDecided(a)) => {
                    assert_eq!(a.answered_by, "alice");
                    assert!(describe(&a).contains("approved by alice"));
                }
                other => panic!("second answer: {other:?}"),
            }
            assert!(matches!(
                q.resolve("nope", res(pb::ApprovalState::Denied, "bob")),
                Err(ResolveError::NotFound(_))
            ));
        }
        let (q, pending) = Queue::open(Store::open(dir.path())?, 10)?;
        assert_eq!(
            pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            ["a2"]
        );
        assert_eq!(q.by_request("r2")?.map(|a| a.id), Some("a2".to_string()));
        assert_eq!(q.history(10)?.len(), 1);
        assert!(q.watch("a2").is_some());
        Ok(())
    }

    #[test]
    fn an_approval_the_caller_did_not_act_on_is_recorded_as_withdrawn()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let (q, _) = Queue::open(Store::open(dir.path())?, 10)?;
            q.hold(approval("a1", "r1"))?;
            // Pending, refused and unknown requests have no approval to supersede.
            assert_eq!(q.supersede("a1", "gave up")?, None);
            assert_eq!(q.supersede("nope", "gave up")?, None);
            q.resolve("a1", res(pb::ApprovalState::Approved, "alice"))?;
            let w = q
                .supersede("a1", "turn cancelled")?
                .ok_or("not superseded")?;
            assert_eq!(w.state(), pb::ApprovalState::Withdrawn);
            assert_eq!(w.answered_by, "alice", "who approved is kept");
            assert_eq!(w.withdrawn_reason, "turn cancelled");
            assert!(describe(&w).contains("NOT enforced"), "{}", describe(&w));
            // Idempotent, and a late answer still finds it decided.
            assert_eq!(q.supersede("a1", "again")?, None);
            assert!(matches!(
                q.resolve("a1", res(pb::ApprovalState::Denied, "bob")),
                Err(ResolveError::AlreadyDecided(_))
            ));
            q.hold(approval("a2", "r2"))?;
            q.resolve("a2", res(pb::ApprovalState::Denied, "bob"))?;
            assert_eq!(q.supersede("a2", "gave up")?, None);
        }
        // History (after a reopen) shows what was enforced.
        let (q, _) = Queue::open(Store::open(dir.path())?, 10)?;
        let h = q.history(10)?;
        let a1 = h.iter().find(|a| a.id == "a1").ok_or("a1 not in history")?;
        assert_eq!(a1.state(), pb::ApprovalState::Withdrawn);
        assert_eq!(h.len(), 2);
        Ok(())
    }

    #[test]
    fn history_is_bounded() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (q, _) = Queue::open(Store::open(dir.path())?, 2)?;
        for i in 0..4 {
            let id = format!("a{i}");
            q.hold(approval(&id, &format!("r{i}")))?;
            q.resolve(&id, res(pb::ApprovalState::Denied, "x"))?;
        }
        assert_eq!(q.history(10)?.len(), 2);
        assert_eq!(q.get("a0")?, None);
        assert_eq!(q.by_request("r0")?, None);
        Ok(())
    }
}
