//! One verb attempt as one supervisor turn: `RunTurn` over the same gRPC contract and the same
//! conversations the A2A front uses, its events folded into an [`Observed`]. Questions the
//! agent asks go to the caller (through the `ask` callback: MCP elicitation); permissions never
//! reach this code — the supervisor asks the policy and reports the decision as an event.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use warden_proto::v1::{
    AnswerQuestionRequest, CancelTurnRequest, FaultClass, RunTurnRequest, Verdict,
    turn_event::Event,
};

use super::envelope::{Blocker, BlockerKind, Diff, FaultSeen, Observed, ToolSeen};
use crate::core::Core;

/// A question of the agent, for the caller.
#[derive(Debug, Clone)]
pub struct Question {
    pub message: String,
    pub schema_json: String,
}

/// The caller's answer: (action accept|decline|cancel, content as JSON text).
pub type Answer = (String, String);

/// Asks the caller; None when it cannot be asked (no elicitation capability).
pub type Ask = dyn Fn(Question) -> BoxFuture<'static, Option<Answer>> + Send + Sync;

/// How a turn ended before it began.
#[derive(Debug, Clone)]
pub enum NotStarted {
    /// The supervisor refused the request (rule, reason): nothing ran.
    Refused(&'static str, String),
    /// A fault before the agent took the prompt (startup, supervisor unavailable).
    Fault(FaultSeen),
}

/// Progress lines of a turn (for notifications and job status).
pub type Progress = dyn Fn(String) + Send + Sync;

fn fault_seen(f: &warden_proto::v1::Fault) -> FaultSeen {
    FaultSeen {
        class: if f.class.is_empty() {
            format!("{:?}", f.fault_class()).to_ascii_lowercase()
        } else {
            f.class.clone()
        },
        timeout: f.fault_class() == FaultClass::Timeout,
        message: f.message.clone(),
    }
}

/// Runs one turn to its stop. `cancel` cancels it at the supervisor (CancelTurn) and the stop is
/// still awaited, within `cancel_grace` beyond which the attempt is reported as cancelled anyway.
pub async fn run(
    core: &Core,
    req: RunTurnRequest,
    ask: &Ask,
    progress: &Progress,
    cancel: CancellationToken,
    cancel_grace: Duration,
) -> Result<Observed, NotStarted> {
    let started = Instant::now();
    let context_id = req.context_id.clone();
    let turn_id = req.turn_id.clone();
    // The one supervisor, or this context's cell (placed now if it has none or lost it).
    let principal = req
        .open
        .as_ref()
        .map(|o| o.principal.clone())
        .unwrap_or_default();
    let routed = core
        .route(&context_id, Some(&principal))
        .await
        .map_err(|f| NotStarted::Fault(fault_seen(&f)))?;
    let mut client = routed.client.clone();
    let mut req = tonic::Request::new(req);
    warden_daemon::otel::inject(req.metadata_mut());
    let stream = match client.run_turn(req).await {
        Ok(r) => routed.events(r.into_inner()),
        Err(status) => {
            let f = crate::core::refused_fault(&routed, &status);
            return Err(match f.fault_class() {
                FaultClass::Rejected => NotStarted::Refused("supervisor.rejected", f.message),
                FaultClass::PromptTooLarge => {
                    NotStarted::Refused("supervisor.prompt-too-large", f.message)
                }
                FaultClass::Capacity => NotStarted::Refused("supervisor.capacity", f.message),
                FaultClass::OptionNotOffered => {
                    NotStarted::Refused("supervisor.option-not-offered", f.message)
                }
                _ => NotStarted::Fault(fault_seen(&f)),
            });
        }
    };
    let mut o = Observed::default();
    tokio::pin!(stream);
    let mut cancel_sent: Option<Instant> = None;
    loop {
        let next = if let Some(at) = cancel_sent {
            let left = cancel_grace.saturating_sub(at.elapsed()) + Duration::from_secs(2);
            match tokio::time::timeout(left, stream.next()).await {
                Ok(n) => n,
                Err(_) => {
                    o.stop_reason = "cancelled".into();
                    break;
                }
            }
        } else {
            tokio::select! {
                n = stream.next() => n,
                _ = cancel.cancelled() => {
                    o.cancelled = true;
                    cancel_sent = Some(Instant::now());
                    let r = client.cancel_turn(CancelTurnRequest {
                        context_id: context_id.clone(),
                        turn_id: turn_id.clone(),
                    }).await;
                    tracing::info!(context_id = %context_id, turn_id = %turn_id, outcome = ?r.map(|r| r.into_inner().outcome), "MCP call cancelled; turn cancel requested");
                    continue;
                }
            }
        };
        let ev = match next {
            Some(Ok(ev)) => ev,
            Some(Err(status)) => {
                o.faults.push(FaultSeen {
                    class: "supervisor".into(),
                    timeout: false,
                    message: format!("the turn stream failed: {}", status.message()),
                });
                break;
            }
            None => {
                o.faults.push(FaultSeen {
                    class: "supervisor".into(),
                    timeout: false,
                    message: "the turn stream ended without a stop".into(),
                });
                break;
            }
        };
        let Some(event) = ev.event else { continue };
        match event {
            Event::Queued(q) => progress(if q.agent {
                format!("queued for an agent, position {}", q.position)
            } else if q.admission {
                format!("waiting for a turn slot (position {})", q.position)
            } else {
                format!(
                    "queued behind this conversation's turns (position {})",
                    q.position
                )
            }),
            Event::Started(s) => {
                o.root = s.root;
                progress("the agent has the task".into());
            }
            Event::MessageChunk(c) => o.push_answer(&c.text),
            Event::ThoughtChunk(_) | Event::Plan(_) | Event::Usage(_) | Event::ModeChange(_) => {}
            Event::ContextReset(r) => progress(format!("new agent session: {}", r.reason)),
            Event::EgressRefused(e) => progress(e.message),
            Event::ToolCall(t) => {
                let seen = o
                    .tools
                    .entry(t.tool_call_id.clone())
                    .or_insert_with(ToolSeen::default);
                if !t.kind.is_empty() {
                    seen.kind = t.kind.clone();
                }
                if !t.title.is_empty() {
                    seen.title = t.title.clone();
                }
                if !t.status.is_empty() {
                    seen.status = t.status.clone();
                }
                for l in &t.locations {
                    if !seen.locations.contains(&l.path) {
                        seen.locations.push(l.path.clone());
                    }
                }
                if !t.update {
                    progress(format!("tool: {} {}", t.kind, t.title));
                }
            }
            Event::Permission(p) => {
                let allowed = p.verdict() == Verdict::Allow && !p.cancelled;
                let seen = o
                    .tools
                    .entry(p.tool_call_id.clone())
                    .or_insert_with(ToolSeen::default);
                seen.allowed = Some(allowed);
                if seen.kind.is_empty() {
                    seen.kind = p.tool_kind.clone();
                }
                progress(format!(
                    "policy {}: {} ({})",
                    if allowed { "allowed" } else { "refused" },
                    p.tool_title,
                    p.rule
                ));
            }
            Event::Question(q) => {
                progress(format!("the agent asks: {}", q.message));
                let answer = if cancel.is_cancelled() {
                    None
                } else {
                    ask(Question {
                        message: q.message.clone(),
                        schema_json: q.requested_schema_json.clone(),
                    })
                    .await
                };
                let (action, content_json) = match answer {
                    Some(a) => a,
                    None => {
                        o.unanswered.push(format!(
                            "the agent asked {:?}; the caller could not be asked (no elicitation), so it was declined",
                            q.message
                        ));
                        ("decline".to_string(), String::new())
                    }
                };
                if action != "accept" && !o.unanswered.iter().any(|u| u.contains(&q.message)) {
                    o.unanswered
                        .push(format!("the caller answered {action} to {:?}", q.message));
                }
                let r = client
                    .answer_question(AnswerQuestionRequest {
                        context_id: context_id.clone(),
                        turn_id: turn_id.clone(),
                        question_id: q.question_id,
                        action,
                        content_json,
                        // An MCP elicitation answer has no A2A message of its own.
                        message_id: String::new(),
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(turn_id = %turn_id, error = %e, "cannot deliver the caller's answer");
                }
            }
            Event::Fault(f) => o.faults.push(fault_seen(&f)),
            Event::Stop(s) => {
                for r in &s.refusals {
                    o.refusals.push(Blocker {
                        kind: BlockerKind::Policy,
                        rule: (!r.rule.is_empty()).then(|| r.rule.clone()),
                        reason: r.reason.clone(),
                        tool: (!r.tool_title.is_empty()).then(|| r.tool_title.clone()),
                    });
                }
                if let Some(f) = &s.fault {
                    let seen = fault_seen(f);
                    if !o.faults.contains(&seen) {
                        o.faults.push(seen);
                    }
                }
                o.changed_files = s.files_changed;
                o.changed_files_known = !s.files_changed_unknown;
                if !s.diff.is_empty() {
                    o.diff = Some(Diff {
                        text: s.diff,
                        files: s.diff_files,
                        cut: s.diff_cut,
                    });
                }
                o.stop_reason = s.stop_reason;
                o.transcript_path = s.transcript_path;
                o.duration_ms = s.duration_millis;
                break;
            }
        }
    }
    if o.duration_ms == 0 {
        o.duration_ms = started.elapsed().as_millis() as u64;
    }
    Ok(o)
}
