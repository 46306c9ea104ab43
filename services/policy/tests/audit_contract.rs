//! The audit log's contract, run against both backends (sled in a temporary directory, a real
//! PostgreSQL cluster): concurrent durable appends all readable afterwards, by decision id,
//! newest first, by context; and for PostgreSQL what only replicas have: another replica reads
//! every acknowledged record, concurrent appends share commits, and a database that is gone
//! fails an append within its timeout instead of hanging, then is used again when it is back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_pgstate::StoreSection;
use warden_pgstate::cluster::TestCluster;
use warden_policy::audit::AuditLog;
use warden_policy::audit_pg::PgAudit;
use warden_policy::audit_store::AuditStore;
use warden_proto::v1 as pb;

type R = Result<(), Box<dyn std::error::Error>>;

fn rec(id: &str, ctx: &str) -> pb::AuditRecord {
    pb::AuditRecord {
        decision_id: id.to_string(),
        request_id: format!("req-{id}"),
        subject: Some(pb::Subject {
            context_id: ctx.to_string(),
            ..Default::default()
        }),
        verdict: pb::Verdict::Allow as i32,
        reason: "because".into(),
        rule: "test".into(),
        decided_at_unix_ms: 1_700_000_000_000,
        ..Default::default()
    }
}

const TASKS: usize = 8;
const EACH: usize = 25;

