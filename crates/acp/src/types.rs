//! ACP v1 message types (the subset a client needs), decoded tolerantly:
//! unknown enum strings become `Other`/`Unknown` variants instead of failing
//! the whole message, because adapters add values between releases.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

mod requests;
mod session;
mod updates;

pub use requests::*;
pub use session::*;
pub use updates::*;

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
