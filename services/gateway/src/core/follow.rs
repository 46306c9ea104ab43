//! Follow and take over: SubscribeToTask; a task another replica follows, followed through the
//! store ([`follow`]); and the leases — with a store shared by replicas, each task's follower
//! renews its lease every third of one ([`Core::leases_forever`]) and takes over the tasks whose
//! follower stopped, through the supervisor's `AttachTurn` ([`Core::take_over`]); at start,
//! [`Core::recover`].
//!
//! Owns: leases, takeover and recovery. Must never: follow a task another replica holds the
//! lease of, or write a task twice over (a takeover replaces what the stopped follower wrote).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use warden_proto::v1::CancelTurnRequest;

use super::live::{DEFAULT_KEEPALIVE, LiveTask, SUBSCRIBER_BUFFER, SharedEvent, Subscription};
use super::shared::Core;
use crate::a2a::{PartContent, StreamResponse, Task};
use crate::error::A2aError;
use crate::mapping::TurnMapper;
use crate::store::{TaskRecord, TaskStore, TaskStoreError};

/// How long a takeover waits for the supervisor to answer `AttachTurn`.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);

impl Core {
    /// SubscribeToTask. A task followed by another replica (a shared store) is followed here
    /// through the store ([`follow`]).
    pub async fn subscribe(&self, principal: &str, id: &str) -> Result<Subscription, A2aError> {
        let (task, _) = self.owned(principal, id).await?;
        if task.status.state.is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {id} is in terminal state {}; it cannot be subscribed to",
                task.status.state.as_str()
            )));
        }
        let permit = self.streams.open(principal)?;
        let sub = match self.live(id) {
            Some(live) => live.subscribe(),
            None if self.store.shared() => follow(self.store.clone(), task),
            None => Subscription {
                task,
                events: None,
                permit: None,
                keepalive: DEFAULT_KEEPALIVE,
            },
        };
        Ok(self.held(sub, permit))
    }

    /// With a store shared by replicas: renews this replica's lease on every task it follows,
    /// and takes over the tasks whose follower's lease ran out (a replica that died), every
    /// third of a lease, until `stop`. Nothing to do for sled (one gateway; its restart
    /// recovers).
    pub async fn leases_forever(self: Arc<Self>, stop: CancellationToken) {
        if !self.store.shared() {
            return;
        }
        let mut tick = tokio::time::interval(crate::store_pg::LEASE / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let ids: Vec<String> = self
                .live
                .lock()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            match self.store.renew_leases(&ids).await {
                Ok(lost) => {
                    for id in lost {
                        // Another replica follows it now (this one could not renew its lease
                        // in time); its writes from here are ignored, and it is read from the
                        // store.
                        tracing::warn!(task_id = %id, "another gateway took over a task this one followed");
                        if let Ok(mut m) = self.live.lock() {
                            m.remove(&id);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, tasks = ids.len(), "cannot renew the leases of the tasks this gateway follows")
                }
            }
            match self.take_over_orphans().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(tasks = n, "taking over tasks whose gateway stopped"),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for tasks left by a stopped gateway")
                }
            }
        }
    }

    /// Marks tasks a previous process left running as FAILED and asks the supervisor to cancel
    /// their turns (best effort: the supervisor may be down or the turn long over).
    pub async fn recover(self: &Arc<Self>) -> Result<usize, TaskStoreError> {
        if self.store.shared() {
            return self.take_over_orphans().await;
        }
        let changed = self.store.recover().await?;
        let n = changed.len();
        for rec in changed {
            tracing::warn!(task_id = %rec.task.id, context_id = %rec.task.context_id, "task was running when the gateway stopped; marked FAILED");
            let me = self.clone();
            tokio::spawn(async move {
                let Ok(mut client) = me.supervisor_of(&rec.task.context_id).await else {
                    return;
                };
                let req = CancelTurnRequest {
                    context_id: rec.task.context_id.clone(),
                    turn_id: rec.task.id.clone(),
                };
                if let Ok(Ok(r)) =
                    tokio::time::timeout(Duration::from_secs(5), client.cancel_turn(req)).await
                {
                    tracing::info!(task_id = %rec.task.id, outcome = %r.into_inner().outcome, "cancelled the orphaned turn");
                }
            });
        }
        Ok(n)
    }

    /// With replicas on one database: takes over every task whose follower stopped (its lease
    /// ran out) and that this replica claims first ([`Core::take_over`]). Returns how many.
    pub(super) async fn take_over_orphans(self: &Arc<Self>) -> Result<usize, TaskStoreError> {
        let mut n = 0;
        for rec in self.store.orphans().await? {
            if !self.store.claim_orphan(&rec.task.id).await? {
                continue;
            }
            n += 1;
            let core = self.clone();
            let span = tracing::info_span!("task", task_id = %rec.task.id);
            tokio::spawn(tracing::Instrument::instrument(core.take_over(rec), span));
        }
        Ok(n)
    }

    /// Follows a task whose gateway stopped: its turn is attached to at the supervisor
    /// (`AttachTurn`, from its first event: the turn never depended on its RunTurn stream), and
    /// the task is written again from those events, as its own follower would have (what the
    /// stopped replica had written of them is replaced, so nothing is doubled). A turn the
    /// supervisor no longer has ends the task FAILED, saying why.
    pub(super) async fn take_over(self: Arc<Self>, rec: TaskRecord) {
        let id = rec.task.id.clone();
        let context_id = rec.task.context_id.clone();
        let attach = warden_proto::v1::AttachTurnRequest {
            context_id: context_id.clone(),
            turn_id: id.clone(),
            principal: rec.principal.clone(),
            after_seq: 0,
        };
        // The context's own supervisor: in `[cells]` mode its cell (a lost cell's turn cannot
        // be followed any more, and ends FAILED below).
        let attached = async {
            let routed = self
                .route(&context_id, None)
                .await
                .map_err(|f| tonic::Status::unavailable(f.message))?;
            let r = routed.client.clone().attach_turn(attach).await?;
            Ok::<_, tonic::Status>(routed.events(r.into_inner()))
        };
        let stream = match tokio::time::timeout(ATTACH_TIMEOUT, attached).await {
            Ok(Ok(events)) => events,
            outcome => {
                let why = match outcome {
                    Ok(Err(status)) => format!(
                        "the gateway following it stopped, and its turn cannot be followed ({})",
                        status.message()
                    ),
                    _ => "the gateway following it stopped, and the supervisor did not answer"
                        .to_string(),
                };
                tracing::warn!(task_id = %id, reason = %why, "cannot take over a task");
                match self.store.fail_task(rec, &why).await {
                    Ok(_) => {}
                    Err(e) => tracing::error!(task_id = %id, error = %e, "cannot end a task"),
                }
                return;
            }
        };
        let task = match self.store.load(&id).await {
            Ok(Some((task, _))) => task,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(task_id = %id, error = %e, "cannot read a task to take over");
                return;
            }
        };
        if let Err(e) = self.store.reset_progress(&id).await {
            tracing::error!(task_id = %id, error = %e, "cannot take over a task");
            return;
        }
        let mut head = task;
        head.history.truncate(1);
        head.artifacts.clear();
        let live = Arc::new(LiveTask::new(
            head,
            rec,
            TurnMapper::new(&id, &context_id).with_coalesce_bytes(self.settings.coalesce_bytes),
            self.store.clone(),
            self.push().cloned(),
        ));
        if let Ok(mut m) = self.live.lock() {
            m.insert(id.clone(), live.clone());
        }
        tracing::info!(task_id = %id, context_id = %context_id, "took over a task whose gateway stopped");
        self.follow_turn(live, stream).await;
    }
}

