//! The pending queue as the service sees it: the durable queue ([`QueueStore`]: sled, or
//! PostgreSQL shared by replicas) plus what lives in this process — a watch per request a
//! Decide call here waits on, and the stream of changes `approvals watch` and the web page
//! follow. Everything is durable before anyone is told.
//!
//! With PostgreSQL, changes made by other replicas arrive as notifications
//! (`warden-pgstate`'s listener): a request answered on another replica wakes the Decide call
//! waiting here, and a request held there shows up in this replica's watchers. After the
//! listener reconnects (the database restarted) every request waited on here is read again, so
//! an answer whose notification was lost still arrives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{broadcast, watch};
use warden_proto::v1 as pb;
use warden_store::Store;

use crate::queue_pg::{CHANNEL, PgQueue};
use crate::queue_sled::SledQueue;
pub use crate::queue_store::{
    Held, QueueError, QueueStore, Resolution, ResolveError, describe, now_ms, subject,
};

/// The queue. One per daemon.
pub struct Queue {
    inner: Arc<Inner>,
    /// The PostgreSQL listener (stops when the queue is dropped).
    _listener: Option<warden_pgstate::listen::Listener>,
}

struct Inner {
    store: Box<dyn QueueStore>,
    /// The approver's own sled store: the queue with the sled backend, the web page's sessions
    /// with either.
    local: Store,
    /// A sender per request a Decide call in this process waits on.
    held: Mutex<HashMap<String, watch::Sender<pb::Approval>>>,
    events: broadcast::Sender<pb::Approval>,
    /// The store is shared with other replicas: its notifications, not this process, tell
    /// watchers of changes (each change once, whoever made it).
    shared: bool,
}

/// What [`Queue::hold`] did.
pub enum Holding {
    /// Held; the receiver sees its decision.
    New(watch::Receiver<pb::Approval>),
    /// The same supervisor request was already held (a replica's retry race): wait on that one.
    Exists(Box<pb::Approval>),
}

impl Queue {
    /// The sled backend: opens the queue in `store` and returns it with the requests that were
    /// pending when the previous run stopped (the caller decides which have expired).
    pub fn open(store: Store, keep: usize) -> Result<(Self, Vec<pb::Approval>), QueueError> {
        let backend = SledQueue::open(store.clone(), keep)?;
        // The sled store is ours alone: what it holds pending, this process waits on.
        let pending = backend.pending_now()?;
        let q = Self::with(Box::new(backend), store, false, None);
        {
            let mut held = q.inner.lock();
            for a in &pending {
                held.insert(a.id.clone(), watch::channel(a.clone()).0);
            }
        }
        Ok((q, pending))
    }

    /// The PostgreSQL backend (`pg` migrated): `local` still holds the web page's sessions.
    pub async fn open_pg(
        local: Store,
        pg: warden_pgstate::Pg,
        keep: usize,
    ) -> Result<(Self, Vec<pb::Approval>), QueueError> {
        let listener = warden_pgstate::listen::Listener::spawn(pg.clone(), &[CHANNEL]);
        let notes = listener.subscribe();
        let backend = PgQueue::new(pg, keep);
        // Every replica keeps the deadlines of what is pending (the first to act wins).
        let pending = backend.pending(100_000).await?;
        let q = Self::with(Box::new(backend), local, true, Some(listener));
        tokio::spawn(follow(Arc::downgrade(&q.inner), notes));
        Ok((q, pending))
    }

    fn with(
        store: Box<dyn QueueStore>,
        local: Store,
        shared: bool,
        listener: Option<warden_pgstate::listen::Listener>,
    ) -> Self {
        let (events, _) = broadcast::channel(256);
        Queue {
            inner: Arc::new(Inner {
                store,
                local,
                held: Mutex::new(HashMap::new()),
                events,
                shared,
            }),
            _listener: listener,
        }
    }

    /// The approver's store, for the web page's sessions (their own tree).
    pub fn store(&self) -> &Store {
        &self.inner.local
    }

