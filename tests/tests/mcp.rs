//! The MCP front (`/mcp` on the gateway) against the real daemons and the scripted agent, over
//! plain HTTP as the MCP streamable-HTTP transport defines it (both eras: 2026-07-28 stateless
//! requests, and a 2025-11-25 session with `Mcp-Session-Id` and DELETE). The Python `mcp` client
//! drives the same endpoint in `mcp_python.rs`.

mod supervisor_support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use supervisor_support::{all_gone, pids_in, processes_in};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;

const ERA: &str = "2026-07-28";

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
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
                    let d = data.join("\n");
                    serde_json::from_str::<Value>(d.trim()).ok()
                })
                .collect()
        } else {
            serde_json::from_str::<Value>(&self.body)
                .into_iter()
                .collect()
        }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

struct Mcp {
    addr: String,
    token: String,
}

impl Mcp {
    async fn raw(&self, method: &str, headers: &[(&str, String)], body: Option<&Value>) -> Reply {
        self.raw_as(None, method, headers, body).await
    }

    /// [`Mcp::raw`] over a socket owned by `uid` (made on a thread of its own with that file
    /// system uid, which is what the kernel's socket table records): a process of that user.
    async fn raw_as(
        &self,
        uid: Option<u32>,
        method: &str,
        headers: &[(&str, String)],
        body: Option<&Value>,
    ) -> Reply {
        let mut req = format!("{method} /mcp HTTP/1.0\r\n");
        let mut has_host = false;
        for (k, v) in headers {
            has_host |= k.eq_ignore_ascii_case("host");
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !has_host {
            req.push_str(&format!("Host: {}\r\n", self.addr));
        }
        req.push_str("Accept: application/json, text/event-stream\r\n");
        let body = body.map(Value::to_string).unwrap_or_default();
        if method == "POST" {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(&body);
        let mut sock = match uid {
            None => TcpStream::connect(&self.addr)
                .await
                .expect("gateway reachable"),
            Some(uid) => {
                let addr = self.addr.clone();
                let s = std::thread::spawn(move || {
                    // SAFETY: setfsuid changes only this thread's file system uid (glibc does
                    // not broadcast it), and it is set back before the thread ends.
                    unsafe { libc::setfsuid(uid) };
                    let s = std::net::TcpStream::connect(&addr);
                    unsafe { libc::setfsuid(0) };
                    s
                })
                .join()
                .unwrap()
                .expect("gateway reachable");
                s.set_nonblocking(true).unwrap();
                TcpStream::from_std(s).unwrap()
            }
        };
        sock.write_all(req.as_bytes())
            .await
            .expect("request written");
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(90), sock.read_to_end(&mut buf))
            .await
            .expect("answer within 90 s")
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

    fn auth(&self) -> (&'static str, String) {
        ("Authorization", format!("Bearer {}", self.token))
    }

    /// A stateless (2026-07-28) tools/call; the result object.
    async fn call_with(&self, extra: &[(&str, String)], tool: &str, args: Value) -> Value {
        self.call_as(None, extra, tool, args).await
    }

    /// [`Mcp::call_with`] from a socket owned by `uid`.
    async fn call_as(
        &self,
        uid: Option<u32>,
        extra: &[(&str, String)],
        tool: &str,
        args: Value,
    ) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": tool, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion": ERA,
                      "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let mut h = vec![
            self.auth(),
            ("MCP-Protocol-Version", ERA.to_string()),
            ("Mcp-Method", "tools/call".to_string()),
            ("Mcp-Name", tool.to_string()),
        ];
        h.extend(extra.iter().cloned());
        let r = self.raw_as(uid, "POST", &h, Some(&body)).await;
        assert_eq!(r.status, 200, "{}\n{}", r.head, r.body);
        let last = r
            .messages()
            .into_iter()
            .rev()
            .find(|m| m.get("id") == Some(&json!(7)))
            .unwrap_or_else(|| panic!("no answer: {}", r.body));
        last.get("result")
            .cloned()
            .unwrap_or_else(|| panic!("not a result: {last}"))
    }

    async fn call(&self, tool: &str, args: Value) -> Value {
        self.call_with(&[], tool, args).await
    }
}

