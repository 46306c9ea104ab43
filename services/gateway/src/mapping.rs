//! TurnEvent → A2A: the pure state machine that turns one supervisor turn into the A2A events of
//! one task. No I/O and no clock of its own (the caller passes `now`), so it is tested with real
//! `TurnEvent` values.
//!
//! Rules (issue 7, seed 000):
//! - message chunks are coalesced into appended updates of one "answer" artifact; the driver
//!   calls [`TurnMapper::flush`] when the supervisor's stream has nothing more ready, so a fast
//!   agent is not relayed one event per token and a slow one is not delayed;
//! - tool calls, plans, mode changes and permission decisions become WORKING status updates whose
//!   message says what happened and whose metadata (`warden`) carries the structured fields;
//! - a permission decision is only ever reported; it never becomes INPUT_REQUIRED. Only a
//!   question (ACP `elicitation/create`) does;
//! - the stop reason decides the final state; every refusal is listed in the final message;
//! - warden's own hints in a chunk's `_meta` (see [`ChunkHint`]) route it: `warden.artifact`
//!   makes it (part of) a named text/file/url/data artifact, `warden.a2a = "message"` makes it the
//!   reply of a task that is answered by a direct A2A Message, `warden.a2a = "reject"` turns a
//!   `refusal` stop into REJECTED. Hints are agent output: malformed ones are ignored (the chunk
//!   is plain answer text), and none of them can hide a tool call, a permission decision or a
//!   refusal from the caller. Reading them is [`hints`]'s.

use serde_json::{Value, json};
use warden_proto::v1::{
    Fault, FaultClass, PermissionDecisionEvent, Refusal, ToolCallEvent, TurnEvent, TurnQueued,
    TurnStop, Verdict, turn_event::Event,
};

use crate::a2a::{
    Artifact, Message, Metadata, Part, PartContent, StreamResponse, TaskArtifactUpdateEvent,
    TaskState, TaskStatus, TaskStatusUpdateEvent,
};

mod hints;

use hints::hinted_part;
pub use hints::{ArtifactHint, ArtifactKind, ChunkHint, MAX_HINT_META_BYTES, base64};

/// Once this much answer text is buffered it is sent even if more is ready.
pub const DEFAULT_COALESCE_BYTES: usize = 16 * 1024;

/// The metadata key under which warden's structured fields travel.
pub const META_KEY: &str = "warden";

/// The diff artifact: its id is the task's id and this suffix (never `-`, the agent's hinted
/// artifacts' separator, so no agent can name it), its one part a file.
pub const DIFF_ARTIFACT_SUFFIX: &str = ".diff";
pub const DIFF_FILENAME: &str = "changes.diff";
pub const DIFF_MEDIA_TYPE: &str = "text/x-diff";

/// The A2A side of one running turn.
#[derive(Debug)]
pub struct TurnMapper {
    task_id: String,
    context_id: String,
    answer_artifact_id: String,
    answer_started: bool,
    text: String,
    thought: String,
    coalesce_bytes: usize,
    state: TaskState,
    pending_question: Option<String>,
    cancel_requested: bool,
    last_fault: Option<Fault>,
    usage: Option<Value>,
    /// Title and kind of each tool call, since updates usually repeat only the id.
    tool_calls: std::collections::HashMap<String, (String, String)>,
    finished: bool,
    /// Text of chunks hinted `warden.a2a` = message / reject: the reply that ends the task.
    reply: String,
    message_hint: bool,
    reject_hint: bool,
    /// Something happened that only a task can show (tool call, permission, question, artifact,
    /// plan, mode change, context reset): such a turn is never answered by a bare Message, so a
    /// blocking caller always gets the task whose history records it.
    task_only: bool,
    /// The agent's artifact ids already started (a first chunk is never sent with `append`).
    hinted_artifacts: std::collections::HashSet<String>,
    direct_message: bool,
}

fn meta(fields: Value) -> Option<Metadata> {
    let mut m = Metadata::new();
    m.insert(META_KEY.to_string(), fields);
    Some(m)
}

/// A queued turn's state, text and `kind`: holding a turn slot and waiting for a live agent
/// (working, with its place: it starts as soon as a turn ends and gives an agent back),
/// accepted and waiting for a turn slot (working, with its place), or behind other turns of its
/// conversation (submitted).
fn queued(q: &TurnQueued) -> (TaskState, String, &'static str) {
    if q.agent {
        let text = format!("queued for an agent, position {}", q.position);
        (TaskState::Working, text, "agent")
    } else if q.admission {
        let text = format!(
            "queued, position {}: waiting for one of the supervisor's turn slots",
            q.position
        );
        (TaskState::Working, text, "admission")
    } else {
        let text = format!(
            "queued behind other turns of this conversation (position {})",
            q.position
        );
        (TaskState::Submitted, text, "queued")
    }
}

/// The working note (text and `warden` fields) of an event that only informs the caller: a
/// plan, a mode change, a context reset, a connection the agent's egress proxy refused (naming
/// the destination and the setting that decides it). `None` for every other event.
fn note(event: &Event) -> Option<(String, Value)> {
    Some(match event {
        Event::Plan(p) => {
            let mut text = String::from("plan:");
            for e in &p.entries {
                text.push_str(&format!("\n- [{}] {}", e.status, e.content));
            }
            let entries: Vec<Value> = p
                .entries
                .iter()
                .map(|e| json!({"content": e.content, "priority": e.priority, "status": e.status}))
                .collect();
            (text, json!({"kind": "plan", "entries": entries}))
        }
        Event::ModeChange(m) => {
            let text = format!(
                "agent mode is now {}{}{}",
                m.mode_id,
                if m.supervised {
                    " (supervised)"
                } else {
                    " (NOT supervised)"
                },
                if m.by_supervisor {
                    ", set by the supervisor"
                } else {
                    ""
                }
            );
            let fields = json!({"kind": "mode", "modeId": m.mode_id, "supervised": m.supervised, "bySupervisor": m.by_supervisor});
            (text, fields)
        }
        Event::ContextReset(r) => (
            format!("the agent's context was reset: {}", r.reason),
            json!({"kind": "context_reset", "reason": r.reason}),
        ),
        Event::EgressRefused(e) => (
            e.message.clone(),
            json!({"kind": "egress_refused", "host": e.host, "port": e.port, "address": e.address, "setting": e.setting}),
        ),
        _ => return None,
    })
}

fn verdict_name(v: i32) -> &'static str {
    match Verdict::try_from(v) {
        Ok(Verdict::Allow) => "allow",
        Ok(Verdict::Escalate) => "escalate",
        // The zero value and anything unknown is a denial, as the policy contract says.
        _ => "deny",
    }
}

fn raw_input(json_text: &str) -> Value {
    if json_text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(json_text).unwrap_or_else(|_| Value::String(json_text.to_string()))
}

/// One line per refusal: "refused by policy: <title> (<kind>): <reason> [rule <rule>]".
pub fn refusal_line(r: &Refusal) -> String {
    format!(
        "refused by policy: {}",
        decision_line(
            &r.tool_title,
            &r.tool_call_id,
            &r.tool_kind,
            &r.reason,
            &r.rule
        )
    )
}

