//! warden-acp against the real warden-scripted-agent process over pipes.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use warden_acp::*;

fn s(v: Value) -> String {
    v.to_string()
}

/// The agent started with no arguments, every permission answered with its allow-once option
/// unless `picks` says otherwise.
async fn start_allowing(picks: Vec<Pick>) -> Harness {
    start(
        &[],
        picks,
        Pick::Kind(PermissionOptionKind::AllowOnce),
        config(),
    )
    .await
}

/// How the agent's turn on `scenario` stopped.
async fn stop_of(h: &Harness, scenario: Value) -> StopReason {
    h.prompt(&s(scenario)).await.unwrap().stop_reason
}

// ---------------------------------------------------------------------------
// Done when: three permissions in three vocabularies, answered, full stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_permissions_three_vocabularies_full_event_stream() {
    let mut h = start_allowing(vec![]).await;
    let scenario = json!({"report": "perm.jsonl", "steps": [
        {"type": "message", "text": "Starting"},
        {"type": "thought", "text": "thinking"},
        {"type": "plan", "entries": [{"content": "write a", "priority": "high", "status": "pending"}]},
        {"type": "tool", "kind": "edit", "path": "a.txt", "content": "A\n", "vocabulary": "claude-0.16", "ask": true},
        {"type": "tool", "kind": "execute", "command": "echo run > b.txt", "vocabulary": "codex-2.6", "ask": true},
        {"type": "tool", "kind": "edit", "path": "c.txt", "content": "C\n", "vocabulary": "claude-0.101", "ask": true},
        {"type": "usage", "used": 10, "size": 100},
        {"type": "message", "text": "Done"}
    ]});
    let resp = h.prompt(&s(scenario)).await.unwrap();
    assert_eq!(resp.stop_reason, StopReason::EndTurn);
    let ev = h.drain();
    assert_eq!(
        kinds(&ev),
        vec![
            "agent_message_chunk",
            "agent_thought_chunk",
            "plan",
            // claude-0.16: tool_call before asking, in_progress, completed
            "tool_call",
            "tool_call_update",
            "tool_call_update",
            // codex-2.6: nothing before asking; tool_call(in_progress) after approval
            "tool_call",
            "tool_call_update",
            // claude-0.101
            "tool_call",
            "tool_call_update",
            "tool_call_update",
            "usage_update",
            "agent_message_chunk",
        ]
    );
    let seen = h.handler.seen.lock().unwrap().clone();
    let ids = |i: usize| {
        seen[i]
            .options
            .iter()
            .map(|o| o.option_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(0), ["allow_always", "allow", "reject"]);
    assert_eq!(
        ids(1),
        [
            "allow_once",
            "allow_for_session",
            "accept_execpolicy_amendment",
            "decline",
            "cancel"
        ]
    );
    assert_eq!(ids(2), ["allow-once", "allow-with-updates", "reject"]);
    let cwd = h.cwd();
    assert_eq!(std::fs::read_to_string(cwd.join("a.txt")).unwrap(), "A\n");
    assert_eq!(std::fs::read_to_string(cwd.join("b.txt")).unwrap(), "run\n");
    assert_eq!(std::fs::read_to_string(cwd.join("c.txt")).unwrap(), "C\n");
    let timings = h.client.permission_timings();
    assert_eq!(timings.len(), 3);
    assert!(
        timings
            .iter()
            .all(|t| matches!(t.answer, PermissionAnswer::Selected(_)))
    );
    let report = h.report_lines("perm.jsonl");
    assert_eq!(report.len(), 3);
    for (line, vocab) in report
        .iter()
        .zip(["claude-0.16", "codex-2.6", "claude-0.101"])
    {
        assert_eq!(line["vocabulary"], vocab);
        assert_eq!(line["reaction"], "ran");
        assert!(line["rtt_us"].as_u64().unwrap() > 0);
    }
    // No "always" rule was written since none was picked.
    assert!(!cwd.join(".claude").exists() && !cwd.join(".codex").exists());
}

// ---------------------------------------------------------------------------
// Every vocabulary, every answer kind.

struct Row {
    vocab: &'static str,
    kind: &'static str,
    pick: Pick,
    stop: Option<&'static str>, // None = the prompt fails with a JSON-RPC error
    ran: bool,
    after: bool,
    rule: Option<&'static str>,
}

fn row(
    vocab: &'static str,
    kind: &'static str,
    pick: Pick,
    stop: Option<&'static str>,
    ran: bool,
    after: bool,
    rule: Option<&'static str>,
) -> Row {
    Row {
        vocab,
        kind,
        pick,
        stop,
        ran,
        after,
        rule,
    }
}

