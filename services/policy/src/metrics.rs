//! warden-policy's metrics (served by `warden_daemon::metrics` when `[daemon] metrics_listen` is
//! set): decisions by verdict and rule, how long a decision took, and how long its audit record
//! took to commit (with `audit.sync`, the journal's group `fdatasync`), and the records the
//! audit's retention removed.

use std::sync::LazyLock;
use std::time::Duration;

use warden_daemon::metrics::prometheus_client::metrics::counter::Counter;
use warden_daemon::metrics::prometheus_client::metrics::family::Family;
use warden_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use warden_daemon::metrics::prometheus_client::registry::{Registry, Unit};
use warden_daemon::metrics::{Exporter, latency_buckets};
use warden_proto::v1 as pb;

/// The process's metrics: one policy daemon per process.
pub struct Metrics {
    decisions: Family<[(&'static str, String); 2], Counter>,
    decide: Histogram,
    audit_commit: Histogram,
    audit_pruned: Family<[(&'static str, &'static str); 1], Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    decisions: Family::default(),
    decide: Histogram::new(latency_buckets()),
    audit_commit: Histogram::new(latency_buckets()),
    audit_pruned: Family::default(),
});

/// One decision answered: its verdict, its rule (the operator's rule names, or warden's own such
/// as `deadline_exceeded` and `audit.unavailable`) and how long it took in all.
pub fn decided(verdict: i32, rule: &str, took: Duration) {
    let m = &*METRICS;
    m.decisions
        .get_or_create(&[
            ("verdict", verdict_label(verdict).into()),
            ("rule", rule.into()),
        ])
        .inc();
    m.decide.observe(took.as_secs_f64());
}

/// One audit record written (and, with `audit.sync`, on disk).
pub fn audit_committed(took: Duration) {
    METRICS.audit_commit.observe(took.as_secs_f64());
}

/// Records removed by the audit's retention (`why`: `age` or `count`).
pub fn audit_pruned(why: &'static str, n: u64) {
    if n > 0 {
        METRICS
            .audit_pruned
            .get_or_create(&[("why", why)])
            .inc_by(n);
    }
}

/// `allow`, `deny` or `escalate`.
pub fn verdict_label(verdict: i32) -> &'static str {
    match pb::Verdict::try_from(verdict) {
        Ok(pb::Verdict::Allow) => "allow",
        Ok(pb::Verdict::Escalate) => "escalate",
        _ => "deny",
    }
}

/// The registry `GET /metrics` encodes.
pub fn exporter() -> Exporter {
    let m = &*METRICS;
    let mut registry = Registry::with_prefix("warden_policy");
    registry.register(
        "decisions",
        "Decisions answered, by verdict and by the rule that decided",
        m.decisions.clone(),
    );
    registry.register_with_unit(
        "decide_duration",
        "Time from a Decide request read to its answer, the audit record included",
        Unit::Seconds,
        m.decide.clone(),
    );
    registry.register_with_unit(
        "audit_commit_duration",
        "Time to write one audit record (with audit.sync, until the journal's fdatasync)",
        Unit::Seconds,
        m.audit_commit.clone(),
    );
    registry.register(
        "audit_pruned_records",
        "Audit records removed by retention (audit.retain_days: why=age; audit.max_records: why=count)",
        m.audit_pruned.clone(),
    );
    Exporter {
        registry,
        refresh: None,
    }
}
