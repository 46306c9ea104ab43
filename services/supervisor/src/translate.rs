//! ACP → proto, as pure functions: what an agent's session updates become on the turn's event
//! stream (the supervisor's counterpart of the gateway's `mapping.rs`). Locations are mapped here
//! once, for events and for permission requests alike.
//!
//! Must never: do I/O, hold state, or decide anything; it only changes the shape of what the
//! agent said.

use warden_acp::{
    ContentChunk, PlanEntry, ToolCall, ToolCallContent, ToolCallLocation, ToolCallUpdate,
};
use warden_proto::v1 as pb;

/// One ACP location (a line beyond `u32` is clamped, not wrapped).
pub fn location(l: &ToolCallLocation) -> pb::Location {
    pb::Location {
        path: l.path.clone(),
        line: l.line.map(|n| n.min(u32::MAX as u64) as u32),
    }
}

pub fn locations(ls: &[ToolCallLocation]) -> Vec<pb::Location> {
    ls.iter().map(location).collect()
}

/// What a Decide request asks to do, as its decision is bound to it: the pure
/// `warden_rules::JudgedAction` of its boundary root and tool call (the policy and the approver
/// read the same request the same way; a request without a tool call judged nothing).
pub fn judged(req: &pb::DecideRequest) -> warden_rules::JudgedAction {
    let Some(tool) = req.tool_call.as_ref() else {
        return warden_rules::JudgedAction::default();
    };
    let root = req.boundary.as_ref().map(|b| b.root.as_str()).unwrap_or("");
    warden_rules::JudgedAction::of(
        std::path::Path::new(root),
        &tool.kind,
        &tool.title,
        tool.locations.iter().map(|l| l.path.as_str()),
        &tool.raw_input_json,
    )
}

/// A chunk's `_meta` as JSON text for `TextChunk.meta_json` ("" when absent or null).
pub fn chunk_meta_json(c: &ContentChunk) -> String {
    match &c.meta {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(m) => m.to_string(),
    }
}

