//! Permission round-trip figures: spawns `warden-scripted-agent`, runs one
//! turn with N permission requests answered at once (allow_once), and prints
//! percentiles of the client-side time (request read -> answer queued) and the
//! agent-side round trip (request written -> answer read, from its report).
//!
//! `cargo build -p warden-scripted-agent && cargo run -p warden-acp --example permission_rtt -- [N] [AGENT]`

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden_acp::*;

struct AllowOnce;

impl ClientHandler for AllowOnce {
    async fn request_permission(
        &self,
        req: PermissionRequest,
    ) -> Result<PermissionOutcome, RpcError> {
        match req
            .selectable_options()
            .find(|o| o.kind == PermissionOptionKind::AllowOnce)
        {
            Some(o) => Ok(PermissionOutcome::Selected {
                option_id: o.option_id.clone(),
            }),
            None => Err(RpcError::internal("no allow_once option")),
        }
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn line(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name:<34} n={:<5} p50={:>8.1?} p95={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.95),
        pct(&v, 0.99),
        v.last().copied().unwrap_or_default()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let agent = match args.next() {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .map(|d| d.join("warden-scripted-agent"))
            .ok_or("cannot locate the target directory")?,
    };
    if !agent.exists() {
        return Err(format!(
            "{} not found: cargo build -p warden-scripted-agent",
            agent.display()
        )
        .into());
    }
    let dir = tempfile::tempdir()?;
    let steps: Vec<Value> = (0..n)
        .map(
            |i| json!({"type": "tool", "kind": "other", "title": format!("step {i}"), "ask": true}),
        )
        .collect();
    let scenario = json!({"vocabulary": "claude-0.101", "report": "rtt.jsonl", "steps": steps});

    let mut child = tokio::process::Command::new(&agent)
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (client, mut events) =
        AcpClient::connect(stdout, stdin, Arc::new(AllowOnce), ClientConfig::default());
    tokio::spawn(async move { while events.recv().await.is_some() {} });

    let t0 = Instant::now();
    client.initialize(ClientCapabilities::default()).await?;
    let init = t0.elapsed();
    let cwd = dir.path().canonicalize()?;
    let session = client.new_session(&cwd).await?;
    let t1 = Instant::now();
    let resp = client
        .prompt(&session.session_id, &scenario.to_string(), Value::Null)
        .await?;
    let turn = t1.elapsed();
    assert_eq!(resp.stop_reason, StopReason::EndTurn);

    let client_side: Vec<Duration> = client
        .permission_timings()
        .iter()
        .map(|t| t.elapsed)
        .collect();
    let agent_side: Vec<Duration> = std::fs::read_to_string(cwd.join("rtt.jsonl"))?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["rtt_us"].as_u64())
        .map(Duration::from_micros)
        .collect();
    println!("agent: {}  permissions: {n}", agent.display());
    println!(
        "initialize: {init:.1?}   turn with {n} permissions: {turn:.1?} ({:.0}/s)",
        n as f64 / turn.as_secs_f64()
    );
    line("client: received -> answered", client_side);
    line("agent: request -> answer (RTT)", agent_side);
    client.close_stdin();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    Ok(())
}