fn id(s: &str) -> Pick {
    Pick::Id(s.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vocabulary_every_answer() {
    const CL: &str = ".claude/settings.local.json";
    const CX: &str = ".codex/rules/default.rules";
    let rows = vec![
        row(
            "claude-0.16",
            "edit",
            id("allow"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "claude-0.16",
            "edit",
            id("allow_always"),
            Some("end_turn"),
            true,
            true,
            Some(CL),
        ),
        row(
            "claude-0.16",
            "edit",
            id("reject"),
            Some("end_turn"),
            false,
            false,
            None,
        ),
        row(
            "claude-0.16",
            "edit",
            id("no-such-option"),
            Some("end_turn"),
            false,
            false,
            None,
        ),
        row(
            "claude-0.16",
            "execute",
            id("allow"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "claude-0.16",
            "execute",
            Pick::Cancelled,
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "claude-0.16",
            "execute",
            Pick::Error,
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "claude-0.101",
            "edit",
            id("allow-once"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "claude-0.101",
            "edit",
            id("allow-with-updates"),
            Some("end_turn"),
            true,
            true,
            Some(CL),
        ),
        row(
            "claude-0.101",
            "edit",
            id("reject"),
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "claude-0.101",
            "execute",
            id("no-such-option"),
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "claude-0.101",
            "execute",
            Pick::Cancelled,
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "claude-0.101",
            "execute",
            Pick::Error,
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "codex-0.16",
            "execute",
            id("approved"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "codex-0.16",
            "execute",
            id("approved-execpolicy-amendment"),
            Some("end_turn"),
            true,
            true,
            Some(CX),
        ),
        row(
            "codex-0.16",
            "execute",
            id("abort"),
            Some("cancelled"),
            false,
            false,
            None,
        ),
        row(
            "codex-0.16",
            "execute",
            id("no-such-option"),
            Some("cancelled"),
            false,
            false,
            None,
        ),
        row(
            "codex-0.16",
            "edit",
            id("approved"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "codex-0.16",
            "edit",
            Pick::Cancelled,
            Some("cancelled"),
            false,
            false,
            None,
        ),
        row("codex-0.16", "edit", Pick::Error, None, false, false, None),
        row(
            "codex-2.6",
            "execute",
            id("allow_once"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "codex-2.6",
            "execute",
            id("allow_for_session"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "codex-2.6",
            "execute",
            id("accept_execpolicy_amendment"),
            Some("end_turn"),
            true,
            true,
            Some(CX),
        ),
        row(
            "codex-2.6",
            "execute",
            id("decline"),
            Some("end_turn"),
            false,
            true,
            None,
        ),
        row(
            "codex-2.6",
            "execute",
            id("cancel"),
            Some("cancelled"),
            false,
            false,
            None,
        ),
        row(
            "codex-2.6",
            "edit",
            id("allow_once"),
            Some("end_turn"),
            true,
            true,
            None,
        ),
        row(
            "codex-2.6",
            "edit",
            id("decline"),
            Some("cancelled"),
            false,
            false,
            None,
        ),
        row(
            "codex-2.6",
            "edit",
            Pick::Error,
            Some("cancelled"),
            false,
            false,
            None,
        ),
    ];
    for r in rows {
        let what = format!("{} {} {:?}", r.vocab, r.kind, r.pick);
        let cfg = ClientConfig {
            enforce_offered_options: false,
            ..config()
        };
        let mut h = start(&[], vec![], r.pick.clone(), cfg).await;
        let tool = if r.kind == "edit" {
            json!({"type": "tool", "kind": "edit", "path": "out.txt", "content": "x\n", "ask": true})
        } else {
            json!({"type": "tool", "kind": "execute", "command": "touch out.txt", "ask": true})
        };
        let sc = json!({"vocabulary": r.vocab, "report": "perm.jsonl",
            "steps": [tool, {"type": "message", "text": "after"}]});
        let res = h.prompt(&s(sc)).await;
        match (r.stop, &res) {
            (Some(stop), Ok(resp)) => assert_eq!(resp.stop_reason.as_str(), stop, "{what}"),
            (None, Err(AcpError::Rpc { error, .. })) => {
                assert_eq!(error.message, "driver refuses", "{what}")
            }
            other => panic!("{what}: unexpected {other:?}"),
        }
        let ev = h.drain();
        let cwd = h.cwd();
        assert_eq!(cwd.join("out.txt").exists(), r.ran, "{what}: tool ran?");
        assert_eq!(
            messages(&ev).contains(&"after".to_string()),
            r.after,
            "{what}: turn went on?"
        );
        for rule in [CL, CX] {
            assert_eq!(
                cwd.join(rule).exists(),
                r.rule == Some(rule),
                "{what}: rule file {rule}"
            );
        }
        let last_status = updates(&ev).iter().rev().find_map(|e| match e {
            SessionEvent::ToolCallUpdate(u) => u.status.clone(),
            _ => None,
        });
        let want = if r.ran {
            ToolCallStatus::Completed
        } else {
            ToolCallStatus::Failed
        };
        if r.stop.is_some() {
            assert_eq!(last_status, Some(want), "{what}: tool status");
        }
        let report = h.report_lines("perm.jsonl");
        assert_eq!(report.len(), 1, "{what}");
        assert_eq!(report[0]["always_rule_written"], r.rule.is_some(), "{what}");
        // Codex 0.16 uses string (UUID) ids, the others integers.
        let t = &h.client.permission_timings()[0];
        assert_eq!(
            matches!(t.request_id, RequestId::Str(_)),
            r.vocab == "codex-0.16",
            "{what}: id type"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_always_is_remembered_for_the_session() {
    let mut h = start_allowing(vec![id("allow_always")]).await;
    let sc = json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "one.txt"},
        {"type": "tool", "kind": "edit", "path": "two.txt"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    h.drain();
    assert_eq!(
        h.handler.seen.lock().unwrap().len(),
        1,
        "second write must not ask"
    );
    assert!(h.cwd().join("two.txt").exists());
    let rules: Value = serde_json::from_str(
        &std::fs::read_to_string(h.cwd().join(".claude/settings.local.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rules["permissions"]["allow"], json!(["mcp__acp__Write"]));
}

// ---------------------------------------------------------------------------
// Plan exit and modes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_exit_changes_mode_like_each_adapter() {
    // claude-0.101: exit-plan-default -> current_mode_update default, next edit asks.
    let mut h = start_allowing(vec![id("exit-plan-default")]).await;
    let sc = json!({"vocabulary": "claude-0.101", "mode": "plan", "steps": [
        {"type": "plan_exit"}, {"type": "tool", "kind": "edit", "path": "p.txt"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let ev = updates(&h.drain());
    assert!(ev.iter().any(|e| matches!(e, SessionEvent::CurrentModeUpdate { current_mode_id } if current_mode_id == "default")));
    assert!(ev.iter().any(|e| matches!(e, SessionEvent::ToolCall(t) if t.kind == ToolKind::SwitchMode && t.title == "Ready to code?")));
    let seen = h.handler.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0]
            .options
            .iter()
            .map(|o| o.option_id.as_str())
            .collect::<Vec<_>>(),
        [
            "exit-plan-default",
            "exit-plan-auto",
            "exit-plan-bypass",
            "reject"
        ]
    );

    // claude-0.16: acceptEdits -> the following edit is not asked about.
    let mut h = start(&[], vec![id("acceptEdits")], Pick::Error, config()).await;
    let sc = json!({"vocabulary": "claude-0.16", "mode": "plan", "steps": [
        {"type": "plan_exit"}, {"type": "tool", "kind": "edit", "path": "p.txt"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let ev = updates(&h.drain());
    assert!(ev.iter().any(|e| matches!(e, SessionEvent::CurrentModeUpdate { current_mode_id } if current_mode_id == "acceptEdits")));
    assert_eq!(h.handler.seen.lock().unwrap().len(), 1);
    assert!(h.cwd().join("p.txt").exists());

    // claude-0.101 reject keeps planning and ends the turn as a cancellation.
    let mut h = start(&[], vec![id("reject")], Pick::Error, config()).await;
    let sc = json!({"vocabulary": "claude-0.101", "mode": "plan", "steps": [
        {"type": "plan_exit"}, {"type": "message", "text": "after"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::Cancelled);
    assert!(!messages(&h.drain()).contains(&"after".to_string()));

    // codex-2.6: implement_plan -> collaboration_mode back to default.
    let mut h = start(&[], vec![id("implement_plan")], Pick::Error, config()).await;
    let sc = json!({"vocabulary": "codex-2.6", "steps": [{"type": "plan_exit"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let ev = updates(&h.drain());
    assert!(ev.iter().any(
        |e| matches!(e, SessionEvent::ConfigOptionUpdate(v) if v[0]["currentValue"] == "default")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_initial_auto_mode_then_set_mode_default_asks() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.json");
    std::fs::write(
        &scenario,
        s(
            json!({"vocabulary": "claude-0.101", "initial_mode": "adapter",
            "steps": [{"type": "tool", "kind": "edit", "path": "m.txt"}]}),
        ),
    )
    .unwrap();
    let h = start(
        &["--scenario", scenario.to_str().unwrap()],
        vec![],
        Pick::Kind(PermissionOptionKind::AllowOnce),
        config(),
    )
    .await;
    h.prompt("go").await.unwrap();
    assert_eq!(
        h.handler.seen.lock().unwrap().len(),
        0,
        "auto mode must not ask"
    );
    assert!(h.cwd().join("m.txt").exists());
    h.client.set_mode(&h.session, "default").await.unwrap();
    h.prompt("go again").await.unwrap();
    assert_eq!(h.handler.seen.lock().unwrap().len(), 1, "default mode asks");
    let err = h
        .client
        .set_mode(&h.session, "no-such-mode")
        .await
        .unwrap_err();
    assert!(matches!(err, AcpError::Rpc { error, .. } if error.code == codes::INVALID_PARAMS));
}

// ---------------------------------------------------------------------------
// Cancel.

async fn wait_pending(c: &AcpClient, n: usize) {
    for _ in 0..500 {
        if c.pending_permissions() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never saw {n} pending permission(s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_pending_permission_cancelled_and_waits_for_prompt() {
    let h = start(&[], vec![], Pick::Hang, config()).await;
    let sc = json!({"vocabulary": "claude-0.101", "report": "perm.jsonl",
        "steps": [{"type": "tool", "kind": "edit", "path": "never.txt", "ask": true}]});
    let c = h.client.clone();
    let sid = h.session.clone();
    let prompt = tokio::spawn(async move { c.prompt(&sid, &s(sc), Value::Null).await });
    wait_pending(&h.client, 1).await;
    let report = h.client.cancel(&h.session).await.unwrap();
    assert_eq!(report.permissions_cancelled, 1);
    assert_eq!(
        report.outcome,
        CancelOutcome::PromptEnded(PromptEnd::Answered(StopReason::Cancelled))
    );
    assert_eq!(
        prompt.await.unwrap().unwrap().stop_reason,
        StopReason::Cancelled
    );
    assert_eq!(
        h.client.permission_timings()[0].answer,
        PermissionAnswer::Cancelled
    );
    assert_eq!(h.client.pending_permissions(), 0);
    let agent_saw = h.report_lines("perm.jsonl");
    assert_eq!(agent_saw[0]["answer"], json!({"outcome": "cancelled"}));
    assert!(!h.cwd().join("never.txt").exists());
}

/// Wait until the turn announced itself, so the cancel cannot overtake the prompt.
async fn wait_started(h: &mut Harness) {
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), h.events.recv()).await {
        if messages(&[ev]) == ["started"] {
            return;
        }
    }
    panic!("the turn never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_misbehaving_agents() {
    // end_turn after a cancel
    let mut h = start(&[], vec![], Pick::Hang, config()).await;
    let c = h.client.clone();
    let sid = h.session.clone();
    let sc = s(
        json!({"on_cancel": "end_turn", "steps": [{"type": "message", "text": "started"}, {"type": "hang"}]}),
    );
    let p = tokio::spawn(async move { c.prompt(&sid, &sc, Value::Null).await });
    wait_started(&mut h).await;
    let r = h.client.cancel(&h.session).await.unwrap();
    assert_eq!(
        r.outcome,
        CancelOutcome::PromptEnded(PromptEnd::Answered(StopReason::EndTurn))
    );
    p.await.unwrap().unwrap();

    // never answers: the deadline expires, the connection is still usable.
    let mut h = start(&[], vec![], Pick::Hang, config()).await;
    let c = h.client.clone();
    let sid = h.session.clone();
    let sc = s(
        json!({"on_cancel": "never", "steps": [{"type": "message", "text": "started"}, {"type": "hang"}]}),
    );
    let _p = tokio::spawn(async move { c.prompt(&sid, &sc, Value::Null).await });
    wait_started(&mut h).await;
    let r = h
        .client
        .cancel_with_deadline(&h.session, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(r.outcome, CancelOutcome::DeadlineExpired);
    assert!(h.client.fault().is_none());

    // nothing in flight
    let r = h.client.cancel("no-such-session").await.unwrap();
    assert_eq!(r.outcome, CancelOutcome::NoPromptInFlight);
}

// ---------------------------------------------------------------------------
// Robustness.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_update_variant_is_skipped() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [
        {"type": "update", "update": {"sessionUpdate": "hologram_projection", "beam": 1}},
        {"type": "update", "update": {"sessionUpdate": "tool_call", "toolCallId": "t9", "title": "odd", "kind": "teleport"}},
        {"type": "message", "text": "still here"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let ev = h.drain();
    assert_eq!(h.client.stats().unknown_updates, 1);
    assert!(!ev.iter().any(|e| matches!(e, AcpEvent::ProtocolError(_))));
    assert!(updates(&ev).iter().any(
        |e| matches!(e, SessionEvent::ToolCall(t) if t.kind == ToolKind::Unknown("teleport".into()))
    ));
    assert_eq!(messages(&ev), ["still here"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_option_kind_is_not_selectable() {
    let h = start(&[], vec![id("warp")], Pick::Error, config()).await;
    let sc = json!({"vocabulary": "claude-0.101", "report": "perm.jsonl", "steps": [
        {"type": "tool", "kind": "edit", "path": "w.txt", "ask": true,
         "extra_options": [{"optionId": "warp", "name": "Warp", "kind": "allow_forever"}]}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let seen = h.handler.seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].options.len(),
        4,
        "the request still parsed with all options"
    );
    assert!(!seen[0].offers("warp"));
    // The client refused to send a non-selectable id.
    assert_eq!(
        h.client.permission_timings()[0].answer,
        PermissionAnswer::Error(codes::INTERNAL_ERROR)
    );
    assert!(h.report_lines("perm.jsonl")[0]["answer"]["error"].is_object());
    assert!(!h.cwd().join("w.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_ids_both_directions() {
    let cfg = ClientConfig {
        id_style: IdStyle::Str,
        ..config()
    };
    let mut h = start(
        &[],
        vec![],
        Pick::Kind(PermissionOptionKind::AllowOnce),
        cfg,
    )
    .await;
    let sc = json!({"vocabulary": "claude-0.101", "string_ids": true,
        "steps": [{"type": "tool", "kind": "edit", "path": "sid.txt", "ask": true}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    h.drain();
    assert!(matches!(
        h.client.permission_timings()[0].request_id,
        RequestId::Str(_)
    ));
    assert!(h.cwd().join("sid.txt").exists());
    assert_eq!(h.client.stats().stray_responses, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_line_is_a_fault() {
    let cfg = ClientConfig {
        max_line_bytes: 64 * 1024,
        ..config()
    };
    let mut h = start(&[], vec![], Pick::Error, cfg).await;
    let sc = json!({"steps": [{"type": "message", "text": "before"}, {"type": "oversized", "bytes": 200000},
        {"type": "message", "text": "after"}]});
    let err = h.prompt(&s(sc)).await.unwrap_err();
    assert_eq!(err, AcpError::Fault(Fault::OversizedLine { limit: 65536 }));
    let ev = h.drain();
    assert_eq!(messages(&ev), ["before"]);
    assert!(ev.contains(&AcpEvent::Fault(Fault::OversizedLine { limit: 65536 })));
    assert_eq!(
        h.client.faulted().await,
        Fault::OversizedLine { limit: 65536 }
    );
    // Later calls fail fast.
    assert!(matches!(
        h.client.set_mode(&h.session, "default").await,
        Err(AcpError::Fault(_))
    ));

    // Under the default 16 MiB limit a 1 MB line is fine.
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [{"type": "oversized", "bytes": 1_000_000}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    assert_eq!(messages(&h.drain())[0].len(), 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_line_is_logged_not_fatal() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [{"type": "malformed"}, {"type": "raw", "line": "[1,2,3]"},
        {"type": "message", "text": "after"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let ev = h.drain();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, AcpEvent::ProtocolError(_)))
            .count(),
        2
    );
    assert_eq!(messages(&ev), ["after"]);
    assert_eq!(h.client.stats().malformed_lines, 2);

    // ...unless the caller caps it.
    let cfg = ClientConfig {
        max_malformed_lines: Some(1),
        ..config()
    };
    let h = start(&[], vec![], Pick::Error, cfg).await;
    let err = h
        .prompt(&s(
            json!({"steps": [{"type": "malformed"}, {"type": "hang"}]}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err, AcpError::Fault(Fault::Garbage { count: 1 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_mid_turn_is_a_fault() {
    use std::os::unix::process::ExitStatusExt;
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [{"type": "message", "text": "working"}, {"type": "crash"}]});
    let err = h.prompt(&s(sc)).await.unwrap_err();
    assert_eq!(err, AcpError::Fault(Fault::AgentClosed));
    let ev = h.drain();
    assert_eq!(messages(&ev), ["working"]);
    assert_eq!(ev.last(), Some(&AcpEvent::Fault(Fault::AgentClosed)));
    let status = h.child.wait().await.unwrap();
    assert_eq!(status.signal(), Some(libc_sigabrt()));

    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let err = h
        .prompt(&s(json!({"steps": [{"type": "exit", "code": 3}]})))
        .await
        .unwrap_err();
    assert_eq!(err, AcpError::Fault(Fault::AgentClosed));
    assert_eq!(h.child.wait().await.unwrap().code(), Some(3));
}

fn libc_sigabrt() -> i32 {
    nix::sys::signal::Signal::SIGABRT as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_error_and_stop_reasons_surface() {
    let h = start(&[], vec![], Pick::Error, config()).await;
    let err = h
        .prompt(&s(
            json!({"steps": [{"type": "error", "code": -32603, "message": "boom"}]}),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcpError::Rpc { error, .. } if error.code == -32603 && error.message == "boom")
    );
    let r = h
        .prompt(&s(
            json!({"steps": [{"type": "stop", "reason": "max_tokens"}]}),
        ))
        .await
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::MaxTokens);
    // An inline scenario with a typo is reported to the user, not obeyed.
    let mut h2 = start(&[], vec![], Pick::Error, config()).await;
    h2.prompt(&s(json!({"stepz": []}))).await.unwrap();
    assert!(messages(&h2.drain())[0].contains("bad inline scenario"));
}

// ---------------------------------------------------------------------------
// fs / terminal / elicitation routing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_016_tools_go_through_client_fs_and_terminal() {
    let mut h = start_allowing(vec![]).await;
    let sc = json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "f.txt", "content": "via client\n"},
        {"type": "tool", "kind": "read", "path": "f.txt"},
        {"type": "tool", "kind": "execute", "command": "cat f.txt"},
        {"type": "tool", "kind": "edit", "path": "/etc/warden-escape.txt", "content": "no"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    let calls = h.handler.calls.lock().unwrap().clone();
    for m in [
        "fs/write_text_file",
        "fs/read_text_file",
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/output",
        "terminal/release",
    ] {
        assert!(calls.iter().any(|c| c == m), "{m} not called: {calls:?}");
    }
    let ev = updates(&h.drain());
    let outputs: Vec<String> = ev
        .iter()
        .filter_map(|e| match e {
            SessionEvent::ToolCallUpdate(u) if u.status == Some(ToolCallStatus::Completed) => u
                .raw_output
                .as_ref()
                .map(|o| o["output"].as_str().unwrap_or("").to_string()),
            _ => None,
        })
        .collect();
    assert!(outputs.iter().any(|o| o == "via client\n"), "{outputs:?}");
    // The handler refused the write outside its root with -32602; the tool failed.
    assert!(!std::path::Path::new("/etc/warden-escape.txt").exists());
    let failed = ev.iter().filter(|e| matches!(e, SessionEvent::ToolCallUpdate(u) if u.status == Some(ToolCallStatus::Failed))).count();
    assert_eq!(failed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_gate_agent_requests() {
    // Without fs/terminal advertised the claude-0.16 agent writes directly, and
    // without elicitation it cannot ask.
    let mut h = start_caps(
        &[],
        vec![],
        Pick::Kind(PermissionOptionKind::AllowOnce),
        config(),
        ClientCapabilities::default(),
    )
    .await;
    let sc = json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "d.txt"},
        {"type": "question", "message": "colour?"},
        {"type": "tool", "kind": "edit", "path": "e.txt", "via": "client"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    assert!(h.cwd().join("d.txt").exists());
    assert!(h.handler.calls.lock().unwrap().is_empty());
    let msgs = messages(&h.drain());
    assert!(msgs[0].contains("cannot answer questions"));
    // The forced client write got -32601 because fs was not advertised.
    assert!(!h.cwd().join("e.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_goes_to_elicitation_handler() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [{"type": "question", "message": "Favourite colour?"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    assert!(
        h.handler
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c == "elicitation: Favourite colour?")
    );
    assert_eq!(messages(&h.drain()), [r#"You answered: {"answer":"blue"}"#]);
    assert!(
        h.client.permission_timings().is_empty(),
        "a question is not a permission"
    );
}

// ---------------------------------------------------------------------------
// Demo behaviour, TCK prefixes, load.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_plain_prompts() {
    let mut h = start(
        &[],
        vec![Pick::Kind(PermissionOptionKind::AllowOnce)],
        Pick::Kind(PermissionOptionKind::RejectOnce),
        config(),
    )
    .await;
    assert_eq!(
        h.prompt("write hello.txt").await.unwrap().stop_reason,
        StopReason::EndTurn
    );
    let ev = h.drain();
    let cwd = h.cwd();
    let tc = updates(&ev)
        .into_iter()
        .find_map(|e| match e {
            SessionEvent::ToolCall(t) => Some(t),
            _ => None,
        })
        .expect("a tool_call");
    assert_eq!(tc.kind, ToolKind::Edit);
    assert_eq!(tc.title, "Write hello.txt");
    assert_eq!(
        tc.locations[0].path,
        cwd.join("hello.txt").to_str().unwrap()
    );
    assert_eq!(
        messages(&ev),
        ["I'll write hello.txt.", "I wrote hello.txt."]
    );
    assert!(cwd.join("hello.txt").exists());
    let seen = h.handler.seen.lock().unwrap()[0].clone();
    assert_eq!(
        seen.options[0].option_id, "allow-once",
        "default vocabulary is claude-0.101"
    );

    // refused
    assert_eq!(
        h.prompt("write second.txt with hi")
            .await
            .unwrap()
            .stop_reason,
        StopReason::EndTurn
    );
    let msgs = messages(&h.drain());
    assert!(msgs[1].contains("refused"), "{msgs:?}");
    assert!(!cwd.join("second.txt").exists());

    // run
    let mut h = start_allowing(vec![]).await;
    std::fs::write(h.cwd().join("marker-file"), "").unwrap();
    assert_eq!(
        h.prompt("run ls").await.unwrap().stop_reason,
        StopReason::EndTurn
    );
    let ev = h.drain();
    assert!(
        updates(&ev)
            .iter()
            .any(|e| matches!(e, SessionEvent::ToolCall(t) if t.kind == ToolKind::Execute))
    );
    assert!(messages(&ev).last().unwrap().contains("marker-file"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tck_message_id_prefixes() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    let meta = json!({"warden": {"messageId": "tck-complete-task-42"}});
    let r = h.client.prompt(&h.session, "anything", meta).await.unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    assert_eq!(messages(&h.drain()), ["Hello from TCK"]);

    let r = h.prompt("tck-reject-task-1 please").await.unwrap();
    assert_eq!(r.stop_reason, StopReason::Refusal);
    h.drain();

    let r = h.prompt("tck-artifact-file-1").await.unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    let ev = updates(&h.drain());
    let SessionEvent::AgentMessageChunk(c) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(
        c.meta.as_ref().unwrap()["warden"]["artifact"]["kind"],
        "file"
    );

    let r = h.prompt("tck-input-required-1").await.unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    assert!(
        h.handler
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.starts_with("elicitation"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_session_replays_history() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    h.prompt("hello there").await.unwrap();
    h.drain();
    h.client.load_session(&h.session, &h.cwd()).await.unwrap();
    let ev = updates(&h.drain());
    assert!(
        matches!(&ev[0], SessionEvent::UserMessageChunk(c) if c.content.as_text() == Some("hello there"))
    );
    assert!(matches!(&ev[1], SessionEvent::AgentMessageChunk(_)));
    let err = h
        .client
        .load_session("sess-unknown", &h.cwd())
        .await
        .unwrap_err();
    assert!(matches!(err, AcpError::Rpc { error, .. } if error.code == codes::RESOURCE_NOT_FOUND));
    assert!(matches!(
        h.client.new_session(std::path::Path::new("relative")).await,
        Err(AcpError::InvalidArgument(_))
    ));
}

// ---------------------------------------------------------------------------
// Process behaviours for containment tests.

fn alive(pid: i32) -> bool {
    // /proc/<pid>/stat state Z means it exited but was not reaped.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_children_ignore_sigterm_and_grandchild_escapes_session() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::{Pid, getsid};
    let h = start(&[], vec![], Pick::Error, config()).await;
    let sc = json!({"steps": [{"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids.txt", "sleep_ms": 60000}]});
    h.prompt(&s(sc)).await.unwrap();
    let mut pids = Vec::new();
    for _ in 0..200 {
        pids = std::fs::read_to_string(h.cwd().join("pids.txt"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse::<i32>().ok())
            .collect();
        if pids.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pids.len(), 2, "child and grandchild pids");
    let agent_pid = h.child.id().unwrap() as i32;
    let agent_sid = getsid(Some(Pid::from_raw(agent_pid))).unwrap();
    let child_sid = getsid(Some(Pid::from_raw(pids[0]))).unwrap();
    let grand_sid = getsid(Some(Pid::from_raw(pids[1]))).unwrap();
    assert_eq!(child_sid, agent_sid);
    assert_ne!(grand_sid, agent_sid, "grandchild called setsid");
    for p in &pids {
        kill(Pid::from_raw(*p), Signal::SIGTERM).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in &pids {
        assert!(alive(*p), "pid {p} must ignore SIGTERM");
        kill(Pid::from_raw(*p), Signal::SIGKILL).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_eof_exits_unless_told_to_ignore_it() {
    let mut h = start(&[], vec![], Pick::Error, config()).await;
    h.client.close_stdin();
    let st = tokio::time::timeout(Duration::from_secs(5), h.child.wait())
        .await
        .expect("exits on EOF")
        .unwrap();
    assert!(st.success());

    let mut h = start(&["--ignore-stdin-eof"], vec![], Pick::Error, config()).await;
    h.client.close_stdin();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        h.child.try_wait().unwrap().is_none(),
        "still running after EOF"
    );
    h.child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_stderr_does_not_disturb_the_protocol() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let handler = TestHandler::new(dir.path(), vec![], Pick::Error);
    let mut cmd = tokio::process::Command::new(agent_bin());
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut err = child.stderr.take().unwrap();
    let counter = tokio::spawn(async move {
        let mut n = 0usize;
        let mut buf = vec![0u8; 65536];
        while let Ok(k) = err.read(&mut buf).await {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    let (client, _events) = AcpClient::connect(
        child.stdout.take().unwrap(),
        child.stdin.take().unwrap(),
        handler,
        config(),
    );
    client
        .initialize(ClientCapabilities::default())
        .await
        .unwrap();
    let sess = client
        .new_session(&dir.path().canonicalize().unwrap())
        .await
        .unwrap();
    let r = client
        .prompt(&sess.session_id, &s(json!({"steps": [{"type": "stderr", "bytes": 4_000_000}, {"type": "message", "text": "ok"}]})), Value::Null)
        .await
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    client.close_stdin();
    child.wait().await.unwrap();
    assert!(counter.await.unwrap() >= 4_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_from_agent_answers_permission_cancelled() {
    let mut h = start(&[], vec![], Pick::Hang, config()).await;
    let sc = json!({"vocabulary": "claude-0.101", "report": "perm.jsonl", "steps": [
        {"type": "tool", "kind": "edit", "path": "x.txt", "ask": true, "withdraw_after_ms": 100},
        {"type": "message", "text": "after"}]});
    assert_eq!(stop_of(&h, sc).await, StopReason::EndTurn);
    assert_eq!(
        h.client.permission_timings()[0].answer,
        PermissionAnswer::Cancelled
    );
    assert_eq!(
        h.report_lines("perm.jsonl")[0]["answer"],
        json!({"outcome": "cancelled"})
    );
    // claude-0.101 treats a cancelled outcome as a failed tool and goes on.
    assert_eq!(messages(&h.drain()), ["after"]);
    assert!(!h.cwd().join("x.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_when_with_the_shipped_scenario_file() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripted-agent/scenarios/three-vocabularies.json");
    let args = ["--scenario", file.to_str().unwrap()];
    let mut h = start(
        &args,
        vec![],
        Pick::Kind(PermissionOptionKind::AllowOnce),
        config(),
    )
    .await;
    let resp = h.prompt("go").await.unwrap();
    assert_eq!(resp.stop_reason, StopReason::EndTurn);
    let ev = h.drain();
    assert_eq!(kinds(&ev).len(), 13);
    assert_eq!(messages(&ev), ["Starting", "Done"]);
    let report = h.report_lines("permissions.jsonl");
    let vocabs: Vec<&str> = report
        .iter()
        .map(|l| l["vocabulary"].as_str().unwrap())
        .collect();
    assert_eq!(vocabs, ["claude-0.16", "codex-2.6", "claude-0.101"]);
    assert_eq!(h.client.permission_timings().len(), 3);
    for f in ["a.txt", "b.txt", "c.txt"] {
        assert!(h.cwd().join(f).exists(), "{f}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_close_stdin_fail_fast() {
    let h = start(&["--ignore-stdin-eof"], vec![], Pick::Error, config()).await;
    h.client.close_stdin();
    let err = tokio::time::timeout(
        Duration::from_secs(2),
        h.client.set_mode(&h.session, "default"),
    )
    .await
    .expect("must not wait for the request timeout")
    .unwrap_err();
    assert_eq!(err, AcpError::Fault(Fault::ClosedByClient));
    assert!(
        h.client.fault().is_none(),
        "closing stdin is not a connection fault"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_timings_are_bounded_and_drainable() {
    let cfg = ClientConfig {
        permission_timing_capacity: 3,
        ..config()
    };
    let h = start(
        &[],
        vec![],
        Pick::Kind(PermissionOptionKind::AllowOnce),
        cfg,
    )
    .await;
    let steps: Vec<Value> = (0..5).map(|i| json!({"type": "tool", "kind": "other", "tool_call_id": format!("t{i}"), "ask": true})).collect();
    h.prompt(&s(json!({"steps": steps}))).await.unwrap();
    let t = h.client.permission_timings();
    assert_eq!(
        t.iter()
            .map(|x| x.tool_call_id.as_str())
            .collect::<Vec<_>>(),
        ["t2", "t3", "t4"]
    );
    assert!(
        t.iter()
            .all(|x| x.elapsed > Duration::ZERO && x.elapsed < Duration::from_secs(5))
    );
    assert_eq!(h.client.take_permission_timings().len(), 3);
    assert!(h.client.permission_timings().is_empty());
}
