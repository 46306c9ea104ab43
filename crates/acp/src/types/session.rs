//! `initialize` and sessions: the capabilities the client advertises, the agent's answer,
//! modes, and the answers of `session/new`, `session/load` and `session/prompt`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;

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
