//! ACP v1 message types (the subset a client needs), decoded tolerantly:
//! unknown enum strings become `Other`/`Unknown` variants instead of failing
//! the whole message, because adapters add values between releases.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The ACP protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident, $fallback:ident { $($(#[$vm:meta])* $variant:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)*
            /// A value this client does not know (kept verbatim).
            $fallback(String),
        }
        impl $name {
            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $s,)*
                    $name::$fallback(s) => s.as_str(),
                }
            }
            /// Decode a wire string; never fails.
            pub fn parse(s: &str) -> Self {
                match s {
                    $($s => $name::$variant,)*
                    other => $name::$fallback(other.to_string()),
                }
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Ok($name::parse(&s))
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum!(
    /// Why a prompt turn ended.
    StopReason, Other {
        /// The model finished.
        EndTurn => "end_turn",
        /// Token limit.
        MaxTokens => "max_tokens",
        /// Turn request limit.
        MaxTurnRequests => "max_turn_requests",
        /// The model refused.
        Refusal => "refusal",
        /// The turn was cancelled (or aborted by a rejected permission in Codex).
        Cancelled => "cancelled",
    }
);

string_enum!(
    /// What a tool call does (a hint for policy; unknown kinds are `Other`).
    ToolKind, Unknown {
        /// Read a file.
        Read => "read",
        /// Edit a file.
        Edit => "edit",
        /// Delete a file.
        Delete => "delete",
        /// Move a file.
        Move => "move",
        /// Search.
        Search => "search",
        /// Run a command.
        Execute => "execute",
        /// Thinking.
        Think => "think",
        /// Network fetch.
        Fetch => "fetch",
        /// Mode switch (plan exit).
        SwitchMode => "switch_mode",
        /// Anything else.
        Other => "other",
    }
);

string_enum!(
    /// Tool call status.
    ToolCallStatus, Other {
        /// Not started.
        Pending => "pending",
        /// Running.
        InProgress => "in_progress",
        /// Done.
        Completed => "completed",
        /// Failed (or refused).
        Failed => "failed",
    }
);

string_enum!(
    /// The UI hint of a permission option. An unknown kind makes that option
    /// not selectable, while the request itself still parses.
    PermissionOptionKind, Unknown {
        /// Allow this once.
        AllowOnce => "allow_once",
        /// Allow and remember (persists rules in the agent: warden never picks these).
        AllowAlways => "allow_always",
        /// Reject this once.
        RejectOnce => "reject_once",
        /// Reject and remember.
        RejectAlways => "reject_always",
    }
);

/// A content block (prompt content, message chunks, tool output). Only `text`
/// is decoded; everything else is kept as raw JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    /// `{"type":"text","text":...}`
    Text {
        /// The text.
        text: String,
    },
    /// Any other block (`image`, `resource`, `resource_link`, ...), verbatim.
    Other(Value),
}

impl ContentBlock {
    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentBlock::Text { text } => Some(text),
            ContentBlock::Other(_) => None,
        }
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentBlock::Text { text } => {
                serde_json::json!({"type": "text", "text": text}).serialize(s)
            }
            ContentBlock::Other(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        if v.get("type").and_then(Value::as_str) == Some("text")
            && let Some(text) = v.get("text").and_then(Value::as_str)
        {
            return Ok(ContentBlock::Text {
                text: text.to_string(),
            });
        }
        Ok(ContentBlock::Other(v))
    }
}

/// `agent_message_chunk` / `agent_thought_chunk` / `user_message_chunk` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentChunk {
    /// The content.
    pub content: ContentBlock,
    /// Optional message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

/// Where a tool call acts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallLocation {
    /// Absolute path (agents should send absolute paths; policy must not trust that).
    pub path: String,
    /// Optional 1-based line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
}

/// Content attached to a tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallContent {
    /// `{"type":"content","content":ContentBlock}`
    Content(ContentBlock),
    /// `{"type":"diff","path","oldText"?,"newText"}`
    Diff {
        /// File path.
        path: String,
        /// Old text (`None` = new file).
        old_text: Option<String>,
        /// New text.
        new_text: String,
    },
    /// `{"type":"terminal","terminalId"}`
    Terminal {
        /// Terminal id.
        terminal_id: String,
    },
    /// Anything else, verbatim.
    Other(Value),
}

