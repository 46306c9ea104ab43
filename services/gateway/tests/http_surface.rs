//! The gateway's real router, driven request by request: every malformed request gets its
//! specified error, the card stays public with caching headers, tokens and principals isolate
//! tasks, and tasks survive a restart of the gateway's core.
//!
//! The supervisor here is simply absent (its socket does not exist): these tests exercise what the
//! gateway decides on its own, and that a turn the supervisor cannot run ends FAILED with the
//! reason instead of hanging. Turns that really run are in the end-to-end tests.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use warden_gateway::admission::HttpState;
use warden_gateway::auth::{Authenticator, HostAllowlist, token_digest_hex};
use warden_gateway::card::{CardResponse, agent_card};
use warden_gateway::config::{EMBEDDED, GatewayConfig};
use warden_gateway::core::{Core, CoreSettings};
use warden_gateway::http::router;
use warden_gateway::store::TaskStore;
use warden_gateway::store_sled::SledStore;

/// (name, extra headers, body, HTTP status, JSON-RPC code)
type RpcRow<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16, i64);
/// (name, method, uri, headers, body, HTTP status, ErrorInfo reason)
type RestRow<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    String,
    u16,
    Option<&'a str>,
);

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";

struct Fixture {
    _dir: tempfile::TempDir,
    app: Router,
}

fn config() -> GatewayConfig {
    let loaded = warden_daemon::config::load::<GatewayConfig>(
        None,
        EMBEDDED,
        "WARDEN_GATEWAY_HTTP_TEST",
        &[
            "http.public_url=\"https://gw.example/base/\"".into(),
            "http.bind=\"127.0.0.1:0\"".into(),
        ],
    )
    .unwrap();
    loaded.value.validate(&loaded.origin).unwrap();
    loaded.value
}

fn build(dir: &std::path::Path, hosts: HostAllowlist, max_body: usize) -> Router {
    let cfg = config();
    let store: TaskStore = std::sync::Arc::new(SledStore::open(&dir.join("store")).unwrap());
    let channel = warden_daemon::client::unix_channel(&dir.join("no-supervisor.sock"));
    let core = Core::new(
        store,
        channel,
        CoreSettings {
            agents: vec!["scripted".into(), "other".into()],
            default_agent: "scripted".into(),
            turn_timeout_seconds: 0,
            cancel_grace: Duration::from_millis(500),
            coalesce_bytes: 1024,
            retention: warden_gateway::core::Retention::default(),
            max_streams_per_principal: 1024,
            stream_keepalive: Duration::from_secs(15),
        },
    );
    let da = token_digest_hex(ALICE);
    let db = token_digest_hex(BOB);
    router(Arc::new(HttpState {
        core,
        auth: Authenticator::from_digests([("alice", da.as_str()), ("bob", db.as_str())]),
        hosts,
        max_body,
        body_timeout: Duration::from_secs(30),
        card: CardResponse::new(&agent_card(&cfg), 300),
    }))
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let app = build(dir.path(), HostAllowlist::off(), 1024 * 1024);
    Fixture { _dir: dir, app }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    fn rpc_code(&self) -> i64 {
        self.json()["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error code: {}", self.text))
    }
    /// The SSE `data:` payloads, in order.
    fn sse(&self) -> Vec<Value> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = tokio::time::timeout(
        Duration::from_secs(10),
        axum::body::to_bytes(resp.into_body(), usize::MAX),
    )
    .await
    .expect("response body did not end")
    .unwrap();
    Reply {
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn rpc(app: &Router, token: &str, body: Value) -> Reply {
    let auth = bearer(token);
    call(
        app,
        "POST",
        "/a2a/jsonrpc",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("a2a-version", "1.0"),
        ],
        body.to_string(),
    )
    .await
}