/// A tool as a caller reads it: its title (or, without one, its call id) and its kind (`other`
/// without one).
fn tool_label(title: &str, id: &str, kind: &str) -> String {
    let title = if title.is_empty() { id } else { title };
    let kind = if kind.is_empty() { "other" } else { kind };
    format!("{title} ({kind})")
}

/// What a decision on a tool said: "<title> (<kind>): <reason> [rule <rule>]".
fn decision_line(title: &str, id: &str, kind: &str, reason: &str, rule: &str) -> String {
    format!("{}: {reason} [rule {rule}]", tool_label(title, id, kind))
}

fn refusal_json(r: &Refusal) -> Value {
    json!({
        "decisionId": r.decision_id, "toolCallId": r.tool_call_id, "toolKind": r.tool_kind,
        "toolTitle": r.tool_title, "rule": r.rule, "reason": r.reason,
    })
}

fn fault_json(f: &Fault) -> Value {
    json!({"class": f.class, "message": f.message})
}

impl TurnMapper {
    pub fn new(task_id: &str, context_id: &str) -> Self {
        Self {
            task_id: task_id.to_string(),
            context_id: context_id.to_string(),
            answer_artifact_id: format!("{task_id}-answer"),
            answer_started: false,
            text: String::new(),
            thought: String::new(),
            coalesce_bytes: DEFAULT_COALESCE_BYTES,
            state: TaskState::Submitted,
            pending_question: None,
            cancel_requested: false,
            last_fault: None,
            usage: None,
            tool_calls: std::collections::HashMap::new(),
            finished: false,
            reply: String::new(),
            message_hint: false,
            reject_hint: false,
            task_only: false,
            hinted_artifacts: std::collections::HashSet::new(),
            direct_message: false,
        }
    }

    /// True when the turn ended COMPLETED with only a hinted reply: a blocking SendMessage
    /// answers with the final status message as a direct A2A Message instead of the Task.
    pub fn direct_message(&self) -> bool {
        self.direct_message
    }

    /// Sets the size at which buffered text is sent without waiting for a flush.
    pub fn with_coalesce_bytes(mut self, bytes: usize) -> Self {
        self.coalesce_bytes = bytes.max(1);
        self
    }

    /// The task state as of the events seen so far.
    pub fn state(&self) -> TaskState {
        self.state
    }

    /// True once a final state has been produced; later events are ignored.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The question the task waits on (INPUT_REQUIRED), if any.
    pub fn pending_question(&self) -> Option<&str> {
        self.pending_question.as_deref()
    }

