//! The permission decision as a pure library: the boundary floor (seed 000), the operator
//! policy (seed 001: modes, per-tool autoDeny/autoApprove/escalate/defaultAction, scopes),
//! escalation without an approver, and the choice of the option to answer with.
//!
//! Owns: every rule that turns (subject, boundary, tool call, offered options) into ALLOW, DENY
//! or ESCALATE with a readable reason and the name of the rule that matched, including what the
//! raw input of a known tool shape says it will touch (`raw_input`) and which paths are the
//! agent's own configuration and hooks (`control`), and what a decision judged as the action it
//! is bound to, with its digest (`judged`).
//!
//! Must never: do I/O of its own (no files, clock, network, environment — the only filesystem
//! access is through the `RootView` (an `FsView` that also knows identities) the caller passes
//! for path containment and the boundary check; the host's homes come in from the caller as a
//! `RootCheck`), let the operator
//! policy loosen the floor, select an `allow_always` or unknown-kind option, or name an option
//! id that was not offered.
#![forbid(unsafe_code)]

mod config;
mod control;
mod engine;
mod floor;
mod judged;
mod options;
mod raw_input;
mod types;

pub use config::{
    Action, FloorPolicy, Mode, NonInteractive, PolicyConfig, PolicyError, ScopePolicy,
};
pub use control::ControlPaths;
pub use engine::{Engine, raw_input_tool_name, title_head};
pub use floor::{FloorContext, FloorResult, evaluate as evaluate_floor};
pub use judged::{DIGEST_PREFIX, JudgedAction, command_matches, sha256_hex, shell_line};
pub use options::{
    Answer, Outcome, SWITCH_MODE_TABLE, SwitchModeEffect, SwitchModeRow, choose_option,
    switch_mode_effect,
};
pub use raw_input::{RawInputError, RawPaths, extract as raw_input_paths};
pub use types::{
    Boundary, Decision, DecisionInput, EndTurnReason, OfferedOption, OptionKind, Profile, Subject,
    ToolCall, ToolKind, Verdict,
};
pub use warden_containment::{AgentHomes, FsView, MemFs, RealFs, RootCheck, RootView};

#[cfg(test)]
mod tests;
