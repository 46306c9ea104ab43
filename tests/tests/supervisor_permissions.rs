//! Supervisor end to end, permissions: each option vocabulary of the scripted agent x allow /
//! deny / escalate-without-approver / policy down. The agent's own report says what it was
//! offered and what it got back, so "the right id, never an always option, never an invented
//! id" is checked on the agent's side of the wire.

mod supervisor_support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use supervisor_support::*;
use warden_proto::v1 as pb;

const VOCABS: [&str; 4] = ["claude-0.16", "claude-0.101", "codex-0.16", "codex-2.6"];
/// Option ids whose kind is allow_always in the scripted agent's vocabularies.
const ALWAYS: [&str; 5] = [
    "allow_always",
    "allow-with-updates",
    "approved-execpolicy-amendment",
    "allow_for_session",
    "accept_execpolicy_amendment",
];

/// The allow option each vocabulary must receive.
fn allow_id(v: &str) -> &'static str {
    match v {
        "claude-0.16" => "allow",
        "claude-0.101" => "allow-once",
        "codex-0.16" => "approved",
        _ => "allow_once",
    }
}

/// The refusal each vocabulary must receive for an execute (the turn-keeping one for Codex).
fn refuse_exec_id(v: &str) -> &'static str {
    match v {
        "claude-0.16" | "claude-0.101" => "reject",
        "codex-0.16" => "denied",
        _ => "decline",
    }
}

fn exec_turn(vocab: &str, ctx: &str, profile: pb::Profile) -> pb::RunTurnRequest {
    let text = scenario(json!({
        "vocabulary": vocab,
        "report": "perm.jsonl",
        "steps": [
            {"type": "tool", "kind": "execute", "command": "echo ran > ran.txt", "offer_decline": true},
            {"type": "message", "text": "after the tool"}
        ]
    }));
    let mut t = turn(ctx, "t1", &text);
    t.open = Some(open(ctx, profile));
    t
}

