//! gateway-bench: how fast the gateway relays a turn to an SSE client, and how much latency it adds.
//!
//! LOAD GENERATOR, NOT A SUPERVISOR: this binary contains a minimal `SupervisorService` that only
//! streams `N` message chunks for `RunTurn` (each chunk's text is the time it was handed to the
//! gRPC stream). It exists so the gateway's streaming path — gRPC client over a Unix socket, the
//! TurnEvent → A2A mapping and coalescing, the task store, the broadcast, SSE over HTTP — can be
//! measured in isolation. It is never used in tests; the end-to-end tests run the real supervisor.
//!
//! Phases, each a SendStreamingMessage over real TCP to the real router:
//! 1. burst: N chunks as fast as the generator can push them → chunks/s and SSE events/s at the
//!    client;
//! 2. paced: N chunks at a fixed rate below saturation → the latency from the generator handing a
//!    chunk to its stream to the SSE client reading it (p50/p99): the gateway's added latency,
//!    including its gRPC and HTTP hops.
//!
//! 3. waves: WAVES waves of PER_WAVE blocking SendMessage calls (50 at a time, 20 chunks per
//!    turn, a new context each), with `max_tasks` = 2 × PER_WAVE, each wave followed by one sweep
//!    → tasks stored, store size on disk and this process's RSS and open fds after each wave (the
//!    RSS includes the load generator and the client, which hold nothing per task).
//!
//! Usage: `cargo run --release -p warden-gateway --bin gateway-bench -- [CHUNKS] [PACED_RATE]
//! [WAVES] [PER_WAVE]`

#![forbid(unsafe_code)]

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};
use warden_gateway::admission::HttpState;
use warden_gateway::auth::{Authenticator, HostAllowlist, token_digest_hex};
use warden_gateway::card::{CardResponse, agent_card};
use warden_gateway::config::{EMBEDDED, GatewayConfig};
use warden_gateway::core::{Core, CoreSettings};
use warden_gateway::http::router;
use warden_gateway::store::TaskStore;
use warden_gateway::store_sled::SledStore;
use warden_proto::v1::supervisor_service_server::{SupervisorService, SupervisorServiceServer};
use warden_proto::v1::{self as pb, TurnEvent, turn_event::Event};

const TOKEN: &str = "bench-token-0123456789abcdef";

#[derive(Clone, Copy)]
enum Pace {
    Burst,
    PerSecond(u64),
}

/// The load generator (see the module comment): RunTurn streams chunks; nothing else works.
struct LoadGenerator {
    epoch: Instant,
    chunks: Arc<std::sync::atomic::AtomicUsize>,
    pace: Arc<std::sync::Mutex<Pace>>,
}

type TurnStream = Pin<Box<dyn Stream<Item = Result<TurnEvent, Status>> + Send>>;

fn ev(seq: u64, e: Event) -> TurnEvent {
    TurnEvent {
        turn_id: String::new(),
        seq,
        event: Some(e),
    }
}

#[tonic::async_trait]
impl SupervisorService for LoadGenerator {
    type RunTurnStream = TurnStream;

