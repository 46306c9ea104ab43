//! The audit records what was enforced (issue 37, item 4): the real `warden-policy` binary on a
//! real PostgreSQL cluster, the database frozen (SIGSTOP), stopped, and slow (a lock held on the
//! audit table). Each time the decisions are answered DENY `audit.unavailable` at the caller's
//! 200 ms deadline, although the rules allow them; once the database is back, the audit (what
//! `warden audit show` and `warden audit tail` read, the admin API's AuditQuery) must say DENY
//! `audit.unavailable` for those decisions, never the ALLOW that was decided and not given, and
//! the policy's metrics must count what the audit shows.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warden_pgstate::cluster::TestCluster;
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

/// The caller's deadline, the supervisor's default.
const DEADLINE_MS: u64 = 200;

struct Policy {
    child: Child,
    dir: tempfile::TempDir,
    metrics: std::net::SocketAddr,
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
    fn root(&self) -> PathBuf {
        self.dir.path().join("ws")
    }
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("a free port: {e}"))
}

/// The policy with its audit in `c` (database `warden`); a commit may take up to 2 s, ten
/// times the caller's deadline, so a late row has room to land.
async fn start(c: &TestCluster) -> Policy {
    let dir = tempfile::Builder::new()
        .prefix("wpe")
        .tempdir_in("/tmp")
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let metrics = free_port();
    let text = format!(
        "[daemon]\nstate_dir = {:?}\nlog_level = \"warn\"\nmetrics_listen = \"{metrics}\"\n\
         [listen]\nsocket = \"policy.sock\"\n\
         [admin]\nsocket = \"policy-admin.sock\"\n\
         [store]\nbackend = \"postgres\"\nurl = {:?}\nconnect_timeout_ms = 2000\n",
        dir.path().display().to_string(),
        c.url("warden"),
    );
    std::fs::write(dir.path().join("policy.toml"), text).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.path().join("ws")).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden-policy"));
    cmd.arg("--config")
        .arg(dir.path().join("policy.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if std::env::var_os("WARDEN_TEST_LOGS").is_none() {
        cmd.stderr(Stdio::null());
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn warden-policy: {e}"));
    let mut p = Policy {
        child,
        dir,
        metrics,
    };
    let t0 = Instant::now();
    while !(warden_daemon::client::healthy(&p.socket()).await
        && warden_daemon::client::healthy(&p.admin_socket()).await)
    {
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!("warden-policy exited during start: {status}");
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "not healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A read inside its own root: the rules allow it.
fn read(root: &Path, id: &str, deadline_ms: u64) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("r-{id}"),
        subject: Some(pb::Subject {
            principal: "alice".into(),
            context_id: "ctx".into(),
            task_id: "t1".into(),
            session_id: "s1".into(),
            agent: "codex".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: root.display().to_string(),
            owned: true,
            allow_execute: false,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: id.into(),
            kind: "read".into(),
            title: "read src/lib.rs".into(),
            raw_input_json: "{}".into(),
            locations: vec![pb::Location {
                path: root.join("src/lib.rs").display().to_string(),
                line: None,
            }],
        }),
        options: vec![
            pb::PermissionOption {
                id: "approved".into(),
                name: "Yes".into(),
                kind: "allow_once".into(),
            },
            pb::PermissionOption {
                id: "denied".into(),
                name: "No".into(),
                kind: "reject_once".into(),
            },
        ],
        current_mode: "default".into(),
        deadline_unix_ms: unix_ms() + deadline_ms,
        return_escalations: false,
    }
}

async fn decide(p: &Policy, r: pb::DecideRequest) -> pb::Decision {
    PolicyServiceClient::new(warden_daemon::client::unix_channel(&p.socket()))
        .decide(r)
        .await
        .unwrap_or_else(|e| panic!("decide: {e}"))
        .into_inner()
}

async fn audit(p: &Policy, q: pb::AuditQueryRequest) -> Vec<pb::AuditRecord> {
    AdminServiceClient::new(warden_daemon::client::unix_channel(&p.admin_socket()))
        .audit_query(q)
        .await
        .unwrap_or_else(|e| panic!("audit query: {e}"))
        .into_inner()
        .records
}

/// `warden audit show ID`'s query.
async fn show(p: &Policy, id: &str) -> Option<pb::AuditRecord> {
    audit(
        p,
        pb::AuditQueryRequest {
            decision_id: id.into(),
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .into_iter()
    .next()
}

/// The policy's `warden_policy_decisions_total` by (verdict, rule).
async fn decisions_metric(p: &Policy) -> Vec<(String, String, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(p.metrics)
        .await
        .unwrap_or_else(|e| panic!("connect to the metrics listener: {e}"));
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("warden_policy_decisions_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        out.push((
            label("verdict"),
            label("rule"),
            value.trim().parse().unwrap_or(0),
        ));
    }
    out.sort();
    out
}

/// What a test checks once the database is back: each of `denied` (answered DENY
/// `audit.unavailable`) reads as that DENY by id and in the tail, exactly once, within a few
/// seconds; and the metrics count, per verdict and rule, what the audit holds.
async fn audit_says_what_was_enforced(p: &Policy, denied: &[pb::Decision]) {
    for d in denied {
        assert_eq!(d.verdict, pb::Verdict::Deny as i32, "{d:?}");
        assert_eq!(d.rule, "audit.unavailable", "{d:?}");
    }
    // The rows that could land late, and the corrections, are given time to.
    let t0 = Instant::now();
    loop {
        let mut shown = Vec::new();
        for d in denied {
            shown.push(show(p, &d.decision_id).await);
        }
        let done = shown.iter().all(|r| {
            r.as_ref()
                .is_some_and(|r| r.verdict == pb::Verdict::Deny as i32)
        });
        if done && t0.elapsed() > Duration::from_secs(3) {
            for r in shown.iter().flatten() {
                assert_eq!(r.rule, "audit.unavailable", "{r:?}");
                assert!(
                    r.reason.contains("never enforced"),
                    "the record says why: {}",
                    r.reason
                );
            }
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the audit does not say what was answered: {shown:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tail = audit(
        p,
        pb::AuditQueryRequest {
            limit: 100,
            ..Default::default()
        },
    )
    .await;
    for d in denied {
        let of: Vec<&pb::AuditRecord> = tail
            .iter()
            .filter(|r| r.decision_id == d.decision_id)
            .collect();
        assert_eq!(of.len(), 1, "one line per decision in the tail: {of:#?}");
        assert_eq!(of[0].verdict, pb::Verdict::Deny as i32, "{:?}", of[0]);
    }
    // The metrics and the audit agree, verdict by verdict and rule by rule.
    let mut from_audit: Vec<(String, String, u64)> = Vec::new();
    for r in &tail {
        let v = match pb::Verdict::try_from(r.verdict) {
            Ok(pb::Verdict::Allow) => "allow",
            Ok(pb::Verdict::Escalate) => "escalate",
            _ => "deny",
        };
        match from_audit
            .iter_mut()
            .find(|(fv, fr, _)| fv == v && *fr == r.rule)
        {
            Some(e) => e.2 += 1,
            None => from_audit.push((v.into(), r.rule.clone(), 1)),
        }
    }
    from_audit.sort();
    assert_eq!(decisions_metric(p).await, from_audit);
}

/// One decision allowed with the database up, so the pool holds a connection (the frozen and
/// slow cases are then about a commit, not a connect).
async fn warm_up(p: &Policy) {
    let d = decide(p, read(&p.root(), "warm", 10_000)).await;
    assert_eq!(d.verdict, pb::Verdict::Allow as i32, "{d:?}");
}

/// Two decisions at once, each with the 200 ms deadline.
async fn two_decisions(p: &Policy, tag: &str) -> Vec<pb::Decision> {
    let t0 = Instant::now();
    let (a, b) = tokio::join!(
        decide(p, read(&p.root(), &format!("{tag}-a"), DEADLINE_MS)),
        decide(p, read(&p.root(), &format!("{tag}-b"), DEADLINE_MS)),
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "answered within the deadline: {:?}",
        t0.elapsed()
    );
    vec![a, b]
}

fn cluster() -> Option<TestCluster> {
    let c = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}"))?;
    c.create_db("warden")
        .unwrap_or_else(|e| panic!("createdb: {e}"));
    Some(c)
}

/// Issue 37's reproduction: the server frozen while two decisions wait for their commit, thawed
/// before the policy's own commit timeout (2 s). On main their rows then committed and the audit
/// read ALLOW for two decisions answered DENY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_never_leaves_an_allow_for_a_decision_answered_deny() {
    let Some(c) = cluster() else { return };
    let p = start(&c).await;
    warm_up(&p).await;
    c.pause();
    let denied = two_decisions(&p, "frozen").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.resume();
    audit_says_what_was_enforced(&p, &denied).await;
    // And the database back, decisions are allowed and recorded as such again.
    warm_up(&p).await;
}

/// The server stopped, then started again: the decisions answered DENY meanwhile are in the
/// audit as that DENY once it is back (on main they were never recorded at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_records_the_deny_given_once_it_is_back() {
    let Some(mut c) = cluster() else { return };
    let p = start(&c).await;
    warm_up(&p).await;
    c.stop();
    let denied = two_decisions(&p, "stopped").await;
    c.start()
        .unwrap_or_else(|e| panic!("restart PostgreSQL: {e}"));
    audit_says_what_was_enforced(&p, &denied).await;
    warm_up(&p).await;
}

/// A slow database: another session holds a lock on the audit table for 600 ms, three times
/// the caller's deadline and well within the policy's commit timeout. On main the insert ran
/// once the lock was released and committed two ALLOWs that had been answered DENY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_never_leaves_an_allow_for_a_decision_answered_deny() {
    let Some(c) = cluster() else { return };
    let p = start(&c).await;
    warm_up(&p).await;
    let pg = warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(c.url("warden")))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut locker = pg.client().await.unwrap_or_else(|e| panic!("{e}"));
    let tx = locker.transaction().await.unwrap_or_else(|e| panic!("{e}"));
    tx.batch_execute("LOCK TABLE policy_audit IN SHARE ROW EXCLUSIVE MODE")
        .await
        .unwrap_or_else(|e| panic!("lock: {e}"));
    let denied = two_decisions(&p, "slow").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    tx.commit().await.unwrap_or_else(|e| panic!("{e}"));
    audit_says_what_was_enforced(&p, &denied).await;
    warm_up(&p).await;
}
