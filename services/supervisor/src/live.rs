//! How many agents are alive at once, exactly: every agent start takes a slot first (held by the
//! running agent and given back when it is dropped, however it ends), and at the cap an idle
//! agent is asked to stop to make room. A start that finds every live agent busy waits for one:
//! a conversation's open does not wait (it opens without an agent, like an idle-stopped one, and
//! its first turn starts it), a turn's start waits in a bounded queue
//! (`limits.max_agent_waiters`), served round robin across principals and first in first out
//! within one (`fair`), told its place, for at most `limits.capacity_wait_ms`; only a full queue
//! or a wait that passes refuses it (fault `capacity`).
//!
//! Who makes room, first to last: a warm agent of the pool (no conversation yet, ready or still
//! starting), the least recently used idle agent, and — for a turn's start only — the least
//! recently used agent whose conversation has a turn waiting for a turn slot (`set_waiting`): a
//! turn that holds a turn slot and waits for an agent must never wait for an agent that itself
//! waits for a turn slot (that would be a deadlock between the two limits). Every agent that is
//! busy holds a turn slot and is running (or starting, which ends within the handshake
//! deadline), so a waiting start always gets the next agent a turn gives back.
//!
//! Warm agents only ever take a slot that is free with nobody waiting for one
//! ([`LiveAgents::try_acquire_spare`]), so a pool never starves a conversation.
//!
//! Must never: count a slot twice or lose one (a slot is an RAII guard; a waiter that gives up
//! gives back a slot granted to it meanwhile), stop a busy agent, let a start overtake an
//! earlier one of the same principal, or block while holding its lock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fair::FairQueue;

struct Entry {
    busy: bool,
    /// Idle, with a turn waiting for a turn slot: stopped only to make room for a turn's start.
    waiting_turn: bool,
    last_used: Instant,
    /// Cancelled to ask this conversation's worker to stop its idle agent.
    evict: CancellationToken,
    evicting: bool,
    /// A warm agent of the pool (no conversation yet): asked to make room first.
    pooled: bool,
}

impl Entry {
    fn started() -> Self {
        Entry {
            busy: true,
            waiting_turn: false,
            last_used: Instant::now(),
            evict: CancellationToken::new(),
            evicting: false,
            pooled: false,
        }
    }
}

/// Who may be asked to make room.
#[derive(Clone, Copy, PartialEq, Eq)]
enum For {
    Open,
    Turn,
}

struct Inner {
    cap: usize,
    entries: HashMap<String, Entry>,
    /// Turn starts waiting for a slot, fairly ordered; their context ids by ticket.
    queue: FairQueue,
    queued: HashMap<u64, String>,
    /// Tickets given a slot (its entry made) whose waiter has not taken it yet.
    granted: HashSet<u64>,
    next_ticket: u64,
    max_waiters: usize,
    /// Opens waiting for an idle agent they asked to stop: while any waits, the pool takes none.
    opening: usize,
}

impl Inner {
    fn insert(&mut self, context_id: &str) {
        self.entries
            .insert(context_id.to_string(), Entry::started());
    }

    /// Asks the next agent in the order of the module doc to stop; false when none may.
    fn evict_one(&mut self, why: For, for_context: &str) -> bool {
        let victim = self
            .entries
            .iter_mut()
            .filter(|(_, e)| {
                !e.evicting && (e.pooled || (!e.busy && (!e.waiting_turn || why == For::Turn)))
            })
            .min_by_key(|(_, e)| (!e.pooled, e.waiting_turn, e.last_used));
        match victim {
            Some((id, e)) => {
                tracing::info!(context_id = %id, for_context = %for_context, "live agents at the limit: stopping the least recently used idle one");
                e.evicting = true;
                e.evict.cancel();
                true
            }
            None => false,
        }
    }

    /// Gives free slots to waiting turn starts in the fair order, and asks idle agents to make
    /// room for the rest (one stop in flight per waiting start).
    fn dispatch(&mut self) -> bool {
        let mut granted = false;
        while self.entries.len() < self.cap {
            let Some((_, ticket)) = self.queue.pop_next(|_| true) else {
                break;
            };
            let Some(context_id) = self.queued.remove(&ticket) else {
                continue;
            };
            self.insert(&context_id);
            self.granted.insert(ticket);
            granted = true;
        }
        let in_flight = self.entries.values().filter(|e| e.evicting).count();
        let need = self.queue.len().saturating_sub(in_flight);
        for _ in 0..need {
            if !self.evict_one(For::Turn, "a waiting turn") {
                break;
            }
        }
        granted
    }
}