fn report(root: &Path) -> Vec<Value> {
    std::fs::read_to_string(root.join("perm.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Runs the execute turn for every vocabulary and checks the common properties; returns
/// (vocab, events, agent report, root).
async fn matrix(
    d: &warden_e2e::Deployment,
    profile: pb::Profile,
) -> Vec<(&'static str, Vec<pb::TurnEvent>, Vec<Value>, PathBuf)> {
    let mut c = client(d);
    let mut out = Vec::new();
    for v in VOCABS {
        let ctx = format!("m-{v}");
        let evs = run(&mut c, exec_turn(v, &ctx, profile)).await;
        let info = c
            .open_conversation(open(&ctx, profile))
            .await
            .unwrap()
            .into_inner();
        let root = PathBuf::from(info.root);
        let rep = report(&root);
        assert_eq!(
            rep.len(),
            1,
            "{v}: one permission request expected: {rep:?}"
        );
        let offered: Vec<String> = rep[0]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        let sent = rep[0]["answer"]["optionId"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            offered.contains(&sent),
            "{v}: invented id {sent:?} not in {offered:?}"
        );
        assert!(
            !ALWAYS.contains(&sent.as_str()),
            "{v}: an always option was sent: {sent}"
        );
        let p = permissions(&evs);
        assert_eq!(p.len(), 1, "{v}: {evs:#?}");
        assert_eq!(
            p[0].option_id_sent, sent,
            "{v}: the event names the option the agent got"
        );
        out.push((v, evs, rep, root));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_sends_the_one_time_allow_of_each_vocabulary() {
    let d = deploy(&[]).await;
    for (v, evs, rep, root) in matrix(&d, pb::Profile::WorkspaceWrite).await {
        assert_eq!(rep[0]["answer"]["optionId"], allow_id(v), "{v}");
        let s = stop(&evs);
        assert_eq!(s.stop_reason, "end_turn", "{v}");
        assert!(s.refusals.is_empty(), "{v}");
        assert_eq!(permissions(&evs)[0].verdict, pb::Verdict::Allow as i32);
        assert!(
            root.join("ran.txt").is_file(),
            "{v}: the allowed command did not run"
        );
    }
}

fn assert_refused(v: &str, evs: &[pb::TurnEvent], rep: &[Value], root: &Path, rule: &str) {
    assert_eq!(rep[0]["answer"]["optionId"], refuse_exec_id(v), "{v}");
    let s = stop(evs);
    assert_eq!(
        s.refusals.len(),
        1,
        "{v}: the refusal must reach the stop event: {s:?}"
    );
    let p = &permissions(evs)[0];
    assert_ne!(p.verdict, pb::Verdict::Allow as i32, "{v}");
    assert_eq!(s.refusals[0].decision_id, p.decision_id, "{v}");
    assert!(
        s.refusals[0].rule.contains(rule),
        "{v}: rule {:?} lacks {rule:?}",
        s.refusals[0].rule
    );
    assert!(!s.refusals[0].reason.is_empty());
    assert!(!root.join("ran.txt").exists(), "{v}: a refused command ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_sends_the_turn_keeping_refusal_of_each_vocabulary() {
    // The operator's policy denies every execute. (Not the read-only profile: under bubblewrap a
    // read-only root could not hold the agent's own report file this test reads.)
    let d = deploy(&[("policy", "policy.global.auto_deny=[\"execute\"]")]).await;
    for (v, evs, rep, root) in matrix(&d, pb::Profile::WorkspaceWrite).await {
        assert_refused(v, &evs, &rep, &root, "tool.autoDeny");
        assert_eq!(
            stop(&evs).stop_reason,
            "end_turn",
            "{v}: a turn-keeping refusal keeps the turn"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn escalation_without_an_approver_is_a_refusal() {
    let d = deploy(&[("policy", r#"policy.global.escalate=["execute"]"#)]).await;
    for (v, evs, rep, root) in matrix(&d, pb::Profile::WorkspaceWrite).await {
        assert_refused(v, &evs, &rep, &root, "escalation");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn escalation_with_non_interactive_fail_ends_the_turn_with_a_fault() {
    let d = deploy(&[
        ("policy", r#"policy.global.escalate=["execute"]"#),
        ("policy", r#"policy.global.non_interactive="fail""#),
    ])
    .await;
    let mut c = client(&d);
    let evs = run(
        &mut c,
        exec_turn("claude-0.101", "fail", pb::Profile::WorkspaceWrite),
    )
    .await;
    let s = stop(&evs);
    assert_eq!(s.stop_reason, "fault", "{evs:#?}");
    assert_eq!(
        s.fault.as_ref().unwrap().class,
        "permission-prompt-unavailable"
    );
    assert_eq!(s.refusals.len(), 1);
    let inc = incidents(&d);
    assert!(
        inc.iter()
            .any(|i| i["class"] == "permission-prompt-unavailable"),
        "{inc:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_down_fails_closed_for_every_vocabulary() {
    let d = deploy_without_policy(&[]).await;
    for (v, evs, rep, root) in matrix(&d, pb::Profile::WorkspaceWrite).await {
        assert_refused(v, &evs, &rep, &root, "policy_unavailable");
        assert!(
            stop(&evs).refusals[0].reason.contains("policy_unavailable"),
            "{v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn edit_refusal_without_decline_ends_the_codex_turn() {
    // Codex offers no turn-keeping refusal on file edits: `cancel` is the only one.
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = scenario(json!({"vocabulary": "codex-2.6", "report": "perm.jsonl",
        "steps": [{"type": "tool", "kind": "edit", "path": "x.txt", "content": "x"}]}));
    let mut t = turn("ed", "t1", &text);
    t.open = Some(open("ed", pb::Profile::ReadOnly));
    let evs = run(&mut c, t).await;
    let p = &permissions(&evs)[0];
    assert_eq!(p.option_id_sent, "cancel");
    assert_eq!(stop(&evs).refusals.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_exit_keeps_supervision_and_a_self_elevation_is_caught() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    for (v, want) in [
        ("claude-0.101", "exit-plan-default"),
        ("claude-0.16", "default"),
        ("codex-2.6", "implement_plan"),
    ] {
        let ctx = format!("plan-{v}");
        let text = scenario(json!({"vocabulary": v, "report": "perm.jsonl",
            "steps": [{"type": "plan_exit", "plan": "1. do it"}]}));
        let evs = run(&mut c, turn(&ctx, "t1", &text)).await;
        let p = permissions(&evs);
        assert_eq!(p.len(), 1, "{v}: {evs:#?}");
        assert_eq!(p[0].option_id_sent, want, "{v}: {:?}", p[0]);
        assert!(faults(&evs).is_empty(), "{v}: {evs:#?}");
    }
    // The agent elevates itself: caught, set back, reported.
    let text = scenario(
        json!({"steps": [{"type": "mode", "mode": "bypassPermissions"},
        {"type": "message", "text": "done"}]}),
    );
    let evs = run(&mut c, turn("elev", "t1", &text)).await;
    let f = faults(&evs);
    assert!(f.iter().any(|f| f.class == "mode-escalation"), "{evs:#?}");
    let restored = evs.iter().any(|e| matches!(&e.event,
        Some(pb::turn_event::Event::ModeChange(m)) if m.by_supervisor && m.mode_id == "default" && m.supervised));
    assert!(restored, "{evs:#?}");
    let info = c
        .open_conversation(open("elev", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.current_mode, "default");
    assert!(
        incidents(&d)
            .iter()
            .any(|i| i["class"] == "mode-escalation")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_and_config_option_escalations_are_each_caught() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = scenario(json!({"steps": [
        {"type": "mode", "mode": "acceptEdits"},
        {"type": "sleep", "ms": 200},
        {"type": "mode", "mode": "acceptEdits"},
        {"type": "sleep", "ms": 200},
        {"type": "update", "update": {"sessionUpdate": "config_option_update", "configOptions": [
            {"id": "mode", "name": "Mode", "category": "mode", "type": "select",
             "currentValue": "bypassPermissions", "options": []}]}},
        {"type": "sleep", "ms": 200},
        {"type": "message", "text": "done"}]}));
    let evs = run(&mut c, turn("twice", "t1", &text)).await;
    let f: Vec<_> = faults(&evs)
        .into_iter()
        .filter(|f| f.class == "mode-escalation")
        .collect();
    assert_eq!(f.len(), 3, "each escalation is caught once: {evs:#?}");
    let info = c
        .open_conversation(open("twice", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.current_mode, "default");
    assert_eq!(stop(&evs).stop_reason, "end_turn");
}
