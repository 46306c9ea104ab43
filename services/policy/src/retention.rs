//! The audit's retention: records older than `audit.retain_days`, and the oldest beyond the
//! newest `audit.max_records`, are removed by a background task every `audit.prune_interval_ms`,
//! oldest first, in passes of at most [`PASS`] records (a large backlog is removed over several
//! passes, never in one long stop). Each backend removes its own way
//! ([`crate::audit_store::AuditStore::prune`]); what is removed is counted in
//! `warden_policy_audit_pruned_records_total{why}`, in Status (`audit_pruned`) and in one log
//! line per pass that removed anything — retention never drops a record silently.
//!
//! Must never: remove a record younger than the age bound while the log holds no more than
//! `max_records` (an operator's window is kept whole), or run a pass that holds appends back
//! (appends go on at the log's other end).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::audit_store::AuditStore;
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

/// Runs passes until one removes less than a full pass (the backlog is gone) or fails; counts
/// and logs what was removed.
pub async fn prune_now(
    audit: &dyn AuditStore,
    retention: Retention,
) -> Result<Pruned, crate::audit::AuditError> {
    let mut all = Pruned::default();
    if !retention.bounds_anything() {
        return Ok(all);
    }
    loop {
        let p = audit.prune(&retention).await?;
        all.by_age += p.by_age;
        all.by_count += p.by_count;
        crate::metrics::audit_pruned("age", p.by_age);
        crate::metrics::audit_pruned("count", p.by_count);
        PRUNED_TOTAL.fetch_add(p.total(), Ordering::Relaxed);
        if p.total() < retention.pass as u64 {
            break;
        }
        // A large backlog: let appends and other work in between passes.
        tokio::task::yield_now().await;
    }
    if all.total() > 0 {
        tracing::info!(
            by_age = all.by_age,
            by_count = all.by_count,
            cutoff_unix_ms = retention.cutoff_unix_ms,
            max_records = retention.max_records,
            backend = audit.backend(),
            "audit retention removed records"
        );
    }
    Ok(all)
}

/// The background task: a pass every `audit.prune_interval_ms` of the configuration in force
/// (read again each time, so a reload changes retention), until `stop`.
pub async fn run(
    audit: Arc<dyn AuditStore>,
    section: impl Fn() -> AuditSection,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    loop {
        let cfg = section();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        if let Err(e) = prune_now(&*audit, Retention::of(&cfg, now)).await {
            tracing::warn!(error = %e, "audit retention pass failed; retried at the next interval");
        }
        let wait = Duration::from_millis(cfg.prune_interval_ms.max(100));
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
