//! The permission bridge's policy half: build a `DecideRequest`, call `PolicyService.Decide`
//! with a deadline, and fail closed (DENY, reason `policy_unavailable`) on any error, timeout or
//! malformed answer. Then turn the verdict into the ACP answer with `warden_rules::choose_option`.
//!
//! The deadline is the larger of the configured one (`decide_deadline_ms`) and the one the
//! service describes (`PolicyService.Describe`: a person's time at warden-approver, nothing at
//! warden-policy), the latter never beyond `warden_proto::limits::MAX_DECIDE_DEADLINE_MS`; so
//! pointing `policy.socket` at an approver is the whole swap.
//!
//! Nothing over the service's request limits leaves the supervisor: the limits it states in its
//! description (`warden_decide::bounds`, the contract's defaults when it states none) are
//! checked before a request is sent ([`PolicyClient::oversized`]); a request over them is refused
//! here ([`refused`]: DENY, the bound's rule, kept as what kind, how large and its digest, never
//! the body), and no message can be larger than the contract's `MAX_DECIDE_MESSAGE_BYTES`, which
//! both sides set as their gRPC message bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

/// The rule name of a fail-closed decision.
pub const POLICY_UNAVAILABLE: &str = "policy_unavailable";

/// A decision as the supervisor will act on it.
#[derive(Debug, Clone)]
pub struct Decided {
    pub decision_id: String,
    pub verdict: pb::Verdict,
    pub option_id: Option<String>,
    pub reason: String,
    pub rule: String,
    /// `Some` when the turn must end after this answer, with the policy's typed reason
    /// (`Unspecified` = a plain refusal that ends the turn; an unknown value reads as that).
    pub end_turn: Option<pb::EndTurnReason>,
    pub latency: Duration,
    /// True when this is the supervisor's own fail-closed DENY.
    pub failed_closed: bool,
    /// The digest of the action the request asked about (`translate::judged`); an ALLOW named
    /// exactly this one (see `validate`).
    pub action_digest: String,
}

/// A permission request over the service's limits, as the supervisor keeps it: what kind (cut
/// to [`KEPT_TEXT`]), how large, the digest of its raw input, and the bound it broke — never
/// its body.
#[derive(Debug, Clone)]
pub struct Oversized {
    /// The bound's rule (`request.malformed.*`, the rule the service would answer with).
    pub rule: &'static str,
    /// Which bound, with the figures (the supervisor's own words).
    pub why: String,
    /// The tool call's kind and id, cut to [`KEPT_TEXT`].
    pub kind: String,
    pub tool_call_id: String,
    /// The encoded request's size and the raw input's, in bytes.
    pub bytes: usize,
    pub raw_input_bytes: usize,
    /// Hex SHA-256 of the raw input (as the policy's audit names a raw input).
    pub raw_input_sha256: String,
}

/// A raw input (or an agent's line) at least this long is measured, serialised and hashed on
/// the blocking pool: on a runtime thread it would hold every other conversation's tasks behind
/// it for tens of milliseconds.
pub const OFF_RUNTIME_BYTES: usize = 256 * 1024;

/// `Some` when `req` is over `limits`: the stand-in's figures, the raw input hashed. Runs
/// wherever it is called: over [`OFF_RUNTIME_BYTES`], call it on the blocking pool.
pub fn oversized_under(
    req: &pb::DecideRequest,
    limits: &warden_decide::bounds::Limits,
) -> Option<Oversized> {
    let m = warden_decide::bounds::check(req, limits).err()?;
    let tool = req.tool_call.as_ref();
    let raw = tool.map_or("", |t| t.raw_input_json.as_str());
    Some(Oversized {
        rule: m.rule,
        why: m.reason,
        kind: cut(tool.map_or("", |t| t.kind.as_str()), KEPT_TEXT),
        tool_call_id: cut(tool.map_or("", |t| t.id.as_str()), KEPT_TEXT),
        bytes: prost::Message::encoded_len(req),
        raw_input_bytes: raw.len(),
        raw_input_sha256: warden_rules::sha256_hex(raw.as_bytes()),
    })
}

