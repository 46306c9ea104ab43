//! Sweep and retention: the store kept bounded (terminal tasks past the retention or beyond a
//! principal's `max_tasks` deleted, oldest first, a running task never), conversations idle past
//! the TTL closed at their supervisor, closed contexts with no task left forgotten. A task
//! started while its context is being closed waits for the close (the `closing` gates).
//!
//! Owns: when a context ends. Must never: close a conversation a task of this replica runs in,
//! or forget a context between a task's ownership check and its write.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use warden_proto::v1::CloseConversationRequest;

use super::live::{LiveTask, lock};
use super::shared::{Core, store_err};
use crate::error::A2aError;
use crate::store::{ContextRecord, TaskStoreError};
use crate::time::now_micros;

/// Idle conversations a sweep closes at the same time.
const CLOSE_CONCURRENCY: usize = 16;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub tasks_deleted: usize,
    pub conversations_closed: usize,
    pub contexts_forgotten: usize,
}

/// What `warden.CloseContext` answers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextClosed {
    pub context_id: String,
    /// Marked closed (false only when a task started in it as the close ended).
    pub closed: bool,
}

/// How long the sweep waits for the supervisor to close one conversation.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Core {
    /// Runs [`Core::sweep`] every sweep interval until `stop`.
    pub async fn sweep_forever(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.retention.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            match self.sweep(now_micros()).await {
                Ok(r) if r != SweepReport::default() => tracing::info!(
                    tasks_deleted = r.tasks_deleted,
                    conversations_closed = r.conversations_closed,
                    contexts_forgotten = r.contexts_forgotten,
                    "store swept"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the store sweep failed; retrying at the next interval")
                }
            }
        }
    }

    /// One sweep at time `now` (µs): prunes tasks, closes conversations idle past the TTL at the
    /// supervisor, and forgets contexts with no task left whose conversation is closed.
    pub async fn sweep(&self, now: i64) -> Result<SweepReport, TaskStoreError> {
        let retention = self.settings.retention;
        let cutoff = now.saturating_sub(micros(retention.task_retention));
        // Computed by the store over every replica's tasks (PostgreSQL: one query).
        let pruned = self.store.prune(cutoff, retention.max_tasks).await?;
        let remaining = pruned.contexts;
        let mut report = SweepReport {
            tasks_deleted: pruned.deleted,
            ..SweepReport::default()
        };
        let retention_micros = micros(retention.task_retention);
        let mut to_close = Vec::new();
        for (cid, rec) in self.store.contexts().await? {
            let tasks = remaining.get(&cid).copied().unwrap_or_default();
            if tasks.busy {
                continue;
            }
            let last = tasks
                .last_status_micros
                .max(rec.last_task_micros)
                .max(rec.created_micros);
            match rec.closed_micros {
                None => {
                    let ttl_passed = retention
                        .conversation_ttl
                        .is_some_and(|ttl| last.saturating_add(micros(ttl)) <= now);
                    // A context with nothing left to show is closed before it is forgotten,
                    // even with the TTL off.
                    let abandoned =
                        tasks.count == 0 && last.saturating_add(retention_micros) <= now;
                    if ttl_passed || abandoned {
                        to_close.push((cid, rec));
                    }
                }
                Some(_) if tasks.count == 0 && last.saturating_add(retention_micros) <= now => {
                    if self.forget_context(&cid, &rec).await? {
                        report.contexts_forgotten += 1;
                    }
                }
                Some(_) => {}
            }
        }
        // Closed a few at a time: one by one, a wave of contexts expiring together (each close
        // kills a tree and removes a root at the supervisor) falls behind the contexts opening.
        use futures::StreamExt;
        let mut closes = futures::stream::iter(to_close)
            .map(|(cid, rec)| async move { self.close_idle(&cid, &rec, now).await })
            .buffer_unordered(CLOSE_CONCURRENCY);
        while let Some(r) = closes.next().await {
            if r? {
                report.conversations_closed += 1;
            }
        }
        Ok(report)
    }

    /// Closes the caller's context now (`warden contexts close`, the JSON-RPC method
    /// `warden.CloseContext`): its conversation ended at the supervisor, which removes the root
    /// it owned (a `-C` copy with it), and the context marked closed, as the sweep does for an
    /// idle one. A later message in the context starts a fresh conversation. Refused while a
    /// task of it has not ended; another principal's context does not exist for the caller.
    pub async fn close_context(
        &self,
        principal: &str,
        context_id: &str,
    ) -> Result<ContextClosed, A2aError> {
        let not_found = || A2aError::TaskNotFound(format!("context {context_id}"));
        let rec = match self.store.context(context_id).await.map_err(store_err)? {
            Some(r) if r.principal == principal => r,
            _ => return Err(not_found()),
        };
        let running = |heads: &[crate::store::TaskRecord]| {
            heads
                .iter()
                .find(|h| h.task.context_id == context_id && !h.task.status.state.is_terminal())
                .map(|h| h.task.id.clone())
        };
        let heads = self.store.heads_of(principal).await.map_err(store_err)?;
        if let Some(id) = running(&heads) {
            return Err(A2aError::UnsupportedOperation(format!(
                "context {context_id} has a task that has not ended ({id}); cancel it first (CancelTask, `warden tasks` shows it)"
            )));
        }
        let Some(_held) = self.closing.begin(context_id).await else {
            // The sweep is closing it right now: closed once that ends.
            self.closing.wait(context_id).await;
            return Ok(ContextClosed {
                context_id: context_id.to_string(),
                closed: true,
            });
        };
        // Registered first, checked second (as `close_idle`): a task that started since the
        // look above is live now, or moved the record on.
        let unchanged = self
            .store
            .context(context_id)
            .await
            .map_err(store_err)?
            .is_some_and(|r| r.last_task_micros == rec.last_task_micros);
        if !unchanged || self.context_busy(context_id) {
            return Err(A2aError::UnsupportedOperation(format!(
                "a task started in context {context_id} while it was being closed; it stays open"
            )));
        }
        match self
            .close_at_supervisor(context_id, principal, "at its caller's request")
            .await
        {
            CloseOutcome::Closed | CloseOutcome::OnNoCell(_) => {}
            CloseOutcome::Failed(why) => {
                return Err(A2aError::Internal(format!(
                    "the supervisor did not close the conversation of context {context_id}: {why}"
                )));
            }
        }
        let closed = self
            .mark_closed(context_id, &rec, now_micros())
            .await
            .map_err(store_err)?;
        Ok(ContextClosed {
            context_id: context_id.to_string(),
            closed,
        })
    }

    /// Asks the context's supervisor to close its conversation (only what is `principal`'s),
    /// bounded by [`CLOSE_TIMEOUT`]: the one way for the sweep and for `warden.CloseContext`.
    async fn close_at_supervisor(
        &self,
        context_id: &str,
        principal: &str,
        why: &'static str,
    ) -> CloseOutcome {
        let req = CloseConversationRequest {
            context_id: context_id.to_string(),
            principal: principal.to_string(),
        };
        let close = async {
            self.supervisor_of(context_id)
                .await?
                .close_conversation(req)
                .await
        };
        match tokio::time::timeout(CLOSE_TIMEOUT, close).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                tracing::info!(
                    context_id,
                    why,
                    found = r.closed,
                    forced = r.forced,
                    processes = r.processes,
                    "closed a conversation"
                );
                CloseOutcome::Closed
            }
            // On a lost cell (or never placed): there is nothing to close any more.
            Ok(Err(status))
                if self.cells.get().is_some() && status.code() == tonic::Code::NotFound =>
            {
                CloseOutcome::OnNoCell(status.message().to_string())
            }
            Ok(Err(status)) => CloseOutcome::Failed(status.message().to_string()),
            Err(_) => {
                CloseOutcome::Failed(format!("no answer within {} s", CLOSE_TIMEOUT.as_secs()))
            }
        }
    }

    /// True when a task of `context_id` is being followed by this process.
    pub(super) fn context_busy(&self, context_id: &str) -> bool {
        let live: Vec<Arc<LiveTask>> = match self.live.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(_) => return true,
        };
        live.iter()
            .any(|l| lock(&l.inner).task.context_id == context_id)
    }

    /// Closes one idle context's conversation at the supervisor, unless a task started in it
    /// since `seen` was read. Returns whether it was closed (and marked so).
    pub(super) async fn close_idle(
        &self,
        context_id: &str,
        seen: &ContextRecord,
        now: i64,
    ) -> Result<bool, TaskStoreError> {
        let Some(_held) = self.closing.begin(context_id).await else {
            return Ok(false);
        };
        // Registered first, checked second: a task that started before the registration is
        // live (or has moved the record on) now; one that starts after it waits on the gate.
        let unchanged = self
            .store
            .context(context_id)
            .await?
            .is_some_and(|r| r.last_task_micros == seen.last_task_micros);
        let mut closed = false;
        if unchanged && !self.context_busy(context_id) {
            // The supervisor closes and removes only what is this principal's.
            match self
                .close_at_supervisor(context_id, &seen.principal, "idle")
                .await
            {
                CloseOutcome::Closed => {
                    closed = self.mark_closed(context_id, seen, now).await?;
                }
                CloseOutcome::OnNoCell(reason) => {
                    tracing::info!(
                        context_id,
                        reason,
                        "idle context on no live cell: forgotten without a close"
                    );
                    closed = self.mark_closed(context_id, seen, now).await?;
                }
                CloseOutcome::Failed(why) => {
                    tracing::warn!(context_id, error = %why, "the supervisor did not close an idle conversation; retrying at the next sweep");
                }
            }
        }
        Ok(closed)
    }

    /// Marks `context_id` closed at `now`, unless a task started in it since `seen` was read.
    pub(super) async fn mark_closed(
        &self,
        context_id: &str,
        seen: &ContextRecord,
        now: i64,
    ) -> Result<bool, TaskStoreError> {
        let _g = self.contexts_guard.lock().await;
        match self.store.context(context_id).await? {
            Some(mut rec) if rec.last_task_micros == seen.last_task_micros => {
                rec.closed_micros = Some(now);
                self.store.put_context(context_id, &rec).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Deletes a closed context with no task left, unless it changed since `seen` was read. Its
    /// id may then be used again, by anyone, as a new context: nothing of the old one remains.
    pub(super) async fn forget_context(
        &self,
        context_id: &str,
        seen: &ContextRecord,
    ) -> Result<bool, TaskStoreError> {
        let _g = self.contexts_guard.lock().await;
        if self.context_busy(context_id) {
            return Ok(false);
        }
        let forgotten = self.store.forget_context(context_id, seen).await?;
        if forgotten && let Some(cells) = self.cells.get().cloned() {
            let context_id = context_id.to_string();
            tokio::spawn(async move {
                if let Err(e) = cells.forget(&context_id).await {
                    tracing::warn!(context_id, error = %e, "cannot forget the context's placement");
                }
            });
        }
        Ok(forgotten)
    }
}

/// What asking a supervisor to close a conversation came to.
enum CloseOutcome {
    Closed,
    /// Its cell is gone (or it was never placed): nothing is left to close.
    OnNoCell(String),
    Failed(String),
}