    /// Remembers that the caller asked to cancel: however the turn then stops, it ends CANCELED.
    pub fn request_cancel(&mut self) {
        self.cancel_requested = true;
    }

    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested
    }

    fn status(
        &mut self,
        state: TaskState,
        text: Option<String>,
        fields: Option<Value>,
        now: i64,
    ) -> StreamResponse {
        self.state = state;
        let message = text.map(|t| {
            Message::agent_text(&self.task_id, &self.context_id, t, fields.and_then(meta))
        });
        StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: TaskStatus {
                state,
                message,
                timestamp: Some(crate::time::format_micros(now)),
            },
            metadata: None,
        })
    }

    fn working_note(&mut self, text: String, fields: Value, now: i64) -> StreamResponse {
        self.status(TaskState::Working, Some(text), Some(fields), now)
    }

    fn answer_update(&mut self, text: String, last_chunk: bool) -> StreamResponse {
        let append = self.answer_started;
        self.answer_started = true;
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact: Artifact {
                artifact_id: self.answer_artifact_id.clone(),
                name: Some("answer".to_string()),
                description: None,
                parts: vec![Part::text(text)],
                metadata: None,
                extensions: Vec::new(),
            },
            append,
            last_chunk,
            metadata: None,
        })
    }

    /// Before anything the agent does is reported, the task must be WORKING.
    /// (Agent activity after a question also means the question was answered.)
    fn ensure_working(&mut self, out: &mut Vec<StreamResponse>, now: i64) {
        if matches!(self.state, TaskState::Submitted | TaskState::InputRequired) {
            self.pending_question = None;
            out.push(self.status(TaskState::Working, None, None, now));
        }
    }

    /// Sends whatever answer text and thoughts are buffered.
    pub fn flush(&mut self, now: i64) -> Vec<StreamResponse> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        if !self.thought.is_empty() {
            self.ensure_working(&mut out, now);
            let thought = std::mem::take(&mut self.thought);
            out.push(self.working_note(thought, json!({"kind": "thought"}), now));
        }
        if !self.text.is_empty() {
            self.ensure_working(&mut out, now);
            let text = std::mem::take(&mut self.text);
            out.push(self.answer_update(text, false));
        }
        out
    }

    /// Maps one supervisor event. Text is buffered; everything else flushes the buffer first so
    /// the caller sees events in the order the agent produced them.
    pub fn on_event(&mut self, ev: &TurnEvent, now: i64) -> Vec<StreamResponse> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        let Some(event) = &ev.event else {
            return out;
        };
        match event {
            Event::MessageChunk(c) => {
                match ChunkHint::parse(&c.meta_json) {
                    ChunkHint::None => {}
                    ChunkHint::Artifact(hint) => {
                        // Everything before it goes first, so the caller sees the agent's order.
                        out.extend(self.flush(now));
                        self.ensure_working(&mut out, now);
                        out.push(self.hinted_artifact(&hint, &c.text));
                        return out;
                    }
                    ChunkHint::Message => {
                        self.message_hint = true;
                        self.reply.push_str(&c.text);
                        return out;
                    }
                    ChunkHint::Reject => {
                        self.reject_hint = true;
                        self.reply.push_str(&c.text);
                        return out;
                    }
                }
                if !self.thought.is_empty() {
                    out.extend(self.flush(now));
                }
                self.text.push_str(&c.text);
                if self.text.len() >= self.coalesce_bytes {
                    out.extend(self.flush(now));
                }
                return out;
            }
            Event::ThoughtChunk(c) => {
                if !self.text.is_empty() {
                    out.extend(self.flush(now));
                }
                self.thought.push_str(&c.text);
                if self.thought.len() >= self.coalesce_bytes {
                    out.extend(self.flush(now));
                }
                return out;
            }
            Event::Usage(u) => {
                self.usage = Some(json!({
                    "inputTokens": u.input_tokens, "outputTokens": u.output_tokens,
                    "totalTokens": u.total_tokens, "contextUsed": u.context_used,
                    "contextSize": u.context_size,
                }));
                return out;
            }
            _ => {}
        }
        if matches!(event, Event::Stop(_)) {
            // The stop sends the rest of the answer itself, marked as the last chunk.
            let text = std::mem::take(&mut self.text);
            out.extend(self.flush(now));
            self.text = text;
        } else {
            out.extend(self.flush(now));
        }
        match event {
            Event::Queued(q) => {
                let (state, text, kind) = queued(q);
                out.push(self.status(
                    state,
                    Some(text),
                    Some(json!({"kind": kind, "position": q.position})),
                    now,
                ));
            }
            Event::Started(_) => {
                out.push(self.status(TaskState::Working, None, None, now));
            }
            Event::ToolCall(t) => {
                self.task_only = true;
                self.ensure_working(&mut out, now);
                out.push(self.tool_call(t, now));
            }
            Event::Permission(p) => {
                self.task_only = true;
                self.ensure_working(&mut out, now);
                out.push(self.permission(p, now));
            }
            Event::Question(q) => {
                self.task_only = true;
                self.pending_question = Some(q.question_id.clone());
                let schema = raw_input(&q.requested_schema_json);
                out.push(self.status(
                    TaskState::InputRequired,
                    Some(q.message.clone()),
                    Some(json!({"kind": "question", "questionId": q.question_id, "requestedSchema": schema})),
                    now,
                ));
            }
            Event::Plan(_)
            | Event::ModeChange(_)
            | Event::ContextReset(_)
            | Event::EgressRefused(_) => {
                if let Some((text, fields)) = note(event) {
                    self.task_only = true;
                    self.ensure_working(&mut out, now);
                    out.push(self.working_note(text, fields, now));
                }
            }
            Event::Fault(f) => {
                // The stop that follows carries the outcome; remember the fault in case it does not.
                self.last_fault = Some(f.clone());
            }
            Event::Stop(stop) => {
                out.extend(self.stop(stop, now));
            }
            Event::MessageChunk(_) | Event::ThoughtChunk(_) | Event::Usage(_) => {}
        }
        out
    }

    fn diff_artifact_id(&self) -> String {
        format!("{}{DIFF_ARTIFACT_SUFFIX}", self.task_id)
    }

    /// The conversation's change to its root so far (the supervisor's diff) as the task's
    /// `text/x-diff` file artifact, whole in one update.
    fn diff_artifact(&mut self, stop: &TurnStop) -> StreamResponse {
        let mut meta = Metadata::new();
        meta.insert(
            "warden".into(),
            json!({"files": stop.diff_files, "cut": stop.diff_cut}),
        );
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact: Artifact {
                artifact_id: self.diff_artifact_id(),
                name: Some(DIFF_FILENAME.into()),
                description: Some(
                    "what this conversation changed in its root so far, as a unified diff \
                     (git apply)"
                        .into(),
                ),
                parts: vec![Part {
                    content: PartContent::Raw(base64(stop.diff.as_bytes())),
                    metadata: None,
                    filename: Some(DIFF_FILENAME.into()),
                    media_type: Some(DIFF_MEDIA_TYPE.into()),
                }],
                metadata: Some(meta),
                extensions: Vec::new(),
            },
            append: false,
            last_chunk: true,
            metadata: None,
        })
    }

    /// One hinted chunk as an artifact update. The agent's id is scoped by the task id so it can
    /// never collide with the answer artifact or another task's artifacts.
    fn hinted_artifact(&mut self, hint: &ArtifactHint, text: &str) -> StreamResponse {
        self.task_only = true;
        let started = !self.hinted_artifacts.insert(hint.artifact_id.clone());
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact: Artifact {
                artifact_id: format!("{}-{}", self.task_id, hint.artifact_id),
                name: Some(
                    hint.name
                        .clone()
                        .unwrap_or_else(|| hint.artifact_id.clone()),
                ),
                description: None,
                parts: vec![hinted_part(hint, text)],
                metadata: None,
                extensions: Vec::new(),
            },
            append: hint.append && started,
            // A chunk that says nothing about chunking is a whole artifact.
            last_chunk: hint.last_chunk.unwrap_or(!hint.append),
            metadata: None,
        })
    }

    fn tool_call(&mut self, t: &ToolCallEvent, now: i64) -> StreamResponse {
        let known = self.tool_calls.entry(t.tool_call_id.clone()).or_default();
        if !t.title.is_empty() {
            known.0 = t.title.clone();
        }
        if !t.kind.is_empty() {
            known.1 = t.kind.clone();
        }
        let mut t = t.clone();
        t.title = known.0.clone();
        t.kind = known.1.clone();
        let t = &t;
        let locations: Vec<Value> = t
            .locations
            .iter()
            .map(|l| match l.line {
                Some(line) => json!({"path": l.path, "line": line}),
                None => json!({"path": l.path}),
            })
            .collect();
        let status = if t.status.is_empty() {
            "pending"
        } else {
            &t.status
        };
        let text = format!(
            "tool call {status}: {}",
            tool_label(&t.title, &t.tool_call_id, &t.kind)
        );
        let mut fields = json!({
            "kind": "tool_call", "toolCallId": t.tool_call_id, "toolKind": t.kind,
            "title": t.title, "status": t.status, "update": t.update, "locations": locations,
            "rawInput": raw_input(&t.raw_input_json),
        });
        if !t.content_text.is_empty() {
            fields["content"] = Value::String(t.content_text.clone());
        }
        self.working_note(text, fields, now)
    }

    fn permission(&mut self, p: &PermissionDecisionEvent, now: i64) -> StreamResponse {
        let verdict = verdict_name(p.verdict);
        let text = format!(
            "permission {verdict}: {}",
            decision_line(
                &p.tool_title,
                &p.tool_call_id,
                &p.tool_kind,
                &p.reason,
                &p.rule
            )
        );
        self.working_note(
            text,
            json!({
                "kind": "permission", "decisionId": p.decision_id, "toolCallId": p.tool_call_id,
                "toolKind": p.tool_kind, "toolTitle": p.tool_title, "verdict": verdict,
                "rule": p.rule, "reason": p.reason, "optionIdSent": p.option_id_sent,
                "cancelled": p.cancelled, "endTurn": p.end_turn,
                "policyLatencyMicros": p.policy_latency_micros,
            }),
            now,
        )
    }

    /// Maps the turn's stop to the final state and message.
    fn stop(&mut self, stop: &TurnStop, now: i64) -> Vec<StreamResponse> {
        let mut out = Vec::new();
        let reply = std::mem::take(&mut self.reply);
        // A hinted reply ends the task as its final status message only when nothing else has to
        // be shown: a rejection needs the agent's `refusal` stop; a direct Message needs a clean
        // end_turn with no refusal and nothing that only a task can carry. Otherwise the reply is
        // ordinary answer text.
        let rejected = !self.cancel_requested && self.reject_hint && stop.stop_reason == "refusal";
        let direct = !self.cancel_requested
            && self.message_hint
            && !self.reject_hint
            && stop.stop_reason == "end_turn"
            && stop.refusals.is_empty()
            && !self.task_only
            && stop.diff.is_empty()
            && !self.answer_started
            && self.text.is_empty()
            && !reply.is_empty();
        if !rejected && !direct {
            self.text.push_str(&reply);
        }
        if self.answer_started || !self.text.is_empty() {
            // Output after a question means it was answered: WORKING first, as in `flush` (the
            // turn's end can reach the mapper before the answering path reports the answer).
            self.ensure_working(&mut out, now);
            let rest = std::mem::take(&mut self.text);
            out.push(self.answer_update(rest, true));
        }
        if !stop.diff.is_empty() {
            out.push(self.diff_artifact(stop));
        }
        let refusals: Vec<String> = stop.refusals.iter().map(refusal_line).collect();
        let fault = stop.fault.clone().or_else(|| self.last_fault.clone());
        let (state, mut lines): (TaskState, Vec<String>) = match stop.stop_reason.as_str() {
            _ if self.cancel_requested => {
                let mut l = vec!["canceled at the caller's request".to_string()];
                l.extend(refusals.iter().cloned());
                (TaskState::Canceled, l)
            }
            "end_turn" if direct => (TaskState::Completed, vec![reply.clone()]),
            "end_turn" => {
                let mut l = vec!["completed".to_string()];
                l.extend(refusals.iter().cloned());
                (TaskState::Completed, l)
            }
            "cancelled" if !refusals.is_empty() => (TaskState::Canceled, refusals.clone()),
            "cancelled" => (
                TaskState::Canceled,
                vec!["the agent cancelled the turn".to_string()],
            ),
            // The agent said explicitly (`warden.a2a = "reject"`) that it will not do this task:
            // REJECTED, with its reason. A plain refusal stays FAILED (issue 7).
            "refusal" if rejected => (
                TaskState::Rejected,
                vec![if reply.trim().is_empty() {
                    "the agent rejected the task".to_string()
                } else {
                    reply.clone()
                }],
            ),
            "refusal" => (
                TaskState::Failed,
                vec!["the agent refused to continue (stop reason: refusal)".to_string()],
            ),
            "max_tokens" | "max_turn_requests" => (
                TaskState::Failed,
                vec![format!(
                    "the agent stopped before finishing: {}",
                    stop.stop_reason
                )],
            ),
            _ => match &fault {
                Some(f)
                    if matches!(
                        f.fault_class(),
                        FaultClass::PromptTooLarge
                            | FaultClass::Rejected
                            | FaultClass::OptionNotOffered
                    ) =>
                {
                    (
                        TaskState::Rejected,
                        vec![format!("rejected: {}", f.message)],
                    )
                }
                Some(f) if f.fault_class() == FaultClass::Startup => (
                    TaskState::Failed,
                    vec![format!("the agent could not start: {}", f.message)],
                ),
                Some(f) => (
                    TaskState::Failed,
                    vec![format!("{}: {}", f.class, f.message)],
                ),
                None => (
                    TaskState::Failed,
                    vec![format!("the turn stopped: {}", stop.stop_reason)],
                ),
            },
        };
        if state != TaskState::Completed && state != TaskState::Canceled && !refusals.is_empty() {
            lines.extend(refusals.iter().cloned());
        }
        let mut fields = json!({
            "kind": "stop", "stopReason": stop.stop_reason,
            "refusals": stop.refusals.iter().map(refusal_json).collect::<Vec<_>>(),
            "durationMillis": stop.duration_millis,
        });
        if let Some(f) = &fault {
            fields["fault"] = fault_json(f);
        }
        if let Some(u) = &self.usage {
            fields["usage"] = u.clone();
        }
        if direct {
            fields["directMessage"] = Value::Bool(true);
        }
        if !stop.diff.is_empty() {
            fields["diff"] = json!({
                "artifactId": self.diff_artifact_id(), "files": stop.diff_files,
                "cut": stop.diff_cut, "bytes": stop.diff.len(),
            });
        }
        if rejected {
            fields["rejectedByAgent"] = Value::Bool(true);
        }
        self.direct_message = direct;
        self.pending_question = None;
        out.push(self.status(state, Some(lines.join("\n")), Some(fields), now));
        self.finished = true;
        out
    }

    /// The caller answered the pending question: the task is WORKING again.
    pub fn question_answered(&mut self, now: i64) -> Vec<StreamResponse> {
        if self.finished || self.pending_question.take().is_none() {
            return Vec::new();
        }
        vec![self.status(TaskState::Working, None, None, now)]
    }

    /// The supervisor's stream ended (or failed) without a TurnStop: the turn cannot be followed.
    pub fn stream_ended(&mut self, reason: &str, now: i64) -> Vec<StreamResponse> {
        if self.finished {
            return Vec::new();
        }
        let stop = TurnStop {
            stop_reason: "fault".to_string(),
            refusals: Vec::new(),
            fault: Some(Fault {
                class: "supervisor".into(),
                message: reason.to_string(),
                fault_class: FaultClass::SupervisorUnavailable as i32,
            }),
            transcript_path: String::new(),
            duration_millis: 0,
            ..Default::default()
        };
        self.stop(&stop, now)
    }

    /// The turn never started: the supervisor refused or failed RunTurn with `fault`.
    pub fn not_started(&mut self, fault: Fault, now: i64) -> Vec<StreamResponse> {
        if self.finished {
            return Vec::new();
        }
        let stop = TurnStop {
            stop_reason: "fault".to_string(),
            fault: Some(fault),
            ..Default::default()
        };
        self.stop(&stop, now)
    }

    /// Ends the task CANCELED without the supervisor's stop (the cancel grace ran out).
    pub fn force_cancel(&mut self, now: i64) -> Vec<StreamResponse> {
        if self.finished {
            return Vec::new();
        }
        self.cancel_requested = true;
        let stop = TurnStop {
            stop_reason: "cancelled".to_string(),
            ..Default::default()
        };
        self.stop(&stop, now)
    }
}

