//! warden-supervisor's metrics (served by `warden_daemon::metrics` when `[daemon]
//! metrics_listen` is set): turns by how they ended and their fault class, egress connections by
//! outcome, permissions denied because the policy did not answer, permission requests refused for
//! their size before they were sent, and, read from the daemon's
//! state at each scrape, live and warm agents, conversations, and the two queues (turns waiting
//! for a turn slot, turns waiting for an agent). A leaf: the binary hands it the figures.
//!
//! Label values an agent could choose (its stop reason) are folded into a fixed set, so a hostile
//! agent cannot grow the daemon's memory or the operator's time series with made-up values.

use std::sync::LazyLock;
use std::sync::atomic::AtomicI64;

use warden_daemon::metrics::prometheus_client::metrics::counter::Counter;
use warden_daemon::metrics::prometheus_client::metrics::family::Family;
use warden_daemon::metrics::prometheus_client::metrics::gauge::Gauge;
use warden_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use warden_daemon::metrics::prometheus_client::registry::Registry;
use warden_daemon::metrics::prometheus_client::registry::Unit;
use warden_daemon::metrics::{Exporter, Refresh, long_buckets};

type Labels2 = [(&'static str, &'static str); 2];

struct Metrics {
    turns: Family<Labels2, Counter>,
    turn_duration: Histogram,
    egress: Family<[(&'static str, &'static str); 1], Counter>,
    policy_failures: Family<[(&'static str, &'static str); 1], Counter>,
    refused: Family<[(&'static str, &'static str); 1], Counter>,
    between_turns: Family<[(&'static str, &'static str); 1], Counter>,
    oversized: Family<[(&'static str, &'static str); 1], Counter>,
    live_agents: Gauge<i64, AtomicI64>,
    warm_agents: Gauge<i64, AtomicI64>,
    max_live_agents: Gauge<i64, AtomicI64>,
    conversations: Gauge<i64, AtomicI64>,
    turns_running: Gauge<i64, AtomicI64>,
    turns_waiting_admission: Gauge<i64, AtomicI64>,
    turns_waiting_agent: Gauge<i64, AtomicI64>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    turns: Family::default(),
    // A turn may wait up to an hour for a person's answer, several times over.
    turn_duration: Histogram::new(long_buckets()),
    egress: Family::default(),
    policy_failures: Family::default(),
    refused: Family::default(),
    between_turns: Family::default(),
    oversized: Family::default(),
    live_agents: Gauge::default(),
    warm_agents: Gauge::default(),
    max_live_agents: Gauge::default(),
    conversations: Gauge::default(),
    turns_running: Gauge::default(),
    turns_waiting_admission: Gauge::default(),
    turns_waiting_agent: Gauge::default(),
});

/// The stop reasons ACP names, plus warden's own; anything else an agent says is `other`.
pub fn stop_label(reason: &str) -> &'static str {
    match reason {
        "end_turn" => "end_turn",
        "max_tokens" => "max_tokens",
        "max_turn_requests" => "max_turn_requests",
        "refusal" => "refusal",
        "cancelled" => "cancelled",
        "fault" => "fault",
        _ => "other",
    }
}

/// One turn ended (its `TurnStop` is being sent): how, and its fault class's name
/// (`fault::name`) if it failed.
pub fn turn_ended(reason: &str, fault: Option<&'static str>) {
    let fault = fault.unwrap_or("");
    METRICS
        .turns
        .get_or_create(&[("stop_reason", stop_label(reason)), ("fault_class", fault)])
        .inc();
}

/// How long a turn that ran took, from its start to its stop.
pub fn turn_took(took: std::time::Duration) {
    METRICS.turn_duration.observe(took.as_secs_f64());
}

/// A call (OpenConversation, or RunTurn with or without its open) refused with a fault before
/// any turn ran: at capacity, an agent that could not start, a wrong option.
pub fn refused(fault_class: &'static str) {
    METRICS
        .refused
        .get_or_create(&[("fault_class", fault_class)])
        .inc();
}

/// Every fault class a refusal can name, so each `refused` series exists from the start at 0
/// (the binary lists them: this leaf does not import `fault`, which counts through it).
pub fn known_refusals(classes: impl IntoIterator<Item = &'static str>) {
    for c in classes {
        let _ = METRICS.refused.get_or_create(&[("fault_class", c)]);
    }
}

/// One egress connection finished or was refused (per agent and destination, the egress records
/// under `<state>/egress/` say more).
pub fn egress_connection(allowed: bool, status: u16) {
    let outcome = if allowed {
        "allowed"
    } else if status >= 500 {
        "failed"
    } else {
        "refused"
    };
    METRICS.egress.get_or_create(&[("outcome", outcome)]).inc();
}

/// A permission the policy did not answer in time (`timeout`), could not be asked
/// (`unavailable`), or answered malformed (`malformed`): denied by the supervisor itself.
pub fn policy_failure(why: &'static str) {
    METRICS.policy_failures.get_or_create(&[("why", why)]).inc();
}

/// The methods an agent's request between turns is counted under (`between_turns`); any other
/// method name is `other`, so an agent cannot make up series.
pub const BETWEEN_TURNS_METHODS: &[&str] = &[
    "session/request_permission",
    "fs/read_text_file",
    "fs/write_text_file",
    "terminal/create",
    "terminal/output",
    "terminal/wait_for_exit",
    "elicitation/create",
    "other",
];

