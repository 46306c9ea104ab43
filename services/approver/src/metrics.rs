//! warden-approver's metrics (served by `warden_daemon::metrics` when `[daemon] metrics_listen`
//! is set): its answers by verdict and rule (`approval.no-response` is a person who did not answer
//! in time), how long an answer took (a person's time included), and, read from the queue at each
//! scrape, the requests waiting for a person and how long the oldest has waited.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use warden_daemon::metrics::prometheus_client::metrics::counter::Counter;
use warden_daemon::metrics::prometheus_client::metrics::family::Family;
use warden_daemon::metrics::prometheus_client::metrics::gauge::Gauge;
use warden_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use warden_daemon::metrics::prometheus_client::registry::{Registry, Unit};
use warden_daemon::metrics::{Exporter, Refresh, long_buckets};
use warden_proto::v1 as pb;

struct Metrics {
    decisions: Family<[(&'static str, String); 2], Counter>,
    decide: Histogram,
    pending: Gauge<i64>,
    oldest_pending_age: Gauge<f64, AtomicU64>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    decisions: Family::default(),
    decide: Histogram::new(long_buckets()),
    pending: Gauge::default(),
    oldest_pending_age: Gauge::default(),
});

/// One Decide answered (`rule` is the upstream's or the approver's own).
pub fn decided(d: &pb::Decision, took: Duration) {
    let verdict = match pb::Verdict::try_from(d.verdict) {
        Ok(pb::Verdict::Allow) => "allow",
        Ok(pb::Verdict::Escalate) => "escalate",
        _ => "deny",
    };
    let m = &*METRICS;
    m.decisions
        .get_or_create(&[("verdict", verdict.into()), ("rule", d.rule.clone())])
        .inc();
    m.decide.observe(took.as_secs_f64());
}

/// Sets the queue's gauges: how many wait, and since when the oldest does (ms since the epoch).
pub fn set_pending(count: usize, oldest_created_unix_ms: Option<u64>, now_unix_ms: u64) {
    let m = &*METRICS;
    m.pending.set(i64::try_from(count).unwrap_or(i64::MAX));
    let age = oldest_created_unix_ms
        .map(|t| now_unix_ms.saturating_sub(t) as f64 / 1000.0)
        .unwrap_or(0.0);
    m.oldest_pending_age.set(age);
}

/// The registry `GET /metrics` encodes; `refresh` calls [`set_pending`].
pub fn exporter(refresh: Refresh) -> Exporter {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("warden_approver");
    r.register(
        "decisions",
        "Decide answers, by verdict and rule (approval.no-response: nobody answered in time)",
        m.decisions.clone(),
    );
    r.register_with_unit(
        "decide_duration",
        "Time from a Decide request to its answer, a person's time included",
        Unit::Seconds,
        m.decide.clone(),
    );
    r.register(
        "approvals_pending",
        "Requests waiting for a person",
        m.pending.clone(),
    );
    r.register_with_unit(
        "oldest_pending_age",
        "How long the oldest request waiting for a person has waited (0 when none waits)",
        Unit::Seconds,
        m.oldest_pending_age.clone(),
    );
    Exporter {
        registry: r,
        refresh: Some(refresh),
    }
}