fn envelope(result: &Value) -> &Value {
    let e = &result["structuredContent"];
    assert!(e.is_object(), "no structuredContent: {result}");
    // The text block is the same JSON, for clients without structured output.
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, e);
    e
}

fn is_error(result: &Value) -> bool {
    result["isError"].as_bool().unwrap_or(false)
}

fn scenario(v: Value) -> String {
    format!("Please do this.\n```json\n{v}\n```\n")
}

fn decision(status: &str, verdict: &str) -> Value {
    json!({"type": "message", "text": format!(
        "Done. {}", json!({"status": status, "verdict": verdict, "findings": ["f1"], "files_touched": ["claimed.txt"], "remaining": [], "blockers": []}))})
}

async fn deploy(sets: &[(&str, String)]) -> (Deployment, Mcp) {
    let opts = Options {
        sets: sets
            .iter()
            .map(|(d, kv)| (d.to_string(), kv.clone()))
            .collect(),
        ..Default::default()
    };
    let d = Deployment::up(opts).await;
    let m = Mcp {
        addr: d.http.clone(),
        token: d.token(),
    };
    (d, m)
}

async fn conversations(d: &Deployment) -> Vec<pb::ConversationInfo> {
    pb::supervisor_service_client::SupervisorServiceClient::new(d.channel("supervisor"))
        .list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
}