/// How often a follower reads its task again without a note (a note lost, or none sent).
pub(super) const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// A subscription to a task another replica follows: the stored task now, then the changes
/// the follower writes, read again on each of the store's notes about the task (PostgreSQL's
/// NOTIFY, sent by the write's own statement) and every [`FOLLOW_POLL`] at the latest.
pub(super) fn follow(store: TaskStore, task: Task) -> Subscription {
    let (tx, rx) = broadcast::channel(SUBSCRIBER_BUFFER);
    let changes = store.changes();
    tokio::spawn(follow_loop(store, changes, task.clone(), tx));
    Subscription {
        task,
        events: Some(rx),
        permit: None,
        keepalive: DEFAULT_KEEPALIVE,
    }
}

/// Waits for a note about `id` ("" says anything may have changed).
pub(super) async fn note_about(changes: &mut Option<broadcast::Receiver<String>>, id: &str) {
    let Some(rx) = changes else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(t) if t == id || t.is_empty() => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => {
                *changes = None;
                return std::future::pending().await;
            }
        }
    }
}

async fn follow_loop(
    store: TaskStore,
    mut changes: Option<broadcast::Receiver<String>>,
    mut seen: Task,
    tx: broadcast::Sender<SharedEvent>,
) {
    let mut tick = tokio::time::interval(FOLLOW_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The first tick is at once: what changed before the note listener was there is read.
        tokio::select! {
            _ = tick.tick() => {}
            _ = note_about(&mut changes, &seen.id) => {}
        }
        if tx.receiver_count() == 0 {
            return;
        }
        let now = match store.load(&seen.id).await {
            Ok(Some((t, _))) => t,
            Ok(None) => {
                // Deleted (retention) under the subscriber: nothing more will come.
                return;
            }
            Err(e) => {
                tracing::warn!(task_id = %seen.id, error = %e, "cannot read a followed task; retrying");
                continue;
            }
        };
        for ev in task_changes(&seen, &now) {
            let _ = tx.send(Arc::new(ev));
        }
        seen = now;
        if seen.status.state.is_terminal() {
            return;
        }
    }
}

