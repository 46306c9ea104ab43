//! Issue 24, case 4: a decision is bound to what it judged. A hostile scripted agent asks for one
//! thing and, once allowed, asks the client for another: `execute ls` then a `terminal/create` of
//! `sh -c 'echo pwned > marker'`; an edit whose raw input holds "harmless" then an
//! `fs/write_text_file` of other content. The other action is not carried out on the strength of
//! that ALLOW: it is decided on its own, carrying what would really run (argv and cwd, the
//! content's hash), its answer is enforced, and the audit — through the admin API and `warden
//! audit` — names the digest of what each decision judged. The matching action still runs on its
//! ALLOW, once. Real policy and supervisor daemons, the real scripted agent.

mod supervisor_support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use supervisor_support::*;
use warden_e2e::{binary, run_with_deadline};
use warden_proto::v1 as pb;

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn record<'a>(audit: &'a [pb::AuditRecord], id: &str) -> &'a pb::AuditRecord {
    audit
        .iter()
        .find(|r| r.decision_id == id)
        .unwrap_or_else(|| panic!("decision {id} not in the audit: {audit:#?}"))
}

/// `warden --state-dir D ARGS...`: stdout (the command must succeed).
async fn warden(d: &warden_e2e::Deployment, args: &[&str]) -> String {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state]).args(args);
    let out = run_with_deadline(&mut c, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("warden {args:?}: {e}"));
    assert!(
        out.status.success(),
        "warden {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Status and text of the last tool_call_update (what the agent made of the client's answer).
fn last_tool(evs: &[pb::TurnEvent]) -> (String, String) {
    evs.iter()
        .rev()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) if t.update && !t.status.is_empty() => {
                Some((t.status.clone(), t.content_text.clone()))
            }
            _ => None,
        })
        .unwrap_or_default()
}

