//! Supervisor end to end, cancellation and containment: queued vs active cancel, a pending
//! permission answered `cancelled`, agents that never answer the cancel or answer `end_turn`,
//! cancel before start, and the TERM-ignoring `setsid` tree gone after close, cancel, timeout,
//! idle stop and a supervisor crash.

mod supervisor_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

async fn cancel(c: &mut Client, ctx: &str, id: &str) -> String {
    c.cancel_turn(pb::CancelTurnRequest {
        context_id: ctx.into(),
        turn_id: id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .outcome
}

async fn info(c: &mut Client, ctx: &str) -> pb::ConversationInfo {
    c.open_conversation(open(ctx, pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner()
}

/// Waits until the stream shows an event matching `f` (returns the events seen).
async fn until(
    s: &mut tonic::Streaming<pb::TurnEvent>,
    f: impl Fn(&Event) -> bool,
) -> Vec<pb::TurnEvent> {
    let mut seen = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = s.message().await.unwrap() {
            let hit = ev.event.as_ref().is_some_and(&f);
            seen.push(ev);
            if hit {
                return;
            }
        }
    })
    .await;
    assert!(r.is_ok(), "event not seen: {seen:#?}");
    seen
}

/// Waits until `file` lists at least `n` pids.
/// Waits until the agent's helpers wrote `n` pids to `file`, then returns the host pids of every
/// live process working inside the conversation's root (the file's directory). The pids the helpers
/// write are only meaningful in their own PID namespace (bubblewrap gives the agent one), so the
/// tree is found from the host's side by working directory instead.
async fn wait_pids(file: &Path, n: usize) -> Vec<i32> {
    let root = file
        .parent()
        .expect("pid file has a directory")
        .to_path_buf();
    for _ in 0..200 {
        let written = pids_in(file);
        let tree = processes_in(&root, None);
        if written.len() >= n && tree.len() >= n {
            return tree;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "helpers did not start: wrote {:?}, found {:?}",
        pids_in(file),
        processes_in(&root, None)
    );
}

const SPAWN_AND_HANG: &str = r#"{"on_cancel": "never", "steps": [
    {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
    {"type": "hang"}]}"#;

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_queued_turn_leaves_the_active_one_alone() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let a = scenario(
        json!({"steps": [{"type": "sleep", "ms": 1500}, {"type": "message", "text": "A done"}]}),
    );
    let mut sa = start(&mut c, turn("q", "a", &a)).await;
    until(&mut sa, |e| matches!(e, Event::Started(_))).await;
    let mut sb = start(&mut c, turn("q", "b", "write b.txt")).await;
    let first = sb.message().await.unwrap().unwrap();
    assert!(
        matches!(
            first.event,
            Some(Event::Queued(pb::TurnQueued {
                position: 1,
                admission: false,
                agent: false,
            }))
        ),
        "{first:?}"
    );
    let i = info(&mut c, "q").await;
    assert_eq!(i.active_turn_id, "a");
    assert_eq!(i.queued_turn_ids, vec!["b".to_string()]);
    assert_eq!(cancel(&mut c, "q", "b").await, "queued");
    let eb = collect(&mut sb, Duration::from_secs(5)).await;
    assert_eq!(stop(&eb).stop_reason, "cancelled");
    assert!(
        !eb.iter()
            .any(|e| matches!(e.event, Some(Event::Started(_))))
    );
    let ea = collect(&mut sa, Duration::from_secs(20)).await;
    assert_eq!(stop(&ea).stop_reason, "end_turn");
    assert!(text(&ea).contains("A done"));
    assert_eq!(cancel(&mut c, "q", "b").await, "finished");
    let h = health(&d);
    assert_eq!(
        h.len(),
        2,
        "one health line per finished turn, queued ones too: {h:?}"
    );
    assert!(h.iter().any(|l| l["stop_reason"] == "cancelled"));
    assert!(
        !PathBuf::from(info(&mut c, "q").await.root)
            .join("b.txt")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_permission_is_answered_cancelled() {
    // A policy service that accepts connections, reads, and never answers: the permission stays
    // pending. It says when the Decide request has arrived (its bytes carry the command; gRPC
    // DATA frames are not compressed), so the test cancels exactly while it is pending.
    let dir = parent().join(format!("hung-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("p.sock");
    let _ = std::fs::remove_file(&sock);
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    let arrived = std::sync::Arc::new(tokio::sync::Notify::new());
    let held = {
        let arrived = arrived.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let arrived = arrived.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut seen: Vec<u8> = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if seen.windows(14).any(|w| w == b"echo x > x.txt") {
                            arrived.notify_one();
                        }
                    }
                    // Held open (never answered) until the peer goes away.
                    drop(s);
                });
            }
        })
    };
    let d = deploy_without_policy(&[
        (
            "supervisor",
            &format!("policy.socket=\"{}\"", sock.display()),
        ),
        ("supervisor", "policy.decide_deadline_ms=60000"),
    ])
    .await;
    let mut c = client(&d);
    let text = scenario(json!({"report": "perm.jsonl",
        "steps": [{"type": "tool", "kind": "execute", "command": "echo x > x.txt"}]}));
    let mut s = start(&mut c, turn("p", "t1", &text)).await;
    until(&mut s, |e| matches!(e, Event::ToolCall(_))).await;
    tokio::time::timeout(Duration::from_secs(20), arrived.notified())
        .await
        .expect("the Decide request never reached the (hung) policy");
    assert_eq!(cancel(&mut c, "p", "t1").await, "active");
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{evs:#?}");
    assert!(
        p[0].cancelled && p[0].option_id_sent.is_empty(),
        "{:?}",
        p[0]
    );
    let root = PathBuf::from(info(&mut c, "p").await.root);
    let rep = std::fs::read_to_string(root.join("perm.jsonl")).unwrap_or_default();
    assert!(
        rep.contains(r#""outcome":"cancelled""#),
        "agent report: {rep}"
    );
    assert!(!root.join("x.txt").exists());
    held.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_ignores_cancel_is_killed_and_its_tree_is_gone() {
    let d = deploy(&[("supervisor", "limits.cancel_grace_ms=500")]).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("k", "t1", SPAWN_AND_HANG)).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    let root = PathBuf::from(info(&mut c, "k").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    assert_eq!(cancel(&mut c, "k", "t1").await, "active");
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
    assert!(
        all_gone(&pids, Duration::from_secs(10)).await,
        "survivors: {pids:?}"
    );
    let i = info(&mut c, "k").await;
    assert_eq!(i.state, pb::ConversationState::IdleStopped as i32);
    // The next turn restarts the agent.
    let evs = run(&mut c, turn("k", "t2", "write again.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn end_turn_after_cancel_still_ends_cancelled() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = r#"{"on_cancel": "end_turn", "steps": [{"type": "hang"}]}"#;
    let mut s = start(&mut c, turn("e", "t1", text)).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    assert_eq!(cancel(&mut c, "e", "t1").await, "active");
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_before_the_turn_arrives_still_cancels_it() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    assert_eq!(cancel(&mut c, "pre", "t9").await, "pending");
    let evs = run(&mut c, turn("pre", "t9", "write never.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
    assert!(
        !evs.iter()
            .any(|e| matches!(e.event, Some(Event::Started(_))))
    );
    assert!(
        !PathBuf::from(info(&mut c, "pre").await.root)
            .join("never.txt")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn close_kills_the_term_ignoring_setsid_tree() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("c", "t1", SPAWN_AND_HANG)).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    let root = PathBuf::from(info(&mut c, "c").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    let r = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "c".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.closed && r.processes >= 3, "{r:?}");
    assert!(
        all_gone(&pids, Duration::from_secs(10)).await,
        "survivors: {pids:?}"
    );
    let evs = collect(&mut s, Duration::from_secs(10)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hard_cutoff_kills_the_tree_and_records_a_timeout() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let mut req = turn("to", "t1", SPAWN_AND_HANG);
    req.timeout_seconds = 1;
    let mut s = start(&mut c, req).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    let root = PathBuf::from(info(&mut c, "to").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    let st = stop(&evs);
    assert_eq!(st.stop_reason, "fault");
    assert_eq!(st.fault.as_ref().unwrap().class, "timeout");
    assert!(
        st.duration_millis >= 1200,
        "hard cutoff is 1.2 x timeout: {}",
        st.duration_millis
    );
    assert!(
        all_gone(&pids, Duration::from_secs(10)).await,
        "survivors: {pids:?}"
    );
    let inc = incidents(&d);
    let t = inc
        .iter()
        .find(|i| i["class"] == "timeout")
        .expect("timeout incident");
    assert_eq!(t["budget_secs"], 1);
    let text = serde_json::to_string(t).unwrap();
    assert!(
        !text.contains("hang") && !text.contains("WARDEN_"),
        "incident leaks task or env: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_stop_kills_the_tree_and_the_next_turn_restarts() {
    let d = deploy(&[("supervisor", "limits.idle_timeout_secs=1")]).await;
    let mut c = client(&d);
    let text = r#"{"steps": [
        {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
        {"type": "message", "text": "left helpers running"}]}"#;
    let evs = run(&mut c, turn("idle", "t1", text)).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    let root = PathBuf::from(info(&mut c, "idle").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    assert!(
        all_gone(&pids, Duration::from_secs(10)).await,
        "survivors after idle stop: {pids:?}"
    );
    // The tree dies before the supervisor finishes the ladder and records the state.
    let mut state = info(&mut c, "idle").await.state;
    for _ in 0..100 {
        if state == pb::ConversationState::IdleStopped as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        state = info(&mut c, "idle").await.state;
    }
    assert_eq!(state, pb::ConversationState::IdleStopped as i32);
    assert!(root.is_dir());
    let evs = run(&mut c, turn("idle", "t2", "write after.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    // The restarted scripted agent cannot load the old session: said, never silent.
    assert!(
        evs.iter()
            .any(|e| matches!(e.event, Some(Event::ContextReset(_)))),
        "{evs:#?}"
    );
    assert!(root.join("after.txt").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_supervisor_crash_and_restart_no_agent_process_survives() {
    let mut d = deploy(&[]).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("crash", "t1", SPAWN_AND_HANG)).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    let root = PathBuf::from(info(&mut c, "crash").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    let sup = d.take("supervisor").unwrap();
    let sup_pid = sup.pid();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup_pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    sup.crash().await;
    d.start("supervisor").await;
    assert!(
        all_gone(&pids, Duration::from_secs(15)).await,
        "survivors after restart: {pids:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_past_the_bound_is_an_output_limit_fault() {
    let d = deploy(&[("supervisor", "limits.output_bytes=2000")]).await;
    let mut c = client(&d);
    let big = "z".repeat(3000);
    let text = scenario(json!({"steps": [{"type": "message", "text": big}, {"type": "hang"}]}));
    let evs = run(&mut c, turn("out", "t1", &text)).await;
    let st = stop(&evs);
    assert_eq!(st.stop_reason, "fault", "{st:?}");
    assert_eq!(st.fault.unwrap().class, "output-limit");
    assert!(incidents(&d).iter().any(|i| i["class"] == "output-limit"));
    let h = health(&d);
    assert_eq!(h.last().unwrap()["fault"], "output-limit");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_of_the_supervisor_kills_every_agent_tree_before_it_exits() {
    let mut d = deploy(&[("supervisor", "daemon.shutdown_grace_ms=500")]).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("term", "t1", SPAWN_AND_HANG)).await;
    until(&mut s, |e| matches!(e, Event::Started(_))).await;
    let root = PathBuf::from(info(&mut c, "term").await.root);
    let pids = wait_pids(&root.join("pids"), 2).await;
    let sup = d.take("supervisor").unwrap();
    let status = sup.terminate().await;
    assert!(status.success(), "supervisor exit: {status}");
    assert!(
        all_gone(&pids, Duration::from_secs(2)).await,
        "survivors after a clean shutdown: {pids:?}"
    );
}
