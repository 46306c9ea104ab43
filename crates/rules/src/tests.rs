//! Table-driven tests: seed 000's rule table, seed 001's precedence and scopes, escalation
//! without an approver, and option choice for every adapter vocabulary in real-adapters.md.

use super::*;

const ROOT: &str = "/work/root";

fn fs() -> MemFs {
    MemFs::new()
        .dir("/work/root/src")
        .file("/work/root/src/lib.rs")
        .dir("/work/root-evil")
        .dir("/work/root/..notes")
        .dir("/etc")
        .symlink("/work/root/escape", "/etc")
        .symlink("/work/root/hop", "escape")
        .symlink("/work/root/dangling-out", "/nonexistent/x")
        .symlink("/work/root/loop", "loop")
}

fn boundary(owned: bool, allow_execute: bool, profile: Profile) -> Boundary {
    Boundary {
        root: ROOT.into(),
        owned,
        allow_execute,
        profile,
    }
}

fn input(tool: ToolCall, b: Boundary, options: &[(&str, &str)]) -> DecisionInput {
    DecisionInput {
        subject: Subject {
            principal: "alice".into(),
            agent: "codex".into(),
            verb: "implement".into(),
            groups: Vec::new(),
        },
        boundary: b,
        tool,
        options: options
            .iter()
            .map(|(id, kind)| OfferedOption::new(id, kind))
            .collect(),
    }
}

/// Claude 0.101 tool options, the common case.
const CLAUDE_101: &[(&str, &str)] = &[
    ("allow-once", "allow_once"),
    ("allow-with-updates", "allow_always"),
    ("reject", "reject_once"),
];

fn engine(toml: &str) -> Engine {
    match PolicyConfig::from_toml_str(toml).and_then(Engine::new) {
        Ok(e) => e,
        Err(e) => panic!("test policy does not parse: {e}"),
    }
}

fn default_engine() -> Engine {
    engine("")
}

const W: Profile = Profile::WorkspaceWrite;
const R: Profile = Profile::ReadOnly;

#[test]
fn seed_000_rule_table() {
    use Verdict::*;
    // (kind, locations, owned, allow_execute, profile, verdict, rule)
    type Row = (
        &'static str,
        &'static [&'static str],
        bool,
        bool,
        Profile,
        Verdict,
        &'static str,
    );
    let table: &[Row] = &[
        // read, search, think → allow, whatever the boundary
        ("read", &[], false, false, W, Allow, "floor.non-mutating"),
        ("search", &[], false, false, R, Allow, "floor.non-mutating"),
        ("think", &[], false, false, R, Allow, "floor.non-mutating"),
        (
            "read",
            &["/etc/passwd"],
            false,
            false,
            W,
            Allow,
            "floor.non-mutating",
        ),
        // edit, delete, move with locations → allow iff every path resolves inside the root
        (
            "edit",
            &["src/lib.rs"],
            false,
            false,
            W,
            Allow,
            "floor.change.inside-root",
        ),
        (
            "delete",
            &["/work/root/src/lib.rs"],
            false,
            false,
            W,
            Allow,
            "floor.change.inside-root",
        ),
        (
            "move",
            &["src/lib.rs", "src/new.rs"],
            false,
            false,
            W,
            Allow,
            "floor.change.inside-root",
        ),
        (
            "move",
            &["src/lib.rs", "../root-evil/x"],
            true,
            true,
            W,
            Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            &["/etc/passwd"],
            true,
            true,
            W,
            Deny,
            "floor.change.outside-root",
        ),
        // edit, delete, move without locations → allow only if the root is ours
        (
            "edit",
            &[],
            true,
            false,
            W,
            Allow,
            "floor.change.no-locations.owned-root",
        ),
        (
            "delete",
            &[],
            false,
            true,
            W,
            Deny,
            "floor.change.no-locations.foreign-root",
        ),
        (
            "move",
            &[],
            false,
            false,
            W,
            Deny,
            "floor.change.no-locations.foreign-root",
        ),
        // execute, fetch, other → allow only if owned, or allow_execute
        (
            "execute",
            &[],
            true,
            false,
            W,
            Allow,
            "floor.execute.owned-root",
        ),
        (
            "fetch",
            &[],
            false,
            true,
            W,
            Allow,
            "floor.execute.operator-allowed",
        ),
        (
            "other",
            &[],
            false,
            false,
            W,
            Deny,
            "floor.execute.foreign-root",
        ),
        (
            "execute",
            &[],
            false,
            false,
            W,
            Deny,
            "floor.execute.foreign-root",
        ),
        // any unknown kind is "other"
        (
            "launch_missiles",
            &[],
            false,
            false,
            W,
            Deny,
            "floor.execute.foreign-root",
        ),
        ("", &[], true, false, W, Allow, "floor.execute.owned-root"),
        // read-only profile denies edit, delete, move, execute, fetch whatever else says
        (
            "edit",
            &["src/lib.rs"],
            true,
            true,
            R,
            Deny,
            "floor.profile.read-only",
        ),
        (
            "delete",
            &[],
            true,
            true,
            R,
            Deny,
            "floor.profile.read-only",
        ),
        ("move", &[], true, true, R, Deny, "floor.profile.read-only"),
        (
            "execute",
            &[],
            true,
            true,
            R,
            Deny,
            "floor.profile.read-only",
        ),
        ("fetch", &[], true, true, R, Deny, "floor.profile.read-only"),
        ("other", &[], true, true, R, Deny, "floor.profile.read-only"),
    ];
    let e = default_engine();
    let f = fs();
    for (kind, locs, owned, allow_exec, profile, want, rule) in table {
        let tool = ToolCall::new(kind, "t").with_locations(locs.iter().copied());
        let d = e.decide(
            &input(tool, boundary(*owned, *allow_exec, *profile), CLAUDE_101),
            &f,
        );
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (*want, *rule),
            "{kind} {locs:?} owned={owned} allow_execute={allow_exec} {profile:?}: {}",
            d.reason
        );
        assert!(!d.reason.trim().is_empty());
        // The option named always fits the verdict and was offered.
        let want_option = if d.verdict == Allow {
            "allow-once"
        } else {
            "reject"
        };
        assert_eq!(d.option_id.as_deref(), Some(want_option), "{kind}");
    }
}

