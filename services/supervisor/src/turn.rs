//! One turn's shared state: its event stream (sequence-numbered), cancel and end requests, the
//! refusals collected for the stop event, pending questions, tool-call locations for merging
//! into permission requests, retained-output accounting and the transcript.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use warden_acp::ElicitationResponse;
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

use crate::records::Transcript;

/// Why a turn is being ended early (other than by the agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndRequest {
    /// CancelTurn from the caller.
    Cancel,
    /// A decision with end_turn (or no refusal option offered): the turn is cancelled; with a
    /// fault class when it is a failure (permission-prompt-unavailable).
    Decision {
        fault: Option<(pb::FaultClass, String)>,
    },
    /// Retained output passed the bound.
    OutputLimit,
    /// The agent escalated its mode and it could not be set back.
    ModeEscalation(String),
    /// The agent passed a per-turn request bound (`Quotas`): fault `request-limit`.
    RequestLimit(String),
}

/// Per-turn bounds on the agent's requests (`limits.*_per_turn`; 0 = unbounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotas {
    pub fs_requests: u32,
    pub permissions: u32,
    pub questions: u32,
    pub terminals: u32,
}

/// What a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    Fs,
    Permission,
    Question,
    /// `terminal/create` (each one a command run, and output held until it is released).
    Terminal,
}

/// The agent's requests of a turn so far, by [`Counted`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub fs_requests: u32,
    pub permissions: u32,
    pub questions: u32,
    pub terminals: u32,
}

/// What the turn was asked to do.
#[derive(Debug, Clone)]
pub struct TurnInput {
    pub id: String,
    pub text: String,
    /// The front's instructions (RunTurnRequest.instructions), a second text block.
    pub instructions: String,
    pub message_id: String,
    pub task_id: String,
    pub timeout_secs: u64,
    /// The identity of the request that started the turn (RunTurnRequest.groups, .issuer):
    /// its permission requests' subject carries them.
    pub groups: Vec<String>,
    pub issuer: String,
    /// The turn's trace span (a child of the `RunTurn` call's, so of the caller's trace when
    /// tracing is on; `Span::none()` otherwise): each permission's `Decide` is a child of it.
    pub span: tracing::Span,
}

#[derive(Default)]
pub struct TurnMut {
    /// What the root walk saw change during the turn: (paths, unknown).
    pub files_changed: (Vec<String>, bool),
    /// The conversation's change to its root so far, when this turn changed files.
    pub patch: Option<crate::patch::Patch>,
    pub refusals: Vec<pb::Refusal>,
    pub questions: HashMap<String, oneshot::Sender<ElicitationResponse>>,
    /// Locations, kind and title of tool calls seen in this session's updates, by id.
    pub tools: HashMap<String, ToolSeen>,
    pub end: Option<EndRequest>,
    pub permissions: usize,
    pub output_bytes: usize,
    pub usage: pb::Usage,
    /// Option ids of ALLOWed switch_mode decisions not yet matched by a mode update.
    pub allowed_switches: Vec<String>,
    /// Commands ALLOWed execute tool calls of this turn judged, not yet run: a `terminal/create`
    /// of exactly one of them (argv and cwd) runs on that ALLOW, once; any other is decided.
    pub allowed_exec: Vec<AllowedExec>,
    /// Writes an ALLOWed edit of this turn judged — a path it named (resolved against the root)
    /// with the hash of the content its raw input carried —, not yet written through
    /// `fs/write_text_file`: one ALLOW covers one client write of each of its paths, of exactly
    /// that content; any other write is decided.
    pub allowed_writes: Vec<CoveredWrite>,
    /// Locations a read ALLOW of this turn judged (a client read decided, or an ALLOWed read
    /// tool call's paths): read through `fs/read_text_file` without asking again.
    pub allowed_reads: Vec<std::path::PathBuf>,
    pub transcript: Option<Transcript>,
    /// Egress refusals of this turn by destination (`host:port`).
    pub egress_refused: HashMap<String, u32>,
    /// Egress refusal events sent to the caller in this turn.
    pub egress_events: u32,
    /// The agent's requests of this turn, against `Quotas`.
    pub counts: Counts,
}

/// A path an ALLOWed edit covers, with the content it judged and the decision that allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoveredWrite {
    pub path: std::path::PathBuf,
    /// Hex SHA-256 of the content the ALLOW judged (its raw input's `content`).
    pub content_sha256: String,
    pub decision_id: String,
    /// The digest of the action the decision judged (`Decision.action_digest`).
    pub digest: String,
    pub tool_call_id: String,
}

/// A command an ALLOWed execute judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedExec {
    /// As the raw input named it (`warden_rules::JudgedAction::argv`).
    pub argv: Vec<String>,
    /// Where it was judged to run, absolute.
    pub cwd: String,
    pub decision_id: String,
    pub digest: String,
    pub tool_call_id: String,
}

#[derive(Debug, Clone, Default)]
pub struct ToolSeen {
    pub kind: String,
    pub title: String,
    pub locations: Vec<pb::Location>,
    pub raw_input_json: String,
}

/// Events of a turn held for callers that attach after it started (`AttachTurn`): at most this
/// many (its retained output is bounded on its own; this bounds a flood of tiny events).
pub const REPLAY_EVENTS: usize = 65_536;

/// What a turn keeps for `AttachTurn`: every event sent (the newest [`REPLAY_EVENTS`]), who is
/// attached, and whether its stop was sent.
#[derive(Default)]
struct Replay {
    events: VecDeque<pb::TurnEvent>,
    attached: Vec<mpsc::UnboundedSender<Result<pb::TurnEvent, tonic::Status>>>,
    stopped: bool,
}

