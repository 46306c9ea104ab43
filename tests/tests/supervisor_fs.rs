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
    // What the supervisor writes for the agent belongs to the agent (the root's owner: the agent
    // uid when the supervisor is root), never to the supervisor.
    {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(&root).unwrap().uid();
        assert_eq!(
            std::fs::metadata(root.join("inside.txt")).unwrap().uid(),
            owner
        );
        if nix::unistd::geteuid().is_root() {
            assert_ne!(owner, 0, "a root supervisor's agent root belongs to root");
        }
    }

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

/// The containment issue's finding 1, reproduced through the real daemons: the agent flips `l`
/// between a directory and a symlink to a host directory in a background loop while it asks the
/// supervisor (which runs outside the sandbox) for hundreds of writes and reads through `l`. Not a
/// byte may land outside or come back from outside.
#[tokio::test(flavor = "multi_thread")]
async fn a_flipping_symlink_never_lets_a_client_write_or_read_leave_the_root() {
    // The scenario (1,000 steps) rides in the prompt. Its 1,000 tool calls report about 240 KB
    // (more when more of them are refused, with longer messages, and with longer paths), close
    // to the default `output_bytes` of 256 KiB: that limit ending the turn is not what this
    // test is about, so it is raised.
    let d = deploy(&[
        ("supervisor", "limits.task_text_bytes=200000"),
        ("supervisor", "limits.output_bytes=4194304"),
    ])
    .await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("race", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    let outside = parent().join(format!("race-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host secret\n").unwrap();
    let flipper = format!(
        "nohup sh -c 'while true; do rm -rf l; mkdir l; rm -rf l; ln -s {} l; done' >/dev/null 2>&1 &",
        outside.display()
    );
    let mut steps = vec![
        json!({"type": "tool", "kind": "execute", "command": flipper,
        "ask": false, "via": "direct"}),
    ];
    for i in 0..500 {
        steps.push(
            json!({"type": "tool", "kind": "edit", "path": format!("l/p{}", i % 16),
            "content": "pwned", "ask": false, "via": "client"}),
        );
        steps.push(
            json!({"type": "tool", "kind": "read", "path": "l/secret", "ask": false,
            "via": "client"}),
        );
    }
    let mut s = start(
        &mut c,
        turn("race", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let evs = collect(&mut s, std::time::Duration::from_secs(240)).await;
    let end = stop(&evs);
    let output: usize = evs
        .iter()
        .map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) => {
                t.content_text.len() + t.raw_input_json.len()
            }
            Some(pb::turn_event::Event::MessageChunk(t)) => t.text.len() + t.meta_json.len(),
            _ => 0,
        })
        .sum();
    eprintln!("the turn's output: {output} bytes");
    assert_eq!(end.stop_reason, "end_turn", "{:?}", end.fault);
    let written: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        written,
        vec![std::ffi::OsString::from("secret")],
        "client writes landed outside the root"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "host secret\n"
    );
    let all_text: String = evs
        .iter()
        .filter_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) => Some(t.content_text.clone()),
            Some(pb::turn_event::Event::MessageChunk(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect();
    assert!(
        !all_text.contains("host secret"),
        "a client read came back from outside the root"
    );
    // No ALLOW covered these writes: each one that was not refused outright (its path led
    // outside when it arrived) was decided. The flipper really flipped: not every write was
    // allowed. Reads through the client are decided too (kind read), once per location a turn.
    let perms = permissions(&evs);
    let writes: Vec<_> = perms.iter().filter(|p| p.tool_kind == "edit").collect();
    let reads = perms.iter().filter(|p| p.tool_kind == "read").count();
    assert!(
        !writes.is_empty() && writes.len() <= 500,
        "{} decisions",
        writes.len()
    );
    let allowed = writes
        .iter()
        .filter(|p| p.verdict == pb::Verdict::Allow as i32)
        .count();
    eprintln!(
        "500 client writes: {} decided ({allowed} allowed), {} refused before any decision; {reads} read decisions",
        writes.len(),
        500 - writes.len()
    );
    assert!(allowed < 500, "the flipper never showed a symlink");
    let _ = root;
}

/// A client write that no ALLOW of the turn covers is decided by the policy like an edit of its
/// path, audited, shown to the caller, and a DENY leaves the file untouched.
#[tokio::test(flavor = "multi_thread")]
async fn an_uncovered_client_write_is_decided_audited_and_a_deny_writes_nothing() {
    let d = deploy(&[(
        "policy",
        r#"policy.principals.tester.auto_deny=["fs/write_text_file"]"#,
    )])
    .await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("wdeny", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    std::fs::write(root.join("kept.txt"), "original").unwrap();
    let evs = run(&mut c, turn("wdeny", "t1", &client_write("kept.txt"))).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    assert_eq!(
        std::fs::read_to_string(root.join("kept.txt")).unwrap(),
        "original",
        "a denied client write changed the file"
    );
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{perms:#?}");
    let p = &perms[0];
    assert_eq!(p.verdict, pb::Verdict::Deny as i32);
    assert_eq!(p.tool_kind, "edit");
    assert!(p.tool_title.starts_with("fs/write_text_file "), "{p:?}");
    let audit = audit_of(&d, "wdeny").await;
    let rec = audit
        .iter()
        .find(|r| r.decision_id == p.decision_id)
        .unwrap_or_else(|| panic!("decision {} not in the audit: {audit:#?}", p.decision_id));
    assert_eq!(rec.verdict, pb::Verdict::Deny as i32);
    assert!(
        stop(&evs)
            .refusals
            .iter()
            .any(|r| r.decision_id == p.decision_id)
    );

    // A write the agent first asked permission for (claude-0.16 style: tool call, permission,
    // then fs/write_text_file) is covered by that ALLOW: one decision, the file written.
    let asked = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "asked.txt", "content": "hello", "ask": true,
         "via": "client"}]}));
    let evs = run(&mut c, turn("wdeny", "t2", &asked)).await;
    let perms = permissions(&evs);
    assert_eq!(
        perms.len(),
        1,
        "the covering ALLOW is the only decision: {perms:#?}"
    );
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32);
    assert_eq!(
        std::fs::read_to_string(root.join("asked.txt")).unwrap(),
        "hello"
    );
}
