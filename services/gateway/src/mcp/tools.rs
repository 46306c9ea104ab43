//! The tool inventory: names, input and output schemas, and the argument parser (unknown
//! arguments refused; the ones only the host or the operator may set refused by name).

use serde_json::{Map, Value, json};
use warden_proto::v1::Profile;

use super::envelope;

/// The verbs that hand work to an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Advise,
    Review,
    Implement,
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Advise => "advise",
            Verb::Review => "review",
            Verb::Implement => "implement",
        }
    }

    pub fn profile(self) -> Profile {
        match self {
            Verb::Advise | Verb::Review => Profile::ReadOnly,
            Verb::Implement => Profile::WorkspaceWrite,
        }
    }

    /// Read verbs are retried once on timeout; `implement` never (edits may have landed).
    pub fn retried_on_timeout(self) -> bool {
        !matches!(self, Verb::Implement)
    }
}

pub const ADVISE: &str = "advise";
pub const REVIEW: &str = "review";
pub const IMPLEMENT: &str = "implement";
pub const IMPLEMENT_BACKGROUND: &str = "implement_background";
pub const JOB_STATUS: &str = "job_status";
pub const JOB_RESULT: &str = "job_result";
pub const JOB_CANCEL: &str = "job_cancel";
pub const BIND_WORKSPACE: &str = "bind_workspace";
pub const STATUS: &str = "status";

/// Every tool, in the order `tools/list` gives them.
pub const INVENTORY: &[&str] = &[
    ADVISE,
    REVIEW,
    IMPLEMENT,
    IMPLEMENT_BACKGROUND,
    JOB_STATUS,
    JOB_RESULT,
    JOB_CANCEL,
    BIND_WORKSPACE,
    STATUS,
];

/// Arguments a model must never set: warden or the host supplies them.
pub const FORBIDDEN: &[(&str, &str)] = &[
    (
        "workspace",
        "the workspace is never a tool argument: it is the conversation's own sandbox, an operator workspace, or the one the human confirmed with bind_workspace",
    ),
    (
        "session_id",
        "session_id is never a tool argument: the MCP session (or, without one, the caller's identity) decides the conversation",
    ),
    (
        "background",
        "background is never a tool argument: the host chooses background work with implement_background",
    ),
    (
        "depth",
        "depth is never a tool argument: the recursion marker is inherited and cannot be lowered",
    ),
];

/// The longest model or effort value accepted (the supervisor's own bound is 128).
const MAX_OPTION_VALUE: usize = 64;

fn verb_input_schema(max_task: usize, max_timeout: u32) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["task"],
        "properties": {
            "task": {"type": "string", "minLength": 1, "description": format!("what to do, at most {max_task} bytes of UTF-8 (longer is refused before anything starts)")},
            "agent": {"type": "string", "description": "a configured agent name (see status); default: the operator's"},
            "model": {"type": "string", "maxLength": MAX_OPTION_VALUE, "description": "the session's model: a value of the agent's own model option (applied through ACP; a model the agent does not offer is refused, naming what it offers)"},
            "effort": {"type": "string", "maxLength": MAX_OPTION_VALUE, "description": "the session's effort, applied through the agent's thought-level option (refused when the agent does not offer it)"},
            "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": max_timeout,
                                "description": "soft budget told to the agent; at 1.2x the agent's process tree is killed and the result is timeout"}
        }
    })
}

fn obj(v: Value) -> std::sync::Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => std::sync::Arc::new(m),
        _ => std::sync::Arc::new(Map::new()),
    }
}

fn job_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["job_id", "state"],
        "properties": {
            "job_id": {"type": "string"},
            "state": {"type": "string", "enum": ["running", "finished", "cancelled"]},
            "progress": {"type": "array", "items": {"type": "string"}, "description": "the latest events of the turn (bounded)"},
            "result": {"type": ["object", "null"]}
        }
    })
}

