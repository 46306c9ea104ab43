//! The real Codex adapters under warden, offline: codex-acp 0.16.0 (`@zed-industries`, Codex
//! 0.137) and 2.6.0 (`@agentclientprotocol`, the built-in `codex`, Codex 0.166), installed by
//! `.ci/run` under `<target>/npm/`, driven through the real daemons by the scripted fake OpenAI
//! Responses server in `tests/fake_models/`. Codex's own sandbox is off (it cannot start inside
//! warden's); it asks for every command and edit, and warden-policy decides each.
//!
//! Missing installs fail under CI (`CI=true`) and are a printed skip elsewhere.

use std::path::Path;
use std::time::Duration;

use warden_e2e::real::{self, CODEX_ACP_016, CODEX_ACP_26, FakeModel, Matrix, Pinned, Vocab};

/// Codex 0.137 (codex-acp 0.16) is configured by the entry itself: `untrusted` with its
/// sandbox off (warden's built-in default is for the 2.6 adapter's Codex).
fn extra_sets(name: &str, p: Pinned) -> Vec<(String, String)> {
    let sup = |kv: String| ("supervisor".to_string(), kv);
    if p.spec != CODEX_ACP_016.spec {
        return Vec::new();
    }
    vec![
        sup(format!(
            "agents.{name}.codex_config={:?}",
            warden_sandbox::CODEX_CONFIG_UNTRUSTED
        )),
        sup(format!(
            "agents.{name}.codex_requirements={:?}",
            warden_sandbox::CODEX_REQUIREMENTS_UNTRUSTED
        )),
        // Under `untrusted` codex-acp 0.16 reports no modes: nothing to force.
        sup(format!("agents.{name}.supervised_mode=\"\"")),
    ]
}

fn sets_for(name: &str, p: Pinned, model: &FakeModel) -> Vec<(String, String)> {
    let mut sets = real::agent_sets(name, p, model);
    sets.extend(extra_sets(name, p));
    sets
}

/// Whether a command that writes must ask to leave Codex's own sandbox: Codex 0.16x runs
/// commands in its read-only (Landlock) sandbox and asks only for those it runs outside;
/// Codex 0.137 (`untrusted`, no sandbox of its own) asks for every command.
fn escalates(p: Pinned) -> bool {
    p.spec == CODEX_ACP_26.spec
}

async fn allow_inside_deny_outside(p: Pinned, agent: &str) {
    if real::installed(p).is_none() {
        return;
    }
    let d = real::deployment();
    let model = FakeModel::start(p.model, d.dir.path()).await;
    let d = real::deploy(d, sets_for(agent, p, &model)).await;
    let outside = format!("/etc/{}", real::unique("warden-codex-denied"));
    let script = format!(
        r#"SCRIPT {{"steps": [
        {{"patch": "*** Begin Patch\n*** Add File: {{CWD}}/hello.txt\n+hello from the fake model\n*** End Patch\n"}},
        {{"patch": "*** Begin Patch\n*** Add File: {outside}\n+x\n*** End Patch\n"}}
    ], "final": "done"}}"#
    );
    let sent = real::send(&d, agent, &script, &[], Duration::from_secs(180)).await;
    let ctx = format!("{}\n-- fake model --\n{}", sent.shown, model.answers());
    assert!(sent.shown.contains("[policy] ALLOW"), "{ctx}");
    assert!(sent.shown.contains("[policy] DENY"), "{ctx}");
    // Codex's only "no" ends its turn (`abort`): completed with a refusal, or cancelled by it.
    assert!(matches!(sent.code, Some(4) | Some(5)), "{ctx}");
    let written = real::find(&d.dir.path().join("supervisor"), "hello.txt");
    assert_eq!(written.len(), 1, "{written:?}\n{ctx}");
    assert_eq!(
        std::fs::read_to_string(&written[0]).unwrap(),
        "hello from the fake model\n"
    );
    assert!(!Path::new(&outside).exists());
}

#[tokio::test]
async fn codex_acp_016_patch_inside_allowed_and_outside_denied() {
    allow_inside_deny_outside(CODEX_ACP_016, "codex-016").await;
}