#[test]
fn adversarial_paths_are_judged_by_where_they_lead() {
    let e = default_engine();
    let f = fs();
    let cases: &[(&str, bool)] = &[
        ("src/../src/lib.rs", true),
        ("..notes/todo.md", true),
        ("new/dir/file.rs", true),
        ("../root-evil/x", false),
        ("/work/root-evil/x", false),
        ("../../etc/passwd", false),
        ("escape/passwd", false),
        ("hop/passwd", false),
        ("dangling-out", false),
        ("src/../../root/src/lib.rs", true),
        ("escape/../work/root/src/lib.rs", true),
    ];
    for (p, inside) in cases {
        let tool = ToolCall::new("edit", &format!("Edit {p}")).with_locations([*p]);
        let d = e.decide(&input(tool, boundary(true, true, W), CLAUDE_101), &f);
        assert_eq!(d.verdict == Verdict::Allow, *inside, "{p}: {}", d.reason);
    }
    // Errors fail closed.
    for p in ["", "loop/x", "src/a\0b"] {
        let tool = ToolCall::new("edit", "Edit").with_locations([p]);
        let d = e.decide(&input(tool, boundary(true, true, W), CLAUDE_101), &f);
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (Verdict::Deny, "floor.change.unresolvable"),
            "{p:?}"
        );
    }
    // A relative root cannot contain anything.
    let mut b = boundary(true, true, W);
    b.root = "work/root".into();
    let tool = ToolCall::new("edit", "Edit").with_locations(["src/lib.rs"]);
    assert_eq!(
        e.decide(&input(tool, b, CLAUDE_101), &f).verdict,
        Verdict::Deny
    );
}

#[test]
fn read_only_verbs_are_read_only_whatever_the_profile_says() {
    let e = default_engine();
    for verb in ["advise", "review", "REVIEW"] {
        let mut i = input(
            ToolCall::new("edit", "Edit").with_locations(["src/lib.rs"]),
            boundary(true, true, W),
            CLAUDE_101,
        );
        i.subject.verb = verb.into();
        let d = e.decide(&i, &fs());
        assert_eq!(d.rule, "floor.profile.read-only", "{verb}");
    }
}

#[test]
fn switch_mode_table_per_vocabulary() {
    // (vocabulary, offered options, expected verdict, expected option)
    type Row = (
        &'static str,
        &'static [(&'static str, &'static str)],
        Verdict,
        Option<&'static str>,
    );
    let rows: &[Row] = &[
        (
            "claude-0.101",
            &[
                ("exit-plan-clear-auto", "allow_always"),
                ("exit-plan-auto", "allow_always"),
                ("exit-plan-bypass", "allow_always"),
                ("exit-plan-default", "allow_once"),
                ("reject", "reject_once"),
            ],
            Verdict::Allow,
            Some("exit-plan-default"),
        ),
        (
            "claude-0.16",
            &[
                ("acceptEdits", "allow_always"),
                ("default", "allow_once"),
                ("plan", "reject_once"),
            ],
            Verdict::Allow,
            Some("default"),
        ),
        (
            "claude-0.23",
            &[
                ("bypassPermissions", "allow_always"),
                ("acceptEdits", "allow_always"),
                ("default", "allow_once"),
                ("plan", "reject_once"),
            ],
            Verdict::Allow,
            Some("default"),
        ),
        (
            "codex-2.6",
            &[
                ("implement_plan", "allow_once"),
                ("revise_plan", "reject_once"),
            ],
            Verdict::Allow,
            Some("implement_plan"),
        ),
        // Only elevated destinations: refuse, and name the refusal to answer with.
        (
            "claude-0.101 elevated only",
            &[
                ("exit-plan-accept-edits", "allow_always"),
                ("exit-plan-clear-bypass", "allow_always"),
                ("reject", "reject_once"),
            ],
            Verdict::Deny,
            Some("reject"),
        ),
        // An elevated id disguised as a one-time allow is still elevated.
        (
            "elevated as allow_once",
            &[
                ("exit-plan-auto", "allow_once"),
                ("bypassPermissions", "allow_once"),
                ("plan", "reject_once"),
            ],
            Verdict::Deny,
            Some("plan"),
        ),
        // Unknown ids are refused even when they sound safe.
        (
            "unknown",
            &[("exit-plan-manual", "allow_once"), ("stay", "reject_once")],
            Verdict::Deny,
            Some("stay"),
        ),
        // The safe id offered with an always-kind is not trusted.
        (
            "safe id, always kind",
            &[
                ("exit-plan-default", "allow_always"),
                ("reject", "reject_once"),
            ],
            Verdict::Deny,
            Some("reject"),
        ),
        ("nothing offered", &[], Verdict::Deny, None),
        // Claude 0.101 EnterPlanMode: entering plan mode lowers privilege; allowed once.
        (
            "claude-0.101 enter plan",
            &[("allow-once", "allow_once"), ("reject", "reject_once")],
            Verdict::Allow,
            Some("allow-once"),
        ),
        // The same, sorted reject-first (Claude's `defaultToNo`).
        (
            "claude-0.101 enter plan, reject first",
            &[("reject", "reject_once"), ("allow-once", "allow_once")],
            Verdict::Allow,
            Some("allow-once"),
        ),
        // The enter-plan id with an always kind is not trusted.
        (
            "enter plan, always kind",
            &[("allow-once", "allow_always"), ("reject", "reject_once")],
            Verdict::Deny,
            Some("reject"),
        ),
        // Beside plan-exit ids the generic one-time allow is not an enter-plan answer: the
        // request is not the one the table describes, and an elevated exit is on offer.
        (
            "enter-plan id beside elevated exits",
            &[
                ("exit-plan-auto", "allow_always"),
                ("exit-plan-bypass", "allow_always"),
                ("allow-once", "allow_once"),
                ("reject", "reject_once"),
            ],
            Verdict::Deny,
            Some("reject"),
        ),
        (
            "enter-plan id beside an elevated exit disguised as allow_once",
            &[
                ("allow-once", "allow_once"),
                ("exit-plan-accept-edits", "allow_once"),
                ("reject", "reject_once"),
            ],
            Verdict::Deny,
            Some("reject"),
        ),
        // Beside the supervision-keeping exit, that exit is the answer, not the generic id.
        (
            "enter-plan id beside exit-plan-default",
            &[
                ("allow-once", "allow_once"),
                ("exit-plan-default", "allow_once"),
                ("reject", "reject_once"),
            ],
            Verdict::Allow,
            Some("exit-plan-default"),
        ),
        // The older adapters' generic one-time allow (`allow`, claude 0.16/0.23) has no
        // documented switch_mode meaning: still refused.
        (
            "claude-0.16 generic allow on switch_mode",
            &[
                ("allow_always", "allow_always"),
                ("allow", "allow_once"),
                ("reject", "reject_once"),
            ],
            Verdict::Deny,
            Some("reject"),
        ),
        // Codex 2.6's one-time allow id is not an enter-plan answer either.
        (
            "codex-2.6 allow_once on switch_mode",
            &[("allow_once", "allow_once"), ("decline", "reject_once")],
            Verdict::Deny,
            Some("decline"),
        ),
    ];
    let e = default_engine();
    for (vocab, options, want, want_opt) in rows {
        for owned in [false, true] {
            let i = input(
                ToolCall::new("switch_mode", "Ready to code?"),
                boundary(owned, true, W),
                options,
            );
            let d = e.decide(&i, &fs());
            assert_eq!(d.verdict, *want, "{vocab} owned={owned}: {}", d.reason);
            assert_eq!(d.option_id.as_deref(), *want_opt, "{vocab}");
        }
    }
}

