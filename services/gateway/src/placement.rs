//! Where a new conversation goes, as a pure function: the best of K cells drawn at random from
//! the live, non-draining ones, by free slots ("the power of K choices": near the best cell's
//! load without every gateway replica piling onto the one cell that looked emptiest a moment
//! ago). A cell is live while its last report is younger than the bound. No I/O, no clock, no
//! randomness of its own: the caller hands in the reports' ages and a source of indexes.
//!
//! A placement counts against its cell at once: the deciding gateway takes each of its own
//! placements off the cell's free slots until a report of the cell written at least
//! [`SETTLE`] after the placement has been read (by then the conversation holds its slot there
//! and the report counts it). A burst of new conversations therefore spreads by what was just
//! placed, not by the counts of the last report (read every `cells.poll_ms`, written every
//! `cell.refresh_ms`), which would send the whole burst to the cell that looked emptiest.

use std::time::{Duration, Instant};

/// How long after a placement the cell's report is taken to count it: the time for the first
/// turn to reach the cell and its agent to take a slot, with room to spare. A report written
/// sooner may not count it, so the placement is still taken off the report's free slots.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Whether a cell's report written at `reported` counts a placement made on it at `placed`.
pub fn counted(placed: Instant, reported: Instant) -> bool {
    reported >= placed + SETTLE
}

/// The free slots of a cell whose report was written at `reported`, less this gateway's
/// placements on it (made at `placed`) that the report does not count yet. May go below zero:
/// a full cell with more placed on it ranks below a full cell with fewer.
pub fn free_now(reported_free: i64, reported: Instant, placed: &[Instant]) -> i64 {
    let pending = placed.iter().filter(|p| !counted(**p, reported)).count();
    reported_free.saturating_sub(i64::try_from(pending).unwrap_or(i64::MAX))
}

/// One cell as the registry showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    pub id: String,
    pub address: String,
    pub free_slots: i64,
    pub draining: bool,
    /// How long ago the cell last reported, by the store's clock.
    pub age_ms: u64,
    /// When the cell's process started (unix ms, the store's clock): another value is another
    /// process, whose agents are not the earlier one's.
    pub started_ms: i64,
}

impl CellView {
    /// Reported within `lost_after_ms`.
    pub fn live(&self, lost_after_ms: u64) -> bool {
        self.age_ms <= lost_after_ms
    }

    /// May take a new conversation.
    pub fn placeable(&self, lost_after_ms: u64) -> bool {
        self.live(lost_after_ms) && !self.draining
    }
}