#[cfg(test)]
mod tests {
    use super::hints::MAX_HINT_FIELD;
    use super::*;
    use warden_proto::v1::{
        Location, PlanEntry, PlanEvent, Question, TextChunk, TurnQueued, TurnStarted,
    };

    fn ev(seq: u64, e: Event) -> TurnEvent {
        TurnEvent {
            turn_id: "t1".into(),
            seq,
            event: Some(e),
        }
    }

    fn chunk(s: &str) -> Event {
        Event::MessageChunk(TextChunk {
            text: s.into(),
            ..Default::default()
        })
    }

    fn started() -> Event {
        Event::Started(TurnStarted {
            session_id: "s".into(),
            root: "/tmp/x".into(),
        })
    }

    fn stop(reason: &str, refusals: Vec<Refusal>, fault: Option<Fault>) -> Event {
        Event::Stop(TurnStop {
            stop_reason: reason.into(),
            refusals,
            fault,
            transcript_path: String::new(),
            duration_millis: 5,
            ..Default::default()
        })
    }

    fn refusal(title: &str, reason: &str) -> Refusal {
        Refusal {
            decision_id: "d1".into(),
            tool_call_id: "tc1".into(),
            tool_kind: "edit".into(),
            tool_title: title.into(),
            rule: "floor.edit.outside-root".into(),
            reason: reason.into(),
        }
    }

    fn run(m: &mut TurnMapper, events: Vec<Event>) -> Vec<StreamResponse> {
        let mut out = Vec::new();
        for (i, e) in events.into_iter().enumerate() {
            out.extend(m.on_event(&ev(i as u64 + 1, e), 1_000));
        }
        out
    }

    /// The first status update a batch of events was mapped to.
    fn first_status_update(out: &[StreamResponse]) -> &TaskStatusUpdateEvent {
        out.iter()
            .find_map(|e| match e {
                StreamResponse::StatusUpdate(s) => Some(s),
                _ => None,
            })
            .expect("a status update")
    }

