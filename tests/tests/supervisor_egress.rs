//! Supervisor end to end, egress (issue 12): an agent with `network = "proxy"` has its own
//! network namespace, and its only way out is the supervisor's egress proxy, through the relay
//! in its sandbox. The scripted agent makes the connections from inside the box (`connect`
//! steps) and reports what it saw; the tests check that, the events the caller got and the
//! conversation's egress record.
//!
//! Skips, saying so, outside CI when bubblewrap does not work on this host (in CI it fails).

mod supervisor_support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use supervisor_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

fn bwrap_works() -> bool {
    if warden_sandbox::find_bwrap().is_some_and(|b| warden_sandbox::bwrap_works(&b)) {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "bubblewrap is required for the egress tests in CI"
    );
    println!("SKIP: bubblewrap missing or not working on this host");
    false
}

/// A loopback server answering each connection with `<tag>:<first line it read>` and closing.
async fn server(tag: &'static str) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                let mut got = Vec::new();
                while !got.contains(&b'\n') && got.len() < 1024 {
                    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let line = String::from_utf8_lossy(&got);
                let line = line.lines().next().unwrap_or("");
                let _ = s.write_all(format!("{tag}:{line}\n").as_bytes()).await;
            });
        }
    });
    port
}

fn connect(host: &str, port: u16, via: &str, send: &str) -> Value {
    json!({"type": "connect", "host": host, "port": port, "via": via, "send": send, "read_ms": 2000})
}

/// The `connect-result:` reports of a turn, in order.
fn results(evs: &[pb::TurnEvent]) -> Vec<Value> {
    text(evs)
        .lines()
        .filter_map(|l| l.strip_prefix("connect-result: "))
        .map(|j| serde_json::from_str(j).unwrap_or_else(|e| panic!("{j}: {e}")))
        .collect()
}

