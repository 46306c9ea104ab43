//! Turning a verdict into an answer among the options the agent offered, and the explicit
//! switch_mode table.
//!
//! Option ids are adapter-private and change between releases, so choice is by `kind`; ids are
//! consulted only for what kinds cannot say: which refusal keeps the turn alive, and where a
//! `switch_mode` option lands (a plan exit, or Claude's request to enter plan mode). Never an `allow_always` (it makes the agent persist a rule in its own
//! settings), never an unknown kind, never an id that was not offered.

use crate::types::{OfferedOption, OptionKind, Verdict};

/// Refusals known to refuse only the one tool and let the turn continue (Codex 2.6 `decline`,
/// Codex 0.16 `denied`).
const TURN_KEEPING_REFUSALS: &[&str] = &["decline", "denied"];
/// Refusals known to end or interrupt the turn (Codex `cancel`, `abort`).
const TURN_ENDING_REFUSALS: &[&str] = &["cancel", "abort"];

/// Where a `switch_mode` option lands, read off the adapters' own effect tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchModeEffect {
    /// Leaves planning into a mode that still asks about every call (or changes no mode).
    KeepsSupervision,
    /// Enters plan mode (Claude's `EnterPlanMode` tool). Privilege goes down: in plan mode the
    /// agent only plans, and the adapter still asks about every call. Trusted only where no
    /// plan-exit option is offered beside it, since its id is the adapters' generic one-time
    /// allow.
    EntersPlan,
    /// Lands in a mode where the adapter stops asking (accept edits, auto, bypass), possibly
    /// with a fresh context.
    Elevated,
    /// Stays in plan mode (the refusal).
    StaysInPlan,
    /// Not in the table: its behaviour is unverified, so it is refused.
    Unknown,
}

/// One row of the switch_mode table.
#[derive(Debug, Clone, Copy)]
pub struct SwitchModeRow {
    pub id: &'static str,
    pub vocabulary: &'static str,
    pub effect: SwitchModeEffect,
}

/// The explicit switch_mode table (seed 000; `../shared/reference/acp.md` §3, real-adapters §3/5).
pub const SWITCH_MODE_TABLE: &[SwitchModeRow] = {
    use SwitchModeEffect::*;
    &[
        row("exit-plan-default", "claude-0.101", KeepsSupervision),
        row("exit-plan-accept-edits", "claude-0.101", Elevated),
        row("exit-plan-auto", "claude-0.101", Elevated),
        row("exit-plan-bypass", "claude-0.101", Elevated),
        row("exit-plan-clear-auto", "claude-0.101", Elevated),
        row("exit-plan-clear-bypass", "claude-0.101", Elevated),
        row("exit-plan-clear-accept-edits", "claude-0.101", Elevated),
        row("reject", "claude-0.101", StaysInPlan),
        // EnterPlanMode: `[allow-once "Yes, enter plan mode", reject]` (acp.md §3.2). The same
        // id is Claude's one-time allow for ordinary tools, which never ask with kind
        // switch_mode; ExitPlanMode uses only the exit-plan-* ids and `reject`.
        row("allow-once", "claude-0.101", EntersPlan),
        row("default", "claude-0.16", KeepsSupervision),
        row("acceptEdits", "claude-0.16", Elevated),
        row("bypassPermissions", "claude-0.23", Elevated),
        row("auto", "claude-pre-0.73", Elevated),
        row("dontAsk", "claude-pre-0.73", Elevated),
        row("plan", "claude-0.16", StaysInPlan),
        row("implement_plan", "codex-2.6", KeepsSupervision),
        row("revise_plan", "codex-2.6", StaysInPlan),
    ]
};

const fn row(
    id: &'static str,
    vocabulary: &'static str,
    effect: SwitchModeEffect,
) -> SwitchModeRow {
    SwitchModeRow {
        id,
        vocabulary,
        effect,
    }
}

/// Looks an option id up in [`SWITCH_MODE_TABLE`] (exact, case-sensitive: ids are identifiers).
pub fn switch_mode_effect(option_id: &str) -> SwitchModeEffect {
    SWITCH_MODE_TABLE
        .iter()
        .find(|r| r.id == option_id)
        .map(|r| r.effect)
        .unwrap_or(SwitchModeEffect::Unknown)
}

/// The answer to send the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `{"outcome":"selected","optionId":…}`; the id is always one the agent offered.
    Selected(String),
    /// `{"outcome":"cancelled"}`: only when the caller is cancelling the turn.
    Cancelled,
    /// No offered option fits a refusal (and the turn is not being cancelled): the caller must
    /// cancel the turn and then answer `cancelled`. Never answer an allow in this case.
    CancelTurn,
}

