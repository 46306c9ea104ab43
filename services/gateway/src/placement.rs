//! Where a new conversation goes, as a pure function: the best of K cells drawn at random from
//! the live, non-draining ones, by free slots ("the power of K choices": near the best cell's
//! load without every gateway replica piling onto the one cell that looked emptiest a moment
//! ago). A cell is live while its last report is younger than the bound. No I/O, no clock, no
//! randomness of its own: the caller hands in the reports' ages and a source of indexes.

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
