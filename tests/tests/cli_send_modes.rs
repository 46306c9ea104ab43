//! `warden send --mode/--model/--effort` and `warden contexts close` against a running deployment
//! (issue 39): under `--mode read-only` every edit and command the agent attempts is denied by
//! warden (the policy floor, whatever the agent would do), nothing is written and the reason
//! names the mode; read-only is never asked of a conversation that may already write; a model
//! the agent offers is applied, one it does not is refused naming those it does; an unknown mode
//! is an A2A invalid-params error; `contexts close` ends the conversation, removes its copy, and
//! the next message in the context starts afresh.

use std::path::Path;

use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;

async fn warden(d: &Deployment, args: &[&str]) -> (i32, String, String) {
    d.warden(args).await
}

fn end_of(out: &str) -> Value {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .unwrap_or_else(|| panic!("no end record in {out}"))
}

async fn deployment() -> Deployment {
    let d = Deployment::up(Options::default()).await;
    // As `warden up` writes it: where `send` and `contexts` find the gateway.
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    d
}

fn repo(d: &Deployment, name: &str) -> std::path::PathBuf {
    let r = d.dir.path().join(name);
    std::fs::create_dir(&r).unwrap();
    std::fs::write(r.join("README"), "base\n").unwrap();
    r
}

async fn conversation(d: &Deployment, ctx: &str) -> Option<pb::ConversationInfo> {
    pb::supervisor_service_client::SupervisorServiceClient::new(d.channel("supervisor"))
        .list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
        .into_iter()
        .find(|c| c.context_id == ctx)
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_is_enforced_by_warden_and_never_asked_of_a_writable_conversation() {
    let d = deployment().await;
    let dir = repo(&d, "mine");
    let dir_s = dir.to_string_lossy().to_string();
    // The agent tries anyway: an edit, a command that writes, then says it is done.
    let attempt = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "src/new.txt", "content": "written\n"},
        {"type": "tool", "kind": "execute", "command": "echo changed > README; touch planted"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "-C",
            &dir_s,
            "--mode",
            "read-only",
            "-o",
            "json",
            &attempt.to_string(),
        ],
    )
    .await;
    // Completed, with the policy's refusals: exit 4.
    assert_eq!(code, 4, "{out}\n{err}");
    assert!(
        out.contains("floor.profile.read-only") && out.contains("read-only profile"),
        "the refusal names the mode: {out}"
    );
    let end = end_of(&out);
    assert_eq!(end["filesChanged"], json!([]), "{end}");
    assert!(end["diff"].is_null(), "{end}");
    // Nothing written in the copy either (its root, as the supervisor keeps it).
    let ctx = end["contextId"].as_str().unwrap().to_string();
    let conv = conversation(&d, &ctx).await.expect("the conversation");
    let root = Path::new(&conv.root);
    assert_eq!(
        std::fs::read_to_string(root.join("README")).unwrap(),
        "base\n"
    );
    assert!(!root.join("src/new.txt").exists());
    assert!(!root.join("planted").exists());
    assert_eq!(conv.profile, pb::Profile::ReadOnly as i32);
    assert_eq!(
        std::fs::read_to_string(dir.join("README")).unwrap(),
        "base\n"
    );

    // A conversation opened to edit: read-only asked of it later is refused, nothing runs.
    let edit = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "a.txt", "content": "a\n"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) =
        warden(&d, &["send", "-C", &dir_s, "-o", "json", &edit.to_string()]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ctx = end_of(&out)["contextId"].as_str().unwrap().to_string();
    let again = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "b.txt", "content": "b\n"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "--context",
            &ctx,
            "--mode",
            "read-only",
            "-o",
            "json",
            &again.to_string(),
        ],
    )
    .await;
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("mode read-only or plan needs a new conversation"),
        "{out}\n{err}"
    );
    let conv = conversation(&d, &ctx).await.expect("the conversation");
    assert!(!Path::new(&conv.root).join("b.txt").exists());

    // `plan` is read-only too.
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "-C",
            &dir_s,
            "--mode",
            "plan",
            "-o",
            "json",
            &attempt.to_string(),
        ],
    )
    .await;
    assert_eq!(code, 4, "{out}\n{err}");
    assert_eq!(end_of(&out)["filesChanged"], json!([]), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_the_agent_offers_is_applied_and_one_it_does_not_is_refused_by_name() {
    let d = deployment().await;
    let report = json!({"steps": [{"type": "report_config"}]}).to_string();
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "--model",
            "scripted-large",
            "--effort",
            "high",
            "-o",
            "json",
            &report,
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("model=scripted-large thought_level=high"),
        "{out}"
    );

    let (code, out, err) = warden(&d, &["send", "--model", "gpt-9", "-o", "json", &report]).await;
    assert_ne!(code, 0, "{out}\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("gpt-9") && all.contains("scripted-default, scripted-large"),
        "the refusal names what the agent offers: {all}"
    );

    // The CLI offers only the modes there are; the gateway checks what any caller sends.
    let (code, _, err) = warden(&d, &["send", "--mode", "yolo", "x"]).await;
    assert_eq!(code, 2, "{err}");
    let r = d
        .a2a_rpc(
            &d.token(),
            "SendMessage",
            json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x"}],
                               "metadata": {"warden": {"mode": "yolo"}}}}),
        )
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"yolo\" is not a mode") && msg.contains("read-only, edit, plan"),
        "{msg}"
    );
    let r = d
        .a2a_rpc(
            &d.token(),
            "SendMessage",
            json!({"message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "x"}],
                               "metadata": {"warden": {"model": "m\u{7}"}}}}),
        )
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn contexts_close_removes_the_copy_and_the_context_starts_afresh() {
    let d = deployment().await;
    let dir = repo(&d, "mine");
    let dir_s = dir.to_string_lossy().to_string();
    let edit = |path: &str| {
        json!({"steps": [
            {"type": "tool", "kind": "edit", "path": path, "content": "x\n"},
            {"type": "message", "text": "done"}]})
        .to_string()
    };
    let (code, out, err) = warden(
        &d,
        &["send", "-C", &dir_s, "-o", "json", &edit("first.txt")],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ctx = end_of(&out)["contextId"].as_str().unwrap().to_string();
    let conv = conversation(&d, &ctx).await.expect("the conversation");
    let root = std::path::PathBuf::from(&conv.root);
    assert!(root.join("first.txt").exists());

    let (code, out, err) = warden(&d, &["contexts", "close", "-o", "json", &ctx[..8]]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let closed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(closed, json!({"contextId": ctx, "closed": true}));
    assert!(!root.exists(), "the copy {} is still there", root.display());
    assert!(
        conversation(&d, &ctx)
            .await
            .is_none_or(|c| c.state == pb::ConversationState::Closed as i32),
        "the conversation still runs"
    );
    // Closed again, or never yours: no such context.
    let (code, _, err) = warden(&d, &["contexts", "close", "zzzz-no-such"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no context of yours"), "{err}");
    let r = d
        .a2a_rpc(
            &d.token(),
            "warden.CloseContext",
            json!({"contextId": "nope"}),
        )
        .await
        .unwrap();
    assert!(r["error"]["code"].is_i64(), "{r}");

    // The context again: a fresh copy of DIR, without what the closed one had.
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "-C",
            &dir_s,
            "--context",
            &ctx,
            "-o",
            "json",
            &edit("second.txt"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end = end_of(&out);
    assert_eq!(end["contextId"], ctx.as_str());
    assert_eq!(end["filesChanged"], json!(["second.txt"]), "{end}");
    let conv = conversation(&d, &ctx).await.expect("the new conversation");
    assert!(!Path::new(&conv.root).join("first.txt").exists());
}

/// `--mode plan` on an agent with a planning option (`plan_config_option`, as the real
/// adapters' entries have it): the session is put in the agent's plan mode before the first
/// prompt, and the conversation runs under the read-only profile.
#[tokio::test(flavor = "multi_thread")]
async fn plan_puts_the_agent_in_its_plan_mode_under_the_read_only_profile() {
    let d = Deployment::up(Options {
        sets: vec![(
            "supervisor".into(),
            "agents.scripted.plan_config_option=\"mode=plan\"".into(),
        )],
        ..Default::default()
    })
    .await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let attempt = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "plan.txt", "content": "written\n"},
        {"type": "message", "text": "here is the plan"}]});
    let (code, out, err) = warden(
        &d,
        &["send", "--mode", "plan", "-o", "json", &attempt.to_string()],
    )
    .await;
    // The agent, in its plan mode, refuses the write itself (warden's floor would have, as
    // the first test shows for an agent without one).
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("not allowed in plan mode"), "{out}");
    let end = end_of(&out);
    assert_eq!(end["filesChanged"], json!([]), "{end}");
    let conv = conversation(&d, end["contextId"].as_str().unwrap())
        .await
        .expect("the conversation");
    assert_eq!(conv.current_mode, "plan", "{conv:?}");
    assert_eq!(conv.profile, pb::Profile::ReadOnly as i32);

    // Without --mode the same agent opens in its supervised default mode, and may edit.
    let edit = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "plan.txt", "content": "written\n"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(&d, &["send", "-o", "json", &edit.to_string()]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end = end_of(&out);
    assert_eq!(end["filesChanged"], json!(["plan.txt"]), "{end}");
    let conv = conversation(&d, end["contextId"].as_str().unwrap())
        .await
        .expect("the conversation");
    assert_eq!(conv.current_mode, "default", "{conv:?}");
}

/// `send --workspace NAME`: the agent works directly in an operator workspace (MCP's rule,
/// `[[agents.access]]`), so its change is there when the task ends; a caller the access rules
/// do not give that workspace is refused before anything runs, the refusal naming the rule.
#[tokio::test(flavor = "multi_thread")]
async fn send_works_directly_in_an_operator_workspace_the_caller_may_use() {
    let parent = warden_e2e::test_root();
    let ws = parent.join(format!("send-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ws);
    std::fs::create_dir_all(&ws).unwrap();
    // The operator lets the agents' user write there (warden writes with the agent's rights).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let edit = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "hello.txt", "content": "from the agent\n", "via": "client"},
        {"type": "message", "text": "done"}]})
    .to_string();
    let ws_set = format!("workspaces.shared.path=\"{}\"", ws.display());

    let d = Deployment::up(Options {
        sets: vec![("supervisor".into(), ws_set.clone())],
        ..Options::default()
    })
    .await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let (code, out, err) =
        warden(&d, &["send", "--workspace", "shared", "-o", "json", &edit]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(end_of(&out)["state"], "TASK_STATE_COMPLETED", "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).unwrap_or_default(),
        "from the agent\n",
        "the change is in the workspace itself: {out}"
    );
    // With -C as well: one or the other.
    let (code, _, err) = warden(
        &d,
        &[
            "send",
            "--workspace",
            "shared",
            "-C",
            &ws.to_string_lossy(),
            &edit,
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("cannot be used with"), "{err}");
    drop(d);

    let d = Deployment::up(Options {
        sets: vec![
            ("supervisor".into(), ws_set),
            (
                "gateway".into(),
                r#"agents.access=[{principal="local", workspaces=["elsewhere"]}]"#.into(),
            ),
        ],
        ..Options::default()
    })
    .await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    std::fs::remove_file(ws.join("hello.txt")).unwrap();
    let (code, out, err) = warden(&d, &["send", "--workspace", "shared", &edit]).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("workspace \"shared\" is not available to you")
            && err.contains("agents.access"),
        "{out}\n{err}"
    );
    assert!(!ws.join("hello.txt").exists(), "nothing ran");
    let _ = std::fs::remove_dir_all(&ws);
}
