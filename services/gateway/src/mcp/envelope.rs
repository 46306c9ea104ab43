//! The result envelope of `advise`, `review` and `implement`: what warden observed of a turn,
//! plus the agent's own six decision fields when it gave them. Pure (no I/O), so every rule here
//! is unit-tested.
//!
//! Who says what: `status` timeout and refused, every `blockers` entry that is a policy refusal
//! or a fault, `files_touched`, and the harness fields are warden's observations and are never
//! taken from model output. The agent's `status` (complete | partial | blocked), `verdict`,
//! `findings`, `remaining` and its own blockers are used when it ended with the JSON object it
//! was asked for; without one the envelope is still produced, with `status` partial.
//!
//! Bounded: at most [`MAX_ITEMS`] entries per list, [`MAX_TEXT`] characters per string, and
//! [`MAX_ENVELOPE_BYTES`] of JSON in all (findings are dropped from the end first); `truncated`
//! says so and the rest stays in the transcript.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

/// Entries kept per list.
pub const MAX_ITEMS: usize = 64;
/// Characters kept per string.
pub const MAX_TEXT: usize = 4096;
/// The envelope's JSON at most.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024;
/// The diff's text kept in an envelope at most (cut at a line's end past it).
pub const MAX_DIFF_TEXT: usize = 32 * 1024;
/// `{` positions (from the end) tried as the start of the decision object.
pub const DECISION_CANDIDATES: usize = 256;
/// The answer text retained per attempt for the decision fields (the tail is kept).
pub const ANSWER_TAIL_BYTES: usize = 128 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Complete,
    Partial,
    Blocked,
    Timeout,
    Refused,
}

impl Status {
    /// `isError` on the tool result.
    pub fn is_error(self) -> bool {
        matches!(self, Status::Blocked | Status::Timeout | Status::Refused)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockerKind {
    /// A permission the policy refused (rule and reason are the policy's).
    Policy,
    /// A fault of the turn (timeout, crash, protocol, output limit, startup, ...).
    Fault,
    /// warden refused the request before anything started.
    Refused,
    /// The caller cancelled the call.
    Cancelled,
    /// A question of the agent that was not answered.
    Question,
    /// Reported by the agent in its decision fields (not verified by warden).
    Agent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    pub kind: BlockerKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

impl Blocker {
    pub fn refused(rule: &str, reason: impl Into<String>) -> Self {
        Self {
            kind: BlockerKind::Refused,
            rule: Some(rule.to_string()),
            reason: reason.into(),
            tool: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incident {
    /// The fault class (`timeout`, `crash`, `startup`, ...).
    pub class: String,
    pub reason: String,
}

/// One tool call as the turn's events showed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSeen {
    pub kind: String,
    pub title: String,
    pub status: String,
    pub locations: Vec<String>,
    /// The policy's verdict when a permission was asked: Some(true) allowed, Some(false) refused.
    pub allowed: Option<bool>,
}

/// A fault as the supervisor reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSeen {
    pub class: String,
    pub timeout: bool,
    pub message: String,
}

/// What warden observed of one attempt (one supervisor turn).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The tail of the agent's answer text.
    pub answer: String,
    /// The conversation's root, as the turn's start reported it.
    pub root: String,
    pub tools: BTreeMap<String, ToolSeen>,
    /// Every policy refusal of the turn (from its stop).
    pub refusals: Vec<Blocker>,
    pub faults: Vec<FaultSeen>,
    pub stop_reason: String,
    pub transcript_path: String,
    pub duration_ms: u64,
    /// Questions the caller could not be asked, or declined.
    pub unanswered: Vec<String>,
    /// The caller cancelled the call while it ran.
    pub cancelled: bool,
    /// Files the supervisor saw change under the root, walking it before and after the turn.
    pub changed_files: Vec<String>,
    /// False when the supervisor could not walk the root (too large, unreadable).
    pub changed_files_known: bool,
    /// The conversation's change to its root so far, when this turn changed files.
    pub diff: Option<Diff>,
}

/// The supervisor's unified diff of the root (its baseline against the turn's end).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Diff {
    /// git's format (`git apply` takes it); at most [`MAX_DIFF_TEXT`] bytes here.
    pub text: String,
    /// Every file the diff is about, also those cut from `text`.
    pub files: Vec<String>,
    /// True when `text` stops before the end of the diff.
    pub cut: bool,
}

impl Observed {
    /// Appends answer text, keeping only the tail.
    pub fn push_answer(&mut self, text: &str) {
        self.answer.push_str(text);
        if self.answer.len() > ANSWER_TAIL_BYTES {
            let mut cut = self.answer.len() - ANSWER_TAIL_BYTES;
            while !self.answer.is_char_boundary(cut) {
                cut += 1;
            }
            self.answer.drain(..cut);
        }
    }

    pub fn timed_out(&self) -> bool {
        self.faults.iter().any(|f| f.timeout)
    }

    /// Files touched, observed, and where the observation comes from: what the supervisor saw
    /// change walking the root before and after the turn ("root"); when it could not walk it,
    /// the edits/deletes/moves the turn's events show completed and allowed ("tool-calls").
    /// Never what the model claims.
    pub fn files_touched(&self) -> (Vec<String>, &'static str) {
        if self.changed_files_known {
            return (self.changed_files.clone(), "root");
        }
        let mut out: Vec<String> = Vec::new();
        for t in self.tools.values() {
            let writes = matches!(t.kind.as_str(), "edit" | "delete" | "move");
            if writes && t.status == "completed" && t.allowed != Some(false) {
                for l in &t.locations {
                    let rel = relative_to(l, &self.root);
                    if !rel.is_empty() && !out.contains(&rel) {
                        out.push(rel);
                    }
                }
            }
        }
        for f in &self.changed_files {
            if !out.contains(f) {
                out.push(f.clone());
            }
        }
        (out, "tool-calls")
    }
}

fn relative_to(path: &str, root: &str) -> String {
    let root = root.trim_end_matches('/');
    if !root.is_empty()
        && let Some(rest) = path.strip_prefix(root)
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return rest.trim_start_matches('/').to_string();
    }
    path.to_string()
}

/// The six decision fields as the agent gave them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub status: Option<Status>,
    pub verdict: String,
    pub findings: Vec<String>,
    pub files_touched: Vec<String>,
    pub remaining: Vec<String>,
    pub blockers: Vec<String>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        _ => Vec::new(),
    }
}

