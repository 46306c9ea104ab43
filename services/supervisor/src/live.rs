//! How many agents are alive at once, exactly: every agent start takes a slot first (held by the
//! running agent and given back when it is dropped, however it ends), and at the cap the least
//! recently used *idle* agent is asked to stop to make room. Only when every live agent is busy
//! is a start refused.
//!
//! Warm agents (the pool's, waiting for a conversation) hold slots too: they are live agents.
//! They are the first asked to make room (before any conversation's idle agent), whether ready
//! or still starting, and they only ever take a slot that is free with nobody waiting for one
//! ([`LiveAgents::try_acquire_spare`]), so a pool never starves a conversation.
//!
//! Must never: count a slot twice or lose one (a slot is an RAII guard), stop a busy agent, or
//! block while holding its lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct Entry {
    busy: bool,
    last_used: Instant,
    /// Cancelled to ask this conversation's worker to stop its idle agent.
    evict: CancellationToken,
    evicting: bool,
    /// A warm agent of the pool (no conversation yet): asked to make room first.
    pooled: bool,
}

struct Inner {
    cap: usize,
    entries: HashMap<String, Entry>,
    /// Starts waiting for a slot to be given back: while any waits, the pool takes none.
    waiters: usize,
}

/// The live-agent slots of one supervisor.
#[derive(Clone)]
pub struct LiveAgents {
    inner: Arc<Mutex<Inner>>,
    /// Bumped on every release, so a waiting start wakes up.
    released: Arc<watch::Sender<u64>>,
}

/// Why an agent could not start now.
#[derive(Debug, thiserror::Error)]
#[error("all {live} live agents are busy with turns; the limit is {cap} (limits.max_live_agents)")]
pub struct Full {
    pub live: usize,
    pub cap: usize,
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
        e.evicting = false;
        e.evict = CancellationToken::new();
        e.last_used = Instant::now();
        g.entries.insert(context_id.to_string(), e);
        drop(g);
        self.context_id = context_id.to_string();
        if was_evicting {
            // A start asked this warm agent to make room just as a conversation took it: that
            // start looks again rather than wait for a slot this one will not give back.
            self.live.released.send_modify(|n| *n += 1);
        }
        true
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        self.live.release(&self.context_id);
    }
}