/// The live-agent slots of one supervisor.
#[derive(Clone)]
pub struct LiveAgents {
    inner: Arc<Mutex<Inner>>,
    /// Bumped on every release and grant, so a waiting start wakes up.
    released: Arc<watch::Sender<u64>>,
}

/// Why an agent could not start now.
#[derive(Debug, thiserror::Error)]
#[error(
    "all {live} live agents are busy with turns; the limit is {cap} (limits.max_live_agents){why}"
)]
pub struct Full {
    pub live: usize,
    pub cap: usize,
    /// What the wait was, if there was one ("" for an open, which does not wait).
    pub why: String,
    /// The waiting turn was cancelled (not a capacity failure).
    pub cancelled: bool,
}

/// One live agent's slot; dropping it gives the slot back.
pub struct LiveSlot {
    live: LiveAgents,
    context_id: String,
}

impl LiveSlot {
    /// The conversation (or warm agent) holding this slot.
    pub fn holder(&self) -> &str {
        &self.context_id
    }

    /// Hands a warm agent's slot to the conversation that took the agent: from now on it is
    /// that conversation's (busy until its open is done, never asked to make room as a pooled
    /// one). Refused (the slot unchanged) when `context_id` already holds one.
    pub fn relabel(&mut self, context_id: &str) -> bool {
        let mut g = self.live.lock();
        if g.entries.contains_key(context_id) {
            return false;
        }
        let Some(mut e) = g.entries.remove(&self.context_id) else {
            return false;
        };
        let was_evicting = e.evicting;
        e.pooled = false;
        e.busy = true;
        e.waiting_turn = false;
        e.evicting = false;
        e.evict = CancellationToken::new();
        e.last_used = Instant::now();
        g.entries.insert(context_id.to_string(), e);
        if was_evicting {
            // A start asked this warm agent to make room just as a conversation took it: the
            // waiting starts ask another, and an open looks again rather than wait for a slot
            // this one will not give back.
            g.dispatch();
        }
        drop(g);
        self.context_id = context_id.to_string();
        if was_evicting {
            self.live.bump();
        }
        true
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        self.live.release(&self.context_id);
    }
}

/// A turn start in the queue; dropped (cancelled, timed out or abandoned) it leaves the queue,
/// and gives back a slot granted to it meanwhile.
struct Waiter<'a> {
    live: &'a LiveAgents,
    principal: &'a str,
    context_id: &'a str,
    ticket: u64,
    done: bool,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        {
            let mut g = self.live.lock();
            g.queued.remove(&self.ticket);
            if !g.queue.remove(self.principal, self.ticket) && g.granted.remove(&self.ticket) {
                g.entries.remove(self.context_id);
            }
            g.dispatch();
        }
        self.live.bump();
    }
}

/// Counts one open waiting for an agent it asked to stop, while it lives.
struct Opening<'a>(&'a LiveAgents);

impl<'a> Opening<'a> {
    fn new(live: &'a LiveAgents) -> Self {
        live.lock().opening += 1;
        Opening(live)
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut g = self.0.lock();
        g.opening = g.opening.saturating_sub(1);
    }
}

