//! The approval queue's contract, run against both backends (sled in a temporary directory, a
//! real PostgreSQL cluster): held once per request id, decided once (the first answer wins,
//! the loser is told what stands, also when both answer at the same moment), withdrawals,
//! bounded history, pending requests found again after a restart. And what only replicas
//! have: an answer given on one replica wakes the caller waiting on the other and reaches the
//! other's watchers, and two replicas answering at once see exactly one answer take effect.

use std::time::Duration;

use warden_approver::queue::{Holding, Queue, Resolution, ResolveError, describe, now_ms};
use warden_pgstate::StoreSection;
use warden_pgstate::cluster::TestCluster;
use warden_proto::v1 as pb;
use warden_store::Store;

type R = Result<(), Box<dyn std::error::Error>>;

fn approval(id: &str, request_id: &str) -> pb::Approval {
    pb::Approval {
        id: id.into(),
        request: Some(pb::DecideRequest {
            request_id: request_id.into(),
            ..Default::default()
        }),
        created_unix_ms: now_ms(),
        deadline_unix_ms: now_ms() + 60_000,
        ..Default::default()
    }
}

fn res(state: pb::ApprovalState, by: &str) -> Resolution {
    Resolution {
        state,
        by: by.into(),
        reason: "because".into(),
        rule: "approval.test",
    }
}

async fn held(
    q: &Queue,
    a: pb::Approval,
) -> Result<tokio::sync::watch::Receiver<pb::Approval>, Box<dyn std::error::Error>> {
    match q.hold(a).await? {
        Holding::New(rx) => Ok(rx),
        Holding::Exists(a) => Err(format!("already held: {}", a.id).into()),
    }
}

