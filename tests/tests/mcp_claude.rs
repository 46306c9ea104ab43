//! docs/mcp.md's worked example with the real Claude Code CLI: `claude mcp add warden -- warden
//! mcp`, `claude mcp list` (Claude Code starts `warden mcp` and checks it), then a headless
//! `claude -p` whose model (the scripted fake Anthropic server, `tests/fake_models/`, offline)
//! calls `mcp__warden__review`: Claude Code → `warden mcp` → the gateway's `/mcp` → the
//! supervisor → the scripted agent, and the policy's refusal comes back in the envelope.
//!
//! The CLI is the one bundled in `@anthropic-ai/claude-agent-sdk`, which `.ci/run` installs with
//! the pinned ACP adapter under `<target>/npm/`. Outside CI a missing install is a printed skip;
//! under CI (`CI=true`) it fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use warden_e2e::{Deployment, Options, bin_dir, binary, run_with_deadline};

const CLI: &str = "npm/claude-code-acp-0.16.2/node_modules/@anthropic-ai/claude-agent-sdk/cli.js";

fn claude_cli() -> Option<PathBuf> {
    let p = bin_dir().parent()?.join(CLI);
    if p.is_file() && Path::new("/usr/bin/node").is_file() {
        return Some(p);
    }
    let why = format!(
        "{} (or node) is missing (`.ci/run` installs it)",
        p.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// The fake model server; killed when dropped.
struct FakeModel {
    _child: tokio::process::Child,
    port: u16,
}

async fn fake_anthropic(dir: &Path) -> FakeModel {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake_models/fake_anthropic.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(dir.join("fake-anthropic.jsonl"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs the fake model server");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(out).read_line(&mut line),
    )
    .await
    .expect("the fake model says its port")
    .unwrap();
    FakeModel {
        _child: child,
        port: line.trim().parse().expect("a port"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_adds_warden_mcp_and_calls_review_through_it() {
    let Some(cli) = claude_cli() else {
        return;
    };
    let d = Deployment::up(Options::default()).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let model = fake_anthropic(d.dir.path()).await;
    let home = d.dir.path().join("claude-home");
    std::fs::create_dir_all(&home).unwrap();
    let warden = binary("warden");
    let claude = |args: &[&str]| {
        let mut c = tokio::process::Command::new("node");
        c.arg(&cli)
            .args(args)
            .current_dir(&home)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("CLAUDE_CONFIG_DIR", home.join(".claude"))
            .env("WARDEN_STATE_DIR", &d.layout.root)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", model.port),
            )
            .env("ANTHROPIC_API_KEY", "sk-fake-for-tests")
            .env("DISABLE_AUTOUPDATER", "1")
            .stdin(Stdio::null());
        c
    };
    let run = |mut c: tokio::process::Command| async move {
        let out = run_with_deadline(&mut c, Duration::from_secs(120))
            .await
            .expect("claude runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let warden = warden.display().to_string();
    let out = run(claude(&["mcp", "add", "warden", "--", &warden, "mcp"])).await;
    assert!(out.contains("Added stdio MCP server warden"), "{out}");
    let out = run(claude(&["mcp", "list"])).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("warden:") && l.contains("Connected")),
        "{out}"
    );
    let prompt = r#"SCRIPT {"steps": [{"tool": ["mcp__warden__review"], "input": {"task": "write notes.txt"}}], "final": "warden reviewed it"}"#;
    let out = run(claude(&[
        "-p",
        prompt,
        "--allowedTools",
        "mcp__warden__review",
        "--output-format",
        "stream-json",
        "--verbose",
    ]))
    .await;
    let events: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let result = events
        .iter()
        .filter(|e| e["type"] == "user")
        .flat_map(|e| {
            e["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|c| c["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {out}"));
    let text = match &result["content"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => panic!("{other}"),
    };
    let envelope: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(envelope["verb"], "review", "{envelope}");
    let policy = envelope["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["kind"] == "policy")
        .unwrap_or_else(|| panic!("{envelope}"));
    assert_eq!(policy["rule"], "floor.profile.read-only");
    let last = events.iter().rev().find(|e| e["type"] == "result").unwrap();
    assert_eq!(last["result"], "warden reviewed it", "{last}");
}
