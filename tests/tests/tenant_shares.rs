//! Issue 31 case 4, "one principal's streams lock everyone out", and issue 30's keep-alive: two
//! principals (`alice`, `bob`, each with its own token) against the real daemons, with the
//! shares lowered by configuration so the test is quick.
//!
//! - alice holds her whole stream share on her own hanging task: her next stream is refused in
//!   each protocol's shape (HTTP 429 with a JSON-RPC error, a `google.rpc.Status` body, gRPC
//!   RESOURCE_EXHAUSTED, `/mcp`'s JSON-RPC error) and nothing of it is stored, while bob's
//!   requests and his own streams are served at once; the same for her connection share; her
//!   share comes back when she lets go.
//! - a slowloris of half-sent headers, far more connections than the gateway's whole cap, while
//!   every one of bob's requests is answered.
//! - a silent stream (a hanging task, an MCP session's own stream) hears a keep-alive within the
//!   configured interval: an SSE comment on A2A and `/mcp`, the current status on A2A gRPC.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use warden_e2e::{Deployment, Options};
use warden_proto::a2a::v1 as pb;
use warden_proto::a2a::v1::a2a_service_client::A2aServiceClient;

const ALICE: &str = "alice-token-shares-0123456789";
const BOB: &str = "bob-token-shares-9876543210";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

async fn up(sets: &[&str]) -> Deployment {
    let mut all: Vec<(String, String)> = sets
        .iter()
        .map(|s| ("gateway".to_string(), s.to_string()))
        .collect();
    all.push((
        "gateway".into(),
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    ));
    Deployment::up(Options {
        sets: all,
        ..Options::default()
    })
    .await
}

fn hang() -> String {
    json!({"steps": [{"type": "message", "text": "started"}, {"type": "hang"}]}).to_string()
}

fn quick(text: &str) -> String {
    json!({"steps": [{"type": "message", "text": text}, {"type": "stop", "reason": "end_turn"}]})
        .to_string()
}

fn message(id: &str, text: &str) -> Value {
    json!({"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]}})
}

fn rpc_body(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

/// Writes one request on a fresh connection. HTTP/1.0 (the connection ends with the response,
/// an SSE body is plain text) unless `keep_alive`.
async fn send(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
    keep_alive: bool,
) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    write_request(&mut sock, addr, method, path, token, body, keep_alive).await;
    sock
}

async fn write_request(
    sock: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
    keep_alive: bool,
) {
    let version = if keep_alive { "1.1" } else { "1.0" };
    let mut req = format!(
        "{method} {path} HTTP/{version}\r\nHost: {addr}\r\nA2A-Version: 1.0\r\nAccept: application/json, text/event-stream\r\n"
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let b = body.unwrap_or("");
    req.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    ));
    sock.write_all(req.as_bytes()).await.expect("write request");
}

/// A response head read off `sock`: status, head text, and what followed it.
async fn read_head(sock: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_string();
            let rest = buf[p + 4..].to_vec();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            return (status, head, rest);
        }
        let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut tmp))
            .await
            .expect("a response head within 30 s")
            .expect("read");
        assert!(n > 0, "closed before a response head: {buf:?}");
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// One whole HTTP/1.0 answer: status and body.
async fn call(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let mut sock = send(addr, method, path, Some(token), body, false).await;
    let (status, _, mut rest) = read_head(&mut sock).await;
    tokio::time::timeout(Duration::from_secs(60), sock.read_to_end(&mut rest))
        .await
        .expect("a body within 60 s")
        .expect("read body");
    (status, serde_json::from_slice(&rest).unwrap_or(Value::Null))
}

async fn rpc(addr: &str, token: &str, method: &str, params: Value) -> (u16, Value) {
    call(
        addr,
        "POST",
        "/a2a/jsonrpc",
        token,
        Some(&rpc_body(method, params)),
    )
    .await
}

/// An open SSE response (HTTP/1.0: its body is the event text itself).
struct Sse {
    sock: TcpStream,
    buf: Vec<u8>,
}

impl Sse {
    async fn open(addr: &str, token: &str, method: &str, path: &str, body: Option<&str>) -> Self {
        let mut sock = send(addr, method, path, Some(token), body, false).await;
        let (status, head, buf) = read_head(&mut sock).await;
        assert_eq!(status, 200, "{head}");
        assert!(
            head.to_ascii_lowercase().contains("text/event-stream"),
            "{head}"
        );
        Sse { sock, buf }
    }

