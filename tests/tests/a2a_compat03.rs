//! A2A 0.3 callers on the same endpoints: the Python `a2a-sdk` 0.3.x (its own virtual
//! environment, `<target>/venv-a2a03`, made by `.ci/run`) over JSON-RPC (`message/send`, …, no
//! `A2A-Version` header) and REST (`/v1/…`), against the real daemons: card with the 0.3
//! fields, blocking send, get, non-blocking send and cancel, streaming ending `final`, resubscribe
//! to a task waiting for input, and a loopback webhook refused.
//!
//! Without the environment the test fails under CI (`CI` set) and is skipped, saying so, elsewhere
//! (`WARDEN_A2A03_PYTHON` may name another interpreter with a2a-sdk 0.3 installed).

use std::path::PathBuf;
use std::time::Duration;

use warden_e2e::{Deployment, Options, bin_dir, run_with_deadline};

fn python03() -> Result<PathBuf, String> {
    let p = match std::env::var_os("WARDEN_A2A03_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => bin_dir()
            .parent()
            .map(|t| t.join("venv-a2a03/bin/python"))
            .ok_or("no target directory")?,
    };
    let ok = std::process::Command::new(&p)
        .args(["-c", "import a2a.client, a2a.types"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(p)
    } else {
        Err(format!(
            "{} cannot import a2a-sdk 0.3 (`.ci/run` creates that venv with a2a-sdk==0.3.26)",
            p.display()
        ))
    }
}

#[tokio::test]
async fn a_0_3_client_works_over_json_rpc_and_rest() {
    let py = match python03() {
        Ok(p) => p,
        Err(why) if std::env::var_os("CI").is_some() => panic!("{why}"),
        Err(why) => {
            eprintln!("SKIPPED a2a_compat03: {why}");
            return;
        }
    };
    let d = Deployment::up(Options::default()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("a2a/sdk03_client.py");
    for transport in ["JSONRPC", "HTTP+JSON"] {
        let mut cmd = tokio::process::Command::new(&py);
        cmd.arg(&script)
            .arg(format!("http://{}", d.http))
            .arg(d.token())
            .arg(transport);
        let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
            .await
            .expect("the 0.3 client runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{transport}: a2a-sdk 0.3 client failed\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!(
                "ok   {transport} resubscribe follows to completed"
            )),
            "{stdout}"
        );
    }
}
