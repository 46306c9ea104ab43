//! The boundary floor (seed 000, "The rules"): what no operator policy can loosen.

use warden_containment::{FsView, is_inside};

use crate::options::{SwitchModeEffect, switch_mode_effect};
use crate::types::{DecisionInput, OptionKind, Profile, ToolKind};

/// The floor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorResult {
    pub allow: bool,
    pub rule: &'static str,
    pub reason: String,
    /// For switch_mode: the offered option that keeps supervision.
    pub option_id: Option<String>,
}

fn allow(rule: &'static str, reason: impl Into<String>) -> FloorResult {
    FloorResult {
        allow: true,
        rule,
        reason: reason.into(),
        option_id: None,
    }
}

fn deny(rule: &'static str, reason: impl Into<String>) -> FloorResult {
    FloorResult {
        allow: false,
        rule,
        reason: reason.into(),
        option_id: None,
    }
}

/// Verbs that are read-only whatever profile the caller claims.
const READ_ONLY_VERBS: &[&str] = &["advise", "review"];

/// Evaluates the floor. `fs` is consulted only for edit/delete/move with locations.
pub fn evaluate(input: &DecisionInput, fs: &(impl FsView + ?Sized)) -> FloorResult {
    let b = &input.boundary;
    let kind = input.tool.kind;
    let read_only = b.profile == Profile::ReadOnly;
    let read_only_verb = READ_ONLY_VERBS
        .iter()
        .any(|v| input.subject.verb.eq_ignore_ascii_case(v));
    let restricted = matches!(
        kind,
        ToolKind::Edit
            | ToolKind::Delete
            | ToolKind::Move
            | ToolKind::Execute
            | ToolKind::Fetch
            | ToolKind::Other
    );
    if restricted && (read_only || read_only_verb) {
        // `other` is refused too: it may be anything, and read-only means nothing changes.
        let why = if read_only {
            "the conversation runs under the read-only profile".to_string()
        } else {
            format!("the verb {:?} is read-only", input.subject.verb)
        };
        return deny(
            "floor.profile.read-only",
            format!("{kind} is not allowed: {why}"),
        );
    }
    match kind {
        ToolKind::Read | ToolKind::Search | ToolKind::Think => {
            allow("floor.non-mutating", format!("{kind} changes nothing"))
        }
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => {
            if input.tool.locations.is_empty() {
                return if b.owned {
                    allow(
                        "floor.change.no-locations.owned-root",
                        format!("{kind} names no paths, and the root is one warden created"),
                    )
                } else {
                    deny(
                        "floor.change.no-locations.foreign-root",
                        format!(
                            "{kind} names no paths to check, and the root {} was not created by warden",
                            b.root.display()
                        ),
                    )
                };
            }
            for loc in &input.tool.locations {
                match is_inside(&b.root, loc, fs) {
                    Ok(true) => {}
                    Ok(false) => {
                        return deny(
                            "floor.change.outside-root",
                            format!(
                                "{kind} of {} resolves outside the root {}",
                                loc.display(),
                                b.root.display()
                            ),
                        );
                    }
                    Err(e) => {
                        return deny(
                            "floor.change.unresolvable",
                            format!(
                                "{kind} of {:?} cannot be shown to stay inside the root {}: {e}",
                                loc,
                                b.root.display()
                            ),
                        );
                    }
                }
            }
            allow(
                "floor.change.inside-root",
                format!(
                    "every path of the {kind} resolves inside the root {}",
                    b.root.display()
                ),
            )
        }
        ToolKind::Execute | ToolKind::Fetch | ToolKind::Other => {
            if b.owned {
                allow(
                    "floor.execute.owned-root",
                    format!("{kind} runs in a root warden created"),
                )
            } else if b.allow_execute {
                allow(
                    "floor.execute.operator-allowed",
                    format!(
                        "{kind} in a root warden did not create, allowed by the operator's allow_execute"
                    ),
                )
            } else {
                deny(
                    "floor.execute.foreign-root",
                    format!(
                        "{kind} runs only in a directory warden created (or with allow_execute); {} is not one",
                        b.root.display()
                    ),
                )
            }
        }
        ToolKind::SwitchMode => switch_mode(input),
    }
}

fn switch_mode(input: &DecisionInput) -> FloorResult {
    // An enter-plan id offered beside plan-exit ids means the request is not the one the table
    // describes (the id is also the generic one-time allow), so it is not trusted then.
    let exits_offered = input.options.iter().any(|o| {
        matches!(
            switch_mode_effect(&o.id),
            SwitchModeEffect::KeepsSupervision | SwitchModeEffect::Elevated
        )
    });
    let safe = input.options.iter().find_map(|o| {
        if o.kind != OptionKind::AllowOnce {
            return None;
        }
        match switch_mode_effect(&o.id) {
            SwitchModeEffect::KeepsSupervision => Some((
                o,
                "floor.switch_mode.keeps-supervision",
                "it leaves planning into a mode that still asks about every call",
            )),
            SwitchModeEffect::EntersPlan if !exits_offered => Some((
                o,
                "floor.switch_mode.enters-plan",
                "it enters plan mode, where the agent only plans and is still asked about every call",
            )),
            _ => None,
        }
    });
    if let Some((o, rule, why)) = safe {
        return FloorResult {
            allow: true,
            rule,
            reason: format!("answer {:?}: {why}", o.id),
            option_id: Some(o.id.clone()),
        };
    }
    let mut refused: Vec<String> = Vec::new();
    for o in &input.options {
        let why = match switch_mode_effect(&o.id) {
            SwitchModeEffect::Elevated => "elevated mode",
            SwitchModeEffect::StaysInPlan => "stays in plan mode",
            SwitchModeEffect::Unknown => "unknown option, behaviour unverified",
            SwitchModeEffect::KeepsSupervision | SwitchModeEffect::EntersPlan
                if o.kind != OptionKind::AllowOnce =>
            {
                "offered with a kind other than allow_once"
            }
            SwitchModeEffect::EntersPlan => {
                "an enter-plan id offered beside plan-exit options, so its effect is unverified"
            }
            SwitchModeEffect::KeepsSupervision => "offered with a kind other than allow_once",
        };
        refused.push(format!("{:?}: {why}", o.id));
    }
    deny(
        "floor.switch_mode.no-safe-option",
        format!(
            "no offered option keeps supervision ({})",
            if refused.is_empty() {
                "none offered".to_string()
            } else {
                refused.join(", ")
            }
        ),
    )
}