fn send_params(message_id: &str, extra: Value) -> Value {
    let mut msg = json!({"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "write hello.txt"}]});
    if let (Some(m), Some(e)) = (msg.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({"message": msg})
}

#[tokio::test]
async fn json_rpc_bad_input_table() {
    let f = fixture();
    let auth = bearer(ALICE);
    let good = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}})
        .to_string();
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\",\"params\":{{\"id\":\"{}\"}}}}",
        "x".repeat(1024 * 1024 + 10)
    );
    // (name, headers, body, expected HTTP status, expected JSON-RPC code)
    let rows: Vec<RpcRow> = vec![
        ("text/plain body", vec![("content-type", "text/plain")], "not json at all".into(), 200, -32005),
        ("no content type", vec![], good.clone(), 200, -32005),
        ("form content type", vec![("content-type", "application/x-www-form-urlencoded")], good.clone(), 200, -32005),
        ("body over 1 MiB", vec![("content-type", "application/json")], big, 413, -32600),
        ("malformed JSON", vec![("content-type", "application/json")], "{\"jsonrpc\": \"2.0\", ".into(), 200, -32700),
        ("batch array", vec![("content-type", "application/json")], format!("[{good}]"), 200, -32600),
        ("wrong jsonrpc version", vec![("content-type", "application/json")],
            json!({"jsonrpc": "1.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}).to_string(), 200, -32600),
        ("no id", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}}).to_string(), 200, -32600),
        ("method not a string", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": 7}).to_string(), 200, -32600),
        ("unknown method", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "DoMagic", "params": {}}).to_string(), 200, -32601),
        ("0.3 method name", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}).to_string(), 200, -32601),
        ("params not an object", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": [1]}).to_string(), 200, -32602),
        ("part text of wrong type", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": 5}]}}}).to_string(), 200, -32602),
        ("role of wrong spelling (0.3)", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "user", "parts": [{"text": "x"}]}}}).to_string(), 200, -32602),
        ("missing message", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}).to_string(), 200, -32602),
        ("empty messageId", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("", json!({}))}).to_string(), 200, -32602),
        ("no parts", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}}).to_string(), 200, -32602),
        ("agent role", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}}).to_string(), 200, -32602),
        ("unknown agent", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m", json!({"metadata": {"agent": "ghost"}}))}).to_string(), 200, -32602),
        ("negative historyLength", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x", "historyLength": -1}}).to_string(), 200, -32602),
        ("pageSize 0", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 0}}).to_string(), 200, -32602),
        ("pageSize of wrong type", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": "ten"}}).to_string(), 200, -32602),
        ("bad pageToken", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageToken": "zz"}}).to_string(), 200, -32602),
        ("bad statusTimestampAfter", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"statusTimestampAfter": "yesterday"}}).to_string(), 200, -32602),
        ("unknown task", vec![("content-type", "application/json")], good.clone(), 200, -32001),
        ("cancel unknown task", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "CancelTask", "params": {"id": "nope"}}).to_string(), 200, -32001),
        ("subscribe unknown task", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": "nope"}}).to_string(), 200, -32001),
        ("push config", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig", "params": {"taskId": "t", "url": "https://x"}}).to_string(), 200, -32003),
        ("push config inside send", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}, "configuration": {"taskPushNotificationConfig": {"url": "https://x"}}}}).to_string(), 200, -32003),
        ("message to unknown task", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m", json!({"taskId": "nope"}))}).to_string(), 200, -32001),
        ("over-long contextId", vec![("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m", json!({"contextId": "c".repeat(300)}))}).to_string(), 200, -32602),
    ];
    for (name, extra, body, status, code) in rows {
        let mut headers = vec![("authorization", auth.as_str()), ("a2a-version", "1.0")];
        headers.extend(extra);
        let r = call(&f.app, "POST", "/a2a/jsonrpc", &headers, body).await;
        assert_eq!(r.status.as_u16(), status, "{name}: {}", r.text);
        assert_eq!(r.rpc_code(), code, "{name}: {}", r.text);
        assert_eq!(r.json()["jsonrpc"], "2.0", "{name}");
        let reason = &r.json()["error"]["data"][0]["reason"];
        if (-32009..=-32001).contains(&code) {
            assert!(
                reason.is_string(),
                "{name}: A2A errors carry ErrorInfo: {}",
                r.text
            );
            assert_eq!(r.json()["error"]["data"][0]["domain"], "a2a-protocol.org");
        }
    }
}

