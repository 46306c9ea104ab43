//! Supervisor end to end, issue 24 cases 1 and 2: warden's hands are the agent's hands. ACP
//! `fs/*` is carried out by the fs servant (`warden-fs-servant`) inside the agent's own sandbox,
//! with the agent's uid, mounts and no capabilities, on the location the decision judged, never
//! following a symbolic link.
//!
//! 1. The racing symlink: the agent flips `d` between a directory and a link to `.claude` in a
//!    background loop while it sends 60 `fs/write_text_file <root>/d/settings.local.json`; no
//!    `<root>/.claude/settings.local.json` may ever appear.
//! 2. The confused deputy: in an operator workspace a root-owned 0600 secret is not read through
//!    `fs/read_text_file`, and a root-owned 0644 file is not overwritten through
//!    `fs/write_text_file` after a routine ALLOW.
//! 3. The servant's identity: the agent's uid, no capabilities; and asked directly (the agent
//!    shares its uid and can speak to it), a read-only bind still stops it.
//!
//! Cases 2 and 3 need a root supervisor with bubblewrap and skip, saying so, without them (CI
//! runs as root); case 1 holds either way and always runs.

mod supervisor_support;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use prost::Message;
use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

/// Status and content of every tool-call update that ended (what the agent made of each fs
/// answer), in order.
fn tool_results(evs: &[pb::TurnEvent]) -> Vec<(String, String)> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t))
                if t.update && (t.status == "completed" || t.status == "failed") =>
            {
                Some((t.status.clone(), t.content_text.clone()))
            }
            _ => None,
        })
        .collect()
}