#[tokio::test]
async fn codex_acp_26_patch_inside_allowed_and_outside_denied() {
    allow_inside_deny_outside(CODEX_ACP_26, "codex").await;
}

async fn shell_write_inside_is_asked_and_allowed(p: Pinned, agent: &str) {
    if real::installed(p).is_none() {
        return;
    }
    let d = real::deployment();
    let model = FakeModel::start(p.model, d.dir.path()).await;
    let d = real::deploy(d, sets_for(agent, p, &model)).await;
    let script = format!(
        r#"SCRIPT {{"steps": [{{"shell": "echo shell-was-here > {{CWD}}/sh.txt", "escalate": {}}}], "final": "done"}}"#,
        escalates(p)
    );
    let sent = real::send(&d, agent, &script, &[], Duration::from_secs(180)).await;
    let ctx = format!("{}\n-- fake model --\n{}", sent.shown, model.answers());
    assert!(sent.shown.contains("[policy] ALLOW"), "{ctx}");
    let written = real::find(&d.dir.path().join("supervisor"), "sh.txt");
    assert_eq!(written.len(), 1, "{written:?}\n{ctx}");
    assert_eq!(
        std::fs::read_to_string(&written[0]).unwrap(),
        "shell-was-here\n"
    );
}

#[tokio::test]
async fn codex_acp_016_shell_write_inside_is_asked_and_allowed() {
    shell_write_inside_is_asked_and_allowed(CODEX_ACP_016, "codex-016").await;
}

#[tokio::test]
async fn codex_acp_26_shell_write_inside_is_asked_and_allowed() {
    shell_write_inside_is_asked_and_allowed(CODEX_ACP_26, "codex").await;
}

fn codex(p: Pinned, agent: &'static str) -> Matrix {
    Matrix {
        pinned: p,
        agent,
        vocab: Vocab::Codex {
            escalate: escalates(p),
        },
        extra_sets: extra_sets(agent, p),
    }
}

#[tokio::test]
async fn codex_acp_016_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    codex(CODEX_ACP_016, "codex-016")
        .writes_outside_are_denied()
        .await;
}

#[tokio::test]
async fn codex_acp_26_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    codex(CODEX_ACP_26, "codex")
        .writes_outside_are_denied()
        .await;
}

#[tokio::test]
async fn codex_acp_016_shell_writes_stay_in_the_sandbox() {
    codex(CODEX_ACP_016, "codex-016")
        .shell_writes_stay_in_the_sandbox()
        .await;
}

#[tokio::test]
async fn codex_acp_26_shell_writes_stay_in_the_sandbox() {
    codex(CODEX_ACP_26, "codex")
        .shell_writes_stay_in_the_sandbox()
        .await;
}

#[tokio::test]
async fn codex_acp_016_never_gets_an_always_answer() {
    codex(CODEX_ACP_016, "codex-016")
        .always_is_never_chosen()
        .await;
}

#[tokio::test]
async fn codex_acp_26_never_gets_an_always_answer() {
    codex(CODEX_ACP_26, "codex").always_is_never_chosen().await;
}

/// Codex 0.16x asks only for what leaves its own sandbox, and that sandbox cannot start inside
/// warden's: a command that does not ask never runs (nothing written, no permission request).
#[tokio::test]
async fn codex_acp_26_a_command_that_does_not_ask_never_runs() {
    let m = codex(CODEX_ACP_26, "codex");
    let Some(r) = m.start().await else { return };
    let quiet = Vocab::Codex { escalate: false };
    let sent = m
        .send(&r, &[quiet.shell("echo quiet > {CWD}/quiet.txt")])
        .await;
    let ctx = r.ctx(&sent);
    assert!(!sent.shown.contains("[policy]"), "it asked: {ctx}");
    assert!(r.in_state("quiet.txt").is_empty(), "{ctx}");
    // What Codex told the model: the command failed (its sandbox did not start).
    let outputs: Vec<String> = r
        .model
        .log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|v| v["input"].as_array().cloned().unwrap_or_default())
        .filter(|i| i["type"] == "custom_tool_call_output")
        .map(|i| i["output"].to_string())
        .collect();
    assert_eq!(outputs.len(), 1, "{ctx}");
    assert!(
        outputs[0].contains("exit_code") && !outputs[0].contains("exit_code\\\":0"),
        "{ctx}\n{outputs:?}"
    );
}