/// What every backend must do.
async fn contract(store: Arc<dyn AuditStore>) -> R {
    assert_eq!(store.count().await?, 0);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                store
                    .append(&rec(&format!("d-{t}-{i}"), &format!("c{t}")), true)
                    .await?;
            }
            Ok::<_, warden_policy::audit::AuditError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    assert_eq!(store.count().await?, (TASKS * EACH) as u64);
    for t in 0..TASKS {
        for i in 0..EACH {
            let id = format!("d-{t}-{i}");
            let got = store.by_decision_id(&id).await?.ok_or(id.clone())?;
            assert_eq!(
                got,
                rec(&id, &format!("c{t}")),
                "the record comes back whole"
            );
        }
    }
    assert_eq!(store.by_decision_id("nope").await?, None);
    store.append(&rec("last", "c9"), true).await?;
    let newest = store.newest(3, None).await?;
    assert_eq!(newest.len(), 3);
    assert_eq!(newest[0].decision_id, "last");
    // One context, newest first: each task appended its own in order.
    let c3 = store.newest(100, Some("c3")).await?;
    let ids: Vec<String> = c3.iter().map(|r| r.decision_id.clone()).collect();
    let want: Vec<String> = (0..EACH).rev().map(|i| format!("d-3-{i}")).collect();
    assert_eq!(ids, want);
    assert!(store.newest(10, Some("none")).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sled_backend_keeps_the_contract() -> R {
    let dir = tempfile::tempdir()?;
    let log = AuditLog::open(warden_store::Store::open(dir.path())?)?;
    assert_eq!(log.backend(), "sled");
    contract(Arc::new(log)).await
}

async fn pg_audit(c: &TestCluster, timeout_ms: u64) -> Result<PgAudit, Box<dyn std::error::Error>> {
    let pg = warden_pgstate::Pg::new(&StoreSection {
        connect_timeout_ms: timeout_ms,
        ..StoreSection::postgres(c.url("audit"))
    })?;
    warden_pgstate::migrate::migrate(&pg).await?;
    Ok(PgAudit::start(pg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_backend_keeps_the_contract_across_replicas() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("audit")?;
    let a = Arc::new(pg_audit(&c, 2000).await?);
    let b = pg_audit(&c, 2000).await?;
    assert_eq!(a.backend(), "postgres");
    contract(a.clone()).await?;
    // Every record a replica acknowledged is read by the other.
    for t in 0..TASKS {
        for i in 0..EACH {
            let id = format!("d-{t}-{i}");
            assert!(
                b.by_decision_id(&id).await?.is_some(),
                "{id} not seen by replica b"
            );
        }
    }
    assert_eq!(b.count().await?, (TASKS * EACH + 1) as u64);
    // A withdrawal reaching replica b finds what replica a decided for the request.
    assert_eq!(
        b.newest_of_request("req-d-2-3")
            .await?
            .map(|r| r.decision_id),
        Some("d-2-3".to_string())
    );
    assert_eq!(b.newest_of_request("req-none").await?, None);
    // Group commit: eight callers at once shared commits.
    let commits = a.stats().commits.load(std::sync::atomic::Ordering::Relaxed);
    let records = a.stats().records.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(records, (TASKS * EACH + 1) as u64);
    assert!(
        commits < records,
        "{records} records took {commits} commits: no group commit"
    );
    println!("group commit: {records} records in {commits} commits");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_appends_within_the_timeout_and_they_resume() -> R {
    let Some(mut c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("audit")?;
    let a = pg_audit(&c, 500).await?;
    a.append(&rec("before", "c"), true).await?;
    c.stop();
    let t0 = Instant::now();
    let failed = a.append(&rec("during", "c"), true).await;
    assert!(
        failed.is_err(),
        "an append succeeded with the database stopped"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(2500),
        "the failed append took {:?}",
        t0.elapsed()
    );
    c.start()?;
    // Back by itself: the pool replaces the dead connections.
    let t0 = Instant::now();
    loop {
        match a.append(&rec("after", "c"), true).await {
            Ok(()) => break,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    assert!(a.by_decision_id("before").await?.is_some());
    assert!(
        a.by_decision_id("during").await?.is_none(),
        "a failed append left a row"
    );
    assert!(a.by_decision_id("after").await?.is_some());
    // Nothing the writer gave up on lands once the server thaws: no row records a decision
    // that was answered DENY.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        assert_eq!(
            a.by_decision_id(&format!("hung-{i}")).await?,
            None,
            "hung-{i} landed late"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_database_fails_appends_within_the_timeout_and_they_resume() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("audit")?;
    let a = pg_audit(&c, 700).await?;
    a.append(&rec("before", "c"), true).await?;
    // Accepts nothing, answers nothing: every append must still come back, failed, in time.
    c.pause();
    for i in 0..3 {
        let t0 = Instant::now();
        let got = a.append(&rec(&format!("hung-{i}"), "c"), true).await;
        let took = t0.elapsed();
        assert!(got.is_err(), "an append succeeded on a frozen database");
        assert!(
            took < Duration::from_millis(2500),
            "append {i} took {took:?}"
        );
    }
    c.resume();
    let t0 = Instant::now();
    loop {
        match a.append(&rec("after", "c"), true).await {
            Ok(()) => break,
            Err(e) if t0.elapsed() < Duration::from_secs(15) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    assert!(a.by_decision_id("after").await?.is_some());
    // Nothing the writer gave up on lands once the server thaws: no row records a decision
    // that was answered DENY.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        assert_eq!(
            a.by_decision_id(&format!("hung-{i}")).await?,
            None,
            "hung-{i} landed late"
        );
    }
    Ok(())
}

/// What every backend keeps of a record and for how long: a record with megabytes of text
/// comes back bounded (each field cut, the cut counted, the digests whole), and retention
/// removes the records older than its age bound, then the oldest beyond its count bound,
/// oldest first, saying how many for each reason.
async fn bounds_and_retention(store: Arc<dyn AuditStore>) -> R {
    use prost::Message;
    use warden_policy::pruner::prune_now;
    use warden_policy::retention::{Pruned, Retention};
    let now = 1_800_000_000_000u64;
    let mut huge = rec("huge", "c");
    huge.decided_at_unix_ms = now - 10_000;
    huge.tool_title = "t".repeat(1 << 20);
    huge.reason = "r".repeat(1 << 20);
    huge.raw_input_sha256 = "ab".repeat(32);
    huge.judged = Some(pb::JudgedAction {
        kind: "execute".into(),
        argv: vec!["x".repeat(4 << 20)],
        digest: "sha256:whole".into(),
        ..Default::default()
    });
    store.append(&huge, true).await?;
    let got = store.by_decision_id("huge").await?.ok_or("huge")?;
    assert!(
        got.encoded_len() < 40 * 1024,
        "{} bytes kept of a {}-byte record",
        got.encoded_len(),
        huge.encoded_len()
    );
    assert!(got.elided_bytes > 6_000_000, "{}", got.elided_bytes);
    assert_eq!(got.raw_input_sha256, huge.raw_input_sha256);
    assert_eq!(got.judged.map(|j| j.digest), Some("sha256:whole".into()));

    // Ten old records (as old as the huge one), then ten new ones.
    for i in 0..20u64 {
        let mut r = rec(&format!("ret-{i}"), "c");
        r.decided_at_unix_ms = if i < 10 { now - 10_000 } else { now };
        store.append(&r, true).await?;
    }
    assert_eq!(store.count().await?, 21);
    // Nothing is older than an hour before the old ones: nothing goes.
    let keep_all = Retention {
        cutoff_unix_ms: now - 3_600_000,
        max_records: 0,
        pass: 1000,
    };
    assert_eq!(prune_now(&*store, keep_all).await?, Pruned::default());
    // By age, in passes of three: the huge one and the ten old ones.
    let by_age = Retention {
        cutoff_unix_ms: now - 1,
        max_records: 0,
        pass: 3,
    };
    assert_eq!(
        prune_now(&*store, by_age).await?,
        Pruned {
            by_age: 11,
            by_count: 0
        }
    );
    assert_eq!(store.count().await?, 10);
    assert!(store.by_decision_id("ret-9").await?.is_none());
    assert!(store.by_decision_id("huge").await?.is_none());
    // By count: the newest four stay.
    let by_count = Retention {
        cutoff_unix_ms: 0,
        max_records: 4,
        pass: 1000,
    };
    assert_eq!(
        prune_now(&*store, by_count).await?,
        Pruned {
            by_age: 0,
            by_count: 6
        }
    );
    assert_eq!(store.count().await?, 4);
    let ids: Vec<String> = store
        .newest(100, None)
        .await?
        .into_iter()
        .map(|r| r.decision_id)
        .collect();
    assert_eq!(ids, ["ret-19", "ret-18", "ret-17", "ret-16"]);
    assert!(store.by_decision_id("ret-15").await?.is_none());
    // Appends go on after retention.
    store.append(&rec("after", "c"), true).await?;
    assert_eq!(store.count().await?, 5);
    assert!(store.by_decision_id("after").await?.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sled_backend_keeps_bounded_records_and_retention() -> R {
    let dir = tempfile::tempdir()?;
    {
        let log = AuditLog::open(warden_store::Store::open(dir.path())?)?;
        bounds_and_retention(Arc::new(log)).await?;
    }
    // Reopened, the log counts what it holds, not what it ever held.
    let t0 = Instant::now();
    let log = loop {
        match warden_store::Store::open(dir.path()) {
            Ok(s) => break AuditLog::open(s)?,
            Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert_eq!(log.len(), 5);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_backend_keeps_bounded_records_and_retention() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("audit")?;
    bounds_and_retention(Arc::new(pg_audit(&c, 2000).await?)).await
}
