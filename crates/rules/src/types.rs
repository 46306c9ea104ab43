//! The decision's inputs and outputs, independent of the wire format (the service converts
//! from and to `warden_proto::v1`).

use std::fmt;
use std::path::PathBuf;

/// ACP tool kind. Any string ACP does not define is [`ToolKind::Other`] (as the ACP Rust SDK does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    Read,
    Edit,
    Delete,
    Move,
    Search,
    Execute,
    Think,
    Fetch,
    SwitchMode,
    Other,
}

impl ToolKind {
    /// Parses an ACP kind, case-insensitively; unknown or empty strings are `Other`, which the
    /// floor treats like `execute` (only in an owned root or with `allow_execute`).
    pub fn parse(s: &str) -> Self {
        let known = [
            ("read", Self::Read),
            ("edit", Self::Edit),
            ("delete", Self::Delete),
            ("move", Self::Move),
            ("search", Self::Search),
            ("execute", Self::Execute),
            ("think", Self::Think),
            ("fetch", Self::Fetch),
            ("switch_mode", Self::SwitchMode),
            ("other", Self::Other),
        ];
        known
            .iter()
            .find(|(name, _)| s.eq_ignore_ascii_case(name))
            .map(|(_, k)| *k)
            .unwrap_or(Self::Other)
    }

    /// The ACP spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Edit => "edit",
            Self::Delete => "delete",
            Self::Move => "move",
            Self::Search => "search",
            Self::Execute => "execute",
            Self::Think => "think",
            Self::Fetch => "fetch",
            Self::SwitchMode => "switch_mode",
            Self::Other => "other",
        }
    }

    /// Kinds that change nothing (seed 000: "read, search, think — nothing changes"); also what
    /// `approve-reads` approves.
    pub fn is_non_mutating(self) -> bool {
        matches!(self, Self::Read | Self::Search | Self::Think)
    }
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub use warden_containment::{Boundary, Profile};

/// Who asks; `principal`, its `groups`, `agent` and `verb` influence the decision, the rest is
/// carried for the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    pub principal: String,
    pub agent: String,
    pub verb: String,
    /// The groups the caller's credential carried for this turn (`[groups.NAME]` scopes).
    pub groups: Vec<String>,
}

/// The tool call the agent wants to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The kind string exactly as the agent sent it (matched by the operator policy too).
    pub kind_raw: String,
    pub kind: ToolKind,
    pub title: String,
    /// Raw input as JSON text ("" when none); only read for its tool name.
    pub raw_input_json: String,
    /// Paths as the agent reported them, absolute or relative to the root.
    pub locations: Vec<PathBuf>,
}

impl ToolCall {
    pub fn new(kind: &str, title: &str) -> Self {
        Self {
            kind_raw: kind.to_string(),
            kind: ToolKind::parse(kind),
            title: title.to_string(),
            raw_input_json: String::new(),
            locations: Vec::new(),
        }
    }

    pub fn with_locations<P: Into<PathBuf>>(mut self, locs: impl IntoIterator<Item = P>) -> Self {
        self.locations = locs.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_raw_input(mut self, json: &str) -> Self {
        self.raw_input_json = json.to_string();
        self
    }
}

/// ACP permission option kind. Kinds ACP does not define are kept verbatim and never selected.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OptionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    Unknown(String),
}

impl OptionKind {
    /// Exact ACP spelling only: a kind that is merely similar is not trusted.
    pub fn parse(s: &str) -> Self {
        match s {
            "allow_once" => Self::AllowOnce,
            "allow_always" => Self::AllowAlways,
            "reject_once" => Self::RejectOnce,
            "reject_always" => Self::RejectAlways,
            other => Self::Unknown(other.to_string()),
        }
    }

    pub fn is_reject(&self) -> bool {
        matches!(self, Self::RejectOnce | Self::RejectAlways)
    }
}

/// One option the agent offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedOption {
    pub id: String,
    pub name: String,
    pub kind: OptionKind,
}

impl OfferedOption {
    pub fn new(id: &str, kind: &str) -> Self {
        Self {
            id: id.to_string(),
            name: String::new(),
            kind: OptionKind::parse(kind),
        }
    }
}

/// Everything one decision looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionInput {
    pub subject: Subject,
    pub boundary: Boundary,
    pub tool: ToolCall,
    /// In the order the agent offered them.
    pub options: Vec<OfferedOption>,
}

/// The verdict. `Deny` is the default, as in the wire contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verdict {
    #[default]
    Deny,
    Allow,
    Escalate,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deny => "deny",
            Self::Allow => "allow",
            Self::Escalate => "escalate",
        })
    }
}

/// The outcome of [`crate::Engine::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The offered option to answer with, when one fits the verdict (always one of the offered ids).
    pub option_id: Option<String>,
    /// Why, for a person. Never empty.
    pub reason: String,
    /// The rule that matched, e.g. `floor.edit.outside-root`, `tool.autoDeny`.
    pub rule: String,
    /// The turn must end after this answer, and why (non_interactive = fail).
    pub end_turn: Option<EndTurnReason>,
}

/// Why a decision ends the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndTurnReason {
    /// An escalation with no approver under `non_interactive = fail`.
    PermissionPromptUnavailable,
}