/// A misconfigured adapter: what it said on stderr is in the FAILED message (Codex 0.166
/// refuses the retired `untrusted`).
#[tokio::test]
async fn codex_acp_26_misconfigured_fails_with_its_stderr() {
    let mut m = codex(CODEX_ACP_26, "codex");
    m.extra_sets.push((
        "supervisor".into(),
        "agents.codex.codex_config=\"approval_policy = \\\"untrusted\\\"\"".into(),
    ));
    let Some(r) = m.start().await else { return };
    let sent = m.send(&r, &[]).await;
    assert_eq!(sent.code, Some(1), "{}", sent.shown);
    assert!(sent.shown.contains("[FAILED]"), "{}", sent.shown);
    assert!(
        sent.shown.contains("is no longer supported"),
        "{}",
        sent.shown
    );
}

/// An adapter that is not installed: the FAILED message says where it was looked for and the
/// command that installs it.
#[tokio::test]
async fn an_adapter_that_is_not_installed_says_how_to_install_it() {
    let mut m = codex(CODEX_ACP_26, "codex");
    m.extra_sets.push((
        "supervisor".into(),
        "agents.codex.adapter=\"@agentclientprotocol/codex-acp@0.0.1\"".into(),
    ));
    let Some(r) = m.start().await else { return };
    let sent = m.send(&r, &[]).await;
    assert_eq!(sent.code, Some(1), "{}", sent.shown);
    assert!(
        sent.shown.contains("not installed")
            && sent.shown.contains("npm install --prefix")
            && sent.shown.contains("codex-acp-0.0.1"),
        "{}",
        sent.shown
    );
}

#[tokio::test]
async fn codex_acp_016_settings_written_by_the_model_change_nothing() {
    codex(CODEX_ACP_016, "codex-016")
        .model_written_settings_change_nothing()
        .await;
}

#[tokio::test]
async fn codex_acp_26_settings_written_by_the_model_change_nothing() {
    codex(CODEX_ACP_26, "codex")
        .model_written_settings_change_nothing()
        .await;
}

#[tokio::test]
async fn codex_acp_016_detached_children_die_with_cancel() {
    codex(CODEX_ACP_016, "codex-016")
        .detached_children_die_with_cancel()
        .await;
}

#[tokio::test]
async fn codex_acp_26_detached_children_die_with_cancel() {
    codex(CODEX_ACP_26, "codex")
        .detached_children_die_with_cancel()
        .await;
}

/// A `review` conversation runs Codex 2.6 in its plan collaboration mode: the model is asked in
/// plan mode, its proposed plan comes to warden-policy as a permission request (Codex's plan
/// review), and after it the next turn's command is still asked.
#[tokio::test]
async fn codex_acp_26_review_plans_and_stays_supervised_after_the_plan() {
    let m = codex(CODEX_ACP_26, "codex");
    let Some(r) = m.start().await else { return };
    let ctx = "plan-review-1";
    let run = |id: &'static str, text: String| {
        real::supervisor_turn(&r.d, "codex", ctx, id, "review", text)
    };
    let decisions = |evs: &[warden_proto::v1::TurnEvent]| real::decisions(evs);
    let plan = real::script(&[]).replace(
        r#""final": "done""#,
        r#""final": "<proposed_plan>\n1. Read the code.\n2. Report.\n</proposed_plan>""#,
    );
    let first = run("t1", plan).await;
    let log = r.model.log_text();
    assert!(
        log.contains("Plan Mode") || log.contains("plan mode"),
        "the model was not asked in plan mode: {first:#?}"
    );
    let asked = decisions(&first);
    for p in &asked {
        eprintln!(
            "plan turn: {} {:?} -> {} ({})",
            p.tool_kind, p.tool_title, p.option_id_sent, p.rule
        );
    }
    assert!(
        asked.iter().any(|p| p.tool_kind == "switch_mode"),
        "the plan was not a permission request: {first:#?}"
    );
    // After the plan: a command is still a permission request.
    let cmd =
        real::script(&[Vocab::Codex { escalate: true }.shell("echo after > {CWD}/after.txt")]);
    let second = run("t2", cmd).await;
    assert!(
        decisions(&second).iter().any(|p| p.tool_kind == "execute"),
        "not asked after the plan: {second:#?}\n{}",
        r.model.answers()
    );
}

