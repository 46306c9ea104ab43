//! Admission of turns: at most `limits.max_active_turns` turns run at once across all
//! conversations; the rest wait in one FIFO and are told their place. Admission instead of
//! failure: an admitted turn has the CPU to have its permissions decided in time, instead of
//! 200 turns competing and some permissions denied for lack of time.
//!
//! Must never: let a turn overtake one that waited longer, or keep a slot after its turn ends
//! (a slot is an RAII permit).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct State {
    cap: usize,
    active: usize,
    next_ticket: u64,
    waiting: VecDeque<u64>,
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
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut s = self.admission.lock();
            s.active = s.active.saturating_sub(1);
        }
        self.admission.bump();
    }
}

impl Admission {
    pub fn new(cap: usize) -> Self {
        let (tx, _) = watch::channel(0);
        Admission {
            state: Arc::new(Mutex::new(State {
                cap: cap.max(1),
                active: 0,
                next_ticket: 0,
                waiting: VecDeque::new(),
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

    /// Waits for a slot in FIFO order. `queued(position)` is called whenever the turn's
    /// 1-based place in the queue changes (not at all when a slot is free at once). `None` when
    /// `cancel` fires first (the turn leaves the queue).
    pub async fn admit(
        &self,
        cancel: &CancellationToken,
        mut queued: impl FnMut(usize),
    ) -> Option<Permit> {
        let ticket = {
            let mut s = self.lock();
            if s.waiting.is_empty() && s.active < s.cap {
                s.active += 1;
                return Some(Permit {
                    admission: self.clone(),
                });
            }
            let t = s.next_ticket;
            s.next_ticket += 1;
            s.waiting.push_back(t);
            t
        };
        let mut told = 0usize;
        loop {
            let mut rx = self.changed.subscribe();
            {
                let mut s = self.lock();
                let pos = s.waiting.iter().position(|w| *w == ticket);
                match pos {
                    Some(0) if s.active < s.cap => {
                        s.waiting.pop_front();
                        s.active += 1;
                        drop(s);
                        // The next in line may fit too.
                        self.bump();
                        return Some(Permit {
                            admission: self.clone(),
                        });
                    }
                    Some(i) if i + 1 != told => {
                        told = i + 1;
                        drop(s);
                        queued(told);
                    }
                    _ => {}
                }
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = cancel.cancelled() => {
                    self.lock().waiting.retain(|w| *w != ticket);
                    self.bump();
                    return None;
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn turns_beyond_the_cap_wait_in_order_and_are_told_their_place() {
        let a = Admission::new(1);
        let never = CancellationToken::new();
        let first = a
            .admit(&never, |_| panic!("the first turn waits"))
            .await
            .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for name in ["b", "c"] {
            let mine = a.clone();
            let tx = tx.clone();
            let never = never.clone();
            waiters.push(tokio::spawn(async move {
                let p = mine
                    .admit(&never, |pos| {
                        let _ = tx.send((name, pos));
                    })
                    .await;
                let _ = tx.send((name, 0));
                p
            }));
            // b queues before c.
            tokio::time::timeout(Duration::from_secs(5), async {
                while a.figures().1 < if name == "b" { 1 } else { 2 } {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap();
        }
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
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let a = Admission::new(1);
        let never = CancellationToken::new();
        let _held = a.admit(&never, |_| {}).await.unwrap();
        let cancel = CancellationToken::new();
        let waiter = {
            let a = a.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move { a.admit(&cancel, |_| {}).await.is_none() })
        };
        while a.figures().1 == 0 {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
        assert!(waiter.await.unwrap());
        assert_eq!(a.figures(), (1, 0, 1));
    }
}
