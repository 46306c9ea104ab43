//! How the read commands print: for people (local times, one aligned line per record) or for
//! scripts (`-o json` / `--json`: one JSON document, or one JSON object a line for what streams —
//! `send`, `audit tail -f`, `approvals watch`). JSON times are RFC 3339 in UTC, with the epoch
//! milliseconds beside them under a `…UnixMs` key; nothing in JSON is escaped for a terminal
//! (serde_json escapes control characters itself).
//!
//! Must never: decide what a command does; only how its answer is written.

use serde_json::{Value, json};
use warden_proto::v1 as pb;

/// `-o human|json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    #[default]
    Human,
    Json,
}

fn at(ms: u64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
}

/// `2026-12-02T06:01:02.123Z`; "" for 0 (a time never set).
pub fn rfc3339(ms: u64) -> String {
    match at(ms) {
        Some(t) if ms > 0 => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        _ => String::new(),
    }
}

/// The local wall-clock time for people: `2026-12-02 07:01:02.123`; "-" for 0.
pub fn local_time(ms: u64) -> String {
    match at(ms) {
        Some(t) if ms > 0 => t
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M:%S%.3f")
            .to_string(),
        _ => "-".into(),
    }
}

/// A duration for people: `45 s`, `2 min 05 s`, `1 h 03 min`.
pub fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, (s % 3600) / 60),
    }
}

pub fn verdict(v: i32) -> &'static str {
    match pb::Verdict::try_from(v) {
        Ok(pb::Verdict::Allow) => "ALLOW",
        Ok(pb::Verdict::Escalate) => "ESCALATE",
        _ => "DENY",
    }
}

fn subject(s: Option<&pb::Subject>) -> Value {
    let s = s.cloned().unwrap_or_default();
    json!({
        "principal": s.principal, "contextId": s.context_id, "taskId": s.task_id,
        "sessionId": s.session_id, "agent": s.agent, "verb": s.verb,
        "groups": s.groups, "issuer": s.issuer,
    })
}

fn judged(j: Option<&pb::JudgedAction>) -> Value {
    let j = j.cloned().unwrap_or_default();
    json!({
        "digest": j.digest, "argv": j.argv, "cwd": j.cwd, "contentSha256": j.content_sha256,
        "locations": j.locations,
    })
}

/// One audit record.
pub fn audit_json(r: &pb::AuditRecord) -> Value {
    json!({
        "decisionId": r.decision_id,
        "requestId": r.request_id,
        "decidedAt": rfc3339(r.decided_at_unix_ms),
        "decidedAtUnixMs": r.decided_at_unix_ms,
        "verdict": verdict(r.verdict),
        "optionId": r.option_id,
        "endTurn": r.end_turn,
        "rule": r.rule,
        "reason": r.reason,
        "toolKind": r.tool_kind,
        "toolTitle": r.tool_title,
        "rawInputSha256": r.raw_input_sha256,
        "judged": judged(r.judged.as_ref()),
        "subject": subject(r.subject.as_ref()),
        "policyVersion": r.policy_version,
        "latencyMicros": r.latency_micros,
    })
}

/// One held request of the approver, with the commands that answer it while it is pending.
pub fn approval_json(a: &pb::Approval, command: &str) -> Value {
    let req = a.request.clone().unwrap_or_default();
    let t = req.tool_call.clone().unwrap_or_default();
    let pending = a.state() == pb::ApprovalState::Pending;
    let mut v = json!({
        "id": a.id,
        "state": state_name(a),
        "tool": {"kind": t.kind, "title": t.title, "rawInput": t.raw_input_json,
                 "locations": t.locations.iter().map(|l| l.path.clone()).collect::<Vec<_>>()},
        "subject": subject(req.subject.as_ref()),
        "escalatedRule": a.escalated_rule,
        "escalatedReason": a.escalated_reason,
        "createdAt": rfc3339(a.created_unix_ms),
        "createdAtUnixMs": a.created_unix_ms,
        "deadline": rfc3339(a.deadline_unix_ms),
        "deadlineUnixMs": a.deadline_unix_ms,
        "answeredBy": a.answered_by,
        "answeredAt": rfc3339(a.answered_unix_ms),
        "answeredAtUnixMs": a.answered_unix_ms,
        "reason": a.reason,
        "rule": a.rule,
        "judged": judged(a.judged.as_ref()),
    });
    if pending {
        v["secondsLeft"] = json!(a.deadline_unix_ms.saturating_sub(now_ms()).div_ceil(1000));
        v["approveWith"] = json!(format!("{command} approvals approve {}", a.id));
        v["denyWith"] = json!(format!("{command} approvals deny {} --reason TEXT", a.id));
    }
    if a.state() == pb::ApprovalState::Withdrawn {
        v["withdrawnReason"] = json!(a.withdrawn_reason);
        v["withdrawnAt"] = json!(rfc3339(a.withdrawn_unix_ms));
    }
    v
}

pub fn state_name(a: &pb::Approval) -> &'static str {
    match a.state() {
        pb::ApprovalState::Pending => "PENDING",
        pb::ApprovalState::Approved => "APPROVED",
        pb::ApprovalState::Denied => "DENIED",
        pb::ApprovalState::NoResponse => "NO-RESPONSE",
        pb::ApprovalState::Revoked => "REVOKED",
        pb::ApprovalState::Expired => "EXPIRED",
        // Approved by a person, but not enforced: the caller had withdrawn the request.
        pb::ApprovalState::Withdrawn => "WITHDRAWN",
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Prints one JSON value on one line (NDJSON), flushing so a pipe sees it at once.
pub fn print_line(v: &Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Prints one JSON document, pretty (a reader that went away, `| head`, is not an error).
pub fn print_doc(v: &Value) {
    use std::io::Write;
    let text = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc_and_unset_times_are_empty() {
        assert_eq!(rfc3339(1_764_655_262_123), "2025-12-02T06:01:02.123Z");
        assert_eq!(rfc3339(0), "");
        assert_eq!(local_time(0), "-");
        assert_eq!(local_time(1_764_655_262_123).len(), 23);
        assert_eq!(duration(5), "5 s");
        assert_eq!(duration(125), "2 min 05 s");
        assert_eq!(duration(3780), "1 h 03 min");
    }
}
