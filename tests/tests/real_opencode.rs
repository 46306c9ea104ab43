//! The real OpenCode under warden, offline: `opencode-ai` 1.18.33 (the built-in `opencode`, a
//! native executable, its own ACP agent with `acp`), installed by `.ci/run` under
//! `<target>/npm/`, driven through the real daemons by the scripted fake OpenAI server's Chat
//! Completions (`tests/fake_models/fake_openai.py`), which warden's managed configuration
//! (`/etc/opencode/opencode.json`) names as its only provider. Every edit and command is asked
//! and warden-policy decides each.
//!
//! Missing installs fail under CI (`CI=true`) and are a printed skip elsewhere.

use std::time::Duration;

use warden_e2e::real::{self, Matrix, OPENCODE, Vocab};

fn opencode() -> Matrix {
    Matrix {
        pinned: OPENCODE,
        agent: "opencode",
        vocab: Vocab::OpenCode,
        extra_sets: Vec::new(),
    }
}

/// A write inside the root is asked, ALLOWed and lands; the first turn reached nothing but the
/// fake model, through the egress proxy, every connection recorded under its conversation.
#[tokio::test]
async fn opencode_write_inside_is_allowed_and_lands_through_the_proxy_only() {
    let Some(r) = opencode().write_inside_lands_through_the_proxy_only().await else {
        return;
    };
    let log = r.model.log_text();
    assert!(
        log.contains("/chat/completions") && log.contains("\"bash\""),
        "{log}"
    );
}

#[tokio::test]
async fn opencode_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    opencode().writes_outside_are_denied().await;
}

#[tokio::test]
async fn opencode_shell_writes_stay_in_the_sandbox() {
    opencode().shell_writes_stay_in_the_sandbox().await;
}

#[tokio::test]
async fn opencode_never_gets_an_always_answer() {
    opencode().always_is_never_chosen().await;
}

#[tokio::test]
async fn opencode_settings_written_by_the_model_change_nothing() {
    opencode().model_written_settings_change_nothing().await;
}

#[tokio::test]
async fn opencode_detached_children_die_with_cancel() {
    opencode().detached_children_die_with_cancel().await;
}

/// How long a warm agent waits before it is taken: long enough for what an adapter does on its
/// own once started (telemetry, update checks, a model list).
const WARM_IDLE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn opencode_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    opencode()
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

/// The network is its model's API and nothing else: a command that opens sockets itself (and a
/// fetch the model asks for) reach nothing, and every connection allowed for the conversation
/// went to the fake model.
#[tokio::test]
async fn opencode_reaches_nothing_but_its_model() {
    let m = opencode();
    let Some(r) = m.start().await else { return };
    let steps = [
        r#"{"tool": "webfetch", "args": {"url": "https://example.com/", "format": "text"}}"#
            .to_string(),
        Vocab::OpenCode.shell(
            "(exec 3<>/dev/tcp/93.184.215.14/80 && echo reached) > {CWD}/net.txt 2>&1; \
             /usr/bin/python3 -c 'import urllib.request; urllib.request.urlopen(\"https://example.com\", timeout=5); print(\"reached\")' >> {CWD}/net.txt 2>&1; \
             echo done > {CWD}/net-done.txt",
        ),
    ];
    let sent = m.send(&r, &steps).await;
    let ctx = r.ctx(&sent);
    assert_eq!(
        r.in_state("net-done.txt").len(),
        1,
        "the command did not run: {ctx}"
    );
    for f in r.in_state("net.txt") {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(!text.contains("reached"), "{text}\n{ctx}");
    }
    let records = real::egress_records(&r.d);
    assert!(
        records
            .iter()
            .filter(|rec| rec["allowed"] == true)
            .all(|rec| rec["port"] == r.model.port),
        "{records:#?}\n{ctx}"
    );
    r.assert_model_reached_through_the_proxy(&ctx);
    assert!(!r.model.log_text().contains("Example Domain"), "{ctx}");
}