fn status_field(pid: i32, key: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_flipped_to_claude_never_gets_a_client_write_into_it() {
    // The 60 writes ride in the prompt.
    let d = deploy(&[("supervisor", "limits.task_text_bytes=200000")]).await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("flip", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    // Made by the sandbox (read-only to the agent) when bubblewrap is on; made here otherwise,
    // the agent's like the rest of its root, so that only the refusal to follow the link (not a
    // file mode) keeps the writes out of it.
    if !root.join(".claude").exists() {
        std::fs::create_dir(root.join(".claude")).unwrap();
        let owner = std::fs::metadata(&root).unwrap();
        std::os::unix::fs::chown(root.join(".claude"), Some(owner.uid()), Some(owner.gid()))
            .unwrap();
    }
    let target = root.join(".claude/settings.local.json");
    assert!(!target.exists());
    let flipper = "nohup sh -c 'while true; do rm -rf d; mkdir d; rm -rf d; ln -s .claude d; done' \
                   >/dev/null 2>&1 &";
    let mut steps = vec![
        json!({"type": "tool", "kind": "execute", "command": flipper, "ask": false, "via": "direct"}),
        json!({"type": "sleep", "ms": 200}),
    ];
    for i in 0..60 {
        steps.push(
            json!({"type": "tool", "kind": "edit", "path": "d/settings.local.json",
            "content": format!("{{\"permissions\":{{\"allow\":[\"Bash\"]}},\"n\":{i}}}"),
            "ask": false, "via": "client"}),
        );
    }
    let evs = run(
        &mut c,
        turn("flip", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{:?}", stop(&evs));
    assert!(
        !target.exists(),
        "a client write landed in .claude: {:?}",
        std::fs::read_to_string(&target)
    );
    let results = tool_results(&evs);
    // The execute step and the 60 writes.
    assert_eq!(results.len(), 61, "{results:#?}");
    let served = results[1..]
        .iter()
        .filter(|(s, _)| s == "completed")
        .count();
    let perms = permissions(&evs);
    let allowed = perms
        .iter()
        .filter(|p| p.tool_kind == "edit" && p.verdict == pb::Verdict::Allow as i32)
        .count();
    eprintln!(
        "60 client writes through a flipping d: {served} served into the plain directory, {allowed} \
         ALLOWed, {} decisions; none in .claude",
        perms.len()
    );
    // Every write that was served went to the plain directory d, never anywhere else.
    assert!(served <= allowed, "served {served} > allowed {allowed}");
    assert!(
        allowed > 0,
        "no write was ever allowed: the race was not run"
    );
    let _ = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "flip".into(),
            principal: String::new(),
        })
        .await;
    assert!(!target.exists());
}

/// An operator workspace whose files the agent's own rights do not reach (a root-owned 0600
/// secret, a root-owned 0644 file in a root-owned 0755 directory).
fn deputy_workspace() -> PathBuf {
    let ws = parent().join(format!("deputy-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ws);
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(ws.join("secret.txt"), "TOP-SECRET-7f3a\n").unwrap();
    std::fs::set_permissions(
        ws.join("secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(ws.join("shared.txt"), "operator content\n").unwrap();
    std::fs::set_permissions(
        ws.join("shared.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(ws.join("readme.txt"), "readable\n").unwrap();
    std::fs::set_permissions(
        ws.join("readme.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    ws
}

#[tokio::test(flavor = "multi_thread")]
async fn fs_requests_in_an_operator_workspace_have_only_the_agents_rights() {
    if !runs_contained() {
        return;
    }
    let ws = deputy_workspace();
    // The agent's own shell runs here (the control below): with allow_execute = false it would
    // not run at all (Landlock's execute right, supervisor_git_exec.rs).
    let d = deploy(&[
        (
            "supervisor",
            &format!("workspaces.ops.path=\"{}\"", ws.display()),
        ),
        ("supervisor", "workspaces.ops.allow_execute=true"),
    ])
    .await;
    let mut c = client(&d);
    let mut o = open("deputy", pb::Profile::WorkspaceWrite);
    o.workspace = "ops".into();
    let info = c.open_conversation(o.clone()).await.unwrap().into_inner();
    assert!(!info.owned);
    let root = PathBuf::from(&info.root);
    let mut t = turn("deputy", "shell", "");
    t.open = Some(o.clone());

    // The agent's own shell: no read of the secret, no write of the shared file.
    t.text = scenario(
        json!({"steps": [{"type": "tool", "kind": "execute", "ask": false,
        "via": "direct", "command":
        "cat secret.txt >/dev/null 2>&1 && echo secret=read || echo secret=denied; \
         (echo pwned > shared.txt) 2>/dev/null && echo shared=written || echo shared=denied"}]}),
    );
    let evs = run(&mut c, t.clone()).await;
    let out = tool_results(&evs).pop().map(|(_, o)| o).unwrap_or_default();
    assert!(
        out.contains("secret=denied") && out.contains("shared=denied"),
        "the control failed: the agent's shell itself reaches the files: {out}"
    );

    // fs/read_text_file of the secret: an error, never its content; of a readable file: served.
    t.turn_id = "read".into();
    t.text = scenario(json!({"steps": [
        {"type": "tool", "kind": "read", "path": root.join("secret.txt"), "ask": false, "via": "client"},
        {"type": "tool", "kind": "read", "path": root.join("readme.txt"), "ask": false, "via": "client"}]}));
    let evs = run(&mut c, t.clone()).await;
    let all = format!("{evs:?}");
    assert!(
        !all.contains("TOP-SECRET-7f3a"),
        "fs/read_text_file returned the secret"
    );
    let results = tool_results(&evs);
    assert_eq!(results.len(), 2, "{results:#?}");
    assert_eq!(results[0].0, "failed", "{results:#?}");
    assert!(
        results[0].1.contains("permission denied"),
        "{:?}",
        results[0]
    );
    assert_eq!(results[1].0, "completed", "{results:#?}");
    assert!(results[1].1.contains("readable"), "{results:#?}");
    // Each read was decided (kind read, the resolved location) and allowed by the floor.
    let reads: Vec<_> = permissions(&evs)
        .into_iter()
        .filter(|p| p.tool_kind == "read")
        .collect();
    assert_eq!(reads.len(), 2, "{reads:#?}");
    assert!(reads.iter().all(|p| p.verdict == pb::Verdict::Allow as i32));
    assert!(
        reads[0]
            .tool_title
            .ends_with(&format!("{}", root.join("secret.txt").display())),
        "{reads:#?}"
    );

    // fs/write_text_file of the shared file after a routine ALLOW (claude-0.16: tool call,
    // permission, then the client write): the ALLOW is given, the write fails, nothing changes.
    t.turn_id = "write".into();
    t.text = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": root.join("shared.txt"), "content": "pwned by the deputy\n",
         "ask": true, "via": "client"}]}));
    let evs = run(&mut c, t.clone()).await;
    let perms = permissions(&evs);
    assert!(
        perms
            .iter()
            .any(|p| p.tool_kind == "edit" && p.verdict == pb::Verdict::Allow as i32),
        "no routine ALLOW was given: {perms:#?}"
    );
    let results = tool_results(&evs);
    assert_eq!(
        results.last().map(|r| r.0.as_str()),
        Some("failed"),
        "{results:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("shared.txt")).unwrap(),
        "operator content\n",
        "fs/write_text_file overwrote a file the agent cannot write"
    );
    assert_eq!(
        std::fs::metadata(ws.join("shared.txt")).unwrap().uid(),
        0,
        "the file changed hands"
    );
    let _ = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "deputy".into(),
            principal: String::new(),
        })
        .await;
    let _ = std::fs::remove_dir_all(&ws);
}

/// Speaks the servant's own wire to a running servant through its stdio pipes, reopened from
/// `/proc` (what the agent, sharing its uid, could do): one request, one answer.
fn ask_directly(
    pid: i32,
    req: &warden_fs_servant::wire::Request,
) -> warden_fs_servant::wire::Response {
    let mut stdin = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/fd/0"))
        .unwrap();
    let mut stdout = std::fs::File::open(format!("/proc/{pid}/fd/1")).unwrap();
    stdin
        .write_all(&req.encode_length_delimited_to_vec())
        .unwrap();
    let body = warden_fs_servant::read_frame(&mut stdout, 1 << 20).unwrap();
    warden_fs_servant::wire::Response::decode(body.as_slice()).unwrap()
}

fn servant_of(root: &Path) -> Vec<i32> {
    processes_in(root, Some("warden-fs-servant"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_servant_runs_as_the_agent_and_a_read_only_bind_stops_it() {
    if !runs_contained() {
        return;
    }
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("servant", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    let agent_uid = std::fs::metadata(&root).unwrap().uid();
    assert_ne!(
        agent_uid, 0,
        "the root of a root supervisor's agent is the agent's"
    );
    assert!(servant_of(&root).is_empty(), "a servant before any fs/*");
    let evs = run(
        &mut c,
        turn(
            "servant",
            "t1",
            &scenario(json!({"steps": [
                {"type": "tool", "kind": "edit", "path": "made.txt", "content": "hello", "ask": false, "via": "client"},
                {"type": "tool", "kind": "execute", "ask": false, "via": "direct",
                 "command": "echo uid=$(id -u)"}]})),
        ),
    )
    .await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    let shell = tool_results(&evs).pop().unwrap_or_default().1;
    assert!(
        shell.contains(&format!("uid={agent_uid}")),
        "the agent is not the root's owner: {shell}"
    );
    // What the servant made is the agent's, made by the agent's own uid (nobody chowned it).
    let made = std::fs::metadata(root.join("made.txt")).unwrap();
    assert_eq!(made.uid(), agent_uid);
    assert_eq!(
        std::fs::read_to_string(root.join("made.txt")).unwrap(),
        "hello"
    );

    // Seen from the host: the servant is a process of the agent's uid with no capability.
    let servants = servant_of(&root);
    assert_eq!(servants.len(), 1, "servants: {servants:?}");
    let pid = servants[0];
    let uids = status_field(pid, "Uid").unwrap_or_default();
    assert!(
        uids.split_whitespace().all(|u| u == agent_uid.to_string()),
        "the servant's uids: {uids}"
    );
    for set in ["CapEff", "CapPrm", "CapAmb"] {
        let v = status_field(pid, set).unwrap_or_default();
        assert!(
            u64::from_str_radix(&v, 16).is_ok_and(|n| n == 0),
            "{set} of the servant: {v}"
        );
    }
    assert_eq!(status_field(pid, "NoNewPrivs").as_deref(), Some("1"));

    // Asked directly (as the agent could), it still cannot write under a read-only bind.
    use warden_fs_servant::wire::{FailureKind, Request, Write as W, request, response};
    let answer = ask_directly(
        pid,
        &Request {
            op: Some(request::Op::Write(W {
                path: root
                    .join(".claude/settings.local.json")
                    .to_string_lossy()
                    .into_owned(),
                content: b"{\"permissions\":{\"allow\":[\"Bash\"]}}".to_vec(),
            })),
        },
    );
    match answer.result {
        Some(response::Result::Failure(f)) => {
            assert_eq!(f.kind(), FailureKind::Denied, "{f:?}")
        }
        other => panic!("the servant wrote under a read-only bind: {other:?}"),
    }
    assert!(!root.join(".claude/settings.local.json").exists());

    // The supervisor still gets straight answers from it afterwards.
    let evs = run(
        &mut c,
        turn(
            "servant",
            "t2",
            &scenario(json!({"steps": [
                {"type": "tool", "kind": "read", "path": "made.txt", "ask": false, "via": "client"}]})),
        ),
    )
    .await;
    let r = tool_results(&evs).pop().unwrap_or_default();
    assert_eq!(r.0, "completed", "{r:?}");
    assert!(r.1.contains("hello"), "{r:?}");

    // The servant is the agent's to kill: the next request fails or is served by a new one,
    // and never hangs.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let t0 = std::time::Instant::now();
    let evs = run(
        &mut c,
        turn(
            "servant",
            "t3",
            &scenario(json!({"steps": [
                {"type": "tool", "kind": "read", "path": "made.txt", "ask": false, "via": "client"},
                {"type": "tool", "kind": "read", "path": "made.txt", "ask": false, "via": "client"}]})),
        ),
    )
    .await;
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));
    let r = tool_results(&evs);
    assert_eq!(r.len(), 2, "{r:#?}");
    assert_eq!(r[1].0, "completed", "a new servant serves: {r:#?}");

    // Closed: no servant is left.
    let _ = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "servant".into(),
            principal: String::new(),
        })
        .await;
    assert!(
        all_gone(&[pid], std::time::Duration::from_secs(5)).await,
        "the servant outlived its conversation"
    );
    let after = servant_of(&root);
    assert!(
        all_gone(&after, std::time::Duration::from_secs(5)).await,
        "a servant outlived its conversation: {after:?}"
    );
}
