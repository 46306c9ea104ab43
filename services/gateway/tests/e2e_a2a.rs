//! End to end through the three real daemons (warden-policy, warden-supervisor, warden-gateway,
//! started by the shared harness exactly as `warden up` starts them) with the scripted agent:
//! allow, deny, escalate, cancel, timeout, crash, a question, several subscribers, a client that
//! disconnects, a gateway restart mid-task, and two principals.

mod common;

use std::time::Duration;

use common::{Gw, kinds, message, state, status_text};
use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

const ALICE: &str = "alice-e2e-token-0123456789";
const BOB: &str = "bob-e2e-token-0123456789";

fn scenario(steps: Value) -> String {
    json!({"steps": steps}).to_string()
}

async fn deploy(sets: Vec<(&str, String)>) -> (Deployment, Gw) {
    let opts = Options {
        sets: sets.into_iter().map(|(d, s)| (d.to_string(), s)).collect(),
        ..Default::default()
    };
    let d = Deployment::up(opts).await;
    let gw = Gw {
        addr: d.http.clone(),
        token: d.token(),
    };
    (d, gw)
}

fn two_principals() -> Vec<(&'static str, String)> {
    let digest = warden_gateway::auth::token_digest_hex;
    vec![(
        "gateway",
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    )]
}

#[tokio::test]
async fn an_allowed_write_completes_and_the_decision_is_in_the_stream() {
    let (_d, gw) = deploy(vec![]).await;
    assert!(!gw.token.is_empty(), "the gateway generated its token file");
    let mut s = gw
        .sse(
            "POST",
            "/a2a/rest/message:stream",
            Some(&json!({"message": message("m-allow", "write hello.txt", json!({}))})),
        )
        .await;
    let events = s.rest().await;
    let k = kinds(&events);
    assert_eq!(k.first().map(String::as_str), Some("task"), "{k:?}");
    assert_eq!(
        k.last().map(String::as_str),
        Some("completed:stop"),
        "{k:?}"
    );
    assert!(k.contains(&"working:tool_call".to_string()), "{k:?}");
    let perm = events
        .iter()
        .find_map(|e| {
            let m = &e["statusUpdate"]["status"]["message"];
            (m["metadata"]["warden"]["kind"] == "permission").then(|| m.clone())
        })
        .expect("a permission decision event");
    assert_eq!(perm["metadata"]["warden"]["verdict"], "allow", "{perm}");
    assert!(
        !perm["metadata"]["warden"]["rule"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );
    assert!(
        !perm["metadata"]["warden"]["reason"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );
    // Never INPUT_REQUIRED for a permission.
    assert!(!k.iter().any(|x| x.starts_with("input_required")), "{k:?}");
    let answer: String = events
        .iter()
        .filter_map(|e| e["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str())
        .collect();
    assert!(answer.contains("hello.txt"), "{answer}");
    // The stored task matches what was streamed.
    let tid = events[0]["task"]["id"].as_str().unwrap();
    let task = gw.rpc("GetTask", json!({"id": tid})).await["result"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"].as_str().unwrap(),
        answer
    );
}

#[tokio::test]
async fn a_denied_edit_is_refused_and_the_caller_is_told_why() {
    let (_d, gw) = deploy(vec![]).await;
    // An edit outside the sandbox: the boundary floor denies it.
    let text = scenario(json!([
        {"type": "message", "text": "Trying to write outside."},
        {"type": "tool", "kind": "edit", "path": "/etc/warden-e2e-denied", "content": "x", "title": "Write /etc/warden-e2e-denied"},
        {"type": "message", "text": "Done."},
        {"type": "stop", "reason": "end_turn"}
    ]));
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-deny", &text, json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    let st = state(task);
    assert!(
        st == "TASK_STATE_COMPLETED" || st == "TASK_STATE_CANCELED",
        "{r}"
    );
    let why = status_text(task);
    assert!(
        why.contains("refused by policy: Write /etc/warden-e2e-denied"),
        "{why}"
    );
    let decisions: Vec<&Value> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["metadata"]["warden"]["kind"] == "permission")
        .collect();
    assert_eq!(decisions.len(), 1, "{task}");
    assert_eq!(decisions[0]["metadata"]["warden"]["verdict"], "deny");
    assert!(!std::path::Path::new("/etc/warden-e2e-denied").exists());
}

#[tokio::test]
async fn an_escalation_without_an_approver_is_denied_and_reported() {
    let (_d, gw) = deploy(vec![("policy", "policy.global.escalate=[\"edit\"]".into())]).await;
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-esc", "write escalated.txt", json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    let perm = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metadata"]["warden"]["kind"] == "permission")
        .cloned()
        .unwrap_or_else(|| panic!("no permission event: {task}"));
    assert_eq!(perm["metadata"]["warden"]["verdict"], "deny", "{perm}");
    assert!(
        status_text(task).contains("refused by policy: Write escalated.txt"),
        "{task}"
    );
    assert_ne!(state(task), "TASK_STATE_INPUT_REQUIRED");
}

#[tokio::test]
async fn cancel_ends_a_running_task_canceled() {
    let (_d, gw) = deploy(vec![]).await;
    let text = scenario(json!([{"type": "message", "text": "working"}, {"type": "hang"}]));
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-cancel", &text, json!({})), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let tid = r["result"]["task"]["id"].as_str().unwrap().to_string();
    gw.wait_task(&tid, |t| state(t) == "TASK_STATE_WORKING")
        .await;
    let c = gw
        .request(
            "POST",
            &format!("/a2a/rest/tasks/{tid}:cancel"),
            Some(&gw.token),
            None,
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(state(&c.json()), "TASK_STATE_CANCELED", "{}", c.body);
    let again = gw.rpc("CancelTask", json!({"id": tid})).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
}

#[tokio::test]
async fn a_timeout_and_a_crash_fail_the_task_with_the_fault() {
    let (_d, gw) = deploy(vec![(
        "gateway",
        "supervisor.turn_timeout_seconds=1".into(),
    )])
    .await;
    let hang = scenario(json!([{"type": "hang"}]));
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-timeout", &hang, json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_FAILED", "{r}");
    assert!(status_text(task).contains("timeout"), "{task}");
    let crash = scenario(json!([{"type": "message", "text": "about to crash"}, {"type": "crash"}]));
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-crash", &crash, json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_FAILED", "{r}");
    assert_eq!(
        task["status"]["message"]["metadata"]["warden"]["fault"]["class"], "crash",
        "{task}"
    );
}

