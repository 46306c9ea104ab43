//! This supervisor as a cell (`[cell]`): its row in the shared store's `cell_registry`, written
//! at start and every `cell.refresh_ms` with the capacity gateways place conversations by (live
//! agents, free slots, memory), and its drain (no new placements; what is placed keeps running).
//!
//! A leaf: the figures come from a closure the binary hands in, so this file knows nothing of
//! conversations. Must never: write another cell's row, clear a drain an operator set while this
//! process runs, or hold a turn up on the store (the registry is written beside the turns, never
//! in their way; a store that is down only makes the cell look lost to gateways).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use warden_pgstate::{Pg, PgError};

use crate::config::CellSection;

/// What the cell reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub live_agents: usize,
    pub max_live_agents: usize,
    /// Live-agent slots not held by a conversation (warm agents count as free: the pool gives
    /// its slot up to a conversation).
    pub free_slots: usize,
    pub mem_total_bytes: u64,
    pub mem_avail_bytes: u64,
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes (zero where unreadable).
pub fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib.saturating_mul(1024))
            .unwrap_or(0)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

fn int(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The registration of one cell.
pub struct Cell {
    section: CellSection,
    pg: Pg,
    draining: AtomicBool,
}

impl Cell {
    /// Connects lazily; [`Cell::register`] is the first use.
    pub fn new(section: &CellSection) -> Result<Arc<Self>, PgError> {
        Ok(Arc::new(Self {
            pg: Pg::new(&section.store())?,
            section: section.clone(),
            draining: AtomicBool::new(false),
        }))
    }

    pub fn id(&self) -> &str {
        &self.section.id
    }

    /// Migrates the shared schema (under its advisory lock) and writes the row as a fresh start:
    /// not draining, `started_at` now.
    pub async fn register(&self, cap: Capacity) -> Result<(), PgError> {
        warden_pgstate::migrate::migrate(&self.pg).await?;
        let c = self.pg.client().await?;
        c.execute(
            "INSERT INTO cell_registry (cell_id, address, live_agents, max_live_agents, free_slots,
                 mem_total_bytes, mem_avail_bytes, draining, started_at, refreshed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, false, now(), now())
             ON CONFLICT (cell_id) DO UPDATE SET address = EXCLUDED.address,
                 live_agents = EXCLUDED.live_agents, max_live_agents = EXCLUDED.max_live_agents,
                 free_slots = EXCLUDED.free_slots, mem_total_bytes = EXCLUDED.mem_total_bytes,
                 mem_avail_bytes = EXCLUDED.mem_avail_bytes, draining = false,
                 started_at = now(), refreshed_at = now()",
            &[
                &self.section.id,
                &self.section.address,
                &int(cap.live_agents),
                &int(cap.max_live_agents),
                &int(cap.free_slots),
                &big(cap.mem_total_bytes),
                &big(cap.mem_avail_bytes),
            ],
        )
        .await?;
        Ok(())
    }

    /// One refresh. A drain set by anyone stays set (`draining OR`); this process's own drain is
    /// written with it.
    pub async fn refresh(&self, cap: Capacity) -> Result<(), PgError> {
        let c = self.pg.client().await?;
        let own_drain = self.draining.load(Ordering::Relaxed);
        let (live, max, free) = (
            int(cap.live_agents),
            int(cap.max_live_agents),
            int(cap.free_slots),
        );
        let (total, avail) = (big(cap.mem_total_bytes), big(cap.mem_avail_bytes));
        let q = tokio::time::timeout(
            self.pg.timeout(),
            c.execute(
                "UPDATE cell_registry SET address = $2, live_agents = $3, max_live_agents = $4,
                 free_slots = $5, mem_total_bytes = $6, mem_avail_bytes = $7,
                 draining = draining OR $8, refreshed_at = now()
             WHERE cell_id = $1",
                &[
                    &self.section.id,
                    &self.section.address,
                    &live,
                    &max,
                    &free,
                    &total,
                    &avail,
                    &own_drain,
                ],
            ),
        )
        .await;
        let n = q.map_err(|_| PgError::Timeout(self.pg.timeout().as_millis() as u64))??;
        if n == 0 {
            // The row was removed (an operator deleting a cell by hand): register again.
            drop(c);
            return self.register(cap).await;
        }
        Ok(())
    }

    /// Marks the cell draining now (SIGTERM): gateways stop placing new conversations here.
    pub async fn drain(&self) -> Result<(), PgError> {
        self.draining.store(true, Ordering::Relaxed);
        set_draining(&self.pg, &self.section.id, true)
            .await
            .map(|_| ())
    }

    /// Registers now (before the cell serves: a gateway that reaches this process must be able
    /// to see that it is a new start), then refreshes every `refresh_ms` until the process ends;
    /// failures are logged and retried at the next tick (the gateways' bound decides when this
    /// cell counts as lost).
    pub async fn start(self: &Arc<Self>, figures: Arc<dyn Fn() -> Capacity + Send + Sync>) {
        let first = self.register(figures()).await;
        if let Err(e) = &first {
            tracing::warn!(cell = %self.section.id, error = %e, "cannot register this cell yet; retrying every refresh");
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(me.section.refresh_ms));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = first.is_err();
            let mut registered = !failing;
            // The first tick is immediate: that write was just made.
            tick.tick().await;
            loop {
                tick.tick().await;
                let written = if registered {
                    me.refresh(figures()).await
                } else {
                    me.register(figures()).await
                };
                registered |= written.is_ok();
                match written {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!(cell = %me.section.id, "cell registry written again");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if !failing {
                            tracing::warn!(cell = %me.section.id, error = %e, "cannot refresh this cell's registry row; gateways count the cell lost once it is stale");
                        }
                        failing = true;
                    }
                }
            }
        });
    }
}

/// Sets or clears a cell's drain (`warden-supervisor --drain` / `--undrain`); false when the
/// store has no row for the cell (it never started).
pub async fn set_draining(pg: &Pg, cell_id: &str, draining: bool) -> Result<bool, PgError> {
    let c = pg.client().await?;
    let n = c
        .execute(
            "UPDATE cell_registry SET draining = $2 WHERE cell_id = $1",
            &[&cell_id, &draining],
        )
        .await?;
    Ok(n > 0)
}

/// Opens the store of `section` for a one-off call (the drain flags).
pub fn store(section: &CellSection) -> Result<Pg, PgError> {
    Pg::new(&section.store())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_meminfo() {
        let (total, avail) = memory();
        assert!(total > 0 && avail > 0 && avail <= total, "{total} {avail}");
    }

    #[test]
    fn figures_beyond_the_column_saturate() {
        assert_eq!(int(usize::MAX), i32::MAX);
        assert_eq!(big(u64::MAX), i64::MAX);
    }
}
