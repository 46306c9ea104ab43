//! Issue 36, finding 5: MCP sessions (2025-11-25, `Mcp-Session-Id`) are a share per principal.
//! Against the real daemons with two principals, `alice` and `bob`:
//!
//! - bob opens sessions until he is refused: exactly at his share, with HTTP 429 and a JSON-RPC
//!   error answering his `initialize` that names the share and its key;
//! - while bob sits at his share and keeps asking, alice's `initialize` and a tool call in her
//!   session succeed, within twice her own baseline (measured first, in the same test) plus slack;
//! - once bob's sessions have been idle for `mcp.session_idle_seconds` (short here) they are
//!   ended: their ids are gone (404), bob can open sessions again, and the gateway's RSS falls
//!   back from the flood's peak (the figures are printed).
//!
//! On binaries without the share (`WARDEN_BIN_DIR` at an older build, with
//! `WARDEN_E2E_NO_SESSION_KEYS=1` as those reject the `mcp.*session*` keys) bob is never refused
//! and the test fails there.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warden_e2e::{Deployment, Options};

const ALICE: &str = "alice-token-mcp-sessions-0123456789";
const BOB: &str = "bob-token-mcp-sessions-9876543210";
/// bob's share; the gateway's limit is far above it.
const SHARE: usize = 100;
const IDLE_SECONDS: u64 = 30;
const ERA: &str = "2025-11-25";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    /// The JSON-RPC messages of the answer: SSE `data:` lines, or the JSON body.
    fn messages(&self) -> Vec<Value> {
        if self.head.to_ascii_lowercase().contains("text/event-stream") {
            self.body
                .split("\n\n")
                .filter_map(|ev| {
                    let data: Vec<&str> = ev
                        .lines()
                        .filter_map(|l| {
                            l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:"))
                        })
                        .collect();
                    serde_json::from_str::<Value>(data.join("\n").trim()).ok()
                })
                .collect()
        } else {
            serde_json::from_str::<Value>(&self.body)
                .into_iter()
                .collect()
        }
    }
}

/// One request on a fresh HTTP/1.0 connection (the answer ends with the connection).
async fn post(
    addr: &str,
    token: &str,
    sid: Option<&str>,
    method: &str,
    body: Option<&Value>,
) -> Reply {
    let mut req = format!(
        "{method} /mcp HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: application/json, text/event-stream\r\n"
    );
    if let Some(sid) = sid {
        req.push_str(&format!(
            "Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {ERA}\r\n"
        ));
    }
    let body = body.map(Value::to_string).unwrap_or_default();
    if method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    let mut sock = TcpStream::connect(addr).await.expect("gateway reachable");
    sock.write_all(req.as_bytes())
        .await
        .expect("request written");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), sock.read_to_end(&mut buf))
        .await
        .expect("answer within 60 s")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Reply {
        status: head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": ERA, "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}})
}

/// A session opened, or the refusal.
async fn open(addr: &str, token: &str, id: u64) -> Result<String, Reply> {
    let r = post(addr, token, None, "POST", Some(&initialize(id))).await;
    match r.header("mcp-session-id") {
        Some(sid) if r.status == 200 => Ok(sid),
        _ => Err(r),
    }
}