/// The published tools.
pub fn list(max_task: usize, max_timeout: u32) -> Vec<rmcp::model::Tool> {
    use rmcp::model::{Tool, ToolAnnotations};
    let envelope = obj(envelope::output_schema());
    let verb = |name: &'static str, desc: &'static str, read_only: bool| {
        Tool::new(name, desc, obj(verb_input_schema(max_task, max_timeout)))
            .with_raw_output_schema(envelope.clone())
            .with_annotations(
                ToolAnnotations::new()
                    .read_only(read_only)
                    .destructive(!read_only)
                    .idempotent(false)
                    .open_world(false),
            )
    };
    let job_arg = obj(json!({
        "type": "object", "additionalProperties": false, "required": ["job_id"],
        "properties": {"job_id": {"type": "string"}}
    }));
    vec![
        verb(
            ADVISE,
            "Ask a supervised coding agent for advice on the bound workspace (read-only: every edit, command and fetch is refused by warden's policy). Returns a result envelope.",
            true,
        ),
        verb(
            REVIEW,
            "Have a supervised coding agent review the bound workspace (read-only). Returns a result envelope with findings.",
            true,
        ),
        verb(
            IMPLEMENT,
            "Have a supervised coding agent change the bound workspace (workspace-write; every action is judged by warden's policy, changes are left uncommitted). Never retried automatically.",
            false,
        ),
        Tool::new(
            IMPLEMENT_BACKGROUND,
            "Start implement as a background job for work longer than the host's tool timeout; follow it with job_status, job_result, job_cancel.",
            obj(verb_input_schema(max_task, max_timeout)),
        )
        .with_raw_output_schema(obj(job_schema()))
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(true)),
        Tool::new(JOB_STATUS, "The state and latest progress of a background job.", job_arg.clone())
            .with_raw_output_schema(obj(job_schema()))
            .with_annotations(ToolAnnotations::new().read_only(true)),
        Tool::new(JOB_RESULT, "The result envelope of a background job (null while it runs).", job_arg.clone())
            .with_raw_output_schema(obj(job_schema()))
            .with_annotations(ToolAnnotations::new().read_only(true)),
        Tool::new(JOB_CANCEL, "Cancel a background job: its turn is cancelled and its agent's process tree ends.", job_arg)
            .with_raw_output_schema(obj(job_schema()))
            .with_annotations(ToolAnnotations::new().read_only(false)),
        Tool::new(
            BIND_WORKSPACE,
            "Bind this session to an operator-allowed workspace. A proposed path is only a suggestion: the human confirms the exact canonical path through elicitation. Rebinding clears the previous binding first.",
            obj(json!({
                "type": "object", "additionalProperties": false,
                "properties": {"proposed_path": {"type": "string", "description": "an absolute path to propose; the human confirms or declines it"}}
            })),
        )
        .with_raw_output_schema(obj(json!({
            "type": "object", "additionalProperties": false, "required": ["bound", "binding", "message"],
            "properties": {
                "bound": {"type": "boolean"},
                "binding": {"type": ["object", "null"]},
                "message": {"type": "string"}
            }
        }))),
        Tool::new(
            STATUS,
            "warden's identity, version, negotiated protocol, binding, workspace fingerprint and tool inventory. Starts no agent.",
            obj(json!({"type": "object", "additionalProperties": false, "properties": {}})),
        )
        .with_raw_output_schema(obj(json!({
            "type": "object",
            "required": ["server", "version", "principal", "protocol", "binding", "workspace", "workspace_fingerprint", "tools", "depth", "agents"],
            "properties": {
                "server": {"type": "string"}, "version": {"type": "string"}, "principal": {"type": "string"},
                "protocol": {"type": ["string", "null"]}, "binding": {"type": ["object", "null"]},
                "workspace": {"type": ["string", "null"]}, "workspace_fingerprint": {"type": ["string", "null"]},
                "tools": {"type": "array", "items": {"type": "string"}}, "depth": {"type": "integer"},
                "agents": {"type": "array", "items": {"type": "string"}}
            }
        })))
        .with_annotations(ToolAnnotations::new().read_only(true).idempotent(true)),
    ]
}

/// A verb call's arguments, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbArgs {
    pub task: String,
    pub agent: Option<String>,
    pub model: Option<String>,
    pub effort: Option<String>,
    pub timeout_seconds: Option<u32>,
}

