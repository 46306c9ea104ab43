//! Traces as an operator collects them: `warden up --approver` with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! pointing at an OTLP receiver this test starts (the OpenTelemetry project's generated
//! `TraceService`, served by tonic); a caller sends one A2A task with its own W3C `traceparent`;
//! the gateway's, the supervisor's, the approver's and the policy's spans all arrive in that one
//! trace, and every span naming the task is in it.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use serde_json::{Value, json};
use warden_e2e::{Deployment, Options, binary};

/// A received span: its daemon (`service.name`), name, trace id and string attributes.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    attributes: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(AnyValue::StringValue(s)) => s.clone(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        };
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .map(|a| text(&a.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        service: service.clone(),
                        name: s.name.clone(),
                        trace_id: s.trace_id.clone(),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|a| (a.key.clone(), text(&a.value)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A JSON-RPC call to the gateway with the caller's own `traceparent` header.
async fn send_traced(http: &str, token: &str, traceparent: &str, body: &Value) -> Value {
    let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri("/a2a/jsonrpc")
        .header(http::header::HOST, http)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("A2A-Version", "1.0")
        .header("traceparent", traceparent)
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

#[tokio::test]
async fn one_task_is_one_trace_across_the_gateway_supervisor_approver_and_policy() {
    // The receiver, on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = listener.local_addr().unwrap();
    let receiver = Receiver::default();
    let serving = receiver.clone();
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(serving))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async move {
                    stopped.notified().await;
                },
            )
            .await
            .unwrap();
    });

    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let up_log = d.dir.path().join("up.log");
    let mut up = tokio::process::Command::new(binary("warden"));
    up.args([
        "--state-dir",
        &state,
        "up",
        "--http",
        &d.http,
        "--approver",
        "--approver-http",
        "",
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
    // Batches every 200 ms rather than every 5 s.
    .env("OTEL_BSP_SCHEDULE_DELAY", "200")
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&up_log).unwrap())
    .stderr(std::fs::File::create(d.dir.path().join("up.err")).unwrap())
    .process_group(0)
    .kill_on_drop(true);
    let mut up = up.spawn().unwrap();
    let start = Instant::now();
    loop {
        let shown = std::fs::read_to_string(&up_log).unwrap_or_default();
        if shown.contains("Try:") {
            break;
        }
        if let Ok(Some(s)) = up.try_wait() {
            let err = std::fs::read_to_string(d.dir.path().join("up.err")).unwrap_or_default();
            panic!("warden up exited ({s}):\n{shown}\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not up:\n{shown}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The caller's own trace: a fixed trace id and parent span id.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let scenario = r#"{"steps":[
        {"type":"tool","kind":"read","path":"notes.txt","ask":true},
        {"type":"message","text":"read it"}]}"#;
    let answer = send_traced(
        &d.http,
        &d.token(),
        &traceparent,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": "traced-1", "role": "ROLE_USER", "parts": [{"text": scenario}]}
        }}),
    )
    .await;
    let task_id = answer["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );

    // A caller's malformed traceparent is ignored: the task runs, in a trace of its own.
    let mangled = send_traced(
        &d.http,
        &d.token(),
        "00-zzzz-not-a-trace-context-ffffffffffffffffffffffffffffffff",
        &json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {
            "message": {"messageId": "traced-2", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
        }}),
    )
    .await;
    assert_eq!(
        mangled["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{mangled}"
    );
    let mangled_id = mangled["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{mangled}"))
        .to_string();

    let wanted = [
        "warden-gateway",
        "warden-supervisor",
        "warden-approver",
        "warden-policy",
    ];
    let in_trace = |got: &[Got]| -> BTreeSet<String> {
        got.iter()
            .filter(|g| hex(&g.trace_id) == trace_id)
            .map(|g| g.service.clone())
            .collect()
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let services = in_trace(&receiver.0.lock().unwrap());
        if wanted.iter().all(|w| services.contains(*w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A stop exports whatever is still buffered (and ends the spans still open).
    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(30), up.wait()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.notify_one();

    let got = receiver.0.lock().unwrap().clone();
    let services = in_trace(&got);
    for w in wanted {
        assert!(
            services.contains(w),
            "no span of {w} in the caller's trace {trace_id}; in it: {services:?}\nall spans: {got:#?}"
        );
    }
    // The spans that say what they are: the gateway's task, the supervisor's turn and the
    // permission it asked, the policy's Decide, each in the caller's trace.
    let named = |service: &str, pred: &dyn Fn(&Got) -> bool| {
        got.iter()
            .filter(|g| g.service == service && pred(g))
            .map(|g| hex(&g.trace_id))
            .collect::<Vec<_>>()
    };
    let task_spans = named("warden-gateway", &|g| {
        g.name == "task" && g.attributes.get("task_id") == Some(&task_id)
    });
    assert_eq!(task_spans, vec![trace_id.to_string()], "{got:#?}");
    let turns = named("warden-supervisor", &|g| {
        g.name == "turn" && g.attributes.get("task_id") == Some(&task_id)
    });
    assert_eq!(turns, vec![trace_id.to_string()], "{got:#?}");
    let permissions = named("warden-supervisor", &|g| g.name == "permission");
    assert!(
        !permissions.is_empty() && permissions.iter().all(|t| t == trace_id),
        "{got:#?}"
    );
    let decides = named("warden-policy", &|g| {
        g.name.ends_with("PolicyService/Decide")
    });
    assert!(
        !decides.is_empty() && decides.iter().all(|t| t == trace_id),
        "{got:#?}"
    );
    // The task with the mangled header has a trace of its own, valid and not the first one's.
    let theirs: Vec<String> = named("warden-gateway", &|g| {
        g.name == "task" && g.attributes.get("task_id") == Some(&mangled_id)
    });
    assert_eq!(theirs.len(), 1, "{got:#?}");
    assert_ne!(theirs[0], trace_id);
    assert_ne!(theirs[0], "0".repeat(32));
    // Every span that names this task is in the caller's trace.
    for g in got
        .iter()
        .filter(|g| g.attributes.values().any(|v| v == &task_id))
    {
        assert_eq!(hex(&g.trace_id), trace_id, "{g:?}");
    }
}