/// `warden doctor` says which installed adapter each built-in runs and where it was found, and
/// for one that is missing, the command that installs it.
#[tokio::test]
async fn doctor_names_the_installed_adapters_and_how_to_install_a_missing_one() {
    let mut m = codex(CODEX_ACP_26, "codex");
    m.extra_sets.push((
        "supervisor".into(),
        "agents.codex-later.adapter=\"@agentclientprotocol/codex-acp@0.0.1\"".into(),
    ));
    let Some(r) = m.start().await else { return };
    let state = r.d.dir.path().to_string_lossy().to_string();
    let mut cmd = tokio::process::Command::new(warden_e2e::binary("warden"));
    cmd.args(["--state-dir", &state, "doctor"])
        .stdin(std::process::Stdio::null());
    let out = warden_e2e::run_with_deadline(&mut cmd, Duration::from_secs(60))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    let line = |agent: &str| {
        shown
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{agent} ")))
            .unwrap_or_else(|| panic!("no line for {agent}: {shown}"))
            .to_string()
    };
    let codex = line("codex");
    assert!(
        codex.contains("@agentclientprotocol/codex-acp@2.6.0 at ")
            && codex.contains("codex-acp-2.6.0/node_modules"),
        "{shown}"
    );
    let later = line("codex-later");
    assert!(
        later.contains("MISSING") && later.contains("npm install --prefix"),
        "{shown}"
    );
}

#[tokio::test]
async fn codex_acp_016_misconfigured_node_fails_with_its_stderr() {
    codex(CODEX_ACP_016, "codex-016")
        .misconfigured_fails_with_its_stderr()
        .await;
}

#[tokio::test]
async fn codex_acp_26_misconfigured_node_fails_with_its_stderr() {
    codex(CODEX_ACP_26, "codex")
        .misconfigured_fails_with_its_stderr()
        .await;
}

/// How long a warm agent waits before it is taken in the warm tests: long enough for what an
/// adapter does on its own once started (telemetry, update checks, a model list).
const WARM_IDLE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn codex_acp_016_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    codex(CODEX_ACP_016, "codex-016")
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

#[tokio::test]
async fn codex_acp_26_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    codex(CODEX_ACP_26, "codex")
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, true)
        .await;
}

/// codex-acp 2.6.0 syncs Codex's curated plugins as it starts (see `real::agent_sets_quiet`)
/// unless its configuration says `[features] plugins = false`, as warden's does: with an
/// operator's `codex_config` that turns them back on, its warm agent is never handed out.
#[tokio::test]
async fn codex_acp_26_warm_that_connects_as_it_starts_is_not_handed_out() {
    let mut m = codex(CODEX_ACP_26, "codex");
    let config =
        warden_sandbox::CODEX_CONFIG_ON_REQUEST.replace("plugins = false", "plugins = true");
    m.extra_sets.push((
        "supervisor".into(),
        format!("agents.codex.codex_config={config:?}"),
    ));
    m.warm_agent_that_connects_is_not_handed_out(WARM_IDLE)
        .await;
}

/// What Codex (the built-in's adapter) reads at start, planted by one allowed command (its
/// `.env`, hooks, agent roles, rules, configuration, the login shell's start files, git's configuration),
/// then an idle stop and restart of the same conversation: every command is still asked.
#[tokio::test]
async fn codex_acp_26_planted_configuration_changes_nothing_after_an_idle_restart() {
    codex(CODEX_ACP_26, "codex")
        .planted_configuration_changes_nothing_after_an_idle_restart()
        .await;
}
