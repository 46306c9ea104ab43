//! The durable state on PostgreSQL, end to end: real daemons (`warden-policy` replicas,
//! `warden-supervisor` with its scripted agent, `warden-approver` replicas) on one real
//! PostgreSQL cluster started by the test (initdb into a temporary directory, a Unix socket
//! only). Issue 27's cases:
//!
//! - the approver with its database down: an escalation denied at once (approval.unavailable),
//!   approvals working again once it is back;
//! - two policy replicas, the one in use killed with SIGKILL during a burst of 1,000 decisions:
//!   every decision the agent was answered has its audit row, none was answered twice, and the
//!   burst finishes through the other replica (the supervisor's `policy.failover_sockets`);
//! - PostgreSQL stopped for 10 s mid-run: decisions fail closed (DENY `audit.unavailable`,
//!   counted by the policy as not audited), none waits past its deadline, and decisions are
//!   allowed again once the database is back, without restarting anything;
//! - two approvers answering the same escalation at once: exactly one answer takes effect, the
//!   other is told which one stands, and the waiting caller (on either) gets that one;
//! - `--check-config` says whether the database is reachable and migrated.

mod supervisor_support;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use supervisor_support::*;
use warden_e2e::{Deployment, Options, binary};
use warden_pgstate::cluster::TestCluster;
use warden_proto::v1 as pb;

/// A cluster with database `warden`, or `None` (printed SKIP) outside CI without PostgreSQL.
fn cluster() -> Option<TestCluster> {
    let c = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}"))?;
    c.create_db("warden")
        .unwrap_or_else(|e| panic!("createdb: {e}"));
    Some(c)
}

fn toml_str(s: &str) -> String {
    format!("{s:?}")
}

/// Sets that put a daemon's state in the cluster.
fn pg_sets(daemon: &str, c: &TestCluster) -> Vec<(String, String)> {
    vec![
        (daemon.into(), "store.backend=\"postgres\"".into()),
        (
            daemon.into(),
            format!("store.url={}", toml_str(&c.url("warden"))),
        ),
        (daemon.into(), "store.connect_timeout_ms=1000".into()),
    ]
}

/// A deployment whose approver keeps its queue in `c`, the policy and the approver started (a
/// person's time: the supervisor waits up to 60 s for a decision).
async fn with_approver_on(c: &TestCluster) -> Deployment {
    let mut sets = pg_sets("approver", c);
    sets.push((
        "supervisor".into(),
        "policy.decide_deadline_ms=60000".into(),
    ));
    let mut d = Deployment::new(Options {
        approver: true,
        sets,
        ..Default::default()
    });
    d.start("policy").await;
    d.start("approver").await;
    d
}

async fn status_of(admin: &Path) -> HashMap<String, String> {
    let ch = warden_daemon::client::unix_channel(admin);
    let mut c = pb::admin_service_client::AdminServiceClient::new(ch);
    c.status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("status of {}: {e}", admin.display()))
        .into_inner()
        .details
}

/// Every row of the shared audit: decision id → request id.
async fn audit_rows(c: &TestCluster) -> Vec<(String, String, i32)> {
    use prost::Message;
    let pg =
        warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(c.url("warden"))).unwrap();
    let rows = pg
        .client()
        .await
        .unwrap()
        .query(
            "SELECT decision_id, request_id, record FROM policy_audit",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let rec = pb::AuditRecord::decode(r.get::<_, &[u8]>(2)).unwrap();
            (r.get(0), r.get(1), rec.verdict)
        })
        .collect()
}

