//! The whole chain, measured: the real warden-policy, warden-supervisor and warden-gateway (started
//! by the shared harness as `warden up` starts them) with the scripted agent streaming 10,000
//! message chunks from a scenario file.
//!
//! 1. the supervisor's own stream: RunTurn straight to the supervisor socket, chunks/s;
//! 2. the same turn through the gateway to an SSE client: chunks/s, SSE events/s, and how much
//!    longer the whole turn took than the supervisor's own stream.
//!
//! Per-chunk added latency (p50/p99) needs both ends' clocks on the same chunk, which only the
//! `gateway-bench` binary (load generator in place of the supervisor) can give.
//!
//! Run: `cargo bench -p warden-gateway --bench chain [-- CHUNKS]`

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_e2e::{Deployment, Options};
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::{OpenConversationRequest, Profile, RunTurnRequest, turn_event::Event};

async fn direct(d: &Deployment, n: usize) -> Result<(usize, Duration), Box<dyn std::error::Error>> {
    let mut client = SupervisorServiceClient::new(d.channel("supervisor"));
    let ctx = format!("bench-direct-{}", uuid::Uuid::new_v4());
    let req = RunTurnRequest {
        instructions: String::new(),
        context_id: ctx.clone(),
        turn_id: "turn-1".into(),
        text: "stream".into(),
        message_id: "bench-direct".into(),
        task_id: "turn-1".into(),
        timeout_seconds: 0,
        open: Some(OpenConversationRequest {
            context_id: ctx,
            agent: String::new(),
            workspace: String::new(),
            profile: Profile::WorkspaceWrite as i32,
            principal: "bench".into(),
            verb: "task".into(),
            ..Default::default()
        }),
        groups: Vec::new(),
        issuer: String::new(),
    };
    let mut stream = client.run_turn(req).await?.into_inner();
    let mut chunks = 0;
    let mut start = None;
    let mut end = Instant::now();
    while let Some(ev) = stream.next().await {
        match ev?.event {
            Some(Event::MessageChunk(c)) => {
                start.get_or_insert_with(Instant::now);
                chunks += c.text.matches(';').count();
            }
            Some(Event::Stop(s)) => {
                end = Instant::now();
                if s.stop_reason != "end_turn" {
                    return Err(
                        format!("direct turn stopped: {} {:?}", s.stop_reason, s.fault).into(),
                    );
                }
            }
            _ => {}
        }
    }
    let _ = n;
    Ok((chunks, end - start.unwrap_or(end)))
}

async fn through_gateway(
    d: &Deployment,
) -> Result<(usize, usize, Duration, String), Box<dyn std::error::Error>> {
    let body = json!({"message": {"messageId": "bench-gw", "role": "ROLE_USER", "parts": [{"text": "stream"}]}}).to_string();
    let req = format!(
        "POST /a2a/rest/message:stream HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\nA2A-Version: 1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        d.http,
        d.token(),
        body.len()
    );
    let mut sock = tokio::net::TcpStream::connect(&d.http).await?;
    sock.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 65536];
    let mut start = None;
    let mut end = Instant::now();
    loop {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        if start.is_none() && tmp[..n].windows(14).any(|w| w == b"artifactUpdate") {
            start = Some(Instant::now());
        }
        end = Instant::now();
        buf.extend_from_slice(&tmp[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let mut events = 0;
    let mut chunks = 0;
    let mut last_state = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        events += 1;
        let v: serde_json::Value = serde_json::from_str(data)?;
        if let Some(t) = v["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str() {
            chunks += t.matches(';').count();
        }
        if let Some(s) = v["statusUpdate"]["status"]["state"].as_str() {
            last_state = s.to_string();
        }
    }
    Ok((chunks, events, end - start.unwrap_or(end), last_state))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let mut d = Deployment::new(Options::default());
    let file = d.dir.path().join("chunks.json");
    let mut steps: Vec<serde_json::Value> = (0..n)
        .map(|i| json!({"type": "message", "text": format!("{i:05};")}))
        .collect();
    steps.push(json!({"type": "stop", "reason": "end_turn"}));
    std::fs::write(&file, json!({"steps": steps}).to_string())?;
    // The supervisor passes WARDEN_SCENARIO through to the scripted agent (operator allowlist).
    unsafe { std::env::set_var("WARDEN_SCENARIO", &file) };
    // Under bubblewrap (the default) the agent reads only what the operator binds; a long stream
    // needs more than the default per-turn output bound.
    d.opts.sets.push((
        "supervisor".into(),
        format!("agents.scripted.read_only_paths=[\"{}\"]", file.display()),
    ));
    d.opts
        .sets
        .push(("supervisor".into(), "limits.output_bytes=1073741824".into()));
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    println!(
        "chain bench: real policy + supervisor + gateway, scripted agent streaming {n} chunks"
    );
    let (dc, dt) = direct(&d, n).await?;
    println!(
        "supervisor stream (RunTurn direct): {dc} chunks in {:.1} ms -> {:.0} chunks/s",
        dt.as_secs_f64() * 1e3,
        dc as f64 / dt.as_secs_f64()
    );
    let (gc, ev, gt, state) = through_gateway(&d).await?;
    println!(
        "through the gateway (SSE client):   {gc} chunks in {:.1} ms -> {:.0} chunks/s, {ev} SSE events ({:.0} events/s), final {state}",
        gt.as_secs_f64() * 1e3,
        gc as f64 / gt.as_secs_f64(),
        ev as f64 / gt.as_secs_f64()
    );
    println!(
        "gateway overhead on the whole turn: {:+.1} ms ({:+.3} ms per chunk)",
        (gt.as_secs_f64() - dt.as_secs_f64()) * 1e3,
        (gt.as_secs_f64() - dt.as_secs_f64()) * 1e3 / n as f64
    );
    if dc != n || gc != n {
        return Err(format!("lost chunks: direct {dc}, gateway {gc}, of {n}").into());
    }
    Ok(())
}
