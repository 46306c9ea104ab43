//! The official A2A Python SDK (`a2a-sdk` 1.3.0, which speaks A2A 1.0) against a `warden up`-style
//! deployment of the three real daemons: send, stream, get, list and cancel over JSON-RPC,
//! HTTP+JSON and gRPC (the gateway's `[grpc]` listener on TCP, found by the SDK on the card). CI installs the SDK (`.ci/requirements.txt`); when it is missing this test FAILS
//! with the install command rather than skipping.

use std::path::PathBuf;
use std::time::Duration;

use warden_e2e::{Deployment, Options, run_with_deadline};

fn python() -> String {
    std::env::var("WARDEN_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn require_sdk() {
    let out = std::process::Command::new(python())
        .args(["-c", "import a2a.client, a2a.types, httpx, grpc"])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the A2A Python SDK is not importable with {} ({}). Install it: `pip install 'a2a-sdk[grpc]==1.3.0'`",
            python(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run {}: {e}. Install Python 3.10+ and `pip install 'a2a-sdk[grpc]==1.3.0'`",
            python()
        ),
    }
}

#[tokio::test]
async fn the_python_a2a_sdk_sends_streams_gets_lists_and_cancels_on_all_three_bindings() {
    require_sdk();
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = Deployment::up(Options {
        sets: vec![
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
        ],
        ..Options::default()
    })
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/a2a_sdk/sdk_client.py");
    for binding in ["JSONRPC", "HTTP+JSON", "GRPC"] {
        let mut cmd = tokio::process::Command::new(python());
        cmd.arg(&script)
            .arg(format!("http://{}", d.http))
            .arg(d.token())
            .arg(binding);
        let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
            .await
            .expect("the SDK client runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{binding}: a2a-sdk client failed\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!("ok   {binding} stream ends COMPLETED")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("ok   {binding} cancel")),
            "{stdout}"
        );
    }
}