#[tokio::test]
async fn a_question_goes_to_the_caller_and_the_next_message_answers_it() {
    let (_d, gw) = deploy(vec![]).await;
    let text = scenario(json!([
        {"type": "question", "message": "Which name?"},
        {"type": "stop", "reason": "end_turn"}
    ]));
    let mut s = gw
        .sse("POST", "/a2a/jsonrpc", Some(&json!({"jsonrpc": "2.0", "id": 9, "method": "SendStreamingMessage", "params": {"message": message("m-q", &text, json!({}))}})))
        .await;
    let events = s.rest().await;
    let last = events.last().unwrap();
    assert_eq!(last["id"], 9);
    let su = &last["result"]["statusUpdate"];
    assert_eq!(su["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{last}");
    assert_eq!(su["status"]["message"]["parts"][0]["text"], "Which name?");
    let tid = su["taskId"].as_str().unwrap().to_string();
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-a", "notes.txt", json!({"taskId": tid}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{r}");
    let texts: Vec<&str> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["parts"][0]["text"].as_str())
        .collect();
    assert!(texts.contains(&"notes.txt"), "{texts:?}");

    // Cancelling a task that waits for input ends it CANCELED; it never hangs.
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-q2", &text, json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_INPUT_REQUIRED", "{r}");
    let tid = task["id"].as_str().unwrap();
    let c = tokio::time::timeout(
        Duration::from_secs(30),
        gw.rpc("CancelTask", json!({"id": tid})),
    )
    .await
    .expect("cancel answers");
    assert_eq!(state(&c["result"]), "TASK_STATE_CANCELED", "{c}");
}

