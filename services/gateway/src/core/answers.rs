//! Answers: a message on an INPUT_REQUIRED task is the answer to its agent's question, delivered
//! to the supervisor here when this replica follows the task, or held in the shared store for
//! the replica that does ([`Core::answers_forever`] delivers the ones held for this one).
//!
//! Owns: taking a question for an answer, once, and the answer's content. Must never: answer a
//! permission (only an agent's question is ever INPUT_REQUIRED).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use warden_proto::v1::AnswerQuestionRequest;

use super::admit::{Answered, SendOutcome};
use super::follow::{FOLLOW_POLL, follow, note_about};
use super::live::{LiveTask, lock};
use super::read::apply_history_length;
use super::shared::{Core, store_err};
use crate::a2a::{Message, PartContent, SendMessageRequest, Task, TaskState};
use crate::error::A2aError;
use crate::mapping::META_KEY;
use crate::time::now_micros;

/// How long an answer held for another replica waits for it to be delivered.
const ANSWER_FORWARD_WAIT: Duration = Duration::from_secs(20);

impl Core {
    /// A message on an existing task: only an INPUT_REQUIRED task takes one (it is the answer).
    /// A task another replica follows gets it through the database: held there, delivered by
    /// its follower ([`Core::answers_forever`]), and its outcome waited for.
    pub(super) async fn answer(
        &self,
        principal: &str,
        task_id: &str,
        req: &SendMessageRequest,
    ) -> Result<Answered, A2aError> {
        if self.live(task_id).is_some() || !self.store.shared() {
            return self
                .answer_here(principal, task_id, req)
                .await
                .map(Answered::Here);
        }
        let (task, _) = self.owned(principal, task_id).await?;
        if let Some(ctx) = req.message.context_id.as_deref().filter(|c| !c.is_empty())
            && ctx != task.context_id
        {
            return Err(A2aError::InvalidParams(format!(
                "message.contextId {ctx:?} does not match task {task_id}'s context"
            )));
        }
        if task.status.state != TaskState::InputRequired {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is {} and not waiting for input",
                task.status.state.as_str()
            )));
        }
        let request = serde_json::to_vec(req)
            .map_err(|e| A2aError::Internal(format!("cannot hold the answer: {e}")))?;
        let mut notes = self.store.changes();
        let Some(id) = self
            .store
            .forward_answer(task_id, &request)
            .await
            .map_err(store_err)?
        else {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is not waiting for input"
            )));
        };
        let deadline = tokio::time::Instant::now() + ANSWER_FORWARD_WAIT;
        loop {
            match self.store.answer_outcome(&id).await.map_err(store_err)? {
                Some(Ok(())) => break,
                Some(Err(refusal)) => return Err(A2aError::UnsupportedOperation(refusal)),
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(A2aError::Internal(format!(
                    "the gateway following task {task_id} did not deliver the answer within {ANSWER_FORWARD_WAIT:?}"
                )));
            }
            let _ = tokio::time::timeout(
                Duration::from_millis(100),
                note_about(&mut notes, crate::store_pg::ANSWER_NOTE),
            )
            .await;
        }
        let (task, _) = self.owned(principal, task_id).await?;
        Ok(Answered::Elsewhere(Box::new(task)))
    }

    /// The rest of a SendMessage whose answer another replica delivered: the task followed
    /// through the store, as SubscribeToTask does, or waited for until it settles.
    pub(super) async fn answered_elsewhere(
        &self,
        task: Task,
        permit: Option<crate::shares::StreamPermit>,
        return_immediately: bool,
        history_length: Option<i32>,
    ) -> Result<SendOutcome, A2aError> {
        if let Some(permit) = permit {
            let sub = follow(self.store.clone(), task);
            return Ok(SendOutcome::Stream(Box::new(self.held(sub, permit))));
        }
        let mut task = task;
        if !return_immediately {
            let mut notes = self.store.changes();
            let answered_at = task.status.timestamp.clone();
            loop {
                let settled = task.status.state.is_terminal()
                    || (task.status.state.is_interrupted() && task.status.timestamp != answered_at);
                if settled {
                    break;
                }
                let _ = tokio::time::timeout(FOLLOW_POLL, note_about(&mut notes, &task.id)).await;
                if let Some((t, _)) = self.store.load(&task.id).await.map_err(store_err)? {
                    task = t;
                }
            }
        }
        apply_history_length(&mut task, history_length)?;
        Ok(SendOutcome::Task(Box::new(task)))
    }

    /// With a store shared by replicas: delivers the answers other replicas hold for the tasks
    /// this one follows (woken by their note, and every second), and records what each did.
    pub async fn answers_forever(self: Arc<Self>, stop: CancellationToken) {
        let mut notes = self.store.changes();
        if notes.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = note_about(&mut notes, crate::store_pg::ANSWER_NOTE) => {}
                _ = stop.cancelled() => return,
            }
            let held = match self.store.answers_to_deliver().await {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the answers held for this gateway's tasks");
                    continue;
                }
            };
            for (id, task_id, request) in held {
                // Only a task followed here (one being taken over is delivered next time).
                if self.live(&task_id).is_none() {
                    continue;
                }
                let outcome = match serde_json::from_slice::<SendMessageRequest>(&request) {
                    Err(e) => Err(format!("the held answer cannot be read: {e}")),
                    Ok(req) => {
                        let principal = match self.store.head(&task_id).await {
                            Ok(Some(h)) => h.principal,
                            _ => continue,
                        };
                        match self.answer_here(&principal, &task_id, &req).await {
                            Ok(live) => {
                                // Written before the answering replica reads the task again.
                                let _ = live.sync().await;
                                Ok(())
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    }
                };
                tracing::info!(task_id = %task_id, answer_id = %id, delivered = outcome.is_ok(), "delivered an answer held by another gateway");
                if let Err(e) = self.store.set_answer_outcome(&id, outcome).await {
                    tracing::warn!(task_id = %task_id, error = %e, "cannot record an answer's outcome");
                }
            }
        }
    }

    /// [`Core::answer`] on a task this replica follows.
    pub(super) async fn answer_here(
        &self,
        principal: &str,
        task_id: &str,
        req: &SendMessageRequest,
    ) -> Result<Arc<LiveTask>, A2aError> {
        let (task, _) = self.owned(principal, task_id).await?;
        if let Some(ctx) = req.message.context_id.as_deref().filter(|c| !c.is_empty())
            && ctx != task.context_id
        {
            return Err(A2aError::InvalidParams(format!(
                "message.contextId {ctx:?} does not match task {task_id}'s context"
            )));
        }
        if task.status.state.is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is in terminal state {}; send a new message without taskId",
                task.status.state.as_str()
            )));
        }
        let live = self.live(task_id).ok_or_else(|| {
            A2aError::UnsupportedOperation(format!("task {task_id} is not waiting for input"))
        })?;
        let question_id = live.take_question().await.map_err(|state| {
            A2aError::UnsupportedOperation(format!(
                "task {task_id} is {} and not waiting for input; wait for it or cancel it",
                state.as_str()
            ))
        })?;
        let (action, content_json) = answer_content(&req.message);
        let result = async {
            self.supervisor_of(&task.context_id)
                .await?
                .answer_question(AnswerQuestionRequest {
                    context_id: task.context_id.clone(),
                    turn_id: task_id.to_string(),
                    question_id,
                    action,
                    content_json,
                    message_id: req.message.message_id.clone(),
                })
                .await
        }
        .await;
        let mut inner = lock(&live.inner);
        inner.answering = false;
        match result {
            Ok(r) if r.get_ref().delivered => {
                let mut m = req.message.clone();
                m.task_id = Some(task_id.to_string());
                m.context_id = Some(task.context_id.clone());
                inner.push_history(m);
                let events = inner.mapper.question_answered(now_micros());
                live.apply(&mut inner, events);
                // The turn may stay quiet a long time now: the answer is stored at once.
                live.writes.write_pending(&mut inner);
                drop(inner);
                Ok(live)
            }
            Ok(_) => Err(A2aError::UnsupportedOperation(format!(
                "the agent no longer waits for an answer on task {task_id}"
            ))),
            Err(status) => Err(A2aError::Internal(format!(
                "the supervisor could not deliver the answer: {}",
                status.message()
            ))),
        }
    }
}

/// The ACP elicitation answer for a caller's message: a data part is the answer object; text is
/// sent as a JSON string. `metadata.warden.action` may say `decline` or `cancel`.
fn answer_content(m: &Message) -> (String, String) {
    let action = m
        .metadata
        .as_ref()
        .and_then(|md| md.get(META_KEY))
        .and_then(|w| w.get("action"))
        .and_then(|a| a.as_str())
        .filter(|a| matches!(*a, "accept" | "decline" | "cancel"))
        .unwrap_or("accept")
        .to_string();
    let data = m.parts.iter().find_map(|p| match &p.content {
        PartContent::Data(v) => Some(v.to_string()),
        _ => None,
    });
    let content = data.unwrap_or_else(|| {
        serde_json::to_string(&m.prompt_text()).unwrap_or_else(|_| "\"\"".into())
    });
    (action, content)
}
