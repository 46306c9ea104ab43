//! Issue 31, "principals are tenants": two principals (`alice`, `bob`, each with its own token)
//! against the real daemons, driven as a hostile caller would.
//!
//! - case 1: a context id reused after a restart never reaches the first principal's root — the
//!   supervisor records the owner with the root and refuses another principal's open, across a
//!   restart; the gateway's idle close after a restart removes the root it finds no conversation
//!   for; bob reusing alice's forgotten context id gets a fresh sandbox.
//! - case 2: `[[agents.access]]` holds on `/mcp` as on A2A (every verb, `status`).
//! - case 6: a leaked MCP `requestState` (a waiting verb's, a bind confirmation's) presented by
//!   bob changes nothing; alice's call completes afterwards.
//! - case 7: rejected 1 MiB messages leave the gateway's store essentially unchanged.

mod supervisor_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use supervisor_support::{client, open, run, text, turn};
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;

const ALICE: &str = "alice-token-tenants-0123456789";
const BOB: &str = "bob-token-tenants-9876543210";
const SECRET: &str = "alice-secret-7f3a9c";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

fn tokens() -> (String, String) {
    (
        "gateway".into(),
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    )
}

async fn up(mut sets: Vec<(String, String)>) -> Deployment {
    sets.push(tokens());
    Deployment::up(Options {
        sets,
        ..Options::default()
    })
    .await
}

async fn rpc(d: &Deployment, token: &str, method: &str, params: Value) -> Value {
    d.a2a_rpc(token, method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn send_params(id: &str, ctx: Option<&str>, text: &str) -> Value {
    let mut m = json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]});
    if let Some(c) = ctx {
        m["contextId"] = json!(c);
    }
    json!({"message": m})
}

/// Everything a finished task shows its caller (artifacts, status, history).
fn said(task: &Value) -> String {
    task.to_string()
}

/// The root of `ctx`'s live conversation, as the supervisor lists it.
async fn root_of(d: &Deployment, ctx: &str) -> PathBuf {
    let convs = client(d)
        .list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations;
    let c = convs
        .iter()
        .find(|c| c.context_id == ctx)
        .unwrap_or_else(|| panic!("no conversation {ctx}: {convs:?}"));
    PathBuf::from(&c.root)
}

async fn restart(d: &mut Deployment, names: &[&str]) {
    for n in names.iter().rev() {
        if let Some(x) = d.take(n) {
            let st = x.terminate().await;
            assert!(st.success(), "{n} stopped badly: {st:?}");
        }
    }
    for n in names {
        d.start(n).await;
    }
}

fn write_secret() -> String {
    json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "notes.txt", "content": SECRET},
        {"type": "message", "text": "written"}]})
    .to_string()
}

fn read_notes() -> String {
    json!({"steps": [{"type": "tool", "kind": "read", "path": "notes.txt"}]}).to_string()
}

// ----------------------------------------------------------------------------------------- case 1

