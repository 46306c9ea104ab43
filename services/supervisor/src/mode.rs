//! The mode-escalation guard, as a pure function: what a mode the agent reports means for
//! supervision. The session mode is what makes an adapter ask at all, so a change to a mode
//! that stops asking is an escalation unless an ALLOWed `switch_mode` of this turn led to it.
//!
//! Must never: do I/O or touch the agent; `conversation.rs` acts on the answer (records it,
//! sets the supervised mode back, or ends the conversation).

/// What a reported mode means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeJudgement {
    /// The mode the agent last reported: one change announced twice (mode update and config
    /// option) is handled once.
    Unchanged,
    /// A mode that still asks about every call.
    Supervised,
    /// An elevated mode an ALLOWed switch_mode named (this index of `allowed_switches`, to be
    /// consumed: one ALLOW, one switch).
    Allowed(usize),
    /// An elevated mode nothing allowed.
    Escalation,
}

/// Judges `mode`, reported after `last_reported`, for an agent whose supervised modes are
/// recognised by `is_supervised`, with this turn's ALLOWed switch option ids (older adapters
/// use mode ids as option ids).
pub fn judge(
    last_reported: &str,
    mode: &str,
    is_supervised: impl Fn(&str) -> bool,
    allowed_switches: &[String],
) -> ModeJudgement {
    if last_reported == mode {
        return ModeJudgement::Unchanged;
    }
    if is_supervised(mode) {
        return ModeJudgement::Supervised;
    }
    match allowed_switches.iter().position(|o| o == mode) {
        Some(i) => ModeJudgement::Allowed(i),
        None => ModeJudgement::Escalation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervised(m: &str) -> bool {
        matches!(m, "default" | "plan" | "")
    }

    #[test]
    fn each_reported_mode_is_judged() {
        let none: Vec<String> = vec![];
        assert_eq!(
            judge("default", "default", supervised, &none),
            ModeJudgement::Unchanged
        );
        assert_eq!(
            judge("default", "plan", supervised, &none),
            ModeJudgement::Supervised
        );
        assert_eq!(
            judge("default", "bypassPermissions", supervised, &none),
            ModeJudgement::Escalation
        );
        let allowed = vec!["plan".to_string(), "acceptEdits".to_string()];
        assert_eq!(
            judge("plan", "acceptEdits", supervised, &allowed),
            ModeJudgement::Allowed(1)
        );
        // An allowed id is not a licence for another elevated mode.
        assert_eq!(
            judge("plan", "bypassPermissions", supervised, &allowed),
            ModeJudgement::Escalation
        );
        // Returning to an elevated mode it was already in is no change (it was judged then).
        assert_eq!(
            judge("bypassPermissions", "bypassPermissions", supervised, &none),
            ModeJudgement::Unchanged
        );
    }
}