#[test]
fn switch_mode_table_covers_every_destination_named_in_the_seed() {
    use SwitchModeEffect::*;
    for (id, effect) in [
        ("exit-plan-default", KeepsSupervision),
        ("default", KeepsSupervision),
        ("implement_plan", KeepsSupervision),
        ("exit-plan-accept-edits", Elevated),
        ("exit-plan-auto", Elevated),
        ("exit-plan-bypass", Elevated),
        ("exit-plan-clear-auto", Elevated),
        ("exit-plan-clear-bypass", Elevated),
        ("exit-plan-clear-accept-edits", Elevated),
        ("acceptEdits", Elevated),
        ("bypassPermissions", Elevated),
        ("allow-once", EntersPlan),
        ("allow", Unknown),
        ("allow_once", Unknown),
        ("Allow-Once", Unknown),
        ("exit-plan-clear-something-new", Unknown),
        ("Default", Unknown),
        ("", Unknown),
    ] {
        assert_eq!(switch_mode_effect(id), effect, "{id}");
    }
}

#[test]
fn entering_plan_mode_is_allowed_once_and_says_so() {
    let e = default_engine();
    let enter: &[(&str, &str)] = &[("allow-once", "allow_once"), ("reject", "reject_once")];
    for owned in [false, true] {
        for profile in [W, R] {
            let i = input(
                ToolCall::new("switch_mode", "EnterPlanMode"),
                boundary(owned, false, profile),
                enter,
            );
            let d = e.decide(&i, &fs());
            assert_eq!(
                d.verdict,
                Verdict::Allow,
                "owned={owned} {profile:?}: {}",
                d.reason
            );
            assert_eq!(d.rule, "floor.switch_mode.enters-plan");
            assert_eq!(d.option_id.as_deref(), Some("allow-once"));
            assert!(d.reason.contains("enters plan mode"), "{}", d.reason);
        }
    }
    // The operator policy can still refuse it; it cannot be turned into anything else.
    let d = engine("[global]\nmode='deny-all'").decide(
        &input(
            ToolCall::new("switch_mode", "EnterPlanMode"),
            boundary(true, true, W),
            enter,
        ),
        &fs(),
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.option_id.as_deref(), Some("reject"));
    // A refusal beside plan-exit ids says why the generic id was not taken.
    let d = e.decide(
        &input(
            ToolCall::new("switch_mode", "Ready to code?"),
            boundary(true, true, W),
            &[
                ("exit-plan-auto", "allow_always"),
                ("allow-once", "allow_once"),
                ("reject", "reject_once"),
            ],
        ),
        &fs(),
    );
    assert_eq!(d.rule, "floor.switch_mode.no-safe-option");
    assert!(
        d.reason.contains("beside plan-exit options"),
        "{}",
        d.reason
    );
}

// ------------------------------------------------------------------ seed 001: operator policy

fn decide_with(e: &Engine, kind: &str, title: &str, raw: &str) -> Decision {
    let tool = ToolCall::new(kind, title)
        .with_raw_input(raw)
        .with_locations(if ["edit", "delete", "move"].contains(&kind) {
            vec!["src/lib.rs"]
        } else {
            vec![]
        });
    e.decide_with_approver(&input(tool, boundary(true, true, W), CLAUDE_101), &fs())
}

#[test]
fn seed_001_precedence() {
    use Verdict::*;
    // Each row: policy, then the expected verdict and rule for an `execute` titled "touch x".
    let rows: &[(&str, Verdict, &str)] = &[
        // autoDeny beats autoApprove, escalate, defaultAction and mode
        (
            "[global]\nauto_deny=['execute']\nauto_approve=['execute']\nescalate=['execute']\ndefault_action='approve'",
            Deny,
            "tool.autoDeny",
        ),
        // autoApprove beats escalate, defaultAction and mode
        (
            "[global]\nmode='deny-all'\nauto_approve=['touch']\nescalate=['execute']\ndefault_action='deny'",
            Allow,
            "tool.autoApprove",
        ),
        // escalate beats defaultAction and mode
        (
            "[global]\nmode='approve-all'\nescalate=['TOUCH X']\ndefault_action='approve'",
            Escalate,
            "tool.escalate",
        ),
        // defaultAction beats the mode
        (
            "[global]\nmode='approve-all'\ndefault_action='deny'",
            Deny,
            "tool.defaultAction",
        ),
        (
            "[global]\nmode='deny-all'\ndefault_action='approve'",
            Allow,
            "tool.defaultAction",
        ),
        (
            "[global]\nmode='deny-all'\ndefault_action='escalate'",
            Escalate,
            "tool.defaultAction",
        ),
        // unmatched lists fall through to the mode
        (
            "[global]\nmode='deny-all'\nauto_approve=['read']",
            Deny,
            "mode.deny-all",
        ),
        (
            "[global]\nmode='approve-reads'",
            Escalate,
            "mode.approve-reads",
        ),
        (
            "[global]\nmode='approve-all'",
            Allow,
            "floor.execute.owned-root",
        ),
        ("", Allow, "floor.execute.owned-root"),
    ];
    for (policy, want, rule) in rows {
        let d = decide_with(&engine(policy), "execute", "touch x", "");
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (*want, *rule),
            "{policy}: {}",
            d.reason
        );
        assert!(!d.reason.is_empty());
    }
}