#[tokio::test]
async fn subscribers_see_the_same_events_and_a_disconnect_does_not_cancel() {
    let (_d, gw) = deploy(vec![]).await;
    let text = scenario(json!([
        {"type": "message", "text": "one "},
        {"type": "sleep", "ms": 700},
        {"type": "tool", "kind": "edit", "path": "sub.txt", "content": "x", "title": "Write sub.txt"},
        {"type": "message", "text": "two"},
        {"type": "sleep", "ms": 300},
        {"type": "stop", "reason": "end_turn"}
    ]));
    let mut first = gw
        .sse(
            "POST",
            "/a2a/rest/message:stream",
            Some(&json!({"message": message("m-sub", &text, json!({}))})),
        )
        .await;
    let head = first.next().await.unwrap();
    let tid = head["task"]["id"].as_str().unwrap().to_string();
    // Two more subscribers, by GET and by POST; a fourth that hangs up at once.
    let mut by_get = gw
        .sse("GET", &format!("/a2a/rest/tasks/{tid}:subscribe"), None)
        .await;
    let mut by_post = gw
        .sse("POST", "/a2a/jsonrpc", Some(&json!({"jsonrpc": "2.0", "id": 4, "method": "SubscribeToTask", "params": {"id": tid}})))
        .await;
    let mut quitter = gw
        .sse("GET", &format!("/a2a/rest/tasks/{tid}:subscribe"), None)
        .await;
    assert!(quitter.next().await.unwrap()["task"].is_object());
    drop(quitter);
    let a = first.rest().await;
    let b = by_get.rest().await;
    let c: Vec<Value> = by_post
        .rest()
        .await
        .into_iter()
        .map(|e| e["result"].clone())
        .collect();
    for (name, s) in [("get", &b), ("post", &c)] {
        assert!(s[0]["task"].is_object(), "{name} starts with the Task");
        // After its snapshot, each subscriber's events are the tail of the first stream's.
        let tail = &s[1..];
        assert!(
            a.ends_with(tail),
            "{name}: {:?} is not a suffix of {:?}",
            kinds(tail),
            kinds(&a)
        );
    }
    assert_eq!(kinds(&a).last().map(String::as_str), Some("completed:stop"));
    // The original sender disconnecting mid-task does not cancel it either.
    let mut sender = gw
        .sse(
            "POST",
            "/a2a/rest/message:stream",
            Some(&json!({"message": message("m-drop", &text, json!({}))})),
        )
        .await;
    let tid = sender.next().await.unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    drop(sender);
    let done = gw
        .wait_task(&tid, |t| {
            state(t).ends_with("COMPLETED")
                || state(t).ends_with("CANCELED")
                || state(t).ends_with("FAILED")
        })
        .await;
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done}");
}

#[tokio::test]
async fn a_gateway_restart_mid_task_fails_the_task_and_keeps_every_task() {
    let (mut d, gw) = deploy(vec![]).await;
    let done = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-before", "hello there", json!({}))}),
        )
        .await;
    let done_id = done["result"]["task"]["id"].as_str().unwrap().to_string();
    let hang = scenario(json!([{"type": "message", "text": "working"}, {"type": "hang"}]));
    let r = gw
        .rpc("SendMessage", json!({"message": message("m-hang", &hang, json!({})), "configuration": {"returnImmediately": true}}))
        .await;
    let tid = r["result"]["task"]["id"].as_str().unwrap().to_string();
    gw.wait_task(&tid, |t| state(t) == "TASK_STATE_WORKING")
        .await;
    d.take("gateway").unwrap().crash().await;
    d.start("gateway").await;
    let task = gw.rpc("GetTask", json!({"id": tid})).await["result"].clone();
    assert_eq!(state(&task), "TASK_STATE_FAILED", "{task}");
    assert!(status_text(&task).contains("gateway restarted"), "{task}");
    let list = gw.rpc("ListTasks", json!({})).await;
    let ids: Vec<&str> = list["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(
        ids.contains(&tid.as_str()) && ids.contains(&done_id.as_str()),
        "{list}"
    );
    let before = gw.rpc("GetTask", json!({"id": done_id})).await["result"].clone();
    assert_eq!(state(&before), "TASK_STATE_COMPLETED");
}