    fn final_status(out: &[StreamResponse]) -> (&TaskStatus, String, Value) {
        match out.last() {
            Some(StreamResponse::StatusUpdate(s)) => {
                let msg = s.status.message.as_ref().expect("final message");
                let text = match &msg.parts[0].content {
                    crate::a2a::PartContent::Text(t) => t.clone(),
                    other => panic!("{other:?}"),
                };
                let meta = msg.metadata.as_ref().expect("metadata")[META_KEY].clone();
                (&s.status, text, meta)
            }
            other => panic!("last event is not a status: {other:?}"),
        }
    }

    #[test]
    fn a_turn_that_changed_files_ends_with_its_diff_as_a_file_artifact() {
        let mut m = TurnMapper::new("t1", "c1");
        let diff = "diff --git a/a.txt b/a.txt\nnew file mode 100644\n--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+hi\n";
        let out = run(
            &mut m,
            vec![
                started(),
                Event::Stop(TurnStop {
                    stop_reason: "end_turn".into(),
                    diff: diff.into(),
                    diff_files: vec!["a.txt".into()],
                    ..Default::default()
                }),
            ],
        );
        let art = out
            .iter()
            .find_map(|e| match e {
                StreamResponse::ArtifactUpdate(a) => Some(&a.artifact),
                _ => None,
            })
            .expect("the diff artifact");
        assert_eq!(art.artifact_id, "t1.diff");
        assert_eq!(art.parts.len(), 1);
        assert_eq!(
            art.parts[0].content,
            PartContent::Raw(base64(diff.as_bytes()))
        );
        assert_eq!(art.parts[0].media_type.as_deref(), Some("text/x-diff"));
        assert_eq!(art.parts[0].filename.as_deref(), Some("changes.diff"));
        let (status, _, meta) = final_status(&out);
        assert_eq!(status.state, TaskState::Completed);
        assert_eq!(meta["diff"]["files"], json!(["a.txt"]));
        assert_eq!(meta["diff"]["artifactId"], "t1.diff");
        // A turn that changed nothing has no diff artifact.
        let mut m = TurnMapper::new("t2", "c1");
        let out = run(&mut m, vec![started(), stop("end_turn", vec![], None)]);
        assert!(
            !out.iter()
                .any(|e| matches!(e, StreamResponse::ArtifactUpdate(_)))
        );
    }

    #[test]
    fn chunks_are_coalesced_into_one_appended_answer_and_end_completed() {
        let mut m = TurnMapper::new("t1", "c1");
        let mut out = run(&mut m, vec![started(), chunk("Hel"), chunk("lo")]);
        // The chunks stay buffered until the driver flushes (its stream had nothing more ready).
        assert_eq!(out.len(), 1);
        out.extend(m.flush(2_000));
        out.extend(run(
            &mut m,
            vec![chunk(" world"), stop("end_turn", vec![], None)],
        ));
        let arts: Vec<_> = out
            .iter()
            .filter_map(|e| match e {
                StreamResponse::ArtifactUpdate(a) => Some(a),
                _ => None,
            })
            .collect();
        assert_eq!(arts.len(), 2);
        assert_eq!(arts[0].artifact.parts, vec![Part::text("Hello")]);
        assert!(!arts[0].append && !arts[0].last_chunk);
        assert_eq!(arts[1].artifact.parts, vec![Part::text(" world")]);
        assert!(arts[1].append && arts[1].last_chunk);
        assert_eq!(arts[0].artifact.artifact_id, arts[1].artifact.artifact_id);
        let (status, text, _) = final_status(&out);
        assert_eq!(status.state, TaskState::Completed);
        assert_eq!(text, "completed");
        assert!(m.is_finished());
        assert!(m.on_event(&ev(9, chunk("late")), 1).is_empty());
    }

    #[test]
    fn a_big_burst_is_split_at_the_coalesce_size() {
        let mut m = TurnMapper::new("t1", "c1").with_coalesce_bytes(10);
        let out = run(
            &mut m,
            vec![started(), chunk("0123456"), chunk("789abc"), chunk("d")],
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            matches!(&out[1], StreamResponse::ArtifactUpdate(a) if a.artifact.parts == vec![Part::text("0123456789abc")])
        );
    }

