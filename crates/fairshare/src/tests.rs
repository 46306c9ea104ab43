//! The scheduler's promises, counted in work units rather than timed: one principal's many
//! futures get about the poll time of another's one; a principal waiting on I/O holds nobody
//! back; idleness buys no burst; dropped and stale futures leave nothing behind.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// About `micros` of CPU inside one poll.
fn burn(micros: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(micros) {
        std::hint::spin_loop();
    }
}

/// `units` units of work, yielding between them; each unit counted in `done`.
async fn work(units: usize, micros: u64, done: Arc<AtomicUsize>) {
    for _ in 0..units {
        burn(micros);
        done.fetch_add(1, Relaxed);
        tokio::task::yield_now().await;
    }
}

/// How many units bob's 100 futures do while alice does 50 of the same size, with or without
/// the scheduler. One runtime thread, so the count is what the scheduler chose.
async fn flood(fair: bool) -> usize {
    let sched = Scheduler::new();
    let bob = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut floods = Vec::new();
    for _ in 0..100 {
        let (bob, stop) = (bob.clone(), stop.clone());
        let f = async move {
            while !stop.load(Relaxed) {
                burn(100);
                bob.fetch_add(1, Relaxed);
                tokio::task::yield_now().await;
            }
        };
        floods.push(if fair {
            tokio::spawn(sched.fair("bob", f).boxed_send())
        } else {
            tokio::spawn(Box::pin(f) as Pin<Box<dyn Future<Output = ()> + Send>>)
        });
    }
    tokio::task::yield_now().await;
    let alice = Arc::new(AtomicUsize::new(0));
    let before = bob.load(Relaxed);
    let a = work(50, 100, alice.clone());
    if fair {
        tokio::spawn(sched.fair("alice", a)).await.ok();
    } else {
        tokio::spawn(a).await.ok();
    }
    let during = bob.load(Relaxed) - before;
    stop.store(true, Relaxed);
    for f in floods {
        f.await.ok();
    }
    assert_eq!(alice.load(Relaxed), 50);
    assert!(sched.shares().is_empty(), "{:?}", sched.shares());
    during
}

trait BoxSend: Future<Output = ()> + Send + Sized + 'static {
    fn boxed_send(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self)
    }
}
impl<F: Future<Output = ()> + Send + 'static> BoxSend for F {}

#[tokio::test(flavor = "current_thread")]
async fn many_futures_of_one_principal_get_the_share_of_one() {
    let unfair = flood(false).await;
    let fair = flood(true).await;
    eprintln!("bob's units during alice's 50: unshared {unfair}, shared {fair}");
    // Unshared, bob's 100 futures each run once per alice unit: ~5,000 units. Shared, bob's
    // poll time tracks alice's: ~50 units, a quantum's worth more at most (2 ms / 100 µs).
    assert!(
        unfair > 1_000,
        "unshared: bob did {unfair} units during alice's 50"
    );
    assert!(
        fair < 400,
        "shared: bob did {fair} units during alice's 50 (unshared: {unfair})"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_principal_waiting_on_io_holds_nobody_back() {
    let sched = Scheduler::new();
    // alice's future waits on a channel that is never written while it is alive.
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    let waiting = tokio::spawn(sched.fair("alice", async move {
        let _ = rx.await;
    }));
    tokio::task::yield_now().await;
    let done = Arc::new(AtomicUsize::new(0));
    let bob: Vec<_> = (0..10)
        .map(|_| tokio::spawn(sched.fair("bob", work(100, 50, done.clone()))))
        .collect();
    let all = async {
        for b in bob {
            b.await.ok();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("bob's work finishes while alice only waits");
    assert_eq!(done.load(Relaxed), 1_000);
    waiting.abort();
    let _ = waiting.await;
    assert!(sched.shares().is_empty(), "{:?}", sched.shares());
}

#[tokio::test(flavor = "current_thread")]
async fn idleness_buys_no_burst() {
    let sched = Scheduler::new();
    // bob works alone for a while; alice's entry is created later (or was idle).
    let bob = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let floods: Vec<_> = (0..10)
        .map(|_| {
            let (bob, stop) = (bob.clone(), stop.clone());
            tokio::spawn(sched.fair("bob", async move {
                while !stop.load(Relaxed) {
                    burn(100);
                    bob.fetch_add(1, Relaxed);
                    tokio::task::yield_now().await;
                }
            }))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = bob.load(Relaxed);
    let alice = Arc::new(AtomicUsize::new(0));
    tokio::spawn(sched.fair("alice", work(100, 100, alice.clone())))
        .await
        .ok();
    let during = bob.load(Relaxed) - before;
    stop.store(true, Relaxed);
    for f in floods {
        f.await.ok();
    }
    // Had alice's entry started at 0 while bob's stood at ~100 ms, bob would have done nothing
    // during her 10 ms. Started near the clock (a lead of 5 quanta, 10 ms), they alternate
    // after her lead: bob does at least a few units.
    assert!(during >= 10, "bob did {during} units during alice's 100");
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_and_parked_futures_leave_nothing_behind() {
    let sched = Scheduler::with_quantum(Duration::from_micros(50));
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for p in ["alice", "bob", "carol"] {
        for _ in 0..20 {
            let stop = stop.clone();
            hs.push(tokio::spawn(sched.fair(p, async move {
                while !stop.load(Relaxed) {
                    burn(20);
                    tokio::task::yield_now().await;
                }
            })));
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Some are parked now; abort them all mid-flight.
    for h in &hs {
        h.abort();
    }
    for h in hs {
        let _ = h.await;
    }
    // Parked wakers of dropped futures are drained by the next look (the watcher's).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sched.shares().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sched.shares().is_empty(), "{:?}", sched.shares());
    assert_eq!(sched.parked(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_ready_future_nobody_polls_does_not_hold_the_others_forever() {
    let sched = Scheduler::new();
    // alice's future is woken (counted ready) but its owner never polls it again: a principal
    // that could otherwise stop everyone else by never being served.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut stuck = Box::pin(sched.fair("alice", async move {
        let _ = rx.await;
    }));
    let noop = Waker::noop();
    assert!(
        stuck
            .as_mut()
            .poll(&mut Context::from_waker(noop))
            .is_pending()
    );
    tx.send(()).ok();
    // bob runs well past a quantum ahead of alice's virtual time.
    let done = Arc::new(AtomicUsize::new(0));
    let bob: Vec<_> = (0..4)
        .map(|_| tokio::spawn(sched.fair("bob", work(200, 100, done.clone()))))
        .collect();
    let all = async {
        for b in bob {
            b.await.ok();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("bob finishes though alice's ready future is never polled");
    assert_eq!(done.load(Relaxed), 800);
    drop(stuck);
    assert!(sched.shares().is_empty(), "{:?}", sched.shares());
}

#[test]
fn the_watcher_ends_with_its_scheduler() {
    let sched = Scheduler::new();
    let weak = Arc::downgrade(&sched);
    drop(sched);
    // The watcher holds it for one look at a time, at most a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    while weak.upgrade().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(weak.upgrade().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_future_woken_in_its_last_poll_leaves_no_ready_count() {
    let sched = Scheduler::new();
    // Woken during the poll that completes it (a channel sent to and read in one poll does
    // this): left counted ready, its principal would hold every other one back.
    sched
        .fair(
            "alice",
            std::future::poll_fn(|cx| {
                cx.waker().wake_by_ref();
                Poll::Ready(())
            }),
        )
        .await;
    assert!(sched.shares().is_empty(), "{:?}", sched.shares());
}
