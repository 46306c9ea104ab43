//! Drive a turn: `RunTurn` at the context's supervisor (after any close the sweep has under way),
//! then its event stream followed to the task's end ([`Core::follow_turn`], also for a turn
//! attached to after a takeover), each event mapped and applied to the [`LiveTask`].
//!
//! Owns: the turn's stream and what a refused or broken one means for the task. Must never:
//! tell anyone a task ended before it is on disk, or wait for the disk on a runtime worker.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use warden_proto::v1::RunTurnRequest;

use super::live::{LiveTask, lock};
use super::shared::Core;
use super::writer::{PENDING_AGE, waits_for_disk};
use crate::time::now_micros;

impl Core {
    /// Follows one turn to its end.
    pub(super) async fn drive(self: Arc<Self>, live: Arc<LiveTask>, run: RunTurnRequest) {
        let task_id = run.task_id.clone();
        // The sweep may be closing this context's idle conversation; RunTurn after it has, so the
        // close cannot end this task's new conversation.
        self.closing.wait(&run.context_id).await;
        let context_id = run.context_id.clone();
        let principal = run
            .open
            .as_ref()
            .map(|o| o.principal.clone())
            .unwrap_or_default();
        let mut run = tonic::Request::new(run);
        warden_daemon::otel::inject(run.metadata_mut());
        let started = match self.route(&context_id, Some(&principal)).await {
            Ok(routed) => match routed.client.clone().run_turn(run).await {
                Ok(resp) => Ok(routed.events(resp.into_inner())),
                Err(status) => {
                    tracing::warn!(task_id = %task_id, error = %status, "RunTurn failed");
                    Err(refused_fault(&routed, &status))
                }
            },
            Err(fault) => Err(fault),
        };
        match started {
            Err(fault) => {
                let events = lock(&live.inner).mapper.not_started(fault, now_micros());
                live.settle(events).await;
                self.finish(&live, &task_id).await;
            }
            Ok(stream) => self.follow_turn(live, stream).await,
        }
    }

    /// Follows a turn's event stream (its RunTurn, or an AttachTurn after a takeover) to the
    /// task's end.
    pub(super) async fn follow_turn(
        &self,
        live: Arc<LiveTask>,
        mut stream: crate::cells::TurnEvents,
    ) {
        let task_id = lock(&live.inner).task.id.clone();
        let ended = async |live: &LiveTask, reason: String| {
            let events = lock(&live.inner).mapper.stream_ended(&reason, now_micros());
            live.settle(events).await;
        };
        {
            {
                loop {
                    // Take whatever is already there; only when the supervisor has nothing more
                    // ready is buffered text sent, which coalesces bursts without adding delay.
                    let next = match stream.next().now_or_never() {
                        Some(n) => n,
                        None => {
                            let pending = {
                                let mut inner = lock(&live.inner);
                                let events = inner.mapper.flush(now_micros());
                                if !events.is_empty() {
                                    live.apply(&mut inner, events);
                                }
                                inner.has_unwritten()
                            };
                            if pending {
                                // Quiet for a while: store what streamed so far.
                                match tokio::time::timeout(PENDING_AGE, stream.next()).await {
                                    Ok(n) => n,
                                    Err(_) => {
                                        live.writes.write_pending(&mut lock(&live.inner));
                                        stream.next().await
                                    }
                                }
                            } else {
                                stream.next().await
                            }
                        }
                    };
                    match next {
                        Some(Ok(ev)) => {
                            let settling = {
                                let mut inner = lock(&live.inner);
                                let events = inner.mapper.on_event(&ev, now_micros());
                                if waits_for_disk(&events) {
                                    live.persist_unflushed(&mut inner, &events);
                                    Some(events)
                                } else {
                                    live.apply(&mut inner, events);
                                    None
                                }
                            };
                            // The end of a task is on disk before anyone is told, and that
                            // wait holds no runtime worker (a wave's tasks end together).
                            if let Some(events) = settling {
                                if let Err(e) = live.sync().await {
                                    tracing::error!(task_id = %task_id, error = %e, "cannot persist task update");
                                }
                                live.announce_all(&mut lock(&live.inner), events);
                            }
                            if lock(&live.inner).mapper.is_finished() {
                                break;
                            }
                        }
                        Some(Err(status)) => {
                            tracing::warn!(task_id = %task_id, error = %status, "turn stream failed");
                            ended(
                                &live,
                                format!("the turn stream failed: {}", status.message()),
                            )
                            .await;
                            break;
                        }
                        None => {
                            ended(&live, "the turn stream ended without a stop".into()).await;
                            break;
                        }
                    }
                    if lock(&live.inner).mapper.is_finished() {
                        break;
                    }
                }
            }
        }
        self.finish(&live, &task_id).await;
    }