#[test]
fn matchers_are_case_insensitive_on_kind_title_head_title_and_raw_tool_name() {
    let claude_bash = (
        "execute",
        "`touch /work/root/x`",
        r#"{"command":"touch x"}"#,
    );
    let named = (
        "other",
        "Fetch the docs",
        r#"{"tool":"WebFetch","url":"x"}"#,
    );
    // (matcher, call, should match)
    let rows: &[(&str, (&str, &str, &str), bool)] = &[
        ("EXECUTE", claude_bash, true),
        ("Touch", claude_bash, true),
        ("`touch /work/root/x`", claude_bash, true),
        ("touch /work/root/x", claude_bash, false),
        ("webfetch", named, true),
        ("fetch", named, true), // the title head
        ("OTHER", named, true),
        ("docs", named, false),
        ("fetch the docs", named, true),
        ("read", claude_bash, false),
    ];
    for (m, (kind, title, raw), hit) in rows {
        let e = engine(&format!("[global]\nauto_deny=[{m:?}]"));
        let d = decide_with(&e, kind, title, raw);
        assert_eq!(
            d.rule == "tool.autoDeny",
            *hit,
            "{m} vs {title}: {}",
            d.reason
        );
    }
    // The unknown kind spelled by the agent also matches verbatim.
    let e = engine("[global]\nauto_deny=['Launch_Missiles']");
    assert_eq!(
        decide_with(&e, "launch_missiles", "x", "").rule,
        "tool.autoDeny"
    );
}

#[test]
fn approve_reads_passes_reads_and_escalates_the_rest() {
    let e = engine("[global]\nmode='approve-reads'");
    for (kind, want) in [
        ("read", Verdict::Allow),
        ("search", Verdict::Allow),
        ("think", Verdict::Allow),
        ("edit", Verdict::Escalate),
        ("execute", Verdict::Escalate),
        ("fetch", Verdict::Escalate),
    ] {
        let d = decide_with(&e, kind, "t", "");
        assert_eq!(d.verdict, want, "{kind}: {}", d.reason);
    }
}

#[test]
fn the_operator_policy_cannot_loosen_the_floor() {
    for policy in [
        "",
        "[global]\nmode='approve-all'",
        "[global]\nauto_approve=['edit','Edit','execute']",
        "[global]\ndefault_action='approve'",
        "[principals.alice]\nauto_approve=['edit']",
    ] {
        let e = engine(policy);
        let tool = ToolCall::new("edit", "Edit").with_locations(["../root-evil/x"]);
        let d = e.decide(&input(tool, boundary(true, true, W), CLAUDE_101), &fs());
        assert_eq!(d.rule, "floor.change.outside-root", "{policy}");
        let d = e.decide(
            &input(
                ToolCall::new("execute", "rm -rf"),
                boundary(false, false, W),
                CLAUDE_101,
            ),
            &fs(),
        );
        assert_eq!(d.rule, "floor.execute.foreign-root", "{policy}");
        let d = e.decide(
            &input(
                ToolCall::new("switch_mode", "Ready?"),
                boundary(true, true, W),
                &[
                    ("exit-plan-bypass", "allow_always"),
                    ("reject", "reject_once"),
                ],
            ),
            &fs(),
        );
        assert_eq!(d.verdict, Verdict::Deny, "{policy}");
    }
}

#[test]
fn the_most_specific_scope_that_sets_a_key_wins() {
    let e = engine(
        "[global]\nmode='deny-all'\nauto_deny=['fetch']\n\
         [agents.codex]\nmode='approve-reads'\n\
         [principals.alice]\nmode='approve-all'\n\
         [principals.bob]\nauto_deny=[]\n",
    );
    let mk = |principal: &str, agent: &str, kind: &str| {
        let mut i = input(
            ToolCall::new(kind, "t"),
            boundary(true, true, W),
            CLAUDE_101,
        );
        i.subject.principal = principal.into();
        i.subject.agent = agent.into();
        e.decide_with_approver(&i, &fs())
    };
    // alice's mode wins over the agent's and global
    assert_eq!(mk("alice", "codex", "execute").verdict, Verdict::Allow);
    // alice sets no auto_deny: the global one still applies
    assert_eq!(mk("alice", "codex", "fetch").rule, "tool.autoDeny");
    // carol has no scope: codex's mode applies
    assert_eq!(mk("carol", "codex", "execute").verdict, Verdict::Escalate);
    // neither scope: global
    assert_eq!(mk("carol", "claude", "read").rule, "mode.deny-all");
    // bob sets an empty auto_deny: it replaces the global list
    assert_eq!(mk("bob", "claude", "fetch").rule, "mode.deny-all");
}

#[test]
fn a_group_scope_decides_for_its_members_below_the_principal_and_above_the_agent() {
    let e = engine(
        "[global]\nmode='approve-all'\n\
         [agents.codex]\nmode='approve-all'\n\
         [groups.interns]\nauto_deny=['edit']\nmode='approve-reads'\n\
         [groups.oncall]\nauto_approve=['execute']\n\
         [groups.zeta]\nauto_deny=['execute']\n\
         [principals.alice]\nmode='approve-all'\n",
    );
    let mk = |principal: &str, groups: &[&str], kind: &str| {
        let mut i = input(
            ToolCall::new(kind, "t"),
            boundary(true, true, W),
            CLAUDE_101,
        );
        i.subject.principal = principal.into();
        i.subject.groups = groups.iter().map(|g| g.to_string()).collect();
        e.decide_with_approver(&i, &fs())
    };
    // A member of interns: its autoDeny and its mode, over the agent's.
    let d = mk("carol", &["interns"], "edit");
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Deny, "tool.autoDeny")
    );
    assert_eq!(
        mk("carol", &["interns"], "execute").verdict,
        Verdict::Escalate
    );
    // The same principal without the group (another credential): the agent's scope.
    assert_eq!(mk("carol", &[], "edit").verdict, Verdict::Allow);
    assert_eq!(mk("carol", &["others"], "execute").verdict, Verdict::Allow);
    // The principal's own scope is more specific than its groups' for the keys it sets (mode),
    // and the group's still apply for the keys it does not (autoDeny).
    assert_eq!(mk("alice", &["interns"], "execute").verdict, Verdict::Allow);
    assert_eq!(mk("alice", &["interns"], "edit").rule, "tool.autoDeny");
    // Several groups: each key from the first by group name (oncall's autoApprove before
    // zeta's autoDeny; autoDeny is consulted first, and zeta is the only group setting it).
    let d = mk("dave", &["zeta", "oncall"], "execute");
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Deny, "tool.autoDeny")
    );
    // A group name matches exactly: case and prefix matter.
    assert_eq!(mk("carol", &["Interns"], "edit").verdict, Verdict::Allow);
    assert_eq!(mk("carol", &["intern"], "edit").verdict, Verdict::Allow);
}

#[test]
fn a_group_scope_needs_a_name_and_non_empty_matchers() {
    assert_eq!(
        PolicyConfig::from_toml_str("[groups.\"\"]\nmode='deny-all'").unwrap_err(),
        PolicyError::EmptyScopeName { scope: "groups" }
    );
    assert!(matches!(
        PolicyConfig::from_toml_str("[groups.ops]\nauto_deny=['']").unwrap_err(),
        PolicyError::EmptyMatcher { .. }
    ));
}