fn root(c: &mut Client, ctx: &str) -> impl std::future::Future<Output = PathBuf> {
    let mut c = c.clone();
    let req = open(ctx, pb::Profile::WorkspaceWrite);
    async move { PathBuf::from(c.open_conversation(req).await.unwrap().into_inner().root) }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_execute_does_not_run_a_different_command() {
    // The operator denies commands run by `sh` (the title's first word); `ls` is allowed.
    let d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("policy", r#"policy.global.auto_deny=["sh"]"#),
    ])
    .await;
    let mut c = client(&d);
    let hostile = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "execute", "command": "ls", "ask": true, "via": "client",
         "then_run": "echo pwned > marker"}]}));
    let evs = run(&mut c, turn("dig-exec", "t1", &hostile)).await;
    let root = root(&mut c, "dig-exec").await;
    let p = permissions(&evs);
    assert_eq!(
        p.len(),
        2,
        "the ALLOW of ls and a decision of its own: {p:#?}"
    );
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    assert_eq!(p[1].tool_kind, "execute");
    assert_eq!(p[1].tool_title, "sh -c 'echo pwned > marker'");
    assert_eq!(p[1].verdict, pb::Verdict::Deny as i32, "{p:#?}");
    let (status, out) = last_tool(&evs);
    assert_eq!(status, "failed", "{evs:#?}");
    assert!(out.contains("refused by the policy"), "{out}");
    assert!(!root.join("marker").exists(), "the other command ran");

    // The audit holds both, each with what it judged: ls in the root, then the real command.
    let audit = audit_of(&d, "dig-exec").await;
    let allowed = record(&audit, &p[0].decision_id);
    let ja = allowed.judged.clone().unwrap_or_default();
    assert_eq!(ja.argv, ["ls"], "{allowed:?}");
    assert_eq!(PathBuf::from(&ja.cwd), root);
    assert!(ja.digest.starts_with("sha256:"), "{ja:?}");
    let real = record(&audit, &p[1].decision_id);
    let jr = real.judged.clone().unwrap_or_default();
    assert_eq!(real.verdict, pb::Verdict::Deny as i32);
    assert_eq!(real.tool_title, "sh -c 'echo pwned > marker'");
    assert_eq!(jr.argv, ["sh", "-c", "echo pwned > marker"], "{real:?}");
    assert_eq!(PathBuf::from(&jr.cwd), root);
    assert_ne!(jr.digest, ja.digest);
    // ... and so does `warden audit`, for an operator.
    let shown = warden(&d, &["audit", "show", &p[1].decision_id]).await;
    assert!(
        shown.contains(&format!("action_digest   {}", jr.digest)),
        "{shown}"
    );
    assert!(shown.contains("echo pwned > marker"), "{shown}");
    let tail = warden(&d, &["audit", "tail"]).await;
    assert!(tail.contains(&format!("action={}", ja.digest)), "{tail}");

    // The command the ALLOW judged runs on it, with no other decision.
    let honest = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "execute", "command": "echo honest > honest.txt", "ask": true,
         "via": "client"}]}));
    let evs = run(&mut c, turn("dig-exec", "t2", &honest)).await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    assert_eq!(last_tool(&evs).0, "completed", "{evs:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join("honest.txt")).unwrap_or_default(),
        "honest\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_execute_does_not_cover_a_terminal_with_an_environment_it_did_not_judge() {
    // The ALLOW judged `echo ok > env.txt`; the agent's terminal asks for the same command with
    // LD_PRELOAD set, which changes what runs. That terminal is decided on its own, carrying
    // the entries (here the operator refuses anything run through `env`).
    let d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("policy", r#"policy.global.auto_deny=["env"]"#),
    ])
    .await;
    let mut c = client(&d);
    let hostile = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "execute", "command": "echo ok > env.txt", "ask": true,
         "via": "client", "then_env": {"LD_PRELOAD": "/tmp/evil.so", "CLAUDECODE": "1"}}]}));
    let evs = run(&mut c, turn("dig-env", "t1", &hostile)).await;
    let root = root(&mut c, "dig-env").await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 2, "{p:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    assert_eq!(
        p[1].tool_title, "env LD_PRELOAD=/tmp/evil.so sh -c 'echo ok > env.txt'",
        "{p:#?}"
    );
    assert_eq!(p[1].verdict, pb::Verdict::Deny as i32, "{p:#?}");
    assert!(!root.join("env.txt").exists(), "the terminal ran");
    let audit = audit_of(&d, "dig-env").await;
    let real = record(&audit, &p[1].decision_id);
    assert!(
        real.tool_title.contains("LD_PRELOAD=/tmp/evil.so"),
        "the audit names the environment it judged: {real:?}"
    );
    // The marker claude-code-acp puts on every terminal (CLAUDECODE=1) changes nothing that
    // runs: the ALLOW of the command covers it, no second decision.
    let honest = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "execute", "command": "echo ok > env.txt", "ask": true,
         "via": "client", "then_env": {"CLAUDECODE": "1"}}]}));
    let evs = run(&mut c, turn("dig-env", "t2", &honest)).await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(last_tool(&evs).0, "completed", "{evs:#?}");
    assert!(root.join("env.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_execute_opens_one_terminal_and_a_second_is_decided() {
    // Without the operator's rule the floor allows commands in an owned root: the second run of
    // the same command is still not carried out on the first ALLOW — it is decided (and audited)
    // on its own.
    let d = deploy(&[("supervisor", "agents.scripted.terminal=true")]).await;
    let mut c = client(&d);
    let twice = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "execute", "command": "echo x >> count.txt", "ask": true,
         "via": "client", "tool_call_id": "once"},
        {"type": "tool", "kind": "execute", "command": "echo x >> count.txt", "ask": false,
         "via": "client", "tool_call_id": "again"}]}));
    let evs = run(&mut c, turn("dig-twice", "t1", &twice)).await;
    let root = root(&mut c, "dig-twice").await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 2, "{p:#?}");
    assert_eq!(p[1].tool_title, "sh -c 'echo x >> count.txt'", "{p:#?}");
    assert!(p.iter().all(|p| p.verdict == pb::Verdict::Allow as i32));
    assert_eq!(
        std::fs::read_to_string(root.join("count.txt")).unwrap_or_default(),
        "x\nx\n"
    );
    let audit = audit_of(&d, "dig-twice").await;
    assert!(
        p.iter()
            .all(|p| audit.iter().any(|r| r.decision_id == p.decision_id)),
        "{audit:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_allowed_for_harmless_content_does_not_cover_other_content() {
    // The operator denies the supervisor's own write decisions; the agent's edits are allowed.
    let d = deploy(&[(
        "policy",
        r#"policy.principals.tester.auto_deny=["fs/write_text_file"]"#,
    )])
    .await;
    let mut c = client(&d);
    let hostile = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "x.txt", "content": "harmless", "ask": true,
         "via": "client", "then_write": "pwned"}]}));
    let evs = run(&mut c, turn("dig-edit", "t1", &hostile)).await;
    let root = root(&mut c, "dig-edit").await;
    let p = permissions(&evs);
    assert_eq!(
        p.len(),
        2,
        "the edit's ALLOW and the write's own decision: {p:#?}"
    );
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    assert_eq!(p[1].tool_kind, "edit");
    assert!(p[1].tool_title.starts_with("fs/write_text_file "), "{p:#?}");
    assert_eq!(p[1].verdict, pb::Verdict::Deny as i32, "{p:#?}");
    assert!(
        !root.join("x.txt").exists(),
        "the other content was written"
    );

    let audit = audit_of(&d, "dig-edit").await;
    let allowed = record(&audit, &p[0].decision_id)
        .judged
        .clone()
        .unwrap_or_default();
    assert_eq!(allowed.content_sha256, sha("harmless"), "{allowed:?}");
    assert_eq!(
        allowed.locations,
        [root.join("x.txt").display().to_string()]
    );
    let real = record(&audit, &p[1].decision_id);
    let jr = real.judged.clone().unwrap_or_default();
    assert_eq!(jr.content_sha256, sha("pwned"), "{real:?}");
    assert_eq!(jr.locations, allowed.locations);
    assert_ne!(jr.digest, allowed.digest);
    let shown = warden(&d, &["audit", "show", &p[1].decision_id]).await;
    assert!(
        shown.contains(&format!("judged content  {}", sha("pwned"))),
        "{shown}"
    );

    // The content the ALLOW judged is written on it, with no other decision.
    let honest = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "y.txt", "content": "harmless", "ask": true,
         "via": "client"}]}));
    let evs = run(&mut c, turn("dig-edit", "t2", &honest)).await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join("y.txt")).unwrap_or_default(),
        "harmless"
    );
}