/// How much of an agent-chosen text (kind, tool call id) a refusal keeps, in bytes.
pub const KEPT_TEXT: usize = 128;

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl Oversized {
    /// The title a refusal shows in place of the agent's.
    pub fn title(&self) -> String {
        format!(
            "(permission request refused before the policy: {} bytes, raw input sha256:{})",
            self.bytes, self.raw_input_sha256
        )
    }

    /// `req` with its body dropped: what the records and the caller's events carry instead.
    pub fn stand_in(&self, req: &pb::DecideRequest) -> pb::DecideRequest {
        pb::DecideRequest {
            request_id: req.request_id.clone(),
            subject: req.subject.clone(),
            boundary: req.boundary.clone(),
            tool_call: Some(pb::ToolCall {
                id: self.tool_call_id.clone(),
                kind: self.kind.clone(),
                title: self.title(),
                raw_input_json: String::new(),
                locations: Vec::new(),
            }),
            options: Vec::new(),
            current_mode: req.current_mode.clone(),
            deadline_unix_ms: 0,
            return_escalations: false,
        }
    }
}

/// The supervisor's own DENY of an oversized request (counted, logged; never sent).
pub fn refused(o: &Oversized) -> Decided {
    crate::metrics::oversized_permission(o.rule);
    let decision_id = format!("local-{}", uuid::Uuid::new_v4().simple());
    tracing::warn!(
        decision_id = %decision_id,
        rule = o.rule,
        kind = %o.kind,
        bytes = o.bytes,
        raw_input_bytes = o.raw_input_bytes,
        raw_input_sha256 = %o.raw_input_sha256,
        "permission request over the policy's limits: refused without sending it"
    );
    Decided {
        decision_id,
        verdict: pb::Verdict::Deny,
        option_id: None,
        reason: format!(
            "refused by the supervisor before asking the policy: {} (raw input sha256:{})",
            o.why, o.raw_input_sha256
        ),
        rule: o.rule.to_string(),
        end_turn: None,
        latency: Duration::ZERO,
        failed_closed: false,
        action_digest: String::new(),
    }
}

/// The default of `policy.answer_grace_ms`.
pub const DEFAULT_ANSWER_GRACE_MS: u64 = 500;

/// The pause between attempts while the policy service is unavailable.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How many recent latencies are kept for the status figures.
const LATENCY_RING: usize = 10_000;

/// Recent permission latencies (µs): the whole handler (request read -> answer queued, minus the
/// ACP client's own framing) and the Decide call inside it. Bounded rings.
#[derive(Default)]
pub struct BridgeStats {
    handler: std::collections::VecDeque<u32>,
    decide: std::collections::VecDeque<u32>,
    pub total: u64,
}

impl BridgeStats {
    fn push(ring: &mut std::collections::VecDeque<u32>, d: Duration) {
        if ring.len() == LATENCY_RING {
            ring.pop_front();
        }
        ring.push_back(d.as_micros().min(u32::MAX as u128) as u32);
    }

    /// (p50, p99) of a ring, µs.
    fn pcts(ring: &std::collections::VecDeque<u32>) -> (u32, u32) {
        if ring.is_empty() {
            return (0, 0);
        }
        let mut v: Vec<u32> = ring.iter().copied().collect();
        v.sort_unstable();
        let at = |p: f64| v[(((v.len() - 1) as f64) * p).round() as usize];
        (at(0.50), at(0.99))
    }

    /// Handler (p50, p99) and Decide (p50, p99), µs.
    pub fn percentiles(&self) -> ((u32, u32), (u32, u32)) {
        (Self::pcts(&self.handler), Self::pcts(&self.decide))
    }
}

/// How long a description is trusted before it is asked again (an approver restarted with a
/// longer deadline is followed within this).
const DESCRIBE_TTL: Duration = Duration::from_secs(10);

/// How long a failed or missing description waits before it is asked again.
const DESCRIBE_RETRY: Duration = Duration::from_secs(1);

/// How long one Describe may take (it runs before the Decide it is for, once per TTL).
const DESCRIBE_PATIENCE: Duration = Duration::from_millis(500);

