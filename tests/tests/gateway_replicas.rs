//! Two gateway replicas on one PostgreSQL (issue 27), with the real policy and supervisor, driven
//! by the A2A gRPC client generated from the vendored `a2a.proto`:
//! - a task started on one replica is seen, listed, followed to its end (SubscribeToTask) and
//!   cancelled from the other; another principal sees none of it on either;
//! - an answer to a task's question sent to the replica that does not follow it reaches the
//!   question (through the database) and the caller gets the task at its end;
//! - in the deployment (2 gateways, 2 policy replicas, 2 approvers, 1 supervisor on one
//!   PostgreSQL), kill -9 of the replica a caller was streaming from: the caller resubscribes on
//!   the other replica and sees the task to COMPLETED with its whole answer and each of its two
//!   permissions (one decided before the kill, one after) once: once the dead replica's lease
//!   ran out, the other one takes the task over and attaches to its turn at the supervisor
//!   (`AttachTurn`), which never depended on the dead replica's stream.
//!
//! Prints SKIP and passes where PostgreSQL's binaries are missing (outside CI).

use std::time::Duration;

use serde_json::json;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use warden_e2e::{Daemon, Deployment, Options, wait_healthy};
use warden_pgstate::cluster::TestCluster;
use warden_proto::a2a::v1 as pb;
use warden_proto::a2a::v1::a2a_service_client::A2aServiceClient;

const ALICE: &str = "alice-token-replicas-0123456789";
const BOB: &str = "bob-token-replicas-9876543210";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

fn toml_str(s: &str) -> String {
    format!("{s:?}")
}

fn cluster() -> Option<TestCluster> {
    let c = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}"))?;
    c.create_db("warden")
        .unwrap_or_else(|e| panic!("createdb: {e}"));
    Some(c)
}

/// Policy, supervisor and gateway 1 (gRPC on `grpc1`), the gateway's tasks in `c`.
async fn deploy(c: &TestCluster, grpc1: &str) -> Deployment {
    let sets = [
        "store.backend=\"postgres\"".to_string(),
        format!("store.url={}", toml_str(&c.url("warden"))),
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
        format!("grpc.tcp={grpc1}"),
        "grpc.allow_any_peer=true".to_string(),
    ];
    Deployment::up(Options {
        sets: sets.iter().map(|s| ("gateway".into(), s.clone())).collect(),
        ..Options::default()
    })
    .await
}

/// The deployment: 2 policy replicas, 2 approvers and gateway 1 on PostgreSQL, the
/// supervisor asking approver 1 and failing over to approver 2 (`policy.failover_sockets`).
/// The second gateway is [`second_gateway`].
async fn full_deployment(c: &TestCluster, grpc1: &str) -> (Deployment, Vec<Daemon>) {
    let db = [
        "store.backend=\"postgres\"".to_string(),
        format!("store.url={}", toml_str(&c.url("warden"))),
    ];
    let mut sets: Vec<(String, String)> = Vec::new();
    for daemon in ["policy", "approver", "gateway"] {
        sets.extend(db.iter().map(|s| (daemon.to_string(), s.clone())));
    }
    sets.extend(
        [
            format!(
                "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
                digest(ALICE),
                digest(BOB)
            ),
            format!("grpc.tcp={grpc1}"),
            "grpc.allow_any_peer=true".to_string(),
        ]
        .into_iter()
        .map(|s| ("gateway".to_string(), s)),
    );
    let mut d = Deployment::new(Options {
        approver: true,
        sets,
        ..Options::default()
    });
    d.start("policy").await;
    let (policy2, _, _) = d.replica("policy", "policy-b").await;
    d.start("approver").await;
    let (approver2, approver2_socket, _) = d.replica("approver", "approver-b").await;
    d.opts.sets.push((
        "supervisor".into(),
        format!(
            "policy.failover_sockets=[{}]",
            toml_str(&approver2_socket.display().to_string())
        ),
    ));
    d.start("supervisor").await;
    d.start("gateway").await;
    (d, vec![policy2, approver2])
}

/// A second gateway replica: its own state directory, sockets and ports, the same database.
async fn second_gateway(d: &Deployment, grpc2: &str) -> Daemon {
    let state = d.dir.path().join("gateway2");
    std::fs::create_dir_all(&state).unwrap();
    let socket = d.dir.path().join("run").join("gateway2.sock");
    let http = format!("127.0.0.1:{}", warden_e2e::free_port());
    let extra: Vec<String> = [
        format!(
            "daemon.state_dir={}",
            toml_str(&state.display().to_string())
        ),
        format!("listen.socket={}", toml_str(&socket.display().to_string())),
        format!("http.bind={}", toml_str(&http)),
        format!("grpc.tcp={grpc2}"),
    ]
    .into_iter()
    .flat_map(|s| ["--set".to_string(), s])
    .collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let child = d.spawn("gateway", &extra);
    let mut g = Daemon {
        name: "gateway2".into(),
        child,
        socket,
        log: None,
    };
    wait_healthy(&mut g, Duration::from_secs(15)).await;
    g
}