impl LiveAgents {
    pub fn new(cap: usize) -> Self {
        let (tx, _) = watch::channel(0);
        LiveAgents {
            inner: Arc::new(Mutex::new(Inner {
                cap: cap.max(1),
                entries: HashMap::new(),
                waiters: 0,
            })),
            released: Arc::new(tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn cap(&self) -> usize {
        self.lock().cap
    }

    pub fn live(&self) -> usize {
        self.lock().entries.len()
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
            || g.waiters > 0
            || g.entries.contains_key(pool_id)
            || g.entries.values().any(|e| e.evicting)
        {
            return None;
        }
        g.entries.insert(
            pool_id.to_string(),
            Entry {
                busy: false,
                last_used: Instant::now(),
                evict: CancellationToken::new(),
                evicting: false,
                pooled: true,
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

    /// Takes a slot for `context_id`'s agent (starting counts as busy). At the cap, the least
    /// recently used idle agent is asked to stop and this waits (at most `wait`) for its slot;
    /// with every agent busy it refuses at once.
    pub async fn acquire(&self, context_id: &str, wait: Duration) -> Result<LiveSlot, Full> {
        let deadline = tokio::time::Instant::now() + wait;
        // Counted as waiting from the first look on, so the pool takes no slot meanwhile.
        let _waiting = Waiting::new(self);
        loop {
            let mut rx = self.released.subscribe();
            {
                let mut g = self.lock();
                let live = g.entries.len();
                if live < g.cap || g.entries.contains_key(context_id) {
                    g.entries.insert(
                        context_id.to_string(),
                        Entry {
                            busy: true,
                            last_used: Instant::now(),
                            evict: CancellationToken::new(),
                            evicting: false,
                            pooled: false,
                        },
                    );
                    return Ok(LiveSlot {
                        live: self.clone(),
                        context_id: context_id.to_string(),
                    });
                }
                let in_flight = g.entries.values().any(|e| e.evicting);
                // A warm agent first (ready or still starting: nobody uses it yet), then the
                // least recently used idle one.
                let victim = g
                    .entries
                    .iter_mut()
                    .filter(|(_, e)| (e.pooled || !e.busy) && !e.evicting)
                    .min_by_key(|(_, e)| (!e.pooled, e.last_used));
                match victim {
                    Some((id, e)) => {
                        tracing::info!(context_id = %id, for_context = %context_id, "live agents at the limit: stopping the least recently used idle one");
                        e.evicting = true;
                        e.evict.cancel();
                    }
                    None if !in_flight => {
                        return Err(Full { live, cap: g.cap });
                    }
                    None => {}
                }
            }
            // Woken by any release (ours or another's); the loop looks again.
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                let g = self.lock();
                return Err(Full {
                    live: g.entries.len(),
                    cap: g.cap,
                });
            }
        }
    }

    /// Marks `context_id`'s agent busy (a turn runs) or idle (and most recently used now).
    pub fn set_busy(&self, context_id: &str, busy: bool) {
        if let Some(e) = self.lock().entries.get_mut(context_id) {
            e.busy = busy;
            e.last_used = Instant::now();
        }
    }

    /// The token a conversation's worker watches: cancelled when its idle agent must stop.
    pub fn evict_token(&self, context_id: &str) -> Option<CancellationToken> {
        self.lock().entries.get(context_id).map(|e| e.evict.clone())
    }

    fn release(&self, context_id: &str) {
        self.lock().entries.remove(context_id);
        self.released.send_modify(|n| *n += 1);
    }
}

/// Counts one start waiting for a slot while it lives.
struct Waiting<'a>(&'a LiveAgents);

impl<'a> Waiting<'a> {
    fn new(live: &'a LiveAgents) -> Self {
        live.lock().waiters += 1;
        Waiting(live)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut g = self.0.lock();
        g.waiters = g.waiters.saturating_sub(1);
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

    #[tokio::test]
    async fn the_cap_is_exact_and_an_idle_agent_makes_room() {
        let live = LiveAgents::new(2);
        let a = live.acquire("a", Duration::from_secs(1)).await.unwrap();
        let _b = live.acquire("b", Duration::from_secs(1)).await.unwrap();
        // Both busy: refused at once.
        let full = live
            .acquire("c", Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert_eq!((full.live, full.cap), (2, 2));
        // a goes idle: c's start asks a to stop and waits for its slot.
        live.set_busy("a", false);
        let token = live.evict_token("a").unwrap();
        let waiter = {
            let live = live.clone();
            tokio::spawn(async move { live.acquire("c", Duration::from_secs(5)).await })
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
        let live = LiveAgents::new(8);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64 {
            let live = live.clone();
            set.spawn(async move { live.acquire(&format!("c{i}"), Duration::ZERO).await.ok() });
        }
        let mut held = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Some(slot) = r.unwrap() {
                held.push(slot);
            }
        }
        assert_eq!(held.len(), 8);
        assert_eq!(live.live(), 8);
    }

    #[tokio::test]
    async fn warm_agents_take_only_free_slots_and_are_the_first_to_make_room() {
        let live = LiveAgents::new(2);
        let warm = live.try_acquire_spare("pool-1").expect("a free slot");
        let busy = live.acquire("a", Duration::from_secs(1)).await.unwrap();
        assert_eq!((live.live(), live.pooled()), (2, 1));
        assert!(live.try_acquire_spare("pool-2").is_none(), "at the cap");
        // An idle conversation agent and a warm one: the warm one is asked first.
        drop(busy);
        let idle = live.acquire("b", Duration::from_secs(1)).await.unwrap();
        live.set_busy("b", false);
        let pool_token = live.evict_token("pool-1").unwrap();
        let idle_token = live.evict_token("b").unwrap();
        let waiter = {
            let live = live.clone();
            tokio::spawn(async move { live.acquire("c", Duration::from_secs(5)).await })
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
        let live = LiveAgents::new(2);
        let mut slot = live.try_acquire_spare("pool-1").unwrap();
        let _other = live.acquire("ctx", Duration::from_secs(1)).await.unwrap();
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
