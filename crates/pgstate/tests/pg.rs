//! The PostgreSQL foundation against a real cluster: migrations applied once by replicas
//! starting together, the advisory lock they queue on, what `--check-config` reports, an
//! unreachable database failing within its timeout, and notifications surviving a restart.

use std::time::{Duration, Instant};

use warden_pgstate::cluster::TestCluster;
use warden_pgstate::listen::{Listener, Note};
use warden_pgstate::migrate::{self, LOCK_KEY, MIGRATIONS};
use warden_pgstate::{Pg, PgError, StoreSection};

type R = Result<(), Box<dyn std::error::Error>>;

fn cluster(db: &str) -> Result<Option<TestCluster>, Box<dyn std::error::Error>> {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(None);
    };
    c.create_db(db)?;
    Ok(Some(c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_apply_each_migration_once() -> R {
    let Some(c) = cluster("w")? else {
        return Ok(());
    };
    let section = StoreSection::postgres(c.url("w"));
    // Not migrated yet: the check says so and changes nothing.
    let pg = Pg::new(&section)?;
    match migrate::check(&pg).await {
        Err(PgError::NotMigrated(why)) => assert!(why.contains("warden_schema"), "{why}"),
        other => panic!("check before migrating: {other:?}"),
    }
    let replicas: Vec<Pg> = (0..6)
        .map(|_| Pg::new(&section))
        .collect::<Result<_, _>>()?;
    let runs = futures::future::join_all(replicas.iter().map(migrate::migrate)).await;
    let mut applied = Vec::new();
    for r in runs {
        let m = r?;
        assert_eq!(m.version, migrate::latest());
        applied.extend(m.applied);
    }
    let all: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(
        applied, all,
        "each migration applied by exactly one replica"
    );
    let rows: i64 = pg
        .client()
        .await?
        .query_one("SELECT count(*) FROM warden_schema", &[])
        .await?
        .get(0);
    assert_eq!(rows as usize, MIGRATIONS.len());
    assert_eq!(migrate::check(&pg).await?, migrate::latest());
    // Starting again applies nothing.
    assert!(migrate::migrate(&pg).await?.applied.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waits_for_the_advisory_lock() -> R {
    let Some(c) = cluster("w")? else {
        return Ok(());
    };
    let section = StoreSection::postgres(c.url("w"));
    let holder = Pg::new(&section)?;
    let held = holder.client().await?;
    held.execute("SELECT pg_advisory_lock($1)", &[&LOCK_KEY])
        .await?;
    let pg = Pg::new(&section)?;
    let run = tokio::spawn(async move { migrate::migrate(&pg).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!run.is_finished(), "migrated while another held the lock");
    held.execute("SELECT pg_advisory_unlock($1)", &[&LOCK_KEY])
        .await?;
    let m = tokio::time::timeout(Duration::from_secs(10), run).await???;
    assert_eq!(m.applied.len(), MIGRATIONS.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_or_edited_schema_is_refused() -> R {
    let Some(c) = cluster("w")? else {
        return Ok(());
    };
    let pg = Pg::new(&StoreSection::postgres(c.url("w")))?;
    migrate::migrate(&pg).await?;
    let client = pg.client().await?;
    client
        .execute(
            "UPDATE warden_schema SET sha256 = 'edited' WHERE version = 1",
            &[],
        )
        .await?;
    assert!(matches!(
        migrate::check(&pg).await,
        Err(PgError::MigrationChanged { version: 1, .. })
    ));
    client
        .execute("DELETE FROM warden_schema WHERE version = 1", &[])
        .await?;
    client
        .execute(
            "INSERT INTO warden_schema (version, name, sha256) VALUES (1, 'x', $1), (999, 'future', 'x')",
            &[&hex_of(MIGRATIONS[0].sql)],
        )
        .await?;
    match migrate::migrate(&pg).await {
        Err(PgError::SchemaTooNew { found: 999, .. }) => {}
        other => panic!("a newer schema: {other:?}"),
    }
    Ok(())
}

fn hex_of(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_is_gone_fails_within_the_timeout_and_is_used_again_when_back() -> R {
    let Some(mut c) = cluster("w")? else {
        return Ok(());
    };
    let section = StoreSection {
        connect_timeout_ms: 500,
        ..StoreSection::postgres(c.url("w"))
    };
    let pg = Pg::new(&section)?;
    pg.ping().await?;
    c.stop();
    let t0 = Instant::now();
    let e = pg.ping().await.err().ok_or("pinged a stopped database")?;
    assert!(e.is_unavailable(), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    c.start()?;
    // The pooled connection died with the server: it is replaced, not handed out.
    pg.ping().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_listeners_and_a_restart_is_told_as_resync() -> R {
    let Some(mut c) = cluster("w")? else {
        return Ok(());
    };
    let pg = Pg::new(&StoreSection {
        connect_timeout_ms: 500,
        ..StoreSection::postgres(c.url("w"))
    })?;
    let listener = Listener::spawn(pg.clone(), &["warden_test"]);
    let mut rx = listener.subscribe();
    let next = async |rx: &mut tokio::sync::broadcast::Receiver<Note>| {
        tokio::time::timeout(Duration::from_secs(15), rx.recv()).await
    };
    assert_eq!(next(&mut rx).await??, Note::Resync);
    pg.client()
        .await?
        .execute("SELECT pg_notify('warden_test', 'a1')", &[])
        .await?;
    assert_eq!(
        next(&mut rx).await??,
        Note::Notify {
            channel: "warden_test".into(),
            payload: "a1".into()
        }
    );
    c.stop();
    c.start()?;
    assert_eq!(next(&mut rx).await??, Note::Resync);
    pg.client()
        .await?
        .execute("SELECT pg_notify('warden_test', 'a2')", &[])
        .await?;
    assert_eq!(
        next(&mut rx).await??,
        Note::Notify {
            channel: "warden_test".into(),
            payload: "a2".into()
        }
    );
    Ok(())
}
