//! The promises of [`TaskBackend`], held by the same tests against both backends (PostgreSQL
//! from a real cluster the test starts; printed SKIP where its binaries are missing, outside
//! CI).

use crate::a2a::{Artifact, Message, Part, Role, Task, TaskPushNotificationConfig};
use crate::a2a::{TaskState, TaskStatus};
use crate::store::*;
use crate::store_sled::SledStore;
use std::sync::Arc;

fn record(id: &str, principal: &str, ctx: &str, state: TaskState, at: i64) -> TaskRecord {
    TaskRecord {
        task: Task {
            id: id.into(),
            context_id: ctx.into(),
            status: TaskStatus {
                state,
                message: None,
                timestamp: None,
            },
            artifacts: vec![],
            history: vec![],
            metadata: None,
        },
        principal: principal.into(),
        agent: "scripted".into(),
        created_micros: at,
        status_micros: at,
    }
}

fn user(task: &str, text: &str) -> Message {
    Message {
        message_id: format!("m-{text}"),
        context_id: Some("ctx".into()),
        task_id: Some(task.into()),
        role: Role::User,
        // A NUL and a non-ASCII character: stored as given.
        parts: vec![Part::text(format!("{text}\u{0}é"))],
        metadata: None,
        extensions: vec![],
        reference_task_ids: vec![],
    }
}

fn chunk(id: &str, text: &str, append: bool) -> ArtifactChunk {
    ArtifactChunk {
        artifact: Artifact {
            artifact_id: id.into(),
            name: Some("answer".into()),
            description: None,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: vec![],
        },
        append,
    }
}

fn ctx(principal: &str, at: i64) -> ContextRecord {
    ContextRecord {
        principal: principal.into(),
        agent: "scripted".into(),
        created_micros: at,
        last_task_micros: at,
        closed_micros: None,
    }
}

async fn tasks_read_back_whole(s: &TaskStore) -> Result<(), Box<dyn std::error::Error>> {
    s.put_head(&record("t1", "alice", "ctx", TaskState::Working, 10))
        .await?;
    s.put_history_segment("t1", 0, &[user("t1", "a")]).await?;
    s.put_history_segment("t1", 1, &[user("t1", "b"), user("t1", "c")])
        .await?;
    s.put_artifact_chunks(
        "t1",
        &[
            (0, 0, chunk("a", "Hel", false)),
            (0, 1, chunk("a", "lo", true)),
        ],
    )
    .await?;
    s.put_artifact_chunks("t1", &[(1, 0, chunk("b", "note", false))])
        .await?;
    s.flush().await?;
    let (task, rec) = s.load("t1").await?.ok_or("t1 missing")?;
    assert_eq!(rec.principal, "alice");
    let texts: Vec<String> = task.history.iter().map(|m| m.prompt_text()).collect();
    assert_eq!(texts, vec!["a\u{0}é", "b\u{0}é", "c\u{0}é"]);
    assert_eq!(task.artifacts.len(), 2);
    assert_eq!(task.artifacts[0].parts, vec![Part::text("Hello")]);
    assert_eq!(task.artifacts[1].parts, vec![Part::text("note")]);
    assert!(s.load("t2").await?.is_none());
    // Only the principal's own heads are listed.
    s.put_head(&record("t2", "bob", "ctx-b", TaskState::Completed, 11))
        .await?;
    let mine: Vec<String> = s
        .heads_of("alice")
        .await?
        .into_iter()
        .map(|h| h.task.id)
        .collect();
    assert_eq!(mine, vec!["t1"]);
    assert_eq!(s.task_count().await?, 2);
    Ok(())
}

