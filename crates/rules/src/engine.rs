//! Floor, then operator policy, then escalation handling, then the option to answer with.

use warden_containment::{RootCheck, RootView};

use crate::config::{Action, Mode, NonInteractive, PolicyConfig, PolicyError, ScopePolicy};
use crate::control::ControlPaths;
use crate::floor::{self, FloorContext};
use crate::options::{Outcome, choose_option};
use crate::types::{Decision, DecisionInput, EndTurnReason, ToolCall, Verdict};

/// A scope with its matchers lowercased once, so a decision does no per-entry allocation.
#[derive(Debug, Clone, Default)]
struct Scope {
    mode: Option<Mode>,
    non_interactive: Option<NonInteractive>,
    auto_approve: Option<Vec<String>>,
    auto_deny: Option<Vec<String>>,
    escalate: Option<Vec<String>>,
    default_action: Option<Action>,
}

impl Scope {
    fn compile(s: &ScopePolicy) -> Self {
        let lower = |l: &Option<Vec<String>>| {
            l.as_ref()
                .map(|v| v.iter().map(|e| e.trim().to_lowercase()).collect())
        };
        Self {
            mode: s.mode,
            non_interactive: s.non_interactive,
            auto_approve: lower(&s.auto_approve),
            auto_deny: lower(&s.auto_deny),
            escalate: lower(&s.escalate),
            default_action: s.default_action,
        }
    }
}

/// The decision engine for one version of the operator policy. Immutable; share it behind an
/// `Arc` and swap the `Arc` to reload.
#[derive(Debug, Clone)]
pub struct Engine {
    config: PolicyConfig,
    global: Scope,
    agents: Vec<(String, Scope)>,
    principals: Vec<(String, Scope)>,
    /// By group name, in name order (the order a principal's groups are consulted in).
    groups: Vec<(String, Scope)>,
    floor: FloorContext,
}

/// The per-key resolution of global → agent → groups → principal for one subject: each key
/// from the most specific scope that sets it.
struct Effective<'a> {
    /// Most specific first: the principal's, each of its groups' (by group name), the agent's,
    /// the global one; each with the name its provenance is told by.
    scopes: Vec<(&'a Scope, &'static str)>,
}

impl<'a> Effective<'a> {
    fn get<T>(&self, f: impl Fn(&'a Scope) -> Option<T>) -> Option<(T, &'static str)> {
        self.scopes
            .iter()
            .find_map(|(s, name)| f(s).map(|v| (v, *name)))
    }
}

/// The strings an operator matcher is compared with, lowercased.
struct MatchKeys {
    keys: Vec<(&'static str, String)>,
}

impl MatchKeys {
    fn of(tool: &ToolCall) -> Self {
        let mut keys = vec![
            ("kind", tool.kind_raw.trim().to_lowercase()),
            ("kind", tool.kind.as_str().to_string()),
            ("title", tool.title.trim().to_lowercase()),
        ];
        if let Some(head) = title_head(&tool.title) {
            keys.push(("title head", head.to_lowercase()));
        }
        if let Some(name) = raw_input_tool_name(&tool.raw_input_json) {
            keys.push(("raw-input tool name", name.to_lowercase()));
        }
        keys.retain(|(_, k)| !k.is_empty());
        Self { keys }
    }

