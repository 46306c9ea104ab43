//! The audit's retention, what it is: records older than `audit.retain_days`, and the oldest
//! beyond the newest `audit.max_records`, are removed by a background task
//! (`crate::pruner`) every `audit.prune_interval_ms`, oldest first, in passes of at most
//! [`PASS`] records (a large backlog is removed over several passes, never in one long stop).
//! Each backend removes its own way (`crate::audit_store::AuditStore::prune`); what is removed
//! is counted in `warden_policy_audit_pruned_records_total{why}`, in Status (`audit_pruned`) and
//! in one log line per run that removed anything — retention never drops a record silently.
//!
//! Must never: remove a record younger than the age bound while the log holds no more than
//! `max_records` (an operator's window is kept whole), or run a pass that holds appends back
//! (appends go on at the log's other end).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::AuditSection;

/// Most records one pass removes.
pub const PASS: usize = 1000;

/// What a pass may remove: records decided before `cutoff_unix_ms` (0 = no age bound), and the
/// oldest records beyond the newest `max_records` (0 = no count bound); at most `pass` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub cutoff_unix_ms: u64,
    pub max_records: u64,
    pub pass: usize,
}

impl Retention {
    /// The retention `audit` configures, as of `now_unix_ms`.
    pub fn of(audit: &AuditSection, now_unix_ms: u64) -> Self {
        let age_ms = audit.retain_days.saturating_mul(24 * 3600 * 1000);
        Retention {
            cutoff_unix_ms: if audit.retain_days == 0 {
                0
            } else {
                now_unix_ms.saturating_sub(age_ms)
            },
            max_records: audit.max_records,
            pass: PASS,
        }
    }

    /// Whether it bounds anything.
    pub fn bounds_anything(&self) -> bool {
        self.cutoff_unix_ms > 0 || self.max_records > 0
    }
}

/// What one pass removed, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Older than the age bound.
    pub by_age: u64,
    /// Beyond the count bound.
    pub by_count: u64,
}

impl Pruned {
    pub fn total(&self) -> u64 {
        self.by_age + self.by_count
    }
}

/// Records removed by retention since the daemon started (Status `audit_pruned`).
static PRUNED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Records removed by retention since the daemon started.
pub fn pruned_total() -> u64 {
    PRUNED_TOTAL.load(Ordering::Relaxed)
}

/// Counts `n` records removed (Status; the metric is counted by why, in `crate::pruner`).
pub fn count_pruned(n: u64) {
    PRUNED_TOTAL.fetch_add(n, Ordering::Relaxed);
}