fn refusals(evs: &[pb::TurnEvent]) -> Vec<pb::EgressRefused> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(Event::EgressRefused(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The conversation's egress record.
fn egress_record(d: &warden_e2e::Deployment, ctx: &str) -> Vec<Value> {
    std::fs::read_to_string(state(d).join("egress").join(format!("{ctx}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The conversation's egress record once `want` holds of it (or as it is after 30 s): a
/// connection is recorded when it ends, which can be after its destination saw its bytes.
async fn egress_record_when(
    d: &warden_e2e::Deployment,
    ctx: &str,
    want: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let t0 = std::time::Instant::now();
    loop {
        let rec = egress_record(d, ctx);
        if want(&rec) || t0.elapsed() > Duration::from_secs(30) {
            return rec;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn deploy_proxy(allow: &[String], extra: &[(&str, &str)]) -> warden_e2e::Deployment {
    let allow = format!(
        "agents.scripted.egress_allow=[{}]",
        allow
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut sets = vec![
        ("supervisor", "agents.scripted.network=\"proxy\""),
        ("supervisor", allow.as_str()),
    ];
    sets.extend_from_slice(extra);
    deploy(&sets).await
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_named_loopback_port_is_reachable_and_every_connection_is_recorded() {
    if !bwrap_works() {
        return;
    }
    let allowed = server("allowed").await;
    let other = server("other").await;
    // The supervisor's Prometheus metrics count what the records hold.
    let metrics = format!("127.0.0.1:{}", warden_e2e::free_port());
    let metrics_set = format!("daemon.metrics_listen={metrics:?}");
    // `localhost:<other>` is named exactly: that name reaches loopback, on that port only.
    // A cold start (`pool_size = 0`): the proxy bound when the agent is spawned. The warm path,
    // bound at the take, has its own tests below.
    let d = deploy_proxy(
        &[format!("127.0.0.1:{allowed}"), format!("localhost:{other}")],
        &[
            ("supervisor", "limits.egress_refusals_end_turn=0"),
            ("supervisor", "agents.scripted.pool_size=0"),
            ("supervisor", metrics_set.as_str()),
        ],
    )
    .await;
    let mut c = client(&d);
    let steps = vec![
        // 0: through the proxy to the named server: the bytes arrive and the answer comes back.
        connect("127.0.0.1", allowed, "proxy", "ping-proxy\n"),
        // 1: the same server at the same address without the proxy (the mirrored port).
        connect("127.0.0.1", allowed, "direct", "ping-direct\n"),
        // 2: another loopback port of the host, through the proxy: refused.
        connect("127.0.0.1", other, "proxy", "x\n"),
        // 3: ... and directly: nothing there in the agent's namespace.
        connect("127.0.0.1", other, "direct", "x\n"),
        // 4: a host nobody named.
        connect("evil.example", 443, "proxy", ""),
        // 5-10: the named server in other spellings, and a name resolving to loopback.
        connect("::ffff:127.0.0.1", allowed, "proxy", "x\n"),
        connect("0.0.0.0", allowed, "proxy", "x\n"),
        connect("127.1", allowed, "proxy", "x\n"),
        connect("2130706433", allowed, "proxy", "x\n"),
        connect("0x7f000001", allowed, "proxy", "x\n"),
        connect("localhost", allowed, "proxy", "x\n"),
        // 11: the cloud metadata address.
        connect("169.254.169.254", 80, "proxy", ""),
        // 12: the name the operator wrote, resolving to loopback: allowed (named exactly).
        connect("localhost", other, "proxy", "by-name\n"),
    ];
    let evs = run(
        &mut c,
        turn("egress", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let r = results(&evs);
    assert_eq!(r.len(), 13, "{r:#?}\n{evs:#?}");
    assert_eq!(r[12]["received"], "other:by-name\n", "{}", r[12]);
    assert!(
        r[0]["status"].as_str().unwrap_or("").contains(" 200 "),
        "{}",
        r[0]
    );
    assert_eq!(r[0]["received"], "allowed:ping-proxy\n", "{}", r[0]);
    assert_eq!(r[1]["error"], "", "{}", r[1]);
    assert_eq!(r[1]["received"], "allowed:ping-direct\n", "{}", r[1]);
    assert!(
        r[2]["status"].as_str().unwrap_or("").contains(" 403 "),
        "{}",
        r[2]
    );
    assert!(
        r[2]["received"]
            .as_str()
            .unwrap_or("")
            .contains("egress_allow"),
        "{}",
        r[2]
    );
    assert!(
        r[3]["error"].as_str().unwrap_or("").contains("connect"),
        "a direct connection to a host loopback port must fail: {}",
        r[3]
    );
    assert!(
        !r[3]["received"].as_str().unwrap_or("").contains("other:"),
        "{}",
        r[3]
    );
    for (i, res) in r.iter().enumerate().take(12).skip(4) {
        let status = res["status"].as_str().unwrap_or("");
        assert!(
            status.contains(" 403 ") || status.contains(" 400 "),
            "step {i} must be refused: {res}"
        );
        assert!(
            !res["received"].as_str().unwrap_or("").contains("allowed:"),
            "{res}"
        );
    }
    // The caller saw each refusal that named a destination, with the host and the setting.
    let refused = refusals(&evs);
    let evil = refused
        .iter()
        .find(|e| e.host == "evil.example")
        .unwrap_or_else(|| panic!("no refusal event for evil.example: {refused:#?}"));
    assert_eq!(evil.port, 443);
    assert_eq!(
        evil.message,
        "egress to evil.example:443 refused: not in [agents.scripted] egress_allow"
    );
    assert_eq!(evil.setting, "agents.scripted.egress_allow");
    assert!(
        refused
            .iter()
            .any(|e| e.host == "127.0.0.1" && e.port == u32::from(other)),
        "{refused:#?}"
    );
    assert!(
        refused.iter().any(|e| e.host == "localhost"),
        "{refused:#?}"
    );
    // Recorded with the conversation: the allowed ones with the address and bytes each way.
    let rec = egress_record(&d, "egress");
    let ok: Vec<&Value> = rec.iter().filter(|r| r["allowed"] == true).collect();
    assert_eq!(ok.len(), 3, "{rec:#?}");
    assert!(
        ok.iter().any(|r| r["host"] == "localhost"
            && r["address"] == format!("127.0.0.1:{other}")
            && r["setting"] == "agents.scripted.egress_allow"),
        "{ok:#?}"
    );
    let kinds: Vec<&str> = ok
        .iter()
        .filter(|r| r["host"] == "127.0.0.1")
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["connect", "connect-mirrored"], "{ok:#?}");
    for r in ok.iter().filter(|r| r["host"] == "127.0.0.1") {
        assert_eq!(r["host"], "127.0.0.1");
        assert_eq!(r["port"], allowed);
        assert_eq!(r["address"], format!("127.0.0.1:{allowed}"));
        assert!(r["bytes_up"].as_u64().unwrap_or(0) > 0, "{r}");
        assert!(r["bytes_down"].as_u64().unwrap_or(0) > 0, "{r}");
        assert_eq!(r["task_id"], "t-t1");
    }
    assert!(
        rec.iter().any(|r| r["allowed"] == false
            && r["host"] == "evil.example"
            && r["status"] == 403
            && r["reason"] == "not in [agents.scripted] egress_allow"),
        "{rec:#?}"
    );
    assert!(
        rec.iter()
            .any(|r| r["allowed"] == false && r["host"] == "localhost"),
        "{rec:#?}"
    );
    // And in the turn's transcript.
    let transcript = std::fs::read_to_string(stop(&evs).transcript_path).unwrap_or_default();
    assert!(transcript.contains("\"kind\":\"egress\""), "{transcript}");
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    // The supervisor's metrics count each recorded connection by outcome, and the turn.
    let resp = warden_cli::client::request(&metrics, http::Method::GET, "/metrics", "", None)
        .await
        .unwrap();
    let (_, text) = warden_cli::client::read_answer(resp).await.unwrap();
    let count = |series: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no sample {series} in:\n{text}")) as usize
    };
    let refused_recorded = rec
        .iter()
        .filter(|r| r["allowed"] == false && r["status"].as_u64().unwrap_or(0) < 500)
        .count();
    let failed_recorded = rec
        .iter()
        .filter(|r| r["allowed"] == false && r["status"].as_u64().unwrap_or(0) >= 500)
        .count();
    assert_eq!(
        count("warden_supervisor_egress_connections_total{outcome=\"allowed\"}"),
        ok.len(),
        "{text}"
    );
    assert_eq!(
        count("warden_supervisor_egress_connections_total{outcome=\"refused\"}"),
        refused_recorded,
        "{text}"
    );
    assert!(refused_recorded >= 8, "{rec:#?}");
    assert_eq!(
        count("warden_supervisor_egress_connections_total{outcome=\"failed\"}"),
        failed_recorded,
        "{text}"
    );
    assert_eq!(
        count("warden_supervisor_turns_total{stop_reason=\"end_turn\",fault_class=\"\"}"),
        1,
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_on_the_proxy_and_its_socket_gets_an_error_and_the_supervisor_keeps_serving() {
    if !bwrap_works() {
        return;
    }
    let allowed = server("allowed").await;
    let d = deploy_proxy(
        &[format!("127.0.0.1:{allowed}")],
        &[("supervisor", "limits.task_text_bytes=65536")],
    )
    .await;
    let mut c = client(&d);
    let big = format!(
        "GET http://127.0.0.1:{allowed}/ HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let steps = vec![
        json!({"type": "connect", "via": "proxy_raw", "send": "\u{1}\u{2}garbage\r\n\r\n"}),
        json!({"type": "connect", "via": "proxy_raw", "send": big}),
        json!({"type": "connect", "via": "socket", "send": "GET / HTTP/1.1\r\n\r\n"}),
        // Plain HTTP in absolute form through the proxy still works.
        json!({"type": "connect", "via": "proxy_raw", "send": format!("GET http://127.0.0.1:{allowed}/x HTTP/1.1\r\nHost: evil.example\r\n\r\n")}),
        // Straight at the socket, the same rules: an unnamed host is refused.
        json!({"type": "connect", "via": "socket", "send": "CONNECT evil.example:443 HTTP/1.1\r\n\r\n"}),
    ];
    let evs = run(
        &mut c,
        turn("garbage", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let r = results(&evs);
    assert_eq!(r.len(), 5, "{r:#?}\n{evs:#?}");
    assert!(
        r[0]["status"].as_str().unwrap_or("").contains(" 400 "),
        "{}",
        r[0]
    );
    assert!(
        r[1]["status"].as_str().unwrap_or("").contains(" 431 "),
        "{}",
        r[1]
    );
    assert!(
        r[2]["status"].as_str().unwrap_or("").contains(" 400 "),
        "{}",
        r[2]
    );
    assert_eq!(r[3]["received"], "allowed:GET /x HTTP/1.1\n", "{}", r[3]);
    assert!(
        r[4]["status"].as_str().unwrap_or("").contains(" 403 "),
        "{}",
        r[4]
    );
    // Still serving: the next turn works and its connection goes through.
    let evs = run(
        &mut c,
        turn(
            "garbage",
            "t2",
            &scenario(json!({"steps": [connect("127.0.0.1", allowed, "proxy", "again\n")]})),
        ),
    )
    .await;
    assert_eq!(results(&evs)[0]["received"], "allowed:again\n", "{evs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_refused_again_and_again_ends_the_turn_within_seconds() {
    if !bwrap_works() {
        return;
    }
    let d = deploy_proxy(&[], &[]).await;
    let mut c = client(&d);
    let retry = connect("api.example.com", 443, "proxy", "");
    let steps = vec![
        retry.clone(),
        retry.clone(),
        retry.clone(),
        json!({"type": "hang"}),
    ];
    let started = std::time::Instant::now();
    let evs = run(
        &mut c,
        turn("retry", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let s = stop(&evs);
    let f = s.fault.unwrap_or_else(|| panic!("no fault: {evs:#?}"));
    assert_eq!(f.fault_class(), pb::FaultClass::EgressRefused);
    assert!(
        f.message.contains(
            "egress to api.example.com:443 refused: not in [agents.scripted] egress_allow"
        ),
        "{}",
        f.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_killing_its_relay_ends_only_its_own_turn() {
    if !bwrap_works() {
        return;
    }
    let allowed = server("allowed").await;
    let d = deploy_proxy(&[format!("127.0.0.1:{allowed}")], &[]).await;
    let mut c = client(&d);
    // The shell's parent is the agent; the agent's parent is the relay.
    let kill = json!({"type": "tool", "kind": "execute", "ask": false, "via": "direct",
        "command": "kill -9 $(awk '{print $4}' /proc/$PPID/stat)"});
    let evs = run(
        &mut c,
        turn(
            "killer",
            "t1",
            &scenario(json!({"steps": [kill, {"type": "sleep", "ms": 3000}]})),
        ),
    )
    .await;
    let s = stop(&evs);
    assert_eq!(s.stop_reason, "fault", "{evs:#?}");
    // Another conversation is served, its egress works.
    let evs = run(
        &mut c,
        turn(
            "after",
            "t1",
            &scenario(json!({"steps": [connect("127.0.0.1", allowed, "proxy", "hi\n")]})),
        ),
    )
    .await;
    assert_eq!(results(&evs)[0]["received"], "allowed:hi\n", "{evs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_agent_without_bubblewrap_is_refused_with_the_reason() {
    let d = deploy(&[
        ("supervisor", "agents.scripted.network=\"proxy\""),
        ("supervisor", "sandbox.bubblewrap=false"),
    ])
    .await;
    let mut c = client(&d);
    let err = c
        .run_turn(turn("nobwrap", "t1", "hello"))
        .await
        .map(|_| ())
        .expect_err("a proxy agent without bubblewrap must be refused");
    let msg = err.message().to_string();
    assert!(msg.contains("network = \"proxy\""), "{msg}");
    assert!(msg.contains("bubblewrap"), "{msg}");
    assert!(msg.contains("[sandbox] bubblewrap = false"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_a2a_caller_sees_the_refusal_naming_the_host_and_the_setting() {
    if !bwrap_works() {
        return;
    }
    let opts = warden_e2e::Options {
        sets: vec![
            (
                "supervisor".into(),
                "agents.scripted.network=\"proxy\"".into(),
            ),
            (
                "supervisor".into(),
                "agents.scripted.egress_allow=[]".into(),
            ),
        ],
        ..Default::default()
    };
    let d = warden_e2e::Deployment::up(opts).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let state = d.dir.path().to_string_lossy().to_string();
    let task = scenario(json!({"steps": [
        connect("evil.example", 443, "proxy", ""),
        {"type": "message", "text": "carried on"}
    ]}));
    let mut send = tokio::process::Command::new(warden_e2e::binary("warden"));
    send.args(["--state-dir", &state, "send", &task])
        .stdin(std::process::Stdio::null());
    let out = warden_e2e::run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("egress to evil.example:443 refused: not in [agents.scripted] egress_allow"),
        "{shown}"
    );
    assert!(
        shown.contains("carried on"),
        "one refusal does not end the turn: {shown}"
    );
}

/// A loopback server keeping the first line of each connection.
async fn recording_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                let mut got = Vec::new();
                while !got.contains(&b'\n') && got.len() < 1024 {
                    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let line = String::from_utf8_lossy(&got)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                kept.lock().unwrap().push(line);
                let _ = s.write_all(b"ok\n").await;
            });
        }
    });
    (port, seen)
}

/// The egress record files of a deployment (one per conversation that made a connection).
fn egress_files(d: &warden_e2e::Deployment) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(state(d).join("egress"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_proxy_agent_reports_its_connections_to_the_conversation_that_takes_it() {
    if !bwrap_works() {
        return;
    }
    let allowed = server("allowed").await;
    let d = deploy_proxy(
        &[format!("127.0.0.1:{allowed}")],
        &[("supervisor", "limits.egress_refusals_end_turn=2")],
    )
    .await;
    let mut c = client(&d);
    // The proxy agent is kept warm (the built-in scripted agent's pool_size is 1).
    let st = wait_figure(&mut c, "scripted", "ready", "1").await;
    assert_eq!(st["pool.scripted.size"], "1", "{st:?}");
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let info = c
        .open_conversation(open("taker", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("warden-scripted-agent")),
        vec![warm],
        "the warm proxy agent serves the conversation"
    );
    assert_eq!(status(&mut c).await["pool.scripted.taken"], "1");
    let deny = connect("evil.example", 443, "proxy", "");
    let steps = vec![
        connect("127.0.0.1", allowed, "proxy", "ping\n"),
        deny.clone(),
        deny,
        json!({"type": "hang"}),
    ];
    let evs = run(
        &mut c,
        turn("taker", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let r = results(&evs);
    assert_eq!(r[0]["received"], "allowed:ping\n", "{r:#?}\n{evs:#?}");
    // The caller of the taking conversation sees the refusal ...
    let refused = refusals(&evs);
    assert!(
        refused
            .iter()
            .any(|e| e.host == "evil.example" && e.port == 443),
        "{refused:#?}"
    );
    // ... and its turn counts them: the second ends it.
    let f = stop(&evs)
        .fault
        .unwrap_or_else(|| panic!("no fault: {evs:#?}"));
    assert_eq!(f.fault_class(), pb::FaultClass::EgressRefused, "{f:?}");
    // Recorded under the taking conversation's context and task, nowhere else.
    let taken = |rec: &[Value]| {
        rec.iter().any(|r| {
            r["allowed"] == true
                && r["port"] == allowed
                && r["context_id"] == "taker"
                && r["task_id"] == "t-t1"
        })
    };
    let rec = egress_record_when(&d, "taker", taken).await;
    assert!(taken(&rec), "{rec:#?}");
    assert_eq!(
        rec.iter()
            .filter(|r| r["allowed"] == false && r["host"] == "evil.example")
            .count(),
        2,
        "{rec:#?}"
    );
    assert!(rec.iter().all(|r| r["context_id"] == "taker"), "{rec:#?}");
    assert_eq!(egress_files(&d), ["taker.jsonl"]);
    let transcript = std::fs::read_to_string(stop(&evs).transcript_path).unwrap_or_default();
    assert!(transcript.contains("\"kind\":\"egress\""), "{transcript}");
}

/// A stdlib ACP agent that, 1 s after `session/new`, opens a tunnel through its proxy to the
/// loopback port `argv[1]` (allowed) and sends the root it runs in.
const EARLY_CONNECTOR: &str = r#"
import json, os, socket, sys, threading, time
port = sys.argv[1]
lock = threading.Lock()
def send(o):
    with lock:
        sys.stdout.write(json.dumps(o) + "\n")
        sys.stdout.flush()
def reach():
    time.sleep(1.0)
    url = os.environ.get("HTTPS_PROXY", "")
    host, p = url.split("://", 1)[-1].strip("/").rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(p)), timeout=5)
        s.sendall(("CONNECT 127.0.0.1:%s HTTP/1.1\r\n\r\n" % port).encode())
        head = s.recv(4096)
        s.sendall(("from " + os.getcwd() + "\n").encode())
        s.recv(4096)
        s.close()
    except Exception:
        pass
for line in sys.stdin:
    m = json.loads(line)
    meth, mid = m.get("method"), m.get("id")
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif meth == "session/new":
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "s1"}})
        threading.Thread(target=reach, daemon=True).start()
    elif meth == "session/prompt":
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
              "update": {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "text", "text": "served in " + os.getcwd()}}}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif meth is not None and mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_proxy_agent_that_connects_before_it_is_taken_forwards_nothing_and_is_never_handed_out()
 {
    if !bwrap_works() {
        return;
    }
    let (port, seen) = recording_server().await;
    let dir = parent().join(format!("early-connector-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("agent.py");
    std::fs::write(&script, EARLY_CONNECTOR).unwrap();
    let sets = [
        "agents.scripted.pool_size=0".to_string(),
        "agents.early.command=\"/usr/bin/python3\"".to_string(),
        format!("agents.early.args=[\"{}\", \"{port}\"]", script.display()),
        format!("agents.early.read_only_paths=[\"{}\"]", dir.display()),
        "agents.early.network=\"proxy\"".to_string(),
        format!("agents.early.egress_allow=[\"127.0.0.1:{port}\"]"),
        "agents.early.pool_size=1".to_string(),
    ];
    let sets: Vec<(&str, &str)> = sets.iter().map(|s| ("supervisor", s.as_str())).collect();
    let d = deploy(&sets).await;
    let mut c = client(&d);
    wait_figure(&mut c, "early", "ready", "1").await;
    let warm = one_agent(&d, "python3.11", &[]).await;
    let warm_root = std::fs::read_link(format!("/proc/{warm}/cwd")).unwrap();
    // It tries 1 s after its session/new: refused, nothing forwarded.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "a warm agent's connection reached its destination: {:?}",
        seen.lock().unwrap()
    );
    let mut req = open("after-early", pb::Profile::WorkspaceWrite);
    req.agent = "early".into();
    let info = c.open_conversation(req).await.unwrap().into_inner();
    assert_ne!(
        Path::new(&info.root),
        warm_root,
        "the warm agent was handed out"
    );
    assert!(
        all_gone(&[warm], Duration::from_secs(5)).await,
        "the warm agent that connected is killed"
    );
    let st = status(&mut c).await;
    assert_eq!(st["pool.early.discarded"], "1", "{st:?}");
    assert_eq!(st["pool.early.taken"], "0", "{st:?}");
    // The conversation's own agent makes the same connection once it has a conversation: that
    // one goes through, recorded under the conversation (so the refusal above was the pool's).
    let t0 = std::time::Instant::now();
    // 30 s: a loaded two-core machine once took longer than 10 s (the full suite, 1 of 4 runs).
    while seen.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = seen.lock().unwrap().clone();
    assert_eq!(lines, [format!("from {}", info.root)], "{lines:?}");
    let allowed = |rec: &[Value]| {
        rec.iter()
            .any(|r| r["allowed"] == true && r["port"] == port)
    };
    let rec = egress_record_when(&d, "after-early", allowed).await;
    assert!(allowed(&rec), "{rec:#?}");
    assert_eq!(egress_files(&d), ["after-early.jsonl"]);
}

/// The uid owning the client end of a loopback connection (`peer` is the client's address as
/// the server saw it), from the kernel's socket table: what the gateway's `peer.rs` reads.
fn socket_owner(peer: std::net::SocketAddr) -> Option<u32> {
    let std::net::IpAddr::V4(ip) = peer.ip() else {
        return None;
    };
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(ip.octets()),
        peer.port()
    );
    std::fs::read_to_string("/proc/net/tcp")
        .ok()?
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&want.as_str()))
                .then(|| f.get(7)?.parse().ok())
                .flatten()
        })
}

/// A deployment of policy, supervisor and gateway whose scripted agent has `network = "proxy"`
/// and an allowlist naming `allow(gateway address)`, with `extra` supervisor `--set`s.
async fn deploy_with_gateway(
    allow: impl Fn(&str) -> Vec<String>,
    extra: &[&str],
) -> warden_e2e::Deployment {
    let mut d = warden_e2e::Deployment::new(Default::default());
    let list = allow(&d.http)
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut sets = vec![
        "agents.scripted.network=\"proxy\"".to_string(),
        format!("agents.scripted.egress_allow=[{list}]"),
        "limits.egress_refusals_end_turn=0".to_string(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    for kv in sets {
        d.opts.sets.push(("supervisor".into(), kv));
    }
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    d
}

/// What the gateway answers a plain request for its agent card (a positive control: the address
/// the agent is refused is really the gateway's).
async fn card_status(gw: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    s.write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Issue 24, case 7: an agent whose allowlist names warden's own gateway (its HTTP listener, by
/// address and by a name resolving to it) does not reach it through its egress proxy, whatever
/// it sends (here the MCP endpoint a caller token would open); every other destination the
/// allowlist names still works in the same turn. The refusal names the setting, and the
/// supervisor learnt the gateway's address from the flags `warden up` gives it.
#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_never_reaches_wardens_own_listeners_whatever_the_allowlist_names() {
    if !bwrap_works() {
        return;
    }
    let allowed = server("allowed").await;
    let d = deploy_with_gateway(
        |gw| {
            let port = gw.rsplit_once(':').unwrap().1;
            vec![
                gw.to_string(),
                format!("localhost:{port}"),
                format!("127.0.0.1:{allowed}"),
            ]
        },
        &["agents.scripted.pool_size=0"],
    )
    .await;
    let gw = d.http.clone();
    let port: u16 = gw.rsplit_once(':').unwrap().1.parse().unwrap();
    assert!(
        card_status(&gw).await.contains(" 200 "),
        "the gateway answers at {gw}"
    );
    let mcp = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 2\r\n\r\n{{}}",
        d.token()
    );
    let steps = vec![
        connect("127.0.0.1", port, "proxy", &mcp),
        connect("localhost", port, "proxy", &mcp),
        connect("::ffff:127.0.0.1", port, "proxy", &mcp),
        json!({"type": "connect", "via": "proxy_raw", "send": format!("GET http://127.0.0.1:{port}/.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")}),
        connect("127.0.0.1", allowed, "proxy", "still-works\n"),
        // The mirrored loopback port inside the sandbox leads to the same proxy.
        connect("127.0.0.1", port, "direct", &mcp),
    ];
    let mut c = client(&d);
    let evs = run(
        &mut c,
        turn("doors", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let r = results(&evs);
    assert_eq!(r.len(), 6, "{r:#?}\n{evs:#?}");
    for (i, res) in r.iter().enumerate().filter(|(i, _)| *i != 4) {
        let status = res["status"].as_str().unwrap_or("");
        let received = res["received"].as_str().unwrap_or("");
        // Through the proxy the refusal is a 403; through the mirrored port the relay closes
        // the connection the proxy refused (nothing arrives).
        assert!(
            status.contains(" 403 ")
                || received.contains(" 403 ")
                || (i == 5 && received.is_empty()),
            "connection {i} reached the gateway: {res}"
        );
        assert!(
            !received.contains("jsonrpc")
                && !received.contains("agent-card")
                && !received.contains("\"name\""),
            "connection {i} got a gateway answer: {res}"
        );
    }
    assert_eq!(r[4]["received"], "allowed:still-works\n", "{}", r[4]);
    // The record says why, naming the setting; no connection to the gateway was allowed.
    let rec = egress_record(&d, "doors");
    let to_gw: Vec<&Value> = rec.iter().filter(|e| e["port"] == port).collect();
    assert!(to_gw.len() >= 5, "{rec:#?}");
    for e in &to_gw {
        assert_eq!(e["allowed"], false, "{e}");
        // What the allowlist names is refused as warden's own door (another spelling of the
        // address is not even on the allowlist).
        if e["host"] == "127.0.0.1" || e["host"] == "localhost" {
            assert_eq!(e["setting"], "egress.warden_listeners", "{e}");
            assert!(
                e["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("this warden's own listener"),
                "{e}"
            );
        }
    }
    assert!(
        to_gw
            .iter()
            .filter(|e| e["setting"] == "egress.warden_listeners")
            .count()
            >= 4,
        "{rec:#?}"
    );
    assert!(
        rec.iter()
            .any(|e| e["port"] == allowed && e["allowed"] == true),
        "{rec:#?}"
    );
}

/// Issue 24, case 7, the other half: a connection the egress proxy makes for an agent is the
/// agent's in the kernel's socket table (its uid owns the socket), which is what the gateway
/// reads to count a caller as nested (`peer.rs`). So a call that reaches the gateway through the
/// proxy by a route the supervisor does not know (here: the gateway's address left out of
/// `egress.warden_listeners`) is still counted as deep, not as the supervisor's own uid — the
/// same as the gateway's under `warden up` as root.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_the_proxy_makes_for_an_agent_is_owned_by_the_agents_uid() {
    if !bwrap_works() {
        return;
    }
    let (port, seen) = recording_owner_server().await;
    let d = deploy_proxy(
        &[format!("127.0.0.1:{port}")],
        &[("supervisor", "agents.scripted.pool_size=0")],
    )
    .await;
    let agents = client(&d)
        .list_agents(pb::ListAgentsRequest {})
        .await
        .unwrap()
        .into_inner();
    let Some(range) = agents.agent_uids.first().cloned() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: agents must have a uid of their own"
        );
        println!("SKIP: this supervisor cannot switch agents to a uid of their own (not root)");
        return;
    };
    let mut c = client(&d);
    let evs = run(
        &mut c,
        turn(
            "owner",
            "t1",
            &scenario(json!({"steps": [connect("127.0.0.1", port, "proxy", "who
")]})),
        ),
    )
    .await;
    assert_eq!(
        results(&evs)[0]["received"],
        "owner
",
        "{evs:#?}"
    );
    let owners = seen.lock().unwrap().clone();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let uid = owners[0].expect("the connection's socket is in the table");
    assert!(
        (range.first..=range.last).contains(&uid),
        "the proxy's connection is owned by uid {uid}, not by an agent uid {range:?}"
    );
    assert_ne!(
        uid,
        nix::unistd::geteuid().as_raw(),
        "not the supervisor's uid"
    );
}

/// A loopback server that records the owner uid of each client's socket (from the socket
/// table, while the connection is open) and answers `owner`.
async fn recording_owner_server() -> (u16, Arc<Mutex<Vec<Option<u32>>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = l.accept().await {
            s2.lock().unwrap().push(socket_owner(peer));
            let _ = s.write_all(b"owner\n").await;
        }
    });
    (port, seen)
}