    async fn run_turn(
        &self,
        req: Request<pb::RunTurnRequest>,
    ) -> Result<Response<TurnStream>, Status> {
        let turn_id = req.into_inner().turn_id;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let epoch = self.epoch;
        let n = self.chunks.load(std::sync::atomic::Ordering::Relaxed);
        let pace = *self.pace.lock().map_err(|_| Status::internal("pace"))?;
        // A thread, so pacing can spin on the clock instead of relying on timer granularity.
        std::thread::spawn(move || {
            let mut seq = 1;
            let mut send = |e: Event| {
                let mut t = ev(seq, e);
                t.turn_id = turn_id.clone();
                seq += 1;
                tx.blocking_send(Ok(t)).is_ok()
            };
            send(Event::Started(pb::TurnStarted::default()));
            let start = Instant::now();
            for i in 0..n {
                if let Pace::PerSecond(rate) = pace {
                    let due = start + Duration::from_nanos(i as u64 * 1_000_000_000 / rate);
                    // Sleep most of the wait (the machine has few cores to spare), spin the rest.
                    let now = Instant::now();
                    if due > now + Duration::from_micros(300) {
                        std::thread::sleep(due - now - Duration::from_micros(200));
                    }
                    while Instant::now() < due {
                        std::hint::spin_loop();
                    }
                }
                let stamp = epoch.elapsed().as_nanos() as u64;
                if !send(Event::MessageChunk(pb::TextChunk {
                    text: format!("{stamp:016x};"),
                    ..Default::default()
                })) {
                    return;
                }
            }
            send(Event::Stop(pb::TurnStop {
                stop_reason: "end_turn".into(),
                ..Default::default()
            }));
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type AttachTurnStream = TurnStream;

    async fn attach_turn(
        &self,
        _: Request<pb::AttachTurnRequest>,
    ) -> Result<Response<TurnStream>, Status> {
        Err(Status::unimplemented("load generator"))
    }

    async fn open_conversation(
        &self,
        _: Request<pb::OpenConversationRequest>,
    ) -> Result<Response<pb::ConversationInfo>, Status> {
        Err(Status::unimplemented("load generator"))
    }
    async fn close_conversation(
        &self,
        _: Request<pb::CloseConversationRequest>,
    ) -> Result<Response<pb::CloseConversationResponse>, Status> {
        Err(Status::unimplemented("load generator"))
    }
    async fn answer_question(
        &self,
        _: Request<pb::AnswerQuestionRequest>,
    ) -> Result<Response<pb::AnswerQuestionResponse>, Status> {
        Err(Status::unimplemented("load generator"))
    }
    async fn cancel_turn(
        &self,
        _: Request<pb::CancelTurnRequest>,
    ) -> Result<Response<pb::CancelTurnResponse>, Status> {
        Err(Status::unimplemented("load generator"))
    }
    async fn list_conversations(
        &self,
        _: Request<pb::ListConversationsRequest>,
    ) -> Result<Response<pb::ListConversationsResponse>, Status> {
        Err(Status::unimplemented("load generator"))
    }
    async fn list_agents(
        &self,
        _: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        Ok(Response::new(pb::ListAgentsResponse {
            agents: vec![pb::AgentInfo {
                name: "scripted".into(),
                description: "the load generator".into(),
                ..Default::default()
            }],
            default_agent: "scripted".into(),
            ..Default::default()
        }))
    }
    async fn list_workspaces(
        &self,
        _: Request<pb::ListWorkspacesRequest>,
    ) -> Result<Response<pb::ListWorkspacesResponse>, Status> {
        Ok(Response::new(pb::ListWorkspacesResponse::default()))
    }
    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Err(Status::unimplemented("load generator"))
    }
}

struct Run {
    elapsed: Duration,
    sse_events: usize,
    chunks: usize,
    latencies_ns: Vec<u64>,
    final_state: String,
}

/// One SendStreamingMessage read to its end. HTTP/1.0 so the body is close-delimited (no
/// chunked decoding needed in this small client).
async fn stream_once(
    addr: &str,
    epoch: Instant,
    id: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    let body = serde_json::json!({"message": {"messageId": format!("bench-{id}"), "role": "ROLE_USER", "parts": [{"text": "stream"}]}}).to_string();
    let req = format!(
        "POST /a2a/rest/message:stream HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let start = Instant::now();
    sock.write_all(req.as_bytes()).await?;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut scanned = 0;
    let mut header_done = false;
    let mut run = Run {
        elapsed: Duration::ZERO,
        sse_events: 0,
        chunks: 0,
        latencies_ns: Vec::new(),
        final_state: String::new(),
    };
    let mut tmp = vec![0u8; 64 * 1024];
    loop {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        let now = epoch.elapsed().as_nanos() as u64;
        buf.extend_from_slice(&tmp[..n]);
        if !header_done {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..p]).to_string();
                if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
                    return Err(format!("unexpected response: {head}").into());
                }
                buf.drain(..p + 4);
                header_done = true;
            } else {
                continue;
            }
        }
        while let Some(p) = buf[scanned..].windows(2).position(|w| w == b"\n\n") {
            let end = scanned + p;
            let event = String::from_utf8_lossy(&buf[..end]).to_string();
            buf.drain(..end + 2);
            scanned = 0;
            for line in event.lines() {
                let Some(data) = line
                    .strip_prefix("data: ")
                    .or_else(|| line.strip_prefix("data:"))
                else {
                    continue;
                };
                run.sse_events += 1;
                let v: serde_json::Value = serde_json::from_str(data)?;
                if let Some(text) = v["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str() {
                    for stamp in text.split(';').filter(|s| !s.is_empty()) {
                        let sent = u64::from_str_radix(stamp, 16)?;
                        run.latencies_ns.push(now.saturating_sub(sent));
                        run.chunks += 1;
                    }
                }
                if let Some(s) = v["statusUpdate"]["status"]["state"].as_str() {
                    run.final_state = s.to_string();
                }
            }
        }
        scanned = buf.len().saturating_sub(1);
    }
    run.elapsed = start.elapsed();
    Ok(run)
}

/// One blocking SendMessage (HTTP/1.0); the final state.
async fn send_once(addr: &str, id: &str) -> Result<String, Box<dyn std::error::Error>> {
    let body = serde_json::json!({"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": "wave"}]}}).to_string();
    let req = format!(
        "POST /a2a/rest/message:send HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    sock.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    sock.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let (_, body) = text.split_once("\r\n\r\n").ok_or("no response body")?;
    let v: serde_json::Value = serde_json::from_str(body)?;
    Ok(v["task"]["status"]["state"]
        .as_str()
        .unwrap_or("?")
        .to_string())
}