    /// `sled` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.inner.store.backend()
    }

    /// Changes as they happen (new pending requests, decisions), from every replica.
    pub fn subscribe(&self) -> broadcast::Receiver<pb::Approval> {
        self.inner.events.subscribe()
    }

    /// How many requests wait for a person (across replicas with a shared store).
    pub async fn pending_count(&self) -> Result<usize, QueueError> {
        if self.inner.shared {
            self.inner.store.pending_count().await
        } else {
            Ok(self.inner.lock().len())
        }
    }

    /// Holds a new request: durable before this returns.
    pub async fn hold(&self, a: pb::Approval) -> Result<Holding, QueueError> {
        let (tx, rx) = watch::channel(a.clone());
        // Registered first: an answer from another replica right after the insert finds it.
        self.inner.lock().insert(a.id.clone(), tx);
        match self.inner.store.hold(&a).await {
            Ok(Held::New) => {
                if !self.inner.shared {
                    let _ = self.inner.events.send(a);
                }
                Ok(Holding::New(rx))
            }
            Ok(Held::Exists(existing)) => {
                self.inner.lock().remove(&a.id);
                Ok(Holding::Exists(existing))
            }
            Err(e) => {
                self.inner.lock().remove(&a.id);
                Err(e)
            }
        }
    }

    /// The approval held for the supervisor's `request_id`, if any (a retried call).
    pub async fn by_request(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError> {
        self.inner.store.by_request(request_id).await
    }

    /// A receiver that sees the approval's decision; `None` when it is no longer pending (or
    /// unknown). A request held by another replica (which may be gone) is waited on here too.
    pub async fn watch(
        &self,
        id: &str,
    ) -> Result<Option<watch::Receiver<pb::Approval>>, QueueError> {
        if let Some(tx) = self.inner.lock().get(id) {
            return Ok(Some(tx.subscribe()));
        }
        let Some(a) = self.inner.store.get(id).await? else {
            return Ok(None);
        };
        if a.state() != pb::ApprovalState::Pending {
            return Ok(None);
        }
        let rx = {
            let mut held = self.inner.lock();
            held.entry(id.to_string())
                .or_insert_with(|| watch::channel(a).0)
                .subscribe()
        };
        // Decided between the read and the registration: tell the receiver now.
        if let Some(now) = self.inner.store.get(id).await?
            && now.state() != pb::ApprovalState::Pending
        {
            self.inner.decided(&now);
        }
        Ok(Some(rx))
    }

    pub async fn get(&self, id: &str) -> Result<Option<pb::Approval>, QueueError> {
        self.inner.store.get(id).await
    }

    /// Pending requests, newest first.
    pub async fn pending(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        self.inner.store.pending(limit).await
    }

    /// Decided requests, newest first.
    pub async fn history(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        self.inner.store.history(limit).await
    }

    /// Decides a pending request. The record is durable before the waiting caller (and anyone
    /// watching) is told; the first resolution wins, across replicas.
    pub async fn resolve(&self, id: &str, r: Resolution) -> Result<pb::Approval, ResolveError> {
        let a = self.inner.store.resolve(id, &r).await?;
        self.inner.decided(&a);
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
        if !self.inner.shared {
            let _ = self.inner.events.send(a.clone());
        }
        Ok(a)
    }

    /// The caller did not act on an approval (`PolicyService.Withdraw` after the answer): the
    /// record is changed to WITHDRAWN, keeping who approved, so history says what was enforced.
    /// `Ok(None)` when the request is not an approval (pending, refused, or unknown).
    pub async fn supersede(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<Option<pb::Approval>, QueueError> {
        let Some(a) = self.inner.store.supersede(id, reason).await? else {
            return Ok(None);
        };
        tracing::warn!(
            decision_id = %a.id,
            context_id = %subject(&a).context_id,
            task_id = %subject(&a).task_id,
            answered_by = %a.answered_by,
            reason = %reason,
            "an approval was not acted on by the caller: recorded as withdrawn"
        );
        if !self.inner.shared {
            let _ = self.inner.events.send(a.clone());
        }
        Ok(Some(a))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<pb::Approval>>> {
        // The map holds senders only; a panic elsewhere cannot leave one half-written.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells whoever here waits on `a` (decided) and forgets it.
    fn decided(&self, a: &pb::Approval) {
        if let Some(tx) = self.lock().remove(&a.id) {
            tx.send_replace(a.clone());
        }
    }
}

/// Follows the database's notifications: each changed approval is read and told to the
/// Decide call waiting on it here (if any) and to every watcher; after a reconnection, every
/// request waited on here is read again.
async fn follow(inner: Weak<Inner>, mut notes: broadcast::Receiver<warden_pgstate::listen::Note>) {
    use warden_pgstate::listen::Note;
    loop {
        let note = match notes.recv().await {
            Ok(n) => n,
            // Fell behind: read everything waited on again.
            Err(broadcast::error::RecvError::Lagged(_)) => Note::Resync,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let Some(inner) = inner.upgrade() else { return };
        match note {
            Note::Notify { payload: id, .. } => match inner.store.get(&id).await {
                Ok(Some(a)) => {
                    if a.state() != pb::ApprovalState::Pending {
                        inner.decided(&a);
                    }
                    let _ = inner.events.send(a);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(decision_id = %id, error = %e, "cannot read a changed approval")
                }
            },
            Note::Resync => {
                let ids: Vec<String> = inner.lock().keys().cloned().collect();
                for id in ids {
                    match inner.store.get(&id).await {
                        Ok(Some(a)) if a.state() != pb::ApprovalState::Pending => {
                            inner.decided(&a);
                            let _ = inner.events.send(a);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(decision_id = %id, error = %e, "cannot read an approval again")
                        }
                    }
                }
            }
        }
    }
}