/// What the service said it needs, and when it was asked.
#[derive(Debug, Clone)]
struct Described {
    asked: Instant,
    /// `None` when it could not be asked (down, hung, or an implementation without Describe).
    desc: Option<pb::PolicyDescription>,
}

/// The deadline one Decide gets, and where it came from (for `Status` and `warden doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveDeadline {
    /// The supervisor's own setting (`policy.decide_deadline_ms` or the agent's override).
    pub own: Duration,
    /// What the service described for the agent (capped), `None` when it did not say.
    pub described: Option<Duration>,
    /// max(own, described): what the supervisor waits.
    pub effective: Duration,
}

/// One policy endpoint: a replica's socket, with its own decision stream.
struct Endpoint {
    path: std::path::PathBuf,
    client: PolicyServiceClient<Channel>,
    /// One `DecideStream` for every Decide, when the service has it (see `decide_stream`).
    stream: crate::decide_stream::DecisionStream,
}

/// A client of the policy service: one endpoint, or several replicas of it (the first is
/// used until it is unavailable, then the next; see [`PolicyClient::with_failover`]).
#[derive(Clone)]
pub struct PolicyClient {
    endpoints: std::sync::Arc<Vec<Endpoint>>,
    /// The endpoint in use (index into `endpoints`).
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// How long past the decision deadline an answer may still arrive (see [`PolicyClient::decide`]).
    grace: Duration,
    failures: std::sync::Arc<AtomicU64>,
    stats: std::sync::Arc<std::sync::Mutex<BridgeStats>>,
    /// The last description (read on every Decide; written by one refresh at a time).
    described: std::sync::Arc<std::sync::RwLock<Option<Described>>>,
    refreshing: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl PolicyClient {
    /// Lazily connects to the socket at `path` (a restarted policy service is found again).
    pub fn new(path: &std::path::Path) -> Self {
        Self::with_failover(std::slice::from_ref(&path.to_path_buf()))
    }

    /// Replicas of one policy service (`policy.socket` first, then `policy.failover_sockets`),
    /// each connected lazily: a decision goes to the one in use; when it answers UNAVAILABLE
    /// (killed, restarting, its stream ended) the same request, with the same request id, goes
    /// to the next one at once, all within the decision's deadline. The replicas share their
    /// audit (PostgreSQL), so any of them may decide any request.
    pub fn with_failover(paths: &[std::path::PathBuf]) -> Self {
        let endpoints = paths
            .iter()
            .map(|p| Endpoint {
                path: p.clone(),
                // The contract's message bound on both sides (the service decodes at most
                // this); `oversized` keeps every request under it.
                client: PolicyServiceClient::new(warden_daemon::client::unix_channel(p))
                    .max_encoding_message_size(warden_proto::limits::MAX_DECIDE_MESSAGE_BYTES)
                    .max_decoding_message_size(warden_proto::limits::MAX_DECIDE_MESSAGE_BYTES),
                stream: Default::default(),
            })
            .collect();
        PolicyClient {
            endpoints: std::sync::Arc::new(endpoints),
            current: Default::default(),
            grace: Duration::from_millis(DEFAULT_ANSWER_GRACE_MS),
            failures: Default::default(),
            stats: Default::default(),
            described: Default::default(),
            refreshing: Default::default(),
        }
    }

    /// The endpoint in use and its index.
    fn endpoint(&self) -> (usize, &Endpoint) {
        let n = self.endpoints.len().max(1);
        let i = self.current.load(Ordering::Acquire) % n;
        // `endpoints` is never empty: built from `policy.socket` at least.
        (i, &self.endpoints[i])
    }

    /// Moves off endpoint `from` to the next one (unless another caller already moved).
    fn fail_over(&self, from: usize) {
        let n = self.endpoints.len();
        if n < 2 {
            return;
        }
        let next = (from + 1) % n;
        if self
            .current
            .compare_exchange(from, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::warn!(
                from = %self.endpoints[from].path.display(),
                to = %self.endpoints[next].path.display(),
                "policy replica unavailable: failing over"
            );
        }
    }

    /// The cached description while it is fresh: `Some(desc)` (which may itself be `None`).
    fn fresh_description(&self) -> Option<Option<pb::PolicyDescription>> {
        let g = self.described.read().unwrap_or_else(|p| p.into_inner());
        let d = g.as_ref()?;
        let ttl = if d.desc.is_some() {
            DESCRIBE_TTL
        } else {
            DESCRIBE_RETRY
        };
        (d.asked.elapsed() < ttl).then(|| d.desc.clone())
    }

    /// The service's description, asked again once it is older than [`DESCRIBE_TTL`] (or
    /// [`DESCRIBE_RETRY`] after a failure; a failure keeps the last good answer).
    pub async fn description(&self) -> Option<pb::PolicyDescription> {
        if let Some(d) = self.fresh_description() {
            return d;
        }
        // One refresh at a time; the others find its answer.
        let _one = self.refreshing.lock().await;
        if let Some(d) = self.fresh_description() {
            return d;
        }
        let mut client = self.endpoint().1.client.clone();
        let mut r = tonic::Request::new(pb::DescribeRequest {});
        r.set_timeout(DESCRIBE_PATIENCE);
        let got = match tokio::time::timeout(DESCRIBE_PATIENCE, client.describe(r)).await {
            Ok(Ok(d)) => Some(d.into_inner()),
            // An implementation without Describe needs no extra time.
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                Some(pb::PolicyDescription::default())
            }
            Ok(Err(s)) => {
                tracing::debug!(error = %s.message(), "the policy service did not describe itself");
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the policy service did not describe itself within {} ms",
                    DESCRIBE_PATIENCE.as_millis()
                );
                None
            }
        };
        let old = self
            .described
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|d| d.desc.clone());
        let desc = match (got, old) {
            (Some(new), old) => {
                if old.as_ref() != Some(&new) {
                    tracing::info!(
                        implementation = %new.implementation,
                        decide_deadline_ms = new.decide_deadline_ms,
                        agents = ?new.agent_decide_deadline_ms,
                        "the policy service described the time it needs"
                    );
                }
                Some(new)
            }
            (None, old) => old,
        };
        *self.described.write().unwrap_or_else(|p| p.into_inner()) = Some(Described {
            asked: Instant::now(),
            desc: desc.clone(),
        });
        desc
    }

    /// The deadline a Decide for `agent` gets: the larger of `own` and what the service
    /// describes, the description capped at `MAX_DECIDE_DEADLINE_MS`.
    pub async fn effective_deadline(&self, own: Duration, agent: &str) -> EffectiveDeadline {
        let described = self.description().await.map(|d| {
            let ms = d
                .agent_decide_deadline_ms
                .get(agent)
                .copied()
                .unwrap_or(d.decide_deadline_ms)
                .min(warden_proto::limits::MAX_DECIDE_DEADLINE_MS);
            Duration::from_millis(ms)
        });
        EffectiveDeadline {
            own,
            described,
            effective: described.map_or(own, |d| d.max(own)),
        }
    }

    /// The request limits the service states (its description), the contract's defaults for
    /// what it does not state or when it could not be asked.
    pub async fn limits(&self) -> warden_decide::bounds::Limits {
        self.description()
            .await
            .map(|d| warden_decide::bounds::Limits::from_description(&d))
            .unwrap_or_default()
    }

    /// `Some` when `req` is over the service's limits (it must then not be sent); a raw input
    /// over [`OFF_RUNTIME_BYTES`] is measured on the blocking pool.
    pub async fn oversized(&self, req: &pb::DecideRequest) -> Option<Oversized> {
        let limits = self.limits().await;
        let raw = req.tool_call.as_ref().map_or(0, |t| t.raw_input_json.len());
        if raw < OFF_RUNTIME_BYTES {
            return oversized_under(req, &limits);
        }
        // A terminal's argv or environment of megabytes (built here, not from a large line)
        // is measured and hashed off the runtime's threads too.
        let req = req.clone();
        match tokio::task::spawn_blocking(move || oversized_under(&req, &limits)).await {
            Ok(o) => o,
            // Only a panic gets here: what could not be measured is not sent.
            Err(e) => Some(Oversized {
                rule: "request.malformed.request-too-large",
                why: format!("the request could not be measured: {e}"),
                kind: String::new(),
                tool_call_id: String::new(),
                bytes: 0,
                raw_input_bytes: raw,
                raw_input_sha256: String::new(),
            }),
        }
    }

    /// `policy.answer_grace_ms`.
    pub fn with_answer_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Records one permission: the handler's time and the Decide call's.
    pub fn record(&self, handler: Duration, decide: Duration) {
        if let Ok(mut s) = self.stats.lock() {
            BridgeStats::push(&mut s.handler, handler);
            BridgeStats::push(&mut s.decide, decide);
            s.total += 1;
        }
    }

    /// Handler (p50, p99), Decide (p50, p99) in µs, and the count of permissions.
    pub fn figures(&self) -> ((u32, u32), (u32, u32), u64) {
        match self.stats.lock() {
            Ok(s) => {
                let (h, d) = s.percentiles();
                (h, d, s.total)
            }
            Err(_) => ((0, 0), (0, 0), 0),
        }
    }

    /// How many decisions failed closed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Calls Decide; never fails: a problem is a DENY `policy_unavailable`.
    ///
    /// `deadline` is when the decision must be *made*: it travels as an absolute time
    /// (`deadline_unix_ms`) and a policy records and answers DENY `deadline_exceeded` for a
    /// decision not ready by then, so its audit never holds an ALLOW that was not enforced. The
    /// answer may take `grace` longer to arrive (the audit write and the trip back); past that the
    /// policy is treated as hung and this denies on its own (the policy, when it gets to the
    /// request, finds the deadline passed and records a DENY too).
    pub async fn decide(&self, req: pb::DecideRequest, deadline: Duration) -> Decided {
        self.decide_judged(req, deadline, None).await
    }

    /// [`Self::decide`], with the digest of what `req` asks (`translate::judged(&req).digest()`)
    /// when the caller already computed it from this very request; None computes it here.
    pub async fn decide_judged(
        &self,
        mut req: pb::DecideRequest,
        deadline: Duration,
        digest: Option<String>,
    ) -> Decided {
        // The last gate: whatever path built it, nothing over the limits is sent.
        if let Some(o) = self.oversized(&req).await {
            return refused(&o);
        }
        let agent = req
            .subject
            .as_ref()
            .map(|s| s.agent.clone())
            .unwrap_or_default();
        let deadline = self.effective_deadline(deadline, &agent).await.effective;
        let started = Instant::now();
        req.deadline_unix_ms = std::time::SystemTime::now()
            .checked_add(deadline)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let wait = deadline + self.grace;
        let request_id = req.request_id.clone();
        let subject = req.subject.clone();
        let offered: Vec<String> = req.options.iter().map(|o| o.id.clone()).collect();
        let digest = digest.unwrap_or_else(|| crate::translate::judged(&req).digest());
        // UNAVAILABLE (nothing listening, a broken connection, an approver restarting) is retried
        // with the same request id until the deadline: an approver that restarts while a person
        // has not answered yet finds the held request again by its id, and with replicas the
        // next one is asked at once (a pause only after every one was tried). Anything else, and
        // the deadline itself, end the call.
        let res = tokio::time::timeout(wait, async {
            let mut unavailable = 0usize;
            // Set once the shared stream ended while this request was on it: its retries are
            // unary calls of their own, so a request that ends the stream (whatever in it a
            // service cannot take) ends it once, and never again for everyone else's.
            let mut off_stream = false;
            loop {
                let (i, ep) = self.endpoint();
                // Traced, each permission is its own unary Decide: one DecideStream has one set
                // of metadata, and each decision's traceparent travels in its call's metadata.
                let streamed = if warden_daemon::otel::enabled() || off_stream {
                    None
                } else {
                    ep.stream.decide(&ep.client, req.clone()).await
                };
                off_stream |= matches!(&streamed, Some(Err(s)) if crate::decide_stream::is_ended(s));
                let answer = match streamed {
                    Some(a) => a,
                    None => {
                        let mut client = ep.client.clone();
                        let mut r = tonic::Request::new(req.clone());
                        r.set_timeout(wait.saturating_sub(started.elapsed()));
                        warden_daemon::otel::inject(r.metadata_mut());
                        client.decide(r).await.map(tonic::Response::into_inner)
                    }
                };
                match answer {
                    Err(status)
                        if status.code() == tonic::Code::Unavailable
                            && started.elapsed() + RETRY_PAUSE < deadline =>
                    {
                        tracing::debug!(request_id = %request_id, endpoint = %ep.path.display(), error = %status.message(), "policy unavailable; retrying");
                        self.fail_over(i);
                        unavailable += 1;
                        if unavailable.is_multiple_of(self.endpoints.len().max(1)) {
                            tokio::time::sleep(RETRY_PAUSE).await;
                        }
                    }
                    other => return other,
                }
            }
        })
        .await;
        let latency = started.elapsed();
        let (class, why) = match res {
            Err(_) => (
                "timeout",
                format!(
                    "no answer within {} ms (+{} ms grace)",
                    deadline.as_millis(),
                    self.grace.as_millis()
                ),
            ),
            Ok(Err(status)) => (
                "unavailable",
                format!("call failed: {}: {}", status.code(), status.message()),
            ),
            Ok(Ok(d)) => match validate(&d, &offered, &digest) {
                Ok(verdict) => {
                    let end_turn = (d.end_turn
                        || d.end_turn_reason != pb::EndTurnReason::Unspecified as i32)
                        .then(|| d.end_turn_reason());
                    return Decided {
                        decision_id: d.decision_id,
                        verdict,
                        option_id: d.option_id,
                        reason: d.reason,
                        rule: d.rule,
                        end_turn,
                        latency,
                        failed_closed: false,
                        action_digest: digest,
                    };
                }
                Err(why) => ("malformed", format!("malformed answer: {why}")),
            },
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        crate::metrics::policy_failure(class);
        tracing::warn!(request_id = %request_id, reason = %why, "policy unavailable: denying");
        // The policy may have recorded (or may yet record) a decision nobody acts on.
        self.withdraw_later(request_id, subject, why.clone());
        Decided {
            decision_id: format!("local-{}", uuid::Uuid::new_v4().simple()),
            verdict: pb::Verdict::Deny,
            option_id: None,
            reason: format!("{POLICY_UNAVAILABLE}: {why}"),
            rule: POLICY_UNAVAILABLE.into(),
            end_turn: None,
            latency,
            failed_closed: true,
            action_digest: digest,
        }
    }
}

