//! A per-principal share of a daemon's CPU (issue 36): futures polled in virtual-time order.
//!
//! A Tokio runtime polls whatever is runnable in arrival order, so a principal with hundreds of
//! requests in flight is polled hundreds of times for each poll of another principal's one, and
//! the other waits behind the whole flood at every step of its request. [`Scheduler`] keeps per
//! principal a *virtual time*, the wall time spent inside its futures' `poll`. A future wrapped
//! in [`Fair`] is polled only while its principal is at most one quantum ahead of the least-served
//! principal that has work ready; otherwise it is *parked*: it returns `Pending` at once and is
//! woken when the others have caught up. Each principal with work ready thus gets an equal share
//! of poll time, however many futures it has.
//!
//! - Work-conserving: only principals with a future ready to run (woken and not yet polled,
//!   parked, or being polled) compete; one whose futures all wait on I/O holds nobody back.
//! - Little credit for idleness: a principal that becomes ready starts at most a few quanta
//!   behind the virtual clock (the least virtual time among the ready): a caller waking from a
//!   wait on I/O is served ahead of a flood that ran meanwhile, but an idle hour buys no more
//!   than that.
//! - Never stuck: a principal counted ready that has not been polled for [`STALE`] no longer
//!   holds the others back (its task may sit behind a busy runtime, or its owner stopped
//!   polling it), and a watcher thread wakes parked futures whenever that is the only reason
//!   they wait.
//!
//! Owns: the virtual times and the parked wake-ups. Must never: hold its lock while polling a
//! future, drop a wake-up (a parked future is always woken again), or keep an entry for a
//! principal that has no live future.

#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How far (in poll time) a principal may run ahead of the least-served ready one.
pub const DEFAULT_QUANTUM: Duration = Duration::from_millis(2);

/// How long a principal counted ready may go unpolled before it stops holding others back.
pub const STALE: Duration = Duration::from_millis(200);

/// How many quanta behind the virtual clock a principal that was idle may start: the lead a
/// waking caller gets over a flood that ran meanwhile (and no more, however long it slept).
const CREDIT_QUANTA: u64 = 5;

/// How long after its last poll a principal with nothing ready still competes. A runtime
/// learns of a wake-up from I/O (or a `yield_now`) only every few dozen polls, so a principal
/// that is about to be ready again would otherwise look idle between every two of its polls,
/// and a flood would run unshared in each of those gaps.
const GRACE: Duration = Duration::from_millis(2);

/// The shares of one daemon's poll time, one per principal. Cheap to share (`Arc`).
pub struct Scheduler {
    quantum: u64,
    state: Mutex<State>,
    /// Signalled when the first future parks, so the watcher looks at stale principals.
    parked_cv: Condvar,
}

#[derive(Default)]
struct State {
    principals: HashMap<Arc<str>, Entry>,
    /// Every principal with an entry, by virtual time.
    live: BTreeSet<(u64, Arc<str>)>,
    /// Principals with a parked future, by virtual time.
    parked: BTreeSet<(u64, Arc<str>)>,
    /// Monotone: the least virtual time among ready principals when last seen. A principal
    /// that becomes ready starts here (never below).
    clock: u64,
    /// Futures parked, over all principals (for the watcher and the figures).
    parked_futures: usize,
    /// The scheduler is being dropped: the watcher ends.
    closing: bool,
    /// When the principal that a parked future waits behind stops competing (its grace or
    /// stale bound ends): the watcher looks again then, not a fixed tick later.
    wake_at: Option<Instant>,
}

struct Entry {
    vtime: u64,
    /// Futures of this principal counted ready (woken and not yet polled, parked, or polling).
    ready: usize,
    /// Live `Fair` futures of this principal.
    futures: usize,
    parked: Vec<Waker>,
    /// When it was last polled, or became ready.
    last_run: Instant,
}

/// What one principal has had, for tests and figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub principal: String,
    /// Poll time so far, relative to the virtual clock's start.
    pub vtime: Duration,
    pub futures: usize,
    pub ready: usize,
    pub parked: usize,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update leaves the maps consistent before any call that could panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's scheduler: a daemon's CPU is one, so every share of it is taken from the same
