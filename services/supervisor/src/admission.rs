//! Admission of turns: at most `limits.max_active_turns` turns run at once across all
//! conversations, and at most `limits.max_active_turns_per_principal` of one principal; the rest
//! wait and are told their place. Admission instead of failure: an admitted turn has the CPU to
//! have its permissions decided in time, instead of 200 turns competing and some permissions
//! denied for lack of time. Waiting turns are served round robin across principals, first in
//! first out within one (`fair`), and a principal at its share is passed over: one caller's
//! hanging tasks hold at most its share, and the others' turns keep running.
//!
//! The agent-start slots (`limits.max_starting_agents`, `Shared::starts`) are one more
//! `Admission`: a start waits for one the same way, so one principal's burst of new contexts holds
//! at most its share of the starts (`max_starting_agents_per_principal`).
//!
//! Must never: let a turn overtake an earlier one of the same principal, let a principal hold
//! more than its share, or keep a slot after its turn ends or its waiter gives up (a slot is an
//! RAII permit; a waiter removes itself when dropped, whether cancelled or abandoned).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fair::FairQueue;

struct State {
    cap: usize,
    /// Slots one principal may hold at once.
    share: usize,
    active: usize,
    active_by: HashMap<String, usize>,
    next_ticket: u64,
    waiting: FairQueue,
    /// Tickets given a slot whose waiter has not taken it yet.
    granted: HashSet<u64>,
}

impl State {
    fn held_by(&self, principal: &str) -> usize {
        self.active_by.get(principal).copied().unwrap_or(0)
    }

    /// Gives free slots to waiting turns, in the fair order, passing over principals at their
    /// share.
    fn dispatch(&mut self) -> bool {
        let mut any = false;
        while self.active < self.cap {
            let share = self.share;
            let active_by = &self.active_by;
            let Some((principal, ticket)) = self
                .waiting
                .pop_next(|p| active_by.get(p).copied().unwrap_or(0) < share)
            else {
                break;
            };
            self.take(&principal);
            self.granted.insert(ticket);
            any = true;
        }
        any
    }

    fn take(&mut self, principal: &str) {
        self.active += 1;
        *self.active_by.entry(principal.to_string()).or_default() += 1;
    }

    fn give_back(&mut self, principal: &str) {
        self.active = self.active.saturating_sub(1);
        if let Some(n) = self.active_by.get_mut(principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.active_by.remove(principal);
            }
        }
    }
}

/// The supervisor's turn slots.
#[derive(Clone)]
pub struct Admission {
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
}

/// A running turn's slot; dropping it lets the next waiting turn in.
pub struct Permit {
    admission: Admission,
    principal: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut s = self.admission.lock();
            s.give_back(&self.principal);
            s.dispatch();
        }
        self.admission.bump();
    }
}

/// A turn in the queue; dropped (cancelled, or its future abandoned) it leaves the queue, and a
/// slot granted to it meanwhile goes to the next.
struct Waiter<'a> {
    admission: &'a Admission,
    principal: &'a str,
    ticket: u64,
    done: bool,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        {
            let mut s = self.admission.lock();
            if !s.waiting.remove(self.principal, self.ticket) && s.granted.remove(&self.ticket) {
                s.give_back(self.principal);
            }
            s.dispatch();
        }
        self.admission.bump();
    }
}