/// The text of a tool call's content: text blocks as they are, a diff as `diff PATH`, one per
/// line; other content (terminals, images) leaves an empty line.
pub fn content_text(c: &[ToolCallContent]) -> String {
    let mut out = String::new();
    for item in c {
        match item {
            ToolCallContent::Content(content) => {
                if let Some(t) = content.as_text() {
                    out.push_str(t);
                }
            }
            ToolCallContent::Diff { path, .. } => {
                out.push_str("diff ");
                out.push_str(path);
            }
            _ => {}
        }
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out
}

fn raw_json(v: &Option<serde_json::Value>) -> String {
    v.as_ref().map(|v| v.to_string()).unwrap_or_default()
}

/// A new tool call.
pub fn tool_call(tc: ToolCall) -> pb::ToolCallEvent {
    pb::ToolCallEvent {
        raw_input_json: raw_json(&tc.raw_input),
        locations: locations(&tc.locations),
        content_text: content_text(&tc.content),
        kind: tc.kind.as_str().to_string(),
        status: tc
            .status
            .map(|s| s.as_str().to_string())
            .unwrap_or_default(),
        tool_call_id: tc.tool_call_id,
        title: tc.title,
        update: false,
    }
}

/// An update of a tool call: fields the agent did not send stay empty.
pub fn tool_call_update(u: ToolCallUpdate) -> pb::ToolCallEvent {
    pb::ToolCallEvent {
        raw_input_json: raw_json(&u.raw_input),
        locations: u.locations.as_deref().map(locations).unwrap_or_default(),
        content_text: u.content.as_deref().map(content_text).unwrap_or_default(),
        kind: u.kind.map(|k| k.as_str().to_string()).unwrap_or_default(),
        status: u.status.map(|s| s.as_str().to_string()).unwrap_or_default(),
        title: u.title.unwrap_or_default(),
        tool_call_id: u.tool_call_id,
        update: true,
    }
}

pub fn plan(entries: Vec<PlanEntry>) -> pb::PlanEvent {
    pb::PlanEvent {
        entries: entries
            .into_iter()
            .map(|e| pb::PlanEntry {
                content: e.content,
                priority: e.priority,
                status: e.status,
            })
            .collect(),
    }
}

/// The mode ids the session mode's config option offers (its `options`' values; grouped
/// options flattened), or `None` when there is no such option.
pub fn modes_offered_in_config_options(options: &serde_json::Value) -> Option<Vec<String>> {
    let option = options.as_array()?.iter().find(|o| {
        o.get("category").and_then(|c| c.as_str()) == Some("mode")
            || o.get("id").and_then(|c| c.as_str()) == Some("mode")
    })?;
    let mut out = Vec::new();
    for v in option.get("options")?.as_array()? {
        match v.get("value").and_then(|x| x.as_str()) {
            Some(id) => out.push(id.to_string()),
            None => out.extend(
                v.get("options")
                    .and_then(|g| g.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.get("value").and_then(|x| x.as_str()))
                    .map(str::to_string),
            ),
        }
    }
    Some(out)
}

/// The `currentValue` of the config option that is the session mode (category or id `mode`).
pub fn mode_from_config_options(options: &serde_json::Value) -> Option<String> {
    options.as_array()?.iter().find_map(|o| {
        let is_mode = o.get("category").and_then(|c| c.as_str()) == Some("mode")
            || o.get("id").and_then(|c| c.as_str()) == Some("mode");
        if is_mode {
            o.get("currentValue")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        } else {
            None
        }
    })
}

/// `protocol` for an agent that broke the framing, `crash` for one that went away.
pub fn fault_class(f: &warden_acp::Fault) -> pb::FaultClass {
    match f {
        warden_acp::Fault::OversizedLine { .. } | warden_acp::Fault::Garbage { .. } => {
            pb::FaultClass::Protocol
        }
        warden_acp::Fault::InputNotRead { .. } => pb::FaultClass::RequestLimit,
        // Updates nobody took (between turns): the agent's output passed a bound.
        warden_acp::Fault::UpdatesNotTaken { .. } => pb::FaultClass::OutputLimit,
        _ => pb::FaultClass::Crash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tc(v: serde_json::Value) -> ToolCall {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_mode_is_read_from_config_options() {
        let v = json!([
            {"id": "model", "category": "model", "currentValue": "opus"},
            {"id": "mode", "category": "mode", "currentValue": "bypassPermissions"}
        ]);
        assert_eq!(
            mode_from_config_options(&v).as_deref(),
            Some("bypassPermissions")
        );
        assert_eq!(mode_from_config_options(&json!([{"id": "x"}])), None);
        // OpenCode 1.18 publishes its modes (primary agents) only this way.
        let v = json!([{"id": "mode", "category": "mode", "type": "select", "currentValue": "build",
            "options": [{"value": "build", "name": "build"}, {"group": "g", "options": [{"value": "plan"}]}]}]);
        assert_eq!(
            modes_offered_in_config_options(&v),
            Some(vec!["build".to_string(), "plan".to_string()])
        );
        assert_eq!(
            modes_offered_in_config_options(&json!([{"id": "model"}])),
            None
        );
        assert_eq!(mode_from_config_options(&json!({"id": "mode"})), None);
    }

    #[test]
    fn a_tool_call_keeps_its_id_kind_title_locations_raw_input_and_text() {
        let e = tool_call(tc(json!({
            "toolCallId": "t1", "title": "Write a.txt", "kind": "edit", "status": "pending",
            "locations": [{"path": "/r/a.txt", "line": 7}, {"path": "/r/b.txt"}],
            "rawInput": {"file_path": "/r/a.txt"},
            "content": [{"type": "content", "content": {"type": "text", "text": "hello"}},
                        {"type": "diff", "path": "/r/a.txt", "newText": "x"}]
        })));
        assert_eq!(e.tool_call_id, "t1");
        assert_eq!(e.kind, "edit");
        assert_eq!(e.title, "Write a.txt");
        assert_eq!(e.status, "pending");
        assert_eq!(e.locations.len(), 2);
        assert_eq!(e.locations[0].line, Some(7));
        assert_eq!(e.locations[1].line, None);
        assert_eq!(e.raw_input_json, r#"{"file_path":"/r/a.txt"}"#);
        assert_eq!(e.content_text, "hello\ndiff /r/a.txt");
        assert!(!e.update);
    }

    #[test]
    fn an_update_leaves_unsent_fields_empty_and_lines_are_clamped() {
        let u: ToolCallUpdate = serde_json::from_value(json!({
            "toolCallId": "t1", "status": "completed",
            "locations": [{"path": "/r/a.txt", "line": 99999999999u64}]
        }))
        .unwrap();
        let e = tool_call_update(u);
        assert!(e.update);
        assert_eq!(e.status, "completed");
        assert_eq!(e.kind, "");
        assert_eq!(e.title, "");
        assert_eq!(e.raw_input_json, "");
        assert_eq!(e.locations[0].line, Some(u32::MAX));
    }

    #[test]
    fn a_plan_keeps_its_entries_in_order() {
        let p = plan(vec![
            PlanEntry {
                content: "one".into(),
                priority: "high".into(),
                status: "pending".into(),
            },
            PlanEntry {
                content: "two".into(),
                priority: "low".into(),
                status: "completed".into(),
            },
        ]);
        let got: Vec<_> = p.entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(got, ["one", "two"]);
    }

    #[test]
    fn broken_framing_is_protocol_and_a_closed_pipe_a_crash() {
        assert_eq!(
            fault_class(&warden_acp::Fault::Garbage { count: 3 }),
            pb::FaultClass::Protocol
        );
        assert_eq!(
            fault_class(&warden_acp::Fault::OversizedLine { limit: 10 }),
            pb::FaultClass::Protocol
        );
        assert_eq!(
            fault_class(&warden_acp::Fault::AgentClosed),
            pb::FaultClass::Crash
        );
    }
}
