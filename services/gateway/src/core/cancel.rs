//! Cancel: CancelTask asks the task's supervisor to cancel its turn and, when the turn does not
//! end within the grace (or the supervisor cannot be reached), ends the task CANCELED itself, so
//! a cancel never hangs — also for a task another replica follows.
//!
//! Owns: the cancel grace. Must never: undo an end a task already reached.

use std::time::Duration;

use warden_proto::v1::{CancelTurnRequest, CancelTurnResponse};

use super::live::lock;
use super::shared::{Core, store_err};
use crate::a2a::{Task, TaskState, TaskStatus};
use crate::error::A2aError;
use crate::store::TaskRecord;
use crate::time::{format_micros, now_micros};

impl Core {
    /// Asks the supervisor of `task`'s context to cancel its turn, waiting at most the cancel
    /// grace for the answer.
    async fn ask_cancel(
        &self,
        task: &Task,
    ) -> Result<
        Result<tonic::Response<CancelTurnResponse>, tonic::Status>,
        tokio::time::error::Elapsed,
    > {
        let req = CancelTurnRequest {
            context_id: task.context_id.clone(),
            turn_id: task.id.clone(),
        };
        let ask = async {
            self.supervisor_of(&task.context_id)
                .await?
                .cancel_turn(req)
                .await
        };
        tokio::time::timeout(self.settings.cancel_grace, ask).await
    }

    /// CancelTask of a task another replica follows: the supervisor is asked directly (the
    /// follower sees the turn end and writes CANCELED); when the stored task is not terminal
    /// within the grace, it is ended CANCELED here (the store keeps the first end a task
    /// reaches, so a late end from the follower cannot undo it).
    pub(super) async fn cancel_remote(
        &self,
        task: Task,
        rec: TaskRecord,
    ) -> Result<Task, A2aError> {
        match self.ask_cancel(&task).await {
            Ok(Ok(r)) => {
                tracing::info!(task_id = %task.id, outcome = %r.get_ref().outcome, "cancel requested for a task another gateway follows")
            }
            Ok(Err(status)) => {
                tracing::warn!(task_id = %task.id, error = %status, "supervisor refused or failed CancelTurn")
            }
            Err(_) => tracing::warn!(task_id = %task.id, "CancelTurn timed out"),
        }
        let deadline = tokio::time::Instant::now() + self.settings.cancel_grace;
        loop {
            if let Some((t, _)) = self.store.load(&task.id).await.map_err(store_err)?
                && t.status.state.is_terminal()
            {
                return Ok(t);
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = now_micros();
        let mut rec = rec;
        rec.task.status = TaskStatus {
            state: TaskState::Canceled,
            message: None,
            timestamp: Some(format_micros(now)),
        };
        rec.status_micros = now;
        self.store.end_if_running(&rec).await.map_err(store_err)?;
        self.store.flush().await.map_err(store_err)?;
        match self.store.load(&task.id).await.map_err(store_err)? {
            Some((t, _)) => Ok(t),
            None => Err(A2aError::TaskNotFound(task.id)),
        }
    }

    /// CancelTask: asks the supervisor to cancel the turn and returns the task once it is
    /// CANCELED. If the supervisor does not end the turn within the grace, or cannot be reached,
    /// the gateway ends the task CANCELED itself, so a cancel never hangs.
    pub async fn cancel(&self, principal: &str, id: &str) -> Result<Task, A2aError> {
        let (task, rec) = self.owned(principal, id).await?;
        let not_cancelable = |t: &Task| {
            A2aError::TaskNotCancelable(format!(
                "task {} is already {}",
                t.id,
                t.status.state.as_str()
            ))
        };
        if task.status.state.is_terminal() {
            return Err(not_cancelable(&task));
        }
        let Some(live) = self.live(id) else {
            if self.store.shared() {
                return self.cancel_remote(task, rec).await;
            }
            return Err(not_cancelable(&task));
        };
        lock(&live.inner).mapper.request_cancel();
        let reached = match self.ask_cancel(&task).await {
            Ok(Ok(r)) => {
                tracing::info!(task_id = %id, outcome = %r.get_ref().outcome, "cancel requested");
                true
            }
            Ok(Err(status)) => {
                tracing::warn!(task_id = %id, error = %status, "supervisor refused or failed CancelTurn");
                false
            }
            Err(_) => false,
        };
        if !reached || !live.terminal(self.settings.cancel_grace).await {
            let events = lock(&live.inner).mapper.force_cancel(now_micros());
            live.settle(events).await;
        }
        let snapshot = lock(&live.inner).task.clone();
        Ok(snapshot)
    }
}