async fn a_context_has_one_principal(s: &TaskStore) -> Result<(), Box<dyn std::error::Error>> {
    let first = s.claim_context("c", &ctx("alice", 1)).await?;
    assert_eq!(first, ctx("alice", 1));
    // Bob's claim leaves Alice's context alone and is told whose it is.
    let other = s.claim_context("c", &ctx("bob", 2)).await?;
    assert_eq!(other.principal, "alice");
    assert_eq!(other.last_task_micros, 1);
    // Alice's next task marks it in use again and reopens it.
    let mut closed = first.clone();
    closed.closed_micros = Some(5);
    s.put_context("c", &closed).await?;
    let again = s.claim_context("c", &ctx("alice", 9)).await?;
    assert_eq!((again.last_task_micros, again.closed_micros), (9, None));
    assert_eq!(again.created_micros, 1);
    // Forgotten only as it was seen.
    assert!(!s.forget_context("c", &first).await?);
    assert!(s.forget_context("c", &again).await?);
    assert!(s.context("c").await?.is_none());
    Ok(())
}

async fn deletes_spare_neighbours(s: &TaskStore) -> Result<(), Box<dyn std::error::Error>> {
    for id in ["d1", "d10"] {
        s.put_head(&record(id, "alice", "ctx", TaskState::Completed, 1))
            .await?;
        s.put_history_segment(id, 0, &[user(id, "hi")]).await?;
        s.put_artifact_chunks(id, &[(0, 0, chunk("a", "x", false))])
            .await?;
        s.put_push(&PushRecord {
            principal: "alice".into(),
            config: TaskPushNotificationConfig {
                tenant: None,
                id: "p1".into(),
                task_id: id.into(),
                url: "https://example.org/hook".into(),
                token: None,
                authentication: None,
            },
            created_micros: 1,
        })
        .await?;
    }
    assert_eq!(s.push_configs("d1").await?.len(), 1);
    assert!(s.push_config("d1", "p1").await?.is_some());
    s.delete_tasks(&["d1"]).await?;
    assert!(s.load("d1").await?.is_none());
    assert!(s.history("d1").await?.is_empty());
    assert!(s.artifacts("d1").await?.is_empty());
    assert!(s.push_configs("d1").await?.is_empty());
    let (d10, _) = s.load("d10").await?.ok_or("d10 went too")?;
    assert_eq!((d10.history.len(), d10.artifacts.len()), (1, 1));
    assert!(s.delete_push("d10", "p1").await?);
    assert!(!s.delete_push("d10", "p1").await?);
    Ok(())
}

async fn retention_counts_per_principal(s: &TaskStore) -> Result<(), Box<dyn std::error::Error>> {
    // Alice: 5 finished (at 1..=5), one running (at 0, the oldest); Bob: 2 finished.
    for i in 1..=5 {
        s.put_head(&record(
            &format!("a{i}"),
            "alice",
            "ca",
            TaskState::Completed,
            i,
        ))
        .await?;
    }
    s.put_head(&record("arun", "alice", "cr", TaskState::Working, 0))
        .await?;
    s.put_head(&record("b1", "bob", "cb", TaskState::Failed, 1))
        .await?;
    s.put_head(&record("b2", "bob", "cb", TaskState::Completed, 2))
        .await?;
    // Nothing expired (cutoff 0), at most 3 each: Alice's three oldest finished go (the
    // running one counts but stays), Bob keeps both.
    let p = s.prune(0, 3).await?;
    assert_eq!(p.deleted, 3);
    let mut left: Vec<String> = s
        .heads_of("alice")
        .await?
        .into_iter()
        .map(|h| h.task.id)
        .collect();
    left.sort();
    assert_eq!(left, vec!["a4", "a5", "arun"]);
    assert_eq!(s.heads_of("bob").await?.len(), 2);
    assert_eq!(
        p.contexts.get("cr"),
        Some(&ContextUsage {
            count: 1,
            busy: true,
            last_status_micros: 0
        })
    );
    assert_eq!(
        p.contexts.get("ca").map(|c| (c.count, c.busy)),
        Some((2, false))
    );
    // Expired: everything finished before 5 goes, whatever the count.
    let p = s.prune(5, 100).await?;
    assert_eq!(p.deleted, 3, "a4, b1, b2");
    assert!(
        s.head("arun").await?.is_some(),
        "a running task is never deleted"
    );
    assert!(s.head("a5").await?.is_some());
    Ok(())
}

