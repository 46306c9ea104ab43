//! What an agent asks of the client: permissions (options and outcome), `fs/*`, `terminal/*`
//! and elicitation, with their answers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;

/// One option of a permission request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    /// Adapter-private id (version specific).
    pub option_id: String,
    /// Display name (never a basis for decisions).
    #[serde(default)]
    pub name: String,
    /// UI hint.
    pub kind: PermissionOptionKind,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

impl PermissionOption {
    /// An option whose kind this client does not know is never selectable.
    pub fn is_selectable(&self) -> bool {
        !matches!(self.kind, PermissionOptionKind::Unknown(_))
    }
}

/// `session/request_permission` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionRequest {
    /// Session.
    pub session_id: String,
    /// The tool call (partial; Claude 0.16 sends only id/title/rawInput here).
    pub tool_call: ToolCallUpdate,
    /// Offered options, in the agent's order.
    pub options: Vec<PermissionOption>,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    /// The size of the line it came in, in bytes (set by the client, never read from the
    /// wire): a handler moves the work over a large one off the runtime's threads.
    #[serde(skip)]
    pub line_bytes: usize,
}

impl PermissionRequest {
    /// Options the caller may pick (known kinds only).
    pub fn selectable_options(&self) -> impl Iterator<Item = &PermissionOption> {
        self.options.iter().filter(|o| o.is_selectable())
    }
    /// Whether `option_id` was offered with a known kind.
    pub fn offers(&self, option_id: &str) -> bool {
        self.selectable_options().any(|o| o.option_id == option_id)
    }
}

/// The answer to a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionOutcome {
    /// One of the offered options.
    Selected {
        /// The option id (must have been offered).
        option_id: String,
    },
    /// Only when the turn is being cancelled.
    Cancelled,
}

impl PermissionOutcome {
    /// The wire form of the result (`{"outcome":{...}}`).
    pub fn to_result(&self) -> Value {
        match self {
            PermissionOutcome::Selected { option_id } => {
                serde_json::json!({"outcome": {"outcome": "selected", "optionId": option_id}})
            }
            PermissionOutcome::Cancelled => {
                serde_json::json!({"outcome": {"outcome": "cancelled"}})
            }
        }
    }
}

/// `fs/read_text_file` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadTextFileRequest {
    /// Session.
    pub session_id: String,
    /// Path as sent (should be absolute; the handler must check).
    pub path: String,
    /// 1-based start line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// Max lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `fs/write_text_file` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteTextFileRequest {
    /// Session.
    pub session_id: String,
    /// Path as sent.
    pub path: String,
    /// Full new content.
    pub content: String,
}

/// An environment variable for `terminal/create`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvVariable {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `terminal/create` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTerminalRequest {
    /// Session.
    pub session_id: String,
    /// Program.
    pub command: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Vec<EnvVariable>,
    /// Working directory (must be checked by the handler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Keep at most this many bytes of output (the tail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_byte_limit: Option<u64>,
}

/// `terminal/output|wait_for_exit|kill|release` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalRequest {
    /// Session.
    pub session_id: String,
    /// Terminal id from `terminal/create`.
    pub terminal_id: String,
}

/// Exit status of a terminal command.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalExitStatus {
    /// Exit code, if it exited.
    pub exit_code: Option<u32>,
    /// Signal name, if killed.
    pub signal: Option<String>,
}

/// `terminal/output` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalOutputResponse {
    /// Output so far (tail-truncated to the byte limit).
    pub output: String,
    /// Whether output was dropped.
    pub truncated: bool,
    /// Set once the command exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<TerminalExitStatus>,
}

/// `elicitation/create` params: a question for the user (never for the policy).
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitationRequest {
    /// Session, when session-scoped.
    pub session_id: Option<String>,
    /// The question.
    pub message: String,
    /// `form` or `url`.
    pub mode: Option<String>,
    /// JSON schema of the form.
    pub requested_schema: Option<Value>,
    /// The whole params object.
    pub raw: Value,
}

impl ElicitationRequest {
    pub(crate) fn from_params(params: &Value) -> Result<Self, String> {
        let message = params
            .get("message")
            .and_then(Value::as_str)
            .ok_or("elicitation without a message")?;
        let s = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_string);
        Ok(ElicitationRequest {
            session_id: s("sessionId"),
            message: message.to_string(),
            mode: s("mode"),
            requested_schema: params.get("requestedSchema").cloned(),
            raw: params.clone(),
        })
    }
}

/// The user's answer to a question.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitationResponse {
    /// Answered, with form content.
    Accept {
        /// The form content (object matching the schema).
        content: Value,
        /// The id of the caller's message that carried the answer, sent as
        /// `_meta.warden.messageId` (as a prompt's is) when present.
        message_id: Option<String>,
    },
    /// The user declined.
    Decline,
    /// Dismissed.
    Cancel,
}

impl ElicitationResponse {
    /// Wire form.
    pub fn to_result(&self) -> Value {
        match self {
            ElicitationResponse::Accept {
                content,
                message_id: None,
            } => serde_json::json!({"action": "accept", "content": content}),
            ElicitationResponse::Accept {
                content,
                message_id: Some(id),
            } => serde_json::json!({"action": "accept", "content": content,
                                    "_meta": {"warden": {"messageId": id}}}),
            ElicitationResponse::Decline => serde_json::json!({"action": "decline"}),
            ElicitationResponse::Cancel => serde_json::json!({"action": "cancel"}),
        }
    }
}