fn decision_of(obj: &serde_json::Map<String, Value>) -> Option<Decision> {
    let status = obj.get("status")?.as_str()?;
    // The model may say complete, partial or blocked; timeout and refused are warden's to say.
    let status = match status {
        "complete" => Status::Complete,
        "blocked" => Status::Blocked,
        _ => Status::Partial,
    };
    Some(Decision {
        status: Some(status),
        verdict: match obj.get("verdict") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        },
        findings: strings(obj.get("findings")),
        files_touched: strings(obj.get("files_touched")),
        remaining: strings(obj.get("remaining")),
        blockers: strings(obj.get("blockers")),
    })
}

/// The last JSON object in `answer` that carries a `status` field: a fenced ```json block or a
/// bare object. None when there is none (the envelope is then built from observation alone).
pub fn parse_decision(answer: &str) -> Option<Decision> {
    // Every '{' is a candidate start, from the end: the agent was asked to *end* with it.
    // At most DECISION_CANDIDATES starts are tried (each parse reads at most the tail after
    // it), so an answer full of braces costs bounded work.
    let bytes = answer.as_bytes();
    let mut found = None;
    let starts = bytes
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'{')
        .take(DECISION_CANDIDATES);
    for (i, _) in starts {
        let mut de = serde_json::Deserializer::from_str(&answer[i..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(obj))) = de.next()
            && let Some(d) = decision_of(&obj)
        {
            found = Some(d);
            break;
        }
    }
    found
}

fn clip(s: &str, max: usize) -> (String, bool) {
    if s.chars().count() <= max {
        return (s.to_string(), false);
    }
    (s.chars().take(max).collect::<String>() + "…", true)
}

