//! The rows the real-adapter tests share beyond `warden_e2e::real::Matrix`'s: each a scenario
//! over one adapter's [`Matrix`], the adapter's own words (its fetch tool, its vocabulary) passed
//! in, the assertions the same for every adapter that runs it. A test file keeps its own tests
//! (one a row, named for its adapter) and what only its adapter does.
#![allow(dead_code)]

use std::time::Duration;

use warden_e2e::real::{self, Matrix, Running};
use warden_proto::v1::{self as pb, Verdict};

/// How long a warm agent waits before it is taken: long enough for what an adapter does on its
/// own once started (telemetry, update checks, a model list).
pub const WARM_IDLE: Duration = Duration::from_secs(5);

/// The network is its model's API and nothing else: a fetch the model asks for (`fetch`, in the
/// adapter's own tool) and a command that opens sockets itself reach nothing, and every
/// connection allowed for the conversation went to the fake model.
pub async fn reaches_nothing_but_its_model(m: &Matrix, fetch: &str) {
    let Some(r) = m.start().await else { return };
    let steps = [
        fetch.to_string(),
        m.vocab.shell(
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
    // What the model was told of its fetch: it did not get the page.
    assert!(!r.model.log_text().contains("Example Domain"), "{ctx}");
}

/// One `review` turn of `agent` in a new conversation `context` running `steps`: its events and
/// the permission decisions among them (each printed, for the reader of a failure).
pub async fn review_turn(
    r: &Running,
    agent: &str,
    context: &str,
    steps: &[String],
) -> (Vec<pb::TurnEvent>, Vec<pb::PermissionDecisionEvent>) {
    let evs =
        real::supervisor_turn(&r.d, agent, context, "t1", "review", real::script(steps)).await;
    let asked = real::decisions(&evs);
    for p in &asked {
        eprintln!(
            "plan turn: {} {:?} -> {} ({})",
            p.tool_kind, p.tool_title, p.option_id_sent, p.rule
        );
    }
    (evs, asked)
}

/// A `review` conversation runs the adapter in its plan mode: a write into the root does not
/// land without an ALLOW, no command runs without being asked, and the model was asked in plan
/// mode. Returns the running deployment for what only this adapter shows of it.
pub async fn review_plans_and_stays_supervised(m: &Matrix, context: &str) -> Option<Running> {
    let r = m.start().await?;
    let steps = [
        m.vocab.write("{CWD}/planned.txt", "written in plan mode"),
        m.vocab.shell("echo ran > {CWD}/ran.txt"),
    ];
    let (evs, asked) = review_turn(&r, m.agent, context, &steps).await;
    let answers = r.model.answers();
    let allowed = |kind: &str| {
        asked
            .iter()
            .any(|p| p.tool_kind == kind && p.verdict == Verdict::Allow as i32)
    };
    assert!(
        r.in_state("planned.txt").is_empty() || allowed("edit"),
        "{evs:#?}\n{answers}"
    );
    assert!(
        r.in_state("ran.txt").is_empty() || allowed("execute"),
        "{evs:#?}\n{answers}"
    );
    assert!(
        r.model.log_text().to_lowercase().contains("plan mode"),
        "the model was not asked in plan mode: {answers}"
    );
    Some(r)
}