async fn run_all(s: TaskStore) -> Result<(), Box<dyn std::error::Error>> {
    tasks_read_back_whole(&s).await?;
    a_context_has_one_principal(&s).await?;
    deletes_spare_neighbours(&s).await?;
    s.delete_tasks(&["t1", "t2", "d10"]).await?;
    retention_counts_per_principal(&s).await?;
    Ok(())
}

#[tokio::test]
async fn sled_keeps_the_contract() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    run_all(Arc::new(SledStore::open(dir.path())?)).await
}

fn cluster() -> Option<warden_pgstate::cluster::TestCluster> {
    let c = warden_pgstate::cluster::TestCluster::start_or_skip()
        .unwrap_or_else(|e| panic!("PostgreSQL: {e}"))?;
    c.create_db("warden")
        .unwrap_or_else(|e| panic!("createdb: {e}"));
    Some(c)
}

async fn pg_store(
    c: &warden_pgstate::cluster::TestCluster,
) -> Result<crate::store_pg::PgStore, Box<dyn std::error::Error>> {
    let pg = warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(c.url("warden")))?;
    warden_pgstate::migrate::migrate(&pg).await?;
    Ok(crate::store_pg::PgStore::new(pg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() -> Result<(), Box<dyn std::error::Error>> {
    let Some(c) = cluster() else { return Ok(()) };
    run_all(Arc::new(pg_store(&c).await?)).await
}

/// `max_tasks` counts a principal's tasks on every replica: A's and B's together, the
/// oldest finished ones going first whoever wrote them, from a sweep on either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_max_tasks_counts_every_replicas_tasks() -> Result<(), Box<dyn std::error::Error>>
{
    let Some(c) = cluster() else { return Ok(()) };
    let a = pg_store(&c).await?;
    let b = pg_store(&c).await?;
    for i in 0..3 {
        a.put_head(&record(
            &format!("a{i}"),
            "alice",
            "ca",
            TaskState::Completed,
            2 * i,
        ))
        .await?;
        b.put_head(&record(
            &format!("b{i}"),
            "alice",
            "cb",
            TaskState::Completed,
            2 * i + 1,
        ))
        .await?;
    }
    b.put_head(&record("bob", "bob", "cc", TaskState::Completed, 0))
        .await?;
    // Four of Alice's six stay: a0 (0) and b0 (1) go, from A's sweep.
    assert_eq!(a.prune(0, 4).await?.deleted, 2);
    let mut left: Vec<String> = b
        .heads_of("alice")
        .await?
        .into_iter()
        .map(|h| h.task.id)
        .collect();
    left.sort();
    assert_eq!(left, vec!["a1", "a2", "b1", "b2"]);
    assert!(b.head("bob").await?.is_some(), "Bob's count is his own");
    // The same sweep on B finds nothing more to do.
    assert_eq!(b.prune(0, 4).await?.deleted, 0);
    Ok(())
}

/// A takeover: once A's lease ran out, exactly one claim wins (B's), A's renewal is told
/// the task is no longer its own, and every later write of A (head, history, artifacts) is
/// ignored, while B's land; B's reset forgets what A wrote of the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_takeover_has_one_winner_and_silences_the_old_follower()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(c) = cluster() else { return Ok(()) };
    let a = pg_store(&c).await?;
    let b = pg_store(&c).await?;
    let b2 = pg_store(&c).await?;
    a.put_head(&record("t", "alice", "c", TaskState::Working, 1))
        .await?;
    a.put_history_segment("t", 0, &[user("t", "q")]).await?;
    a.put_history_segment("t", 1, &[user("t", "a-1")]).await?;
    a.put_artifact_chunks("t", &[(0, 0, chunk("x", "from a", false))])
        .await?;
    assert!(!b.claim_orphan("t").await?, "the lease is fresh");
    tokio::time::sleep(crate::store_pg::LEASE + std::time::Duration::from_millis(300)).await;
    assert_eq!(b.orphans().await?.len(), 1);
    let (w1, w2) = tokio::join!(b.claim_orphan("t"), b2.claim_orphan("t"));
    let (w1, w2) = (w1?, w2?);
    assert!(w1 ^ w2, "exactly one claim wins");
    let (winner, loser) = if w1 { (&b, &b2) } else { (&b2, &b) };
    assert!(winner.orphans().await?.is_empty() && loser.orphans().await?.is_empty());
    assert!(!loser.claim_orphan("t").await?);
    assert_eq!(
        a.renew_leases(&["t".to_string()]).await?,
        vec!["t".to_string()]
    );
    // A's late writes change nothing.
    a.put_head(&record("t", "alice", "c", TaskState::Completed, 2))
        .await?;
    a.put_history_segment("t", 2, &[user("t", "a-2")]).await?;
    a.put_artifact_chunks("t", &[(0, 1, chunk("x", " more from a", true))])
        .await?;
    let (t, _) = winner.load("t").await?.ok_or("gone")?;
    assert_eq!(t.status.state, TaskState::Working);
    assert_eq!(t.history.len(), 2);
    assert_eq!(t.artifacts[0].parts, vec![Part::text("from a")]);
    // The winner starts over from the turn's first event and its writes land.
    winner.reset_progress("t").await?;
    let (t, _) = winner.load("t").await?.ok_or("gone")?;
    assert_eq!(
        (t.history.len(), t.artifacts.len()),
        (1, 0),
        "the caller's message stays"
    );
    winner
        .put_artifact_chunks("t", &[(0, 0, chunk("x", "from b", false))])
        .await?;
    winner
        .put_head(&record("t", "alice", "c", TaskState::Completed, 3))
        .await?;
    let (t, _) = a.load("t").await?.ok_or("gone")?;
    assert_eq!(t.status.state, TaskState::Completed);
    assert_eq!(t.artifacts[0].parts, vec![Part::text("from b")]);
    Ok(())
}

/// Two replicas on one database: a task one follows is not taken for an orphan by the
/// other while its lease is renewed; once it runs out (the follower died), the other ends
/// it FAILED, once, and a late write of the dead follower cannot bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fails_only_tasks_whose_follower_stopped() -> Result<(), Box<dyn std::error::Error>>
{
    let Some(c) = cluster() else { return Ok(()) };
    let a = pg_store(&c).await?;
    let b = pg_store(&c).await?;
    let mut notes = b.changes().ok_or("no notes")?;
    // B listens (its first note says so: anything may have changed before).
    let listening = tokio::time::timeout(std::time::Duration::from_secs(5), notes.recv()).await;
    assert!(
        matches!(listening, Ok(Ok(ref s)) if s.is_empty()),
        "{listening:?}"
    );
    a.put_head(&record("live", "alice", "c", TaskState::Working, 1))
        .await?;
    // B hears of A's write.
    let heard = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            if let Ok(id) = notes.recv().await
                && id == "live"
            {
                return;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "B was not told of A's write");
    assert!(b.recover().await?.is_empty(), "the lease is fresh");
    a.renew_leases(&["live".to_string()]).await?;
    assert!(b.recover().await?.is_empty());
    // A stops renewing: past the lease, B ends the task.
    tokio::time::sleep(crate::store_pg::LEASE + std::time::Duration::from_millis(300)).await;
    assert!(
        a.recover().await?.is_empty(),
        "a replica never takes its own tasks"
    );
    let failed = b.recover().await?;
    assert_eq!(failed.len(), 1);
    assert!(b.recover().await?.is_empty(), "once");
    let (t, _) = b.load("live").await?.ok_or("gone")?;
    assert_eq!(t.status.state, TaskState::Failed);
    assert!(
        t.history
            .last()
            .is_some_and(|m| m.prompt_text().contains("stopped"))
    );
    // The dead follower's late write does not undo the end.
    a.put_head(&record("live", "alice", "c", TaskState::Working, 2))
        .await?;
    assert_eq!(
        a.renew_leases(&["live".to_string()]).await?,
        Vec::<String>::new(),
        "ended: nothing to renew, nothing taken"
    );
    assert_eq!(
        b.head("live").await?.ok_or("gone")?.task.status.state,
        TaskState::Failed
    );
    Ok(())
}