/// The supervisor's own record: a restart between alice's write and bob's open, the gateway
/// out of the way (its checks are not what holds here).
#[tokio::test(flavor = "multi_thread")]
async fn the_supervisor_refuses_another_principals_context_id_across_a_restart() {
    let mut d = supervisor_support::deploy(&[]).await;
    let mut c = client(&d);
    let as_ = |who: &str, ctx: &str, id: &str, text: &str| {
        let mut t = turn(ctx, id, text);
        t.open.as_mut().unwrap().principal = who.into();
        t
    };
    let opened = |who: &str, ctx: &str| {
        let mut o = open(ctx, pb::Profile::WorkspaceWrite);
        o.principal = who.into();
        o
    };
    let evs = run(
        &mut c,
        as_("alice", "team-build-ctx", "a1", &write_secret()),
    )
    .await;
    assert!(text(&evs).contains("written"), "{evs:?}");
    let root = root_of(&d, "team-build-ctx").await;
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        SECRET
    );
    // While alice's conversation is live, bob's open and turn are "not found".
    let e = c
        .open_conversation(opened("bob", "team-build-ctx"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let e = c
        .run_turn(as_("bob", "team-build-ctx", "b0", &read_notes()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert!(!e.message().contains(SECRET));

    // The supervisor restarts: only the root and its record are left.
    restart(&mut d, &["supervisor"]).await;
    let mut c = client(&d);
    let e = c
        .run_turn(as_("bob", "team-build-ctx", "b1", &read_notes()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert_eq!(e.message(), "context team-build-ctx not found");
    let e = c
        .open_conversation(opened("bob", "team-build-ctx"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    // bob's close takes nothing of alice's.
    let r = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "team-build-ctx".into(),
            principal: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.closed);
    assert!(
        root.join("notes.txt").is_file(),
        "bob's close removed alice's root"
    );
    // alice reopens her own root after the restart.
    let evs = run(&mut c, as_("alice", "team-build-ctx", "a2", &read_notes())).await;
    assert!(format!("{evs:?}").contains(SECRET), "{evs:?}");
    // Her close removes it; with no conversation in memory too (a second restart first).
    restart(&mut d, &["supervisor"]).await;
    let mut c = client(&d);
    let r = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "team-build-ctx".into(),
            principal: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.closed, "no live conversation after the restart");
    assert!(
        !root.exists(),
        "the close of a context with no live agent left its root: {}",
        root.display()
    );
    // The id is free again: bob's conversation in it is a fresh, empty root.
    let evs = run(&mut c, as_("bob", "team-build-ctx", "b2", &read_notes())).await;
    assert!(!format!("{evs:?}").contains(SECRET), "{evs:?}");
    assert!(format!("{evs:?}").contains("notes.txt"), "{evs:?}");
}

/// The issue's measured path through `warden up`'s daemons: alice writes in `team-build-ctx`,
/// the daemons restart, the gateway's idle close finds no conversation and the context is
/// forgotten; bob then sends `read notes.txt` in the same contextId.
#[tokio::test(flavor = "multi_thread")]
async fn a_reused_context_id_after_a_restart_gets_a_fresh_sandbox_not_the_old_root() {
    let mut d = up(vec![]).await;
    let r = rpc(
        &d,
        ALICE,
        "SendMessage",
        send_params("a-write", Some("team-build-ctx"), &write_secret()),
    )
    .await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    // Its root (a warm agent's may carry another label): as the supervisor lists it.
    let root = root_of(&d, "team-build-ctx").await;
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        SECRET
    );
    // While the gateway knows the context, bob is told it does not exist.
    let r = rpc(
        &d,
        BOB,
        "SendMessage",
        send_params("b-early", Some("team-build-ctx"), &read_notes()),
    )
    .await;
    assert_eq!(r["error"]["code"], -32001, "{r}");

    // `warden up` restarts; the gateway comes back with a short TTL and retention, so its sweep
    // closes the idle context (no live conversation: found=false) and then forgets it.
    d.opts.sets.extend([
        (
            "gateway".to_string(),
            "store.conversation_ttl_seconds=1".to_string(),
        ),
        ("gateway".into(), "store.task_retention_seconds=2".into()),
        ("gateway".into(), "store.sweep_interval_ms=200".into()),
    ]);
    restart(&mut d, &["policy", "supervisor", "gateway"]).await;
    let t0 = Instant::now();
    while root.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the idle close after the restart left alice's root {}",
            root.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Bob retries until the gateway has forgotten the context, then runs in it.
    let task = loop {
        let r = rpc(
            &d,
            BOB,
            "SendMessage",
            send_params("b-read", Some("team-build-ctx"), &read_notes()),
        )
        .await;
        if let Some(t) = r["result"].get("task") {
            break t.clone();
        }
        assert_eq!(r["error"]["code"], -32001, "{r}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the context was never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert!(
        !said(&task).contains(SECRET),
        "bob read alice's file: {task}"
    );
    let fresh = root_of(&d, "team-build-ctx").await;
    assert_ne!(fresh, root);
    assert!(!fresh.join("notes.txt").exists());
}

// ----------------------------------------------------------------------------------------- case 2

struct Mcp<'a> {
    d: &'a Deployment,
    token: &'static str,
}

impl Mcp<'_> {
    /// A stateless (2026-07-28) tools/call through the harness's HTTP client; the result.
    async fn call(&self, tool: &str, args: Value, extra: Value) -> Value {
        let mut params = json!({"name": tool, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}});
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
            .to_string();
        // HTTP/1.0 over a plain socket, as `tests/tests/mcp.rs` speaks it: the answer ends
        // with the connection.
        let req = format!(
            "POST /mcp HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n\
             Content-Length: {len}\r\n\r\n{body}",
            host = self.d.http,
            token = self.token,
            len = body.len(),
        );
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut sock = tokio::net::TcpStream::connect(&self.d.http)
            .await
            .expect("gateway reachable");
        sock.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(90), sock.read_to_end(&mut buf))
            .await
            .expect("answer within 90 s")
            .unwrap();
        let all = String::from_utf8_lossy(&buf).into_owned();
        let (head, text) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{all}"
        );
        // The answer: a JSON body, or the last SSE `data:` line carrying id 7.
        let answer = serde_json::from_str::<Value>(text).ok().or_else(|| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .rfind(|v| v["id"] == 7)
        });
        let answer = answer.unwrap_or_else(|| panic!("no answer: {text}"));
        answer
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("not a result: {answer}"))
    }
}