#[tokio::test]
async fn two_principals_are_isolated_and_the_principal_reaches_the_policy() {
    let (d, gw) = deploy(two_principals()).await;
    let r = gw.rpc_as(ALICE, "SendMessage", json!({"message": message("m-alice", "write alice.txt", json!({"contextId": "shared-name"}))})).await;
    let task = r["result"]["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{r}");
    let tid = task["id"].as_str().unwrap();
    for (method, params) in [
        ("GetTask", json!({"id": tid})),
        ("CancelTask", json!({"id": tid})),
        (
            "SendMessage",
            json!({"message": message("m-bob", "hi", json!({"contextId": "shared-name"}))}),
        ),
    ] {
        let r = gw.rpc_as(BOB, method, params).await;
        assert_eq!(r["error"]["code"], -32001, "bob {method}: {r}");
    }
    let bob_list = gw.rpc_as(BOB, "ListTasks", json!({})).await;
    assert_eq!(bob_list["result"]["totalSize"], 0);
    // The policy's audit record names alice as the subject.
    let records = warden_cli::audit::query(
        &d.layout.policy_admin_socket(),
        warden_proto::v1::AuditQueryRequest {
            limit: 10,
            decision_id: String::new(),
            context_id: "shared-name".into(),
        },
    )
    .await
    .expect("audit query");
    assert!(!records.is_empty(), "a decision was audited");
    for rec in records {
        let subject = rec.subject.expect("subject");
        assert_eq!(subject.principal, "alice");
        assert_eq!(subject.task_id, tid);
    }
    // With tokens configured, no token file is generated and nothing else is accepted.
    assert!(gw.token.is_empty(), "no token file when auth.tokens is set");
    let r = gw
        .request(
            "GET",
            "/a2a/rest/tasks",
            Some("some-other-token-0123456789"),
            None,
        )
        .await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn the_admin_socket_answers_status_and_refuses_the_policy_only_calls() {
    let (d, gw) = deploy(vec![]).await;
    gw.rpc(
        "SendMessage",
        json!({"message": message("m-status", "hello", json!({}))}),
    )
    .await;
    let mut admin =
        warden_proto::v1::admin_service_client::AdminServiceClient::new(d.channel("gateway"));
    let st = admin
        .status(warden_proto::v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(st.daemon, "warden-gateway");
    assert!(
        st.listeners.iter().any(|l| l == &format!("tcp:{}", d.http)),
        "{:?}",
        st.listeners
    );
    assert!(
        st.listeners.iter().any(|l| l.starts_with("unix:")),
        "{:?}",
        st.listeners
    );
    assert_eq!(
        st.details.get("tasks_stored").map(String::as_str),
        Some("1")
    );
    let err = admin
        .audit_query(warden_proto::v1::AuditQueryRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}

#[tokio::test]
async fn a_context_whose_agent_cannot_start_fails_with_the_startup_fault() {
    let (_d, gw) = deploy(vec![
        (
            "gateway",
            "agents.list=[{name=\"scripted\"}, {name=\"broken\"}]".into(),
        ),
        (
            "supervisor",
            "agents.broken.command=\"/nonexistent/warden-e2e-agent\"".into(),
        ),
    ])
    .await;
    let r = gw
        .rpc("SendMessage", json!({"message": message("m-broken", "hello", json!({"metadata": {"agent": "broken"}}))}))
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_FAILED", "{r}");
    assert_eq!(
        task["status"]["message"]["metadata"]["warden"]["fault"]["class"], "startup",
        "{task}"
    );
    assert!(
        status_text(task).starts_with("the agent could not start"),
        "{task}"
    );
    // A prompt over the supervisor's 16 KiB task limit is refused before anything starts, or
    // is stored: the request is invalid, and no task of it exists.
    let big = "x".repeat(20_000);
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("m-big", &big, json!({}))}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prompt-too-large"),
        "{r}"
    );
    // The card lists the supervisor's agents that can start as skills: `broken` (its program is
    // missing) is left off, the scripted agent is there (claude and codex are there only where
    // their adapters are installed); an agent neither knows is refused.
    let card = gw
        .request("GET", "/.well-known/agent-card.json", None, None)
        .await
        .json();
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert!(
        skills.contains(&"scripted") && !skills.contains(&"broken"),
        "{skills:?}"
    );
    let r = gw
        .rpc("SendMessage", json!({"message": message("m-ghost", "hello", json!({"metadata": {"agent": "ghost"}}))}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test]
async fn the_a2a_message_id_reaches_the_agent_for_correlation() {
    let (_d, gw) = deploy(vec![]).await;
    // The scripted agent keys the TCK behaviours on the messageId it finds in the prompt's
    // _meta.warden; the text alone ("anything") would only be echoed.
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("tck-complete-task-e2e-1", "anything", json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{r}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "Hello from TCK",
        "{task}"
    );
    // The TCK's reject behaviour: the agent says it rejects the task (`warden.a2a = "reject"`)
    // and stops with `refusal`: REJECTED, with its reason. (A plain refusal stays FAILED; see
    // e2e_tck_behaviours.rs.)
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": message("tck-reject-task-e2e-1", "anything", json!({}))}),
        )
        .await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_REJECTED", "{r}");
    assert_eq!(status_text(task), "rejected", "{task}");
}