#[tokio::test]
async fn versions_other_than_1_0_are_refused_with_32009_and_a_hint() {
    let f = fixture();
    let auth = bearer(ALICE);
    let body = json!({"jsonrpc": "2.0", "id": "x1", "method": "GetTask", "params": {"id": "t"}})
        .to_string();
    for version in [None, Some("0.3"), Some("0.5"), Some("1.0.1"), Some("2.0")] {
        let mut h = vec![
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(v) = version {
            h.push(("a2a-version", v));
        }
        let r = call(&f.app, "POST", "/a2a/jsonrpc", &h, body.clone()).await;
        assert_eq!(r.rpc_code(), -32009, "{version:?}: {}", r.text);
        assert_eq!(r.json()["id"], "x1");
        assert_eq!(
            r.json()["error"]["data"][0]["reason"],
            "VERSION_NOT_SUPPORTED"
        );
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains("A2A-Version: 1.0"), "{msg}");
    }
    // The version may also come as a query parameter.
    let r = call(
        &f.app,
        "POST",
        "/a2a/jsonrpc?A2A-Version=1.0",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        body.clone(),
    )
    .await;
    assert_eq!(r.rpc_code(), -32001, "{}", r.text);
    // REST: HTTP 400 with google.rpc.Status.
    let r = call(
        &f.app,
        "GET",
        "/a2a/rest/tasks/t",
        &[("authorization", &auth)],
        Body::empty(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json()["error"]["details"][0]["reason"],
        "VERSION_NOT_SUPPORTED"
    );
}

#[tokio::test]
async fn json_rpc_is_served_with_and_without_trailing_slash_and_at_the_root() {
    let f = fixture();
    let auth = bearer(ALICE);
    let body =
        json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "t"}}).to_string();
    for path in ["/a2a/jsonrpc", "/a2a/jsonrpc/", "/"] {
        let r = call(
            &f.app,
            "POST",
            path,
            &[
                ("authorization", &auth),
                ("content-type", "application/json; charset=utf-8"),
                ("a2a-version", "1.0"),
            ],
            body.clone(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.rpc_code(), -32001, "{path}: {}", r.text);
        assert_eq!(r.json()["id"], 3);
    }
}

