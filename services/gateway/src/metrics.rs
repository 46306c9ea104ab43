//! warden-gateway's metrics (served by `warden_daemon::metrics` when `[daemon] metrics_listen` is
//! set): tasks entering each A2A state (a change of state, not every status message), and, read
//! from the gateway's state at each scrape, tasks live in memory, tasks stored, and the open
//! streaming subscriptions (SSE, and the gRPC binding's streams) across every caller.
//!
//! A leaf: it imports nothing of the gateway's; the binary hands it the figures.

use std::sync::LazyLock;

use warden_daemon::metrics::prometheus_client::metrics::counter::Counter;
use warden_daemon::metrics::prometheus_client::metrics::family::Family;
use warden_daemon::metrics::prometheus_client::metrics::gauge::Gauge;
use warden_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use warden_daemon::metrics::prometheus_client::registry::Registry;
use warden_daemon::metrics::prometheus_client::registry::Unit;
use warden_daemon::metrics::{Exporter, Refresh, long_buckets};

type RequestLabels = [(&'static str, &'static str); 2];

struct Metrics {
    entered: Family<[(&'static str, &'static str); 1], Counter>,
    requests: Family<RequestLabels, Histogram>,
    live: Gauge,
    stored: Gauge,
    streams: Gauge,
    auth_refused: Family<[(&'static str, &'static str); 1], Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    entered: Family::default(),
    // Up to hours: a blocking `message/send` lasts as long as its turn (and a person's answer).
    requests: Family::new_with_constructor(|| Histogram::new(long_buckets())),
    live: Gauge::default(),
    stored: Gauge::default(),
    streams: Gauge::default(),
    auth_refused: Family::default(),
});

/// A request refused as unauthenticated, by reason (`missing`, `invalid`, `expired`,
/// `audience`, `unknown_key`, ... a fixed set: `AuthFailure::reason`).
pub fn auth_refused(reason: &'static str) {
    METRICS
        .auth_refused
        .get_or_create(&[("reason", reason)])
        .inc();
}

/// A task's state changed to `state` (the proto name, `TASK_STATE_WORKING`, a fixed set).
pub fn task_entered(state: &'static str) {
    METRICS.entered.get_or_create(&[("state", state)]).inc();
}

/// One HTTP request answered: its front (`jsonrpc`, `rest`, `mcp`, `card`), its status, and the
/// time to its response head (a stream's head comes at once; its lifetime is not counted).
pub fn http_request(front: &'static str, status: u16, took: std::time::Duration) {
    let class = match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    METRICS
        .requests
        .get_or_create(&[("front", front), ("code", class)])
        .observe(took.as_secs_f64());
}

/// The state-read figures, set before each scrape.
pub fn set(tasks_live: usize, tasks_stored: usize, streams_open: usize) {
    let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let m = &*METRICS;
    m.live.set(g(tasks_live));
    m.stored.set(g(tasks_stored));
    m.streams.set(g(streams_open));
}

/// The registry `GET /metrics` encodes; `refresh` calls [`set`].
pub fn exporter(refresh: Refresh) -> Exporter {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("warden_gateway");
    r.register(
        "tasks_entered",
        "Tasks entering each A2A state (TASK_STATE_WORKING, TASK_STATE_COMPLETED, ...)",
        m.entered.clone(),
    );
    r.register(
        "tasks_live",
        "Tasks held in memory (not yet ended or swept)",
        m.live.clone(),
    );
    r.register(
        "tasks_stored",
        "Tasks in the durable store",
        m.stored.clone(),
    );
    r.register(
        "streams_open",
        "Open streaming subscriptions (SSE on the HTTP bindings, streams on the gRPC binding)",
        m.streams.clone(),
    );
    r.register(
        "auth_refused",
        "Requests refused as unauthenticated, by reason (missing, invalid, too_large, malformed, unknown_issuer, algorithm, unknown_key, keys_unavailable, signature, expired, not_yet_valid, audience, claims, certificate_unmapped)",
        m.auth_refused.clone(),
    );
    r.register_with_unit(
        "http_request_duration",
        "Time from an HTTP request to its response head, by front (jsonrpc, rest, mcp, card) and status class",
        Unit::Seconds,
        m.requests.clone(),
    );
    Exporter {
        registry: r,
        refresh: Some(refresh),
    }
}
