//! Adversarial framing: a hand-written byte peer on an in-memory pipe sends
//! what a broken or hostile agent could, and reads the client's exact answers.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use warden_acp::*;

struct Peer {
    client: AcpClient,
    events: AcpEvents,
    tx: WriteHalf<DuplexStream>,
    rx: Lines<BufReader<ReadHalf<DuplexStream>>>,
    _dir: tempfile::TempDir,
}

fn peer(cfg: ClientConfig) -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let handler = TestHandler::new(dir.path(), vec![], Pick::Hang);
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let (r, w) = tokio::io::split(ours);
    let (client, events) = AcpClient::connect(r, w, handler, cfg);
    let (pr, pw) = tokio::io::split(theirs);
    Peer {
        client,
        events,
        tx: pw,
        rx: BufReader::new(pr).lines(),
        _dir: dir,
    }
}

impl Peer {
    /// One write of the line and its newline: written apart, a client that refuses an oversized
    /// line before its newline arrives (it need not wait for it) has closed the pipe by then
    /// (seen once in CI as BrokenPipe on the newline).
    async fn send(&mut self, line: &str) {
        self.tx
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    async fn recv(&mut self) -> Value {
        let l = tokio::time::timeout(Duration::from_secs(5), self.rx.next_line())
            .await
            .expect("client answer")
            .unwrap()
            .unwrap();
        serde_json::from_str(&l).unwrap()
    }
}

fn perm(id: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission", "params": {
        "sessionId": "s1", "toolCall": {"toolCallId": "t1"},
        "options": [{"optionId": "a", "name": "A", "kind": "allow_once"}]}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_exact_errors() {
    let mut p = peer(config());
    // Unknown method, ungated capability (nothing advertised yet), bad params.
    p.send(r#"{"jsonrpc":"2.0","id":1,"method":"_vendor/frobnicate","params":{}}"#)
        .await;
    assert_eq!(p.recv().await["error"]["code"], -32601);
    p.send(r#"{"jsonrpc":"2.0","id":"r2","method":"fs/read_text_file","params":{"sessionId":"s1","path":"/etc/passwd"}}"#).await;
    let a = p.recv().await;
    assert_eq!(
        (a["id"].clone(), a["error"]["code"].clone()),
        (json!("r2"), json!(-32601))
    );
    p.send(r#"{"jsonrpc":"2.0","id":3,"method":"session/request_permission","params":{"sessionId":"s1"}}"#).await;
    assert_eq!(p.recv().await["error"]["code"], -32602);
    // Request whose id object is unusable: logged, not answered, not fatal.
    p.send(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"fs/read_text_file","params":{}}"#)
        .await;
    // Duplicate id of a pending request.
    // The client's read loop takes lines in order, so the first is pending when the second is read.
    p.send(&perm(json!(7))).await;
    p.send(&perm(json!(7))).await;
    let a = p.recv().await;
    assert_eq!(
        (a["id"].clone(), a["error"]["code"].clone()),
        (json!(7), json!(-32600))
    );
    // $/cancel_request for the pending permission: answered `cancelled`.
    p.send(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":7}}"#)
        .await;
    let a = p.recv().await;
    assert_eq!(
        a,
        json!({"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "cancelled"}}})
    );
    // A response nobody asked for.
    p.send(r#"{"jsonrpc":"2.0","id":999,"result":{}}"#).await;
    // Garbage of several kinds, then a valid update still arrives.
    for g in [
        "null",
        "[1,2]",
        "\"str\"",
        "{\"jsonrpc\":\"2.0\"}",
        "\u{0}\u{1}binary",
    ] {
        p.send(g).await;
    }
    p.send(r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"ok"}}}}"#).await;
    let mut got_update = false;
    let mut protocol_errors = 0;
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(2), p.events.recv()).await {
        match ev {
            AcpEvent::ProtocolError(_) => protocol_errors += 1,
            AcpEvent::Update(n) => {
                got_update = true;
                assert!(matches!(n.event, SessionEvent::AgentMessageChunk(_)));
                break;
            }
            AcpEvent::Fault(f) => panic!("unexpected fault {f}"),
        }
    }
    assert!(got_update);
    assert_eq!(protocol_errors, 6, "bad id object + 5 garbage lines");
    assert_eq!(p.client.stats().stray_responses, 1);
    assert!(p.client.fault().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_limit_is_exact_and_crlf_is_accepted() {
    let cfg = ClientConfig {
        max_line_bytes: 200,
        ..config()
    };
    let mut p = peer(cfg);
    let mk = |pad: usize| {
        let base = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"X"}}}}"#;
        base.replace("\"X\"", &format!("\"{}\"", "x".repeat(pad)))
    };
    let base_len = mk(0).len();
    let exact = mk(200 - base_len);
    assert_eq!(exact.len(), 200);
    p.send(&exact).await;
    let ev = tokio::time::timeout(Duration::from_secs(2), p.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ev, AcpEvent::Update(_)), "{ev:?}");
    p.send(&format!("{}\r", mk(3))).await; // CRLF line endings are accepted
    let ev = tokio::time::timeout(Duration::from_secs(2), p.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ev, AcpEvent::Update(_)), "{ev:?}");
    p.send(&mk(201 - base_len)).await;
    let ev = tokio::time::timeout(Duration::from_secs(2), p.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, AcpEvent::Fault(Fault::OversizedLine { limit: 200 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_never_blocks_the_read_loop() {
    let mut p = peer(config());
    // A permission that hangs forever ...
    p.send(&perm(json!("slow"))).await;
    // ... while a prompt is answered and updates keep flowing.
    let c = p.client.clone();
    let prompt = tokio::spawn(async move { c.prompt("s1", "hi", Value::Null).await });
    let req = p.recv().await;
    assert_eq!(req["method"], "session/prompt");
    p.send(r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"current_mode_update","currentModeId":"plan"}}}"#).await;
    p.send(
        &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"stopReason": "end_turn"}})
            .to_string(),
    )
    .await;
    let r = tokio::time::timeout(Duration::from_secs(2), prompt)
        .await
        .expect("prompt answered")
        .unwrap()
        .unwrap();
    assert_eq!(r.stop_reason, StopReason::EndTurn);
    assert_eq!(p.client.pending_permissions(), 1);
    let ev = p.events.recv().await.unwrap();
    assert!(
        matches!(ev, AcpEvent::Update(n) if n.event == SessionEvent::CurrentModeUpdate { current_mode_id: "plan".into() })
    );
    // The session cancel releases the hung permission.
    let rep = p
        .client
        .cancel_with_deadline("s1", Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(rep.permissions_cancelled, 1);
    let mut answered = None;
    for _ in 0..3 {
        let v = p.recv().await;
        if v["id"] == "slow" {
            answered = Some(v);
            break;
        }
    }
    assert_eq!(
        answered.unwrap()["result"],
        json!({"outcome": {"outcome": "cancelled"}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_bound_are_refused_unhandled() {
    let mut p = peer(ClientConfig {
        max_incoming_requests: 4,
        ..config()
    });
    // Four permissions hang (the handler never answers); the fifth and sixth are refused at
    // once, and the four stay pending.
    for i in 0..6 {
        p.send(&perm(json!(i))).await;
    }
    for want in [4, 5] {
        let a = p.recv().await;
        assert_eq!(a["id"], want, "{a}");
        assert_eq!(a["error"]["code"], -32603, "{a}");
        let msg = a["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("too many requests in flight") && msg.contains("at most 4"),
            "{msg}"
        );
    }
    assert_eq!(p.client.pending_permissions(), 4);
    assert!(p.client.fault().is_none(), "refusing is not a fault");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_byte_bound_are_refused_unhandled() {
    let mut p = peer(ClientConfig {
        max_incoming_bytes: 250_000,
        ..config()
    });
    // Permissions of ~100 KB each hang (the handler never answers): two are held (200 KB), the
    // third would pass 250 KB and is refused at once; a small one still fits.
    let big = |id: i64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission", "params": {
            "sessionId": "s1", "toolCall": {"toolCallId": "t1", "title": "x".repeat(100_000)},
            "options": [{"optionId": "a", "name": "A", "kind": "allow_once"}]}})
        .to_string()
    };
    for i in 0..3 {
        p.send(&big(i)).await;
    }
    let a = p.recv().await;
    assert_eq!(a["id"], 2, "{a}");
    assert_eq!(a["error"]["code"], -32603, "{a}");
    let msg = a["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("too many bytes of requests in flight"),
        "{msg}"
    );
    p.send(&perm(json!(3))).await;
    // The small one is held (no answer: the handler hangs), so three are pending.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(p.client.pending_permissions(), 3);
    assert!(p.client.fault().is_none(), "refusing is not a fault");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_reading_faults_the_connection_instead_of_growing_the_queue() {
    let limit = 2 * 1024 * 1024;
    let mut p = peer(ClientConfig {
        max_queued_bytes: limit,
        ..config()
    });
    // Each request's answer (an error naming the 100 KB method) is about 100 KB; the pipe holds
    // 1 MiB and the peer never reads it: the queue passes 2 MiB within 40 requests.
    let method = format!("_x{}", "a".repeat(100_000));
    for i in 0..40 {
        let line = json!({"jsonrpc": "2.0", "id": i, "method": method, "params": {}}).to_string();
        // Once the connection faulted the client stops reading: the pipe breaks.
        if p.tx
            .write_all(format!("{line}\n").as_bytes())
            .await
            .is_err()
        {
            break;
        }
    }
    let fault = tokio::time::timeout(Duration::from_secs(5), p.client.faulted())
        .await
        .expect("a fault");
    assert_eq!(fault, Fault::InputNotRead { limit });
    assert!(
        fault.to_string().contains("stopped reading its input"),
        "{fault}"
    );
    // Nothing more is sent to it: a request fails with the fault at once.
    let e = p
        .client
        .request("session/new", json!({}))
        .await
        .unwrap_err();
    assert_eq!(e, AcpError::Fault(Fault::InputNotRead { limit }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_nobody_takes_fault_the_connection_at_their_bound() {
    let limit = 1024 * 1024;
    let p = peer(ClientConfig {
        max_queued_event_bytes: limit,
        ..config()
    });
    let mut tx = p.tx;
    let line = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
        "update": {"sessionUpdate": "agent_message_chunk",
                   "content": {"type": "text", "text": "x".repeat(100_000)}}}})
    .to_string();
    // Nobody takes the events (between turns nobody does): 30 updates of 100 KB pass 1 MiB.
    for _ in 0..30 {
        if tx.write_all(format!("{line}\n").as_bytes()).await.is_err() {
            break;
        }
    }
    let fault = tokio::time::timeout(Duration::from_secs(5), p.client.faulted())
        .await
        .expect("a fault");
    assert_eq!(fault, Fault::UpdatesNotTaken { limit });
    // What was queued is still there to take, the fault last.
    let mut events = p.events;
    let mut updates = 0;
    while let Ok(ev) = events.try_recv() {
        match ev {
            AcpEvent::Update(_) => updates += 1,
            AcpEvent::Fault(f) => {
                assert_eq!(f, Fault::UpdatesNotTaken { limit });
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!((10..=11).contains(&updates), "{updates} updates queued");
}
