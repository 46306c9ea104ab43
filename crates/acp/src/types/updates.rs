//! What an agent reports in `session/update`: content, tool calls and their updates, plans,
//! commands, usage, decoded tolerantly (an unknown variant never fails the message).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::*;

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