/// The agent's own count of its floods' answers: (answered, errors).
fn flood_results(evs: &[pb::TurnEvent]) -> (u64, u64) {
    let said = text(evs);
    let mut ok = 0;
    let mut errors = 0;
    for line in said.lines() {
        if let Some(r) = line.strip_prefix("flood-result: ") {
            let v: serde_json::Value =
                serde_json::from_str(r.trim()).unwrap_or_else(|e| panic!("{r}: {e}"));
            ok += v["ok"].as_u64().unwrap_or(0);
            errors += v["errors"].as_u64().unwrap_or(0);
        }
    }
    (ok, errors)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_replica_killed_mid_burst_loses_no_acknowledged_decision() {
    let Some(c) = cluster() else { return };
    let mut sets = pg_sets("policy", &c);
    let mut d = Deployment::new(Options {
        sets: sets.clone(),
        ..Default::default()
    });
    d.start("policy").await;
    let (mut b, b_socket, b_admin) = d.replica("policy", "policy-b").await;
    sets.extend([
        (
            "supervisor".to_string(),
            format!(
                "policy.failover_sockets=[{}]",
                toml_str(&b_socket.display().to_string())
            ),
        ),
        (
            "supervisor".into(),
            "policy.decide_deadline_ms=10000".into(),
        ),
        (
            "supervisor".into(),
            "limits.permissions_per_turn=5000".into(),
        ),
    ]);
    d.opts.sets = sets;
    d.start("supervisor").await;
    let mut client = client(&d);

    // Twenty waves of fifty at once (an agent has at most 64 requests handled at a time).
    const BURST: usize = 1000;
    let steps: Vec<_> = (0..BURST / 50)
        .map(|_| json!({"type": "flood", "method": "session/request_permission", "count": 50}))
        .collect();
    let started = Instant::now();
    let mut s = start(
        &mut client,
        turn("burst", "burst-1", &scenario(json!({"steps": steps}))),
    )
    .await;
    // Some decisions answered by replica A, then A is killed mid-burst.
    let mut evs = Vec::new();
    while permissions(&evs).len() < 150 {
        match tokio::time::timeout(Duration::from_secs(60), s.message()).await {
            Ok(Ok(Some(ev))) => evs.push(ev),
            other => panic!("the turn stopped early: {other:?}"),
        }
    }
    let a = d.take("policy").expect("replica a");
    a.crash().await;
    let killed_after = permissions(&evs).len();
    evs.extend(collect(&mut s, Duration::from_secs(300)).await);
    let elapsed = started.elapsed();

    let perms = permissions(&evs);
    assert_eq!(
        perms.len(),
        BURST,
        "every request was answered once; the turn ended {:?}; said {:?}; {} events",
        evs.last(),
        text(&evs),
        evs.len()
    );
    let unavailable: Vec<_> = perms
        .iter()
        .filter(|p| p.verdict != pb::Verdict::Allow as i32)
        .map(|p| (p.rule.clone(), p.reason.clone()))
        .collect();
    assert!(
        unavailable.is_empty(),
        "decisions that were not ALLOWed (none should have failed): {:?}",
        &unavailable[..unavailable.len().min(5)]
    );
    assert_eq!(
        flood_results(&evs),
        (BURST as u64, 0),
        "what the agent was answered"
    );
    let ids: HashSet<&str> = perms.iter().map(|p| p.decision_id.as_str()).collect();
    assert_eq!(ids.len(), BURST, "no decision was answered twice");

    // Every acknowledged decision has its committed audit row.
    let rows = audit_rows(&c).await;
    let audited: HashSet<&str> = rows.iter().map(|(d, _, _)| d.as_str()).collect();
    let missing: Vec<&&str> = ids.iter().filter(|id| !audited.contains(**id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged decisions have no audit row, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    // Rows nobody was answered with: decided by A, its answer lost with it, decided again by B.
    let mut per_request: HashMap<&str, usize> = HashMap::new();
    for (_, r, _) in &rows {
        *per_request.entry(r.as_str()).or_default() += 1;
    }
    let decided_twice = per_request.values().filter(|n| **n > 1).count();
    let by_b: u64 = status_of(&b_admin).await["decisions"].parse().unwrap();
    eprintln!(
        "{BURST} decisions in {elapsed:?}; replica a killed after {killed_after} answers; \
         replica b decided {by_b}; audit rows {}; requests decided on both replicas (a's answer lost \
         with it) {decided_twice}",
        rows.len()
    );
    assert!(by_b > 0, "the burst did not go on through replica b");
    assert!(
        rows.len() <= BURST + decided_twice,
        "more rows than answers and lost answers"
    );
    let _ = b.child.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_fails_decisions_closed_within_their_deadline_and_service_resumes() {
    let Some(mut c) = cluster() else { return };
    let mut sets = pg_sets("policy", &c);
    sets.extend([
        (
            "supervisor".to_string(),
            "policy.decide_deadline_ms=3000".to_string(),
        ),
        ("supervisor".into(), "policy.answer_grace_ms=500".into()),
        (
            "supervisor".into(),
            "limits.permissions_per_turn=5000".into(),
        ),
    ]);
    let mut d = Deployment::new(Options {
        sets,
        ..Default::default()
    });
    d.start("policy").await;
    d.start("supervisor").await;
    let mut client = client(&d);
    // Three permissions every 200 ms for about 25 s.
    let steps: Vec<_> = (0..125)
        .flat_map(|_| {
            [
                json!({"type": "flood", "method": "session/request_permission", "count": 3}),
                json!({"type": "sleep", "ms": 200}),
            ]
        })
        .collect();
    let mut s = start(
        &mut client,
        turn("outage", "outage-1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let mut evs = Vec::new();
    let t0 = Instant::now();
    let mut stopped_at = None;
    let mut restarted_at = None;
    loop {
        match tokio::time::timeout(Duration::from_millis(100), s.message()).await {
            Ok(Ok(Some(ev))) => {
                let last = matches!(ev.event, Some(pb::turn_event::Event::Stop(_)));
                evs.push(ev);
                if last {
                    break;
                }
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => panic!("stream error: {e}"),
            Err(_) => {}
        }
        if stopped_at.is_none() && t0.elapsed() > Duration::from_secs(5) {
            c.stop();
            stopped_at = Some(permissions(&evs).len());
        }
        if restarted_at.is_none() && t0.elapsed() > Duration::from_secs(15) {
            c.start().unwrap_or_else(|e| panic!("restart: {e}"));
            restarted_at = Some(permissions(&evs).len());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the turn did not end"
        );
    }
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 375, "every request was answered");
    let (Some(stopped_at), Some(restarted_at)) = (stopped_at, restarted_at) else {
        panic!("the turn ended before the outage was over");
    };
    let before = &perms[..stopped_at];
    let after = &perms[perms.len() - 30..];
    let during = &perms[stopped_at..restarted_at];
    let allow = pb::Verdict::Allow as i32;
    assert!(
        before.iter().all(|p| p.verdict == allow),
        "before the outage"
    );
    // Fail closed: every decision answered while the database was down is a DENY.
    let denied: Vec<_> = perms.iter().filter(|p| p.verdict != allow).collect();
    assert!(
        during.iter().filter(|p| p.verdict != allow).count() >= 10,
        "the outage denied too little: {:?}",
        during.iter().map(|p| &p.rule).collect::<Vec<_>>()
    );
    for p in &denied {
        assert!(
            p.rule == "audit.unavailable" || p.rule == "policy_unavailable",
            "{} {}",
            p.rule,
            p.reason
        );
    }
    // Nothing waited past its deadline (3 s) and grace (0.5 s).
    let slowest = perms
        .iter()
        .map(|p| p.policy_latency_micros)
        .max()
        .unwrap_or(0);
    assert!(
        slowest < 3_500_000,
        "a decision took {slowest} µs, past the deadline and grace"
    );
    // Back by itself: the last decisions are allowed again.
    assert!(
        after.iter().all(|p| p.verdict == allow),
        "after the outage: {:?}",
        after.iter().map(|p| &p.rule).collect::<Vec<_>>()
    );
    // The policy counted what it could not audit, and nothing it answered DENY for lack of
    // an audit row has an ALLOW row.
    let status = status_of(&d.layout.policy_admin_socket()).await;
    let not_audited: usize = status["decisions_not_audited"].parse().unwrap();
    let audit_denied = denied
        .iter()
        .filter(|p| p.rule == "audit.unavailable")
        .count();
    let rows = audit_rows(&c).await;
    let allowed_rows: HashSet<&str> = rows
        .iter()
        .filter(|(_, _, v)| *v == allow)
        .map(|(d, _, _)| d.as_str())
        .collect();
    let wrongly_audited: Vec<_> = denied
        .iter()
        .filter(|p| allowed_rows.contains(p.decision_id.as_str()))
        .collect();
    eprintln!(
        "375 decisions: {} denied during the outage ({audit_denied} audit.unavailable, {} \
         policy_unavailable), counted not audited by the policy: {not_audited}; slowest {slowest} µs; \
         ALLOW rows of denied decisions: {}",
        denied.len(),
        denied.len() - audit_denied,
        wrongly_audited.len()
    );
    assert!(
        not_audited >= audit_denied,
        "the policy counted {not_audited}, the agent saw {audit_denied}"
    );
    assert!(
        wrongly_audited.is_empty(),
        "ALLOW rows for decisions answered DENY: {wrongly_audited:?}"
    );
    // Every ALLOW the agent got is audited.
    let audited: HashSet<&str> = rows.iter().map(|(d, _, _)| d.as_str()).collect();
    let unaudited_allows = perms
        .iter()
        .filter(|p| p.verdict == allow && !audited.contains(p.decision_id.as_str()))
        .count();
    assert_eq!(unaudited_allows, 0, "ALLOWs without their audit row");
}

#[tokio::test(flavor = "multi_thread")]
async fn check_config_says_whether_the_database_is_reachable_and_migrated() {
    let Some(mut c) = cluster() else { return };
    let check = |url: String| {
        let out = std::process::Command::new(binary("warden-policy"))
            .args([
                "--check-config",
                "--set",
                "store.backend=\"postgres\"",
                "--set",
            ])
            .arg(format!("store.url={}", toml_str(&url)))
            .args(["--set", "store.connect_timeout_ms=1000"])
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, out) = check(c.url("warden"));
    assert!(!ok && out.contains("not migrated"), "{out}");
    // A policy's start migrates.
    let mut d = Deployment::new(Options {
        sets: pg_sets("policy", &c),
        ..Default::default()
    });
    d.start("policy").await;
    let (ok, out) = check(c.url("warden"));
    assert!(ok && out.contains("configuration OK"), "{out}");
    assert!(out.contains("postgres warden@"), "{out}");
    c.stop();
    let (ok, out) = check(c.url("warden"));
    assert!(!ok && out.contains("store ("), "{out}");
    // sled (the default) needs no database.
    let out = std::process::Command::new(binary("warden-policy"))
        .args(["--check-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("audit store: sled"));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_approvers_answering_the_same_escalation_at_once_one_answer_takes_effect() {
    let Some(c) = cluster() else { return };
    let mut d = with_approver_on(&c).await;
    let (mut b, _, b_admin) = d.replica("approver", "approver-b").await;
    d.start("supervisor").await;
    let admin_of = |p: &Path| {
        pb::approval_service_client::ApprovalServiceClient::new(
            warden_daemon::client::unix_channel(p),
        )
    };
    let mut on_a = admin_of(&d.layout.approver_admin_socket());
    let mut on_b = admin_of(&b_admin);
    let mut client = client(&d);
    let allow = pb::Verdict::Allow as i32;
    for round in 0..5 {
        let ctx = format!("esc{round}");
        // An edit escalates (the local approver demo's policy: approve-reads) and waits on
        // approver a, where the supervisor asks.
        let mut s = start(
            &mut client,
            turn(
                &ctx,
                &format!("{ctx}-1"),
                &scenario(json!({"steps": [
                    {"type": "tool", "kind": "edit", "path": format!("f{round}.txt"), "content": "x", "ask": true}
                ]})),
            ),
        )
        .await;
        // Replica b shows the request held by a.
        let t0 = Instant::now();
        let id = loop {
            let pending = on_b
                .list(pb::ListApprovalsRequest { limit: 10 })
                .await
                .unwrap()
                .into_inner()
                .approvals;
            if let Some(a) = pending.first() {
                break a.id.clone();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "b never showed the request"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Both operators answer at the same moment, one on each replica.
        let (x, y) = tokio::join!(
            on_a.answer(pb::AnswerRequest {
                id: id.clone(),
                verdict: allow,
                reason: "fine by a".into(),
            }),
            on_b.answer(pb::AnswerRequest {
                id: id.clone(),
                verdict: pb::Verdict::Deny as i32,
                reason: "not by b".into(),
            })
        );
        let (won, lost) = match (x, y) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w.into_inner(), l),
            other => panic!("round {round}: not exactly one answer took effect: {other:?}"),
        };
        assert_eq!(lost.code(), tonic::Code::FailedPrecondition, "{lost:?}");
        assert!(
            lost.message().contains(&won.answered_by) && lost.message().contains("already decided"),
            "the loser is told who won: {lost:?}"
        );
        let evs = collect(&mut s, Duration::from_secs(60)).await;
        let perms = permissions(&evs);
        assert_eq!(perms.len(), 1);
        let want = if won.state() == pb::ApprovalState::Approved {
            allow
        } else {
            pb::Verdict::Deny as i32
        };
        assert_eq!(
            perms[0].verdict, want,
            "round {round}: the caller got the winner's answer"
        );
        assert_eq!(perms[0].decision_id, id);
        // Both replicas' history holds the one decision.
        for h in [&mut on_a, &mut on_b] {
            let got = h
                .get(pb::GetApprovalRequest { id: id.clone() })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(got.answered_by, won.answered_by);
            assert_eq!(got.state(), won.state());
        }
        eprintln!("round {round}: {} won ({:?})", won.reason, won.state());
    }
    // `warden doctor` says where each daemon's durable state lives.
    let out = std::process::Command::new(binary("warden"))
        .arg("--state-dir")
        .arg(d.dir.path())
        .arg("doctor")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.contains("durable state:"), "{out}");
    assert!(out.contains("policy    sled (sled)"), "{out}");
    assert!(
        out.contains("approver  postgres (postgres warden@") && out.contains("; 0 pending"),
        "{out}"
    );
    let _ = b.child.kill().await;
}

/// The approver's queue in a PostgreSQL that is down: an escalation cannot be held durably, so
/// it is denied at once (never left waiting for a person it could not be shown to, never
/// allowed), and once the database is back escalations wait for a person and are answered.
#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_while_the_queue_database_is_down_is_denied_at_once_and_approvals_resume() {
    let Some(mut c) = cluster() else { return };
    let mut d = with_approver_on(&c).await;
    d.start("supervisor").await;
    let mut client = client(&d);
    let edit = |ctx: &str, file: &str| {
        turn(
            ctx,
            &format!("{ctx}-1"),
            &scenario(json!({"steps": [
                {"type": "tool", "kind": "edit", "path": file, "content": "x", "ask": true}
            ]})),
        )
    };

    c.stop();
    let t0 = Instant::now();
    let mut s = start(&mut client, edit("down", "down.txt")).await;
    let evs = collect(&mut s, Duration::from_secs(60)).await;
    let waited = t0.elapsed();
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{evs:#?}");
    assert_eq!(
        perms[0].verdict,
        pb::Verdict::Deny as i32,
        "an escalation the queue could not hold was not denied: {:?}",
        perms[0]
    );
    assert_eq!(perms[0].rule, "approval.unavailable", "{:?}", perms[0]);
    // Bounded by the store's connect timeout (1 s here), not by a person's time (60 s).
    assert!(
        waited < Duration::from_secs(20),
        "denied only after {waited:?}"
    );
    eprintln!(
        "database down: denied after {waited:?}: {} ({})",
        perms[0].reason, perms[0].rule
    );

    c.start().unwrap();
    let mut admin = pb::approval_service_client::ApprovalServiceClient::new(
        warden_daemon::client::unix_channel(&d.layout.approver_admin_socket()),
    );
    let mut s = start(&mut client, edit("back", "back.txt")).await;
    let t0 = Instant::now();
    let id = loop {
        if let Ok(r) = admin.list(pb::ListApprovalsRequest { limit: 10 }).await
            && let Some(a) = r.into_inner().approvals.first()
        {
            break a.id.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the escalation never waited for a person once the database was back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    admin
        .answer(pb::AnswerRequest {
            id: id.clone(),
            verdict: pb::Verdict::Allow as i32,
            reason: "back".into(),
        })
        .await
        .expect("answered once the database is back");
    let evs = collect(&mut s, Duration::from_secs(60)).await;
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{evs:#?}");
    assert_eq!(
        perms[0].verdict,
        pb::Verdict::Allow as i32,
        "{:?}",
        perms[0]
    );
    assert_eq!(perms[0].decision_id, id);
}

fn edit_request(root: &Path, n: usize) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("mig-{n}"),
        subject: Some(pb::Subject {
            principal: "tester".into(),
            context_id: "mig".into(),
            task_id: "t".into(),
            session_id: "s".into(),
            agent: "scripted".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: root.display().to_string(),
            owned: true,
            allow_execute: true,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: format!("call-{n}"),
            kind: "edit".into(),
            title: format!("Write f{n}.txt"),
            raw_input_json: "{}".into(),
            locations: vec![pb::Location {
                path: root.join(format!("f{n}.txt")).display().to_string(),
                line: None,
            }],
        }),
        options: vec![
            pb::PermissionOption {
                id: "allow".into(),
                name: "Allow".into(),
                kind: "allow_once".into(),
            },
            pb::PermissionOption {
                id: "reject".into(),
                name: "Reject".into(),
                kind: "reject_once".into(),
            },
        ],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_store_moves_the_audit_and_the_queue_from_sled_into_postgres() {
    let Some(c) = cluster() else { return };
    let mut d = Deployment::new(Options {
        approver: true,
        ..Default::default()
    });
    d.start("policy").await;
    d.start("approver").await;
    let root = d.dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    // Decisions of the policy itself (edits escalate under the approver demo's approve-reads:
    // asked directly they are DENY "escalated: no approver"; reads are ALLOW).
    let mut policy = pb::policy_service_client::PolicyServiceClient::new(d.channel("policy"));
    let mut decided = Vec::new();
    for n in 0..20 {
        let mut r = edit_request(&root, n);
        if n % 2 == 0 {
            r.tool_call.as_mut().unwrap().kind = "read".into();
        }
        decided.push(policy.decide(r).await.unwrap().into_inner().decision_id);
    }
    // Two requests answered by a person on the approver, one left waiting.
    let approver = pb::policy_service_client::PolicyServiceClient::new(d.channel("approver"));
    let mut admin = pb::approval_service_client::ApprovalServiceClient::new(
        warden_daemon::client::unix_channel(&d.layout.approver_admin_socket()),
    );
    let mut answered = Vec::new();
    for n in 100..103 {
        let mut a = approver.clone();
        let waiting = tokio::spawn(async move { a.decide(edit_request_at(n)).await });
        let t0 = Instant::now();
        let id = loop {
            let p = admin
                .list(pb::ListApprovalsRequest { limit: 10 })
                .await
                .unwrap()
                .into_inner()
                .approvals;
            if let Some(a) = p.iter().find(|a| {
                a.request.as_ref().map(|r| r.request_id.as_str()) == Some(&format!("mig-{n}"))
            }) {
                break a.id.clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "not held");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if n == 102 {
            // Left pending: the approver is stopped with it held (its caller still waiting, so
            // it is not revoked).
            drop(waiting);
            answered.push((id, None));
            continue;
        }
        admin
            .answer(pb::AnswerRequest {
                id: id.clone(),
                verdict: pb::Verdict::Allow as i32,
                reason: "ok".into(),
            })
            .await
            .unwrap();
        let got = waiting.await.unwrap().unwrap().into_inner();
        assert_eq!(got.verdict, pb::Verdict::Allow as i32);
        answered.push((id, Some(())));
    }
    drop(approver);
    d.take("approver").unwrap().terminate().await;
    d.take("policy").unwrap().terminate().await;
    // The gateway's tasks: one finished task (its answer an artifact), one left running when
    // the gateway stopped (moved as FAILED, as its restart would end it).
    d.start("supervisor").await;
    d.start("gateway").await;
    let token = d.token();
    let answer = |text: &str| {
        serde_json::json!({"steps": [
            {"type": "message", "text": text}, {"type": "stop", "reason": "end_turn"}
        ]})
        .to_string()
    };
    let send = |id: &str, text: String, immediately: bool| {
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]},
            "configuration": {"returnImmediately": immediately}
        }})
    };
    let http = d.http.clone();
    let rpc = async |body: serde_json::Value| {
        let resp = warden_cli::client::request(
            &http,
            hyper::Method::POST,
            "/a2a/jsonrpc",
            &token,
            Some(&body),
        )
        .await
        .unwrap();
        warden_cli::client::read_answer(resp).await.unwrap().0
    };
    let done = rpc(send("mig-done", answer("moved answer"), false)).await;
    let done_id = done["result"]["task"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );
    let hang =
        serde_json::json!({"steps": [{"type": "message", "text": "started"}, {"type": "hang"}]});
    let running = rpc(send("mig-run", hang.to_string(), true)).await;
    let running_id = running["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    d.take("gateway").unwrap().terminate().await;
    d.take("supervisor").unwrap().terminate().await;

    let migrate = || {
        std::process::Command::new(binary("warden"))
            .arg("--state-dir")
            .arg(d.dir.path())
            .args(["migrate-store", "--url", &c.url("warden")])
            .output()
            .unwrap()
    };
    let out = migrate();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("warden-policy: imported the audit log"),
        "{text}"
    );
    assert!(
        text.contains("warden-approver: imported the queue"),
        "{text}"
    );
    assert!(
        text.contains("warden-gateway: imported the task store") && text.contains(" 2 tasks"),
        "{text}"
    );
    // Again: nothing is copied twice.
    let out = migrate();
    let again = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{again}");
    assert!(again.contains(" 0 new,"), "{again}");
    eprintln!("{text}{again}");

    // The daemons on PostgreSQL find everything.
    let mut sets = pg_sets("policy", &c);
    sets.extend(pg_sets("approver", &c));
    d.opts.sets = sets;
    d.start("policy").await;
    d.start("approver").await;
    let mut audit = pb::admin_service_client::AdminServiceClient::new(
        warden_daemon::client::unix_channel(&d.layout.policy_admin_socket()),
    );
    for id in &decided {
        let got = audit
            .audit_query(pb::AuditQueryRequest {
                limit: 1,
                decision_id: id.clone(),
                context_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .records;
        assert_eq!(got.len(), 1, "decision {id} not in the moved audit");
    }
    let mut admin = pb::approval_service_client::ApprovalServiceClient::new(
        warden_daemon::client::unix_channel(&d.layout.approver_admin_socket()),
    );
    for (id, was_answered) in &answered {
        let a = admin
            .get(pb::GetApprovalRequest { id: id.clone() })
            .await
            .unwrap_or_else(|e| panic!("{id} not moved: {e}"))
            .into_inner();
        match was_answered {
            Some(()) => assert_eq!(a.state(), pb::ApprovalState::Approved),
            None => assert_eq!(a.state(), pb::ApprovalState::Pending, "{a:?}"),
        }
    }
    // The gateway on PostgreSQL shows the moved tasks as they were.
    d.opts.sets = pg_sets("gateway", &c);
    d.start("supervisor").await;
    d.start("gateway").await;
    let get = |id: &str| serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}});
    let t = rpc(get(&done_id)).await;
    assert_eq!(
        t["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{t}"
    );
    assert!(t.to_string().contains("moved answer"), "{t}");
    let t = rpc(get(&running_id)).await;
    assert_eq!(t["result"]["status"]["state"], "TASK_STATE_FAILED", "{t}");
}

/// An edit request for the approver (a fixed root under /var/tmp is not needed: the approver
/// holds it before any filesystem check matters for this test).
fn edit_request_at(n: usize) -> pb::DecideRequest {
    edit_request(Path::new("/srv"), n)
}