impl LiveAgents {
    /// `cap` live agents; at most `max_waiters` turn starts wait for one.
    pub fn new(cap: usize, max_waiters: usize) -> Self {
        let (tx, _) = watch::channel(0);
        LiveAgents {
            inner: Arc::new(Mutex::new(Inner {
                cap: cap.max(1),
                entries: HashMap::new(),
                queue: FairQueue::default(),
                queued: HashMap::new(),
                granted: HashSet::new(),
                next_ticket: 0,
                max_waiters,
                opening: 0,
            })),
            released: Arc::new(tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.released.send_modify(|n| *n += 1);
    }

    pub fn cap(&self) -> usize {
        self.lock().cap
    }

    pub fn live(&self) -> usize {
        self.lock().entries.len()
    }

    /// Turn starts waiting for an agent, and the principals they are of (for status).
    pub fn waiting(&self) -> (usize, usize) {
        let g = self.lock();
        (g.queue.len(), g.queue.principals())
    }

    /// Live agents that are the pool's (no conversation yet).
    pub fn pooled(&self) -> usize {
        self.lock().entries.values().filter(|e| e.pooled).count()
    }

    /// A slot for a warm agent of the pool, only if one is free now with no start waiting for
    /// one and no agent being stopped to make room: the pool never takes a slot a conversation
    /// is about to need, and never asks anyone to make room for itself.
    pub fn try_acquire_spare(&self, pool_id: &str) -> Option<LiveSlot> {
        let mut g = self.lock();
        if g.entries.len() >= g.cap
            || !g.queue.is_empty()
            || g.opening > 0
            || g.entries.contains_key(pool_id)
            || g.entries.values().any(|e| e.evicting)
        {
            return None;
        }
        g.entries.insert(
            pool_id.to_string(),
            Entry {
                busy: false,
                pooled: true,
                ..Entry::started()
            },
        );
        Some(LiveSlot {
            live: self.clone(),
            context_id: pool_id.to_string(),
        })
    }

    /// A receiver that changes whenever a slot is given back (the pool waits on it for room).
    pub fn released(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    fn slot(&self, context_id: &str) -> LiveSlot {
        LiveSlot {
            live: self.clone(),
            context_id: context_id.to_string(),
        }
    }

    fn full(&self, why: String, cancelled: bool) -> Full {
        let g = self.lock();
        Full {
            live: g.entries.len(),
            cap: g.cap,
            why,
            cancelled,
        }
    }

    /// A slot for an open's agent (starting counts as busy), without queueing: a free one with
    /// no turn start waiting, or the one an idle agent (a warm one first, never one whose
    /// conversation has a turn waiting) gives back within `wait`. `Full` at once otherwise:
    /// the open then goes ahead without an agent and its first turn waits for one.
    pub async fn acquire_now(&self, context_id: &str, wait: Duration) -> Result<LiveSlot, Full> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut opening = None;
        loop {
            let mut rx = self.released.subscribe();
            {
                let mut g = self.lock();
                let free = g.entries.len() < g.cap && g.queue.is_empty();
                if free || g.entries.contains_key(context_id) {
                    g.insert(context_id);
                    return Ok(self.slot(context_id));
                }
                if !g.queue.is_empty() {
                    // Turns wait already: this open does not go before them.
                    drop(g);
                    return Err(
                        self.full(format!("; {} starts wait for one", self.waiting().0), false)
                    );
                }
                // One stop in flight for this open (a warm agent taken while asked to stop
                // gives none back: then another is asked).
                if !g.entries.values().any(|e| e.evicting) && !g.evict_one(For::Open, context_id) {
                    drop(g);
                    return Err(self.full(String::new(), false));
                }
            }
            // Counted from here on, so the pool takes no slot meanwhile.
            if opening.is_none() {
                opening = Some(Opening::new(self));
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(self.full(String::new(), false));
            }
        }
    }

    /// A slot for the agent of `principal`'s turn in `context_id` (starting counts as busy):
    /// at once when one is free and nobody waits, else in the queue, told its 1-based place
    /// through `queued` whenever it changes, for at most `wait`. `Full` when the queue is full,
    /// the wait passes, or `cancel` fires (`cancelled`).
    pub async fn acquire_queued(
        &self,
        principal: &str,
        context_id: &str,
        wait: Duration,
        cancel: &CancellationToken,
        mut queued: impl FnMut(usize),
    ) -> Result<LiveSlot, Full> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiter = {
            let mut g = self.lock();
            if (g.entries.len() < g.cap && g.queue.is_empty()) || g.entries.contains_key(context_id)
            {
                g.insert(context_id);
                return Ok(self.slot(context_id));
            }
            if g.queue.len() >= g.max_waiters {
                let n = g.queue.len();
                drop(g);
                return Err(self.full(
                    format!(
                        "; {n} starts already wait for one, the most that may (limits.max_agent_waiters)"
                    ),
                    false,
                ));
            }
            let ticket = g.next_ticket;
            g.next_ticket += 1;
            g.queue.push(principal, ticket);
            g.queued.insert(ticket, context_id.to_string());
            g.dispatch();
            Waiter {
                live: self,
                principal,
                context_id,
                ticket,
                done: false,
            }
        };
        let started = Instant::now();
        let mut told = 0usize;
        let mut again = tokio::time::Instant::now() + crate::fair::REANNOUNCE;
        loop {
            let mut rx = self.released.subscribe();
            let pos = {
                let mut g = self.lock();
                if g.granted.remove(&waiter.ticket) {
                    waiter.done = true;
                    return Ok(self.slot(context_id));
                }
                g.queue.position(principal, waiter.ticket)
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
                _ = tokio::time::sleep_until(deadline) => {
                    drop(waiter);
                    return Err(self.full(format!(
                        "; waited {} ms for one to be free (limits.capacity_wait_ms)",
                        started.elapsed().as_millis()
                    ), false));
                }
                _ = cancel.cancelled() => {
                    drop(waiter);
                    return Err(self.full("; the waiting turn was cancelled".into(), true));
                }
            }
        }
    }

    /// Marks `context_id`'s agent busy (a turn runs) or idle (and most recently used now).
    pub fn set_busy(&self, context_id: &str, busy: bool) {
        let mut g = self.lock();
        if let Some(e) = g.entries.get_mut(context_id) {
            e.busy = busy;
            e.waiting_turn = false;
            e.last_used = Instant::now();
            if !busy && !g.queue.is_empty() {
                // A waiting start may ask it to make room now.
                g.dispatch();
            }
        }
    }

    /// Marks `context_id`'s agent idle with a turn waiting for a turn slot: only a turn's start
    /// may ask it to make room (it restarts when its turn is admitted).
    pub fn set_waiting(&self, context_id: &str) {
        let mut g = self.lock();
        if let Some(e) = g.entries.get_mut(context_id) {
            e.busy = false;
            e.waiting_turn = true;
            if !g.queue.is_empty() {
                g.dispatch();
            }
        }
    }

    /// The token a conversation's worker watches: cancelled when its idle agent must stop.
    pub fn evict_token(&self, context_id: &str) -> Option<CancellationToken> {
        self.lock().entries.get(context_id).map(|e| e.evict.clone())
    }

    fn release(&self, context_id: &str) {
        {
            let mut g = self.lock();
            g.entries.remove(context_id);
            g.dispatch();
        }
        self.bump();
    }
}

/// The default cap: what the host's memory holds at ~300 MiB per agent tree (a real Claude
/// adapter's size), at least 4, at most `max_conversations`.
pub fn default_cap(max_conversations: usize) -> usize {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let by_memory = (mem / (300 * 1024)) as usize;
    by_memory.max(4).min(max_conversations.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(30);

    /// Starts `principal`'s turn start for `ctx` in the queue, reporting its places on `tx`.
    fn queue(
        live: &LiveAgents,
        principal: &'static str,
        ctx: &'static str,
        wait: Duration,
        cancel: CancellationToken,
        tx: &tokio::sync::mpsc::UnboundedSender<(&'static str, usize)>,
    ) -> tokio::task::JoinHandle<Result<LiveSlot, Full>> {
        let live = live.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = live
                .acquire_queued(principal, ctx, wait, &cancel, |p| {
                    let _ = tx.send((ctx, p));
                })
                .await;
            if r.is_ok() {
                let _ = tx.send((ctx, 0));
            }
            r
        })
    }

    async fn until_waiting(live: &LiveAgents, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while live.waiting().0 < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the starts queued");
    }

    #[tokio::test]
    async fn the_cap_is_exact_and_an_idle_agent_makes_room() {
        let live = LiveAgents::new(2, 8);
        let a = live.acquire_now("a", Duration::from_secs(1)).await.unwrap();
        let _b = live.acquire_now("b", Duration::from_secs(1)).await.unwrap();
        // Both busy: an open is refused at once (it goes ahead without an agent).
        let full = live
            .acquire_now("c", Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert_eq!((full.live, full.cap), (2, 2));
        // a goes idle: c's start asks a to stop and waits for its slot.
        live.set_busy("a", false);
        let token = live.evict_token("a").unwrap();
        let waiter = {
            let live = live.clone();
            tokio::spawn(async move { live.acquire_now("c", Duration::from_secs(5)).await })
        };
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .expect("the idle agent was asked to stop");
        assert_eq!(
            live.live(),
            2,
            "no slot is handed out before one is given back"
        );
        drop(a);
        let c = waiter.await.unwrap().unwrap();
        assert_eq!(live.live(), 2);
        drop(c);
        assert_eq!(live.live(), 1);
    }

    #[tokio::test]
    async fn many_concurrent_starts_never_exceed_the_cap() {
        let live = LiveAgents::new(8, 64);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64 {
            let live = live.clone();
            set.spawn(async move {
                let id = format!("c{i}");
                if i % 2 == 0 {
                    live.acquire_now(&id, Duration::ZERO).await.ok()
                } else {
                    live.acquire_queued(
                        "p",
                        &id,
                        Duration::from_millis(50),
                        &CancellationToken::new(),
                        |_| {},
                    )
                    .await
                    .ok()
                }
            });
        }
        let mut held = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Some(slot) = r.unwrap() {
                held.push(slot);
            }
        }
        assert_eq!(held.len(), 8);
        assert_eq!(live.live(), 8);
        assert_eq!(live.waiting(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiting_turn_gets_the_agent_a_finished_turn_gives_back() {
        let live = LiveAgents::new(1, 8);
        let busy = live.acquire_now("a", LONG).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let never = CancellationToken::new();
        let b = queue(&live, "p", "b", LONG, never.clone(), &tx);
        until_waiting(&live, 1).await;
        assert_eq!(rx.recv().await, Some(("b", 1)));
        // An open does not go before it.
        let open = live.acquire_now("c", Duration::from_secs(1)).await;
        assert!(open.err().unwrap().why.contains("wait"));
        // a's turn ends: its agent is idle, asked to stop, and its slot is b's.
        let token = live.evict_token("a").unwrap();
        live.set_busy("a", false);
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .expect("the idle agent was asked to make room");
        drop(busy);
        let b = b.await.unwrap();
        assert!(b.is_ok());
        assert_eq!(rx.recv().await, Some(("b", 0)));
        assert_eq!((live.live(), live.waiting().0), (1, 0));
    }

    #[tokio::test]
    async fn waiting_starts_are_served_round_robin_by_principal() {
        let live = LiveAgents::new(1, 8);
        let mut holder = Some(live.acquire_now("x", LONG).await.unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let never = CancellationToken::new();
        let mut handles = HashMap::new();
        for (i, (p, ctx)) in [
            ("alice", "a1"),
            ("alice", "a2"),
            ("alice", "a3"),
            ("bob", "b1"),
        ]
        .into_iter()
        .enumerate()
        {
            handles.insert(ctx, queue(&live, p, ctx, LONG, never.clone(), &tx));
            until_waiting(&live, i + 1).await;
        }
        let mut places = HashMap::new();
        while places.len() < 4 {
            let (c, p) = rx.recv().await.unwrap();
            places.insert(c, p);
        }
        assert_eq!(places["b1"], 2, "{places:?}");
        let mut order = Vec::new();
        while order.len() < 4 {
            drop(holder.take());
            loop {
                let (c, p) = rx.recv().await.unwrap();
                if p == 0 {
                    order.push(c);
                    holder = Some(handles.remove(c).unwrap().await.unwrap().unwrap());
                    break;
                }
            }
        }
        assert_eq!(order, vec!["a1", "b1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn a_wait_passes_only_after_capacity_wait_and_a_full_queue_refuses() {
        let live = LiveAgents::new(1, 1);
        let _busy = live.acquire_now("a", LONG).await.unwrap();
        let never = CancellationToken::new();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let t0 = Instant::now();
        let b = queue(
            &live,
            "p",
            "b",
            Duration::from_millis(400),
            never.clone(),
            &tx,
        );
        until_waiting(&live, 1).await;
        // The queue holds one: the next is refused at once.
        let c = live
            .acquire_queued("q", "c", LONG, &never, |_| {})
            .await
            .err()
            .unwrap();
        assert!(c.why.contains("max_agent_waiters"), "{c}");
        let e = b.await.unwrap().err().unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(400));
        assert!(e.why.contains("capacity_wait_ms"), "{e}");
        assert!(!e.cancelled);
        assert_eq!(live.waiting(), (0, 0));
        assert_eq!(live.live(), 1);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_queue_and_gives_back_what_it_was_granted() {
        let live = LiveAgents::new(1, 8);
        let busy = live.acquire_now("a", LONG).await.unwrap();
        let cancel = CancellationToken::new();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let b = queue(&live, "p", "b", LONG, cancel.clone(), &tx);
        until_waiting(&live, 1).await;
        cancel.cancel();
        let e = b.await.unwrap().err().unwrap();
        assert!(e.cancelled);
        assert_eq!(live.waiting(), (0, 0));
        // Abandoned after the grant: the slot is given back, not lost.
        let c = queue(&live, "p", "c", LONG, CancellationToken::new(), &tx);
        until_waiting(&live, 1).await;
        c.abort();
        drop(busy);
        let _ = c.await;
        assert_eq!(live.live(), 0);
        assert!(live.try_acquire_spare("pool-1").is_some());
    }

    #[tokio::test]
    async fn only_a_turn_start_stops_an_agent_whose_turn_waits_for_a_turn_slot() {
        let live = LiveAgents::new(1, 8);
        let _a = live.acquire_now("a", LONG).await.unwrap();
        live.set_waiting("a");
        let token = live.evict_token("a").unwrap();
        assert!(
            live.acquire_now("b", Duration::from_millis(100))
                .await
                .is_err()
        );
        assert!(!token.is_cancelled(), "an open leaves it alone");
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let _c = queue(&live, "p", "c", LONG, CancellationToken::new(), &tx);
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .expect("a turn start asks it to make room");
    }

    #[tokio::test]
    async fn warm_agents_take_only_free_slots_and_are_the_first_to_make_room() {
        let live = LiveAgents::new(2, 8);
        let warm = live.try_acquire_spare("pool-1").expect("a free slot");
        let busy = live.acquire_now("a", Duration::from_secs(1)).await.unwrap();
        assert_eq!((live.live(), live.pooled()), (2, 1));
        assert!(live.try_acquire_spare("pool-2").is_none(), "at the cap");
        // An idle conversation agent and a warm one: the warm one is asked first.
        drop(busy);
        let idle = live.acquire_now("b", Duration::from_secs(1)).await.unwrap();
        live.set_busy("b", false);
        let pool_token = live.evict_token("pool-1").unwrap();
        let idle_token = live.evict_token("b").unwrap();
        let waiter = {
            let live = live.clone();
            tokio::spawn(async move { live.acquire_now("c", Duration::from_secs(5)).await })
        };
        tokio::time::timeout(Duration::from_secs(5), pool_token.cancelled())
            .await
            .expect("the warm agent is asked to make room");
        assert!(
            !idle_token.is_cancelled(),
            "not the conversation's idle agent"
        );
        // While a start waits, the pool takes nothing, even a slot given back meanwhile.
        assert!(live.try_acquire_spare("pool-3").is_none());
        drop(warm);
        let c = waiter.await.unwrap().unwrap();
        assert_eq!(live.pooled(), 0);
        drop((c, idle));
        assert!(live.try_acquire_spare("pool-4").is_some());
    }

    #[tokio::test]
    async fn a_taken_warm_slot_is_the_conversations() {
        let live = LiveAgents::new(2, 8);
        let mut slot = live.try_acquire_spare("pool-1").unwrap();
        let _other = live
            .acquire_now("ctx", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(
            !slot.relabel("ctx"),
            "a context holding a slot cannot take a second"
        );
        drop(_other);
        assert!(slot.relabel("ctx"));
        assert_eq!(slot.holder(), "ctx");
        assert_eq!((live.live(), live.pooled()), (1, 0));
        drop(slot);
        assert_eq!(live.live(), 0);
    }

    #[test]
    fn the_default_cap_is_bounded_by_max_conversations() {
        assert!(default_cap(512) >= 4);
        assert_eq!(default_cap(2), 2);
    }
}