impl Serialize for ToolCallContent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ToolCallContent::Content(c) => serde_json::json!({"type": "content", "content": c}).serialize(s),
            ToolCallContent::Diff {
                path,
                old_text,
                new_text,
            } => serde_json::json!({"type": "diff", "path": path, "oldText": old_text, "newText": new_text})
                .serialize(s),
            ToolCallContent::Terminal { terminal_id } => {
                serde_json::json!({"type": "terminal", "terminalId": terminal_id}).serialize(s)
            }
            ToolCallContent::Other(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ToolCallContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Ok(match v.get("type").and_then(Value::as_str) {
            Some("content") => match v.get("content").cloned() {
                Some(c) => ToolCallContent::Content(
                    serde_json::from_value(c.clone()).unwrap_or(ContentBlock::Other(c)),
                ),
                None => ToolCallContent::Other(v),
            },
            Some("diff") => match (s("path"), s("newText")) {
                (Some(path), Some(new_text)) => ToolCallContent::Diff {
                    path,
                    old_text: s("oldText"),
                    new_text,
                },
                _ => ToolCallContent::Other(v),
            },
            Some("terminal") => match s("terminalId") {
                Some(terminal_id) => ToolCallContent::Terminal { terminal_id },
                None => ToolCallContent::Other(v),
            },
            _ => ToolCallContent::Other(v),
        })
    }
}

/// A `tool_call` update: a new tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// Tool call id (unique within the session).
    pub tool_call_id: String,
    /// Human readable title.
    #[serde(default)]
    pub title: String,
    /// Kind (default `other`).
    #[serde(default = "default_kind")]
    pub kind: ToolKind,
    /// Status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ToolCallStatus>,
    /// Content (diffs, text, terminals).
    #[serde(default, deserialize_with = "lenient_vec")]
    pub content: Vec<ToolCallContent>,
    /// Locations the call touches.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub locations: Vec<ToolCallLocation>,
    /// Raw tool input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_input: Option<Value>,
    /// Raw tool output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Value>,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

fn default_kind() -> ToolKind {
    ToolKind::Other
}

/// A partial update of a tool call (`tool_call_update`, and the `toolCall` of
/// a permission request). Only `tool_call_id` is required.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallUpdate {
    /// Tool call id.
    pub tool_call_id: String,
    /// New title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// New kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    /// New status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ToolCallStatus>,
    /// Replacement content.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_opt_vec"
    )]
    pub content: Option<Vec<ToolCallContent>>,
    /// Replacement locations.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_opt_vec"
    )]
    pub locations: Option<Vec<ToolCallLocation>>,
    /// Raw input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_input: Option<Value>,
    /// Raw output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Value>,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

/// Decode a list, dropping elements that do not parse (logged) instead of
/// failing the whole message.
fn lenient_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let v = Option::<Vec<Value>>::deserialize(d)?.unwrap_or_default();
    Ok(v.into_iter()
        .filter_map(|item| match serde_json::from_value(item) {
            Ok(x) => Some(x),
            Err(e) => {
                tracing::warn!(error = %e, "skipping an undecodable list element");
                None
            }
        })
        .collect())
}

fn lenient_opt_vec<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    lenient_vec(d).map(Some)
}

/// One plan entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// What to do.
    pub content: String,
    /// `high|medium|low`.
    #[serde(default)]
    pub priority: String,
    /// `pending|in_progress|completed`.
    #[serde(default)]
    pub status: String,
}

/// A slash command the agent advertises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AvailableCommand {
    /// Command name (without `/`).
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// Input hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

/// `usage_update` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens used.
    #[serde(default)]
    pub used: u64,
    /// Context size.
    #[serde(default)]
    pub size: u64,
    /// Cost `{amount, currency}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Value>,
}

/// A typed `session/update`. Unknown variants never reach the caller: they are
/// logged and counted (see `AcpClient::unknown_updates`).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// Assistant text.
    AgentMessageChunk(ContentChunk),
    /// Assistant reasoning.
    AgentThoughtChunk(ContentChunk),
    /// User text (history replay on `session/load`).
    UserMessageChunk(ContentChunk),
    /// A new tool call.
    ToolCall(ToolCall),
    /// An update to a tool call.
    ToolCallUpdate(ToolCallUpdate),
    /// The whole plan (replaces the previous one).
    Plan(Vec<PlanEntry>),
    /// The agent changed mode (plan exit, or after `set_mode`).
    CurrentModeUpdate {
        /// The new mode id.
        current_mode_id: String,
    },
    /// Slash commands.
    AvailableCommandsUpdate(Vec<AvailableCommand>),
    /// Token/cost usage.
    UsageUpdate(Usage),
    /// Full list of config options.
    ConfigOptionUpdate(Value),
    /// Title etc.
    SessionInfoUpdate(Value),
}