/// A client of the replica's gRPC listener (bound a moment after the gateway reports healthy:
/// tried for up to 10 s).
async fn client(addr: &str) -> A2aServiceClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let t0 = tokio::time::Instant::now();
    loop {
        match endpoint.connect().await {
            Ok(ch) => return A2aServiceClient::new(ch),
            Err(e) if t0.elapsed() > Duration::from_secs(10) => {
                panic!("gRPC listener {addr} not reachable: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
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

fn send(id: &str, text: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        message: Some(pb::Message {
            message_id: id.into(),
            role: pb::Role::User as i32,
            parts: vec![pb::Part {
                content: Some(pb::part::Content::Text(text.into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// "one ", a pause of `ms`, "two", the end.
fn slow(ms: u64) -> String {
    json!({"steps": [
        {"type": "message", "text": "one "},
        {"type": "sleep", "ms": ms},
        {"type": "message", "text": "two"},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string()
}

fn state(t: &pb::Task) -> pb::TaskState {
    t.status
        .as_ref()
        .map(|s| s.state())
        .unwrap_or(pb::TaskState::Unspecified)
}

/// What a stream said: the answer's text, the states it went through, the last state.
#[derive(Debug, Default)]
struct Seen {
    text: String,
    states: Vec<pb::TaskState>,
}

async fn follow(
    mut stream: tonic::Streaming<pb::StreamResponse>,
    within: Duration,
    seen: &mut Seen,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| format!("no end within {within:?}: {seen:?}"))?;
        let Some(ev) = next else { return Ok(()) };
        let ev = ev.map_err(|e| format!("stream error: {e}"))?;
        match ev.payload {
            Some(pb::stream_response::Payload::Task(t)) => {
                for a in &t.artifacts {
                    for p in &a.parts {
                        if let Some(pb::part::Content::Text(s)) = &p.content {
                            seen.text.push_str(s);
                        }
                    }
                }
                seen.states.push(state(&t));
            }
            Some(pb::stream_response::Payload::ArtifactUpdate(a)) => {
                let parts = a.artifact.map(|a| a.parts).unwrap_or_default();
                if !a.append {
                    seen.text.clear();
                }
                for p in parts {
                    if let Some(pb::part::Content::Text(s)) = p.content {
                        seen.text.push_str(&s);
                    }
                }
            }
            Some(pb::stream_response::Payload::StatusUpdate(s)) => {
                seen.states
                    .push(s.status.map(|s| s.state()).unwrap_or_default());
            }
            _ => {}
        }
    }
}

async fn get(
    c: &mut A2aServiceClient<tonic::transport::Channel>,
    token: &str,
    id: &str,
) -> Result<pb::Task, tonic::Status> {
    c.get_task(authed(
        pb::GetTaskRequest {
            id: id.into(),
            ..Default::default()
        },
        token,
    ))
    .await
    .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_replica_shows_follows_and_cancels_any_task_of_its_principal() {
    let Some(c) = cluster() else { return };
    let (grpc1, grpc2) = (
        format!("127.0.0.1:{}", warden_e2e::free_port()),
        format!("127.0.0.1:{}", warden_e2e::free_port()),
    );
    let d = deploy(&c, &grpc1).await;
    let _g2 = second_gateway(&d, &grpc2).await;
    let (mut a, mut b) = (client(&grpc1).await, client(&grpc2).await);

    // Alice streams a task from replica A.
    let mut stream = a
        .send_streaming_message(authed(send("m-slow", &slow(3000)), ALICE))
        .await
        .expect("streamed send")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("a first event")
        .expect("a stream item")
        .expect("no error");
    let Some(pb::stream_response::Payload::Task(task)) = first.payload else {
        panic!("the stream starts with the task: {first:?}")
    };
    let id = task.id.clone();

    // Replica B shows it to Alice while it runs, and to nobody else.
    let t0 = tokio::time::Instant::now();
    let on_b = get(&mut b, ALICE, &id).await.expect("GetTask on B");
    assert!(
        !state(&on_b).eq(&pb::TaskState::Completed),
        "still running: {on_b:?}"
    );
    let e = get(&mut b, BOB, &id).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let listed = b
        .list_tasks(authed(pb::ListTasksRequest::default(), ALICE))
        .await
        .expect("ListTasks on B")
        .into_inner();
    assert!(listed.tasks.iter().any(|t| t.id == id), "{listed:?}");
    let bobs = b
        .list_tasks(authed(pb::ListTasksRequest::default(), BOB))
        .await
        .expect("ListTasks on B")
        .into_inner();
    assert!(bobs.tasks.is_empty(), "{bobs:?}");
    let e = b
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: id.clone(),
                ..Default::default()
            },
            BOB,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // Alice resubscribes on B and sees the task to its end, the whole answer with it.
    let sub = b
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: id.clone(),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect("SubscribeToTask on B")
        .into_inner();
    let mut seen = Seen::default();
    follow(sub, Duration::from_secs(30), &mut seen)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen.states.last(),
        Some(&pb::TaskState::Completed),
        "{seen:?}"
    );
    assert_eq!(seen.text, "one two", "{seen:?}");
    println!(
        "a task started on A followed on B to COMPLETED {:?} after B first showed it",
        t0.elapsed()
    );
    let done = get(&mut b, ALICE, &id).await.expect("GetTask on B");
    assert_eq!(state(&done), pb::TaskState::Completed);

    // A task started on A is cancelled from B: the turn stops at the supervisor, both show it.
    let long = a
        .send_message(authed(
            pb::SendMessageRequest {
                configuration: Some(pb::SendMessageConfiguration {
                    return_immediately: true,
                    ..Default::default()
                }),
                ..send("m-long", &slow(60_000))
            },
            ALICE,
        ))
        .await
        .expect("send")
        .into_inner();
    let Some(pb::send_message_response::Payload::Task(long)) = long.payload else {
        panic!("a task")
    };
    // Bob cannot cancel it from either replica.
    let e = b
        .cancel_task(authed(
            pb::CancelTaskRequest {
                id: long.id.clone(),
                ..Default::default()
            },
            BOB,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // Once it runs (its first words stored), Alice cancels it on B.
    let t0 = tokio::time::Instant::now();
    loop {
        let t = get(&mut b, ALICE, &long.id).await.expect("GetTask");
        if state(&t) == pb::TaskState::Working && !t.artifacts.is_empty() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never ran: {t:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = tokio::time::Instant::now();
    let cancelled = b
        .cancel_task(authed(
            pb::CancelTaskRequest {
                id: long.id.clone(),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect("CancelTask on B")
        .into_inner();
    assert_eq!(state(&cancelled), pb::TaskState::Canceled, "{cancelled:?}");
    println!("cancelled from B in {:?}", t0.elapsed());
    let on_a = get(&mut a, ALICE, &long.id).await.expect("GetTask on A");
    assert_eq!(state(&on_a), pb::TaskState::Canceled, "{on_a:?}");
    // The turn itself stopped: A's follower saw it end (not a long sleep left running).
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the cancel took {:?}",
        t0.elapsed()
    );

    // `warden doctor` says where the gateway's tasks live.
    let out = std::process::Command::new(warden_e2e::binary("warden"))
        .arg("--state-dir")
        .arg(d.dir.path())
        .arg("doctor")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.contains("gateway   postgres (postgres warden@") && out.contains("; 2 tasks stored"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_whose_replica_was_killed_resubscribes_on_the_other_and_sees_the_end() {
    let Some(c) = cluster() else { return };
    let (grpc1, grpc2) = (
        format!("127.0.0.1:{}", warden_e2e::free_port()),
        format!("127.0.0.1:{}", warden_e2e::free_port()),
    );
    let (mut d, _replicas) = full_deployment(&c, &grpc1).await;
    let _g2 = second_gateway(&d, &grpc2).await;
    let (mut a, mut b) = (client(&grpc1).await, client(&grpc2).await);
    // A permission before the kill and one after it (the policy's floor allows reads: ALLOW
    // through the approver chain), the answer around them.
    let turn = json!({"steps": [
        {"type": "tool", "kind": "read", "path": "before.txt", "ask": true},
        {"type": "message", "text": "one "},
        {"type": "sleep", "ms": 12_000},
        {"type": "tool", "kind": "read", "path": "after.txt", "ask": true},
        {"type": "message", "text": "two"},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    let mut stream = a
        .send_streaming_message(authed(send("m-kill", &turn), ALICE))
        .await
        .expect("streamed send")
        .into_inner();
    let mut id = String::new();
    // Until the first words arrived: the turn runs.
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("events")
    {
        match ev.expect("no error").payload {
            Some(pb::stream_response::Payload::Task(t)) => id = t.id,
            Some(pb::stream_response::Payload::ArtifactUpdate(_)) => break,
            _ => {}
        }
    }
    assert!(!id.is_empty());
    let g1 = d.take("gateway").expect("gateway 1");
    g1.crash().await;
    let killed = tokio::time::Instant::now();
    // The caller's stream ends with the replica.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    // It resubscribes on B and sees the task reach its end.
    let sub = b
        .subscribe_to_task(authed(
            pb::SubscribeToTaskRequest {
                id: id.clone(),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect("SubscribeToTask on B")
        .into_inner();
    let mut seen = Seen::default();
    follow(sub, Duration::from_secs(30), &mut seen)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let end = seen.states.last().copied();
    println!(
        "after kill -9 of the caller's replica: {end:?} on B {:?} later ({seen:?})",
        killed.elapsed()
    );
    assert_eq!(end, Some(pb::TaskState::Completed), "{seen:?}");
    assert_eq!(seen.text, "one two", "the whole answer: {seen:?}");
    // Stored as the turn produced it: one answer, not the words written twice.
    let t = get(&mut b, ALICE, &id).await.expect("GetTask on B");
    assert_eq!(state(&t), pb::TaskState::Completed);
    let text: Vec<String> = t
        .artifacts
        .iter()
        .flat_map(|a| a.parts.iter())
        .filter_map(|p| match &p.content {
            Some(pb::part::Content::Text(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(text.concat(), "one two", "{t:?}");
    // Both permissions were decided through the chain and are in the task's history, once each:
    // the one before the kill and the one after the takeover.
    let kind = |m: &pb::Message| {
        m.metadata
            .as_ref()
            .and_then(|md| md.fields.get("warden"))
            .and_then(|w| match &w.kind {
                Some(prost_types::value::Kind::StructValue(s)) => s.fields.get("kind").cloned(),
                _ => None,
            })
            .and_then(|k| match k.kind {
                Some(prost_types::value::Kind::StringValue(s)) => Some(s),
                _ => None,
            })
            .unwrap_or_default()
    };
    let decisions: Vec<String> = t
        .history
        .iter()
        .filter(|m| kind(m) == "permission")
        .map(|m| format!("{:?}", m.parts))
        .collect();
    assert_eq!(decisions.len(), 2, "{decisions:#?}");
    assert!(
        decisions[0].contains("before.txt") && decisions[1].contains("after.txt"),
        "{decisions:#?}"
    );
    assert!(
        decisions.iter().all(|d| d.contains("permission allow")),
        "{decisions:#?}"
    );
    // Nobody else can follow it from the surviving replica either.
    let e = get(&mut b, BOB, &id).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}

/// An answer to a task's question sent to the replica that does not follow the task: held in
/// the database, delivered by the follower, and the caller's blocking SendMessage returns the
/// task at its end, its answer once in the history; another principal's answer is NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_sent_to_the_other_replica_reaches_the_question() {
    let Some(c) = cluster() else { return };
    let (grpc1, grpc2) = (
        format!("127.0.0.1:{}", warden_e2e::free_port()),
        format!("127.0.0.1:{}", warden_e2e::free_port()),
    );
    let d = deploy(&c, &grpc1).await;
    let _g2 = second_gateway(&d, &grpc2).await;
    let (mut a, mut b) = (client(&grpc1).await, client(&grpc2).await);
    let asks = json!({"steps": [
        {"type": "question", "message": "Which colour?"},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    // Blocking: returns when the task waits for input.
    let sent = a
        .send_message(authed(send("m-ask", &asks), ALICE))
        .await
        .expect("send")
        .into_inner();
    let Some(pb::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("a task")
    };
    assert_eq!(state(&task), pb::TaskState::InputRequired, "{task:?}");
    let answer = |token: &str, id: &str| {
        let mut m = send(id, "blue");
        if let Some(msg) = m.message.as_mut() {
            msg.task_id = task.id.clone();
            msg.context_id = task.context_id.clone();
        }
        authed(m, token)
    };
    let e = b.send_message(answer(BOB, "m-bob")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let t0 = tokio::time::Instant::now();
    let done = b
        .send_message(answer(ALICE, "m-blue"))
        .await
        .expect("the answer on B")
        .into_inner();
    println!("answered on B, task ended {:?} later", t0.elapsed());
    let Some(pb::send_message_response::Payload::Task(done)) = done.payload else {
        panic!("a task: {done:?}")
    };
    assert_eq!(state(&done), pb::TaskState::Completed, "{done:?}");
    let answers: Vec<&pb::Message> = done
        .history
        .iter()
        .filter(|m| m.message_id == "m-blue")
        .collect();
    assert_eq!(answers.len(), 1, "{:?}", done.history);
    assert_eq!(answers[0].role, pb::Role::User as i32);
    // A follows it as stored: the same end.
    let on_a = get(&mut a, ALICE, &task.id).await.expect("GetTask on A");
    assert_eq!(state(&on_a), pb::TaskState::Completed);
}