    /// The first matcher in `list` that equals one of the keys, with which key it matched.
    fn find<'l>(&self, list: &'l [String]) -> Option<(&'l str, &'static str)> {
        list.iter().find_map(|entry| {
            self.keys
                .iter()
                .find(|(_, k)| k == entry)
                .map(|(what, _)| (entry.as_str(), *what))
        })
    }
}

/// The first word of a title, without the quoting adapters put around commands
/// (Claude titles a shell call "`touch /x`").
pub fn title_head(title: &str) -> Option<&str> {
    let head = title
        .split_whitespace()
        .next()?
        .trim_matches(|c: char| matches!(c, '`' | '"' | '\'' | ':'));
    (!head.is_empty()).then_some(head)
}

/// The tool name carried in the raw input, if any (`tool`, `toolName`, `tool_name` or `name`
/// as a string at the top level). Invalid JSON has no tool name.
pub fn raw_input_tool_name(raw_input_json: &str) -> Option<String> {
    if raw_input_json.trim().is_empty() {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(raw_input_json).ok()?;
    let obj = value.as_object()?;
    ["tool", "toolName", "tool_name", "name"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(|v| v.as_str()))
        .map(str::to_string)
}

/// An intermediate decision before the option is chosen.
struct Pending {
    verdict: Verdict,
    rule: String,
    reason: String,
    explicit_option: Option<String>,
    end_turn: Option<EndTurnReason>,
}

impl Engine {
    /// Builds an engine from a validated policy. Its boundary check knows no homes until
    /// [`Engine::with_root_check`] gives it the host's (a service must; see `AgentHomes`).
    pub fn new(config: PolicyConfig) -> Result<Self, PolicyError> {
        config.validate()?;
        let compile = |m: &std::collections::BTreeMap<String, ScopePolicy>| {
            m.iter()
                .map(|(k, s)| (k.clone(), Scope::compile(s)))
                .collect::<Vec<_>>()
        };
        Ok(Self {
            global: Scope::compile(&config.global),
            agents: compile(&config.agents),
            principals: compile(&config.principals),
            groups: compile(&config.groups),
            floor: FloorContext {
                root_check: RootCheck::default(),
                control: ControlPaths::new(&config.floor.agent_control_paths),
            },
            config,
        })
    }

    /// The same engine judging boundaries with `root_check` (homes and agent configuration
    /// homes resolved once, the same validator the supervisor applies to workspaces).
    pub fn with_root_check(mut self, root_check: RootCheck) -> Self {
        self.floor.root_check = root_check;
        self
    }

    /// The policy this engine was built from.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    fn effective(&self, input: &DecisionInput) -> Effective<'_> {
        // Tiny maps in practice, so a linear scan beats hashing.
        fn find<'s>(list: &'s [(String, Scope)], name: &str) -> Option<&'s Scope> {
            if name.is_empty() {
                return None;
            }
            list.iter().find(|(k, _)| k == name).map(|(_, s)| s)
        }
        let mut scopes = Vec::with_capacity(3);
        if let Some(s) = find(&self.principals, &input.subject.principal) {
            scopes.push((s, "principal"));
        }
        if !input.subject.groups.is_empty() {
            scopes.extend(
                self.groups
                    .iter()
                    .filter(|(g, _)| input.subject.groups.contains(g))
                    .map(|(_, s)| (s, "group")),
            );
        }
        if let Some(s) = find(&self.agents, &input.subject.agent) {
            scopes.push((s, "agent"));
        }
        scopes.push((&self.global, "global"));
        Effective { scopes }
    }

    /// The decision as warden-policy gives it when no approver stands behind it: an ESCALATE
    /// becomes DENY per the effective `non_interactive` (`deny`: reason "escalated: no
    /// approver"; `fail`: end_turn and PERMISSION_PROMPT_UNAVAILABLE).
    pub fn decide(&self, input: &DecisionInput, fs: &(impl RootView + ?Sized)) -> Decision {
        let eff = self.effective(input);
        let mut p = self.evaluate(input, fs, &eff);
        if p.verdict == Verdict::Escalate {
            let (ni, _) = eff
                .get(|s| s.non_interactive)
                .unwrap_or((NonInteractive::Deny, "default"));
            p = match ni {
                NonInteractive::Deny => Pending {
                    verdict: Verdict::Deny,
                    rule: "escalation.no-approver".to_string(),
                    reason: format!("escalated: no approver ({}: {})", p.rule, p.reason),
                    explicit_option: None,
                    end_turn: None,
                },
                NonInteractive::Fail => Pending {
                    verdict: Verdict::Deny,
                    rule: "escalation.prompt-unavailable".to_string(),
                    reason: format!(
                        "PERMISSION_PROMPT_UNAVAILABLE: escalated ({}: {}) and no approver can be asked",
                        p.rule, p.reason
                    ),
                    explicit_option: None,
                    end_turn: Some(EndTurnReason::PermissionPromptUnavailable),
                },
            };
        }
        finish(p, input)
    }

    /// The decision with ESCALATE kept, for a caller that has an approver behind it.
    pub fn decide_with_approver(
        &self,
        input: &DecisionInput,
        fs: &(impl RootView + ?Sized),
    ) -> Decision {
        let eff = self.effective(input);
        let p = self.evaluate(input, fs, &eff);
        finish(p, input)
    }

    fn evaluate(
        &self,
        input: &DecisionInput,
        fs: &(impl RootView + ?Sized),
        eff: &Effective<'_>,
    ) -> Pending {
        let fl = floor::evaluate(input, fs, &self.floor);
        if !fl.allow {
            return Pending {
                verdict: Verdict::Deny,
                rule: fl.rule.to_string(),
                reason: fl.reason,
                explicit_option: None,
                end_turn: None,
            };
        }
        let needs_keys = [
            eff.get(|s| s.auto_deny.as_ref()),
            eff.get(|s| s.auto_approve.as_ref()),
            eff.get(|s| s.escalate.as_ref()),
        ]
        .iter()
        .any(|l| l.is_some_and(|(l, _)| !l.is_empty()));
        let keys = needs_keys.then(|| MatchKeys::of(&input.tool));
        let matched = |list: Option<(&Vec<String>, &'static str)>| {
            let (list, scope) = list?;
            let (entry, what) = keys.as_ref()?.find(list)?;
            Some(format!("{entry:?} matches the {what} ({scope} scope)"))
        };
        let floor_option = fl.option_id.clone();
        let p = |verdict, rule: &str, reason: String| Pending {
            verdict,
            rule: rule.to_string(),
            reason,
            explicit_option: floor_option.clone(),
            end_turn: None,
        };
        if let Some(m) = matched(eff.get(|s| s.auto_deny.as_ref())) {
            return p(
                Verdict::Deny,
                "tool.autoDeny",
                format!("operator policy autoDeny: {m}"),
            );
        }
        if let Some(m) = matched(eff.get(|s| s.auto_approve.as_ref())) {
            return p(
                Verdict::Allow,
                "tool.autoApprove",
                format!("operator policy autoApprove: {m}; floor: {}", fl.reason),
            );
        }
        if let Some(m) = matched(eff.get(|s| s.escalate.as_ref())) {
            return p(
                Verdict::Escalate,
                "tool.escalate",
                format!("operator policy escalate: {m}"),
            );
        }
        if let Some((action, scope)) = eff.get(|s| s.default_action) {
            return match action {
                Action::Approve => p(
                    Verdict::Allow,
                    "tool.defaultAction",
                    format!(
                        "operator policy defaultAction approve ({scope} scope); floor: {}",
                        fl.reason
                    ),
                ),
                Action::Deny => p(
                    Verdict::Deny,
                    "tool.defaultAction",
                    format!("operator policy defaultAction deny ({scope} scope)"),
                ),
                Action::Escalate => p(
                    Verdict::Escalate,
                    "tool.defaultAction",
                    format!("operator policy defaultAction escalate ({scope} scope)"),
                ),
            };
        }
        let (mode, scope) = eff.get(|s| s.mode).unwrap_or((Mode::ApproveAll, "default"));
        let kind = input.tool.kind;
        match mode {
            Mode::ApproveAll => p(Verdict::Allow, fl.rule, fl.reason),
            Mode::ApproveReads if kind.is_non_mutating() => p(
                Verdict::Allow,
                "mode.approve-reads",
                format!("mode approve-reads ({scope} scope) approves {kind}"),
            ),
            Mode::ApproveReads => p(
                Verdict::Escalate,
                "mode.approve-reads",
                format!("mode approve-reads ({scope} scope) asks about {kind}"),
            ),
            Mode::DenyAll => p(
                Verdict::Deny,
                "mode.deny-all",
                format!("mode deny-all ({scope} scope) refuses every request"),
            ),
        }
    }
}