/// The best of `k` cells drawn without replacement from the placeable ones; `pick(n)` returns
/// an index in `0..n` (random in the gateway, scripted in tests). Ties go to the first drawn.
/// None when no cell is placeable.
pub fn choose(
    cells: &[CellView],
    k: usize,
    lost_after_ms: u64,
    mut pick: impl FnMut(usize) -> usize,
) -> Option<&CellView> {
    let mut pool: Vec<&CellView> = cells
        .iter()
        .filter(|c| c.placeable(lost_after_ms))
        .collect();
    let mut best: Option<&CellView> = None;
    for _ in 0..k.max(1) {
        if pool.is_empty() {
            break;
        }
        let i = pick(pool.len()).min(pool.len() - 1);
        let drawn = pool.swap_remove(i);
        if best.is_none_or(|b| drawn.free_slots > b.free_slots) {
            best = Some(drawn);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(id: &str, free: i64, draining: bool, age_ms: u64) -> CellView {
        CellView {
            id: id.into(),
            address: format!("{id}:7443"),
            free_slots: free,
            draining,
            age_ms,
            started_ms: 0,
        }
    }

    #[test]
    fn the_best_of_the_drawn_cells_wins_not_the_best_of_all() {
        let cells = [
            cell("a", 1, false, 0),
            cell("b", 9, false, 0),
            cell("c", 5, false, 0),
        ];
        // Draws a (index 0), then from [c, b] index 0 = c: b (the best overall) was not drawn.
        let mut draws = [0usize, 0].into_iter();
        let got = choose(&cells, 2, 1000, |_| draws.next().unwrap_or(0));
        assert_eq!(got.map(|c| c.id.as_str()), Some("c"));
        // With K as large as the cells, the best overall wins whatever the draws.
        let got = choose(&cells, 3, 1000, |n| n - 1);
        assert_eq!(got.map(|c| c.id.as_str()), Some("b"));
    }

    #[test]
    fn lost_and_draining_cells_are_never_chosen() {
        let cells = [
            cell("lost", 50, false, 1001),
            cell("draining", 50, true, 0),
            cell("full", 0, false, 1000),
        ];
        for k in 1..5 {
            for first in 0..3 {
                let got = choose(&cells, k, 1000, |n| first % n);
                assert_eq!(got.map(|c| c.id.as_str()), Some("full"), "k={k}");
            }
        }
        assert!(choose(&cells[..2], 3, 1000, |_| 0).is_none());
        assert!(choose(&[], 3, 1000, |_| 0).is_none());
    }

    #[test]
    fn ties_go_to_the_first_drawn_and_a_bad_index_is_clamped() {
        let cells = [cell("a", 4, false, 0), cell("b", 4, false, 0)];
        let got = choose(&cells, 2, 1000, |n| n - 1);
        assert_eq!(got.map(|c| c.id.as_str()), Some("b"));
        let got = choose(&cells, 1, 1000, |_| usize::MAX);
        assert_eq!(got.map(|c| c.id.as_str()), Some("b"));
        // k = 0 is taken as 1: a conversation is always placed when a cell can take it.
        assert!(choose(&cells, 0, 1000, |_| 0).is_some());
    }

    #[test]
    fn a_burst_counted_at_once_splits_evenly_and_a_later_report_replaces_the_count() {
        // Two equal cells, 10 new conversations before either reports again: each placement is
        // taken off its cell's free slots at once, so the burst alternates (5/5), where the
        // reported counts alone (3 and 3 all along) would leave it to the ties.
        let t0 = Instant::now();
        let mut placed: [Vec<Instant>; 2] = [Vec::new(), Vec::new()];
        let mut seed = 11u64;
        for i in 0..10u64 {
            let at = t0 + Duration::from_millis(i * 10);
            let cells: Vec<CellView> = ["a", "b"]
                .iter()
                .zip(&placed)
                .map(|(id, p)| cell(id, free_now(3, t0, p), false, 0))
                .collect();
            let got = choose(&cells, 2, 1000, |n| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as usize % n
            })
            .map(|c| c.id.clone());
            placed[usize::from(got.as_deref() == Some("b"))].push(at);
        }
        assert_eq!([placed[0].len(), placed[1].len()], [5, 5]);
        // Below zero once the cell is over-placed: 3 free, 5 placed.
        assert_eq!(free_now(3, t0, &placed[0]), -2);
        // A report written less than SETTLE after a placement may not count it: still taken off.
        let soon = t0 + Duration::from_millis(500);
        assert_eq!(free_now(3, soon, &placed[0]), -2);
        // A report written SETTLE after the last placement counts them all: its figure stands.
        let later = t0 + Duration::from_millis(90) + SETTLE;
        assert_eq!(free_now(-1, later, &placed[0]), -1);
        assert!(counted(t0, t0 + SETTLE) && !counted(t0, t0 + SETTLE / 2));
    }

    #[test]
    fn random_draws_spread_conversations_over_equal_cells() {
        let cells = [cell("a", 3, false, 0), cell("b", 3, false, 0)];
        let mut seed = 7u64;
        let mut counts = [0usize; 2];
        for _ in 0..200 {
            let got = choose(&cells, 1, 1000, |n| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as usize % n
            });
            counts[usize::from(got.map(|c| c.id.as_str()) == Some("b"))] += 1;
        }
        assert!(counts[0] > 50 && counts[1] > 50, "{counts:?}");
    }
}