    /// The next event (data lines as JSON, or `Value::Null` for a comment), within `within`.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(p) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event = String::from_utf8_lossy(&self.buf[..p]).to_string();
                self.buf.drain(..p + 2);
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
                    .collect();
                if data.is_empty() {
                    return Some(Value::Null);
                }
                return Some(serde_json::from_str(&data.join("\n")).expect("SSE data is JSON"));
            }
            let mut tmp = [0u8; 16384];
            let n = tokio::time::timeout_at(deadline, self.sock.read(&mut tmp))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// The next data event, skipping comments.
    async fn next_data(&mut self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            match self.next(deadline - Instant::now()).await? {
                Value::Null => continue,
                v => return Some(v),
            }
        }
    }
}

/// Sends a streaming message and reads it to its end: the final state.
async fn streamed_to_the_end(addr: &str, token: &str, id: &str, text: &str) -> String {
    let mut s = Sse::open(
        addr,
        token,
        "POST",
        "/a2a/jsonrpc",
        Some(&rpc_body("SendStreamingMessage", message(id, text))),
    )
    .await;
    let mut last = String::new();
    while let Some(ev) = s.next_data(Duration::from_secs(30)).await {
        if let Some(st) = ev["result"]["statusUpdate"]["status"]["state"].as_str() {
            last = st.to_string();
        }
    }
    last
}

async fn grpc_client(addr: &str) -> A2aServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("gRPC listener reachable");
    A2aServiceClient::new(ch)
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    r.metadata_mut()
        .insert("a2a-version", MetadataValue::from_static("1.0"));
    r
}

/// alice's hanging task, started without waiting: its id.
async fn hanging_task(addr: &str, id: &str) -> String {
    let mut params = message(id, &hang());
    params["configuration"] = json!({"returnImmediately": true});
    let (status, r) = rpc(addr, ALICE, "SendMessage", params).await;
    assert_eq!(status, 200, "{r}");
    let task = r["result"]["task"]["id"].as_str().unwrap_or_default();
    assert!(!task.is_empty(), "{r}");
    task.to_string()
}

// ------------------------------------------------------------------------------ streams