/// A turn, queued or active.
pub struct TurnCtx {
    pub input: TurnInput,
    seq: AtomicU64,
    tx: mpsc::UnboundedSender<Result<pb::TurnEvent, tonic::Status>>,
    replay: Mutex<Replay>,
    /// Requested by CancelTurn (or internally): the turn ends cancelled.
    pub cancel: CancellationToken,
    /// Set on any early end (cancel, end_turn decision, output limit, ...).
    pub end: CancellationToken,
    pub state: Mutex<TurnMut>,
    output_limit: usize,
}

pub type EventRx = mpsc::UnboundedReceiver<Result<pb::TurnEvent, tonic::Status>>;

impl TurnCtx {
    pub fn new(input: TurnInput, output_limit: usize) -> (std::sync::Arc<Self>, EventRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            std::sync::Arc::new(TurnCtx {
                input,
                seq: AtomicU64::new(0),
                tx,
                replay: Mutex::new(Replay::default()),
                cancel: CancellationToken::new(),
                end: CancellationToken::new(),
                state: Mutex::new(TurnMut::default()),
                output_limit,
            }),
            rx,
        )
    }

    pub fn id(&self) -> &str {
        &self.input.id
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, TurnMut> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one event (a client that went away is not an error: the turn goes on), and keeps
    /// it for callers that attach later. Numbered under the replay's lock, so every stream sees
    /// the events in one order.
    pub fn emit(&self, ev: Event) {
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let stop = matches!(ev, Event::Stop(_));
        let ev = pb::TurnEvent {
            turn_id: self.input.id.clone(),
            seq,
            event: Some(ev),
        };
        r.attached.retain(|a| a.send(Ok(ev.clone())).is_ok());
        if stop {
            r.stopped = true;
            // Their streams end after the stop.
            r.attached.clear();
        }
        if r.events.len() >= REPLAY_EVENTS {
            r.events.pop_front();
        }
        r.events.push_back(ev.clone());
        drop(r);
        let _ = self.tx.send(Ok(ev));
    }

    /// A stream of this turn's events after `after_seq`: those already sent, then the live
    /// ones until the stop. `None` when the events right after `after_seq` are no longer held.
    pub fn attach(&self, after_seq: u64) -> Option<EventRx> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = r.events.front()
            && first.seq > after_seq + 1
        {
            return None;
        }
        for ev in r.events.iter().filter(|e| e.seq > after_seq) {
            let _ = tx.send(Ok(ev.clone()));
        }
        if !r.stopped {
            r.attached.push(tx);
        }
        Some(rx)
    }

    /// Records `kind`/`data` in the transcript (if open).
    pub fn record(&self, kind: &str, data: serde_json::Value) {
        if let Some(t) = self.lock().transcript.as_mut() {
            t.record(kind, &data);
        }
    }

    /// Asks the turn to end; the first reason wins.
    pub fn request_end(&self, why: EndRequest) {
        {
            let mut st = self.lock();
            if st.end.is_none() {
                st.end = Some(why.clone());
            }
        }
        if why == EndRequest::Cancel {
            self.cancel.cancel();
        }
        self.end.cancel();
    }

    pub fn end_reason(&self) -> Option<EndRequest> {
        self.lock().end.clone()
    }

    /// Counts retained output; past the bound the turn is asked to end with `output-limit`.
    pub fn add_output(&self, n: usize) {
        let over = {
            let mut st = self.lock();
            st.output_bytes = st.output_bytes.saturating_add(n);
            st.output_bytes > self.output_limit
        };
        if over {
            self.request_end(EndRequest::OutputLimit);
        }
    }

    /// Counts one request of the agent; past its bound the request is refused (the error the
    /// agent gets) and the turn is asked to end with fault `request-limit`. Each flood of
    /// requests that costs something outside the supervisor (a durable audit record per
    /// permission, a stored question per elicitation, a file read, a command run with its
    /// output held) stops at its bound. Requests outside any turn never get here: they are
    /// refused (`ConvCore::count`).
    pub fn count(&self, what: Counted, quotas: &Quotas) -> Result<(), warden_acp::RpcError> {
        let (n, limit, key, name) = {
            let mut st = self.lock();
            let c = &mut st.counts;
            match what {
                Counted::Fs => {
                    c.fs_requests = c.fs_requests.saturating_add(1);
                    (
                        c.fs_requests,
                        quotas.fs_requests,
                        "fs_requests_per_turn",
                        "fs/* requests",
                    )
                }
                Counted::Permission => {
                    c.permissions = c.permissions.saturating_add(1);
                    (
                        c.permissions,
                        quotas.permissions,
                        "permissions_per_turn",
                        "permission requests",
                    )
                }
                Counted::Question => {
                    c.questions = c.questions.saturating_add(1);
                    (
                        c.questions,
                        quotas.questions,
                        "questions_per_turn",
                        "elicitation/create requests",
                    )
                }
                Counted::Terminal => {
                    c.terminals = c.terminals.saturating_add(1);
                    (
                        c.terminals,
                        quotas.terminals,
                        "terminals_per_turn",
                        "terminal/create requests",
                    )
                }
            }
        };
        if limit == 0 || n <= limit {
            return Ok(());
        }
        let why = format!("the agent made more than {limit} {name} in one turn (limits.{key})");
        self.request_end(EndRequest::RequestLimit(why.clone()));
        Err(warden_acp::RpcError::internal(format!(
            "{why}: refused, and the turn is ended"
        )))
    }

    /// Answers every open question `cancel` (the turn is over or cancelled).
    pub fn cancel_questions(&self) {
        let qs: Vec<_> = self.lock().questions.drain().collect();
        for (_, tx) in qs {
            let _ = tx.send(ElicitationResponse::Cancel);
        }
    }
}