/// Why a call's arguments were refused: (rule, reason).
pub type ArgRefusal = (&'static str, String);

/// Refuses the names only warden or the host may set, then every other unknown name.
pub fn check_names(args: &Map<String, Value>, known: &[&str]) -> Result<(), ArgRefusal> {
    for (name, why) in FORBIDDEN {
        if args.contains_key(*name) {
            return Err(("mcp.argument.forbidden", format!("{name}: {why}")));
        }
    }
    let mut unknown: Vec<&str> = args
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k))
        .collect();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        return Err((
            "mcp.argument.unknown",
            format!(
                "unknown argument(s) {}; accepted: {}",
                unknown.join(", "),
                known.join(", ")
            ),
        ));
    }
    Ok(())
}

fn opt_str(
    args: &Map<String, Value>,
    name: &str,
    max: usize,
) -> Result<Option<String>, ArgRefusal> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= max && !s.chars().any(char::is_control) => {
            Ok((!s.is_empty()).then(|| s.clone()))
        }
        Some(Value::String(_)) => Err((
            "mcp.argument.invalid",
            format!("{name} must be at most {max} bytes without control characters"),
        )),
        Some(_) => Err(("mcp.argument.invalid", format!("{name} must be a string"))),
    }
}

/// Parses a verb's arguments. The task limit is checked on the UTF-8 bytes.
pub fn verb_args(
    args: &Map<String, Value>,
    max_task: usize,
    max_timeout: u32,
) -> Result<VerbArgs, ArgRefusal> {
    check_names(
        args,
        &["task", "agent", "model", "effort", "timeout_seconds"],
    )?;
    let task = match args.get("task") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) | None => {
            return Err(("mcp.argument.missing", "task is required".into()));
        }
        Some(_) => return Err(("mcp.argument.invalid", "task must be a string".into())),
    };
    if task.len() > max_task {
        return Err((
            "mcp.task.too-large",
            format!(
                "task is {} bytes; at most {max_task} bytes are accepted (nothing was started)",
                task.len()
            ),
        ));
    }
    // Which values exist is the agent's to say (its ACP options); the supervisor refuses one
    // it does not offer, naming those it does.
    let effort = opt_str(args, "effort", MAX_OPTION_VALUE)?;
    let timeout_seconds = match args.get("timeout_seconds") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u64::from(max_timeout) => Some(n as u32),
            _ => {
                return Err((
                    "mcp.argument.invalid",
                    format!("timeout_seconds must be an integer from 1 to {max_timeout}"),
                ));
            }
        },
    };
    Ok(VerbArgs {
        task,
        agent: opt_str(args, "agent", 64)?,
        model: opt_str(args, "model", MAX_OPTION_VALUE)?,
        effort,
        timeout_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn model_supplied_workspace_session_and_background_are_refused_by_name() {
        for k in ["workspace", "session_id", "background", "depth"] {
            let (rule, why) = verb_args(&m(json!({"task": "x", k: "/"})), 100, 10).unwrap_err();
            assert_eq!(rule, "mcp.argument.forbidden");
            assert!(why.starts_with(k), "{why}");
        }
        let (rule, why) = verb_args(&m(json!({"task": "x", "colour": 1})), 100, 10).unwrap_err();
        assert_eq!(rule, "mcp.argument.unknown");
        assert!(why.contains("colour"));
    }

    #[test]
    fn the_task_limit_counts_utf8_bytes() {
        let t = "é".repeat(51); // 102 bytes
        assert_eq!(
            verb_args(&m(json!({"task": t})), 100, 10).unwrap_err().0,
            "mcp.task.too-large"
        );
        assert!(verb_args(&m(json!({"task": "é".repeat(50)})), 100, 10).is_ok());
    }

    #[test]
    fn options_are_checked() {
        let a = verb_args(
            &m(json!({"task": "x", "effort": "high", "timeout_seconds": 5, "model": "m"})),
            100,
            10,
        )
        .unwrap();
        assert_eq!(a.timeout_seconds, Some(5));
        assert!(verb_args(&m(json!({"task": "x", "timeout_seconds": 11})), 100, 10).is_err());
        assert!(verb_args(&m(json!({"task": "x", "timeout_seconds": 0})), 100, 10).is_err());
        assert!(verb_args(&m(json!({"task": "x", "effort": "e".repeat(65)})), 100, 10).is_err());
        assert!(verb_args(&m(json!({"task": ""})), 100, 10).is_err());
    }
}