fn clip_list(v: Vec<String>, truncated: &mut bool) -> Vec<String> {
    if v.len() > MAX_ITEMS {
        *truncated = true;
    }
    v.into_iter()
        .take(MAX_ITEMS)
        .map(|s| {
            let (s, t) = clip(&s, MAX_TEXT);
            *truncated |= t;
            s
        })
        .collect()
}

/// The envelope as returned in `structuredContent`.
#[derive(Debug, Clone, Serialize)]
pub struct Envelope {
    pub status: Status,
    pub verdict: String,
    pub findings: Vec<String>,
    pub files_touched: Vec<String>,
    /// Where `files_touched` was observed: "root" (the supervisor's walk of the root before and
    /// after), "tool-calls" (the turn's completed edits, when the root could not be walked), or
    /// "none" (nothing ran).
    pub files_touched_from: &'static str,
    /// The conversation's change to its root so far as a unified diff (null when this turn
    /// changed no file or nothing ran).
    pub diff: Option<Diff>,
    pub remaining: Vec<String>,
    pub blockers: Vec<Blocker>,
    pub run_id: String,
    pub duration_ms: u64,
    pub depth: u32,
    pub transcript_path: Option<String>,
    pub incident: Option<Incident>,
    pub verb: String,
    pub agent: String,
    pub attempts: u32,
    pub truncated: bool,
}

/// The harness fields every envelope carries.
#[derive(Debug, Clone, Default)]
pub struct Harness {
    pub run_id: String,
    pub verb: String,
    pub agent: String,
    pub depth: u32,
    pub duration_ms: u64,
    pub attempts: u32,
}

impl Envelope {
    /// A request refused before anything started.
    pub fn refused(h: Harness, blocker: Blocker) -> Self {
        let verdict = format!("refused: {}", blocker.reason);
        Self::bounded(Self {
            status: Status::Refused,
            verdict,
            findings: vec![],
            files_touched: vec![],
            files_touched_from: "none",
            diff: None,
            remaining: vec![],
            blockers: vec![blocker],
            run_id: h.run_id,
            duration_ms: h.duration_ms,
            depth: h.depth,
            transcript_path: None,
            incident: None,
            verb: h.verb,
            agent: h.agent,
            attempts: h.attempts,
            truncated: false,
        })
    }

    /// The envelope of a finished attempt (the last one when a read verb was retried).
    pub fn from_observed(h: Harness, o: &Observed) -> Self {
        let decision = parse_decision(&o.answer);
        let mut blockers: Vec<Blocker> = o.refusals.clone();
        for f in &o.faults {
            blockers.push(Blocker {
                kind: BlockerKind::Fault,
                rule: Some(f.class.clone()),
                reason: f.message.clone(),
                tool: None,
            });
        }
        for q in &o.unanswered {
            blockers.push(Blocker {
                kind: BlockerKind::Question,
                rule: None,
                reason: q.clone(),
                tool: None,
            });
        }
        if o.cancelled {
            blockers.push(Blocker {
                kind: BlockerKind::Cancelled,
                rule: None,
                reason: "the caller cancelled the call; the turn was cancelled".into(),
                tool: None,
            });
        }
        if let Some(d) = &decision {
            for b in &d.blockers {
                blockers.push(Blocker {
                    kind: BlockerKind::Agent,
                    rule: None,
                    reason: b.clone(),
                    tool: None,
                });
            }
        }
        let fault = o.faults.last();
        let status = if o.timed_out() {
            Status::Timeout
        } else if fault.is_some()
            || o.cancelled
            || o.stop_reason == "cancelled"
            || o.stop_reason == "refusal"
        {
            Status::Blocked
        } else {
            decision
                .as_ref()
                .and_then(|d| d.status)
                .unwrap_or(Status::Partial)
        };
        let verdict = match (&decision, status) {
            (_, Status::Timeout) => "the turn passed its hard time limit and was stopped".into(),
            (Some(d), _) if !d.verdict.is_empty() => d.verdict.clone(),
            _ => {
                // No decision: the tail of what the agent said is the best summary there is.
                let t = o.answer.trim();
                let start = t
                    .char_indices()
                    .rev()
                    .nth(MAX_TEXT.saturating_sub(1))
                    .map(|(i, _)| i)
                    .unwrap_or(0);
                t[start..].to_string()
            }
        };
        let (findings, remaining) = match &decision {
            Some(d) => (d.findings.clone(), d.remaining.clone()),
            None => (
                vec![],
                if status == Status::Partial {
                    vec![
                        "the agent did not end with the decision fields; read the transcript"
                            .into(),
                    ]
                } else {
                    vec![]
                },
            ),
        };
        let (files_touched, files_touched_from) = o.files_touched();
        Self::bounded(Self {
            status,
            verdict,
            findings,
            files_touched,
            files_touched_from,
            diff: o.diff.clone(),
            remaining,
            blockers,
            run_id: h.run_id,
            duration_ms: h.duration_ms,
            depth: h.depth,
            transcript_path: (!o.transcript_path.is_empty()).then(|| o.transcript_path.clone()),
            incident: fault.map(|f| Incident {
                class: f.class.clone(),
                reason: f.message.clone(),
            }),
            verb: h.verb,
            agent: h.agent,
            attempts: h.attempts,
            truncated: false,
        })
    }