impl Admission {
    /// `cap` slots, `share` of them for one principal at most (both at least 1).
    pub fn new(cap: usize, share: usize) -> Self {
        let (tx, _) = watch::channel(0);
        let cap = cap.max(1);
        Admission {
            state: Arc::new(Mutex::new(State {
                cap,
                share: share.clamp(1, cap),
                active: 0,
                active_by: HashMap::new(),
                next_ticket: 0,
                waiting: FairQueue::default(),
                granted: HashSet::new(),
            })),
            changed: Arc::new(tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// (running, waiting, cap), for status.
    pub fn figures(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (s.active, s.waiting.len(), s.cap)
    }

    /// The slots one principal may hold.
    pub fn share(&self) -> usize {
        self.lock().share
    }

    /// Principals with turns waiting for a slot (for status).
    pub fn principals_waiting(&self) -> usize {
        self.lock().waiting.principals()
    }

    /// Slots `principal` holds now.
    pub fn held_by(&self, principal: &str) -> usize {
        self.lock().held_by(principal)
    }

    /// A slot for `principal` only when one is free now and nobody waits (the warm-agent pool:
    /// conversations never wait behind it).
    pub fn try_admit(&self, principal: &str) -> Option<Permit> {
        let mut s = self.lock();
        if !(s.waiting.is_empty() && s.active < s.cap && s.held_by(principal) < s.share) {
            return None;
        }
        s.take(principal);
        Some(Permit {
            admission: self.clone(),
            principal: principal.to_string(),
        })
    }

    /// Waits for a slot for one of `principal`'s turns, in the fair order. `queued(position)`
    /// is called whenever the turn's 1-based place changes (not at all when a slot is free at
    /// once). `None` when `cancel` fires first (the turn leaves the queue).
    pub async fn admit(
        &self,
        principal: &str,
        cancel: &CancellationToken,
        mut queued: impl FnMut(usize),
    ) -> Option<Permit> {
        let mut waiter = {
            let mut s = self.lock();
            if s.waiting.is_empty() && s.active < s.cap && s.held_by(principal) < s.share {
                s.take(principal);
                return Some(Permit {
                    admission: self.clone(),
                    principal: principal.to_string(),
                });
            }
            let t = s.next_ticket;
            s.next_ticket += 1;
            s.waiting.push(principal, t);
            // A free slot may be this turn's now (another principal waits at its share).
            s.dispatch();
            Waiter {
                admission: self,
                principal,
                ticket: t,
                done: false,
            }
        };
        self.bump();
        let mut told = 0usize;
        let mut again = tokio::time::Instant::now() + crate::fair::REANNOUNCE;
        loop {
            let mut rx = self.changed.subscribe();
            let pos = {
                let mut s = self.lock();
                if s.granted.remove(&waiter.ticket) {
                    waiter.done = true;
                    return Some(Permit {
                        admission: self.clone(),
                        principal: principal.to_string(),
                    });
                }
                s.waiting.position(principal, waiter.ticket)
            };
            if let Some(p) = pos
                && (p != told || tokio::time::Instant::now() >= again)
            {
                told = p;
                again = tokio::time::Instant::now() + crate::fair::REANNOUNCE;
                queued(p);
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(again) => {}
                // The waiter's drop leaves the queue.
                _ = cancel.cancelled() => return None,
            }
        }
    }
}

/// The default number of turns running at once: sixteen per core. Most of a real turn is
/// waiting for the model; what needs the CPU is the permission path (~0.4 ms of CPU per
/// decision across supervisor and policy), so a core carries many turns — but not the 100 per
/// core at which permissions were measured being denied for lack of time.
pub fn default_cap() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 16)
        .unwrap_or(32)
}

/// The default share of one principal: three quarters of what can run at once — the turn
/// slots, or the live agents when there are fewer (every running turn holds one) — at least 1,
/// so a quarter is left for everyone else.
pub fn default_share(turn_cap: usize, live_cap: usize) -> usize {
    (turn_cap.min(live_cap) * 3 / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Waits until `a` has `n` turns waiting.
    async fn waiting(a: &Admission, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while a.figures().1 < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the turns queued");
    }

    /// Queues a turn of `principal` named `name`; its admission (and the permit, held until the
    /// test drops it) is reported on `tx` as `(name, 0)`, its places as `(name, position)`.
    fn queue(
        a: &Admission,
        principal: &'static str,
        name: &'static str,
        tx: &tokio::sync::mpsc::UnboundedSender<(&'static str, usize)>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<Option<Permit>> {
        let a = a.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let p = a
                .admit(principal, &cancel, |pos| {
                    let _ = tx.send((name, pos));
                })
                .await;
            if p.is_some() {
                let _ = tx.send((name, 0));
            }
            p
        })
    }

    #[tokio::test]
    async fn turns_beyond_the_cap_wait_in_order_and_are_told_their_place() {
        let a = Admission::new(1, 1);
        let never = CancellationToken::new();
        let first = a
            .admit("p", &never, |_| panic!("the first turn waits"))
            .await
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let b = queue(&a, "p", "b", &tx, never.clone());
        waiting(&a, 1).await;
        let c = queue(&a, "p", "c", &tx, never.clone());
        waiting(&a, 2).await;
        assert_eq!(rx.recv().await, Some(("b", 1)));
        assert_eq!(rx.recv().await, Some(("c", 2)));
        drop(first);
        // b is admitted (0 = admitted), then c moves up to the front.
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.push(rx.recv().await.unwrap());
        }
        assert!(
            seen.contains(&("b", 0)) && seen.contains(&("c", 1)),
            "{seen:?}"
        );
        assert_eq!(a.figures(), (1, 1, 1));
        drop(b.await.unwrap());
        assert!(c.await.unwrap().is_some());
    }