#[test]
fn escalation_without_an_approver() {
    let deny = engine("[global]\nmode='approve-reads'");
    let i = input(
        ToolCall::new("execute", "make"),
        boundary(true, true, W),
        CLAUDE_101,
    );
    let d = deny.decide(&i, &fs());
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.rule, "escalation.no-approver");
    assert!(
        d.reason.starts_with("escalated: no approver"),
        "{}",
        d.reason
    );
    assert_eq!(d.end_turn, None);
    assert_eq!(d.option_id.as_deref(), Some("reject"));

    let fail = engine("[global]\nmode='approve-reads'\nnon_interactive='fail'");
    let d = fail.decide(&i, &fs());
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.rule, "escalation.prompt-unavailable");
    assert!(
        d.reason.starts_with("PERMISSION_PROMPT_UNAVAILABLE"),
        "{}",
        d.reason
    );
    assert_eq!(
        d.end_turn,
        Some(crate::EndTurnReason::PermissionPromptUnavailable)
    );

    // With an approver the escalation is kept.
    assert_eq!(
        fail.decide_with_approver(&i, &fs()).verdict,
        Verdict::Escalate
    );
}

#[test]
fn an_escalated_plan_exit_keeps_the_safe_option_for_the_approver() {
    let e = engine("[global]\nmode='approve-reads'");
    let i = input(
        ToolCall::new("switch_mode", "Ready?"),
        boundary(true, true, W),
        &[
            ("exit-plan-auto", "allow_always"),
            ("exit-plan-default", "allow_once"),
            ("reject", "reject_once"),
        ],
    );
    let d = e.decide_with_approver(&i, &fs());
    assert_eq!(d.verdict, Verdict::Escalate);
    assert_eq!(d.option_id.as_deref(), Some("exit-plan-default"));
}

#[test]
fn an_allow_with_only_an_always_option_becomes_a_deny_that_says_why() {
    let e = default_engine();
    let i = input(
        ToolCall::new("read", "Read x"),
        boundary(true, true, W),
        &[
            ("approved-for-session", "allow_always"),
            ("abort", "reject_once"),
        ],
    );
    let d = e.decide(&i, &fs());
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.rule, "option.no-allow-once");
    assert!(d.reason.contains("always-allow"), "{}", d.reason);
    assert_eq!(d.option_id.as_deref(), Some("abort"));
}

// ------------------------------------------------------------------ option choice

/// (vocabulary, options offered, chosen for Allow, chosen for Deny)
type VocabRow = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Outcome,
    Outcome,
);

fn sel(id: &str) -> Outcome {
    Outcome::Selected(id.to_string())
}

fn vocabularies() -> Vec<VocabRow> {
    vec![
        (
            "claude-0.16 tool",
            &[
                ("allow_always", "allow_always"),
                ("allow", "allow_once"),
                ("reject", "reject_once"),
            ],
            sel("allow"),
            sel("reject"),
        ),
        (
            "claude-0.101 write",
            &[
                ("allow-once", "allow_once"),
                ("allow-with-updates", "allow_always"),
                ("reject", "reject_once"),
            ],
            sel("allow-once"),
            sel("reject"),
        ),
        (
            "claude-0.101 bash, reject first (defaultToNo)",
            &[("reject", "reject_once"), ("allow-once", "allow_once")],
            sel("allow-once"),
            sel("reject"),
        ),
        (
            "claude-0.101 skill",
            &[
                ("allow-skill-exact", "allow_always"),
                ("allow-skill-prefix", "allow_always"),
                ("reject", "reject_once"),
            ],
            sel("reject"), // only always-allows: refused
            sel("reject"),
        ),
        (
            "codex-0.16 exec",
            &[
                ("approved", "allow_once"),
                ("approved-execpolicy-amendment", "allow_always"),
                ("abort", "reject_once"),
            ],
            sel("approved"),
            sel("abort"),
        ),
        (
            "codex-0.16 exec with denied",
            &[
                ("approved", "allow_once"),
                ("approved-for-session", "allow_always"),
                ("abort", "reject_once"),
                ("denied", "reject_once"),
            ],
            sel("approved"),
            sel("denied"),
        ),
        (
            "codex-0.16 patch",
            &[
                ("approved-for-session", "allow_always"),
                ("approved", "allow_once"),
                ("abort", "reject_once"),
            ],
            sel("approved"),
            sel("abort"),
        ),
        (
            "codex-0.16 mcp",
            &[
                ("approved", "allow_once"),
                ("approved-for-session", "allow_always"),
                ("approved-always", "allow_always"),
                ("cancel", "reject_once"),
            ],
            sel("approved"),
            sel("cancel"),
        ),
        (
            "codex-2.6 command",
            &[
                ("allow_once", "allow_once"),
                ("allow_for_session", "allow_always"),
                ("accept_execpolicy_amendment", "allow_always"),
                ("cancel", "reject_once"),
                ("decline", "reject_once"),
            ],
            sel("allow_once"),
            sel("decline"),
        ),
        (
            "codex-2.6 file change (no decline)",
            &[
                ("allow_once", "allow_once"),
                ("allow_for_session", "allow_always"),
                ("cancel", "reject_once"),
            ],
            sel("allow_once"),
            sel("cancel"),
        ),
        (
            "codex-2.6 network",
            &[
                ("allow_once", "allow_once"),
                ("apply_network_policy_amendment:0", "allow_always"),
                ("apply_network_policy_amendment:1", "reject_always"),
                ("cancel", "reject_once"),
            ],
            sel("allow_once"),
            sel("cancel"),
        ),
        (
            "codex-2.6 permission profile",
            &[
                ("allow_permissions_turn", "allow_once"),
                ("allow_permissions_session", "allow_always"),
                ("reject_permissions", "reject_once"),
            ],
            sel("allow_permissions_turn"),
            sel("reject_permissions"),
        ),
        (
            "only reject_always",
            &[
                ("allow_once", "allow_once"),
                ("no-forever", "reject_always"),
            ],
            sel("allow_once"),
            sel("no-forever"),
        ),
        (
            "unknown kinds are never selected",
            &[("yolo", "allow_maybe"), ("nope", "REJECT_ONCE")],
            Outcome::CancelTurn,
            Outcome::CancelTurn,
        ),
        (
            "nothing offered",
            &[],
            Outcome::CancelTurn,
            Outcome::CancelTurn,
        ),
    ]
}