/// alice's round: `initialize`, `notifications/initialized`, the `status` tool in her session,
/// DELETE. Asserts each answer; returns how long the initialize and the call took.
async fn alice_round(addr: &str) -> Duration {
    let started = Instant::now();
    let sid = open(addr, ALICE, 1)
        .await
        .unwrap_or_else(|r| panic!("alice's initialize refused: {} {}", r.status, r.body));
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = post(addr, ALICE, Some(&sid), "POST", Some(&note)).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "status", "arguments": {}}});
    let r = post(addr, ALICE, Some(&sid), "POST", Some(&call)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let msgs = r.messages();
    let res = msgs
        .iter()
        .find(|m| m["id"] == 2)
        .unwrap_or_else(|| panic!("no answer to alice's call: {}", r.body));
    assert_eq!(
        res["result"]["structuredContent"]["principal"], "alice",
        "{res}"
    );
    assert_eq!(
        res["result"]["structuredContent"]["era"], "session",
        "{res}"
    );
    let took = started.elapsed();
    let r = post(addr, ALICE, Some(&sid), "DELETE", None).await;
    assert!(r.status < 300, "{} {}", r.status, r.body);
    took
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bob_at_his_session_share_leaves_alice_served_and_idle_sessions_give_memory_back() {
    let d = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                format!(
                    "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
                    digest(ALICE),
                    digest(BOB)
                ),
            ),
        ]
        .into_iter()
        .chain(
            [
                "mcp.max_sessions=8192".to_string(),
                format!("mcp.max_sessions_per_principal={SHARE}"),
                format!("mcp.session_idle_seconds={IDLE_SECONDS}"),
            ]
            .into_iter()
            .filter(|_| std::env::var_os("WARDEN_E2E_NO_SESSION_KEYS").is_none())
            .map(|kv| ("gateway".to_string(), kv)),
        )
        .collect(),
        ..Options::default()
    })
    .await;
    let addr = d.http.clone();
    let pid = d
        .daemons
        .iter()
        .find(|x| x.name == "gateway")
        .expect("a gateway")
        .pid();

    // alice's baseline, alone.
    alice_round(&addr).await; // warm-up
    let mut base = Vec::new();
    for _ in 0..5 {
        base.push(alice_round(&addr).await);
    }
    let baseline = median(base);
    let rss_before = rss_kib(pid);

    // bob opens sessions from 16 connections at once until each is refused.
    let flood = Instant::now();
    let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (addr, tries) = (addr.clone(), tries.clone());
            tokio::spawn(async move {
                let mut opened = Vec::new();
                for i in 0.. {
                    let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    assert!(n < 3 * SHARE, "bob was never refused: {n} sessions opened");
                    match open(&addr, BOB, w * 100_000 + i).await {
                        Ok(sid) => opened.push(sid),
                        Err(r) => return (opened, r, w * 100_000 + i),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    let mut bob_sessions = Vec::new();
    let mut refusals = Vec::new();
    for w in workers {
        let (opened, refusal, id) = w.await.expect("bob's worker");
        bob_sessions.extend(opened);
        refusals.push((refusal, id));
    }
    let flood_took = flood.elapsed();
    let flood_end = Instant::now();
    assert!(
        flood_took < Duration::from_secs(IDLE_SECONDS),
        "bob's flood took {flood_took:?}, longer than the idle time: raise IDLE_SECONDS"
    );
    assert_eq!(
        bob_sessions.len(),
        SHARE,
        "bob is refused exactly at his share"
    );
    for (r, id) in &refusals {
        assert_eq!(r.status, 429, "{}\n{}", r.head, r.body);
        assert!(r.header("retry-after").is_some(), "{}", r.head);
        let v: Value = serde_json::from_str(&r.body).expect("a JSON-RPC error body");
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(
            v["id"],
            json!(id),
            "the error answers bob's initialize: {v}"
        );
        assert_eq!(v["error"]["code"], -32029, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&format!("{SHARE} open MCP sessions"))
                && msg.contains("mcp.max_sessions_per_principal"),
            "{msg}"
        );
    }
    let rss_peak = rss_kib(pid);

    // alice, while bob sits at his share and keeps asking for more.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let (addr, stop) = (addr.clone(), stop.clone());
        tokio::spawn(async move {
            let mut refused = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match open(&addr, BOB, 7).await {
                    Ok(sid) => panic!("bob got a session past his share: {sid}"),
                    Err(r) => {
                        assert_eq!(r.status, 429, "{}", r.body);
                        refused += 1;
                    }
                }
            }
            refused
        })
    };
    let mut under = Vec::new();
    for _ in 0..5 {
        under.push(alice_round(&addr).await);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let hammered = hammer.await.expect("bob's hammer");
    let flooded = median(under);
    println!(
        "alice: baseline {baseline:?}, with bob at his share of {SHARE} sessions {flooded:?} ({hammered} more initializes of bob refused meanwhile); bob's flood took {flood_took:?}"
    );
    assert!(
        flooded <= baseline * 2 + Duration::from_secs(1),
        "alice's initialize and call took {flooded:?} with bob at his share, {baseline:?} alone"
    );

    // bob's sessions end once idle: their ids are gone, and he may open sessions again.
    let idle_from = Instant::now();
    let reopened = loop {
        match open(&addr, BOB, 9).await {
            Ok(sid) => break sid,
            Err(r) => assert_eq!(r.status, 429, "{}", r.body),
        }
        assert!(
            idle_from.elapsed() < Duration::from_secs(IDLE_SECONDS + 60),
            "bob's idle sessions were never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        flood.elapsed() >= Duration::from_secs(IDLE_SECONDS),
        "a session of bob's ended {:?} after his flood started, before it was idle for {IDLE_SECONDS} s",
        flood.elapsed()
    );
    // Every session of the flood ends: the last was used when the flood ended, and the reaper
    // looks every quarter of the idle time. (Asking about one before would keep it alive.)
    let all_idle = flood_end + Duration::from_secs(IDLE_SECONDS + IDLE_SECONDS / 4 + 5);
    tokio::time::sleep_until(all_idle.into()).await;
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    for sid in bob_sessions.iter().step_by(SHARE / 10) {
        let r = post(&addr, BOB, Some(sid), "POST", Some(&ping)).await;
        assert_eq!(r.status, 404, "an ended session is gone: {}", r.body);
    }
    let r = post(&addr, BOB, Some(&reopened), "POST", Some(&ping)).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The memory the flood took is handed back once every session of it ended.
    let mut rss_after = rss_kib(pid);
    let deadline = Instant::now() + Duration::from_secs(IDLE_SECONDS + 30);
    while rss_after > rss_before + (rss_peak.saturating_sub(rss_before)) / 2
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_after = rss_kib(pid);
    }
    println!(
        "gateway RSS: before {} MiB, at the peak of {SHARE} sessions {} MiB ({:.1} KiB a session), after the reap {} MiB",
        rss_before / 1024,
        rss_peak / 1024,
        rss_peak.saturating_sub(rss_before) as f64 / SHARE as f64,
        rss_after / 1024
    );
    assert!(
        rss_after < rss_peak,
        "RSS stayed up after the reap: before {rss_before} KiB, peak {rss_peak} KiB, after {rss_after} KiB"
    );
    assert!(alice_round(&addr).await > Duration::ZERO);
}
