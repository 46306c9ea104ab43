//! The audit's retention task (what retention is: `crate::retention`): a pass every
//! `audit.prune_interval_ms` over the audit store, passes repeated until the backlog is gone,
//! each removed record counted and each run that removed any logged.
//!
//! Must never: hold appends back (a backend removes at the log's other end), or stop the daemon
//! on a failed pass (it is retried at the next interval).

use std::sync::Arc;
use std::time::Duration;

use crate::audit_store::AuditStore;
use crate::config::AuditSection;
use crate::retention::{Pruned, Retention};

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
        crate::retention::count_pruned(p.total());
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