/// What every backend must do, on a fresh queue.
async fn contract(q: &Queue) -> R {
    let mut rx = held(q, approval("a1", "r1")).await?;
    held(q, approval("a2", "r2")).await?;
    // The same supervisor request is held once.
    match q.hold(approval("a1-again", "r1")).await? {
        Holding::Exists(a) => assert_eq!(a.id, "a1"),
        Holding::New(_) => panic!("a request id was held twice"),
    }
    assert_eq!(q.pending_count().await?, 2);
    let got = q
        .resolve("a1", res(pb::ApprovalState::Approved, "alice"))
        .await?;
    assert_eq!(got.answered_by, "alice");
    assert_eq!(rx.borrow_and_update().state(), pb::ApprovalState::Approved);
    match q.resolve("a1", res(pb::ApprovalState::Denied, "bob")).await {
        Err(ResolveError::AlreadyDecided(a)) => {
            assert_eq!(a.answered_by, "alice");
            assert!(describe(&a).contains("approved by alice"));
        }
        other => panic!("second answer: {other:?}"),
    }
    assert!(matches!(
        q.resolve("nope", res(pb::ApprovalState::Denied, "bob"))
            .await,
        Err(ResolveError::NotFound(_))
    ));
    assert_eq!(q.by_request("r2").await?.map(|a| a.id), Some("a2".into()));
    assert_eq!(q.by_request("").await?, None);
    let pending: Vec<String> = q.pending(10).await?.into_iter().map(|a| a.id).collect();
    assert_eq!(pending, ["a2"]);
    assert_eq!(q.history(10).await?.len(), 1);
    assert!(q.watch("a2").await?.is_some());
    assert!(
        q.watch("a1").await?.is_none(),
        "a decided request is not waited on"
    );

    // Withdrawn approvals: pending, refused and unknown requests have none to supersede.
    assert_eq!(q.supersede("a2", "gave up").await?, None);
    assert_eq!(q.supersede("nope", "gave up").await?, None);
    let w = q
        .supersede("a1", "turn cancelled")
        .await?
        .ok_or("not superseded")?;
    assert_eq!(w.state(), pb::ApprovalState::Withdrawn);
    assert_eq!(w.answered_by, "alice", "who approved is kept");
    assert!(describe(&w).contains("NOT enforced"), "{}", describe(&w));
    assert_eq!(q.supersede("a1", "again").await?, None);
    assert_eq!(
        q.get("a1").await?.map(|a| a.state()),
        Some(pb::ApprovalState::Withdrawn)
    );

    // Two answers at the same moment, twenty times: exactly one takes effect each time.
    for i in 0..20 {
        let id = format!("race-{i}");
        held(q, approval(&id, &format!("rr-{i}"))).await?;
        let (x, y) = tokio::join!(
            q.resolve(&id, res(pb::ApprovalState::Approved, "x")),
            q.resolve(&id, res(pb::ApprovalState::Denied, "y"))
        );
        let winner = match (x, y) {
            (Ok(a), Err(ResolveError::AlreadyDecided(b)))
            | (Err(ResolveError::AlreadyDecided(b)), Ok(a)) => {
                assert_eq!(a.answered_by, b.answered_by, "the loser is told who won");
                a.answered_by
            }
            other => panic!("{id}: {other:?}"),
        };
        assert_eq!(q.get(&id).await?.map(|a| a.answered_by), Some(winner));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sled_queue_keeps_the_contract_and_pending_survives_reopen() -> R {
    let dir = tempfile::tempdir()?;
    {
        let (q, pending) = Queue::open(Store::open(dir.path())?, 100)?;
        assert!(pending.is_empty());
        assert_eq!(q.backend(), "sled");
        contract(&q).await?;
    }
    let (q, pending) = Queue::open(Store::open(dir.path())?, 100)?;
    assert_eq!(
        pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    assert!(q.watch("a2").await?.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sled_history_is_bounded() -> R {
    let dir = tempfile::tempdir()?;
    let (q, _) = Queue::open(Store::open(dir.path())?, 2)?;
    bounded(&q).await
}

async fn bounded(q: &Queue) -> R {
    for i in 0..4 {
        let id = format!("h{i}");
        held(q, approval(&id, &format!("hr{i}"))).await?;
        q.resolve(&id, res(pb::ApprovalState::Denied, "x")).await?;
    }
    assert_eq!(q.history(10).await?.len(), 2);
    assert_eq!(q.get("h0").await?, None);
    assert_eq!(q.by_request("hr0").await?, None);
    Ok(())
}

async fn pg_queue(
    c: &TestCluster,
    local: &std::path::Path,
    keep: usize,
) -> Result<(Queue, Vec<pb::Approval>), Box<dyn std::error::Error>> {
    let pg = warden_pgstate::Pg::new(&StoreSection::postgres(c.url("approver")))?;
    warden_pgstate::migrate::migrate(&pg).await?;
    Ok(Queue::open_pg(Store::open(local)?, pg, keep).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_queue_keeps_the_contract_and_pending_survives_reopen() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("approver")?;
    let dir = tempfile::tempdir()?;
    {
        let (q, pending) = pg_queue(&c, &dir.path().join("a"), 100).await?;
        assert!(pending.is_empty());
        assert_eq!(q.backend(), "postgres");
        contract(&q).await?;
    }
    let (q, pending) = pg_queue(&c, &dir.path().join("b"), 100).await?;
    assert_eq!(
        pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    assert!(q.watch("a2").await?.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_history_is_bounded() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("approver")?;
    let dir = tempfile::tempdir()?;
    let (q, _) = pg_queue(&c, dir.path(), 2).await?;
    bounded(&q).await
}

/// Waits for the next event about `id` in `state`.
async fn event(
    rx: &mut tokio::sync::broadcast::Receiver<pb::Approval>,
    id: &str,
    state: pb::ApprovalState,
) -> Result<pb::Approval, Box<dyn std::error::Error>> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let a = rx.recv().await?;
            if a.id == id && a.state() == state {
                return Ok::<_, Box<dyn std::error::Error>>(a);
            }
        }
    })
    .await
    .map_err(|_| format!("no {state:?} event for {id}"))?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_see_each_others_requests_and_answers_live_and_one_answer_wins() -> R {
    let Some(c) = TestCluster::start_or_skip()? else {
        return Ok(());
    };
    c.create_db("approver")?;
    let dir = tempfile::tempdir()?;
    let (a, _) = pg_queue(&c, &dir.path().join("a"), 100).await?;
    let (b, _) = pg_queue(&c, &dir.path().join("b"), 100).await?;
    // Both listening before anything happens.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut watch_b = b.subscribe();
    let mut waiting_on_a = held(&a, approval("x1", "rx1")).await?;
    // B's watchers see the request A holds, and B can answer it.
    event(&mut watch_b, "x1", pb::ApprovalState::Pending).await?;
    assert_eq!(b.pending(10).await?.len(), 1);
    b.resolve("x1", res(pb::ApprovalState::Approved, "bob@b"))
        .await?;
    // The caller waiting on A hears B's answer.
    tokio::time::timeout(
        Duration::from_secs(10),
        waiting_on_a.wait_for(|x| x.state() != pb::ApprovalState::Pending),
    )
    .await??;
    assert_eq!(waiting_on_a.borrow().answered_by, "bob@b");
    event(&mut watch_b, "x1", pb::ApprovalState::Approved).await?;

    // A request held on A whose replica is gone is waited on from B.
    let mut watch_a = a.subscribe();
    held(&a, approval("x2", "rx2")).await?;
    let mut waiting_on_b = b.watch("x2").await?.ok_or("B does not wait on x2")?;
    a.resolve("x2", res(pb::ApprovalState::Denied, "alice@a"))
        .await?;
    tokio::time::timeout(
        Duration::from_secs(10),
        waiting_on_b.wait_for(|x| x.state() == pb::ApprovalState::Denied),
    )
    .await??;
    event(&mut watch_a, "x2", pb::ApprovalState::Denied).await?;

    // Both replicas answer the same escalation at once, twenty times: one answer each time.
    for i in 0..20 {
        let id = format!("both-{i}");
        held(&a, approval(&id, &format!("rb-{i}"))).await?;
        let (x, y) = tokio::join!(
            a.resolve(&id, res(pb::ApprovalState::Approved, "on-a")),
            b.resolve(&id, res(pb::ApprovalState::Denied, "on-b"))
        );
        match (x, y) {
            (Ok(w), Err(ResolveError::AlreadyDecided(l)))
            | (Err(ResolveError::AlreadyDecided(l)), Ok(w)) => {
                assert_eq!(
                    w.answered_by, l.answered_by,
                    "{id}: the loser is told who won"
                );
                assert_eq!(
                    a.get(&id).await?.map(|r| r.answered_by),
                    Some(w.answered_by)
                );
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    Ok(())
}
