//! MCP sessions (2025-11-25, `Mcp-Session-Id`) as a share per principal (issue 36, finding 5):
//! at most `mcp.max_sessions_per_principal` open sessions per principal and `mcp.max_sessions`
//! on the gateway, and a session idle for `mcp.session_idle_seconds` is ended as a DELETE ends
//! it, after which the memory it held is handed back to the system.
//!
//! An `initialize` takes a [`Reservation`] before rmcp sees it (so concurrent ones cannot pass
//! the share together); the session id of the answer turns it into an entry, and no id gives it
//! back. Every request naming a session holds an [`Activity`] until its response body is
//! written out (an SSE stream, a GET stream included), so a session is idle only when nothing
//! of it is in flight.
//!
//! Owns: which principal holds which session, how many each holds, when each was last used.
//! Must never: end a session with a request in flight, count a session against anyone but the
//! principal that opened it, or let a refused `initialize` create anything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update below is a few statements that leave the maps consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The session shares of one gateway.
#[derive(Debug)]
pub struct SessionTable {
    max_total: usize,
    max_per_principal: usize,
    idle: Duration,
    inner: Mutex<Inner>,
    /// Sessions ended since the memory was last handed back.
    ended: AtomicUsize,
}

#[derive(Debug, Default)]
struct Inner {
    open: HashMap<String, Entry>,
    /// Sessions and reservations per principal.
    held: HashMap<String, usize>,
    /// Sessions and reservations of every principal.
    total: usize,
}

#[derive(Debug)]
struct Entry {
    principal: String,
    last: Instant,
    in_flight: usize,
}

/// Why an `initialize` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "this caller already holds {0} open MCP sessions, its share (mcp.max_sessions_per_principal); end one with DELETE, or an idle one ends by itself after mcp.session_idle_seconds ({1} s)"
    )]
    Principal(usize, u64),
    #[error(
        "the gateway already holds {0} open MCP sessions, its limit (mcp.max_sessions); retry later: idle sessions end after mcp.session_idle_seconds ({1} s)"
    )]
    Gateway(usize, u64),
}

/// A place for one session of a principal, taken before its `initialize` runs.
#[derive(Debug)]
pub struct Reservation {
    table: Arc<SessionTable>,
    principal: String,
    bound: bool,
}

/// One request of a session in flight; the session is idle again from its drop.
#[derive(Debug)]
pub struct Activity {
    table: Arc<SessionTable>,
    sid: String,
}

impl SessionTable {
    pub fn new(max_total: usize, max_per_principal: usize, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_total: max_total.max(1),
            max_per_principal: max_per_principal.clamp(1, max_total.max(1)),
            idle,
            inner: Mutex::new(Inner::default()),
            ended: AtomicUsize::new(0),
        })
    }

    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// A place for one more session of `principal`, or why not.
    pub fn reserve(self: &Arc<Self>, principal: &str) -> Result<Reservation, Refused> {
        let mut inner = lock(&self.inner);
        let mine = inner.held.get(principal).copied().unwrap_or(0);
        let idle = self.idle.as_secs();
        if mine >= self.max_per_principal {
            return Err(Refused::Principal(self.max_per_principal, idle));
        }
        if inner.total >= self.max_total {
            return Err(Refused::Gateway(self.max_total, idle));
        }
        inner.held.insert(principal.to_string(), mine + 1);
        inner.total += 1;
        Ok(Reservation {
            table: self.clone(),
            principal: principal.to_string(),
            bound: false,
        })
    }

    /// A session that was opened without a reservation (an `initialize` the edge did not
    /// recognise as one): counted against its principal all the same, whatever the share.
    pub fn adopt(&self, sid: &str, principal: &str) {
        let mut inner = lock(&self.inner);
        if inner.open.contains_key(sid) {
            return;
        }
        *inner.held.entry(principal.to_string()).or_insert(0) += 1;
        inner.total += 1;
        inner.open.insert(
            sid.to_string(),
            Entry {
                principal: principal.to_string(),
                last: Instant::now(),
                in_flight: 0,
            },
        );
    }

    /// The principal that opened session `sid`, while it is open.
    pub fn owner(&self, sid: &str) -> Option<String> {
        lock(&self.inner).open.get(sid).map(|e| e.principal.clone())
    }

    /// A request of session `sid` starts (nothing when the session is unknown).
    pub fn activity(self: &Arc<Self>, sid: &str) -> Option<Activity> {
        let mut inner = lock(&self.inner);
        let e = inner.open.get_mut(sid)?;
        e.in_flight += 1;
        e.last = Instant::now();
        Some(Activity {
            table: self.clone(),
            sid: sid.to_string(),
        })
    }

    /// Session `sid` ended (DELETE, the reaper, rmcp): its share comes back. Its principal, if
    /// it was open.
    pub fn remove(&self, sid: &str) -> Option<String> {
        let mut inner = lock(&self.inner);
        let e = inner.open.remove(sid)?;
        release(&mut inner, &e.principal);
        self.ended.fetch_add(1, Ordering::Relaxed);
        Some(e.principal)
    }

    /// Sessions with nothing in flight and no request for the idle time, oldest first.
    pub fn idle_sessions(&self, now: Instant) -> Vec<String> {
        let inner = lock(&self.inner);
        let mut idle: Vec<(Instant, &String)> = inner
            .open
            .iter()
            .filter(|(_, e)| e.in_flight == 0 && now.saturating_duration_since(e.last) >= self.idle)
            .map(|(sid, e)| (e.last, sid))
            .collect();
        idle.sort();
        idle.into_iter().map(|(_, sid)| sid.clone()).collect()
    }

    /// Every open session id.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.inner).open.keys().cloned().collect()
    }

    /// Sessions open now, of every principal.
    pub fn open(&self) -> usize {
        lock(&self.inner).open.len()
    }

    /// Sessions (and reservations) `principal` holds now.
    pub fn held_by(&self, principal: &str) -> usize {
        lock(&self.inner).held.get(principal).copied().unwrap_or(0)
    }

    /// How many sessions ended since the last call (and resets the count).
    pub fn take_ended(&self) -> usize {
        self.ended.swap(0, Ordering::Relaxed)
    }

    /// The maps give back the room of ended sessions (a `HashMap` never shrinks by itself: the
    /// table of a flood would stay the flood's size).
    pub fn shrink(&self) {
        let mut inner = lock(&self.inner);
        if inner.open.capacity() > 2 * inner.open.len() + 64 {
            inner.open.shrink_to_fit();
        }
        if inner.held.capacity() > 2 * inner.held.len() + 64 {
            inner.held.shrink_to_fit();
        }
    }
}

