//! Supervisor end to end, ACP terminals: served only to an agent configured with terminals, and
//! only once decided (an ALLOW of an execute tool call that judged the command, or a decision of
//! its own); the command runs contained inside the root.

mod supervisor_support;

use std::path::PathBuf;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

fn exec(ask: bool, cmd: &str) -> String {
    scenario(json!({"steps": [
        {"type": "tool", "kind": "execute", "command": cmd, "ask": ask, "via": "client"}]}))
}

fn last_tool(evs: &[pb::TurnEvent]) -> (String, String) {
    evs.iter()
        .rev()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) if t.update && !t.status.is_empty() => {
                Some((t.status.clone(), t.content_text.clone()))
            }
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn terminals_run_only_once_decided() {
    let d = deploy(&[("supervisor", "agents.scripted.terminal=true")]).await;
    let mut c = client(&d);
    let evs = run(
        &mut c,
        turn(
            "term",
            "t1",
            &exec(true, "echo hello-from-terminal; pwd > where.txt"),
        ),
    )
    .await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{evs:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32);
    let (status, out) = last_tool(&evs);
    assert_eq!(status, "completed", "{evs:#?}");
    assert!(out.contains("hello-from-terminal"), "{out}");
    let info = c
        .open_conversation(open("term", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    let wd = std::fs::read_to_string(root.join("where.txt")).unwrap();
    assert_eq!(
        PathBuf::from(wd.trim()),
        root,
        "the command ran in the root"
    );

    // No permission asked, so no ALLOW: the terminal is not run on nothing, it is decided on
    // its own, as the command it really is (the default floor allows it in an owned root).
    let evs = run(&mut c, turn("term", "t2", &exec(false, "touch sneaky.txt"))).await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{evs:#?}");
    assert_eq!(p[0].tool_kind, "execute");
    assert_eq!(p[0].tool_title, "sh -c 'touch sneaky.txt'");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32);
    assert_eq!(last_tool(&evs).0, "completed", "{evs:#?}");
    assert!(root.join("sneaky.txt").exists());

    // Refused by the policy (an operator rule on the command's head), it does not run.
    let d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("policy", "policy.global.auto_deny=[\"sh\"]"),
    ])
    .await;
    let mut c = client(&d);
    let evs = run(
        &mut c,
        turn("term2", "t1", &exec(false, "touch sneaky.txt")),
    )
    .await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{evs:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Deny as i32, "{p:?}");
    let (status, out) = last_tool(&evs);
    assert_eq!(status, "failed", "{evs:#?}");
    assert!(out.contains("refused by the policy"), "{out}");
    let info = c
        .open_conversation(open("term2", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert!(!PathBuf::from(info.root).join("sneaky.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_terminals_configured_the_methods_are_not_found() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let evs = run(&mut c, turn("noterm", "t1", &exec(true, "touch t.txt"))).await;
    let (status, out) = last_tool(&evs);
    assert_eq!(status, "failed", "{evs:#?}");
    assert!(
        out.contains("-32601") || out.to_lowercase().contains("not found"),
        "{out}"
    );
}