/// An agent's request that arrived while no turn of its conversation was running: refused by
/// the supervisor without reaching the policy, a file or the caller.
pub fn between_turns(method: &str) {
    let label = BETWEEN_TURNS_METHODS
        .iter()
        .copied()
        .find(|m| *m == method)
        .unwrap_or("other");
    METRICS
        .between_turns
        .get_or_create(&[("method", label)])
        .inc();
}

/// The bounds a permission request can break (`warden_decide::bounds`, its rule without the
/// `request.malformed.` prefix): the label set of `oversized_permissions`.
pub const OVERSIZED_BOUNDS: &[&str] = &[
    "raw-input-too-large",
    "title-too-large",
    "too-many-locations",
    "too-deeply-nested",
    "too-many-options",
    "request-too-large",
];

/// A permission request over the policy's limits, refused by the supervisor without sending it
/// (`rule`: the bound's rule; one outside the known set counts as `other`).
pub fn oversized_permission(rule: &str) {
    let bound = rule.strip_prefix("request.malformed.").unwrap_or(rule);
    let bound = OVERSIZED_BOUNDS
        .iter()
        .copied()
        .find(|b| *b == bound)
        .unwrap_or("other");
    METRICS.oversized.get_or_create(&[("bound", bound)]).inc();
}

/// The state-read figures, set before each scrape.
pub struct Figures {
    pub live_agents: usize,
    pub warm_agents: usize,
    pub max_live_agents: usize,
    pub conversations: usize,
    pub turns_running: usize,
    pub turns_waiting_admission: usize,
    pub turns_waiting_agent: usize,
}

/// Sets the gauges from `f`.
pub fn set(f: Figures) {
    let m = &*METRICS;
    let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    m.live_agents.set(g(f.live_agents));
    m.warm_agents.set(g(f.warm_agents));
    m.max_live_agents.set(g(f.max_live_agents));
    m.conversations.set(g(f.conversations));
    m.turns_running.set(g(f.turns_running));
    m.turns_waiting_admission.set(g(f.turns_waiting_admission));
    m.turns_waiting_agent.set(g(f.turns_waiting_agent));
}

/// The registry `GET /metrics` encodes; `refresh` calls [`set`] with the daemon's figures.
pub fn exporter(refresh: Refresh) -> Exporter {
    let m = &*METRICS;
    // Every series of a fixed label set exists from the start at 0, so `increase()` sees the
    // first one and a dashboard shows a zero rather than no data.
    for outcome in ["allowed", "refused", "failed"] {
        let _ = m.egress.get_or_create(&[("outcome", outcome)]);
    }
    for why in ["timeout", "unavailable", "malformed"] {
        let _ = m.policy_failures.get_or_create(&[("why", why)]);
    }
    for method in BETWEEN_TURNS_METHODS {
        let _ = m.between_turns.get_or_create(&[("method", method)]);
    }
    for bound in OVERSIZED_BOUNDS {
        let _ = m.oversized.get_or_create(&[("bound", bound)]);
    }
    let mut r = Registry::with_prefix("warden_supervisor");
    r.register(
        "turns",
        "Turns ended, by stop reason (end_turn, cancelled, fault, ...) and fault class",
        m.turns.clone(),
    );
    r.register_with_unit(
        "turn_duration",
        "Time from a turn's start to its stop (its queueing, its agent's work and every answer it waited for)",
        Unit::Seconds,
        m.turn_duration.clone(),
    );
    r.register(
        "egress_connections",
        "Connections through agents' egress proxies, by outcome (allowed, refused, failed)",
        m.egress.clone(),
    );
    r.register(
        "policy_failures",
        "Permissions denied by the supervisor because the policy did not answer in time (timeout), could not be reached (unavailable) or answered malformed",
        m.policy_failures.clone(),
    );
    r.register(
        "oversized_permissions",
        "Permission requests over the policy's limits (size, count, nesting), refused by the supervisor without sending them, by the bound they broke",
        m.oversized.clone(),
    );
    r.register(
        "refused",
        "Calls refused with a fault before any turn ran (OpenConversation, RunTurn), by fault class",
        m.refused.clone(),
    );
    r.register(
        "requests_between_turns",
        "Agent requests refused because no turn of their conversation was running (never decided, served or asked), by method",
        m.between_turns.clone(),
    );
    r.register(
        "live_agents",
        "Agent processes alive, warm ones included",
        m.live_agents.clone(),
    );
    r.register(
        "warm_agents",
        "Warm agents waiting for a conversation",
        m.warm_agents.clone(),
    );
    r.register(
        "max_live_agents",
        "The cap on live agents (limits.max_live_agents)",
        m.max_live_agents.clone(),
    );
    r.register(
        "conversations",
        "Open conversations",
        m.conversations.clone(),
    );
    r.register(
        "turns_running",
        "Turns holding a turn slot",
        m.turns_running.clone(),
    );
    r.register(
        "turns_waiting_admission",
        "Turns queued for a turn slot (the admission queue)",
        m.turns_waiting_admission.clone(),
    );
    r.register(
        "turns_waiting_agent",
        "Turns holding their slot and queued for a live agent (every agent busy)",
        m.turns_waiting_agent.clone(),
    );
    Exporter {
        registry: r,
        refresh: Some(refresh),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_own_stop_reason_is_folded_into_other() {
        assert_eq!(stop_label("end_turn"), "end_turn");
        assert_eq!(stop_label("cancelled"), "cancelled");
        // A hostile agent's made-up reasons all land on one series.
        for made_up in ["x", "end_turn ", "🙂", &"a".repeat(10_000)] {
            assert_eq!(stop_label(made_up), "other");
        }
    }
}