fn release(inner: &mut Inner, principal: &str) {
    if let Some(n) = inner.held.get_mut(principal) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            inner.held.remove(principal);
        }
    }
    inner.total = inner.total.saturating_sub(1);
}

impl Reservation {
    /// The `initialize` was answered with session `sid`: the place is that session's now.
    pub fn bind(mut self, sid: &str) {
        let mut inner = lock(&self.table.inner);
        self.bound = true;
        let entry = Entry {
            principal: self.principal.clone(),
            last: Instant::now(),
            in_flight: 0,
        };
        if let Some(before) = inner.open.insert(sid.to_string(), entry) {
            // rmcp never hands out an id twice; if it did, the older place is given back.
            release(&mut inner, &before.principal);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.bound {
            release(&mut lock(&self.table.inner), &self.principal);
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        let mut inner = lock(&self.table.inner);
        if let Some(e) = inner.open.get_mut(&self.sid) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.last = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_at_its_share_is_refused_and_others_are_not() {
        let t = SessionTable::new(10, 3, Duration::from_secs(60));
        let mut held = Vec::new();
        for i in 0..3 {
            let r = t.reserve("bob").unwrap();
            r.bind(&format!("b{i}"));
            held.push(format!("b{i}"));
        }
        assert_eq!(t.reserve("bob").unwrap_err(), Refused::Principal(3, 60));
        let a = t.reserve("alice").unwrap();
        a.bind("a0");
        assert_eq!(t.owner("a0").as_deref(), Some("alice"));
        assert_eq!(t.remove("b0").as_deref(), Some("bob"));
        assert!(t.reserve("bob").is_ok(), "a place came back");
        assert_eq!(
            t.held_by("bob"),
            2,
            "the unbound reservation was given back"
        );
    }

    #[test]
    fn the_gateway_limit_is_the_sum() {
        let t = SessionTable::new(4, 2, Duration::from_secs(60));
        for p in ["a", "b"] {
            for i in 0..2 {
                t.reserve(p).unwrap().bind(&format!("{p}{i}"));
            }
        }
        let e = t.reserve("c").unwrap_err();
        assert_eq!(e, Refused::Gateway(4, 60));
        assert!(e.to_string().contains("mcp.max_sessions"), "{e}");
    }

    #[test]
    fn only_sessions_with_nothing_in_flight_go_idle() {
        let t = SessionTable::new(10, 10, Duration::from_millis(0));
        t.reserve("a").unwrap().bind("s1");
        t.reserve("a").unwrap().bind("s2");
        let busy = t.activity("s1").unwrap();
        let idle = t.idle_sessions(Instant::now() + Duration::from_millis(1));
        assert_eq!(idle, vec!["s2".to_string()]);
        drop(busy);
        assert_eq!(
            t.idle_sessions(Instant::now() + Duration::from_millis(1))
                .len(),
            2
        );
        assert!(t.activity("nope").is_none());
        assert_eq!(t.remove("s1").as_deref(), Some("a"));
        assert_eq!(t.remove("s1"), None, "removing twice counts once");
        assert_eq!(t.take_ended(), 1);
        assert_eq!(t.open(), 1);
    }
}