/// A line of /proc/self/status, in kB.
fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1_000_000.0
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let chunks: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let rate: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5_000);
    let waves: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let per_wave: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let chunk_count = Arc::new(std::sync::atomic::AtomicUsize::new(chunks));
    let dir = tempfile::tempdir()?;
    let epoch = Instant::now();
    let pace = Arc::new(std::sync::Mutex::new(Pace::Burst));

    let sock = dir.path().join("loadgen.sock");
    let listener = tokio::net::UnixListener::bind(&sock)?;
    let generator = LoadGenerator {
        epoch,
        chunks: chunk_count.clone(),
        pace: pace.clone(),
    };
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(SupervisorServiceServer::new(generator))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });

    let loaded =
        warden_daemon::config::load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_BENCH", &[])?;
    let cfg = loaded.value;
    let store: TaskStore = std::sync::Arc::new(SledStore::open(&dir.path().join("store"))?);
    let core = Core::new(
        store,
        warden_daemon::client::unix_channel(&sock),
        CoreSettings {
            agents: vec!["scripted".into()],
            default_agent: "scripted".into(),
            turn_timeout_seconds: 0,
            cancel_grace: Duration::from_secs(5),
            coalesce_bytes: warden_gateway::mapping::DEFAULT_COALESCE_BYTES,
            retention: warden_gateway::core::Retention {
                max_tasks: 2 * per_wave.max(1),
                ..warden_gateway::core::Retention::default()
            },
            max_streams_per_principal: 1024,
            stream_keepalive: Duration::from_secs(15),
        },
    );
    let digest = token_digest_hex(TOKEN);
    let app = router(Arc::new(HttpState {
        core: core.clone(),
        auth: Authenticator::from_digests([("bench", digest.as_str())]),
        hosts: HostAllowlist::off(),
        max_body: 1 << 20,
        body_timeout: Duration::from_secs(30),
        card: CardResponse::new(&agent_card(&cfg), 60),
    }));
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = http.local_addr()?.to_string();
    let limits = warden_gateway::serve::EdgeLimits {
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_connections: 4096,
        max_unauthenticated_connections: 256,
        max_connections_per_principal: 4096 - 256,
        max_grpc_requests_per_principal: 4096 - 256,
        grpc_max_concurrent_streams: 128,
    };
    tokio::spawn(warden_gateway::serve::serve(
        http,
        app,
        limits,
        Authenticator::from_digests([("bench", digest.as_str())]),
        tokio_util::sync::CancellationToken::new(),
    ));

    println!(
        "gateway-bench: {chunks} chunks per turn; supervisor side is a LOAD GENERATOR (see source)"
    );
    // Warm-up (connections, allocator).
    stream_once(&addr, epoch, 0).await?;

    let burst = stream_once(&addr, epoch, 1).await?;
    let secs = burst.elapsed.as_secs_f64();
    println!(
        "burst:  {} chunks in {:.1} ms -> {:.0} chunks/s end to end; {} SSE events ({:.0} events/s, coalesced); final {}",
        burst.chunks,
        secs * 1000.0,
        burst.chunks as f64 / secs,
        burst.sse_events,
        burst.sse_events as f64 / secs,
        burst.final_state
    );

    if let Ok(mut p) = pace.lock() {
        *p = Pace::PerSecond(rate);
    }
    let paced = stream_once(&addr, epoch, 2).await?;
    let mut lat = paced.latencies_ns.clone();
    lat.sort_unstable();
    println!(
        "paced:  {} chunks at {rate}/s in {} SSE events; added latency per chunk p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; final {}",
        paced.chunks,
        paced.sse_events,
        pct(&lat, 0.50),
        pct(&lat, 0.99),
        pct(&lat, 1.0),
        paced.final_state
    );

    chunk_count.store(20, std::sync::atomic::Ordering::Relaxed);
    println!(
        "waves:  {waves} x {per_wave} tasks (20 chunks each, 50 concurrent), max_tasks {}, one sweep after each wave",
        2 * per_wave
    );
    println!("        wave  tasks/s  stored  store_bytes  rss_kB  fds");
    for wave in 0..waves {
        let t0 = Instant::now();
        let sem = Arc::new(tokio::sync::Semaphore::new(50));
        let mut handles = Vec::new();
        for i in 0..per_wave {
            let permit = sem.clone().acquire_owned().await?;
            let addr = addr.clone();
            handles.push(tokio::spawn(async move {
                let r = send_once(&addr, &format!("wave-{wave}-{i}")).await;
                drop(permit);
                r.map_err(|e| e.to_string())
            }));
        }
        for h in handles {
            let state = h.await??;
            if state != "TASK_STATE_COMPLETED" {
                return Err(format!("a wave task ended {state}").into());
            }
        }
        let rate = per_wave as f64 / t0.elapsed().as_secs_f64();
        core.sweep(warden_gateway::time::now_micros()).await?;
        println!(
            "        {:>4}  {:>7.0}  {:>6}  {:>11}  {:>6}  {:>3}",
            wave + 1,
            rate,
            core.store().task_count().await?,
            core.store().size_on_disk().unwrap_or(0),
            proc_status_kb("VmRSS:"),
            open_fds()
        );
    }
    if burst.chunks != chunks || paced.chunks != chunks {
        return Err(format!(
            "lost chunks: burst {} paced {} of {chunks}",
            burst.chunks, paced.chunks
        )
        .into());
    }
    Ok(())
}