/// The events that take a subscriber from `old` to `new`: each artifact that grew (the new
/// parts appended) or changed (replaced), then the status when it changed.
fn task_changes(old: &Task, new: &Task) -> Vec<StreamResponse> {
    use crate::a2a::{TaskArtifactUpdateEvent, TaskStatusUpdateEvent};
    let mut out = Vec::new();
    for (i, art) in new.artifacts.iter().enumerate() {
        let before = old.artifacts.get(i);
        if before == Some(art) {
            continue;
        }
        let (artifact, append) = match before.and_then(|b| appended(b, art)) {
            Some(parts) => (
                crate::a2a::Artifact {
                    parts,
                    ..art.clone()
                },
                true,
            ),
            None => (art.clone(), false),
        };
        out.push(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: new.id.clone(),
            context_id: new.context_id.clone(),
            artifact,
            append,
            last_chunk: false,
            metadata: None,
        }));
    }
    if new.status != old.status {
        out.push(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: new.id.clone(),
            context_id: new.context_id.clone(),
            status: new.status.clone(),
            metadata: None,
        }));
    }
    out
}

/// The parts that, appended to `old`'s, make `new`'s (text joined as the store joins it);
/// `None` when `new` is not `old` grown.
fn appended(
    old: &crate::a2a::Artifact,
    new: &crate::a2a::Artifact,
) -> Option<Vec<crate::a2a::Part>> {
    if old.artifact_id != new.artifact_id || new.parts.len() < old.parts.len() {
        return None;
    }
    let mut extra = Vec::new();
    for (i, p) in new.parts.iter().enumerate() {
        match old.parts.get(i) {
            Some(o) if o == p => {}
            // The last old part is a text the new one continues.
            Some(o) if i + 1 == old.parts.len() => match (&o.content, &p.content) {
                (PartContent::Text(a), PartContent::Text(b))
                    if b.starts_with(a.as_str()) && o.metadata == p.metadata =>
                {
                    extra.push(crate::a2a::Part::text(&b[a.len()..]));
                }
                _ => return None,
            },
            Some(_) => return None,
            None => extra.push(p.clone()),
        }
    }
    Some(extra)
}