impl SessionEvent {
    /// Decode `params.update`. `Ok(None)` = unknown variant (skip), `Err` = a
    /// known variant with a malformed body.
    pub fn from_update(update: &Value) -> Result<Option<SessionEvent>, String> {
        let kind = update
            .get("sessionUpdate")
            .and_then(Value::as_str)
            .ok_or_else(|| "update has no sessionUpdate tag".to_string())?;
        // Deserialized from the borrowed tree: only the strings the event keeps are copied,
        // not the whole update (this runs once per streamed chunk).
        fn de<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, String> {
            T::deserialize(v).map_err(|e| e.to_string())
        }
        let ev = match kind {
            "agent_message_chunk" => SessionEvent::AgentMessageChunk(de(update)?),
            "agent_thought_chunk" => SessionEvent::AgentThoughtChunk(de(update)?),
            "user_message_chunk" => SessionEvent::UserMessageChunk(de(update)?),
            "tool_call" => SessionEvent::ToolCall(de(update)?),
            "tool_call_update" => SessionEvent::ToolCallUpdate(de(update)?),
            "plan" => SessionEvent::Plan(de(update.get("entries").unwrap_or(&Value::Null))?),
            "current_mode_update" => {
                // The docs once said `modeId`; schema and adapters use `currentModeId`.
                let id = update
                    .get("currentModeId")
                    .or_else(|| update.get("modeId"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| "current_mode_update without currentModeId".to_string())?;
                SessionEvent::CurrentModeUpdate {
                    current_mode_id: id.to_string(),
                }
            }
            "available_commands_update" => SessionEvent::AvailableCommandsUpdate(de(update
                .get("availableCommands")
                .unwrap_or(&Value::Null))?),
            "usage_update" => SessionEvent::UsageUpdate(de(update)?),
            "config_option_update" => SessionEvent::ConfigOptionUpdate(
                update.get("configOptions").cloned().unwrap_or(Value::Null),
            ),
            "session_info_update" => SessionEvent::SessionInfoUpdate(update.clone()),
            _ => return Ok(None),
        };
        Ok(Some(ev))
    }

    /// The wire name of this variant.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::AgentMessageChunk(_) => "agent_message_chunk",
            SessionEvent::AgentThoughtChunk(_) => "agent_thought_chunk",
            SessionEvent::UserMessageChunk(_) => "user_message_chunk",
            SessionEvent::ToolCall(_) => "tool_call",
            SessionEvent::ToolCallUpdate(_) => "tool_call_update",
            SessionEvent::Plan(_) => "plan",
            SessionEvent::CurrentModeUpdate { .. } => "current_mode_update",
            SessionEvent::AvailableCommandsUpdate(_) => "available_commands_update",
            SessionEvent::UsageUpdate(_) => "usage_update",
            SessionEvent::ConfigOptionUpdate(_) => "config_option_update",
            SessionEvent::SessionInfoUpdate(_) => "session_info_update",
        }
    }
}

/// A `session/update` notification, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionNotification {
    /// Session the update belongs to.
    pub session_id: String,
    /// The update.
    pub event: SessionEvent,
    /// `params._meta`, if any.
    pub meta: Option<Value>,
}

// ---------------------------------------------------------------------------
// initialize / sessions

/// `clientCapabilities.fs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsCapabilities {
    /// Advertise `fs/read_text_file`.
    pub read_text_file: bool,
    /// Advertise `fs/write_text_file`.
    pub write_text_file: bool,
}

/// What the client advertises in `initialize`. Exactly these are sent; a
/// capability not advertised is answered `-32601` if the agent calls it anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientCapabilities {
    /// fs methods.
    pub fs: FsCapabilities,
    /// `terminal/*`.
    pub terminal: bool,
    /// `elicitation/create` (form mode).
    pub elicitation: bool,
}

impl ClientCapabilities {
    /// Everything on.
    pub fn all() -> Self {
        ClientCapabilities {
            fs: FsCapabilities {
                read_text_file: true,
                write_text_file: true,
            },
            terminal: true,
            elicitation: true,
        }
    }

    /// The wire form.
    pub fn to_value(&self) -> Value {
        let mut v = serde_json::json!({"fs": self.fs, "terminal": self.terminal});
        if self.elicitation {
            v["elicitation"] = serde_json::json!({"form": {}});
        }
        v
    }
}

/// The agent's `initialize` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    /// Protocol version the agent speaks.
    pub protocol_version: u64,
    /// Agent capabilities.
    #[serde(default)]
    pub agent_capabilities: AgentCapabilities,
    /// Agent name/version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_info: Option<Value>,
    /// Auth methods.
    #[serde(default)]
    pub auth_methods: Vec<Value>,
}

impl InitializeResponse {
    /// The id of the first `env_var` auth method (ACP's "the key is in the environment") all of
    /// whose variables `present` says are set, if the agent lists one. Agents that need no
    /// authentication list none, or only interactive ones (a browser login), and get `None`.
    pub fn env_auth_method(&self, present: impl Fn(&str) -> bool) -> Option<String> {
        self.auth_methods.iter().find_map(|m| {
            if m.get("type").and_then(Value::as_str) != Some("env_var") {
                return None;
            }
            let vars = m.get("vars").and_then(Value::as_array)?;
            let all = !vars.is_empty()
                && vars.iter().all(|v| {
                    v.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| !n.is_empty() && present(n))
                });
            all.then(|| m.get("id").and_then(Value::as_str).map(str::to_string))
                .flatten()
        })
    }
}