/// What [`choose_option`] decided, with the verdict it actually carries out and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: Outcome,
    /// `Allow` only when an allow option was selected; everything else is a refusal.
    pub effective: Verdict,
    pub reason: String,
}

/// Picks the answer for `verdict` among `offered`.
///
/// * `cancelling` → `Cancelled`, whatever else.
/// * `explicit_option_id` is used only when it was offered AND its kind fits the verdict
///   (`allow_once` for Allow, a reject kind otherwise).
/// * Allow → the first `allow_once`. If the only allow offered is `allow_always`, or none is,
///   the answer is a refusal and the reason says why.
/// * Deny / Escalate (an unanswered escalation is a denial) → a refusal that keeps the turn
///   alive (`decline`/`denied`, then other `reject_once`), then the turn-ending ones
///   (`cancel`/`abort`), then `reject_always`; with none offered, `CancelTurn`.
pub fn choose_option(
    verdict: Verdict,
    explicit_option_id: Option<&str>,
    offered: &[OfferedOption],
    cancelling: bool,
) -> Answer {
    if cancelling {
        return Answer {
            outcome: Outcome::Cancelled,
            effective: Verdict::Deny,
            reason: "the turn is being cancelled".to_string(),
        };
    }
    let mut note = String::new();
    if let Some(id) = explicit_option_id {
        match offered.iter().find(|o| o.id == id) {
            Some(o) if verdict == Verdict::Allow && o.kind == OptionKind::AllowOnce => {
                return Answer {
                    outcome: Outcome::Selected(o.id.clone()),
                    effective: Verdict::Allow,
                    reason: format!("allowed once with the named option {:?}", o.id),
                };
            }
            Some(o) if verdict != Verdict::Allow && o.kind.is_reject() => {
                return Answer {
                    outcome: Outcome::Selected(o.id.clone()),
                    effective: Verdict::Deny,
                    reason: format!("refused with the named option {:?}", o.id),
                };
            }
            Some(o) => {
                note = format!(
                    "; the named option {:?} (kind {:?}) does not fit a {verdict} verdict",
                    o.id,
                    kind_str(&o.kind)
                );
            }
            None => note = format!("; the named option {id:?} was not offered"),
        }
    }
    if verdict == Verdict::Allow {
        if let Some(o) = offered.iter().find(|o| o.kind == OptionKind::AllowOnce) {
            return Answer {
                outcome: Outcome::Selected(o.id.clone()),
                effective: Verdict::Allow,
                reason: format!("allowed once with {:?}{note}", o.id),
            };
        }
        let why = if offered.iter().any(|o| o.kind == OptionKind::AllowAlways) {
            "only an always-allow option was offered, and answering it would make the agent persist \
             a rule in its own settings; refusing instead"
        } else {
            "no one-time allow option was offered; refusing instead"
        };
        let mut refusal = refuse(offered);
        refusal.reason = format!("{why}: {}{note}", refusal.reason);
        return refusal;
    }
    let mut refusal = refuse(offered);
    refusal.reason.push_str(&note);
    refusal
}

fn kind_str(k: &OptionKind) -> &str {
    match k {
        OptionKind::AllowOnce => "allow_once",
        OptionKind::AllowAlways => "allow_always",
        OptionKind::RejectOnce => "reject_once",
        OptionKind::RejectAlways => "reject_always",
        OptionKind::Unknown(s) => s,
    }
}

/// The best refusal among `offered`.
fn refuse(offered: &[OfferedOption]) -> Answer {
    let once = |o: &&OfferedOption| o.kind == OptionKind::RejectOnce;
    let pick = offered
        .iter()
        .filter(once)
        .find(|o| TURN_KEEPING_REFUSALS.contains(&o.id.as_str()))
        .map(|o| (o, "refused; the turn continues"))
        .or_else(|| {
            offered
                .iter()
                .filter(once)
                .find(|o| !TURN_ENDING_REFUSALS.contains(&o.id.as_str()))
                .map(|o| (o, "refused"))
        })
        .or_else(|| {
            offered.iter().find(once).map(|o| {
                (
                    o,
                    "refused; no refusal that keeps the turn was offered, so the turn ends",
                )
            })
        })
        .or_else(|| {
            offered
                .iter()
                .find(|o| o.kind == OptionKind::RejectAlways)
                .map(|o| (o, "refused with the only refusal offered (reject_always)"))
        });
    match pick {
        Some((o, why)) => Answer {
            outcome: Outcome::Selected(o.id.clone()),
            effective: Verdict::Deny,
            reason: format!("{why} (option {:?})", o.id),
        },
        None => Answer {
            outcome: Outcome::CancelTurn,
            effective: Verdict::Deny,
            reason: "no refusal option was offered; the turn must be cancelled".to_string(),
        },
    }
}