/// Names the option to answer with; an ALLOW that no one-time allow option can carry becomes
/// a DENY that says why.
fn finish(p: Pending, input: &DecisionInput) -> Decision {
    let mut d = Decision {
        verdict: p.verdict,
        option_id: None,
        reason: p.reason,
        rule: p.rule,
        end_turn: p.end_turn,
    };
    match p.verdict {
        Verdict::Escalate => {
            // Keep only the floor's named option (the supervision-keeping plan exit) so an
            // approver that says yes answers with it.
            d.option_id = p.explicit_option;
        }
        Verdict::Allow | Verdict::Deny => {
            let explicit = if p.verdict == Verdict::Allow {
                p.explicit_option.as_deref()
            } else {
                None
            };
            let answer = choose_option(p.verdict, explicit, &input.options, false);
            if p.verdict == Verdict::Allow && answer.effective != Verdict::Allow {
                d.verdict = Verdict::Deny;
                d.rule = "option.no-allow-once".to_string();
                d.reason = format!("{} — but {}", d.reason, answer.reason);
            }
            if let Outcome::Selected(id) = answer.outcome {
                d.option_id = Some(id);
            }
        }
    }
    if d.reason.trim().is_empty() {
        // Unreachable by construction; the contract requires a reason.
        d.reason = format!("rule {}", d.rule);
    }
    d
}
