//! The real Qwen Code under warden, offline: `@qwen-code/qwen-code` 0.24.4 (the built-in `qwen`,
//! its own ACP agent with `--acp`), installed by `.ci/run` under `<target>/npm/`, driven through
//! the real daemons by the scripted fake OpenAI server's Chat Completions
//! (`tests/fake_models/fake_openai.py`). It runs in its `default` approval mode (forced; its own
//! default, `auto`, lets a model classifier approve), asks for every edit and command, and
//! warden-policy decides each; its writes go through warden's `fs/write_text_file`.
//!
//! Missing installs fail under CI (`CI=true`) and are a printed skip elsewhere.

use warden_e2e::real::{self, Matrix, QWEN_CODE, Vocab};

mod real_support;
use real_support::WARM_IDLE;

fn qwen() -> Matrix {
    Matrix {
        pinned: QWEN_CODE,
        agent: "qwen",
        vocab: Vocab::Gemini,
        extra_sets: Vec::new(),
    }
}

/// A write inside the root is asked, ALLOWed and lands; the first turn reached nothing but the
/// fake model, through the egress proxy, every connection recorded under its conversation.
#[tokio::test]
async fn qwen_code_write_inside_is_allowed_and_lands_through_the_proxy_only() {
    let Some(r) = qwen().write_inside_lands_through_the_proxy_only().await else {
        return;
    };
    let log = r.model.log_text();
    assert!(
        log.contains("/chat/completions") && log.contains("run_shell_command"),
        "{log}"
    );
}

#[tokio::test]
async fn qwen_code_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    qwen().writes_outside_are_denied().await;
}

#[tokio::test]
async fn qwen_code_shell_writes_stay_in_the_sandbox() {
    qwen().shell_writes_stay_in_the_sandbox().await;
}

#[tokio::test]
async fn qwen_code_never_gets_an_always_answer() {
    qwen().always_is_never_chosen().await;
}

#[tokio::test]
async fn qwen_code_settings_written_by_the_model_change_nothing() {
    qwen().model_written_settings_change_nothing().await;
}

#[tokio::test]
async fn qwen_code_detached_children_die_with_cancel() {
    qwen().detached_children_die_with_cancel().await;
}

#[tokio::test]
async fn qwen_code_misconfigured_fails_with_its_stderr() {
    qwen().misconfigured_fails_with_its_stderr().await;
}

/// Qwen Code starts its session in `default` under warden (its own default is `auto`, a model
/// classifier approving): the supervisor has no mode to force, which it would log, and its
/// command is asked. (That Qwen Code reads warden's `/etc/qwen-code/settings.json` in the
/// sandbox was checked by writing `"approvalMode": "yolo"` there: this test then fails, the
/// supervisor forcing `default` over `yolo`.)
#[tokio::test]
async fn qwen_code_reads_wardens_settings() {
    let m = qwen();
    let Some(r) = m.start().await else { return };
    let evs = real::supervisor_turn(
        &r.d,
        "qwen",
        "qwen-settings-1",
        "t1",
        "",
        real::script(&[Vocab::Gemini.shell("echo x > {CWD}/x.txt")]),
    )
    .await;
    let asked = real::decisions(&evs);
    assert!(
        asked.iter().any(|p| p.tool_kind == "execute"),
        "{evs:#?}\n{}",
        r.model.answers()
    );
    let log = std::fs::read_to_string(r.d.log_file("supervisor")).unwrap_or_default();
    for l in log.lines().filter(|l| l.contains("mode")) {
        eprintln!("LOG {l}");
    }
    assert!(
        log.contains("agent=qwen") || log.contains("qwen"),
        "no supervisor log: {log}"
    );
    assert!(
        !log.contains("started outside its supervised mode"),
        "Qwen Code did not start in default: warden's settings were not read\n{log}"
    );
}

/// A `review` conversation runs Qwen Code in its `plan` mode: a write into the root does not
/// land without an ALLOW, and no command runs without being asked.
#[tokio::test]
async fn qwen_code_review_plans_and_stays_supervised() {
    real_support::review_plans_and_stays_supervised(&qwen(), "qwen-plan-1").await;
}

#[tokio::test]
async fn qwen_code_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    qwen()
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

/// The network is its model's API and nothing else: a command that opens sockets itself (and a
/// fetch the model asks for) reach nothing, and every connection allowed for the conversation
/// went to the fake model.
#[tokio::test]
async fn qwen_code_reaches_nothing_but_its_model() {
    real_support::reaches_nothing_but_its_model(
        &qwen(),
        r#"{"tool": "web_fetch", "args": {"url": "https://example.com/", "prompt": "Summarize it"}}"#,
    )
    .await;
}

/// Issue 35, finding 5: one allowed command wrote `~/.env` naming a system settings file of
/// the root's (YOLO, a hook) and that file; after the idle stop the restarted Qwen Code ran
/// commands unasked. Now every `.env` it reads is warden's (read-only, empty) or filtered,
/// and the variables naming its settings are set by warden over anything a file says.
#[tokio::test]
async fn qwen_code_planted_configuration_changes_nothing_after_an_idle_restart() {
    qwen()
        .planted_configuration_changes_nothing_after_an_idle_restart()
        .await;
}
