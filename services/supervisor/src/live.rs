//! How many agents are alive at once, exactly: every agent start takes a slot first (held by the
//! running agent and given back when it is dropped, however it ends), and at the cap the least
//! recently used *idle* agent is asked to stop to make room. Only when every live agent is busy
//! is a start refused.
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
}

struct Inner {
    cap: usize,
    entries: HashMap<String, Entry>,
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

    /// Takes a slot for `context_id`'s agent (starting counts as busy). At the cap, the least
    /// recently used idle agent is asked to stop and this waits (at most `wait`) for its slot;
    /// with every agent busy it refuses at once.
    pub async fn acquire(&self, context_id: &str, wait: Duration) -> Result<LiveSlot, Full> {
        let deadline = tokio::time::Instant::now() + wait;
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
                        },
                    );
                    return Ok(LiveSlot {
                        live: self.clone(),
                        context_id: context_id.to_string(),
                    });
                }
                let in_flight = g.entries.values().any(|e| e.evicting);
                let victim = g
                    .entries
                    .iter_mut()
                    .filter(|(_, e)| !e.busy && !e.evicting)
                    .min_by_key(|(_, e)| e.last_used);
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

    #[test]
    fn the_default_cap_is_bounded_by_max_conversations() {
        assert!(default_cap(512) >= 4);
        assert_eq!(default_cap(2), 2);
    }
}