    #[tokio::test]
    async fn principals_are_admitted_in_turn_not_in_arrival_order() {
        let a = Admission::new(1, 1);
        let never = CancellationToken::new();
        let first = a.admit("alice", &never, |_| {}).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut held = Vec::new();
        for (i, name) in ["a1", "a2", "a3"].into_iter().enumerate() {
            held.push(queue(&a, "alice", name, &tx, never.clone()));
            waiting(&a, i + 1).await;
        }
        held.push(queue(&a, "bob", "b1", &tx, never.clone()));
        waiting(&a, 4).await;
        // bob's one turn is second in line, not fourth.
        // The last place each was told: bob's arrival moved alice's second back by one.
        let mut places = std::collections::HashMap::new();
        while places.get("b1") != Some(&2)
            || places.get("a2") != Some(&3)
            || places.get("a3") != Some(&4)
        {
            let (n, p) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap_or_else(|_| panic!("places so far: {places:?}"))
                .unwrap();
            places.insert(n, p);
        }
        // Admitted one at a time: a1, then bob, then alice's others in her order.
        let mut order = Vec::new();
        drop(first);
        let mut handles: std::collections::HashMap<&str, _> =
            ["a1", "a2", "a3", "b1"].into_iter().zip(held).collect();
        while order.len() < 4 {
            let (n, p) = rx.recv().await.unwrap();
            if p == 0 {
                order.push(n);
                // Running and done: its slot goes to the next.
                drop(handles.remove(n).unwrap().await.unwrap());
            }
        }
        assert_eq!(order, vec!["a1", "b1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn one_principal_holds_at_most_its_share() {
        let a = Admission::new(4, 3);
        let never = CancellationToken::new();
        let mut alice = Vec::new();
        for _ in 0..3 {
            alice.push(a.admit("alice", &never, |_| {}).await.unwrap());
        }
        // Her fourth waits although a slot is free...
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let a4 = queue(&a, "alice", "a4", &tx, never.clone());
        waiting(&a, 1).await;
        assert_eq!(rx.recv().await, Some(("a4", 1)));
        assert_eq!(a.figures(), (3, 1, 4));
        // ...and bob's takes that slot at once, behind nobody.
        let bob = tokio::time::timeout(
            Duration::from_secs(5),
            a.admit("bob", &never, |p| panic!("bob waited at {p}")),
        )
        .await
        .expect("bob is admitted at once")
        .unwrap();
        assert_eq!(a.held_by("alice"), 3);
        assert_eq!(a.held_by("bob"), 1);
        // One of alice's ends: her fourth runs.
        drop(alice.pop());
        let a4 = a4.await.unwrap();
        assert!(a4.is_some());
        assert_eq!(a.held_by("alice"), 3);
        drop(a4);
        drop(bob);
        assert_eq!(a.figures(), (2, 0, 4));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_crowd_of_one_principals_turns_never_holds_more_than_its_share() {
        let a = Admission::new(8, 6);
        let never = CancellationToken::new();
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64 {
            let (a, never, peak) = (a.clone(), never.clone(), peak.clone());
            let who = if i % 8 == 0 { "bob" } else { "alice" };
            set.spawn(async move {
                let p = a.admit(who, &never, |_| {}).await.unwrap();
                peak.fetch_max(a.held_by("alice"), std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(p);
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 6);
        assert_eq!(a.figures(), (0, 0, 8));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let a = Admission::new(1, 1);
        let never = CancellationToken::new();
        let held = a.admit("p", &never, |_| {}).await.unwrap();
        let cancel = CancellationToken::new();
        let waiter = {
            let a = a.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move { a.admit("p", &cancel, |_| {}).await.is_none() })
        };
        waiting(&a, 1).await;
        cancel.cancel();
        assert!(waiter.await.unwrap());
        assert_eq!(a.figures(), (1, 0, 1));
        // The slot goes to nobody once the holder is done: nothing leaked either way.
        drop(held);
        assert_eq!(a.figures(), (0, 0, 1));
    }

    #[tokio::test]
    async fn an_abandoned_waiter_gives_back_a_slot_granted_to_it() {
        let a = Admission::new(1, 1);
        let never = CancellationToken::new();
        let held = a.admit("p", &never, |_| {}).await.unwrap();
        let waiter = {
            let a = a.clone();
            let never = never.clone();
            tokio::spawn(async move { a.admit("q", &never, |_| {}).await })
        };
        waiting(&a, 1).await;
        // Granted under the lock when `held` goes, then the waiter's task is aborted before it
        // looked: the slot must come back.
        waiter.abort();
        drop(held);
        let _ = waiter.await;
        assert_eq!(a.figures(), (0, 0, 1));
        assert!(a.admit("r", &never, |_| panic!("free")).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_turn_is_told_its_place_again_while_it_waits() {
        let a = Admission::new(1, 1);
        let never = CancellationToken::new();
        let _held = a.admit("p", &never, |_| {}).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _w = queue(&a, "q", "w", &tx, never.clone());
        assert_eq!(rx.recv().await, Some(("w", 1)));
        // Unchanged, but said again within REANNOUNCE (the clock is paused: it advances only
        // when every task waits).
        let t0 = tokio::time::Instant::now();
        assert_eq!(rx.recv().await, Some(("w", 1)));
        assert!(t0.elapsed() <= crate::fair::REANNOUNCE + Duration::from_millis(1));
    }

    #[test]
    fn the_default_share_leaves_a_quarter() {
        assert_eq!(default_share(32, 80), 24);
        assert_eq!(default_share(32, 2), 1);
        assert_eq!(default_share(1, 1), 1);
    }
}
