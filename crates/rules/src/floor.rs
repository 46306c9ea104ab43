//! The boundary floor (seed 000, "The rules"): what no operator policy can loosen.

use std::path::{Component, Path, PathBuf};

use warden_containment::{Anchored, RootCheck, RootView};

use crate::control::ControlPaths;
use crate::options::{SwitchModeEffect, switch_mode_effect};
use crate::raw_input::{self, RawPaths};
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

/// What the floor needs besides the request: the boundary validator with the host's homes
/// (supplied by the service, read once at start) and the agent-control names.
#[derive(Debug, Clone, Default)]
pub struct FloorContext {
    pub root_check: RootCheck,
    pub control: ControlPaths,
}

/// Evaluates the floor, in this order: a boundary that cannot be trusted denies everything;
/// then the read-only profile; then raw input that cannot be read (mutating kinds); then the
/// kind's row of seed 000, where every path — `locations` and the paths the raw input names —
/// is resolved first, then checked against the agent-control names (denied even inside the
/// root), then against the root.
pub fn evaluate(
    input: &DecisionInput,
    fs: &(impl RootView + ?Sized),
    ctx: &FloorContext,
) -> FloorResult {
    let b = &input.boundary;
    let kind = input.tool.kind;
    let real_root = match ctx.root_check.check(&b.root, fs) {
        Ok(r) => r,
        Err(why) => {
            return deny(
                "floor.boundary.invalid",
                format!(
                    "the boundary root {:?} cannot be trusted ({why}), so no {kind} is judged inside it",
                    b.root
                ),
            );
        }
    };
    // The root is resolved and checked: the paths judged below are resolved asking only about
    // what lies beneath it (its ancestors are the check's own answer, not the agent's).
    let anchored = Anchored::trusting(fs, &real_root);
    let fs = &anchored;
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
    let raw = if restricted {
        match raw_input::extract(&input.tool.raw_input_json) {
            Ok(r) => r,
            Err(e) => {
                return deny(
                    "floor.input.malformed",
                    format!("{kind} refused: {e}, so what the tool will do cannot be checked"),
                );
            }
        }
    } else {
        RawPaths::default()
    };
    // Relative raw-input paths are relative to the tool's working directory when it names one.
    let raw_base = raw
        .cwds
        .first()
        .map(|c| real_root.join(c))
        .unwrap_or_else(|| real_root.clone());
    match kind {
        ToolKind::Read | ToolKind::Search | ToolKind::Think => {
            allow("floor.non-mutating", format!("{kind} changes nothing"))
        }
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => {
            let locations = input.tool.locations.iter().map(|l| (l, &real_root));
            let raw_paths = raw.changed.iter().map(|p| (p, &raw_base));
            for (path, base) in locations.chain(raw_paths) {
                if let Some(d) = check_change(kind, path, base, &real_root, fs, ctx) {
                    return d;
                }
            }
            if input.tool.locations.is_empty() {
                // Paths read off the raw input only ever tighten: in a root warden did not
                // create, an edit the adapter reported no locations for is still refused.
                let checked = if raw.changed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (the {} path(s) its raw input names resolve inside the root)",
                        raw.changed.len()
                    )
                };
                return if b.owned {
                    allow(
                        "floor.change.no-locations.owned-root",
                        format!(
                            "{kind} names no locations{checked}, and the root is one warden created"
                        ),
                    )
                } else {
                    deny(
                        "floor.change.no-locations.foreign-root",
                        format!(
                            "{kind} names no locations to check{checked}, and the root {} was not created by warden",
                            b.root.display()
                        ),
                    )
                };
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
            for cwd in &raw.cwds {
                let outside = match fs.resolve(cwd, &real_root) {
                    Ok(r) if r.starts_with(&real_root) => continue,
                    Ok(r) => format!("resolves to {}", r.display()),
                    Err(e) => format!("cannot be resolved ({e})"),
                };
                return deny(
                    "floor.execute.cwd-outside-root",
                    format!(
                        "{kind} would run in {} which {outside}, outside the root {}; a command runs only inside its root",
                        cwd.display(),
                        b.root.display()
                    ),
                );
            }
            // A patch carried in a command (Codex `apply_patch` through the shell) is an edit.
            for path in &raw.changed {
                if let Some(d) = check_change(kind, path, &raw_base, &real_root, fs, ctx) {
                    return d;
                }
            }
            // An `other` request that names places (OpenCode's `external_directory`: its raw
            // input, or the locations it reports) is judged by them. It only reaches them:
            // what is then done there is asked on its own (an edit is an edit, judged by its
            // path; a command by its cwd), and what needs no asking is a read, which the floor
            // allows anywhere. So a place outside the root is named in the decision (and in
            // the judged action its digest covers) rather than refused; one that cannot be
            // resolved is refused.
            let mut outside = Vec::new();
            if kind == ToolKind::Other {
                let locations = input
                    .tool
                    .locations
                    .iter()
                    .map(|l| (l, real_root.as_path()));
                let reached = raw.reached.iter().map(|p| (p, raw_base.as_path()));
                for (path, base) in locations.chain(reached) {
                    match fs.resolve(path, base) {
                        Ok(r) if r.starts_with(&real_root) => {}
                        Ok(r) => outside.push(r.display().to_string()),
                        Err(e) => {
                            return deny(
                                "floor.other.unresolvable",
                                format!(
                                    "{kind} names {} which cannot be resolved ({e})",
                                    path.display()
                                ),
                            );
                        }
                    }
                }
            }
            if !outside.is_empty() && (b.owned || b.allow_execute) {
                return allow(
                    "floor.other.reaches-outside-root",
                    format!(
                        "{kind} reaches {} outside the root {}: only to read there; what it \
                         would change or run there is asked on its own",
                        outside.join(", "),
                        b.root.display()
                    ),
                );
            }
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

/// One path a change would touch: resolved first, then matched against the agent-control
/// names (both as written and as resolved — `.claude` reached through a symlink is still
/// `.claude`, and a write to `.claude/x` goes wherever a planted `.claude` link points),
/// then held to the root. `None` when the path is fine.
fn check_change(
    kind: ToolKind,
    path: &Path,
    base: &Path,
    real_root: &Path,
    fs: &Anchored<impl RootView>,
    ctx: &FloorContext,
) -> Option<FloorResult> {
    let resolved = match fs.resolve(path, base) {
        Ok(r) => r,
        Err(e) => {
            return Some(deny(
                "floor.change.unresolvable",
                format!(
                    "{kind} of {path:?} cannot be shown to stay inside the root {}: {e}",
                    real_root.display()
                ),
            ));
        }
    };
    let written = lexical(&base.join(path));
    let control = ctx
        .control
        .matched(real_root, &resolved)
        .or_else(|| ctx.control.matched(real_root, &written));
    if let Some(what) = control {
        return Some(deny(
            "floor.change.agent-control",
            format!(
                "{kind} of {} would change {what}: an agent may not change its own configuration or hooks",
                path.display()
            ),
        ));
    }
    if !resolved.starts_with(real_root) {
        return Some(deny(
            "floor.change.outside-root",
            format!(
                "{kind} of {} resolves outside the root {}",
                path.display(),
                real_root.display()
            ),
        ));
    }
    None
}

/// `p` with `.` dropped and `..` applied to the text (only used to match names, never to decide
/// containment).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
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
