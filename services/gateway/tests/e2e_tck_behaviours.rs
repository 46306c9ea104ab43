//! The A2A TCK behaviours (keyed on the messageId prefix) end to end through the three real
//! daemons with the scripted agent, so CI checks what the TCK checks without fetching the TCK:
//! text/file/url/data artifacts from the agent's `_meta.warden.artifact` hints (passed through
//! the supervisor as `TextChunk.meta_json`), a direct Message reply, an explicit rejection vs a
//! plain refusal, chunked artifacts, SubscribeToTask on a task waiting for input, and request
//! members spelled with their proto field names.

mod common;

use common::{Gw, kinds, message, state, status_text};
use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

async fn deploy() -> (Deployment, Gw) {
    let d = Deployment::up(Options::default()).await;
    let gw = Gw {
        addr: d.http.clone(),
        token: d.token(),
    };
    (d, gw)
}

async fn send(gw: &Gw, id: &str, text: &str) -> Value {
    gw.rpc(
        "SendMessage",
        json!({"message": message(id, text, json!({}))}),
    )
    .await
}

fn inline(steps: Value) -> String {
    json!({"steps": steps}).to_string()
}

/// An `agent_message_chunk` step with `_meta.warden = warden`.
fn hinted(text: &str, warden: Value) -> Value {
    json!({"type": "update", "update": {"sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text}, "_meta": {"warden": warden}}})
}

#[tokio::test]
async fn artifact_hints_become_text_file_url_and_data_artifacts() {
    let (_d, gw) = deploy().await;

    let r = send(&gw, "tck-artifact-data-e2e", "anything").await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{r}");
    let arts = task["artifacts"].as_array().expect("artifacts");
    assert_eq!(
        arts.len(),
        1,
        "only the data artifact, no answer artifact: {task}"
    );
    assert_eq!(
        arts[0]["parts"][0]["data"],
        json!({"key": "value", "count": 42}),
        "{task}"
    );
    assert!(!arts[0]["artifactId"].as_str().unwrap_or("").is_empty());

    let r = send(&gw, "tck-artifact-file-e2e", "anything").await;
    let part = &r["result"]["task"]["artifacts"][0]["parts"][0];
    assert_eq!(part["raw"], "dGNr", "base64 of the chunk's text: {r}");
    assert_eq!(part["filename"], "output.txt", "{r}");
    assert_eq!(part["mediaType"], "text/plain", "{r}");

    let r = send(&gw, "tck-artifact-file-url-e2e", "anything").await;
    let part = &r["result"]["task"]["artifacts"][0]["parts"][0];
    assert_eq!(part["url"], "https://example.com/output.txt", "{r}");
    assert_eq!(part["filename"], "output.txt", "{r}");
    assert_eq!(part["mediaType"], "text/plain", "{r}");

    // Over HTTP+JSON too, and GetTask returns the stored artifact the same way.
    let reply = gw
        .request(
            "POST",
            "/a2a/rest/message:send",
            Some(&gw.token),
            Some(&json!({"message": message("tck-artifact-text-e2e", "anything", json!({}))})),
        )
        .await;
    let task = reply.json()["task"].clone();
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "Generated text content",
        "{task}"
    );
    let tid = task["id"].as_str().unwrap();
    let stored = gw.rpc("GetTask", json!({"id": tid})).await["result"].clone();
    assert_eq!(stored["artifacts"], task["artifacts"], "{stored}");
}

#[tokio::test]
async fn a_malformed_hint_is_plain_answer_text() {
    let (_d, gw) = deploy().await;
    // A data hint whose text is not JSON, a hint with wrong types, an unknown kind: nothing is
    // lost, nothing fails; the text reaches the caller.
    let text = inline(json!([
        hinted("not json", json!({"artifact": {"artifactId": "d", "kind": "data"}})),
        hinted(" typed", json!({"artifact": {"artifactId": 5, "kind": "text"}})),
        hinted(" odd", json!({"artifact": {"artifactId": "o", "kind": "hologram"}})),
        {"type": "stop", "reason": "end_turn"}
    ]));
    let r = send(&gw, "m-bad-hints", &text).await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{r}");
    let texts: Vec<String> = task["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["parts"].as_array().unwrap().clone())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(texts.concat(), "not json typed odd", "{task}");
}

#[tokio::test]
async fn a_direct_reply_is_a_message_but_cannot_hide_a_tool_call() {
    let (_d, gw) = deploy().await;
    let r = send(&gw, "tck-message-response-e2e", "anything").await;
    let m = &r["result"]["message"];
    assert!(r["result"].get("task").is_none(), "{r}");
    assert_eq!(m["role"], "ROLE_AGENT", "{r}");
    assert_eq!(m["parts"][0]["text"], "Direct message response", "{r}");
    // The task behind it is still on record.
    let tid = m["taskId"].as_str().expect("the reply names its task");
    let task = gw.rpc("GetTask", json!({"id": tid})).await["result"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task}");

    // The same hint on a turn that ran a tool: the caller gets the task (with the tool call and
    // its permission decision), and the reply text as the answer.
    let text = inline(json!([
        {"type": "tool", "kind": "edit", "path": "hint.txt", "content": "x", "title": "Write hint.txt"},
        hinted("all done", json!({"a2a": "message"})),
        {"type": "stop", "reason": "end_turn"}
    ]));
    let r = send(&gw, "m-hint-tool", &text).await;
    let task = &r["result"]["task"];
    assert!(r["result"].get("message").is_none(), "{r}");
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{r}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "all done",
        "{task}"
    );
    let hist = task["history"].as_array().unwrap();
    assert!(
        hist.iter()
            .any(|h| h["metadata"]["warden"]["kind"] == "permission"),
        "{task}"
    );
}

#[tokio::test]
async fn an_explicit_rejection_is_rejected_and_a_plain_refusal_fails() {
    let (_d, gw) = deploy().await;
    let r = send(&gw, "tck-reject-task-e2e", "anything").await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_REJECTED", "{r}");
    assert_eq!(status_text(task), "rejected");
    assert_eq!(
        task["status"]["message"]["metadata"]["warden"]["rejectedByAgent"], true,
        "{task}"
    );

    // Issue 7: a `refusal` stop without the agent saying it rejects the task is FAILED.
    let text = inline(json!([
        {"type": "message", "text": "I won't."},
        {"type": "stop", "reason": "refusal"}
    ]));
    let task = send(&gw, "m-plain-refusal", &text).await["result"]["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_FAILED", "{task}");
    assert!(status_text(&task).contains("refusal"), "{task}");

    // A rejection hint does not turn a finished turn into a rejection.
    let text = inline(json!([
        hinted("never mind", json!({"a2a": "reject"})),
        {"type": "stop", "reason": "end_turn"}
    ]));
    let task = send(&gw, "m-reject-then-done", &text).await["result"]["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "never mind",
        "{task}"
    );
}

#[tokio::test]
async fn a_chunked_artifact_streams_append_and_last_chunk() {
    let (_d, gw) = deploy().await;
    let mut s = gw
        .sse(
            "POST",
            "/a2a/rest/message:stream",
            Some(&json!({"message": message("tck-stream-artifact-chunked-e2e", "x", json!({}))})),
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
    let arts: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    assert_eq!(arts.len(), 2, "{events:?}");
    assert_eq!(arts[0]["artifact"]["parts"][0]["text"], "chunk-1 ");
    assert!(
        arts[0].get("append").is_none(),
        "a first chunk never appends: {:?}",
        arts[0]
    );
    assert_eq!(arts[1]["append"], true);
    assert_eq!(arts[1]["lastChunk"], true);
    assert_eq!(
        arts[0]["artifact"]["artifactId"],
        arts[1]["artifact"]["artifactId"]
    );
    let tid = events[0]["task"]["id"].as_str().unwrap();
    let task = gw.rpc("GetTask", json!({"id": tid})).await["result"].clone();
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "chunk-1 chunk-2",
        "{task}"
    );
}

#[tokio::test]
async fn subscribing_to_a_task_waiting_for_input_follows_it_to_the_end() {
    let (_d, gw) = deploy().await;
    let r = send(&gw, "tck-input-required-e2e", "anything").await;
    let task = &r["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_INPUT_REQUIRED", "{r}");
    let tid = task["id"].as_str().unwrap().to_string();
    let mut sub = gw
        .sse("GET", &format!("/a2a/rest/tasks/{tid}:subscribe"), None)
        .await;
    let first = sub.next().await.expect("the snapshot");
    assert_eq!(
        state(&first["task"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );
    // The answer, sent with the proto field name `task_id` (ProtoJSON accepts both spellings).
    let r = gw
        .rpc(
            "SendMessage",
            json!({"message": {"message_id": "m-answer", "role": "ROLE_USER",
                               "parts": [{"text": "yes"}], "task_id": tid}}),
        )
        .await;
    assert_eq!(state(&r["result"]["task"]), "TASK_STATE_COMPLETED", "{r}");
    let rest = sub.rest().await;
    let k = kinds(&rest);
    assert_eq!(
        k.last().map(String::as_str),
        Some("completed:stop"),
        "{k:?}"
    );
    assert!(k.contains(&"working".to_string()), "{k:?}");
    // historyLength by its proto name too.
    let got = gw
        .rpc("GetTask", json!({"id": tid, "history_length": 1}))
        .await["result"]
        .clone();
    assert_eq!(got["history"].as_array().map(Vec::len), Some(1), "{got}");
    let got = gw
        .rpc("GetTask", json!({"id": tid, "history_length": 0}))
        .await["result"]
        .clone();
    assert!(got.get("history").is_none(), "{got}");
}

/// TCK CORE-HIST-005/006: every follow-up whose messageId starts `tck-input-required` is asked
/// again (the task stays INPUT_REQUIRED), another message completes the task, and the history
/// holds every exchanged message in order. Over HTTP+JSON, whose bodies are
/// `application/a2a+json`.
#[tokio::test]
async fn tck_input_required_asks_again_until_another_message_completes_it() {
    let (_d, gw) = deploy().await;
    let send_rest = |body: Value| {
        let gw = &gw;
        async move {
            gw.request(
                "POST",
                "/a2a/rest/message:send",
                Some(&gw.token),
                Some(&body),
            )
            .await
        }
    };
    let r = send_rest(json!({"message": message("tck-input-required-h0", "TCK prerequisite task creation", json!({}))})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: application/a2a+json"),
        "{}",
        r.head
    );
    let task = r.json()["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_INPUT_REQUIRED", "{task}");
    let tid = task["id"].as_str().unwrap().to_string();
    for (i, text) in ["TCK history message 1", "TCK history message 2"]
        .into_iter()
        .enumerate()
    {
        let r = send_rest(json!({"message": message(&format!("tck-input-required-h{}", i + 1), text, json!({"taskId": tid}))})).await;
        let t = r.json()["task"].clone();
        assert_eq!(state(&t), "TASK_STATE_INPUT_REQUIRED", "asked again: {t}");
    }
    let r = send_rest(json!({"message": message("tck-complete-task-h3", "TCK complete after history", json!({"taskId": tid}))})).await;
    assert_eq!(
        state(&r.json()["task"]),
        "TASK_STATE_COMPLETED",
        "{}",
        r.body
    );
    let got = gw
        .request(
            "GET",
            &format!("/a2a/rest/tasks/{tid}?historyLength=10"),
            Some(&gw.token),
            None,
        )
        .await;
    assert!(
        got.head
            .to_ascii_lowercase()
            .contains("application/a2a+json"),
        "{}",
        got.head
    );
    let texts: Vec<String> = got.json()["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "ROLE_USER")
        .filter_map(|m| m["parts"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        texts,
        [
            "TCK prerequisite task creation",
            "TCK history message 1",
            "TCK history message 2",
            "TCK complete after history"
        ],
        "{}",
        got.body
    );
    // A REST error is a2a+json too.
    let missing = gw
        .request("GET", "/a2a/rest/tasks/nope", Some(&gw.token), None)
        .await;
    assert_eq!(missing.status, 404);
    assert!(
        missing
            .head
            .to_ascii_lowercase()
            .contains("application/a2a+json"),
        "{}",
        missing.head
    );
}