    #[test]
    fn tool_calls_and_permission_decisions_are_status_messages_not_input_required() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                chunk("I will write it."),
                Event::ToolCall(ToolCallEvent {
                    tool_call_id: "tc1".into(),
                    kind: "edit".into(),
                    title: "Write hello.txt".into(),
                    status: "pending".into(),
                    raw_input_json: r#"{"path":"hello.txt"}"#.into(),
                    locations: vec![Location {
                        path: "hello.txt".into(),
                        line: None,
                    }],
                    content_text: String::new(),
                    update: false,
                }),
                Event::Permission(PermissionDecisionEvent {
                    decision_id: "d1".into(),
                    tool_call_id: "tc1".into(),
                    tool_kind: "edit".into(),
                    tool_title: "Write hello.txt".into(),
                    verdict: Verdict::Allow as i32,
                    rule: "floor.edit.inside-root".into(),
                    reason: "every path is inside the root".into(),
                    option_id_sent: "allow-once".into(),
                    cancelled: false,
                    end_turn: false,
                    policy_latency_micros: 120,
                }),
            ],
        );
        // WORKING, answer chunk (flushed before the tool call), tool call, permission.
        assert_eq!(out.len(), 4, "{out:#?}");
        assert!(matches!(&out[1], StreamResponse::ArtifactUpdate(_)));
        for e in &out {
            if let StreamResponse::StatusUpdate(s) = e {
                assert_eq!(s.status.state, TaskState::Working);
            }
        }
        let StreamResponse::StatusUpdate(tool) = &out[2] else {
            panic!()
        };
        let tmeta = &tool
            .status
            .message
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()[META_KEY];
        assert_eq!(tmeta["kind"], "tool_call");
        assert_eq!(tmeta["rawInput"]["path"], "hello.txt");
        assert_eq!(tmeta["locations"][0]["path"], "hello.txt");
        let StreamResponse::StatusUpdate(perm) = &out[3] else {
            panic!()
        };
        let msg = perm.status.message.as_ref().unwrap();
        let pmeta = &msg.metadata.as_ref().unwrap()[META_KEY];
        assert_eq!(pmeta["verdict"], "allow");
        assert_eq!(pmeta["rule"], "floor.edit.inside-root");
        assert_eq!(pmeta["reason"], "every path is inside the root");
        assert_eq!(
            msg.parts[0].content,
            crate::a2a::PartContent::Text(
                "permission allow: Write hello.txt (edit): every path is inside the root [rule floor.edit.inside-root]".into()
            )
        );
        assert!(m.pending_question().is_none());
    }

    #[test]
    fn tool_call_updates_keep_the_title_and_kind_of_the_first_report() {
        let mut m = TurnMapper::new("t1", "c1");
        let first = ToolCallEvent {
            tool_call_id: "tc1".into(),
            kind: "edit".into(),
            title: "Write hello.txt".into(),
            status: "pending".into(),
            ..Default::default()
        };
        let update = ToolCallEvent {
            tool_call_id: "tc1".into(),
            status: "completed".into(),
            update: true,
            ..Default::default()
        };
        let out = run(
            &mut m,
            vec![started(), Event::ToolCall(first), Event::ToolCall(update)],
        );
        let StreamResponse::StatusUpdate(s) = &out[2] else {
            panic!()
        };
        let msg = s.status.message.as_ref().unwrap();
        assert_eq!(
            msg.parts[0].content,
            crate::a2a::PartContent::Text("tool call completed: Write hello.txt (edit)".into())
        );
        assert_eq!(msg.metadata.as_ref().unwrap()[META_KEY]["update"], true);
    }

    #[test]
    fn an_escalated_then_denied_permission_is_reported_with_its_verdict() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                Event::Permission(PermissionDecisionEvent {
                    decision_id: "d2".into(),
                    tool_call_id: "tc2".into(),
                    tool_kind: "execute".into(),
                    tool_title: "rm -rf /".into(),
                    verdict: Verdict::Deny as i32,
                    rule: "escalate.non_interactive".into(),
                    reason: "no approver; escalation denied".into(),
                    ..Default::default()
                }),
            ],
        );
        let StreamResponse::StatusUpdate(perm) = &out[1] else {
            panic!()
        };
        assert_eq!(perm.status.state, TaskState::Working);
        let pmeta = &perm
            .status
            .message
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()[META_KEY];
        assert_eq!(pmeta["verdict"], "deny");
        // An unknown verdict number is reported as a denial, never as an allow.
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![Event::Permission(PermissionDecisionEvent {
                verdict: 42,
                ..Default::default()
            })],
        );
        let StreamResponse::StatusUpdate(perm) = &out[1] else {
            panic!()
        };
        assert_eq!(
            perm.status
                .message
                .as_ref()
                .unwrap()
                .metadata
                .as_ref()
                .unwrap()[META_KEY]["verdict"],
            "deny"
        );
    }

    #[test]
    fn end_turn_with_refusals_completes_with_a_note_listing_each() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                chunk("done"),
                stop(
                    "end_turn",
                    vec![
                        refusal("Write /etc/passwd", "path is outside the root"),
                        refusal("Write ../x", "path escapes the root"),
                    ],
                    None,
                ),
            ],
        );
        let (status, text, meta) = final_status(&out);
        assert_eq!(status.state, TaskState::Completed);
        assert!(text.contains("refused by policy: Write /etc/passwd (edit): path is outside the root [rule floor.edit.outside-root]"), "{text}");
        assert!(
            text.contains("refused by policy: Write ../x (edit): path escapes the root"),
            "{text}"
        );
        assert_eq!(meta["refusals"].as_array().unwrap().len(), 2);
        // The answer artifact closes before the final status.
        assert!(matches!(&out[out.len() - 2], StreamResponse::ArtifactUpdate(a) if a.last_chunk));
    }

    #[test]
    fn cancelled_after_a_refusal_is_canceled_saying_refused_by_policy() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                stop(
                    "cancelled",
                    vec![refusal("Write a.txt", "denied by operator rule")],
                    None,
                ),
            ],
        );
        let (status, text, _) = final_status(&out);
        assert_eq!(status.state, TaskState::Canceled);
        assert!(
            text.starts_with("refused by policy: Write a.txt (edit): denied by operator rule"),
            "{text}"
        );
    }

    #[test]
    fn faults_fail_the_task_with_the_fault_and_refusal_fails_it() {
        for (class, typed, msg, expect_state, expect_text) in [
            (
                "crash",
                FaultClass::Crash,
                "agent exited with signal 9",
                TaskState::Failed,
                "crash: agent exited with signal 9",
            ),
            (
                "timeout",
                FaultClass::Timeout,
                "turn exceeded 30 s",
                TaskState::Failed,
                "timeout: turn exceeded 30 s",
            ),
            (
                "output-limit",
                FaultClass::OutputLimit,
                "over 256 KiB",
                TaskState::Failed,
                "output-limit: over 256 KiB",
            ),
            (
                "startup",
                FaultClass::Startup,
                "no such binary",
                TaskState::Failed,
                "the agent could not start: no such binary",
            ),
            (
                "prompt-too-large",
                FaultClass::PromptTooLarge,
                "text over 16 KiB",
                TaskState::Rejected,
                "rejected: text over 16 KiB",
            ),
        ] {
            let mut m = TurnMapper::new("t1", "c1");
            let f = Fault {
                class: class.into(),
                message: msg.into(),
                fault_class: typed as i32,
            };
            let out = run(&mut m, vec![stop("fault", vec![], Some(f))]);
            let (status, text, meta) = final_status(&out);
            assert_eq!(status.state, expect_state, "{class}");
            assert_eq!(text, expect_text);
            assert_eq!(meta["fault"]["class"], class);
        }
        // A fault event followed by a stop without one still reports the fault.
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                Event::Fault(Fault {
                    class: "crash".into(),
                    message: "boom".into(),
                    fault_class: FaultClass::Crash as i32,
                }),
                stop("fault", vec![], None),
            ],
        );
        assert_eq!(final_status(&out).1, "crash: boom");
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(&mut m, vec![started(), stop("refusal", vec![], None)]);
        assert_eq!(final_status(&out).0.state, TaskState::Failed);
    }

    #[test]
    fn a_question_interrupts_and_an_answer_resumes() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                Event::Question(Question {
                    question_id: "q1".into(),
                    message: "Which file name?".into(),
                    requested_schema_json: r#"{"type":"string"}"#.into(),
                }),
            ],
        );
        let (status, text, meta) = final_status(&out);
        assert_eq!(status.state, TaskState::InputRequired);
        assert_eq!(text, "Which file name?");
        assert_eq!(meta["questionId"], "q1");
        assert_eq!(meta["requestedSchema"]["type"], "string");
        assert_eq!(m.pending_question(), Some("q1"));
        let resumed = m.question_answered(2);
        assert!(
            matches!(&resumed[0], StreamResponse::StatusUpdate(s) if s.status.state == TaskState::Working)
        );
        assert!(m.pending_question().is_none());
        assert!(m.question_answered(3).is_empty());
    }

    #[test]
    fn a_turn_that_answers_and_ends_before_the_answer_is_reported_still_passes_through_working() {
        let mut m = TurnMapper::new("t1", "c1");
        run(
            &mut m,
            vec![
                started(),
                Event::Question(Question {
                    question_id: "q1".into(),
                    message: "Which file name?".into(),
                    requested_schema_json: r#"{"type":"string"}"#.into(),
                }),
            ],
        );
        let out = run(&mut m, vec![chunk("done"), stop("end_turn", vec![], None)]);
        let states: Vec<TaskState> = out
            .iter()
            .filter_map(|e| match e {
                StreamResponse::StatusUpdate(s) => Some(s.status.state),
                _ => None,
            })
            .collect();
        assert_eq!(
            states,
            vec![TaskState::Working, TaskState::Completed],
            "{out:?}"
        );
        assert!(m.question_answered(3).is_empty(), "reported once only");
    }

    #[test]
    fn a_cancel_request_ends_canceled_however_the_turn_stops() {
        let mut m = TurnMapper::new("t1", "c1");
        run(&mut m, vec![started()]);
        m.request_cancel();
        let out = run(&mut m, vec![stop("end_turn", vec![], None)]);
        let (status, text, _) = final_status(&out);
        assert_eq!(status.state, TaskState::Canceled);
        assert_eq!(text, "canceled at the caller's request");
        // And a forced cancel (no stop arrived in time) also ends CANCELED, once.
        let mut m = TurnMapper::new("t1", "c1");
        run(&mut m, vec![started()]);
        let out = m.force_cancel(5);
        assert_eq!(final_status(&out).0.state, TaskState::Canceled);
        assert!(m.force_cancel(6).is_empty());
    }

    #[test]
    fn a_turn_that_never_started_reports_its_fault() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = m.not_started(
            Fault {
                class: "startup".into(),
                message: "program not found".into(),
                fault_class: FaultClass::Startup as i32,
            },
            1,
        );
        let (status, text, meta) = final_status(&out);
        assert_eq!(status.state, TaskState::Failed);
        assert_eq!(text, "the agent could not start: program not found");
        assert_eq!(meta["fault"]["class"], "startup");
        let mut m = TurnMapper::new("t1", "c1");
        let out = m.not_started(
            Fault {
                class: "rejected".into(),
                message: "task text is empty".into(),
                fault_class: FaultClass::Rejected as i32,
            },
            1,
        );
        assert_eq!(final_status(&out).0.state, TaskState::Rejected);
    }

    #[test]
    fn a_stream_that_ends_without_a_stop_fails_the_task() {
        let mut m = TurnMapper::new("t1", "c1");
        run(&mut m, vec![started(), chunk("partial")]);
        let out = m.stream_ended("supervisor unavailable: connection refused", 9);
        let (status, text, _) = final_status(&out);
        assert_eq!(status.state, TaskState::Failed);
        assert!(text.contains("supervisor unavailable"), "{text}");
        // The partial answer is kept and closed.
        assert!(
            out.iter()
                .any(|e| matches!(e, StreamResponse::ArtifactUpdate(a) if a.last_chunk))
        );
    }

    #[test]
    fn an_egress_refusal_is_a_working_note_naming_the_host_and_the_setting() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                Event::EgressRefused(warden_proto::v1::EgressRefused {
                    host: "evil.example".into(),
                    port: 443,
                    address: String::new(),
                    message:
                        "egress to evil.example:443 refused: not in [agents.claude] egress_allow"
                            .into(),
                    setting: "agents.claude.egress_allow".into(),
                }),
            ],
        );
        let note = out
            .iter()
            .find_map(|e| match e {
                StreamResponse::StatusUpdate(s)
                    if s.status
                        .message
                        .as_ref()
                        .and_then(|m| m.metadata.as_ref())
                        .is_some_and(|md| md[META_KEY]["kind"] == "egress_refused") =>
                {
                    Some(s)
                }
                _ => None,
            })
            .expect("an egress note");
        assert_eq!(note.status.state, TaskState::Working);
        let msg = note.status.message.as_ref().expect("message");
        let text = serde_json::to_string(&msg.parts).unwrap_or_default();
        assert!(text.contains("evil.example:443 refused"), "{text}");
        assert!(text.contains("[agents.claude] egress_allow"), "{text}");
        let md = msg.metadata.as_ref().expect("metadata");
        assert_eq!(md[META_KEY]["host"], "evil.example");
        assert_eq!(md[META_KEY]["port"], 443);
        assert_eq!(md[META_KEY]["setting"], "agents.claude.egress_allow");
    }

    /// The status a turn's lone `Queued` event becomes.
    fn queued_status(position: u32, admission: bool, agent: bool) -> TaskStatus {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![Event::Queued(TurnQueued {
                position,
                admission,
                agent,
            })],
        );
        first_status_update(&out).status.clone()
    }

    #[test]
    fn a_turn_waiting_for_admission_is_working_with_its_place() {
        let status = queued_status(3, true, false);
        assert_eq!(status.state, TaskState::Working);
        let msg = status.message.as_ref().expect("a status message");
        let md = msg.metadata.as_ref().expect("metadata");
        assert_eq!(md[META_KEY]["kind"], "admission");
        assert_eq!(md[META_KEY]["position"], 3);
    }

    #[test]
    fn a_turn_waiting_for_an_agent_is_working_with_its_place() {
        let status = queued_status(2, false, true);
        assert_eq!(status.state, TaskState::Working);
        let msg = status.message.as_ref().expect("a status message");
        assert_eq!(
            msg.parts,
            vec![Part::text("queued for an agent, position 2")]
        );
        let md = msg.metadata.as_ref().expect("metadata");
        assert_eq!(md[META_KEY]["kind"], "agent");
        assert_eq!(md[META_KEY]["position"], 2);
    }

    #[test]
    fn queue_plan_mode_and_thoughts_are_reported() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                Event::Queued(TurnQueued {
                    position: 2,
                    admission: false,
                    agent: false,
                }),
                started(),
                Event::ThoughtChunk(TextChunk {
                    text: "thinking".into(),
                    ..Default::default()
                }),
                Event::Plan(PlanEvent {
                    entries: vec![PlanEntry {
                        content: "write file".into(),
                        priority: "high".into(),
                        status: "pending".into(),
                    }],
                }),
                Event::ModeChange(warden_proto::v1::ModeChange {
                    mode_id: "default".into(),
                    supervised: true,
                    by_supervisor: true,
                }),
            ],
        );
        let kinds: Vec<String> = out
            .iter()
            .map(|e| match e {
                StreamResponse::StatusUpdate(s) => format!(
                    "{}:{}",
                    s.status.state.as_str(),
                    s.status
                        .message
                        .as_ref()
                        .and_then(|m| m.metadata.as_ref())
                        .map(|m| m[META_KEY]["kind"].as_str().unwrap_or("").to_string())
                        .unwrap_or_default()
                ),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "TASK_STATE_SUBMITTED:queued",
                "TASK_STATE_WORKING:",
                "TASK_STATE_WORKING:thought",
                "TASK_STATE_WORKING:plan",
                "TASK_STATE_WORKING:mode",
            ]
        );
    }

    fn hinted_chunk(text: &str, meta: Value) -> Event {
        Event::MessageChunk(TextChunk {
            text: text.into(),
            meta_json: meta.to_string(),
        })
    }

    fn artifacts(out: &[StreamResponse]) -> Vec<&TaskArtifactUpdateEvent> {
        out.iter()
            .filter_map(|e| match e {
                StreamResponse::ArtifactUpdate(a) => Some(a),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("tck", "dGNr"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc, "{plain:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn hints_are_read_and_malformed_ones_ignored() {
        let a = |v: Value| ChunkHint::parse(&json!({"warden": {"artifact": v}}).to_string());
        let ok = a(json!({"artifactId": "x", "kind": "data", "lastChunk": true}));
        assert!(
            matches!(&ok, ChunkHint::Artifact(h) if h.kind == ArtifactKind::Data && h.last_chunk == Some(true)),
            "{ok:?}"
        );
        assert!(matches!(
            a(json!({"artifactId": "x", "kind": "file_url"})),
            ChunkHint::Artifact(ArtifactHint {
                kind: ArtifactKind::Url,
                ..
            })
        ));
        // Adversarial or sloppy hints are no hints: the chunk stays answer text.
        for bad in [
            json!({"kind": "text"}),
            json!({"artifactId": "", "kind": "text"}),
            json!({"artifactId": 7, "kind": "text"}),
            json!({"artifactId": "x", "kind": "hologram"}),
            json!({"artifactId": "x", "append": "yes"}),
            json!({"artifactId": "x\u{7}bell"}),
            json!({"artifactId": "x".repeat(MAX_HINT_FIELD + 1)}),
            json!({"artifactId": "x", "filename": ["a"]}),
            json!("text"),
        ] {
            assert_eq!(a(bad.clone()), ChunkHint::None, "{bad}");
        }
        for raw in [
            "",
            "{",
            "null",
            "[]",
            "{\"warden\": 3}",
            "{\"other\": {\"a2a\": \"message\"}}",
        ] {
            assert_eq!(ChunkHint::parse(raw), ChunkHint::None, "{raw}");
        }
        let huge = json!({"warden": {"a2a": "message"}, "pad": "x".repeat(MAX_HINT_META_BYTES)});
        assert_eq!(ChunkHint::parse(&huge.to_string()), ChunkHint::None);
        assert_eq!(
            ChunkHint::parse(r#"{"warden": {"a2a": "message"}}"#),
            ChunkHint::Message
        );
        assert_eq!(
            ChunkHint::parse(r#"{"warden": {"a2a": "reject"}}"#),
            ChunkHint::Reject
        );
        assert_eq!(
            ChunkHint::parse(r#"{"warden": {"a2a": "shout"}}"#),
            ChunkHint::None
        );
    }

    #[test]
    fn hinted_chunks_become_their_artifacts_in_order() {
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![
                started(),
                chunk("before "),
                hinted_chunk(
                    r#"{"count": 42}"#,
                    json!({"warden": {"artifact": {"artifactId": "d", "kind": "data"}}}),
                ),
                hinted_chunk(
                    "https://example.com/o.txt",
                    json!({"warden": {"artifact": {"artifactId": "u", "kind": "url",
                        "filename": "o.txt", "mediaType": "text/plain"}}}),
                ),
                hinted_chunk(
                    "{not json",
                    json!({"warden": {"artifact": {"artifactId": "bad", "kind": "data"}}}),
                ),
                stop("end_turn", vec![], None),
            ],
        );
        let arts = artifacts(&out);
        // The answer text that came first is sent first.
        assert_eq!(arts[0].artifact.artifact_id, "t1-answer");
        assert_eq!(arts[1].artifact.artifact_id, "t1-d");
        assert_eq!(
            arts[1].artifact.parts[0].content,
            PartContent::Data(json!({"count": 42}))
        );
        assert!(arts[1].last_chunk && !arts[1].append);
        assert_eq!(
            arts[2].artifact.parts[0].content,
            PartContent::Url("https://example.com/o.txt".into())
        );
        assert_eq!(arts[2].artifact.parts[0].filename.as_deref(), Some("o.txt"));
        // Content that does not fit its kind is still delivered, as text.
        assert_eq!(
            arts[3].artifact.parts[0].content,
            PartContent::Text("{not json".into())
        );
        assert!(!m.direct_message());
    }

    #[test]
    fn append_is_never_claimed_for_a_first_chunk() {
        let mut m = TurnMapper::new("t1", "c1");
        let hint = |append: bool| json!({"warden": {"artifact": {"artifactId": "c", "kind": "text", "append": append}}});
        let out = run(
            &mut m,
            vec![
                started(),
                hinted_chunk("a", hint(true)),
                hinted_chunk("b", hint(true)),
                stop("end_turn", vec![], None),
            ],
        );
        let arts = artifacts(&out);
        assert!(!arts[0].append, "nothing to append to yet");
        assert!(arts[1].append);
    }

    #[test]
    fn a_direct_reply_only_for_a_clean_turn() {
        let reply = || hinted_chunk("hi there", json!({"warden": {"a2a": "message"}}));
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![started(), reply(), stop("end_turn", vec![], None)],
        );
        let (st, text, meta) = final_status(&out);
        assert_eq!(st.state, TaskState::Completed);
        assert_eq!(text, "hi there");
        assert_eq!(meta["directMessage"], true);
        assert!(artifacts(&out).is_empty());
        assert!(m.direct_message());

        // A refusal, a tool call, or plain answer text: a task, with the reply as answer text.
        let tool = Event::ToolCall(ToolCallEvent {
            tool_call_id: "tc".into(),
            kind: "edit".into(),
            ..Default::default()
        });
        for (name, events) in [
            (
                "refusal",
                vec![
                    started(),
                    reply(),
                    stop("end_turn", vec![refusal("Write x", "no")], None),
                ],
            ),
            (
                "tool",
                vec![started(), tool, reply(), stop("end_turn", vec![], None)],
            ),
            (
                "text",
                vec![
                    started(),
                    chunk("plain "),
                    reply(),
                    stop("end_turn", vec![], None),
                ],
            ),
            (
                "mode",
                vec![
                    started(),
                    Event::ModeChange(warden_proto::v1::ModeChange {
                        mode_id: "bypassPermissions".into(),
                        supervised: false,
                        by_supervisor: false,
                    }),
                    reply(),
                    stop("end_turn", vec![], None),
                ],
            ),
        ] {
            let mut m = TurnMapper::new("t1", "c1");
            let out = run(&mut m, events);
            assert!(!m.direct_message(), "{name}");
            let answer: String = artifacts(&out)
                .iter()
                .map(|a| match &a.artifact.parts[0].content {
                    PartContent::Text(t) => t.clone(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert!(answer.ends_with("hi there"), "{name}: {answer:?}");
            let (st, text, _) = final_status(&out);
            assert_eq!(st.state, TaskState::Completed, "{name}");
            assert!(text.starts_with("completed"), "{name}: {text}");
        }
    }

    #[test]
    fn only_an_explicit_rejection_with_a_refusal_stop_is_rejected() {
        let reject = || hinted_chunk("not my job", json!({"warden": {"a2a": "reject"}}));
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![started(), reject(), stop("refusal", vec![], None)],
        );
        let (st, text, meta) = final_status(&out);
        assert_eq!(st.state, TaskState::Rejected);
        assert_eq!(text, "not my job");
        assert_eq!(meta["rejectedByAgent"], true);

        // A plain refusal stays FAILED (issue 7).
        let mut m = TurnMapper::new("t1", "c1");
        let out = run(
            &mut m,
            vec![started(), chunk("no"), stop("refusal", vec![], None)],
        );
        assert_eq!(final_status(&out).0.state, TaskState::Failed);

        // A caller's cancel wins over the agent's rejection.
        let mut m = TurnMapper::new("t1", "c1");
        m.request_cancel();
        let out = run(
            &mut m,
            vec![started(), reject(), stop("refusal", vec![], None)],
        );
        assert_eq!(final_status(&out).0.state, TaskState::Canceled);
    }
}