#[tokio::test]
async fn rest_bad_input_table() {
    let f = fixture();
    let auth = bearer(ALICE);
    let v = ("a2a-version", "1.0");
    let a = ("authorization", auth.as_str());
    let send = send_params("m1", json!({})).to_string();
    // (name, method, uri, headers, body, status, reason)
    let rows: Vec<RestRow> = vec![
        (
            "unknown task",
            "GET",
            "/a2a/rest/tasks/nope",
            vec![a, v],
            String::new(),
            404,
            Some("TASK_NOT_FOUND"),
        ),
        (
            "unknown task at root",
            "GET",
            "/tasks/nope",
            vec![a, v],
            String::new(),
            404,
            Some("TASK_NOT_FOUND"),
        ),
        (
            "cancel unknown",
            "POST",
            "/a2a/rest/tasks/nope:cancel",
            vec![a, v],
            String::new(),
            404,
            Some("TASK_NOT_FOUND"),
        ),
        (
            "subscribe unknown (GET)",
            "GET",
            "/a2a/rest/tasks/nope:subscribe",
            vec![a, v],
            String::new(),
            404,
            Some("TASK_NOT_FOUND"),
        ),
        (
            "subscribe unknown (POST)",
            "POST",
            "/a2a/rest/tasks/nope:subscribe",
            vec![a, v],
            String::new(),
            404,
            Some("TASK_NOT_FOUND"),
        ),
        (
            "text/plain send",
            "POST",
            "/a2a/rest/message:send",
            vec![a, v, ("content-type", "text/plain")],
            "hello".into(),
            400,
            Some("CONTENT_TYPE_NOT_SUPPORTED"),
        ),
        (
            "malformed JSON",
            "POST",
            "/a2a/rest/message:send",
            vec![a, v, ("content-type", "application/json")],
            "{".into(),
            400,
            None,
        ),
        (
            "not an object",
            "POST",
            "/a2a/rest/message:send",
            vec![a, v, ("content-type", "application/json")],
            "[]".into(),
            400,
            None,
        ),
        (
            "wrong types",
            "POST",
            "/a2a/rest/message:send",
            vec![a, v, ("content-type", "application/a2a+json")],
            json!({"message": {"messageId": 1, "role": "ROLE_USER", "parts": []}}).to_string(),
            400,
            None,
        ),
        (
            "no version",
            "POST",
            "/a2a/rest/message:send",
            vec![a, ("content-type", "application/json")],
            send.clone(),
            400,
            Some("VERSION_NOT_SUPPORTED"),
        ),
        (
            "push configs",
            "POST",
            "/a2a/rest/tasks/t/pushNotificationConfigs",
            vec![a, v],
            "{}".into(),
            400,
            Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
        ),
        (
            "push config get",
            "GET",
            "/a2a/rest/tasks/t/pushNotificationConfigs/c",
            vec![a, v],
            String::new(),
            400,
            Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
        ),
        (
            "bad pageSize",
            "GET",
            "/a2a/rest/tasks?pageSize=abc",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "pageSize out of range",
            "GET",
            "/a2a/rest/tasks?pageSize=101",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "bad percent-encoding",
            "GET",
            "/a2a/rest/tasks?contextId=%zz",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "percent-encoding cut short",
            "GET",
            "/a2a/rest/tasks?contextId=ab%4",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "percent-encoding that is not UTF-8",
            "GET",
            "/a2a/rest/tasks?contextId=%C3%28",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "unknown status",
            "GET",
            "/a2a/rest/tasks?status=done",
            vec![a, v],
            String::new(),
            400,
            None,
        ),
        (
            "unknown task operation",
            "POST",
            "/a2a/rest/tasks/t:explode",
            vec![a, v],
            String::new(),
            404,
            None,
        ),
        (
            "unknown route",
            "GET",
            "/a2a/rest/nothing-here",
            vec![a, v],
            String::new(),
            404,
            None,
        ),
    ];
    for (name, method, uri, headers, body, status, reason) in rows {
        let r = call(&f.app, method, uri, &headers, body).await;
        assert_eq!(r.status.as_u16(), status, "{name}: {}", r.text);
        assert_eq!(r.json()["error"]["code"], status, "{name}: {}", r.text);
        if let Some(reason) = reason {
            assert_eq!(
                r.json()["error"]["details"][0]["reason"],
                reason,
                "{name}: {}",
                r.text
            );
        }
    }
    let ok = call(
        &f.app,
        "GET",
        "/a2a/rest/tasks?pageSize=5&status=TASK_STATE_FAILED",
        &[a, v],
        Body::empty(),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    assert_eq!(
        ok.json(),
        json!({"tasks": [], "nextPageToken": "", "pageSize": 5, "totalSize": 0})
    );
    // Names and values are percent-decoded (`%5F` is `_`) before they are read, and a proto field
    // name means its ProtoJSON one.
    let encoded = call(
        &f.app,
        "GET",
        "/a2a/rest/tasks?page%5Fsize=7&status=TASK%5FSTATE%5FFAILED&contextId=a+b%2Fc",
        &[a, v],
        Body::empty(),
    )
    .await;
    assert_eq!(encoded.status, StatusCode::OK, "{}", encoded.text);
    assert_eq!(encoded.json()["pageSize"], 7, "{}", encoded.text);
    // A malformed escape is refused in the binding's shape, naming what was wrong.
    let bad = call(
        &f.app,
        "GET",
        "/a2a/rest/tasks?contextId=%zz",
        &[a, v],
        Body::empty(),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    assert!(
        bad.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bad percent-encoding") && m.contains("%zz")),
        "{}",
        bad.text
    );
}

#[tokio::test]
async fn tokens_are_required_everywhere_but_the_card() {
    let f = fixture();
    for (method, uri) in [
        ("POST", "/a2a/jsonrpc"),
        ("POST", "/a2a/rest/message:send"),
        ("GET", "/a2a/rest/tasks"),
        ("GET", "/tasks/x"),
        ("POST", "/tasks/x:cancel"),
    ] {
        for (token, challenge_has_error) in [
            (None, false),
            (Some("Bearer wrong-token-0123456789".to_string()), true),
            (Some(format!("Basic {ALICE}")), true),
            (Some(format!("Bearer {}", token_digest_hex(ALICE))), true),
        ] {
            let mut h = vec![("a2a-version", "1.0"), ("content-type", "application/json")];
            if let Some(t) = &token {
                h.push(("authorization", t.as_str()));
            }
            let r = call(&f.app, method, uri, &h, "{}").await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {token:?}"
            );
            let challenge = r.headers.get("www-authenticate").unwrap().to_str().unwrap();
            assert!(challenge.starts_with("Bearer"), "{challenge}");
            assert_eq!(
                challenge.contains("invalid_token"),
                challenge_has_error,
                "{challenge}"
            );
        }
    }
    let card = call(
        &f.app,
        "GET",
        "/.well-known/agent-card.json",
        &[],
        Body::empty(),
    )
    .await;
    assert_eq!(card.status, StatusCode::OK);
}

#[tokio::test]
async fn the_card_is_public_cached_and_built_from_the_public_url() {
    let f = fixture();
    let r = call(
        &f.app,
        "GET",
        "/.well-known/agent-card.json",
        &[],
        Body::empty(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.headers["cache-control"]
            .to_str()
            .unwrap()
            .contains("max-age=300")
    );
    let etag = r.headers["etag"].to_str().unwrap().to_string();
    assert!(etag.starts_with('"'));
    assert!(r.headers.contains_key("last-modified"));
    let card = r.json();
    let urls: Vec<(String, String, String)> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["url"].as_str().unwrap().to_string(),
                i["protocolBinding"].as_str().unwrap().to_string(),
                i["protocolVersion"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        urls,
        vec![
            (
                "https://gw.example/base/a2a/jsonrpc".into(),
                "JSONRPC".into(),
                "1.0".into()
            ),
            (
                "https://gw.example/base/a2a/rest".into(),
                "HTTP+JSON".into(),
                "1.0".into()
            ),
            // The same endpoints serve A2A 0.3 (requests without A2A-Version).
            (
                "https://gw.example/base/a2a/jsonrpc".into(),
                "JSONRPC".into(),
                "0.3.0".into()
            ),
            (
                "https://gw.example/base/a2a/rest".into(),
                "HTTP+JSON".into(),
                "0.3.0".into()
            ),
        ]
    );
    // The 0.3 card fields beside the 1.0 ones.
    assert_eq!(card["protocolVersion"], "0.3.0");
    assert_eq!(card["url"], "https://gw.example/base/a2a/jsonrpc");
    assert_eq!(card["preferredTransport"], "JSONRPC");
    assert_eq!(
        card["additionalInterfaces"][1],
        serde_json::json!({"url": "https://gw.example/base/a2a/rest", "transport": "HTTP+JSON"})
    );
    assert_eq!(card["securitySchemes"]["bearer"]["type"], "http");
    assert_eq!(card["security"], serde_json::json!([{"bearer": []}]));
    // A fetch that asks for 1.0 gets the card as 1.0 defines it (no 0.3 members), its own ETag.
    let plain = call(
        &f.app,
        "GET",
        "/.well-known/agent-card.json",
        &[("a2a-version", "1.0")],
        Body::empty(),
    )
    .await;
    assert_eq!(plain.status, StatusCode::OK);
    assert_ne!(plain.headers["etag"], r.headers["etag"]);
    assert_eq!(plain.headers["vary"], "A2A-Version");
    let p = plain.json();
    for key in [
        "url",
        "protocolVersion",
        "preferredTransport",
        "additionalInterfaces",
        "security",
    ] {
        assert!(p.get(key).is_none(), "{key} in the 1.0 card: {p}");
    }
    assert!(p["securitySchemes"]["bearer"].get("type").is_none());
    assert_eq!(p["supportedInterfaces"], card["supportedInterfaces"]);
    assert!(
        !r.text.contains("127.0.0.1"),
        "the bind address must not leak into the card"
    );
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert_eq!(card["skills"][0]["id"], "scripted");
    for key in [
        "name",
        "description",
        "version",
        "defaultInputModes",
        "defaultOutputModes",
    ] {
        assert!(!card[key].is_null(), "{key}");
    }
    let again = call(
        &f.app,
        "GET",
        "/.well-known/agent-card.json",
        &[("if-none-match", &etag)],
        Body::empty(),
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.text.is_empty());
}

#[tokio::test]
async fn a_wide_bind_checks_the_host_header() {
    let dir = tempfile::tempdir().unwrap();
    let app = build(
        dir.path(),
        HostAllowlist::new(["gw.example".to_string()]),
        1 << 20,
    );
    let auth = bearer(ALICE);
    for host in ["evil.example", "gw.example.evil.example", "127.0.0.1:8080"] {
        let r = call(
            &app,
            "GET",
            "/.well-known/agent-card.json",
            &[("host", host)],
            Body::empty(),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
        let r = call(
            &app,
            "GET",
            "/a2a/rest/tasks",
            &[
                ("host", host),
                ("authorization", &auth),
                ("a2a-version", "1.0"),
            ],
            Body::empty(),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
    }
    let r = call(
        &app,
        "GET",
        "/.well-known/agent-card.json",
        &[("host", "gw.example:443")],
        Body::empty(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &app,
        "GET",
        "/a2a/rest/tasks",
        &[
            ("host", "gw.example"),
            ("authorization", &auth),
            ("a2a-version", "1.0"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn a_configurable_body_limit_is_enforced_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let app = build(dir.path(), HostAllowlist::off(), 2048);
    let auth = bearer(ALICE);
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m", json!({"metadata": {"pad": "p".repeat(4000)}}))});
    let r = call(
        &app,
        "POST",
        "/a2a/jsonrpc",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("a2a-version", "1.0"),
        ],
        big.to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.rpc_code(), -32600);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2048")
    );
    // A chunked body without Content-Length is cut off at the limit too.
    let stream = futures::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1000])));
    let r = call(
        &app,
        "POST",
        "/a2a/rest/message:send",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("a2a-version", "1.0"),
        ],
        Body::from_stream(stream),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// With the supervisor unreachable, a task ends FAILED with the reason (it never stays WORKING),
/// by JSON-RPC, REST and SSE alike.
#[tokio::test]
async fn a_turn_the_supervisor_cannot_run_fails_with_the_reason() {
    let f = fixture();
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m1", json!({}))})).await;
    let task = &r.json()["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{}", r.text);
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(why.contains("supervisor could not run the turn"), "{why}");
    assert_eq!(task["history"][0]["messageId"], "m1");
    assert_eq!(task["history"][0]["role"], "ROLE_USER");

    let auth = bearer(ALICE);
    let r = call(
        &f.app,
        "POST",
        "/a2a/jsonrpc/",
        &[("authorization", &auth), ("content-type", "application/json"), ("a2a-version", "1.0")],
        json!({"jsonrpc": "2.0", "id": "s1", "method": "SendStreamingMessage", "params": send_params("m2", json!({}))}).to_string(),
    )
    .await;
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let events = r.sse();
    assert_eq!(events.len(), 2, "{}", r.text);
    assert_eq!(events[0]["id"], "s1");
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
    assert_eq!(
        events[1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_FAILED"
    );
    let tid = events[0]["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Subscribing to a terminal task is an unsupported operation.
    let r = rpc(
        &f.app,
        ALICE,
        json!({"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": tid}}),
    )
    .await;
    assert_eq!(r.rpc_code(), -32004);
    // So is cancelling one, as TaskNotCancelable, and sending to it.
    let r = rpc(
        &f.app,
        ALICE,
        json!({"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": tid}}),
    )
    .await;
    assert_eq!(r.rpc_code(), -32002);
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": send_params("m3", json!({"taskId": tid}))})).await;
    assert_eq!(r.rpc_code(), -32004);

    let r = call(
        &f.app,
        "POST",
        "/a2a/rest/message:stream",
        &[
            ("authorization", &auth),
            ("content-type", "application/a2a+json"),
            ("a2a-version", "1.0"),
        ],
        send_params("m4", json!({})).to_string(),
    )
    .await;
    let events = r.sse();
    assert!(
        events[0]["task"].is_object(),
        "REST SSE carries the bare StreamResponse: {}",
        r.text
    );
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_FAILED"
    );
}

#[tokio::test]
async fn principals_cannot_see_or_touch_each_others_tasks_or_contexts() {
    let f = fixture();
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m1", json!({"contextId": "alice-ctx"}))})).await;
    let tid = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (method, params) in [
        ("GetTask", json!({"id": tid})),
        ("CancelTask", json!({"id": tid})),
        ("SubscribeToTask", json!({"id": tid})),
        ("SendMessage", send_params("b1", json!({"taskId": tid}))),
        (
            "SendMessage",
            send_params("b2", json!({"contextId": "alice-ctx"})),
        ),
    ] {
        let r = rpc(
            &f.app,
            BOB,
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
        )
        .await;
        assert_eq!(r.rpc_code(), -32001, "bob {method}: {}", r.text);
    }
    let auth = bearer(BOB);
    let r = call(
        &f.app,
        "GET",
        &format!("/a2a/rest/tasks/{tid}"),
        &[("authorization", &auth), ("a2a-version", "1.0")],
        Body::empty(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = rpc(
        &f.app,
        BOB,
        json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}),
    )
    .await;
    assert_eq!(r.json()["result"]["totalSize"], 0, "{}", r.text);
    // Alice sees hers, and a second task in the same context joins it.
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid, "historyLength": 1}})).await;
    assert_eq!(r.json()["result"]["id"], tid.as_str());
    assert_eq!(r.json()["result"]["history"].as_array().unwrap().len(), 1);
    rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m2", json!({"contextId": "alice-ctx"}))})).await;
    rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m3", json!({}))})).await;
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "alice-ctx", "pageSize": 1}})).await;
    let res = &r.json()["result"];
    assert_eq!(res["totalSize"], 2, "{}", r.text);
    assert_eq!(res["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(res["nextPageToken"], "1");
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "alice-ctx", "pageSize": 1, "pageToken": "1"}})).await;
    assert_eq!(r.json()["result"]["nextPageToken"], "");
    // A context runs one agent; asking for another in it is refused.
    let r = rpc(&f.app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m4", json!({"contextId": "alice-ctx", "metadata": {"agent": "other"}}))})).await;
    assert_eq!(r.rpc_code(), -32602, "{}", r.text);
}

#[tokio::test]
async fn tasks_survive_a_restart_of_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let tid = {
        let app = build(dir.path(), HostAllowlist::off(), 1 << 20);
        let r = rpc(&app, ALICE, json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params("m1", json!({}))})).await;
        r.json()["result"]["task"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Give sled's handles time to be dropped by the finished driver before reopening.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let app = build(dir.path(), HostAllowlist::off(), 1 << 20);
    let r = rpc(
        &app,
        ALICE,
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid}}),
    )
    .await;
    assert_eq!(
        r.json()["result"]["status"]["state"],
        "TASK_STATE_FAILED",
        "{}",
        r.text
    );
    assert_eq!(r.json()["result"]["history"][0]["messageId"], "m1");
    let r = rpc(
        &app,
        ALICE,
        json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}),
    )
    .await;
    assert_eq!(r.json()["result"]["totalSize"], 1);
}
