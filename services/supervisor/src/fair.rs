//! A queue that serves principals fairly: round robin across the principals that wait, first in
//! first out within one. Both waits of the supervisor use it (a turn slot in `admission`, a live
//! agent in `live`), so one caller with a hundred waiting tasks delays another caller's one task
//! by at most one place per round, not by a hundred.
//!
//! Must never: lose an entry, serve one principal's entries out of their order, or serve a
//! principal the caller says is not eligible (at its share).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// A waiter is told its place again at least this often, changed or not: its caller's stream
/// carries a status while it waits, so "waiting" can be told from "dead" (issue 30).
pub const REANNOUNCE: Duration = Duration::from_secs(10);

/// Waiting entries (ids) by principal, and the order principals are served in.
#[derive(Default)]
pub struct FairQueue {
    queues: HashMap<String, VecDeque<u64>>,
    /// Principals with waiting entries; the front one is served next (if eligible), then it
    /// goes to the back.
    ring: VecDeque<String>,
    len: usize,
}

impl FairQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries waiting for `principal`.
    pub fn len_of(&self, principal: &str) -> usize {
        self.queues.get(principal).map_or(0, VecDeque::len)
    }

    /// Principals waiting (for status).
    pub fn principals(&self) -> usize {
        self.ring.len()
    }

    /// Adds `id` behind `principal`'s other entries; a principal that was not waiting joins the
    /// round at its end.
    pub fn push(&mut self, principal: &str, id: u64) {
        let q = self.queues.entry(principal.to_string()).or_default();
        if q.is_empty() {
            self.ring.push_back(principal.to_string());
        }
        q.push_back(id);
        self.len += 1;
    }

    /// Removes `id` (a waiter that gave up); true when it was there.
    pub fn remove(&mut self, principal: &str, id: u64) -> bool {
        let Some(q) = self.queues.get_mut(principal) else {
            return false;
        };
        let Some(i) = q.iter().position(|x| *x == id) else {
            return false;
        };
        q.remove(i);
        self.len -= 1;
        if q.is_empty() {
            self.queues.remove(principal);
            self.ring.retain(|p| p != principal);
        }
        true
    }

    /// Takes the next entry of the first principal in the round that `eligible` admits; that
    /// principal moves to the back of the round. Principals passed over keep their place.
    pub fn pop_next(&mut self, eligible: impl Fn(&str) -> bool) -> Option<(String, u64)> {
        let i = self.ring.iter().position(|p| eligible(p))?;
        let principal = self.ring.remove(i)?;
        let q = self.queues.get_mut(&principal)?;
        let id = q.pop_front()?;
        self.len -= 1;
        if q.is_empty() {
            self.queues.remove(&principal);
        } else {
            self.ring.push_back(principal.clone());
        }
        Some((principal, id))
    }

    /// `id`'s 1-based place in the order the round would serve everyone waiting now (shares
    /// aside), or None when it does not wait.
    pub fn position(&self, principal: &str, id: u64) -> Option<usize> {
        let q = self.queues.get(principal)?;
        let i = q.iter().position(|x| *x == id)?;
        let mine = self.ring.iter().position(|p| p == principal)?;
        let mut before = 0;
        for (r, p) in self.ring.iter().enumerate() {
            let n = self.queues.get(p).map_or(0, VecDeque::len);
            // Each earlier round serves one of every principal still waiting; in the round of
            // `id`, the principals ahead of its own in the ring go first.
            before += n.min(i) + usize::from(r < mine && n > i);
        }
        Some(before + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_are_served_in_turn_and_each_in_its_own_order() {
        let mut q = FairQueue::default();
        for id in 1..=4 {
            q.push("alice", id);
        }
        q.push("bob", 10);
        q.push("bob", 11);
        q.push("carol", 20);
        // bob's first waits behind one of alice's, not behind all four.
        assert_eq!(q.position("bob", 10), Some(2));
        assert_eq!(q.position("carol", 20), Some(3));
        assert_eq!(q.position("alice", 2), Some(4));
        assert_eq!(q.position("bob", 11), Some(5));
        assert_eq!(q.position("alice", 4), Some(7));
        let order: Vec<u64> =
            std::iter::from_fn(|| q.pop_next(|_| true).map(|(_, id)| id)).collect();
        assert_eq!(order, vec![1, 10, 20, 2, 11, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.principals(), 0);
    }

    #[test]
    fn a_principal_at_its_share_is_passed_over_and_keeps_its_place() {
        let mut q = FairQueue::default();
        q.push("alice", 1);
        q.push("alice", 2);
        q.push("bob", 3);
        assert_eq!(q.pop_next(|p| p != "alice"), Some(("bob".into(), 3)));
        assert_eq!(q.pop_next(|p| p != "alice"), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_next(|_| true), Some(("alice".into(), 1)));
    }

    #[test]
    fn removed_entries_leave_no_trace() {
        let mut q = FairQueue::default();
        q.push("alice", 1);
        q.push("bob", 2);
        assert!(q.remove("alice", 1));
        assert!(!q.remove("alice", 1));
        assert_eq!(q.position("bob", 2), Some(1));
        assert_eq!(q.len_of("alice"), 0);
        assert_eq!(q.principals(), 1);
        assert_eq!(q.pop_next(|_| true), Some(("bob".into(), 2)));
        assert!(q.is_empty());
    }
}
