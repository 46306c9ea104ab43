//! The real `warden-policy` binary, started as its own process: the contract kit, peer
//! allowlists with a second uid, audit records, reloads (SIGHUP and admin) and malformed requests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use warden_decide::contract::{
    Fixture, KitOptions, SlowPolicy, check_deadline_cutoff, check_policy_service, serve_on_socket,
};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

struct Policy {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Policy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Policy {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("policy.sock")
    }
    fn admin_socket(&self) -> PathBuf {
        self.dir.path().join("policy-admin.sock")
    }
    fn policy(&self) -> PolicyServiceClient<tonic::transport::Channel> {
        PolicyServiceClient::new(warden_daemon::client::unix_channel(&self.socket()))
    }
    fn admin(&self) -> AdminServiceClient<tonic::transport::Channel> {
        AdminServiceClient::new(warden_daemon::client::unix_channel(&self.admin_socket()))
    }
    fn write_config(&self, policy: &str, extra: &str) {
        write_config(self.dir.path(), policy, extra);
    }
    fn hup(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
            .unwrap_or_else(|e| panic!("SIGHUP: {e}"));
    }
}

fn write_config(dir: &Path, policy: &str, extra: &str) {
    let text = format!(
        "[daemon]\nstate_dir = {:?}\nlog_level = \"warn\"\n\
         [listen]\nsocket = \"policy.sock\"\n{extra}\n\
         [admin]\nsocket = \"policy-admin.sock\"\n\
         {policy}\n",
        dir.display().to_string()
    );
    std::fs::write(dir.join("policy.toml"), text).unwrap_or_else(|e| panic!("write config: {e}"));
}

fn spawn_in(dir: &Path) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden-policy"));
    cmd.arg("--config")
        .arg(dir.join("policy.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if std::env::var_os("WARDEN_TEST_LOGS").is_none() {
        cmd.stderr(Stdio::null());
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("spawn warden-policy: {e}"))
}

async fn start(policy: &str, listen_extra: &str) -> Policy {
    let dir = tempfile::Builder::new()
        .prefix("wpt")
        .tempdir_in("/tmp")
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    write_config(dir.path(), policy, listen_extra);
    let child = spawn_in(dir.path());
    let mut p = Policy { child, dir };
    wait_healthy(&mut p).await;
    p
}