    /// The task is over here: everything written, then it is read from the store.
    pub(super) async fn finish(&self, live: &LiveTask, task_id: &str) {
        let state = {
            let mut inner = lock(&live.inner);
            // Read from the store from now on: nothing may stay buffered.
            live.writes.write_pending(&mut inner);
            inner.task.status.state
        };
        if let Err(e) = live.sync().await {
            tracing::error!(task_id = %task_id, error = %e, "cannot persist task update");
        }
        tracing::info!(task_id = %task_id, state = state.as_str(), "task finished");
        if let Ok(mut m) = self.live.lock() {
            m.remove(task_id);
        }
    }
}

/// A refused RunTurn's fault; on a cell whose TLS handshake refused a certificate (either
/// way), `cell-refused`; on a cell that could not be reached otherwise, `cell-lost`.
pub fn refused_fault(
    routed: &crate::cells::Routed,
    status: &tonic::Status,
) -> warden_proto::v1::Fault {
    if let Some(f) = routed.refused_certificate(status) {
        return f;
    }
    let f = fault_of_refused_turn(status);
    match &routed.cell {
        Some(cell) if f.fault_class() == warden_proto::v1::FaultClass::SupervisorUnavailable => {
            crate::cells::cell_lost(format!(
                "cell {cell} could not be reached: {}",
                status.message()
            ))
        }
        _ => f,
    }
}

/// What a RunTurn refused before its stream began means for the task. A refusal for a fault
/// carries the typed fault as the status's binary details (startup, prompt-too-large); any other
/// invalid argument is a refusal of the request (REJECTED); anything else is the supervisor being
/// unavailable. The message text is shown, never parsed.
pub fn fault_of_refused_turn(status: &tonic::Status) -> warden_proto::v1::Fault {
    use prost::Message;
    use warden_proto::v1::{Fault, FaultClass};
    if let Ok(f) = Fault::decode(status.details())
        && f.fault_class() != FaultClass::Unspecified
    {
        return f;
    }
    let msg = status.message();
    let (class, name, message) = if status.code() == tonic::Code::InvalidArgument {
        (FaultClass::Rejected, "rejected", msg.to_string())
    } else {
        (
            FaultClass::SupervisorUnavailable,
            "supervisor",
            format!("the supervisor could not run the turn: {msg}"),
        )
    };
    Fault {
        class: name.to_string(),
        message,
        fault_class: class as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_turn_is_read_from_its_typed_details_not_its_text() {
        use prost::Message;
        use warden_proto::v1::{Fault, FaultClass};
        // The message says nothing a parser could use; the details say startup.
        let detail = Fault {
            class: "startup".into(),
            message: "bwrap: no permission".into(),
            fault_class: FaultClass::Startup as i32,
        };
        let s = tonic::Status::with_details(
            tonic::Code::Unavailable,
            "something went wrong",
            detail.encode_to_vec().into(),
        );
        let f = fault_of_refused_turn(&s);
        assert_eq!(f.fault_class(), FaultClass::Startup);
        assert_eq!(f.message, "bwrap: no permission");
        // A message that merely looks like a startup fault, without details, is not one.
        let s = tonic::Status::unavailable("startup fault: forged");
        assert_eq!(
            fault_of_refused_turn(&s).fault_class(),
            FaultClass::SupervisorUnavailable
        );
        let s = tonic::Status::invalid_argument("task text is empty");
        assert_eq!(
            fault_of_refused_turn(&s).fault_class(),
            FaultClass::Rejected
        );
    }
}