#[test]
fn option_choice_for_every_vocabulary() {
    for (vocab, offered, allow, deny) in vocabularies() {
        let offered: Vec<OfferedOption> = offered
            .iter()
            .map(|(id, k)| OfferedOption::new(id, k))
            .collect();
        let a = choose_option(Verdict::Allow, None, &offered, false);
        assert_eq!(a.outcome, allow, "{vocab} allow: {}", a.reason);
        let d = choose_option(Verdict::Deny, None, &offered, false);
        assert_eq!(d.outcome, deny, "{vocab} deny: {}", d.reason);
        assert_eq!(d.effective, Verdict::Deny);
        // An escalation nobody answered is a denial.
        assert_eq!(
            choose_option(Verdict::Escalate, None, &offered, false).outcome,
            deny
        );
        // Cancelling always answers cancelled.
        assert_eq!(
            choose_option(Verdict::Allow, None, &offered, true).outcome,
            Outcome::Cancelled
        );
        for ans in [&a, &d] {
            assert!(!ans.reason.is_empty());
            if let Outcome::Selected(id) = &ans.outcome {
                let o = offered.iter().find(|o| &o.id == id);
                assert!(o.is_some(), "{vocab}: invented {id}");
                assert!(
                    o.is_some_and(|o| o.kind != OptionKind::AllowAlways
                        && !matches!(o.kind, OptionKind::Unknown(_))),
                    "{vocab}: picked {id}"
                );
            }
            if ans.outcome != sel("allow") && ans.effective == Verdict::Allow {
                assert!(matches!(ans.outcome, Outcome::Selected(_)));
            }
        }
    }
}

#[test]
fn an_explicit_option_is_used_only_when_offered_and_fitting() {
    let offered: Vec<OfferedOption> = [
        ("approved", "allow_once"),
        ("approved-for-session", "allow_always"),
        ("abort", "reject_once"),
        ("denied", "reject_once"),
    ]
    .iter()
    .map(|(id, k)| OfferedOption::new(id, k))
    .collect();
    let c = |v, id| choose_option(v, Some(id), &offered, false);
    assert_eq!(c(Verdict::Deny, "abort").outcome, sel("abort"));
    assert_eq!(c(Verdict::Allow, "approved").outcome, sel("approved"));
    // Not offered: ignored, and said so.
    let a = c(Verdict::Allow, "allow-once");
    assert_eq!(a.outcome, sel("approved"));
    assert!(a.reason.contains("not offered"), "{}", a.reason);
    // Offered but always-allow: never.
    assert_eq!(
        c(Verdict::Allow, "approved-for-session").outcome,
        sel("approved")
    );
    // An allow named for a deny: ignored.
    assert_eq!(c(Verdict::Deny, "approved").outcome, sel("denied"));
    assert_eq!(
        choose_option(Verdict::Deny, Some("approved"), &offered, false).effective,
        Verdict::Deny
    );
}

// ------------------------------------------------------------------ configuration

#[test]
fn policy_toml_is_strict_and_names_the_bad_key() {
    let ok = PolicyConfig::from_toml_str(
        "[global]\nmode='approve-reads'\nnon_interactive='fail'\nautoApprove=['read']\n\
         autoDeny=['fetch']\ndefaultAction='escalate'\n[agents.codex]\nescalate=['execute']\n",
    );
    assert!(ok.is_ok(), "{ok:?}");
    for (bad, needle) in [
        ("[global]\nmode='yolo'", "mode"),
        ("[global]\nauto_aprove=['x']", "auto_aprove"),
        ("[globl]\nmode='deny-all'", "globl"),
        ("[global]\nauto_deny=['']", "global.auto_deny[0]"),
        (
            "[principals.bob]\nescalate=['ok', ' ']",
            "principals.bob.escalate[1]",
        ),
        ("[global]\nnon_interactive='maybe'", "non_interactive"),
        ("[global]\ndefault_action='allow'", "default_action"),
        ("mode = 'deny-all'", "mode"),
    ] {
        match PolicyConfig::from_toml_str(bad) {
            Ok(c) => panic!("{bad:?} was accepted: {c:?}"),
            Err(e) => assert!(e.to_string().contains(needle), "{bad:?}: {e}"),
        }
    }
}