#[tokio::test(flavor = "multi_thread")]
async fn each_verb_runs_one_supervised_turn_and_returns_the_envelope() {
    let (d, m) = deploy(&[]).await;
    let r = m
        .call(
            "advise",
            json!({"task": scenario(json!({"steps": [{"type": "report_config"}, decision("complete", "use a map")]})),
                   "effort": "high", "model": "Large"}),
        )
        .await;
    let e = envelope(&r);
    assert_eq!(e["status"], "complete", "{e}");
    assert_eq!(e["verdict"], "use a map");
    assert_eq!(e["findings"], json!(["f1"]));
    assert_eq!(e["verb"], "advise");
    assert_eq!(e["attempts"], 1);
    assert_eq!(e["depth"], 0);
    assert!(!is_error(&r));
    assert!(
        e["files_touched"].as_array().unwrap().is_empty(),
        "a claimed file is not an observed one: {e}"
    );
    let transcript = e["transcript_path"].as_str().unwrap();
    assert!(std::path::Path::new(transcript).is_file(), "{transcript}");
    // The model (asked by its display name) and effort were set on the agent's session through
    // its own config options before the prompt, not merely mentioned in it.
    let said = std::fs::read_to_string(transcript).unwrap();
    assert!(
        said.contains("model=scripted-large thought_level=high"),
        "{said}"
    );
    assert!(!said.contains("Model preference"), "{said}");
    // The read-only verb ran in a read-only conversation owned by this principal.
    let convs = conversations(&d).await;
    let c = convs
        .iter()
        .find(|c| c.context_id.starts_with("mcp-"))
        .unwrap();
    assert_eq!(c.profile, pb::Profile::ReadOnly as i32);
    assert!(!c.principal.is_empty());

    let r = m
        .call(
            "review",
            json!({"task": scenario(json!({"steps": [decision("partial", "two issues")]}))}),
        )
        .await;
    assert_eq!(envelope(&r)["status"], "partial");
    assert_eq!(envelope(&r)["verb"], "review");

    // implement: a workspace-write conversation; the edit is observed from the turn.
    let r = m
        .call(
            "implement",
            json!({"task": scenario(json!({"steps": [
                {"type": "tool", "kind": "edit", "path": "notes.txt", "content": "hi"},
                decision("complete", "wrote notes")]}))}),
        )
        .await;
    let e = envelope(&r);
    assert_eq!(e["status"], "complete", "{e}");
    assert_eq!(e["files_touched"], json!(["notes.txt"]), "{e}");
    assert_eq!(e["files_touched_from"], "root", "{e}");
    // The change itself, computed by warden from the root: a diff `git apply` takes.
    assert_eq!(e["diff"]["files"], json!(["notes.txt"]), "{e}");
    assert_eq!(e["diff"]["cut"], false, "{e}");
    assert_eq!(
        e["diff"]["text"],
        format!(
            "diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n{}--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+hi\n\\ No newline at end of file\n",
            warden_e2e::new_file_index(b"hi")
        ),
        "{e}"
    );
    assert!(e["blockers"].as_array().unwrap().is_empty(), "{e}");
    let convs = conversations(&d).await;
    let w = convs
        .iter()
        .find(|c| c.profile == pb::Profile::WorkspaceWrite as i32)
        .expect("a workspace-write conversation");
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&w.root).join("notes.txt")).unwrap(),
        "hi"
    );

    // A file a shell command writes is no tool call's location; the root walk still sees it.
    let r = m
        .call(
            "implement",
            json!({"task": scenario(json!({"steps": [
                {"type": "tool", "kind": "execute", "command": "mkdir -p out && echo hi > out/shell.txt"},
                decision("complete", "ran it")]}))}),
        )
        .await;
    let e = envelope(&r);
    assert_eq!(e["files_touched"], json!(["out", "out/shell.txt"]), "{e}");
    assert_eq!(e["files_touched_from"], "root");
    let files = e["diff"]["files"].as_array().expect("a diff");
    assert!(files.contains(&json!("out/shell.txt")), "{e}");
    assert!(
        e["diff"]["text"]
            .as_str()
            .unwrap()
            .contains("+++ b/out/shell.txt\n@@ -0,0 +1 @@\n+hi\n"),
        "{e}"
    );

    // A client that cannot be asked (no elicitation capability): the agent's question is
    // declined, and the envelope says so.
    let r = m
        .call(
            "advise",
            json!({"task": scenario(json!({"steps": [
                {"type": "question", "message": "Which file?"},
                {"type": "message", "text": "no answer then"}]}))}),
        )
        .await;
    let e = envelope(&r);
    let q: Vec<&Value> = e["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["kind"] == "question")
        .collect();
    assert_eq!(q.len(), 1, "{e}");
    assert!(
        q[0]["reason"].as_str().unwrap().contains("Which file?"),
        "{e}"
    );

    // Without the decision fields the envelope still comes, partial, from what warden saw.
    let r = m.call("advise", json!({"task": "hello"})).await;
    let e = envelope(&r);
    assert_eq!(e["status"], "partial");
    assert!(e["verdict"].as_str().unwrap().contains("hello"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_edit_is_a_policy_blocker_with_rule_and_reason() {
    let (_d, m) = deploy(&[]).await;
    let r = m
        .call(
            "review",
            json!({"task": scenario(json!({"steps": [
                {"type": "tool", "kind": "edit", "path": "x.txt", "content": "no"},
                decision("complete", "reviewed")]}))}),
        )
        .await;
    let e = envelope(&r);
    let blockers = e["blockers"].as_array().unwrap();
    let policy: Vec<&Value> = blockers.iter().filter(|b| b["kind"] == "policy").collect();
    assert_eq!(policy.len(), 1, "{e}");
    assert_eq!(policy[0]["rule"], "floor.profile.read-only", "{e}");
    assert!(
        policy[0]["reason"].as_str().unwrap().contains("read-only"),
        "{e}"
    );
    assert!(e["files_touched"].as_array().unwrap().is_empty(), "{e}");
    assert!(e["diff"].is_null(), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_verb_is_retried_once_on_timeout_and_implement_never() {
    let (d, m) = deploy(&[]).await;
    let hang = scenario(json!({"steps": [{"type": "hang"}]}));
    let t = Instant::now();
    let r = m
        .call("review", json!({"task": hang, "timeout_seconds": 1}))
        .await;
    let e = envelope(&r);
    assert_eq!(e["status"], "timeout", "{e}");
    assert!(is_error(&r));
    assert_eq!(e["attempts"], 2, "{e}");
    assert_eq!(e["incident"]["class"], "timeout", "{e}");
    assert!(
        e["blockers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["kind"] == "fault")
    );
    // Two hard cutoffs of 1.2 s each.
    assert!(
        t.elapsed() >= Duration::from_millis(2400),
        "{:?}",
        t.elapsed()
    );

    let t = Instant::now();
    let tree_and_hang = scenario(serde_json::from_str(SPAWN_AND_HANG).unwrap());
    let r = m
        .call(
            "implement",
            json!({"task": tree_and_hang, "timeout_seconds": 1}),
        )
        .await;
    let e = envelope(&r);
    assert_eq!(e["status"], "timeout", "{e}");
    assert_eq!(e["attempts"], 1, "implement is never retried: {e}");
    // The hard cutoff killed the whole tree: agent, SIGTERM-ignoring child, setsid grandchild.
    let convs = conversations(&d).await;
    let w = convs
        .iter()
        .find(|c| c.profile == pb::Profile::WorkspaceWrite as i32)
        .unwrap();
    let root = std::path::PathBuf::from(&w.root);
    assert!(
        pids_in(&root.join("pids")).len() >= 2,
        "the tree had started"
    );
    for _ in 0..100 {
        if processes_in(&root, None).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        processes_in(&root, None).is_empty(),
        "{:?}",
        processes_in(&root, None)
    );
    assert!(t.elapsed() >= Duration::from_millis(1200));
    assert!(
        t.elapsed() < Duration::from_millis(2400 + 1500),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_a_model_must_not_set_and_oversized_tasks_are_refused_before_anything_starts() {
    let (d, m) = deploy(&[]).await;
    for (k, v) in [
        ("workspace", json!("/")),
        ("session_id", json!("abc")),
        ("background", json!(true)),
    ] {
        let mut args = json!({"task": "write x"});
        args[k] = v;
        let r = m.call("implement", args).await;
        let e = envelope(&r);
        assert!(is_error(&r));
        assert_eq!(e["status"], "refused", "{e}");
        assert_eq!(e["blockers"][0]["rule"], "mcp.argument.forbidden");
        assert!(e["blockers"][0]["reason"].as_str().unwrap().starts_with(k));
    }
    let r = m
        .call("advise", json!({"task": "x", "colour": "red"}))
        .await;
    assert_eq!(envelope(&r)["blockers"][0]["rule"], "mcp.argument.unknown");
    let big = "a".repeat(16 * 1024 + 1);
    let r = m.call("advise", json!({"task": big})).await;
    let e = envelope(&r);
    assert_eq!(e["status"], "refused");
    assert_eq!(e["blockers"][0]["rule"], "mcp.task.too-large", "{e}");
    // Nothing was started for any of them.
    assert!(conversations(&d).await.is_empty());
    let exact = "a".repeat(16 * 1024);
    let r = m.call("advise", json!({"task": exact})).await;
    assert_ne!(envelope(&r)["status"], "refused", "{}", envelope(&r));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_or_effort_the_agent_does_not_offer_is_refused_naming_what_it_offers() {
    let (d, m) = deploy(&[]).await;
    let run = scenario(json!({"steps": [{"type": "report_config"}, decision("complete", "ran")]}));
    for (k, v, offered) in [
        ("model", "gpt-9", "scripted-default, scripted-large"),
        ("effort", "max", "medium, low, high, xhigh"),
        // The mode is the supervisor's to force: never a model a caller can pick.
        ("model", "plan", "scripted-default, scripted-large"),
    ] {
        let mut args = json!({"task": run});
        args[k] = json!(v);
        let r = m.call("implement", args).await;
        let e = envelope(&r);
        assert!(is_error(&r), "{e}");
        assert_eq!(e["status"], "refused", "{e}");
        assert_eq!(e["attempts"], 1, "a refusal is not retried: {e}");
        let b = &e["blockers"][0];
        assert_eq!(b["rule"], "supervisor.option-not-offered", "{e}");
        let reason = b["reason"].as_str().unwrap();
        assert!(reason.contains(v) && reason.contains(offered), "{reason}");
    }
    // Nothing kept running for them: no conversation, no agent process.
    assert!(
        conversations(&d)
            .await
            .iter()
            .all(|c| c.state != pb::ConversationState::Ready as i32),
        "{:?}",
        conversations(&d).await
    );
    let r = m
        .call(
            "implement",
            json!({"task": run, "model": "scripted-default", "effort": "medium"}),
        )
        .await;
    assert_eq!(envelope(&r)["status"], "complete", "{}", envelope(&r));
    // The same session's next calls reuse its conversation, whose model and effort were chosen
    // when it opened: another value is refused naming what the session runs (it used to run
    // silently with the first call's), an unknown one too; the same values, or none, run.
    for (k, v) in [
        ("model", "scripted-large"),
        ("effort", "low"),
        ("model", "no-such-model"),
    ] {
        let mut args = json!({"task": run});
        args[k] = json!(v);
        let r = m.call("implement", args).await;
        let e = envelope(&r);
        assert_eq!(e["status"], "refused", "{k}={v}: {e}");
        let b = &e["blockers"][0];
        assert_eq!(b["rule"], "supervisor.option-not-offered", "{e}");
        let reason = b["reason"].as_str().unwrap();
        assert!(
            reason.contains(v) && reason.contains("new conversation"),
            "{reason}"
        );
    }
    for args in [
        json!({"task": run, "model": "scripted-default", "effort": "medium"}),
        json!({"task": run}),
    ] {
        let r = m.call("implement", args).await;
        let e = envelope(&r);
        assert_eq!(e["status"], "complete", "{e}");
        let said = std::fs::read_to_string(e["transcript_path"].as_str().unwrap()).unwrap();
        assert!(
            said.contains("model=scripted-default thought_level=medium"),
            "the session still runs what it opened with: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_from_inside_a_warden_agent_is_refused_before_anything_is_spawned() {
    let (d, m) = deploy(&[]).await;
    for depth in ["1", "7", "-1", "zero"] {
        let r = m
            .call_with(
                &[("Warden-Depth", depth.to_string())],
                "implement",
                json!({"task": "write x"}),
            )
            .await;
        let e = envelope(&r);
        assert_eq!(e["status"], "refused", "depth {depth}: {e}");
        assert_eq!(e["blockers"][0]["rule"], "mcp.recursion", "{e}");
        let r = m
            .call_with(
                &[("Warden-Depth", depth.to_string())],
                "implement_background",
                json!({"task": "write x"}),
            )
            .await;
        assert!(is_error(&r), "{r}");
    }
    // Depth 0 (a caller outside warden) is served.
    let r = m
        .call_with(
            &[("Warden-Depth", "0".into())],
            "advise",
            json!({"task": "hi"}),
        )
        .await;
    assert_eq!(envelope(&r)["depth"], 0);
    assert_eq!(
        conversations(&d).await.len(),
        1,
        "only the depth-0 call started an agent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_of_an_agent_uid_is_deep_whatever_header_it_sends() {
    let (d, m) = deploy(&[]).await;
    let agents =
        pb::supervisor_service_client::SupervisorServiceClient::new(d.channel("supervisor"))
            .list_agents(pb::ListAgentsRequest {})
            .await
            .unwrap()
            .into_inner();
    let Some(uid) = agents.agent_uids.first().map(|r| r.first) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: the supervisor must switch agents to a uid of their own"
        );
        eprintln!("skipped: this supervisor cannot switch agents to a uid of their own (not root)");
        return;
    };
    // A process inside the agent that got hold of the token and reaches the port directly: it
    // leaves the header out, or claims depth 0.
    for extra in [vec![], vec![("Warden-Depth", "0".to_string())]] {
        for tool in ["implement", "advise", "implement_background"] {
            let r = m
                .call_as(Some(uid), &extra, tool, json!({"task": "write x"}))
                .await;
            assert!(is_error(&r), "{tool} {extra:?}: {r}");
            if tool != "implement_background" {
                let e = envelope(&r);
                assert_eq!(e["status"], "refused", "{e}");
                assert_eq!(e["blockers"][0]["rule"], "mcp.recursion", "{e}");
                assert_eq!(e["depth"], 1, "{e}");
            }
        }
    }
    assert!(conversations(&d).await.is_empty(), "nothing was spawned");
    // The same call from this (the operator's) uid is served.
    let r = m.call("advise", json!({"task": "hi"})).await;
    assert_eq!(envelope(&r)["depth"], 0, "{}", envelope(&r));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_background_job_leaves_no_process() {
    let (d, m) = deploy(&[]).await;
    let r = m
        .call(
            "implement_background",
            json!({"task": scenario(json!({"on_cancel": "never", "steps": [
                {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
                {"type": "hang"}]}))}),
        )
        .await;
    assert!(!is_error(&r), "{r}");
    let job = r["structuredContent"]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(r["structuredContent"]["state"], "running");
    // Find the job's conversation root and its processes.
    let mut tree = Vec::new();
    for _ in 0..200 {
        if let Some(c) = conversations(&d)
            .await
            .into_iter()
            .find(|c| !c.root.is_empty())
        {
            let root = std::path::PathBuf::from(&c.root);
            if pids_in(&root.join("pids")).len() >= 2 {
                tree = processes_in(&root, None);
                if tree.len() >= 3 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tree.len() >= 3, "agent, child and grandchild run: {tree:?}");
    let s = m.call("job_status", json!({"job_id": job})).await;
    assert_eq!(s["structuredContent"]["state"], "running", "{s}");
    assert!(s["structuredContent"]["result"].is_null());
    let c = m.call("job_cancel", json!({"job_id": job})).await;
    assert_eq!(c["structuredContent"]["state"], "cancelled", "{c}");
    assert!(
        all_gone(&tree, Duration::from_secs(10)).await,
        "left: {tree:?}"
    );
    let res = m.call("job_result", json!({"job_id": job})).await;
    let e = &res["structuredContent"]["result"];
    assert_eq!(e["status"], "blocked", "{res}");
    assert!(
        e["blockers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["kind"] == "cancelled"),
        "{e}"
    );
    assert_eq!(e["attempts"], 1);
    // Another caller's job id is not found (and unknown arguments are refused).
    let r = m.call("job_status", json!({"job_id": "nope"})).await;
    assert!(is_error(&r));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_edge_checks_host_origin_token_and_serves_protected_resource_metadata() {
    let (_d, m) = deploy(&[]).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}});
    // No token: 401 with a challenge naming the RFC 9728 metadata.
    let r = m.raw("POST", &[], Some(&init)).await;
    assert_eq!(r.status, 401);
    let challenge = r.header("www-authenticate").unwrap();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    let meta_url = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    assert!(
        meta_url.ends_with("/.well-known/oauth-protected-resource/mcp"),
        "{meta_url}"
    );
    let r = m
        .raw(
            "POST",
            &[("Authorization", "Bearer wrong".into())],
            Some(&init),
        )
        .await;
    assert_eq!(r.status, 401);
    assert!(
        r.header("www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    // The metadata document.
    let mut sock = TcpStream::connect(&m.addr).await.unwrap();
    sock.write_all(
        format!(
            "GET /.well-known/oauth-protected-resource/mcp HTTP/1.0\r\nHost: {}\r\n\r\n",
            m.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    sock.read_to_string(&mut buf).await.unwrap();
    let doc: Value = serde_json::from_str(buf.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(doc["resource"], format!("http://{}/mcp", m.addr));
    assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    // DNS rebinding: a foreign Host or Origin is refused before the token is even looked at.
    let r = m
        .raw(
            "POST",
            &[m.auth(), ("Host", "evil.example:80".into())],
            Some(&init),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = m
        .raw(
            "POST",
            &[m.auth(), ("Origin", "http://evil.example".into())],
            Some(&init),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = m
        .raw(
            "POST",
            &[m.auth(), ("Origin", "http://localhost:5173".into())],
            Some(&init),
        )
        .await;
    assert_eq!(
        r.status, 200,
        "a loopback origin is fine on a loopback bind: {}",
        r.body
    );
    // Body limit.
    let huge = json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "a".repeat(2 * 1024 * 1024)}});
    let r = m.raw("POST", &[m.auth()], Some(&huge)).await;
    assert_eq!(r.status, 413);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2025_11_25_session_is_bound_to_its_principal_and_ended_by_delete() {
    const ALICE: &str = "alice-token-0123456789";
    const BOB: &str = "bob-token-9876543210";
    let digest = |t: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(t.as_bytes()))
    };
    let (d, mut m) = deploy(&[(
        "gateway",
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    )])
    .await;
    m.token = ALICE.into();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}});
    let r = m.raw("POST", &[m.auth()], Some(&init)).await;
    assert_eq!(r.status, 200);
    let sid = r.header("mcp-session-id").expect("a session id");
    assert_eq!(r.messages()[0]["result"]["protocolVersion"], "2025-11-25");
    let legacy = |extra: Vec<(&'static str, String)>| {
        let mut h = vec![
            ("Mcp-Session-Id", sid.clone()),
            ("MCP-Protocol-Version", "2025-11-25".to_string()),
        ];
        h.extend(extra);
        h
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = m.raw("POST", &legacy(vec![m.auth()]), Some(&note)).await;
    assert_eq!(r.status, 202);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "advise", "arguments": {"task": scenario(json!({"steps": [decision("complete", "ok")]}))}}});
    let r = m.raw("POST", &legacy(vec![m.auth()]), Some(&call)).await;
    let msgs = r.messages();
    let res = msgs.iter().find(|m| m["id"] == 2).unwrap();
    assert_eq!(
        res["result"]["structuredContent"]["status"], "complete",
        "{res}"
    );
    // Bob cannot use Alice's session.
    let r = m
        .raw(
            "POST",
            &legacy(vec![("Authorization", format!("Bearer {BOB}"))]),
            Some(&call),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    let conv = conversations(&d).await;
    assert_eq!(conv.len(), 1);
    assert_eq!(conv[0].principal, "alice");
    // DELETE ends the session: its conversation is closed, the id is gone.
    let r = m.raw("DELETE", &legacy(vec![m.auth()]), None).await;
    assert!(r.status < 300, "{} {}", r.status, r.body);
    let r = m.raw("POST", &legacy(vec![m.auth()]), Some(&call)).await;
    assert_eq!(r.status, 404, "{}", r.body);
    for _ in 0..100 {
        if conversations(&d).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        conversations(&d).await.is_empty(),
        "the session's conversation was closed"
    );

    // Background jobs are their principal's: Bob can neither see nor cancel Alice's.
    let r = m
        .call(
            "implement_background",
            json!({"task": scenario(json!({"steps": [{"type": "hang"}]}))}),
        )
        .await;
    let job = r["structuredContent"]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let bob = Mcp {
        addr: m.addr.clone(),
        token: BOB.into(),
    };
    for tool in ["job_status", "job_result", "job_cancel"] {
        let r = bob.call(tool, json!({"job_id": job})).await;
        assert!(is_error(&r), "{tool}: {r}");
        assert!(r["structuredContent"]["result"].is_null(), "{r}");
    }
    let r = m.call("job_status", json!({"job_id": job})).await;
    assert_eq!(r["structuredContent"]["state"], "running", "{r}");
    let r = m.call("job_cancel", json!({"job_id": job})).await;
    assert_eq!(r["structuredContent"]["state"], "cancelled", "{r}");
}

/// Waits until a conversation has a live process tree of at least `n` processes; its root.
async fn tree_of_running_turn(d: &Deployment, n: usize) -> (std::path::PathBuf, Vec<i32>) {
    for _ in 0..200 {
        for c in conversations(d).await {
            if c.root.is_empty() || c.active_turn_id.is_empty() {
                continue;
            }
            let root = std::path::PathBuf::from(&c.root);
            let tree = processes_in(&root, None);
            if pids_in(&root.join("pids")).len() >= 2 && tree.len() >= n {
                return (root, tree);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no running turn with {n} processes: {:?}",
        conversations(d).await
    );
}

const SPAWN_AND_HANG: &str = r#"{"on_cancel": "never", "steps": [
    {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
    {"type": "hang"}]}"#;

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_mcp_request_cancels_the_turn_in_both_eras() {
    let (d, m) = deploy(&[]).await;
    let task = scenario(serde_json::from_str(SPAWN_AND_HANG).unwrap());

    // 2025-11-25: notifications/cancelled for the request id.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}});
    let r = m.raw("POST", &[m.auth()], Some(&init)).await;
    let sid = r.header("mcp-session-id").unwrap();
    let h = vec![
        m.auth(),
        ("Mcp-Session-Id", sid.clone()),
        ("MCP-Protocol-Version", "2025-11-25".to_string()),
    ];
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(m.raw("POST", &h, Some(&note)).await.status, 202);
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "implement", "arguments": {"task": task}}});
    let m2 = Mcp {
        addr: m.addr.clone(),
        token: m.token.clone(),
    };
    let h2 = h.clone();
    let pending = tokio::spawn(async move { m2.raw("POST", &h2, Some(&call)).await });
    let (_, tree) = tree_of_running_turn(&d, 3).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5, "reason": "user"}});
    assert_eq!(m.raw("POST", &h, Some(&cancel)).await.status, 202);
    assert!(
        all_gone(&tree, Duration::from_secs(15)).await,
        "left: {tree:?}"
    );
    pending.abort();
    for _ in 0..100 {
        if conversations(&d)
            .await
            .iter()
            .all(|c| c.active_turn_id.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        conversations(&d)
            .await
            .iter()
            .all(|c| c.active_turn_id.is_empty())
    );

    // 2026-07-28: closing the request's stream is the cancellation.
    let m3 = Mcp {
        addr: m.addr.clone(),
        token: m.token.clone(),
    };
    let t = task.clone();
    let pending = tokio::spawn(async move { m3.call("implement", json!({"task": t})).await });
    let (_, tree) = tree_of_running_turn(&d, 3).await;
    pending.abort(); // drops the connection
    assert!(
        all_gone(&tree, Duration::from_secs(15)).await,
        "left: {tree:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stateless_bind_is_confirmed_by_the_retry_and_a_stale_confirmation_never_binds() {
    let ws = tempfile::Builder::new()
        .prefix("ws")
        .tempdir_in(warden_e2e::test_root())
        .unwrap();
    let path = std::fs::canonicalize(ws.path())
        .unwrap()
        .display()
        .to_string();
    let (_d, m) = deploy(&[(
        "supervisor",
        format!("workspaces.proj.path={:?}", ws.path().display().to_string()),
    )])
    .await;
    let m = &m;
    let post = |params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params});
        let h = vec![
            m.auth(),
            ("MCP-Protocol-Version", ERA.to_string()),
            ("Mcp-Method", "tools/call".to_string()),
            ("Mcp-Name", "bind_workspace".to_string()),
        ];
        async move {
            let r = m.raw("POST", &h, Some(&body)).await;
            r.messages()
                .into_iter()
                .find(|v| v["id"] == 9)
                .unwrap_or_else(|| panic!("{}", r.body))["result"]
                .clone()
        }
    };
    let meta = json!({"io.modelcontextprotocol/protocolVersion": ERA,
                      "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}});
    let first = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta}),
    )
    .await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let ask = &first["inputRequests"]["confirm"];
    assert_eq!(ask["method"], "elicitation/create", "{first}");
    let message = ask["params"]["message"].as_str().unwrap();
    assert!(
        message.contains(&path) && message.contains("PROPOSED"),
        "{message}"
    );
    let stale = first["requestState"].as_str().unwrap().to_string();
    // A second bind call: the first confirmation is now stale.
    let second = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta}),
    )
    .await;
    let fresh = second["requestState"].as_str().unwrap().to_string();
    let accept = json!({"confirm": {"action": "accept", "content": {"confirm": true}}});
    let r = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta,
                        "inputResponses": accept, "requestState": stale}),
    )
    .await;
    assert_eq!(r["structuredContent"]["bound"], false, "{r}");
    // Declined: nothing is bound, and the handle is used up.
    let decline = json!({"confirm": {"action": "decline"}});
    let r = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta,
                        "inputResponses": decline, "requestState": fresh}),
    )
    .await;
    assert_eq!(r["structuredContent"]["bound"], false, "{r}");
    let r = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta,
                        "inputResponses": accept, "requestState": fresh}),
    )
    .await;
    assert_eq!(
        r["structuredContent"]["bound"], false,
        "a used handle never binds: {r}"
    );
    // A real round: ask, accept, bound.
    let third = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta}),
    )
    .await;
    let state = third["requestState"].as_str().unwrap().to_string();
    let r = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": meta,
                        "inputResponses": accept, "requestState": state}),
    )
    .await;
    assert_eq!(r["structuredContent"]["bound"], true, "{r}");
    assert_eq!(r["structuredContent"]["binding"]["path"], path.as_str());
    // A client that cannot elicit cannot bind.
    let no_elicit = json!({"io.modelcontextprotocol/protocolVersion": ERA,
                           "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                           "io.modelcontextprotocol/clientCapabilities": {}});
    let r = post(
        json!({"name": "bind_workspace", "arguments": {"proposed_path": path}, "_meta": no_elicit}),
    )
    .await;
    assert_eq!(r["structuredContent"]["bound"], false, "{r}");
    assert!(
        r["structuredContent"]["message"]
            .as_str()
            .unwrap()
            .contains("elicitation"),
        "{r}"
    );
}
