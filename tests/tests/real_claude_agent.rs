//! The built-in `claude` for real, offline: `@agentclientprotocol/claude-agent-acp` 0.101.0
//! (installed by `.ci/run` under `<target>/npm/`, found there through `[adapters] dir`), driven
//! through the real daemons by the scripted fake Anthropic Messages server in
//! `tests/fake_models/`. Missing installs fail under CI (`CI=true`), a printed skip elsewhere.

use std::path::Path;
use std::time::Duration;

use warden_e2e::real::{self, CLAUDE_AGENT_ACP, CLAUDE_CODE_ACP, FakeModel, Matrix, Pinned, Vocab};

#[tokio::test]
async fn claude_agent_acp_writes_inside_when_allowed_and_nothing_outside_when_denied() {
    let p = CLAUDE_AGENT_ACP;
    if real::installed(p).is_none() {
        return;
    }
    let d = real::deployment();
    let model = FakeModel::start(p.model, d.dir.path()).await;
    let d = real::deploy(d, real::agent_sets("claude", p, &model)).await;
    let outside = format!("/etc/{}", real::unique("warden-claude-denied"));
    let script = format!(
        r#"SCRIPT {{"steps": [
        {{"tool": ["mcp__acp__Write", "Write"], "input": {{"file_path": "{{CWD}}/hello.txt", "content": "hello from the fake model\n"}}}},
        {{"tool": ["mcp__acp__Write", "Write"], "input": {{"file_path": "{outside}", "content": "x\n"}}}}
    ], "final": "done"}}"#
    );
    let sent = real::send(&d, "claude", &script, &[], Duration::from_secs(180)).await;
    let ctx = format!("{}\n-- fake model --\n{}", sent.shown, model.answers());
    assert!(sent.shown.contains("[policy] ALLOW"), "{ctx}");
    assert!(sent.shown.contains("[policy] DENY"), "{ctx}");
    assert_eq!(sent.code, Some(4), "{ctx}");
    let written = real::find(&d.dir.path().join("supervisor"), "hello.txt");
    assert_eq!(written.len(), 1, "{written:?}\n{ctx}");
    assert_eq!(
        std::fs::read_to_string(&written[0]).unwrap(),
        "hello from the fake model\n"
    );
    assert!(!Path::new(&outside).exists());
}

fn claude(p: Pinned, agent: &'static str) -> Matrix {
    // An entry of the operator's own (not the built-in `claude`) is given the built-in's
    // supervised modes: `default` forced, `plan` also asking.
    let extra_sets = if agent == "claude" {
        Vec::new()
    } else {
        vec![
            (
                "supervisor".to_string(),
                format!("agents.{agent}.supervised_mode=\"default\""),
            ),
            (
                "supervisor".to_string(),
                format!("agents.{agent}.supervised_modes=[\"plan\"]"),
            ),
        ]
    };
    Matrix {
        pinned: p,
        agent,
        vocab: Vocab::Claude,
        extra_sets,
    }
}

#[tokio::test]
async fn claude_agent_acp_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .writes_outside_are_denied()
        .await;
}

#[tokio::test]
async fn claude_agent_acp_shell_writes_stay_in_the_sandbox() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .shell_writes_stay_in_the_sandbox()
        .await;
}

#[tokio::test]
async fn claude_agent_acp_never_gets_an_always_answer() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .always_is_never_chosen()
        .await;
}

#[tokio::test]
async fn claude_code_acp_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .writes_outside_are_denied()
        .await;
}

#[tokio::test]
async fn claude_code_acp_shell_writes_stay_in_the_sandbox() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .shell_writes_stay_in_the_sandbox()
        .await;
}

#[tokio::test]
async fn claude_code_acp_never_gets_an_always_answer() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .always_is_never_chosen()
        .await;
}

#[tokio::test]
async fn claude_agent_acp_settings_written_by_the_model_change_nothing() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .model_written_settings_change_nothing()
        .await;
}

#[tokio::test]
async fn claude_code_acp_settings_written_by_the_model_change_nothing() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .model_written_settings_change_nothing()
        .await;
}

#[tokio::test]
async fn claude_agent_acp_detached_children_die_with_cancel() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .detached_children_die_with_cancel()
        .await;
}

#[tokio::test]
async fn claude_code_acp_detached_children_die_with_cancel() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .detached_children_die_with_cancel()
        .await;
}

