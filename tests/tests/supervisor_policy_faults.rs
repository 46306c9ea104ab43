//! Supervisor end to end against a misbehaving PolicyService: a policy that answers too late,
//! names an option that was not offered, answers without a reason, or ALLOWs without naming the
//! digest of the action asked about (or naming another's). Each is a DENY with reason
//! `policy_unavailable` (fail closed), and the agent still gets an id it offered. A policy that
//! answers ESCALATE is refused (the supervisor asks no person); one that describes a longer
//! deadline is waited for, but never beyond `MAX_DECIDE_DEADLINE_MS`.
//!
//! The misbehaving policies are real gRPC servers implementing the contract badly, on a Unix
//! socket, as an operator's third implementation could.

mod supervisor_support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use tonic::{Request, Response, Status};
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_server::{PolicyService, PolicyServiceServer};

#[derive(Clone, Copy)]
enum Bad {
    Slow,
    UnofferedOption,
    NoReason,
    /// Answers ESCALATE to everything (as warden-policy would to a caller asking for escalations).
    Escalate,
    /// Describes 1500 ms and answers ALLOW after 1000 ms: longer than the supervisor's 200 ms.
    Patient,
    /// Describes ten hours (and eleven for one agent), far beyond the contract's cap.
    Greedy,
    /// ALLOWs without naming the action it judged.
    NoDigest,
    /// ALLOWs naming the digest of another action (a different command).
    OtherDigest,
}

struct BadPolicy(Bad);