fn access_sets() -> Vec<(String, String)> {
    vec![
        (
            "supervisor".into(),
            format!(
                "agents.premium.command={:?}",
                warden_e2e::binary("warden-scripted-agent")
                    .display()
                    .to_string()
            ),
        ),
        (
            "gateway".into(),
            r#"agents.access=[{principal="bob", agents=["scripted"]}]"#.into(),
        ),
    ]
}

/// An MCP verb's task: the scenario in a fenced block (the verb's instructions follow it).
fn mcp_task(v: Value) -> String {
    format!("Please do this.\n```json\n{v}\n```\n")
}

fn done(verdict: &str) -> Value {
    json!({"type": "message", "text": format!("Done. {}",
        json!({"status": "complete", "verdict": verdict, "findings": [], "files_touched": [], "remaining": [], "blockers": []}))})
}

fn decision(verdict: &str) -> String {
    mcp_task(json!({"steps": [done(verdict)]}))
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_access_holds_on_mcp_as_on_a2a() {
    let d = up(access_sets()).await;
    let bob = Mcp { d: &d, token: BOB };
    let alice = Mcp {
        d: &d,
        token: ALICE,
    };
    // alice may use premium: it is a working agent, so a refusal for bob is the rule's.
    let r = alice
        .call(
            "advise",
            json!({"task": decision("premium ran"), "agent": "premium"}),
            json!({}),
        )
        .await;
    assert_eq!(r["structuredContent"]["verdict"], "premium ran", "{r}");
    // bob: every verb refuses premium, naming only his own agents; nothing ran.
    for verb in ["advise", "review", "implement"] {
        let r = bob
            .call(
                verb,
                json!({"task": decision("premium ran"), "agent": "premium"}),
                json!({}),
            )
            .await;
        let e = &r["structuredContent"];
        assert_eq!(e["status"], "refused", "{verb}: {r}");
        let why = e.to_string();
        assert!(
            why.contains("not available to you; yours: scripted"),
            "{why}"
        );
        assert!(!why.contains("premium ran"), "{why}");
        assert!(!why.contains("claude") && !why.contains("codex"), "{why}");
    }
    // An agent that does not exist gets the same words: bob cannot tell the two apart.
    let r = bob
        .call(
            "advise",
            json!({"task": decision("x"), "agent": "ghost"}),
            json!({}),
        )
        .await;
    let why = r["structuredContent"].to_string();
    assert!(
        why.contains("not available to you; yours: scripted"),
        "{why}"
    );
    assert!(!why.contains("premium"), "{why}");
    let r = bob
        .call(
            "implement_background",
            json!({"task": decision("premium ran"), "agent": "premium"}),
            json!({}),
        )
        .await;
    let job = r["structuredContent"]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut result = Value::Null;
    for _ in 0..200 {
        let s = bob
            .call("job_result", json!({"job_id": job}), json!({}))
            .await;
        if s["structuredContent"]["state"] != "running" {
            result = s["structuredContent"]["result"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(result["status"], "refused", "{result}");
    assert!(!result.to_string().contains("premium ran"), "{result}");
    // bob's own agent still runs.
    let r = bob
        .call(
            "advise",
            json!({"task": decision("scripted ran")}),
            json!({}),
        )
        .await;
    assert_eq!(r["structuredContent"]["verdict"], "scripted ran", "{r}");
    // status lists what the caller may use, only.
    let s = bob.call("status", json!({}), json!({})).await;
    assert_eq!(s["structuredContent"]["agents"], json!(["scripted"]), "{s}");
    let s = alice.call("status", json!({}), json!({})).await;
    let all = s["structuredContent"]["agents"].to_string();
    assert!(all.contains("premium") && all.contains("scripted"), "{all}");
    // A2A refuses it too, with the same words, on JSON-RPC.
    let r = rpc(
        &d,
        BOB,
        "SendMessage",
        json!({"message": {"messageId": "b-prem", "role": "ROLE_USER", "parts": [{"text": decision("premium ran")}],
                           "metadata": {"agent": "premium"}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not available to you; yours: scripted"),
        "{r}"
    );
    // And no conversation of premium was ever opened for bob.
    let convs = client(&d)
        .list_conversations(pb::ListConversationsRequest {
            principal: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .conversations;
    assert!(convs.iter().all(|c| c.agent == "scripted"), "{convs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_workspace_offers_only_the_workspaces_a_principal_may_use() {
    let base = warden_e2e::test_root().join(format!("tenants-ws-{}", std::process::id()));
    let (open_ws, closed_ws) = (base.join("open"), base.join("closed"));
    std::fs::create_dir_all(&open_ws).unwrap();
    std::fs::create_dir_all(&closed_ws).unwrap();
    let d = up(vec![
        (
            "supervisor".into(),
            format!("workspaces.open.path={:?}", open_ws.display().to_string()),
        ),
        (
            "supervisor".into(),
            format!(
                "workspaces.closed.path={:?}",
                closed_ws.display().to_string()
            ),
        ),
        (
            "gateway".into(),
            r#"agents.access=[{principal="bob", workspaces=["open"]}]"#.into(),
        ),
    ])
    .await;
    let bob = Mcp { d: &d, token: BOB };
    let closed = closed_ws.display().to_string();
    let r = bob
        .call(
            "bind_workspace",
            json!({"proposed_path": closed}),
            json!({}),
        )
        .await;
    assert_eq!(r["structuredContent"]["bound"], false, "{r}");
    // The refusal lists bob's own workspaces only (his proposal is echoed back to him).
    let msg = r["structuredContent"]["message"].as_str().unwrap();
    let listed = msg.split("allowed:").nth(1).unwrap_or_default();
    assert!(listed.contains(&open_ws.display().to_string()), "{msg}");
    assert!(
        !listed.contains(&closed),
        "the refusal names the closed workspace: {msg}"
    );
    // Asked without a path, bob is offered his one workspace only.
    let r = bob.call("bind_workspace", json!({}), json!({})).await;
    assert_eq!(r["resultType"], "input_required", "{r}");
    let ask = r["inputRequests"].to_string();
    assert!(ask.contains(&open_ws.display().to_string()), "{ask}");
    assert!(!ask.contains(&closed), "{ask}");
    // alice has no entry: the closed workspace is hers to bind.
    let alice = Mcp {
        d: &d,
        token: ALICE,
    };
    let r = alice
        .call(
            "bind_workspace",
            json!({"proposed_path": closed}),
            json!({}),
        )
        .await;
    assert_eq!(r["resultType"], "input_required", "{r}");
    let _ = std::fs::remove_dir_all(&base);
}

// ----------------------------------------------------------------------------------------- case 6

#[tokio::test(flavor = "multi_thread")]
async fn a_leaked_request_state_presented_by_another_principal_changes_nothing() {
    let d = up(vec![]).await;
    let alice = Mcp {
        d: &d,
        token: ALICE,
    };
    let bob = Mcp { d: &d, token: BOB };
    let task = mcp_task(json!({"steps": [
        {"type": "question", "message": "Which file?"}, done("answered")]}));
    let r = alice.call("advise", json!({"task": task}), json!({})).await;
    assert_eq!(r["resultType"], "input_required", "{r}");
    let state = r["requestState"].as_str().unwrap().to_string();
    let answer = json!({"question": {"action": "accept", "content": {"answer": "main.rs"}}});
    // bob presents alice's handle (with an answer, and without): refused, nothing changes.
    for responses in [answer.clone(), json!({})] {
        let r = bob
            .call(
                "advise",
                json!({"task": "x"}),
                json!({"requestState": state, "inputResponses": responses}),
            )
            .await;
        assert!(
            r.to_string().contains("unknown or expired"),
            "bob's use of the handle: {r}"
        );
    }
    // alice's retry still answers her waiting call, which completes.
    let r = alice
        .call(
            "advise",
            json!({"task": "x"}),
            json!({"requestState": state, "inputResponses": answer}),
        )
        .await;
    assert_eq!(r["structuredContent"]["status"], "complete", "{r}");
    assert_eq!(r["structuredContent"]["verdict"], "answered", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leaked_bind_confirmation_presented_by_another_principal_changes_nothing() {
    let ws = warden_e2e::test_root().join(format!("tenants-bind-{}", std::process::id()));
    std::fs::create_dir_all(&ws).unwrap();
    let path = ws.display().to_string();
    let d = up(vec![(
        "supervisor".into(),
        format!("workspaces.repo.path={path:?}"),
    )])
    .await;
    let alice = Mcp {
        d: &d,
        token: ALICE,
    };
    let bob = Mcp { d: &d, token: BOB };
    let first = alice
        .call("bind_workspace", json!({"proposed_path": path}), json!({}))
        .await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let state = first["requestState"].as_str().unwrap().to_string();
    let accept = json!({"confirm": {"action": "accept", "content": {"confirm": true}}});
    let r = bob
        .call(
            "bind_workspace",
            json!({"proposed_path": path}),
            json!({"requestState": state, "inputResponses": accept}),
        )
        .await;
    assert_eq!(r["structuredContent"]["bound"], false, "{r}");
    let s = bob.call("status", json!({}), json!({})).await;
    assert_eq!(s["structuredContent"]["binding"], Value::Null, "{s}");
    // alice's confirmation still binds her.
    let r = alice
        .call(
            "bind_workspace",
            json!({"proposed_path": path}),
            json!({"requestState": state, "inputResponses": accept}),
        )
        .await;
    assert_eq!(r["structuredContent"]["bound"], true, "{r}");
    let _ = std::fs::remove_dir_all(&ws);
}

// ----------------------------------------------------------------------------------------- case 7

fn du(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            total += du(&e.path());
        } else {
            use std::os::unix::fs::MetadataExt;
            total += m.blocks() * 512;
        }
    }
    total
}

/// Rejected 1 MiB messages: 30 of them grew the store by 74.6 MB before. Now the bound is
/// 1 MiB for all 30 together (the store is measured after a stop, which flushes it).
#[tokio::test(flavor = "multi_thread")]
async fn rejected_messages_cost_the_gateway_store_nothing() {
    let mut d = up(vec![(
        "gateway".into(),
        // Big enough that the message reaches the task logic instead of the body limit.
        "http.max_body_bytes=2097152".into(),
    )])
    .await;
    restart(&mut d, &["gateway"]).await;
    let store = d.layout.state_of("gateway");
    let before = du(&store);
    let big = "x".repeat(1024 * 1024);
    for i in 0..30 {
        let r = rpc(
            &d,
            ALICE,
            "SendMessage",
            send_params(&format!("big-{i}"), None, &big),
        )
        .await;
        assert_eq!(
            r["error"]["code"],
            -32602,
            "{}",
            &r.to_string()[..200.min(r.to_string().len())]
        );
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("prompt-too-large"),
            "{}",
            r["error"]
        );
    }
    let listed = rpc(&d, ALICE, "ListTasks", json!({})).await;
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    let g = d.take("gateway").unwrap();
    assert!(g.terminate().await.success());
    let after = du(&store);
    let grown = after.saturating_sub(before);
    println!(
        "gateway store: {before} bytes before, {after} after 30 rejected 1 MiB messages (+{grown})"
    );
    assert!(
        grown < 1024 * 1024,
        "30 rejected 1 MiB messages grew the store by {grown} bytes"
    );
    // A task that is accepted is still stored as before.
    d.start("gateway").await;
    let r = rpc(
        &d,
        ALICE,
        "SendMessage",
        send_params("small", None, &decision("ok")),
    )
    .await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
}
