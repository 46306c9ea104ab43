//! The official A2A JavaScript SDK (`@a2a-js/sdk` 1.3.0, installed by `.ci/run` under
//! `<target>/npm/a2a-js-sdk-1.3.0`) against the real daemons over JSON-RPC and HTTP+JSON: send,
//! get, list, cancel, stream, the extended card, and a loopback webhook refused.
//!
//! Without node or the installed SDK the test fails under CI (`CI` set) and is skipped, saying
//! so, elsewhere (`WARDEN_A2A_JS_SDK` may name another npm prefix holding the SDK).

use std::path::PathBuf;
use std::time::Duration;

use warden_e2e::{Deployment, Options, bin_dir, run_with_deadline};

fn sdk() -> Result<(PathBuf, PathBuf), String> {
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("node is not installed")?;
    let dir = match std::env::var_os("WARDEN_A2A_JS_SDK") {
        Some(p) => PathBuf::from(p),
        None => bin_dir()
            .parent()
            .map(|t| t.join("npm/a2a-js-sdk-1.3.0"))
            .ok_or("no target directory")?,
    };
    if !dir
        .join("node_modules/@a2a-js/sdk/dist/client/index.js")
        .is_file()
    {
        return Err(format!(
            "@a2a-js/sdk is not installed under {} (`.ci/run` installs @a2a-js/sdk@1.3.0 there)",
            dir.display()
        ));
    }
    Ok((node, dir))
}

#[tokio::test]
async fn the_js_a2a_sdk_works_over_json_rpc_and_rest() {
    let (node, dir) = match sdk() {
        Ok(s) => s,
        Err(why) if std::env::var_os("CI").is_some() => panic!("{why}"),
        Err(why) => {
            eprintln!("SKIPPED a2a_js_sdk: {why}");
            return;
        }
    };
    let d = Deployment::up(Options::default()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("a2a/js_sdk_client.mjs");
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let mut cmd = tokio::process::Command::new(&node);
        cmd.arg(&script)
            .arg(format!("http://{}", d.http))
            .arg(d.token())
            .arg(binding)
            .arg(&dir);
        let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
            .await
            .expect("node runs the SDK client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{binding}: @a2a-js/sdk client failed\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(&format!("ok   {binding} all checks")),
            "{stdout}"
        );
    }
}
