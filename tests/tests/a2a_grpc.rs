//! The A2A gRPC binding (`lf.a2a.v1.A2AService`) of the real gateway, driven with a tonic client
//! generated from the vendored `a2a.proto`: the card lists it; a call without a valid bearer
//! token in the `authorization` metadata is UNAUTHENTICATED; an unsupported `a2a-version` is
//! FAILED_PRECONDITION with the A2A ErrorInfo; another task's id is NOT_FOUND; a streamed send
//! gives the Task first and closes after the terminal status; SubscribeToTask on a task waiting
//! for input follows it, after an answer sent over gRPC, to COMPLETED; and tasks made over gRPC
//! are the same tasks JSON-RPC sees. (The Python SDK over gRPC is `services/gateway/tests/a2a_sdk.rs`.)

use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use warden_e2e::{Deployment, Options};
use warden_proto::a2a::v1 as pb;
use warden_proto::a2a::v1::a2a_service_client::A2aServiceClient;

async fn deploy() -> (Deployment, String) {
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = Deployment::up(Options {
        sets: vec![
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
        ],
        ..Options::default()
    })
    .await;
    (d, grpc)
}

async fn client(addr: &str) -> A2aServiceClient<tonic::transport::Channel> {
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

fn text_message(id: &str, text: &str) -> pb::Message {
    pb::Message {
        message_id: id.into(),
        role: pb::Role::User as i32,
        parts: vec![pb::Part {
            content: Some(pb::part::Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn reason(s: &tonic::Status) -> String {
    // google.rpc.Status { details: [Any(ErrorInfo { reason = 1 })] }, read without a schema crate.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Info {
        #[prost(string, tag = "1")]
        reason: String,
        #[prost(string, tag = "2")]
        domain: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct St {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(message, repeated, tag = "3")]
        details: Vec<prost_types::Any>,
    }
    use prost::Message;
    let st = St::decode(s.details()).expect("status details are a google.rpc.Status");
    let any = st.details.first().expect("an ErrorInfo detail");
    assert_eq!(any.type_url, "type.googleapis.com/google.rpc.ErrorInfo");
    let info = Info::decode(any.value.as_slice()).unwrap();
    assert_eq!(info.domain, "a2a-protocol.org");
    info.reason
}

fn state(t: &pb::Task) -> pb::TaskState {
    t.status
        .as_ref()
        .and_then(|s| pb::TaskState::try_from(s.state).ok())
        .unwrap_or(pb::TaskState::Unspecified)
}

#[tokio::test]
async fn the_grpc_binding_authenticates_streams_and_shares_the_task_store() {
    let (d, grpc) = deploy().await;
    let token = d.token();
    // The card lists the gRPC interface next to the JSON ones.
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", &token)
        .await
        .unwrap();
    let bindings: Vec<(String, String)> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["protocolBinding"].as_str().unwrap().to_string(),
                i["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        bindings.contains(&("GRPC".to_string(), grpc.clone())),
        "{bindings:?}"
    );

    let mut c = client(&grpc).await;
    // No token, a wrong token: UNAUTHENTICATED, nothing else said.
    let e = c
        .get_task(pb::GetTaskRequest {
            id: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = c
        .get_task(authed(
            pb::GetTaskRequest {
                id: "x".into(),
                ..Default::default()
            },
            "not-the-token",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // An unsupported version.
    let mut r = authed(
        pb::GetTaskRequest {
            id: "x".into(),
            ..Default::default()
        },
        &token,
    );
    r.metadata_mut()
        .insert("a2a-version", MetadataValue::from_static("0.5"));
    let e = c.get_task(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(reason(&e), "VERSION_NOT_SUPPORTED");
    // Unknown task.
    let e = c
        .get_task(authed(
            pb::GetTaskRequest {
                id: "no-such-task".into(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(reason(&e), "TASK_NOT_FOUND");
    // A message without parts is invalid.
    let e = c
        .send_message(authed(
            pb::SendMessageRequest {
                message: Some(pb::Message {
                    message_id: "m".into(),
                    role: pb::Role::User as i32,
                    ..Default::default()
                }),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    // Streaming: Task first, then updates, closed after COMPLETED.
    let mut stream = c
        .send_streaming_message(authed(
            pb::SendMessageRequest {
                message: Some(text_message("tck-stream-001-g", "hi")),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut kinds = Vec::new();
    let mut task_id = String::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("an event within 30 s")
    {
        match ev.unwrap().payload.unwrap() {
            pb::stream_response::Payload::Task(t) => {
                task_id = t.id.clone();
                kinds.push("task".to_string());
            }
            pb::stream_response::Payload::StatusUpdate(s) => kinds.push(
                pb::TaskState::try_from(s.status.unwrap().state)
                    .unwrap()
                    .as_str_name()
                    .to_string(),
            ),
            pb::stream_response::Payload::ArtifactUpdate(a) => {
                let text: String = a
                    .artifact
                    .unwrap()
                    .parts
                    .iter()
                    .filter_map(|p| match &p.content {
                        Some(pb::part::Content::Text(t)) => Some(t.clone()),
                        _ => None,
                    })
                    .collect();
                kinds.push(format!("artifact:{text}"));
            }
            pb::stream_response::Payload::Message(_) => kinds.push("message".into()),
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("task"), "{kinds:?}");
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("TASK_STATE_COMPLETED"),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"artifact:Stream hello from TCK".to_string()),
        "{kinds:?}"
    );
    // The same task over JSON-RPC.
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &token,
        Some(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}})),
    )
    .await
    .unwrap();
    let (v, _) = warden_cli::client::read_answer(resp).await.unwrap();
    assert_eq!(
        v["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );

    // Subscribe to a task waiting for input, answer it over gRPC, follow it to the end.
    let sent = c
        .send_message(authed(
            pb::SendMessageRequest {
                message: Some(text_message("tck-input-required-g", "ask me")),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let Some(pb::send_message_response::Payload::Task(t)) = sent.payload else {
        panic!("a task")
    };
    assert_eq!(state(&t), pb::TaskState::InputRequired);
    let mut sub = c
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: t.id.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let first = sub.next().await.unwrap().unwrap();
    assert!(
        matches!(first.payload, Some(pb::stream_response::Payload::Task(ref s)) if state(s) == pb::TaskState::InputRequired),
        "{first:?}"
    );
    let mut answer = text_message("answer-g", "blue");
    answer.task_id = t.id.clone();
    let done = c
        .send_message(authed(
            pb::SendMessageRequest {
                message: Some(answer),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let Some(pb::send_message_response::Payload::Task(done)) = done.payload else {
        panic!("a task")
    };
    assert_eq!(state(&done), pb::TaskState::Completed);
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("the subscription ends")
    {
        if let Some(pb::stream_response::Payload::StatusUpdate(s)) = ev.unwrap().payload {
            last = s.status.map(|s| s.state);
        }
    }
    assert_eq!(last, Some(pb::TaskState::Completed as i32));
    // A terminal task cannot be subscribed to.
    let e = c
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: t.id.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&e), "UNSUPPORTED_OPERATION");
    // ListTasks sees both tasks.
    let listed = c
        .list_tasks(authed(pb::ListTasksRequest::default(), &token))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.tasks.iter().any(|x| x.id == task_id));
    assert!(listed.tasks.iter().any(|x| x.id == t.id));
}

/// The gRPC binding on a Unix socket instead: the card names it `unix:<path>`, the socket has
/// the listener's mode, and a caller still needs the bearer token.
#[tokio::test]
async fn the_grpc_binding_can_listen_on_a_unix_socket() {
    let d = Deployment::up(Options {
        sets: vec![("gateway".into(), "grpc.socket=\"a2a-grpc.sock\"".into())],
        ..Options::default()
    })
    .await;
    let token = d.token();
    let path = d.layout.root.join("gateway/a2a-grpc.sock");
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", &token)
        .await
        .unwrap();
    let grpc: Vec<&str> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["protocolBinding"] == "GRPC")
        .filter_map(|i| i["url"].as_str())
        .collect();
    assert_eq!(grpc, [format!("unix:{}", path.display())], "{card}");
    {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let meta = std::fs::metadata(&path).expect("the socket exists");
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    }
    let mut c = A2aServiceClient::new(warden_daemon::client::unix_channel(&path));
    let e = c
        .get_task(pb::GetTaskRequest {
            id: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let done = c
        .send_message(authed(
            pb::SendMessageRequest {
                message: Some(text_message("tck-complete-task-unix", "hi")),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let Some(pb::send_message_response::Payload::Task(t)) = done.payload else {
        panic!("a task")
    };
    assert_eq!(state(&t), pb::TaskState::Completed);
}