impl PolicyClient {
    /// Tells the policy, in the background, that `request_id`'s decision was not acted on, so
    /// its audit can say what was enforced. Best effort and bounded: a policy that is down
    /// still has the deadline in the request and records a late decision as DENY by itself.
    pub fn withdraw_later(&self, request_id: String, subject: Option<pb::Subject>, reason: String) {
        let mut client = self.endpoint().1.client.clone();
        tokio::spawn(async move {
            let req = pb::WithdrawRequest {
                request_id: request_id.clone(),
                reason,
                subject,
            };
            match tokio::time::timeout(WITHDRAW_PATIENCE, client.withdraw(req)).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    tracing::info!(request_id = %request_id, decision_id = %r.decision_id, superseded = r.superseded, "decision withdrawn");
                }
                Ok(Err(status)) => {
                    tracing::warn!(request_id = %request_id, error = %status, "the policy did not take the withdrawal")
                }
                Err(_) => {
                    tracing::warn!(request_id = %request_id, "no answer to the withdrawal")
                }
            }
        });
    }
}

/// How long a withdrawal waits for a paused or busy policy.
const WITHDRAW_PATIENCE: Duration = Duration::from_secs(60);

/// Checks a decision against the contract; the verdict when it holds. An ALLOW must name the
/// digest of the action asked about (`digest`): one that names none, or another, was not made
/// for this request and is acted on as nothing (a malformed answer, so DENY).
fn validate(d: &pb::Decision, offered: &[String], digest: &str) -> Result<pb::Verdict, String> {
    let verdict = pb::Verdict::try_from(d.verdict).map_err(|_| format!("verdict {}", d.verdict))?;
    if d.decision_id.is_empty() {
        return Err("empty decision_id".into());
    }
    if d.reason.trim().is_empty() {
        return Err("empty reason".into());
    }
    if d.rule.trim().is_empty() {
        return Err("empty rule".into());
    }
    if let Some(id) = &d.option_id
        && !offered.iter().any(|o| o == id)
    {
        return Err(format!("option {id:?} was not offered"));
    }
    if verdict == pb::Verdict::Allow && d.action_digest != digest {
        return Err(format!(
            "the ALLOW names action digest {:?}, not the request's {digest}",
            d.action_digest
        ));
    }
    Ok(verdict)
}