/// poll time (a request and the work it spawns are charged to one principal in one place).
pub fn global() -> &'static Arc<Scheduler> {
    static GLOBAL: std::sync::OnceLock<Arc<Scheduler>> = std::sync::OnceLock::new();
    GLOBAL.get_or_init(Scheduler::new)
}

impl Scheduler {
    /// A scheduler with the default quantum.
    pub fn new() -> Arc<Self> {
        Self::with_quantum(DEFAULT_QUANTUM)
    }

    /// A scheduler whose principals may each run `quantum` of poll time ahead of the others.
    pub fn with_quantum(quantum: Duration) -> Arc<Self> {
        let s = Arc::new(Self {
            quantum: u64::try_from(quantum.as_nanos()).unwrap_or(u64::MAX),
            state: Mutex::new(State::default()),
            parked_cv: Condvar::new(),
        });
        let weak = Arc::downgrade(&s);
        // One thread per scheduler (one per daemon); it sleeps on a condition variable while
        // nothing is parked. Without it a parked future whose only obstacle is a stale
        // principal would wait for some other poll to end.
        let _ = std::thread::Builder::new()
            .name("fairshare-watch".into())
            .spawn(move || watch(weak));
        s
    }

    /// Wraps `fut` as work of `principal`.
    pub fn fair<F: Future>(self: &Arc<Self>, principal: &str, fut: F) -> Fair<F> {
        let key: Arc<str> = Arc::from(principal);
        let shared = Arc::new(Shared {
            sched: self.clone(),
            key: key.clone(),
            woken: AtomicBool::new(true),
            gone: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        {
            let mut st = lock(&self.state);
            let clock = st.clock;
            let e = st.principals.entry(key.clone()).or_insert_with(|| Entry {
                vtime: clock,
                ready: 0,
                futures: 0,
                parked: Vec::new(),
                last_run: Instant::now(),
            });
            e.futures += 1;
            let v = e.vtime;
            st.live.insert((v, key.clone()));
            // A new future is ready: it has not been polled yet.
            st.become_ready(&key, self.quantum);
        }
        Fair {
            own: Waker::from(shared.clone()),
            shared,
            inner: Box::pin(fut),
            done: false,
        }
    }

    /// Every principal with a live future, least served first.
    pub fn shares(&self) -> Vec<Share> {
        let st = lock(&self.state);
        let base = st.clock;
        let mut v: Vec<Share> = st
            .principals
            .iter()
            .map(|(k, e)| Share {
                principal: k.to_string(),
                vtime: Duration::from_nanos(e.vtime.saturating_sub(base)),
                futures: e.futures,
                ready: e.ready,
                parked: e.parked.len(),
            })
            .collect();
        v.sort_by(|a, b| a.vtime.cmp(&b.vtime).then(a.principal.cmp(&b.principal)));
        v
    }

    /// Futures parked now, over all principals.
    pub fn parked(&self) -> usize {
        lock(&self.state).parked_futures
    }

    /// May a future of `key` be polled now? If not, `waker` is kept and woken when it may.
    fn admit(&self, key: &Arc<str>, waker: &Waker) -> bool {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let Some(vtime) = st.principals.get(key).map(|e| e.vtime) else {
            return true;
        };
        let Some((least, until)) = st.least_fresh(now) else {
            return true;
        };
        if vtime <= least.saturating_add(self.quantum) {
            return true;
        }
        let mut notify = st.parked_futures == 0;
        if let Some(t) = until
            && st.wake_at.is_none_or(|w| t < w)
        {
            st.wake_at = Some(t);
            notify = true;
        }
        let Some(e) = st.principals.get_mut(key) else {
            return true;
        };
        e.parked.push(waker.clone());
        let newly = e.parked.len() == 1;
        st.parked_futures += 1;
        if newly {
            st.parked.insert((vtime, key.clone()));
        }
        drop(st);
        if notify {
            self.parked_cv.notify_one();
        }
        false
    }

    /// A future of `key` was polled for `spent`; `finished` if it completed. A finished future
    /// woken during its last poll is counted ready no longer (`woken` is cleared here, under the
    /// lock): a count left behind would make its principal look ready forever.
    fn ran(&self, key: &Arc<str>, spent: Duration, finished: bool, woken: &AtomicBool) {
        let spent = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        let wake = {
            let mut st = lock(&self.state);
            let late = finished && woken.swap(false, Ordering::Relaxed);
            st.update(key, |e| {
                e.vtime = e.vtime.saturating_add(spent);
                e.ready = e.ready.saturating_sub(1 + usize::from(late));
                e.last_run = Instant::now();
                if finished {
                    e.futures = e.futures.saturating_sub(1);
                }
            });
            st.forget_if_idle(key);
            st.advance_clock();
            st.eligible(self.quantum, Instant::now())
        };
        for w in wake {
            w.wake();
        }
    }

    /// The watcher's look: the wakers of what waits only on stale principals, after waiting up
    /// to `idle` for something to be parked. `None` when closing.
    fn unstick(&self, idle: Duration) -> Option<Vec<Waker>> {
        let mut st = lock(&self.state);
        // Whatever is parked is looked at again within a quarter of the stale bound at most.
        let fallback = Instant::now() + STALE / 4;
        loop {
            if st.closing {
                return None;
            }
            if st.parked_futures == 0 {
                st = self
                    .parked_cv
                    .wait_timeout(st, idle)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
                if st.parked_futures == 0 {
                    return Some(Vec::new());
                }
                continue;
            }
            let now = Instant::now();
            let until = st.wake_at.map_or(fallback, |w| w.min(fallback));
            if now < until {
                // Woken early by a park with a nearer deadline: the loop reads it again.
                st = self
                    .parked_cv
                    .wait_timeout(st, until - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
                continue;
            }
            st.wake_at = None;
            return Some(st.eligible(self.quantum, now));
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        lock(&self.state).closing = true;
        self.parked_cv.notify_all();
    }
}

fn watch(sched: Weak<Scheduler>) {
    loop {
        // The scheduler is held only for one look (at most a second of waiting), so dropping
        // the last handle elsewhere ends this thread within that second.
        let Some(s) = sched.upgrade() else { return };
        let Some(wake) = s.unstick(Duration::from_secs(1)) else {
            return;
        };
        drop(s);
        for w in wake {
            w.wake();
        }
    }
}

impl State {
    /// Applies `f` to `key`'s entry, keeping the ordered sets in step with its virtual time.
    fn update(&mut self, key: &Arc<str>, f: impl FnOnce(&mut Entry)) {
        let Some(e) = self.principals.get_mut(key) else {
            return;
        };
        let (was_parked, old) = (!e.parked.is_empty(), e.vtime);
        f(e);
        let (is_parked, new) = (!e.parked.is_empty(), e.vtime);
        if old != new {
            self.live.remove(&(old, key.clone()));
            self.live.insert((new, key.clone()));
        }
        if was_parked {
            self.parked.remove(&(old, key.clone()));
        }
        if is_parked {
            self.parked.insert((new, key.clone()));
        }
    }

    fn become_ready(&mut self, key: &Arc<str>, quantum: u64) {
        let floor = self
            .clock
            .saturating_sub(quantum.saturating_mul(CREDIT_QUANTA));
        self.update(key, |e| {
            if e.ready == 0 {
                // Placed near the clock: a bounded lead for the time it was idle.
                e.vtime = e.vtime.max(floor);
                e.last_run = Instant::now();
            }
            e.ready += 1;
        });
    }

    fn forget_if_idle(&mut self, key: &Arc<str>) {
        if let Some(e) = self.principals.get(key)
            && e.futures == 0
            && e.ready == 0
            && e.parked.is_empty()
        {
            let v = e.vtime;
            self.principals.remove(key);
            self.live.remove(&(v, key.clone()));
        }
    }

    fn advance_clock(&mut self) {
        if let Some((v, _)) = self.least_fresh(Instant::now()) {
            self.clock = self.clock.max(v);
        }
    }

    /// The least virtual time among the principals that compete now: those with a parked
    /// future, with a ready one polled within [`STALE`], or polled within [`GRACE`].
    /// With it, when that principal stops competing unless polled again (`None`: it has a
    /// parked future, which keeps it competing until it is polled).
    fn least_fresh(&self, now: Instant) -> Option<(u64, Option<Instant>)> {
        self.live.iter().find_map(|(v, k)| {
            let e = self.principals.get(k)?;
            let since = now.saturating_duration_since(e.last_run);
            if !e.parked.is_empty() {
                Some((*v, None))
            } else if e.ready > 0 && since < STALE {
                Some((*v, Some(e.last_run + STALE)))
            } else if since < GRACE {
                Some((*v, Some(e.last_run + GRACE)))
            } else {
                None
            }
        })
    }

    /// Takes the wakers of every parked principal now within one quantum of the least fresh.
    fn eligible(&mut self, quantum: u64, now: Instant) -> Vec<Waker> {
        let limit = match self.least_fresh(now) {
            Some((v, _)) => v.saturating_add(quantum),
            None => u64::MAX,
        };
        let mut wake = Vec::new();
        while let Some((v, k)) = self.parked.first().cloned() {
            if v > limit {
                break;
            }
            self.parked.pop_first();
            if let Some(e) = self.principals.get_mut(&k) {
                self.parked_futures = self.parked_futures.saturating_sub(e.parked.len());
                wake.append(&mut e.parked);
            }
            // A parked future may have been dropped since: its entry goes with its wakers.
            self.forget_if_idle(&k);
        }
        wake
    }
}

/// What a `Fair` future shares with its waker.
struct Shared {
    sched: Arc<Scheduler>,
    key: Arc<str>,
    /// Counted ready in the scheduler (changed only under the scheduler's lock).
    woken: AtomicBool,
    /// The future was dropped: a late wake-up must not count it ready again.
    gone: AtomicBool,
    /// The waker of the task polling the future.
    waker: Mutex<Option<Waker>>,
}

impl Shared {
    /// Counts the future ready, once until its next poll.
    fn mark_ready(&self) {
        let mut st = lock(&self.sched.state);
        if self.gone.load(Ordering::Relaxed) || self.woken.load(Ordering::Relaxed) {
            return;
        }
        self.woken.store(true, Ordering::Relaxed);
        st.become_ready(&self.key, self.sched.quantum);
    }

    fn task_waker(&self) -> Option<Waker> {
        self.waker.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.mark_ready();
        if let Some(w) = self.task_waker() {
            w.wake();
        }
    }
}

/// A future run as one principal's work; see [`Scheduler::fair`].
pub struct Fair<F> {
    shared: Arc<Shared>,
    /// The waker handed to the inner future: it counts a wake-up before passing it on.
    own: Waker,
    inner: Pin<Box<F>>,
    done: bool,
}

impl<F: Future> Future for Fair<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let shared = &this.shared;
        // Polled without its own waker having fired (a parent polls all its children, or the
        // task was woken by something else): it is ready all the same.
        shared.mark_ready();
        if !shared.sched.admit(&shared.key, cx.waker()) {
            return Poll::Pending;
        }
        {
            let mut w = shared.waker.lock().unwrap_or_else(|p| p.into_inner());
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        {
            // From here a wake-up counts it ready again; the count it had ends after the poll.
            let _st = lock(&shared.sched.state);
            shared.woken.store(false, Ordering::Relaxed);
        }
        let started = Instant::now();
        let out = this
            .inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.own));
        let finished = out.is_ready();
        if finished {
            this.done = true;
            shared.gone.store(true, Ordering::Relaxed);
        }
        shared
            .sched
            .ran(&shared.key, started.elapsed(), finished, &shared.woken);
        out
    }
}

impl<F> Drop for Fair<F> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let sched = &self.shared.sched;
        let wake = {
            let mut st = lock(&sched.state);
            self.shared.gone.store(true, Ordering::Relaxed);
            let counted = self.shared.woken.load(Ordering::Relaxed);
            let key = self.shared.key.clone();
            st.update(&key, |e| {
                e.futures = e.futures.saturating_sub(1);
                if counted {
                    e.ready = e.ready.saturating_sub(1);
                }
            });
            st.forget_if_idle(&key);
            st.advance_clock();
            st.eligible(sched.quantum, Instant::now())
        };
        for w in wake {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests;
