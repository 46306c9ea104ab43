//! Supervisor end to end, adversarial `fs/*`: the agent's file requests are served inside the
//! boundary only, whatever the path spelling (absolute outside, `..`, a symlink planted in the
//! root), with -32602 for anything outside; read-only conversations refuse writes.

mod supervisor_support;

use std::path::PathBuf;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

fn client_write(path: &str) -> String {
    scenario(json!({"steps": [
        {"type": "tool", "kind": "edit", "path": path, "content": "pwned", "ask": false, "via": "client"}
    ]}))
}

/// Status and content of the last tool_call_update (what the agent made of the fs answer).
fn tool_result(evs: &[pb::TurnEvent]) -> (String, String) {
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
async fn client_fs_requests_stay_inside_the_boundary() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("fs", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    let outside = parent().join(format!("outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();

    // Positive control: inside the root the write is served.
    let evs = run(&mut c, turn("fs", "in", &client_write("inside.txt"))).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    assert_eq!(
        std::fs::read_to_string(root.join("inside.txt")).unwrap(),
        "pwned"
    );

    let abs = outside.join("abs.txt");
    let dotdot = format!(
        "{}/../{}/dotdot.txt",
        root.display(),
        outside.file_name().unwrap().to_string_lossy()
    );
    let cases = [
        ("abs", abs.display().to_string()),
        ("dotdot", dotdot),
        ("link", "escape/via-link.txt".to_string()),
    ];
    for (id, path) in &cases {
        let evs = run(&mut c, turn("fs", id, &client_write(path))).await;
        assert_eq!(stop(&evs).stop_reason, "end_turn", "{id}");
        let t = tool_result(&evs);
        assert!(
            t.0 == "failed" && (t.1.contains("-32602") || t.1.contains("outside")),
            "{id}: the agent's tool ended {t:?}"
        );
    }
    let leaked: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leaked.is_empty(), "written outside the root: {leaked:?}");
    let evs = run(
        &mut c,
        turn(
            "fs",
            "etc",
            &scenario(json!({"steps": [
        {"type": "tool", "kind": "read", "path": "/etc/passwd", "ask": false, "via": "client"}]})),
        ),
    )
    .await;
    assert!(
        !text(&evs).contains("root:x:0"),
        "a read outside the root was served"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_conversation_refuses_client_writes() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let mut req = turn("rofs", "t1", &client_write("ro.txt"));
    req.open = Some(open("rofs", pb::Profile::ReadOnly));
    let evs = run(&mut c, req).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    let info = c
        .open_conversation(open("rofs", pb::Profile::ReadOnly))
        .await
        .unwrap()
        .into_inner();
    assert!(!PathBuf::from(info.root).join("ro.txt").exists());
}
