//! warden-acp against an independently written agent on the official Python
//! ACP SDK (`pip install agent-client-protocol`). CI installs the SDK; when it
//! is missing this test FAILS with the install command rather than skipping.

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::Value;
use warden_acp::*;

fn python() -> String {
    std::env::var("WARDEN_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn peer_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/py_agent.py")
}

fn require_sdk() {
    let out = std::process::Command::new(python())
        .args(["-c", "import acp; from acp import run_agent"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the Python ACP SDK is not importable with {} ({}). Install it: `pip install agent-client-protocol`",
            python(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run {}: {e}. Install Python 3.10+ and `pip install agent-client-protocol`",
            python()
        ),
    }
}

async fn start_peer(pick: Pick) -> Harness {
    require_sdk();
    let dir = tempfile::tempdir().unwrap();
    let handler = TestHandler::new(dir.path(), vec![], pick);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(peer_script()).current_dir(dir.path());
    let mut h = connect(cmd, handler, dir, config());
    let caps = ClientCapabilities {
        fs: FsCapabilities {
            read_text_file: true,
            write_text_file: true,
        },
        terminal: true,
        elicitation: false,
    };
    h.client
        .initialize(caps)
        .await
        .expect("initialize the python peer");
    h.session = h
        .client
        .new_session(&h.cwd())
        .await
        .expect("session/new")
        .session_id;
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_peer_permission_fs_and_terminal() {
    let mut h = start_peer(Pick::Kind(PermissionOptionKind::AllowOnce)).await;
    let r = h
        .client
        .prompt(&h.session, "do it", Value::Null)
        .await
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    let ev = h.drain();
    let msgs = messages(&ev);
    assert_eq!(
        msgs.first().map(String::as_str),
        Some("python peer starting")
    );
    assert_eq!(
        msgs.last().map(String::as_str),
        Some("read back: from python peer | terminal exit 0: from-terminal")
    );
    assert!(
        updates(&ev)
            .iter()
            .any(|e| matches!(e, SessionEvent::ToolCall(t)
        if t.kind == ToolKind::Edit && t.locations[0].path.ends_with("peer.txt")))
    );
    assert_eq!(
        std::fs::read_to_string(h.cwd().join("peer.txt")).unwrap(),
        "from python peer\n"
    );
    let calls = h.handler.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            "fs/write_text_file",
            "fs/read_text_file",
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    let t = h.client.permission_timings();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].answer, PermissionAnswer::Selected("py-once".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_peer_sees_refusal_and_cancel() {
    let mut h = start_peer(Pick::Kind(PermissionOptionKind::RejectOnce)).await;
    h.client
        .prompt(&h.session, "do it", Value::Null)
        .await
        .unwrap();
    assert_eq!(
        messages(&h.drain()).last().unwrap(),
        "peer refused: selected py-no"
    );
    assert!(!h.cwd().join("peer.txt").exists());

    // A pending permission answered `cancelled` by our cancel reaches the peer
    // as a proper outcome.
    let h = start_peer(Pick::Hang).await;
    let c = h.client.clone();
    let sid = h.session.clone();
    let p = tokio::spawn(async move { c.prompt(&sid, "do it", Value::Null).await });
    for _ in 0..500 {
        if h.client.pending_permissions() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let rep = h.client.cancel(&h.session).await.unwrap();
    assert_eq!(rep.permissions_cancelled, 1);
    // The SDK peer ignores session/cancel and reports the cancelled outcome: end_turn.
    assert_eq!(
        rep.outcome,
        CancelOutcome::PromptEnded(PromptEnd::Answered(StopReason::EndTurn))
    );
    p.await.unwrap().unwrap();
}