/// The rules library's verdict for a wire verdict. ESCALATE stays ESCALATE, which
/// `choose_option` answers like DENY (a refusal): the supervisor never asks a person itself.
pub fn rules_verdict(v: pb::Verdict) -> warden_rules::Verdict {
    match v {
        pb::Verdict::Allow => warden_rules::Verdict::Allow,
        pb::Verdict::Escalate => warden_rules::Verdict::Escalate,
        pb::Verdict::Deny => warden_rules::Verdict::Deny,
    }
}

/// Wire kind of a rules option kind.
pub fn option_kind_str(k: &warden_acp::PermissionOptionKind) -> &str {
    k.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> pb::Decision {
        pb::Decision {
            decision_id: "d1".into(),
            verdict: pb::Verdict::Allow as i32,
            option_id: None,
            reason: "ok".into(),
            rule: "floor.read".into(),
            end_turn: false,
            end_turn_reason: 0,
            request_id: String::new(),
            action_digest: "sha256:ab".into(),
        }
    }

    #[test]
    fn malformed_decisions_are_refused() {
        let offered = vec!["allow-once".to_string()];
        let validate = |d: &pb::Decision, o: &[String]| validate(d, o, "sha256:ab");
        assert_eq!(validate(&d(), &offered).unwrap(), pb::Verdict::Allow);
        // An ALLOW that names no digest, or another action's, is not an ALLOW of this request;
        // a DENY needs none.
        for other in ["", "sha256:cd"] {
            let mut x = d();
            x.action_digest = other.into();
            assert!(validate(&x, &offered).is_err(), "{other:?}");
            x.verdict = pb::Verdict::Deny as i32;
            assert_eq!(validate(&x, &offered).unwrap(), pb::Verdict::Deny);
        }
        let mut x = d();
        x.verdict = 99;
        assert!(validate(&x, &offered).is_err());
        let mut x = d();
        x.reason = " ".into();
        assert!(validate(&x, &offered).is_err());
        let mut x = d();
        x.rule.clear();
        assert!(validate(&x, &offered).is_err());
        let mut x = d();
        x.option_id = Some("allow-always".into());
        assert!(validate(&x, &offered).is_err());
        let mut x = d();
        x.decision_id.clear();
        assert!(validate(&x, &offered).is_err());
    }

    #[tokio::test]
    async fn nothing_listening_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let c = PolicyClient::new(&dir.path().join("none.sock"));
        let got = c
            .decide(
                pb::DecideRequest {
                    request_id: "r".into(),
                    ..Default::default()
                },
                Duration::from_millis(200),
            )
            .await;
        assert_eq!(got.verdict, pb::Verdict::Deny);
        assert_eq!(got.rule, POLICY_UNAVAILABLE);
        assert!(got.failed_closed);
        assert_eq!(c.failures(), 1);
    }

    #[tokio::test]
    async fn replicas_that_are_all_down_fail_closed_within_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let c = PolicyClient::with_failover(&[
            dir.path().join("a.sock"),
            dir.path().join("b.sock"),
            dir.path().join("c.sock"),
        ]);
        let t0 = Instant::now();
        let got = c
            .decide(
                pb::DecideRequest {
                    request_id: "r".into(),
                    ..Default::default()
                },
                Duration::from_millis(400),
            )
            .await;
        assert_eq!(got.verdict, pb::Verdict::Deny);
        assert_eq!(got.rule, POLICY_UNAVAILABLE);
        // The deadline plus the answer grace, with room for a loaded machine.
        assert!(t0.elapsed() < Duration::from_millis(400 + DEFAULT_ANSWER_GRACE_MS + 500));
        assert_eq!(c.failures(), 1);
    }
}