    fn bounded(mut e: Self) -> Self {
        let mut t = false;
        let (v, vt) = clip(&e.verdict, MAX_TEXT);
        e.verdict = v;
        t |= vt;
        e.findings = clip_list(std::mem::take(&mut e.findings), &mut t);
        e.files_touched = clip_list(std::mem::take(&mut e.files_touched), &mut t);
        e.remaining = clip_list(std::mem::take(&mut e.remaining), &mut t);
        if e.blockers.len() > MAX_ITEMS {
            t = true;
            e.blockers.truncate(MAX_ITEMS);
        }
        for b in &mut e.blockers {
            let (r, rt) = clip(&b.reason, MAX_TEXT);
            b.reason = r;
            t |= rt;
        }
        if let Some(d) = &mut e.diff {
            if d.files.len() > MAX_ITEMS {
                d.files.truncate(MAX_ITEMS);
                d.cut = true;
            }
            if d.text.len() > MAX_DIFF_TEXT {
                cut_lines(&mut d.text, MAX_DIFF_TEXT);
                d.cut = true;
            }
        }
        e.truncated = t;
        while serde_json::to_vec(&e).map(|v| v.len()).unwrap_or(0) > MAX_ENVELOPE_BYTES {
            e.truncated = true;
            // The diff's text goes first: its files stay named, and the whole diff is the task's.
            if let Some(d) = e.diff.as_mut().filter(|d| !d.text.is_empty()) {
                let half = d.text.len() / 2;
                cut_lines(&mut d.text, half);
                d.cut = true;
                continue;
            }
            if e.findings.pop().is_none() && e.remaining.pop().is_none() {
                // Blockers are kept longest: they are what the caller must act on.
                if e.files_touched.pop().is_none() && e.blockers.pop().is_none() {
                    break;
                }
            }
        }
        e
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Cuts `text` to at most `max` bytes, at the end of a line.
fn cut_lines(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let end = text[..end].rfind('\n').map_or(0, |i| i + 1);
    text.truncate(end);
}

/// The `outputSchema` of the verbs.
pub fn output_schema() -> Value {
    let strings = json!({"type": "array", "items": {"type": "string"}, "maxItems": MAX_ITEMS});
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["status", "verdict", "findings", "files_touched", "files_touched_from", "diff", "remaining", "blockers",
                     "run_id", "duration_ms", "depth", "transcript_path", "incident",
                     "verb", "agent", "attempts", "truncated"],
        "properties": {
            "status": {"type": "string", "enum": ["complete", "partial", "blocked", "timeout", "refused"],
                       "description": "timeout and refused are warden's own observations; isError is true for blocked, timeout and refused"},
            "verdict": {"type": "string", "maxLength": MAX_TEXT + 1},
            "findings": strings,
            "files_touched": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_ITEMS,
                              "description": "files warden saw change under the root (relative to it), not what the model claims"},
            "files_touched_from": {"type": "string", "enum": ["root", "tool-calls", "none"],
                                   "description": "root: the supervisor walked the root before and after the turn; tool-calls: the root could not be walked, so the turn's completed edits are listed"},
            "diff": {"type": ["object", "null"], "additionalProperties": false,
                     "required": ["text", "files", "cut"],
                     "description": "what the conversation changed in its root so far, as a unified diff in git's format computed by warden from the root's contents (links never followed); null when this turn changed no file",
                     "properties": {
                         "text": {"type": "string", "maxLength": MAX_DIFF_TEXT},
                         "files": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_ITEMS},
                         "cut": {"type": "boolean", "description": "the text stops before the diff's end (its cap, or the envelope's)"}}},
            "remaining": strings,
            "blockers": {"type": "array", "maxItems": MAX_ITEMS, "items": {
                "type": "object", "additionalProperties": false, "required": ["kind", "reason"],
                "properties": {
                    "kind": {"type": "string", "enum": ["policy", "fault", "refused", "cancelled", "question", "agent"]},
                    "rule": {"type": "string"},
                    "reason": {"type": "string"},
                    "tool": {"type": "string"}
                }}},
            "run_id": {"type": "string"},
            "duration_ms": {"type": "integer", "minimum": 0},
            "depth": {"type": "integer", "minimum": 0},
            "transcript_path": {"type": ["string", "null"]},
            "incident": {"type": ["object", "null"], "additionalProperties": false,
                         "required": ["class", "reason"],
                         "properties": {"class": {"type": "string"}, "reason": {"type": "string"}}},
            "verb": {"type": "string"},
            "agent": {"type": "string"},
            "attempts": {"type": "integer", "minimum": 0},
            "truncated": {"type": "boolean", "description": format!("lists hold at most {MAX_ITEMS} entries, strings {MAX_TEXT} characters, the envelope {MAX_ENVELOPE_BYTES} bytes; the rest is in the transcript")}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> Harness {
        Harness {
            run_id: "r".into(),
            verb: "review".into(),
            agent: "scripted".into(),
            depth: 0,
            duration_ms: 5,
            attempts: 1,
        }
    }

    #[test]
    fn the_last_decision_object_is_read_fenced_or_bare() {
        let t = "I looked.\n```json\n{\"status\":\"complete\",\"verdict\":\"fine\",\"findings\":[\"a\"],\"files_touched\":[],\"remaining\":[],\"blockers\":[]}\n```\n";
        let d = parse_decision(t).unwrap();
        assert_eq!(d.status, Some(Status::Complete));
        assert_eq!(d.findings, vec!["a"]);
        let t = "{\"status\":\"blocked\"} then {\"x\":1} and finally {\"status\":\"partial\",\"verdict\":\"v\"}";
        assert_eq!(parse_decision(t).unwrap().verdict, "v");
        assert!(parse_decision("no json {here").is_none());
        // Braces everywhere: bounded work, and a decision after them is still found.
        let noisy = format!("{}{{\"status\":\"complete\"}}", "{\"a\":".repeat(20_000));
        assert_eq!(
            parse_decision(&noisy).unwrap().status,
            Some(Status::Complete)
        );
        assert!(parse_decision(&"{".repeat(100_000)).is_none());
        assert!(parse_decision("{\"verdict\":\"no status\"}").is_none());
    }

    #[test]
    fn a_model_cannot_claim_timeout_or_refused() {
        let o = Observed {
            answer: "{\"status\":\"timeout\",\"verdict\":\"x\"}".into(),
            stop_reason: "end_turn".into(),
            ..Default::default()
        };
        assert_eq!(Envelope::from_observed(h(), &o).status, Status::Partial);
        let o = Observed {
            answer: "{\"status\":\"refused\"}".into(),
            stop_reason: "end_turn".into(),
            ..Default::default()
        };
        assert_eq!(Envelope::from_observed(h(), &o).status, Status::Partial);
    }

    #[test]
    fn without_decision_fields_the_envelope_is_partial_from_observation() {
        let mut o = Observed {
            answer: "did some things".into(),
            stop_reason: "end_turn".into(),
            root: "/r/x".into(),
            ..Default::default()
        };
        o.tools.insert(
            "t1".into(),
            ToolSeen {
                kind: "edit".into(),
                status: "completed".into(),
                locations: vec!["/r/x/src/a.rs".into()],
                allowed: Some(true),
                ..Default::default()
            },
        );
        o.tools.insert(
            "t2".into(),
            ToolSeen {
                kind: "edit".into(),
                status: "failed".into(),
                locations: vec!["/r/x/b.rs".into()],
                allowed: Some(false),
                ..Default::default()
            },
        );
        let e = Envelope::from_observed(h(), &o);
        assert_eq!(e.status, Status::Partial);
        assert_eq!(e.verdict, "did some things");
        assert_eq!(e.files_touched, vec!["src/a.rs"]);
        assert_eq!(e.files_touched_from, "tool-calls");
        assert!(!e.status.is_error());
        // When the root was walked, the walk is the observation (a shell write included).
        o.changed_files = vec!["made-by-shell.txt".into()];
        o.changed_files_known = true;
        let e = Envelope::from_observed(h(), &o);
        assert_eq!(e.files_touched, vec!["made-by-shell.txt"]);
        assert_eq!(e.files_touched_from, "root");
    }

    #[test]
    fn the_diff_is_carried_and_cut_at_a_line_to_fit() {
        let line = format!("+{}\n", "x".repeat(99));
        let o = Observed {
            diff: Some(Diff {
                text: line.repeat(2000),
                files: vec!["a".into()],
                cut: false,
            }),
            ..Default::default()
        };
        let e = Envelope::from_observed(h(), &o);
        let d = e.diff.as_ref().expect("the diff");
        assert!(d.cut);
        assert_eq!(d.files, vec!["a"]);
        assert!(d.text.len() <= MAX_DIFF_TEXT && d.text.len() > MAX_DIFF_TEXT / 2);
        assert!(d.text.ends_with('\n') && d.text.len().is_multiple_of(line.len()));
        assert!(serde_json::to_vec(&e).unwrap().len() <= MAX_ENVELOPE_BYTES);
        assert!(
            Envelope::from_observed(h(), &Observed::default())
                .diff
                .is_none()
        );
    }

    #[test]
    fn files_touched_are_observed_not_claimed() {
        let o = Observed {
            answer: "{\"status\":\"complete\",\"files_touched\":[\"/etc/passwd\"]}".into(),
            stop_reason: "end_turn".into(),
            ..Default::default()
        };
        assert!(Envelope::from_observed(h(), &o).files_touched.is_empty());
    }

    #[test]
    fn faults_and_refusals_are_blockers_and_timeouts_are_errors() {
        let o = Observed {
            answer: "{\"status\":\"complete\"}".into(),
            stop_reason: "fault".into(),
            refusals: vec![Blocker {
                kind: BlockerKind::Policy,
                rule: Some("floor.read-only".into()),
                reason: "read-only profile".into(),
                tool: Some("Write a".into()),
            }],
            faults: vec![FaultSeen {
                class: "timeout".into(),
                timeout: true,
                message: "hard cutoff".into(),
            }],
            ..Default::default()
        };
        let e = Envelope::from_observed(h(), &o);
        assert_eq!(e.status, Status::Timeout);
        assert!(e.status.is_error());
        assert_eq!(e.blockers.len(), 2);
        assert_eq!(e.incident.as_ref().unwrap().class, "timeout");
    }

    #[test]
    fn the_envelope_is_bounded() {
        let many: Vec<String> = (0..500)
            .map(|i| format!("{i}{}", "x".repeat(5000)))
            .collect();
        let d = json!({"status": "complete", "verdict": "y".repeat(10_000), "findings": many, "remaining": [], "blockers": []});
        let o = Observed {
            answer: d.to_string(),
            stop_reason: "end_turn".into(),
            ..Default::default()
        };
        let e = Envelope::from_observed(h(), &o);
        assert!(e.truncated);
        assert!(serde_json::to_vec(&e).unwrap().len() <= MAX_ENVELOPE_BYTES);
        assert!(e.verdict.chars().count() <= MAX_TEXT + 1);
    }
}