#[tonic::async_trait]
impl PolicyService for BadPolicy {
    async fn decide(
        &self,
        req: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        let ok = pb::Decision {
            decision_id: format!("bad-{}", req.get_ref().request_id),
            verdict: pb::Verdict::Allow as i32,
            option_id: None,
            reason: "allowed".into(),
            rule: "bad.rule".into(),
            end_turn: false,
            end_turn_reason: 0,
            request_id: String::new(),
            action_digest: warden_decide::convert::judged(req.get_ref()).digest,
        };
        Ok(Response::new(match self.0 {
            Bad::Slow => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                ok
            }
            Bad::UnofferedOption => pb::Decision {
                option_id: Some("allow-with-updates-invented".into()),
                ..ok
            },
            Bad::NoReason => pb::Decision {
                reason: String::new(),
                ..ok
            },
            Bad::Escalate => pb::Decision {
                verdict: pb::Verdict::Escalate as i32,
                reason: "a person must decide".into(),
                ..ok
            },
            Bad::Patient => {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                ok
            }
            Bad::Greedy => ok,
            Bad::NoDigest => pb::Decision {
                action_digest: String::new(),
                ..ok
            },
            Bad::OtherDigest => {
                let mut other = req.get_ref().clone();
                if let Some(t) = other.tool_call.as_mut() {
                    t.raw_input_json = r#"{"command":"true"}"#.into();
                }
                pb::Decision {
                    action_digest: warden_decide::convert::judged(&other).digest,
                    ..ok
                }
            }
        }))
    }

    async fn describe(
        &self,
        _req: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::PolicyDescription>, Status> {
        let (ms, agents) = match self.0 {
            Bad::Patient => (1500, vec![]),
            Bad::Greedy => (36_000_000, vec![("scripted".to_string(), 39_600_000)]),
            _ => return Err(Status::unimplemented("describes nothing")),
        };
        Ok(Response::new(pb::PolicyDescription {
            decide_deadline_ms: ms,
            agent_decide_deadline_ms: agents.into_iter().collect(),
            implementation: "bad-policy".into(),
            ..Default::default()
        }))
    }

    async fn withdraw(
        &self,
        _req: Request<pb::WithdrawRequest>,
    ) -> Result<Response<pb::WithdrawResponse>, Status> {
        Err(Status::unimplemented("a bad policy keeps no audit"))
    }

    type DecideStreamStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Decision, Status>> + Send>>;

    /// Decide only: the supervisor falls back to it on UNIMPLEMENTED.
    async fn decide_stream(
        &self,
        _req: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStreamStream>, Status> {
        Err(Status::unimplemented("a bad policy has no stream"))
    }
}

async fn serve_bad(bad: Bad, name: &str) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let dir = parent().join(format!("bad-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("p.sock");
    let _ = std::fs::remove_file(&sock);
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    let h = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PolicyServiceServer::new(BadPolicy(bad)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
            .await;
    });
    (sock, h)
}

#[tokio::test(flavor = "multi_thread")]
async fn late_invented_or_reasonless_decisions_fail_closed() {
    for (bad, name) in [
        (Bad::Slow, "slow"),
        (Bad::UnofferedOption, "invented"),
        (Bad::NoReason, "noreason"),
        (Bad::NoDigest, "nodigest"),
        (Bad::OtherDigest, "otherdigest"),
    ] {
        let (sock, h) = serve_bad(bad, name).await;
        let d = deploy_without_policy(&[(
            "supervisor",
            &format!("policy.socket=\"{}\"", sock.display()),
        )])
        .await;
        let mut c = client(&d);
        let text = scenario(json!({"report": "perm.jsonl",
            "steps": [{"type": "tool", "kind": "execute", "command": "echo ran > ran.txt"}]}));
        let evs = run(&mut c, turn(name, "t1", &text)).await;
        let s = stop(&evs);
        assert_eq!(s.refusals.len(), 1, "{name}: {evs:#?}");
        assert_eq!(s.refusals[0].rule, "policy_unavailable", "{name}");
        let p = &permissions(&evs)[0];
        assert_eq!(p.verdict, pb::Verdict::Deny as i32, "{name}");
        assert_eq!(p.option_id_sent, "reject", "{name}");
        if let Bad::Slow = bad {
            assert!(
                p.policy_latency_micros < 1_000_000,
                "the 200 ms deadline held: {p:?}"
            );
        }
        let info = c
            .open_conversation(open(name, pb::Profile::WorkspaceWrite))
            .await
            .unwrap()
            .into_inner();
        assert!(
            !PathBuf::from(info.root).join("ran.txt").exists(),
            "{name}: ran"
        );
        let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
        assert_eq!(st.details["policy_failures"], "1", "{name}: counted");
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_the_supervisor_cannot_put_to_a_person_is_a_refusal() {
    let (sock, h) = serve_bad(Bad::Escalate, "escalate").await;
    let d = deploy_without_policy(&[(
        "supervisor",
        &format!("policy.socket=\"{}\"", sock.display()),
    )])
    .await;
    let mut c = client(&d);
    let text = scenario(json!({"report": "perm.jsonl",
        "steps": [{"type": "tool", "kind": "execute", "command": "echo ran > ran.txt"}]}));
    let evs = run(&mut c, turn("esc", "t1", &text)).await;
    let p = &permissions(&evs)[0];
    assert_eq!(
        p.verdict,
        pb::Verdict::Escalate as i32,
        "reported as it was: {p:?}"
    );
    assert_eq!(
        p.option_id_sent, "reject",
        "but enforced as a refusal: {p:?}"
    );
    assert_eq!(stop(&evs).refusals.len(), 1, "{evs:#?}");
    let info = c
        .open_conversation(open("esc", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert!(!PathBuf::from(info.root).join("ran.txt").exists(), "ran");
    h.abort();
}

/// The swap is one line: pointed at a service that describes a longer deadline (an approver),
/// the supervisor waits that long without its own `decide_deadline_ms` being raised; a service
/// asking for more than the contract's cap gets the cap.
#[tokio::test(flavor = "multi_thread")]
async fn the_supervisor_waits_as_long_as_the_service_describes_up_to_the_cap() {
    let (sock, h) = serve_bad(Bad::Patient, "patient").await;
    let d = deploy_without_policy(&[(
        "supervisor",
        &format!("policy.socket=\"{}\"", sock.display()),
    )])
    .await;
    let mut c = client(&d);
    let text = scenario(json!({"report": "perm.jsonl",
        "steps": [{"type": "tool", "kind": "execute", "command": "echo ran > ran.txt"}]}));
    let evs = run(&mut c, turn("patient", "t1", &text)).await;
    let p = &permissions(&evs)[0];
    assert_eq!(
        p.verdict,
        pb::Verdict::Allow as i32,
        "waited 1 s > 200 ms: {p:?}"
    );
    assert!(p.policy_latency_micros >= 1_000_000, "{p:?}");
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.details["decide_deadline_ms.own"], "200");
    assert_eq!(st.details["decide_deadline_ms.described"], "1500");
    assert_eq!(st.details["decide_deadline_ms.effective"], "1500");
    assert_eq!(st.details["policy_implementation"], "bad-policy");
    h.abort();

    let (sock, h) = serve_bad(Bad::Greedy, "greedy").await;
    let d = deploy_without_policy(&[(
        "supervisor",
        &format!("policy.socket=\"{}\"", sock.display()),
    )])
    .await;
    let mut c = client(&d);
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let cap = warden_proto::limits::MAX_DECIDE_DEADLINE_MS.to_string();
    assert_eq!(st.details["decide_deadline_ms.described"], cap, "{st:?}");
    assert_eq!(st.details["decide_deadline_ms.effective"], cap, "{st:?}");
    assert_eq!(
        st.details["decide_deadline_ms.effective.scripted"], cap,
        "{st:?}"
    );
    h.abort();
}

/// The long-running-service issue's finding 4: when the policy answers after the deadline, the
/// supervisor denies, and the audit must say so too. The real warden-policy is paused (SIGSTOP)
/// and resumed over and over while an agent asks for 80 edits; requests pile up in its socket
/// while it is stopped. Afterwards every audit record of the conversation must agree with what
/// the supervisor enforced: 0 records that ALLOW what was denied.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_agrees_with_what_was_enforced_when_the_policy_is_late() {
    let mut d = deploy(&[
        ("supervisor", "policy.decide_deadline_ms=100"),
        ("supervisor", "policy.answer_grace_ms=300"),
    ])
    .await;
    let policy_pid = nix::unistd::Pid::from_raw(
        d.daemon("policy")
            .and_then(|p| p.child.id())
            .expect("policy pid") as i32,
    );
    let mut c = client(&d);
    let steps: Vec<_> = (0..80)
        .map(|i| {
            json!({"type": "tool", "kind": "edit", "path": format!("f{i}.txt"), "content": "x",
                   "ask": true})
        })
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pauser = {
        let done = done.clone();
        tokio::spawn(async move {
            use nix::sys::signal::{Signal, kill};
            let mut i = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let _ = kill(policy_pid, Signal::SIGSTOP);
                // Vary the pause around the deadline + grace so answers land on both sides.
                tokio::time::sleep(Duration::from_millis(60 + (i * 37) % 400)).await;
                let _ = kill(policy_pid, Signal::SIGCONT);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            let _ = kill(policy_pid, Signal::SIGCONT);
        })
    };
    let mut s = start(
        &mut c,
        turn("late", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let evs = collect(&mut s, Duration::from_secs(180)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    pauser.await.unwrap();

    let perms = permissions(&evs);
    assert_eq!(perms.len(), 80, "every edit was asked about");
    // Requests still queued in the policy's socket, and the supervisor's withdrawals of the
    // decisions it gave up on, land shortly after the turn: poll until the record agrees (or
    // the deadline shows it never will).
    let enforced: std::collections::HashMap<&str, i32> = perms
        .iter()
        .map(|p| (p.decision_id.as_str(), p.verdict))
        .collect();
    let ch = warden_daemon::client::unix_channel(&d.layout.policy_admin_socket());
    let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
    let mut audit = Vec::new();
    let mut mismatches = Vec::new();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        audit = admin
            .audit_query(pb::AuditQueryRequest {
                limit: 1000,
                decision_id: String::new(),
                context_id: "late".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .records;
        let superseded: std::collections::HashSet<&str> = audit
            .iter()
            .filter(|r| !r.supersedes_decision_id.is_empty())
            .map(|r| r.supersedes_decision_id.as_str())
            .collect();
        // An ALLOW on the record that the supervisor did not enforce as ALLOW, and that no
        // later record of the same request supersedes.
        mismatches = audit
            .iter()
            .filter(|r| r.verdict == pb::Verdict::Allow as i32)
            .filter(|r| enforced.get(r.decision_id.as_str()) != Some(&(pb::Verdict::Allow as i32)))
            .filter(|r| !superseded.contains(r.decision_id.as_str()))
            .cloned()
            .collect();
        if mismatches.is_empty() && audit.len() >= 80 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let allowed = perms
        .iter()
        .filter(|p| p.verdict == pb::Verdict::Allow as i32)
        .count();
    let late = audit
        .iter()
        .filter(|r| r.rule == "deadline_exceeded")
        .count();
    let failed_closed = perms
        .iter()
        .filter(|p| p.rule == "policy_unavailable")
        .count();
    let withdrawn = audit.iter().filter(|r| r.rule == "withdrawn").count();
    eprintln!(
        "80 permissions: {allowed} allowed; audit: {} records, {late} deadline_exceeded, \
         {withdrawn} withdrawn; {failed_closed} failed closed in the supervisor",
        audit.len()
    );
    assert!(
        mismatches.is_empty(),
        "audit records that ALLOW what was not enforced as ALLOW: {mismatches:#?}"
    );
    assert!(
        allowed < 80 && allowed > 0,
        "the pauses never made a decision late ({allowed} of 80 allowed)"
    );
}

/// Every permission of a supervisor goes over one `DecideStream` to warden-policy. When the
/// policy is killed and started again, the permissions asked meanwhile wait (UNAVAILABLE is
/// retried within the deadline) and are decided by the new process over a new stream; none is
/// lost, none is answered twice, each answer is its own request's.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_killed_and_restarted_mid_turn_decides_every_permission_over_a_new_stream() {
    let mut d = deploy(&[("supervisor", "policy.decide_deadline_ms=10000")]).await;
    let mut c = client(&d);
    // Half the edits inside the root (ALLOW), half outside it (DENY): a mixed-up answer shows.
    let steps: Vec<_> = (0..60)
        .map(|i| {
            let path = if i % 2 == 0 {
                format!("in{i}.txt")
            } else {
                format!("/etc/out{i}.txt")
            };
            json!({"type": "tool", "kind": "edit", "path": path, "content": "x", "ask": true})
        })
        .collect();
    let mut s = start(
        &mut c,
        turn("restart", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    // Let some permissions be decided, then kill the policy and start it again.
    let mut first = Vec::new();
    while permissions(&first).len() < 10 {
        match tokio::time::timeout(Duration::from_secs(30), s.message()).await {
            Ok(Ok(Some(ev))) => first.push(ev),
            other => panic!("the turn stopped early: {other:?}"),
        }
    }
    let policy = d.take("policy").expect("the policy daemon");
    policy.crash().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.start("policy").await;
    let mut evs = first;
    evs.extend(collect(&mut s, Duration::from_secs(120)).await);
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 60, "every edit was asked about once");
    let by_title: Vec<(String, i32, String)> = perms
        .iter()
        .map(|p| (p.tool_title.clone(), p.verdict, p.rule.clone()))
        .collect();
    let unavailable = perms
        .iter()
        .filter(|p| p.rule == "policy_unavailable")
        .count();
    assert_eq!(unavailable, 0, "none failed closed: {by_title:#?}");
    for (title, verdict, rule) in &by_title {
        let outside = title.contains("/etc/out");
        let want = if outside {
            pb::Verdict::Deny
        } else {
            pb::Verdict::Allow
        };
        assert_eq!(*verdict, want as i32, "{title}: {rule}");
    }
    let ids: std::collections::HashSet<&str> =
        perms.iter().map(|p| p.decision_id.as_str()).collect();
    assert_eq!(ids.len(), 60, "each permission has its own decision");
}