/// A `review` conversation starts Claude in plan mode (`plan_config_option = "mode=plan"`);
/// leaving it (ExitPlanMode, decided by warden-policy) keeps supervision: the next command is
/// still asked.
async fn plan_exit_keeps_supervision(p: Pinned, agent: &'static str) {
    let mut m = claude(p, agent);
    m.extra_sets.push((
        "supervisor".into(),
        format!("agents.{agent}.plan_config_option=\"mode=plan\""),
    ));
    let Some(r) = m.start().await else { return };
    let steps = [
        r#"{"tool": ["ExitPlanMode"], "input": {"plan": "1. Write after.txt.\n2. Report."}}"#
            .to_string(),
        Vocab::Claude.shell("echo after > {CWD}/after.txt"),
    ];
    let evs =
        real::supervisor_turn(&r.d, agent, "plan-1", "t1", "review", real::script(&steps)).await;
    let asked = real::decisions(&evs);
    for d in &asked {
        eprintln!(
            "{agent}: {} {:?} -> {} ({})",
            d.tool_kind, d.tool_title, d.option_id_sent, d.rule
        );
    }
    let ctx = format!("{evs:#?}\n-- fake model --\n{}", r.model.answers());
    assert!(
        asked.iter().any(|d| d.tool_kind == "switch_mode"),
        "plan exit was not asked: {ctx}"
    );
    assert!(
        asked.iter().any(|d| d.tool_kind == "execute"),
        "the command after the plan was not asked: {ctx}"
    );
    // The conversation was put into plan mode for the review (the supervisor says so), and
    // whatever mode the agent announced after the plan (claude-code-acp 0.16.2 announces none)
    // keeps supervision.
    let log = std::fs::read_to_string(r.d.log_file("supervisor")).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("planning for the verb") && l.contains("plan")),
        "the supervisor did not put the agent into plan mode: {log}"
    );
    use warden_proto::v1::turn_event::Event;
    let modes: Vec<&warden_proto::v1::ModeChange> = evs
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::ModeChange(m)) => Some(m),
            _ => None,
        })
        .collect();
    assert!(
        modes.iter().all(|m| m.supervised || m.by_supervisor),
        "{modes:?}"
    );
}

#[tokio::test]
async fn claude_agent_acp_plan_exit_keeps_supervision() {
    plan_exit_keeps_supervision(CLAUDE_AGENT_ACP, "claude").await;
}

/// claude-code-acp 0.16.2 has no config options: `mode=plan` goes through `session/set_mode`.
#[tokio::test]
async fn claude_code_acp_plan_exit_keeps_supervision() {
    plan_exit_keeps_supervision(CLAUDE_CODE_ACP, "claude-code").await;
}

#[tokio::test]
async fn claude_agent_acp_misconfigured_fails_with_its_stderr() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .misconfigured_fails_with_its_stderr()
        .await;
}

#[tokio::test]
async fn claude_code_acp_misconfigured_fails_with_its_stderr() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .misconfigured_fails_with_its_stderr()
        .await;
}

/// How long a warm agent waits before it is taken in the warm tests: long enough for what an
/// adapter does on its own once started (telemetry, update checks, a model list).
const WARM_IDLE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn claude_agent_acp_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

#[tokio::test]
async fn claude_code_acp_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, true)
        .await;
}

/// claude-code-acp 0.16.2 checks fast mode at api.anthropic.com as it starts (see
/// `real::agent_sets_quiet`): without `CLAUDE_CODE_DISABLE_FAST_MODE` its warm agent is never
/// handed out.
#[tokio::test]
async fn claude_code_acp_warm_that_connects_as_it_starts_is_not_handed_out() {
    claude(CLAUDE_CODE_ACP, "claude-code")
        .warm_agent_that_connects_is_not_handed_out(WARM_IDLE)
        .await;
}

/// What Claude Code (the built-in's adapter) reads at start, planted by one allowed command
/// (`~/.claude.json`'s MCP servers and allowed tools, subagents, skills, commands, settings,
/// the root's `.mcp.json`, shell and git start files), then an idle stop and restart of the
/// same conversation: every command is still asked.
#[tokio::test]
async fn claude_agent_acp_planted_configuration_changes_nothing_after_an_idle_restart() {
    claude(CLAUDE_AGENT_ACP, "claude")
        .planted_configuration_changes_nothing_after_an_idle_restart()
        .await;
}