#[test]
fn tool_names_and_title_heads() {
    assert_eq!(title_head("`touch /x`"), Some("touch"));
    assert_eq!(title_head("  Write /a/b"), Some("Write"));
    assert_eq!(title_head("``"), None);
    assert_eq!(title_head(""), None);
    assert_eq!(
        raw_input_tool_name(r#"{"toolName":"Bash"}"#).as_deref(),
        Some("Bash")
    );
    assert_eq!(
        raw_input_tool_name(r#"{"tool":1,"name":"x"}"#).as_deref(),
        Some("x")
    );
    assert_eq!(raw_input_tool_name("not json"), None);
    assert_eq!(raw_input_tool_name("[1,2]"), None);
}

// ------------------------------------------------------------------ issue 11: containment

/// `fs()` plus agent-control files in and around the root, symlinks that lead to them, and a
/// home with its agent configuration.
fn control_fs() -> MemFs {
    fs().dir("/work/root/.claude")
        .file("/work/root/.claude/settings.local.json")
        .dir("/work/root/.git/hooks")
        .file("/work/root/.git/config")
        .dir("/work/root/.claude-notes")
        .dir("/work/root/docs")
        .symlink("/work/root/settings-link", ".claude/settings.local.json")
        .symlink("/work/root/cfg", ".claude")
        .symlink("/work/root/hooks-link", ".git/hooks")
        .symlink("/work/root/.codex", "docs")
        .dir("/home/alice/.claude")
        .dir("/home/alice/project")
}

fn decide_floor(e: &Engine, tool: ToolCall, owned: bool, f: &MemFs) -> Decision {
    e.decide(&input(tool, boundary(owned, true, W), CLAUDE_101), f)
}

#[test]
fn agent_control_files_are_not_the_agents_to_change() {
    let e = default_engine();
    let f = control_fs();
    let denied = [
        ".claude",
        ".claude/settings.local.json",
        ".claude/settings.json",
        "/work/root/.claude/hooks/run.sh",
        "sub/dir/.claude/settings.json",
        ".codex/config.toml",
        ".gemini/settings.json",
        ".mcp.json",
        "pkg/.mcp.json",
        ".git",
        ".git/hooks/pre-commit",
        ".git/config",
        "src/../.claude/settings.json",
        // Resolution first, then the match: links inside the root that lead to control files.
        "settings-link",
        "cfg/settings.json",
        "hooks-link/post-checkout",
        // `.codex` is a link to `docs`: the agent would read `.codex/…`, so writing there is
        // changing its configuration wherever the link points.
        ".codex/config.toml",
        // Outside the root too: the named rule, not just "outside".
        "/home/alice/.claude/settings.json",
        "/root/.codex/rules/default.rules",
    ];
    for p in denied {
        for kind in ["edit", "delete", "move"] {
            for owned in [true, false] {
                let tool = ToolCall::new(kind, &format!("Write {p}")).with_locations([p]);
                let d = decide_floor(&e, tool, owned, &f);
                assert_eq!(
                    (d.verdict, d.rule.as_str()),
                    (Verdict::Deny, "floor.change.agent-control"),
                    "{kind} {p} (owned {owned}): {}",
                    d.reason
                );
                assert!(
                    d.reason.contains(p) && d.reason.contains("configuration or hooks"),
                    "{p}: the reason names the path and why: {}",
                    d.reason
                );
            }
        }
    }
    // Names that only look like them are ordinary files.
    for p in [
        ".claude-notes/todo.md",
        "..claude",
        "x.mcp.json",
        ".mcp.json.orig",
        "claude/settings.json",
        ".git/HEAD",
        ".git/objects/ab/cd",
        ".gitignore",
        "docs/config.toml",
    ] {
        let tool = ToolCall::new("edit", "Edit").with_locations([p]);
        let d = decide_floor(&e, tool, false, &f);
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (Verdict::Allow, "floor.change.inside-root"),
            "{p}: {}",
            d.reason
        );
    }
    // Reading them is not changing them.
    let tool = ToolCall::new("read", "Read").with_locations([".claude/settings.local.json"]);
    assert_eq!(decide_floor(&e, tool, false, &f).verdict, Verdict::Allow);
    // No operator policy can approve a change to them.
    let lax = engine("[global]\nauto_approve = [\"edit\"]\ndefault_action = \"approve\"\n");
    let tool = ToolCall::new("edit", "Edit").with_locations([".claude/settings.json"]);
    assert_eq!(
        decide_floor(&lax, tool, true, &f).rule,
        "floor.change.agent-control"
    );
}

#[test]
fn the_operator_adds_agent_control_paths_and_cannot_remove_the_built_in_ones() {
    let e = engine("[floor]\nagent_control_paths = [\"deploy/secrets\", \"**/Makefile\"]\n");
    let f = control_fs();
    for (p, rule) in [
        ("deploy/secrets/key.pem", "floor.change.agent-control"),
        ("deploy/secrets", "floor.change.agent-control"),
        ("src/Makefile", "floor.change.agent-control"),
        (".claude/settings.json", "floor.change.agent-control"),
        ("deploy/secrets-old", "floor.change.inside-root"),
        ("src/Makefile.am", "floor.change.inside-root"),
    ] {
        let tool = ToolCall::new("edit", "Edit").with_locations([p]);
        let d = decide_floor(&e, tool, true, &f);
        assert_eq!(d.rule, rule, "{p}: {}", d.reason);
        if rule == "floor.change.agent-control" && !p.starts_with(".claude") {
            assert!(d.reason.contains("operator"), "{}", d.reason);
        }
    }
    for (bad, names) in [
        (
            "[floor]\nagent_control_paths = [\"/etc/x\"]",
            "relative to the root",
        ),
        ("[floor]\nagent_control_paths = [\"a/../../x\"]", "`..`"),
        ("[floor]\nagent_control_paths = [\"\"]", "names nothing"),
        ("[floor]\nagent_control_paths = [\"**\"]", "every path"),
        ("[floor]\nallow = [\".claude\"]", "unknown field"),
    ] {
        match PolicyConfig::from_toml_str(bad) {
            Err(e) => assert!(e.to_string().contains(names), "{bad}: {e}"),
            Ok(_) => panic!("{bad} accepted"),
        }
    }
}

#[test]
fn the_floor_judges_the_paths_the_raw_input_names() {
    let e = default_engine();
    let f = control_fs();
    let patch = |body: &str| {
        serde_json::json!({
            "command": ["/bin/bash", "-lc", format!("apply_patch <<'EOF'\n*** Begin Patch\n{body}*** End Patch\nEOF\n")],
            "cwd": "/work/root/src",
        })
        .to_string()
    };
    // (kind, title, raw input, owned, verdict, rule)
    let cases: Vec<(&str, &str, String, bool, Verdict, &str)> = vec![
        // The hole: no locations, raw input aimed at /etc/passwd, owned root.
        (
            "edit",
            "Write /etc/passwd",
            r#"{"file_path":"/etc/passwd","content":"x"}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            "mcp__acp__Edit",
            r#"{"file_path":"../root-evil/x","old_string":"a","new_string":"b"}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            "MultiEdit",
            r#"{"file_path":"escape/shadow","edits":[]}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            "mcp__acp__NotebookEdit",
            r#"{"notebook_path":"/work/root-evil/n.ipynb","new_source":""}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            "Write",
            r#"{"file_path":".claude/settings.local.json","content":"{}"}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.agent-control",
        ),
        (
            "edit",
            "Write",
            r#"{"file_path":"/work/root/src/new.rs","content":"x"}"#.into(),
            true,
            Verdict::Allow,
            "floor.change.no-locations.owned-root",
        ),
        // Raw-input paths only tighten: a foreign root still wants locations.
        (
            "edit",
            "Write",
            r#"{"file_path":"/work/root/src/new.rs","content":"x"}"#.into(),
            false,
            Verdict::Deny,
            "floor.change.no-locations.foreign-root",
        ),
        // Codex 0.16 patch approval: the changes map, a rename's destination included.
        (
            "edit",
            "Edit /work/root/src/lib.rs",
            r#"{"changes":{"/work/root/src/lib.rs":{"update":{"unified_diff":"@@","move_path":"/etc/cron.d/x"}}}}"#.into(),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "edit",
            "Edit",
            r##"{"changes":{"/work/root/.git/hooks/pre-commit":{"add":{"content":"#!/bin/sh"}}}}"##.into(),
            true,
            Verdict::Deny,
            "floor.change.agent-control",
        ),
        // apply_patch headers, relative to the command's cwd.
        (
            "edit",
            "apply_patch",
            patch("*** Add File: ../../root-evil/x\n+x\n"),
            true,
            Verdict::Deny,
            "floor.change.outside-root",
        ),
        (
            "execute",
            "apply_patch",
            patch("*** Update File: lib.rs\n*** Move to: ../.mcp.json\n"),
            true,
            Verdict::Deny,
            "floor.change.agent-control",
        ),
        (
            "execute",
            "apply_patch",
            patch("*** Add File: new.rs\n+x\n*** Delete File: lib.rs\n"),
            true,
            Verdict::Allow,
            "floor.execute.owned-root",
        ),
        // A command runs only inside its root, even one warden created.
        (
            "execute",
            "touch /tmp/x",
            r#"{"command":["/bin/bash","-lc","touch x"],"cwd":"/tmp"}"#.into(),
            true,
            Verdict::Deny,
            "floor.execute.cwd-outside-root",
        ),
        (
            "execute",
            "ls",
            r#"{"cmd":"ls","workdir":"escape"}"#.into(),
            true,
            Verdict::Deny,
            "floor.execute.cwd-outside-root",
        ),
        (
            "execute",
            "ls",
            r#"{"command":"ls","cwd":"loop"}"#.into(),
            true,
            Verdict::Deny,
            "floor.execute.cwd-outside-root",
        ),
        (
            "execute",
            "touch x",
            r#"{"command":["/bin/bash","-lc","touch x"],"cwd":"/work/root/src"}"#.into(),
            true,
            Verdict::Allow,
            "floor.execute.owned-root",
        ),
        (
            "execute",
            "touch x",
            r#"{"command":"touch x","cwd":"/work/root"}"#.into(),
            false,
            Verdict::Deny,
            "floor.execute.foreign-root",
        ),
        // OpenCode's `external_directory` (kind `other`): judged by the places it names.
        (
            "other",
            "external_directory",
            r#"{"filepath":"/work/root-evil/x","parentDir":"/work/root-evil"}"#.into(),
            true,
            Verdict::Allow,
            "floor.other.reaches-outside-root",
        ),
        (
            "other",
            "external_directory",
            r#"{"command":"ls ../x","directories":["/work/root/src","/work/root-evil"],"patterns":["/work/root-evil/*"]}"#.into(),
            false,
            Verdict::Deny,
            "floor.execute.foreign-root",
        ),
        (
            "other",
            "external_directory",
            r#"{"filepath":"/work/root/src/lib.rs","parentDir":"/work/root/src"}"#.into(),
            true,
            Verdict::Allow,
            "floor.execute.owned-root",
        ),
        (
            "other",
            "external_directory",
            r#"{"directories":"/etc"}"#.into(),
            true,
            Verdict::Deny,
            "floor.input.malformed",
        ),
    ];
    for (kind, title, raw, owned, verdict, rule) in cases {
        let tool = ToolCall::new(kind, title).with_raw_input(&raw);
        let b = Boundary {
            allow_execute: false,
            ..boundary(owned, false, W)
        };
        let d = e.decide(&input(tool, b, CLAUDE_101), &f);
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (verdict, rule),
            "{kind} {title} {raw}: {}",
            d.reason
        );
    }
    // The deny says which path and why.
    let tool = ToolCall::new("execute", "ls").with_raw_input(r#"{"command":"ls","cwd":"/tmp"}"#);
    let d = decide_floor(&e, tool, true, &f);
    assert!(
        d.reason.contains("/tmp") && d.reason.contains("outside the root"),
        "{}",
        d.reason
    );
    // Raw-input paths are checked even beside locations that are fine.
    let tool = ToolCall::new("edit", "Write")
        .with_locations(["src/lib.rs"])
        .with_raw_input(r#"{"file_path":"/etc/passwd"}"#);
    assert_eq!(
        decide_floor(&e, tool, true, &f).rule,
        "floor.change.outside-root"
    );
}

#[test]
fn raw_input_that_is_not_json_denies_a_mutating_kind() {
    let e = default_engine();
    let f = control_fs();
    for kind in [
        "edit",
        "delete",
        "move",
        "execute",
        "fetch",
        "other",
        "frobnicate",
    ] {
        for raw in [
            "{\"file_path\": \"/etc/passwd\"",
            "file_path=/etc/passwd",
            r#"{"file_path":["/etc/passwd"]}"#,
            r#"{"cwd":7}"#,
        ] {
            let tool = ToolCall::new(kind, "x")
                .with_locations(["src/lib.rs"])
                .with_raw_input(raw);
            let d = decide_floor(&e, tool, true, &f);
            assert_eq!(
                (d.verdict, d.rule.as_str()),
                (Verdict::Deny, "floor.input.malformed"),
                "{kind} {raw}: {}",
                d.reason
            );
            assert!(d.reason.contains("raw input"), "{}", d.reason);
        }
        // Empty raw input stays as it was.
        let tool = ToolCall::new(kind, "x")
            .with_locations(["src/lib.rs"])
            .with_raw_input("  ");
        assert_eq!(
            decide_floor(&e, tool, true, &f).verdict,
            Verdict::Allow,
            "{kind}"
        );
    }
    // Kinds that change nothing are not held to it.
    for kind in ["read", "search", "think"] {
        let tool = ToolCall::new(kind, "x").with_raw_input("not json");
        assert_eq!(
            decide_floor(&e, tool, true, &f).verdict,
            Verdict::Allow,
            "{kind}"
        );
    }
}

#[test]
fn a_boundary_the_floor_cannot_trust_denies_everything() {
    let f = control_fs().file("/work/afile");
    let homes = AgentHomes::new(
        vec!["/home/alice".into(), "/root".into()],
        vec!["/home/alice/.claude".into()],
    );
    let e = default_engine().with_root_check(RootCheck::new(&homes, &f));
    for (root, why) in [
        ("work/root", "not an absolute path"),
        ("", "not an absolute path"),
        ("/work/nowhere", "does not exist"),
        ("/work/afile", "not a directory"),
        ("/", "the filesystem root"),
        ("/work/root/..", "/work"), // fine on its own: checked below as allowed
        ("/home/alice", "home directory /home/alice"),
        ("/home", "home directory /home/alice"),
        ("/home/alice/.claude", "agent configuration home"),
        ("/work/root/escape/..", "the filesystem root"),
    ] {
        for kind in ["edit", "execute", "read", "switch_mode"] {
            let mut b = boundary(true, true, W);
            b.root = root.into();
            let tool = ToolCall::new(kind, "x").with_locations(["/home/alice/project/x"]);
            let d = e.decide(&input(tool, b, CLAUDE_101), &f);
            if root == "/work/root/.." {
                assert_ne!(d.rule, "floor.boundary.invalid", "{root}: {}", d.reason);
                continue;
            }
            assert_eq!(
                (d.verdict, d.rule.as_str()),
                (Verdict::Deny, "floor.boundary.invalid"),
                "{kind} in {root:?}: {}",
                d.reason
            );
            assert!(d.reason.contains(why), "{root}: {}", d.reason);
        }
    }
    // A project under a home is a fine root.
    let mut b = boundary(false, false, W);
    b.root = "/home/alice/project".into();
    let tool = ToolCall::new("edit", "x").with_locations(["src/x"]);
    assert_eq!(
        e.decide(&input(tool, b, CLAUDE_101), &f).rule,
        "floor.change.inside-root"
    );
}