/// `agentCapabilities` (only what a client branches on is typed).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `session/load` supported.
    #[serde(default)]
    pub load_session: bool,
    /// Prompt content capabilities, verbatim.
    #[serde(default)]
    pub prompt_capabilities: Value,
    /// MCP capabilities, verbatim.
    #[serde(default)]
    pub mcp_capabilities: Value,
    /// Session capabilities, verbatim.
    #[serde(default)]
    pub session_capabilities: Value,
}

/// One mode an agent offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionMode {
    /// Mode id (`default`, `plan`, `read-only`, ...).
    pub id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Modes of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionModeState {
    /// Current mode.
    pub current_mode_id: String,
    /// Available modes.
    #[serde(default)]
    pub available_modes: Vec<SessionMode>,
}

/// `session/new` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionResponse {
    /// The session id.
    pub session_id: String,
    /// Modes, if the agent has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modes: Option<SessionModeState>,
    /// Config options, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_options: Option<Value>,
}

/// `session/load` answer (the history arrives as session updates before it).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadSessionResponse {
    /// Modes, if the agent has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modes: Option<SessionModeState>,
    /// Config options, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_options: Option<Value>,
}

/// `session/prompt` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptResponse {
    /// Why the turn ended.
    pub stop_reason: StopReason,
    /// `_meta`.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

// ---------------------------------------------------------------------------
// agent -> client requests

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_auth_method_is_the_first_whose_variables_are_all_set() {
        // codex-acp 0.16's list: a browser login, then two environment keys.
        let init: InitializeResponse = serde_json::from_value(serde_json::json!({
        "protocolVersion": 1,
        "authMethods": [
            {"id": "chatgpt", "name": "Login with ChatGPT"},
            {"type": "env_var", "id": "codex-api-key", "vars": [{"name": "CODEX_API_KEY"}]},
            {"type": "env_var", "id": "openai-api-key", "vars": [{"name": "OPENAI_API_KEY"}]},
            {"type": "env_var", "id": "empty", "vars": []}
        ]}))
        .unwrap();
        let set = |names: &'static [&'static str]| move |n: &str| names.contains(&n);
        assert_eq!(
            init.env_auth_method(set(&["OPENAI_API_KEY"])).as_deref(),
            Some("openai-api-key")
        );
        assert_eq!(
            init.env_auth_method(set(&["CODEX_API_KEY", "OPENAI_API_KEY"]))
                .as_deref(),
            Some("codex-api-key")
        );
        // Nothing set: no method (an interactive one is never chosen; nor one naming no variable).
        assert_eq!(init.env_auth_method(set(&[])), None);
        let none: InitializeResponse =
            serde_json::from_value(serde_json::json!({"protocolVersion": 1})).unwrap();
        assert_eq!(none.env_auth_method(|_| true), None);
    }

    #[test]
    fn unknown_option_kind_parses_but_is_not_selectable() {
        let req: PermissionRequest = serde_json::from_value(serde_json::json!({
            "sessionId": "s", "toolCall": {"toolCallId": "t", "kind": "teleport"},
            "options": [{"optionId": "a", "name": "A", "kind": "allow_once"},
                        {"optionId": "z", "name": "Z", "kind": "allow_forever_and_ever"}]}))
        .unwrap();
        assert!(req.offers("a"));
        assert!(!req.offers("z"));
        assert_eq!(
            req.tool_call.kind,
            Some(ToolKind::Unknown("teleport".into()))
        );
    }

    #[test]
    fn session_events_decode() {
        let ev = SessionEvent::from_update(&serde_json::json!({
            "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit", "kind": "edit",
            "locations": [{"path": "/a"}, {"nopath": 1}],
            "content": [{"type": "diff", "path": "/a", "oldText": null, "newText": "x"}]}))
        .unwrap()
        .unwrap();
        let SessionEvent::ToolCall(tc) = ev else {
            panic!()
        };
        assert_eq!(tc.locations.len(), 1);
        assert!(matches!(
            tc.content[0],
            ToolCallContent::Diff { old_text: None, .. }
        ));
        assert_eq!(
            SessionEvent::from_update(&serde_json::json!({"sessionUpdate": "brand_new"})).unwrap(),
            None
        );
        assert!(SessionEvent::from_update(&serde_json::json!({"x": 1})).is_err());
    }

    #[test]
    fn outcomes_serialize_exactly() {
        assert_eq!(
            PermissionOutcome::Cancelled.to_result(),
            serde_json::json!({"outcome": {"outcome": "cancelled"}})
        );
        assert_eq!(
            ClientCapabilities::default().to_value(),
            serde_json::json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false})
        );
    }
}