async fn wait_healthy(p: &mut Policy) {
    let t0 = Instant::now();
    loop {
        if warden_daemon::client::healthy(&p.socket()).await
            && warden_daemon::client::healthy(&p.admin_socket()).await
        {
            return;
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!("warden-policy exited during start: {status}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "warden-policy did not become healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn opt(id: &str, kind: &str) -> pb::PermissionOption {
    pb::PermissionOption {
        id: id.into(),
        name: id.into(),
        kind: kind.into(),
    }
}

fn req(root: &Path, owned: bool, kind: &str, locs: &[&str], context: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("r-{kind}-{context}"),
        subject: Some(pb::Subject {
            principal: "alice".into(),
            context_id: context.into(),
            task_id: "t1".into(),
            session_id: "s1".into(),
            agent: "codex".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: root.display().to_string(),
            owned,
            allow_execute: false,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: "c1".into(),
            kind: kind.into(),
            title: format!("{kind} something"),
            raw_input_json: r#"{"command":["make"]}"#.into(),
            locations: locs
                .iter()
                .map(|p| pb::Location {
                    path: p.to_string(),
                    line: None,
                })
                .collect(),
        }),
        options: vec![
            opt("approved", "allow_once"),
            opt("approved-for-session", "allow_always"),
            opt("abort", "reject_once"),
            opt("denied", "reject_once"),
        ],
        current_mode: "read-only".into(),
        deadline_unix_ms: 0,
        return_escalations: false,
    }
}

/// The audit records a query of the policy's admin API returns.
async fn audit(p: &Policy, q: pb::AuditQueryRequest) -> Vec<pb::AuditRecord> {
    p.admin()
        .audit_query(q)
        .await
        .unwrap_or_else(|e| panic!("audit query: {e}"))
        .into_inner()
        .records
}

/// The audit record(s) of one decision.
async fn audit_of(p: &Policy, decision_id: &str) -> Vec<pb::AuditRecord> {
    audit(
        p,
        pb::AuditQueryRequest {
            decision_id: decision_id.to_string(),
            ..Default::default()
        },
    )
    .await
}

async fn decide(p: &Policy, r: pb::DecideRequest) -> pb::Decision {
    p.policy()
        .decide(r)
        .await
        .unwrap_or_else(|e| panic!("decide: {e}"))
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_kit_passes_against_warden_policy() {
    let p = start("", "").await;
    let fixture = Fixture::new().unwrap_or_else(|e| panic!("fixture: {e}"));
    let violations = check_policy_service(
        warden_daemon::client::unix_channel(&p.socket()),
        &fixture,
        &KitOptions::default(),
    )
    .await;
    assert!(
        violations.is_empty(),
        "contract violations:\n{}",
        violations
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A real implementation answers well within a short deadline: the cut-off check passes
    // only because the answer is a DENY (the kit's empty request), never by waiting.
    assert!(
        check_deadline_cutoff(
            warden_daemon::client::unix_channel(&p.socket()),
            Duration::from_millis(500)
        )
        .await
        .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_implementation_is_cut_off_by_the_callers_deadline() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let sock = dir.path().join("slow.sock");
    let server = serve_on_socket(
        SlowPolicy {
            delay: Duration::from_secs(5),
        },
        &sock,
    )
    .unwrap_or_else(|e| panic!("serve: {e}"));
    let t0 = Instant::now();
    let v = check_deadline_cutoff(
        warden_daemon::client::unix_channel(&sock),
        Duration::from_millis(200),
    )
    .await;
    assert!(v.is_empty(), "{v:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));

    // The check can fail: with a deadline longer than the delay, the late ALLOW arrives and
    // the kit reports that the caller would have used it.
    let quick = dir.path().join("quick.sock");
    let server2 = serve_on_socket(
        SlowPolicy {
            delay: Duration::from_millis(50),
        },
        &quick,
    )
    .unwrap_or_else(|e| panic!("serve: {e}"));
    let v = check_deadline_cutoff(
        warden_daemon::client::unix_channel(&quick),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].check, "deadline");
    server.abort();
    server2.abort();
}

/// `audit.sync = true` (the default): every answered decision is on disk. SIGKILL right after
/// the answers (well inside sled's own 0.5 s flush interval, so only the audit journal can have
/// kept them), then restart on the same state: every answered decision is there, findable by
/// id and in the tail, and new records number on after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_decisions_survive_a_kill_9() {
    let mut p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let mut ids = Vec::new();
    for i in 0..40 {
        let kind = if i % 2 == 0 { "read" } else { "execute" };
        ids.push(
            decide(&p, req(&root, i % 3 == 0, kind, &[], &format!("k{i}")))
                .await
                .decision_id,
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("SIGKILL: {e}"));
    let _ = p.child.wait();
    p.child = spawn_in(p.dir.path());
    wait_healthy(&mut p).await;

    for (i, id) in ids.iter().enumerate() {
        let got = audit_of(&p, id).await;
        assert_eq!(got.len(), 1, "decision {i} ({id}) lost by the crash");
        assert_eq!(
            got[0].subject.as_ref().map(|s| s.context_id.clone()),
            Some(format!("k{i}"))
        );
    }
    let after = decide(&p, req(&root, true, "read", &[], "after")).await;
    let tail = audit(
        &p,
        pb::AuditQueryRequest {
            limit: 41,
            ..Default::default()
        },
    )
    .await;
    let mut expected: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    expected.insert(0, &after.decision_id);
    let got: Vec<&str> = tail.iter().map(|r| r.decision_id.as_str()).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_audited_before_the_answer() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(root.join("src")).unwrap_or_else(|e| panic!("{e}"));
    let allow = decide(&p, req(&root, true, "execute", &[], "ctx-a")).await;
    assert_eq!(allow.verdict, pb::Verdict::Allow as i32, "{allow:?}");
    assert_eq!(allow.option_id.as_deref(), Some("approved"));
    let deny = decide(&p, req(&root, true, "edit", &["../elsewhere"], "ctx-b")).await;
    assert_eq!(deny.verdict, pb::Verdict::Deny as i32);
    assert_eq!(deny.rule, "floor.change.outside-root");
    // Codex's turn-keeping refusal is named over the turn-ending one.
    assert_eq!(deny.option_id.as_deref(), Some("denied"));

    let mut admin = p.admin();
    let got = audit_of(&p, &allow.decision_id).await;
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.request_id, "r-execute-ctx-a");
    assert_eq!(r.verdict, pb::Verdict::Allow as i32);
    assert_eq!(r.rule, allow.rule);
    assert_eq!(r.reason, allow.reason);
    assert_eq!(r.option_id.as_deref(), Some("approved"));
    assert_eq!(r.tool_kind, "execute");
    assert_eq!(r.policy_version, 1);
    assert_eq!(
        r.raw_input_sha256,
        hex::encode(Sha256::digest(br#"{"command":["make"]}"#))
    );
    assert!(r.decided_at_unix_ms > 0);

    let tail = audit(&p, pb::AuditQueryRequest::default()).await;
    let ids: Vec<&str> = tail.iter().map(|r| r.decision_id.as_str()).collect();
    assert_eq!(
        ids,
        vec![deny.decision_id.as_str(), allow.decision_id.as_str()]
    );
    let by_ctx = audit(
        &p,
        pb::AuditQueryRequest {
            context_id: "ctx-b".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_ctx.len(), 1);
    assert_eq!(by_ctx[0].decision_id, deny.decision_id);

    let status = admin
        .status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert_eq!(status.daemon, "warden-policy");
    assert_eq!(
        status.details.get("policy_version").map(String::as_str),
        Some("1")
    );
    assert_eq!(status.listeners.len(), 2);
}

/// Asks the daemon to reload through the admin API.
async fn reload(p: &Policy) -> pb::ReloadResponse {
    p.admin()
        .reload(pb::ReloadRequest {})
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
}

async fn reload_attempts(p: &Policy) -> u64 {
    p.admin()
        .status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .details
        .get("reload_attempts")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_is_atomic_and_a_bad_file_changes_nothing() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let exec = || req(&root, true, "execute", &[], "c");
    assert_eq!(decide(&p, exec()).await.verdict, pb::Verdict::Allow as i32);

    // SIGHUP with a stricter policy.
    p.write_config("[policy.global]\nmode = \"deny-all\"\n", "");
    p.hup();
    let t0 = Instant::now();
    loop {
        let d = decide(&p, exec()).await;
        if d.rule == "mode.deny-all" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "SIGHUP did not reload: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A broken file through the admin API: rejected with the key and the file, version stays.
    p.write_config("[policy.global]\nmode = \"approve-everything\"\n", "");
    let r = reload(&p).await;
    assert!(!r.reloaded);
    assert_eq!(r.policy_version, 2);
    assert!(r.error.contains("policy.global.mode"), "{}", r.error);
    assert!(r.error.contains("policy.toml"), "{}", r.error);
    assert_eq!(decide(&p, exec()).await.rule, "mode.deny-all");

    // A broken file through SIGHUP: same. The reload is seen to happen (Status counts attempts
    // and names the last refusal), so this fails if the signal was never acted on.
    let attempts = reload_attempts(&p).await;
    p.write_config("[policy.global]\nauto_deny = [\"\"]\n", "");
    p.hup();
    let t0 = Instant::now();
    while reload_attempts(&p).await == attempts {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "SIGHUP with a broken file was never acted on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = p
        .admin()
        .status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let last = status
        .details
        .get("last_reload_error")
        .cloned()
        .unwrap_or_default();
    assert!(
        last.contains("auto_deny"),
        "the refusal names the key: {last:?}"
    );
    assert_eq!(
        status.details.get("policy_version").map(String::as_str),
        Some("2")
    );
    assert_eq!(decide(&p, exec()).await.rule, "mode.deny-all");
    // An unknown key is also a broken file.
    p.write_config("[policy.global]\nauto_aprove = [\"execute\"]\n", "");
    let r = reload(&p).await;
    assert!(!r.reloaded && r.error.contains("auto_aprove"), "{r:?}");

    // A good file through the admin API.
    p.write_config(
        "[policy.global]\nmode = \"approve-reads\"\nnon_interactive = \"fail\"\n",
        "",
    );
    let r = reload(&p).await;
    assert!(r.reloaded, "{r:?}");
    assert_eq!(r.policy_version, 3);
    let d = decide(&p, exec()).await;
    assert_eq!(d.rule, "escalation.prompt-unavailable");
    assert!(d.end_turn);
    assert_eq!(
        d.end_turn_reason(),
        pb::EndTurnReason::PermissionPromptUnavailable,
        "the end of the turn is typed, not only spelled in the reason"
    );
    assert!(d.reason.starts_with("PERMISSION_PROMPT_UNAVAILABLE"));
    let recs = audit_of(&p, &d.decision_id).await;
    assert_eq!(recs.first().map(|r| r.policy_version), Some(3));
}

/// An approver chaining to the policy asks for escalations in the request itself, so the policy's
/// configuration does not change when an approver is swapped in; without the request field (the
/// supervisor) an escalation is still the refusal `non_interactive` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_can_ask_a_person_gets_escalate_without_any_policy_setting() {
    let p = start(
        "[policy.global]\nmode = \"approve-reads\"\nnon_interactive = \"fail\"\n",
        "",
    )
    .await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let exec = |ask: bool| pb::DecideRequest {
        request_id: format!("r-exec-{ask}"),
        return_escalations: ask,
        ..req(&root, true, "execute", &[], "esc")
    };
    let supervisor = decide(&p, exec(false)).await;
    assert_eq!(
        supervisor.verdict,
        pb::Verdict::Deny as i32,
        "{supervisor:?}"
    );
    assert_eq!(supervisor.rule, "escalation.prompt-unavailable");
    let approver = decide(&p, exec(true)).await;
    assert_eq!(
        approver.verdict,
        pb::Verdict::Escalate as i32,
        "{approver:?}"
    );
    assert!(!approver.end_turn, "{approver:?}");
    // The floor is not loosened by asking: an edit outside the root is still refused outright.
    let outside = pb::DecideRequest {
        return_escalations: true,
        ..req(&root, true, "edit", &["/etc/passwd"], "esc")
    };
    assert_eq!(decide(&p, outside).await.verdict, pb::Verdict::Deny as i32);
    // The audit says what was answered.
    let recs = audit_of(&p, &approver.decision_id).await;
    assert_eq!(
        recs.first().map(|r| r.verdict),
        Some(pb::Verdict::Escalate as i32)
    );
    // The rules answer at once: the description asks a caller for no extra time.
    let d = p
        .policy()
        .describe(pb::DescribeRequest {})
        .await
        .unwrap_or_else(|e| panic!("describe: {e}"))
        .into_inner();
    assert_eq!(d.decide_deadline_ms, 0);
    assert_eq!(d.implementation, "warden-policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_denied_with_a_reason() {
    let p = start("[decide]\nmax_raw_input_bytes = 1024\n", "").await;
    let root = p.dir.path().to_path_buf();
    // Each case: what is wrong with an otherwise good read request, and the rule that names it.
    type Break = fn(&mut pb::DecideRequest);
    let cases: [(Break, &str); 8] = [
        (|r| r.tool_call = None, "request.malformed.no-tool-call"),
        (|r| r.boundary = None, "request.malformed.no-boundary"),
        (
            |r| {
                if let Some(b) = r.boundary.as_mut() {
                    b.profile = 42;
                }
            },
            "request.malformed.profile",
        ),
        (
            |r| {
                if let Some(t) = r.tool_call.as_mut() {
                    t.raw_input_json = "x".repeat(1025);
                }
            },
            "request.malformed.raw-input-too-large",
        ),
        (
            |r| r.options.push(opt("approved", "allow_once")),
            "request.malformed.option-id",
        ),
        (
            |r| {
                r.options = (0..40)
                    .map(|i| opt(&format!("o{i}"), "allow_once"))
                    .collect();
            },
            "request.malformed.too-many-options",
        ),
        (
            |r| {
                if let Some(t) = r.tool_call.as_mut() {
                    t.raw_input_json = format!("{}{}", "[".repeat(65), "]".repeat(65));
                }
            },
            "request.malformed.too-deeply-nested",
        ),
        (
            |r| {
                if let Some(t) = r.tool_call.as_mut() {
                    t.title = "t".repeat(65 * 1024 + 1);
                }
            },
            "request.malformed.title-too-large",
        ),
    ];
    for (break_it, rule) in cases {
        let mut r = req(&root, true, "read", &[], "m");
        break_it(&mut r);
        let d = decide(&p, r).await;
        assert_eq!(d.verdict, pb::Verdict::Deny as i32, "{rule}");
        assert_eq!(d.rule, rule);
        assert!(d.reason.starts_with("malformed request: "), "{}", d.reason);
    }
    // The daemon is still serving, and a good request within the limit is decided on merit.
    let d = decide(&p, req(&root, true, "read", &[], "m")).await;
    assert_eq!(d.verdict, pb::Verdict::Allow as i32);
    // The limits in force are stated, so a caller refuses a request over them itself.
    let desc = p
        .policy()
        .describe(pb::DescribeRequest {})
        .await
        .unwrap_or_else(|e| panic!("describe: {e}"))
        .into_inner();
    assert_eq!(
        (
            desc.max_raw_input_bytes,
            desc.max_locations,
            desc.max_options,
            desc.max_title_bytes,
            desc.max_json_depth
        ),
        (1024, 256, 32, 65536, 64)
    );
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A request that reaches the policy after its caller's deadline (it waited in a socket while the
/// policy was paused, say) is not ALLOWed on the record: the audit says DENY deadline_exceeded,
/// which is what the caller enforced. One still within its deadline is decided on merit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_past_the_callers_deadline_is_recorded_and_answered_as_deny() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let mut late = req(&root, true, "read", &[], "late");
    late.deadline_unix_ms = unix_ms().saturating_sub(50);
    let d = decide(&p, late).await;
    assert_eq!(d.verdict, pb::Verdict::Deny as i32, "{d:?}");
    assert_eq!(d.rule, "deadline_exceeded");
    assert!(d.reason.contains("deadline"), "{}", d.reason);
    let recs = audit_of(&p, &d.decision_id).await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].verdict, pb::Verdict::Deny as i32);
    assert_eq!(recs[0].rule, "deadline_exceeded");

    let mut in_time = req(&root, true, "read", &[], "in-time");
    in_time.deadline_unix_ms = unix_ms() + 10_000;
    assert_eq!(decide(&p, in_time).await.verdict, pb::Verdict::Allow as i32);
}

/// `Withdraw`: a caller that did not act on a decision says so, and the audit follows what was
/// enforced — a recorded ALLOW is superseded by a DENY "withdrawn" record (once), and a request
/// withdrawn before it arrived is decided DENY "withdrawn".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_decision_is_superseded_on_the_record() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let allowed = req(&root, true, "read", &[], "w1");
    let d = decide(&p, allowed.clone()).await;
    assert_eq!(d.verdict, pb::Verdict::Allow as i32);
    let w = |request_id: &str| pb::WithdrawRequest {
        request_id: request_id.into(),
        reason: "no answer within 200 ms".into(),
        subject: allowed.subject.clone(),
    };
    let r = p
        .policy()
        .withdraw(w(&allowed.request_id))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert!(r.superseded);
    assert_eq!(r.decision_id, d.decision_id);
    // Idempotent: nothing left to supersede.
    let again = p
        .policy()
        .withdraw(w(&allowed.request_id))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert!(!again.superseded);
    let ctx = allowed
        .subject
        .as_ref()
        .map(|s| s.context_id.clone())
        .unwrap_or_default();
    let recs = audit(
        &p,
        pb::AuditQueryRequest {
            context_id: ctx,
            ..Default::default()
        },
    )
    .await;
    let superseding: Vec<_> = recs
        .iter()
        .filter(|r| r.supersedes_decision_id == d.decision_id)
        .collect();
    assert_eq!(superseding.len(), 1, "{recs:#?}");
    assert_eq!(superseding[0].verdict, pb::Verdict::Deny as i32);
    assert_eq!(superseding[0].rule, "withdrawn");

    // Withdrawn before it arrived: decided DENY when it does.
    let mut early = req(&root, true, "read", &[], "w2");
    early.request_id = "withdrawn-early".into();
    p.policy()
        .withdraw(w("withdrawn-early"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let d = decide(&p, early).await;
    assert_eq!(d.verdict, pb::Verdict::Deny as i32);
    assert_eq!(d.rule, "withdrawn");
    // A withdrawal names its request.
    let bad = p.policy().withdraw(w("")).await;
    assert_eq!(
        bad.map(|_| ()).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

/// Runs the bench binary's `probe` as uid/gid 65534 against `socket`; returns its output line.
fn probe_as_nobody(socket: &Path) -> String {
    use std::os::unix::process::CommandExt;
    let out = Command::new(env!("CARGO_BIN_EXE_warden-policy-bench"))
        .arg("probe")
        .arg(socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap_or_else(|e| panic!("probe: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_peers_may_call_decide() {
    if !nix::unistd::getuid().is_root() {
        println!("skipped: needs root to run a probe under a second uid (setuid)");
        return;
    }
    // The socket is world-connectable so the kernel lets the other uid in; the allowlist
    // (empty = this daemon's own uid) must refuse it.
    let p = start("", "mode = \"0666\"\n").await;
    std::fs::set_permissions(
        p.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let refused = probe_as_nobody(&p.socket());
    assert!(refused.starts_with("error=PermissionDenied"), "{refused}");
    // Our own uid is allowed.
    let d = decide(&p, req(p.dir.path(), true, "read", &[], "peer")).await;
    assert_eq!(d.verdict, pb::Verdict::Allow as i32);
    drop(p);

    // With uid 65534 on the allowlist (next to ours, so the test can still check health),
    // the same probe is answered.
    let me = nix::unistd::getuid().as_raw();
    let p = start(
        "",
        &format!("mode = \"0666\"\nallow_uids = [{me}, 65534]\n"),
    )
    .await;
    std::fs::set_permissions(
        p.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ok = probe_as_nobody(&p.socket());
    assert!(ok.starts_with("verdict="), "{ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_during_reloads_each_see_one_whole_policy_version() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for c in 0..4 {
        let mut client = p.policy();
        let (root, stop) = (root.clone(), stop.clone());
        callers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = client
                    .decide(req(&root, true, "execute", &[], &format!("c{c}")))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .into_inner();
                seen.push(d);
            }
            seen
        }));
    }
    // Odd versions approve everything, even versions deny everything.
    for v in 2..=12u64 {
        let policy = if v % 2 == 0 {
            "[policy.global]\nmode = \"deny-all\"\n"
        } else {
            "[policy.global]\nmode = \"approve-all\"\n"
        };
        p.write_config(policy, "");
        let r = reload(&p).await;
        assert_eq!((r.reloaded, r.policy_version), (true, v), "{r:?}");
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut decisions = Vec::new();
    for c in callers {
        decisions.extend(c.await.unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(decisions.len() > 20, "only {} decisions", decisions.len());
    let mut versions = std::collections::BTreeSet::new();
    for d in &decisions {
        let rec = audit_of(&p, &d.decision_id).await;
        let v = rec
            .first()
            .map(|r| r.policy_version)
            .unwrap_or_else(|| panic!("no audit record for {}", d.decision_id));
        versions.insert(v);
        let denied_by_mode = d.rule == "mode.deny-all";
        assert_eq!(denied_by_mode, v % 2 == 0, "version {v} decided {d:?}");
    }
    assert!(
        versions.len() > 3,
        "reloads were not interleaved: {versions:?}"
    );
}

/// `DecideStream`: many requests on one stream, each answered once, with its own request id,
/// exactly as `Decide` answers it, and audited like it; a request past its deadline is a DENY
/// `deadline_exceeded` there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_stream_answers_each_request_with_its_own_id_as_decide_does() {
    let p = start("", "").await;
    let root = p.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let ask = |i: usize| {
        let mut r = if i.is_multiple_of(2) {
            req(&root, true, "execute", &[], "ctx-s")
        } else {
            req(&root, true, "edit", &["../elsewhere"], "ctx-s")
        };
        r.request_id = format!("s-{i}");
        if i == 7 {
            r.deadline_unix_ms = 1;
        }
        r
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut answers = p
        .policy()
        .decide_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap_or_else(|e| panic!("decide_stream: {e}"))
        .into_inner();
    for i in 0..40 {
        tx.send(ask(i)).unwrap_or_else(|e| panic!("send: {e}"));
    }
    drop(tx);
    let mut got = std::collections::HashMap::new();
    while let Some(d) = answers
        .message()
        .await
        .unwrap_or_else(|e| panic!("stream: {e}"))
    {
        assert!(
            got.insert(d.request_id.clone(), d).is_none(),
            "answered twice"
        );
    }
    assert_eq!(
        got.len(),
        40,
        "every request answered, then the stream ends"
    );
    for i in 0..40 {
        let d = &got[&format!("s-{i}")];
        if i == 7 {
            assert_eq!(d.verdict, pb::Verdict::Deny as i32);
            assert_eq!(d.rule, "deadline_exceeded");
            continue;
        }
        let unary = decide(&p, ask(i)).await;
        assert_eq!(
            (d.verdict, &d.rule, &d.option_id),
            (unary.verdict, &unary.rule, &unary.option_id),
            "request {i}"
        );
        let want = if i.is_multiple_of(2) {
            pb::Verdict::Allow
        } else {
            pb::Verdict::Deny
        };
        assert_eq!(d.verdict, want as i32, "request {i}: {d:?}");
        let records = audit_of(&p, &d.decision_id).await;
        assert_eq!(records.len(), 1, "request {i} audited");
        assert_eq!(records[0].request_id, format!("s-{i}"));
    }
}
