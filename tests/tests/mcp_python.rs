//! The official Python MCP client (`mcp` 2.3.0, `.ci/requirements.txt`) against the real daemons:
//! over streamable HTTP in both protocol eras (a 2025-11-25 session, 2026-07-28 stateless) and
//! through `warden mcp` as a stdio server (both eras, and from inside a warden-run agent, where
//! the inherited depth marker gets every verb refused). The script is `tests/mcp/mcp_client.py`:
//! tools/list and schemas, each era's verb call with progress, a model-supplied workspace
//! refused, the agent's question as elicitation, bind_workspace accepted / declined / `/` and a
//! home refused, status with the binding. When the client is missing this test FAILS with the
//! install command rather than skipping.

use std::path::{Path, PathBuf};
use std::time::Duration;

use warden_e2e::{Deployment, Options, run_with_deadline};
use warden_proto::v1 as pb;

fn python() -> String {
    std::env::var("WARDEN_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn require_client() {
    let out = std::process::Command::new(python())
        .args(["-c", "import mcp, httpx2; from mcp import Client"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the Python MCP client is not importable with {} ({}). Install it: `pip install mcp==2.3.0`",
            python(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run {}: {e}. Install Python 3.10+ and `pip install mcp==2.3.0`",
            python()
        ),
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/mcp_client.py")
}

async fn run(args: &[String]) -> String {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script()).args(args);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(180))
        .await
        .expect("the MCP client runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mcp client {args:?} failed\n{stdout}\n{stderr}"
    );
    stdout
}

/// A deployment with one operator workspace the MCP caller may bind.
async fn deploy() -> (Deployment, tempfile::TempDir) {
    let ws = tempfile::Builder::new()
        .prefix("ws")
        .tempdir_in(warden_e2e::test_root())
        .unwrap();
    let opts = Options {
        sets: vec![(
            "supervisor".into(),
            format!("workspaces.proj.path={:?}", ws.path().display().to_string()),
        )],
        ..Default::default()
    };
    (Deployment::up(opts).await, ws)
}

async fn roots(d: &Deployment) -> Vec<String> {
    pb::supervisor_service_client::SupervisorServiceClient::new(d.channel("supervisor"))
        .list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
        .into_iter()
        .map(|c| c.root)
        .collect()
}

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap().display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_client_in_both_eras_over_http() {
    require_client();
    let (d, ws) = deploy().await;
    let url = format!("http://{}/mcp", d.http);
    for mode in ["legacy", "2026-07-28"] {
        let out = run(&[
            "http".into(),
            url.clone(),
            d.token(),
            mode.into(),
            ws.path().display().to_string(),
        ])
        .await;
        for want in [
            "advise",
            "progress notifications",
            "a model-supplied workspace is refused",
            "bind accepted",
            "bind declined",
            "rebinding cleared the previous binding",
            "a proposed / is refused without asking",
            "a verb runs in the bound workspace",
        ] {
            assert!(
                out.contains(&format!("ok   http {mode} {want}")),
                "{mode}: {want}\n{out}"
            );
        }
        // A session asks with a server request, the stateless era with an input-required
        // result the client answers by retrying.
        for want in [
            "the answer reached the agent",
            "a binding is void once the path names another directory",
        ] {
            assert!(
                out.contains(&format!("ok   http {mode} {want}")),
                "{want}\n{out}"
            );
        }
    }
    // The bound runs ran in the operator workspace itself, not in a sandbox.
    assert!(
        roots(&d).await.contains(&canonical(ws.path())),
        "{:?}",
        roots(&d).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn warden_mcp_is_a_stdio_server_for_the_python_client() {
    require_client();
    let (d, ws) = deploy().await;
    let warden = warden_e2e::binary("warden").display().to_string();
    // As `warden up` does: `warden mcp` finds the gateway through this file.
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let state = d.layout.root.display().to_string();
    let out = run(&[
        "stdio".into(),
        warden.clone(),
        state.clone(),
        "legacy".into(),
        "-".into(),
        ws.path().display().to_string(),
    ])
    .await;
    for want in [
        "advise",
        "the agent's question reached the caller",
        "bind accepted",
        "a proposed / is refused without asking",
    ] {
        assert!(
            out.contains(&format!("ok   stdio legacy {want}")),
            "{want}\n{out}"
        );
    }
    let out = run(&["stdio".into(), warden.clone(), state.clone(), "auto".into()]).await;
    assert!(out.contains("ok   stdio auto advise"), "{out}");
    // Inside a warden-run agent (WARDEN_DEPTH=1 inherited): refused before anything is spawned.
    let before = roots(&d).await.len();
    let out = run(&["stdio".into(), warden, state, "legacy".into(), "1".into()]).await;
    assert!(
        out.contains("a call from inside a warden agent is refused"),
        "{out}"
    );
    assert_eq!(roots(&d).await.len(), before, "no conversation was opened");
}