#[tokio::test(flavor = "multi_thread")]
async fn alice_holding_her_whole_stream_share_slows_only_herself() {
    const STREAMS: usize = 6;
    const CONNS: usize = 10;
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = up(&[
        &format!("http.max_streams_per_principal={STREAMS}"),
        &format!("http.max_connections_per_principal={CONNS}"),
        "http.max_connections=64",
        &format!("grpc.tcp={grpc}"),
        "grpc.allow_any_peer=true",
    ])
    .await;
    let addr = d.http.clone();
    let task = hanging_task(&addr, "a-hang").await;

    // alice subscribes to her own hanging task until her share is full.
    let subscribe = rpc_body("SubscribeToTask", json!({"id": task}));
    let mut held = Vec::new();
    for _ in 0..STREAMS {
        let mut s = Sse::open(&addr, ALICE, "POST", "/a2a/jsonrpc", Some(&subscribe)).await;
        let first = s
            .next_data(Duration::from_secs(10))
            .await
            .expect("snapshot");
        assert_eq!(first["result"]["task"]["id"], task.as_str(), "{first}");
        held.push(s);
    }

    // The operator sees them in the gateway's Status.
    let status =
        warden_proto::v1::admin_service_client::AdminServiceClient::new(d.channel("gateway"))
            .status(warden_proto::v1::StatusRequest::default())
            .await
            .expect("Status")
            .into_inner();
    assert_eq!(
        status.details.get("streams_open").map(String::as_str),
        Some(STREAMS.to_string().as_str()),
        "{:?}",
        status.details
    );

    // One more is refused, in each protocol's own shape.
    let (status, r) = rpc(&addr, ALICE, "SubscribeToTask", json!({"id": task})).await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["error"]["code"], -32029, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("max_streams_per_principal"),
        "{r}"
    );
    let (status, r) = call(
        &addr,
        "GET",
        &format!("/a2a/rest/tasks/{task}:subscribe"),
        ALICE,
        None,
    )
    .await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["error"]["status"], "RESOURCE_EXHAUSTED", "{r}");
    let mut g = grpc_client(&grpc).await;
    let e = g
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: task.clone(),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect_err("alice's gRPC stream is refused at her share");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let (status, r) = call(
        &addr,
        "POST",
        "/mcp",
        ALICE,
        Some(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["error"]["code"], -32029, "{r}");

    // A new streaming task of hers is refused before anything of it is stored.
    let (status, r) = rpc(
        &addr,
        ALICE,
        "SendStreamingMessage",
        message("a-refused", &quick("never")),
    )
    .await;
    assert_eq!(status, 429, "{r}");
    let (_, listed) = rpc(&addr, ALICE, "ListTasks", json!({})).await;
    let ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![task.as_str()], "{listed}");
    // Her other requests are not streams and are served.
    let (status, r) = rpc(&addr, ALICE, "GetTask", json!({"id": task})).await;
    assert_eq!(
        (status, r["result"]["id"].as_str()),
        (200, Some(task.as_str()))
    );

    // Meanwhile bob is served at once: a plain task, his own stream, a subscription, gRPC.
    let t0 = Instant::now();
    let (status, r) = rpc(&addr, BOB, "SendMessage", message("b-1", &quick("bob one"))).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    assert_eq!(
        streamed_to_the_end(&addr, BOB, "b-2", &quick("bob two")).await,
        "TASK_STATE_COMPLETED"
    );
    let mut bob_hang = message("b-hang", &hang());
    bob_hang["configuration"] = json!({"returnImmediately": true});
    let (_, r) = rpc(&addr, BOB, "SendMessage", bob_hang).await;
    let bob_task = r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut bob_sub = Sse::open(
        &addr,
        BOB,
        "POST",
        "/a2a/jsonrpc",
        Some(&rpc_body("SubscribeToTask", json!({"id": bob_task}))),
    )
    .await;
    let first = bob_sub
        .next_data(Duration::from_secs(10))
        .await
        .expect("bob's snapshot");
    assert_eq!(first["result"]["task"]["id"], bob_task.as_str(), "{first}");
    let mut stream = g
        .send_streaming_message(authed(
            pb::SendMessageRequest {
                message: Some(pb::Message {
                    message_id: "b-grpc".into(),
                    role: pb::Role::User as i32,
                    parts: vec![pb::Part {
                        content: Some(pb::part::Content::Text(quick("bob grpc"))),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            BOB,
        ))
        .await
        .expect("bob's gRPC stream is served")
        .into_inner();
    let mut grpc_events = 0;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("bob's gRPC stream ends in time")
    {
        ev.expect("an event");
        grpc_events += 1;
    }
    assert!(grpc_events >= 2, "{grpc_events}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "bob waited {:?}",
        t0.elapsed()
    );

    // alice's connections: her streams hold STREAMS of her CONNS; kept-alive connections fill
    // the rest, and the next one is refused 429 and closed. bob is still served.
    let get = format!("/a2a/rest/tasks/{task}");
    let mut idle = Vec::new();
    for _ in 0..CONNS - STREAMS {
        let mut sock = send(&addr, "GET", &get, Some(ALICE), None, true).await;
        let (status, head, _) = read_head(&mut sock).await;
        assert_eq!(status, 200, "{head}");
        idle.push(sock);
    }
    let mut over = send(&addr, "GET", &get, Some(ALICE), None, true).await;
    let (status, head, _) = read_head(&mut over).await;
    assert_eq!(status, 429, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let (status, r) = rpc(&addr, BOB, "GetTask", json!({"id": bob_task})).await;
    assert_eq!(
        (status, r["result"]["id"].as_str()),
        (200, Some(bob_task.as_str()))
    );

    // When alice lets go, her shares come back.
    drop(idle);
    drop(over);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = send(
            &addr,
            "POST",
            "/a2a/jsonrpc",
            Some(ALICE),
            Some(&subscribe),
            false,
        )
        .await;
        let (status, _, _) = read_head(&mut s).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(Instant::now() < deadline, "alice's share never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ------------------------------------------------------------------------------ slowloris

#[tokio::test(flavor = "multi_thread")]
async fn half_sent_headers_never_lock_bob_out() {
    const CAP: usize = 64;
    const SHARE: usize = 16;
    let d = up(&[
        &format!("http.max_connections={CAP}"),
        &format!("http.max_unauthenticated_connections={SHARE}"),
        "http.header_read_timeout_ms=10000",
    ])
    .await;
    let addr = d.http.clone();
    let (_, r) = rpc(&addr, BOB, "SendMessage", message("b-0", &quick("first"))).await;
    let bob_task = r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!bob_task.is_empty(), "{r}");

    // An unauthenticated client opening a connection every 10 ms, each sending half a head and
    // holding it: well past the whole cap within the header timeout.
    let stop = flag();
    let attacker = {
        let addr = addr.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect(&addr).await {
                    let _ = s
                        .write_all(b"POST /a2a/jsonrpc HTTP/1.1\r\nHost: x\r\nContent-Type: applic")
                        .await;
                    held.push((Instant::now(), s));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            held
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Every one of bob's requests is answered while the attack goes on.
    let mut answered = 0;
    let mut refused = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        let (status, r) = rpc(&addr, BOB, "GetTask", json!({"id": bob_task})).await;
        if status == 200 && r["result"]["id"] == bob_task.as_str() {
            answered += 1;
        } else {
            refused.push(format!("{status} {r}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let held = attacker.await.expect("attacker");
    assert!(
        held.len() > CAP * 3,
        "the attack opened only {} connections",
        held.len()
    );
    assert!(
        refused.is_empty(),
        "bob was refused {} of {} times, first: {:?}",
        refused.len(),
        refused.len() + answered,
        refused.first()
    );
    assert!(answered >= 20, "bob was answered {answered} times");

    // The attacker's old connections were closed for newer ones long before the header
    // timeout; at most its share (twice it for a burst younger than the eviction grace) are
    // still open.
    let mut open = 0;
    for (_, mut s) in held {
        let mut b = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            _ => open += 1,
        }
    }
    assert!(
        open <= 2 * SHARE,
        "{open} unauthenticated connections still open"
    );
}

fn flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))
}

// ------------------------------------------------------------------------------ keep-alive

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_stream_hears_a_keepalive_within_the_interval() {
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = up(&[
        "http.stream_keepalive_ms=1000",
        &format!("grpc.tcp={grpc}"),
        "grpc.allow_any_peer=true",
    ])
    .await;
    let addr = d.http.clone();

    // SSE: a streaming task that says "started" and then nothing, ever.
    let mut s = Sse::open(
        &addr,
        ALICE,
        "POST",
        "/a2a/jsonrpc",
        Some(&rpc_body("SendStreamingMessage", message("k-1", &hang()))),
    )
    .await;
    // Past the first events (snapshot, working, the message), then silence: each gap between
    // two things heard is under the interval plus a margin.
    let mut seen_started = false;
    while !seen_started {
        let ev = s
            .next_data(Duration::from_secs(20))
            .await
            .expect("an event");
        seen_started = ev.to_string().contains("started");
    }
    let mut comments = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let heard = s
            .next(Duration::from_millis(1800))
            .await
            .expect("the silent stream hears something within 1.8 s (interval 1 s)");
        if heard.is_null() {
            comments += 1;
        }
    }
    assert!(comments >= 3, "{comments} keep-alive comments in 5 s");

    // gRPC: no comment frame there; the current status comes again.
    let mut g = grpc_client(&grpc).await;
    let mut stream = g
        .send_streaming_message(authed(
            pb::SendMessageRequest {
                message: Some(pb::Message {
                    message_id: "k-grpc".into(),
                    role: pb::Role::User as i32,
                    parts: vec![pb::Part {
                        content: Some(pb::part::Content::Text(hang())),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect("a gRPC stream")
        .into_inner();
    let mut last = Instant::now();
    let mut statuses = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        let ev = tokio::time::timeout(Duration::from_millis(1800), stream.next())
            .await
            .expect("the silent gRPC stream hears something within 1.8 s")
            .expect("the stream stays open")
            .expect("an event");
        assert!(last.elapsed() < Duration::from_millis(1800));
        last = Instant::now();
        if let Some(pb::stream_response::Payload::StatusUpdate(u)) = ev.payload {
            assert_eq!(
                u.status.map(|s| s.state),
                Some(pb::TaskState::Working as i32),
                "the repeated status is the task's current one"
            );
            statuses += 1;
        }
    }
    assert!(statuses >= 3, "{statuses} status updates in 6 s");

    // MCP: a session's own SSE stream (GET /mcp), silent, hears comments.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "0"}}})
    .to_string();
    let mut sock = mcp_request(&addr, "POST", None, Some(&init)).await;
    let (status, head, _) = read_head(&mut sock).await;
    assert_eq!(status, 200, "{head}");
    let sid = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_string())
        })
        .expect("a session id");
    drop(sock);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let mut sock = mcp_request(&addr, "POST", Some(&sid), Some(&note)).await;
    let (status, head, _) = read_head(&mut sock).await;
    assert_eq!(status, 202, "{head}");
    let mut sock = mcp_request(&addr, "GET", Some(&sid), None).await;
    let (status, head, _) = read_head(&mut sock).await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    let mut comments = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_millis(1800), sock.read(&mut buf))
            .await
            .expect("the silent MCP stream hears something within 1.8 s")
            .expect("read");
        assert!(n > 0, "the MCP stream closed");
        comments += String::from_utf8_lossy(&buf[..n])
            .lines()
            .filter(|l| l.starts_with(':'))
            .count();
    }
    assert!(comments >= 3, "{comments} keep-alive comments in 5 s");
}

/// A request to `/mcp` as alice (HTTP/1.0), in the session `sid` when given.
async fn mcp_request(addr: &str, method: &str, sid: Option<&str>, body: Option<&str>) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!(
        "{method} /mcp HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\nAccept: application/json, text/event-stream\r\n"
    );
    if let Some(sid) = sid {
        req.push_str(&format!(
            "Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        ));
    }
    let b = body.unwrap_or("");
    if body.is_some() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(b);
    sock.write_all(req.as_bytes()).await.expect("write request");
    sock
}
