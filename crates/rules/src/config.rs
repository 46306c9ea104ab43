//! The operator policy as configured (TOML), and its validation.
//!
//! ```toml
//! [global]
//! mode = "approve-all"          # approve-all (default) | approve-reads | deny-all
//! non_interactive = "deny"      # deny (default) | fail
//! auto_deny = ["fetch"]         # kinds, title heads, titles, raw-input tool names
//! auto_approve = []
//! escalate = ["execute"]
//! default_action = "escalate"   # approve | deny | escalate (optional)
//!
//! [agents.codex]                # per configured agent name
//! mode = "approve-reads"
//!
//! [principals.alice]            # per authenticated principal; the most specific scope wins
//! auto_deny = ["Bash"]
//!
//! [groups.interns]              # per group of the caller (its credential's, for the turn):
//! mode = "approve-reads"        # below the principal's scope, above the agent's; a caller in
//!                               # several groups takes each key from the first by group name
//!
//! [floor]                       # additions to the boundary floor; they can only deny more
//! agent_control_paths = ["deploy/secrets", "**/Makefile"]
//! ```
//!
//! `floor.agent_control_paths` are root-relative globs (`*`/`?` within a component, `**` for
//! any number of components) naming files an agent may not edit, delete or move, in addition to
//! the built-in agent configuration and hooks (`.claude`, `.codex`, `.gemini`, `.qwen`,
//! `.opencode`, `.mcp.json`, `opencode.json(c)`, `.git`, `.git/hooks`, `.git/config`); an entry
//! naming a directory covers what is beneath it.
//!
//! acpx's camelCase spellings (`autoApprove`, `autoDeny`, `defaultAction`,
//! `nonInteractivePermissions`) are accepted as aliases.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The permission mode (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The boundary floor alone decides (seed 000's behaviour). warden's default.
    #[default]
    ApproveAll,
    /// read/search/think pass; everything else escalates.
    ApproveReads,
    /// Everything is refused.
    DenyAll,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApproveAll => "approve-all",
            Self::ApproveReads => "approve-reads",
            Self::DenyAll => "deny-all",
        }
    }
}

/// What an escalation becomes when no approver can be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NonInteractive {
    /// DENY, reason "escalated: no approver"; the turn goes on.
    #[default]
    Deny,
    /// DENY with end_turn, reason PERMISSION_PROMPT_UNAVAILABLE.
    Fail,
}

/// `defaultAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Approve,
    Deny,
    Escalate,
}

/// One scope's settings; every key is optional so that a narrower scope sets only what it
/// changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopePolicy {
    pub mode: Option<Mode>,
    #[serde(alias = "nonInteractivePermissions", alias = "nonInteractive")]
    pub non_interactive: Option<NonInteractive>,
    #[serde(alias = "autoApprove")]
    pub auto_approve: Option<Vec<String>>,
    #[serde(alias = "autoDeny")]
    pub auto_deny: Option<Vec<String>>,
    pub escalate: Option<Vec<String>>,
    #[serde(alias = "defaultAction")]
    pub default_action: Option<Action>,
}

/// Operator additions to the floor. Deny-only: nothing here can allow what the floor refuses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorPolicy {
    /// Root-relative globs of further agent-control files (rule `floor.change.agent-control`).
    #[serde(default)]
    pub agent_control_paths: Vec<String>,
}

/// The whole operator policy: a global scope, per-agent, per-group and per-principal scopes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default)]
    pub global: ScopePolicy,
    #[serde(default)]
    pub agents: BTreeMap<String, ScopePolicy>,
    #[serde(default)]
    pub principals: BTreeMap<String, ScopePolicy>,
    /// Per group of the caller (issuer-prefixed for an OpenID Connect group, as the gateway
    /// names it).
    #[serde(default)]
    pub groups: BTreeMap<String, ScopePolicy>,
    #[serde(default)]
    pub floor: FloorPolicy,
}

/// A policy that cannot be used; names the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("invalid policy: {0}")]
    Parse(String),
    #[error("{key}[{index}] is empty: an empty matcher would match nothing a person meant")]
    EmptyMatcher { key: String, index: usize },
    #[error("{scope} has an empty name")]
    EmptyScopeName { scope: &'static str },
    #[error("floor.agent_control_paths[{index}] = {entry:?}: {why}")]
    BadControlPath {
        index: usize,
        entry: String,
        why: &'static str,
    },
}

impl PolicyConfig {
    /// Parses and validates a TOML policy document (the shape in the module docs).
    pub fn from_toml_str(text: &str) -> Result<Self, PolicyError> {
        let cfg: Self = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects what deserialization alone lets through.
    pub fn validate(&self) -> Result<(), PolicyError> {
        check_scope("global", &self.global)?;
        for (name, s) in &self.agents {
            if name.is_empty() {
                return Err(PolicyError::EmptyScopeName { scope: "agents" });
            }
            check_scope(&format!("agents.{name}"), s)?;
        }
        for (name, s) in &self.principals {
            if name.is_empty() {
                return Err(PolicyError::EmptyScopeName {
                    scope: "principals",
                });
            }
            check_scope(&format!("principals.{name}"), s)?;
        }
        for (name, s) in &self.groups {
            if name.is_empty() {
                return Err(PolicyError::EmptyScopeName { scope: "groups" });
            }
            check_scope(&format!("groups.{name}"), s)?;
        }
        for (index, entry) in self.floor.agent_control_paths.iter().enumerate() {
            let bad = |why| {
                Err(PolicyError::BadControlPath {
                    index,
                    entry: entry.clone(),
                    why,
                })
            };
            let comps: Vec<&str> = entry
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .collect();
            if comps.is_empty() {
                return bad("names nothing below the root (empty, `.` or `/`)");
            }
            if entry.starts_with('/') {
                return bad("must be relative to the root; paths outside it are denied anyway");
            }
            if comps.contains(&"..") {
                return bad("`..` would leave the root");
            }
            if comps.iter().all(|c| *c == "**") {
                return bad("matches every path: use mode = \"deny-all\" for that");
            }
        }
        Ok(())
    }
}

fn check_scope(prefix: &str, s: &ScopePolicy) -> Result<(), PolicyError> {
    for (key, list) in [
        ("auto_approve", &s.auto_approve),
        ("auto_deny", &s.auto_deny),
        ("escalate", &s.escalate),
    ] {
        if let Some(list) = list
            && let Some(index) = list.iter().position(|e| e.trim().is_empty())
        {
            return Err(PolicyError::EmptyMatcher {
                key: format!("{prefix}.{key}"),
                index,
            });
        }
    }
    Ok(())
}
