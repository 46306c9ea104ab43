//! The PolicyService and AdminService implementations over one shared state: the engine in
//! force (swapped whole on reload), the audit log, and the figures for Status.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};
use warden_containment::RealFs;
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_server::AdminService;
use warden_proto::v1::policy_service_server::PolicyService;
use warden_rules::{AgentHomes, Engine, RootCheck};

use crate::audit_store::AuditStore;
use crate::config::{AuditSection, Config, Sources};
use warden_decide::DecideSection;
use warden_decide::convert;
use warden_decide::fsview::DecisionFs;

/// What decides right now. Replaced as a whole, so a request sees one version throughout.
pub struct Active {
    pub engine: Engine,
    pub decide: DecideSection,
    pub audit: AuditSection,
    pub version: u64,
}

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReloadError(pub String);

/// State shared by both services.
pub struct PolicyState {
    active: RwLock<Arc<Active>>,
    reload_lock: Mutex<()>,
    sources: Sources,
    audit: Arc<dyn AuditStore>,
    /// Where the audit lives, for Status (`[store]`, no password).
    store: String,
    started: Instant,
    decisions: AtomicU64,
    /// Decisions answered DENY `audit.unavailable` because their record could not be written
    /// (the database unreachable, the disk failing): counted, not audited.
    not_audited: AtomicU64,
    /// Reloads tried (SIGHUP or admin), and the error of the last one refused: an operator (and
    /// a test) can see that a reload happened even when it changed nothing.
    reload_attempts: AtomicU64,
    last_reload_error: Mutex<String>,
    /// What `Withdraw` needs: recent requests' decisions and requests withdrawn before they
    /// were decided (bounded; see [`Ledger`]).
    ledger: Mutex<Ledger>,
    listeners: RwLock<Vec<String>>,
    /// Records of decisions answered DENY `audit.unavailable`, each stating that answer, on
    /// their way to the audit log (see [`corrections`]): bounded, the overflow counted.
    corrections: tokio::sync::mpsc::Sender<pb::AuditRecord>,
    corrections_dropped: AtomicU64,
    /// The boundary validator with this host's homes, read and resolved once at start (the
    /// same `AgentHomes::from_host` the supervisor's workspace check uses) and handed to every
    /// engine, reloaded ones included. It remembers a root it accepted for
    /// [`ROOT_CHECK_TTL`] (`RootCheck::remembering`).
    root_check: RootCheck,
}

/// How long an accepted boundary root is taken as checked: every permission of a conversation
/// names the same root, whose ancestors belong to the supervisor or the operator, never to the
/// agent; checking it once a second instead of once per decision was about a fifth of the
/// daemon's CPU per decision.
pub const ROOT_CHECK_TTL: std::time::Duration = std::time::Duration::from_secs(1);

impl PolicyState {
    /// Builds the state from an already loaded configuration (version 1).
    pub fn new(
        config: &Config,
        sources: Sources,
        audit: Arc<dyn AuditStore>,
    ) -> Result<Self, ReloadError> {
        let root_check =
            RootCheck::new(&AgentHomes::from_host(), &RealFs).remembering(ROOT_CHECK_TTL);
        let engine = Engine::new(config.policy.clone())
            .map_err(|e| ReloadError(e.to_string()))?
            .with_root_check(root_check.clone());
        let (corrections, pending) = tokio::sync::mpsc::channel(CORRECTIONS_QUEUE);
        tokio::spawn(write_corrections(audit.clone(), pending));
        Ok(Self {
            active: RwLock::new(Arc::new(Active {
                engine,
                decide: config.decide.clone(),
                audit: config.audit.clone(),
                version: 1,
            })),
            reload_lock: Mutex::new(()),
            sources,
            audit,
            store: config.store.describe(),
            started: Instant::now(),
            decisions: AtomicU64::new(0),
            not_audited: AtomicU64::new(0),
            reload_attempts: AtomicU64::new(0),
            last_reload_error: Mutex::new(String::new()),
            ledger: Mutex::new(Ledger::default()),
            listeners: RwLock::new(Vec::new()),
            corrections,
            corrections_dropped: AtomicU64::new(0),
            root_check,
        })
    }

    /// The configuration in force.
    pub fn active(&self) -> Arc<Active> {
        match self.active.read() {
            Ok(g) => g.clone(),
            // A panic while holding the lock cannot leave a half-written Arc; keep serving.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set_listeners(&self, l: Vec<String>) {
        if let Ok(mut g) = self.listeners.write() {
            *g = l;
        }
    }

    /// Re-reads the configuration sources; on any error the rules in force stay.
    /// Listener and daemon settings are read but only take effect at restart.
    pub fn reload(&self) -> Result<u64, ReloadError> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.reload_locked();
        let mut last = self
            .last_reload_error
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(_) => last.clear(),
            Err(e) => *last = e.0.clone(),
        }
        // Counted after the outcome is in place, so a reader that sees the count sees its result.
        self.reload_attempts.fetch_add(1, Ordering::Release);
        result
    }

    fn reload_locked(&self) -> Result<u64, ReloadError> {
        let loaded = self
            .sources
            .load()
            .map_err(|e| ReloadError(e.to_string()))?;
        let engine = Engine::new(loaded.value.policy.clone())
            .map_err(|e| ReloadError(e.to_string()))?
            .with_root_check(self.root_check.clone());
        let version = self.active().version + 1;
        let next = Arc::new(Active {
            engine,
            decide: loaded.value.decide.clone(),
            audit: loaded.value.audit.clone(),
            version,
        });
        match self.active.write() {
            Ok(mut g) => *g = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        tracing::info!(policy_version = version, source = %self.sources.describe(), "policy reloaded");
        Ok(version)
    }

    /// Decides one request and records it; the record is written (and, with `audit.sync`,
    /// on disk) before this returns.
    pub async fn decide(&self, req: &pb::DecideRequest) -> pb::Decision {
        let t0 = Instant::now();
        let active = self.active();
        let decision_id = uuid::Uuid::new_v4().to_string();
        let outcome = match convert::to_input(req, &active.decide) {
            // Past the caller's deadline before it was even read: the caller is already denying.
            _ if past_deadline(req.deadline_unix_ms) => deadline_exceeded(&decision_id, req),
            Ok(input) => {
                // The real filesystem, each path looked up once per decision (see `fsview`).
                let fs = DecisionFs::new(RealFs);
                // The caller can hold an escalation for a person (an approver chaining to this
                // service asks with `return_escalations`), or the operator configured it so.
                let d = if active.decide.return_escalations || req.return_escalations {
                    active.engine.decide_with_approver(&input, &fs)
                } else {
                    active.engine.decide(&input, &fs)
                };
                pb::Decision {
                    decision_id: decision_id.clone(),
                    verdict: convert::verdict(d.verdict) as i32,
                    option_id: d.option_id,
                    reason: d.reason,
                    rule: d.rule,
                    end_turn: d.end_turn.is_some(),
                    end_turn_reason: convert::end_turn_reason(d.end_turn) as i32,
                    request_id: String::new(),
                    action_digest: String::new(),
                }
            }
            Err(m) => pb::Decision {
                decision_id: decision_id.clone(),
                verdict: pb::Verdict::Deny as i32,
                option_id: None,
                reason: format!("malformed request: {}", m.reason),
                rule: m.rule.to_string(),
                end_turn: false,
                end_turn_reason: 0,
                request_id: String::new(),
                action_digest: String::new(),
            },
        };
        // Ready, but after the caller's deadline: what is recorded is what the caller enforces.
        let outcome = if past_deadline(req.deadline_unix_ms) {
            deadline_exceeded(&decision_id, req)
        } else {
            outcome
        };
        // Every answer names what it judged: the caller acts on an ALLOW only for this digest.
        let judged = convert::judged(req);
        let mut outcome = outcome;
        outcome.action_digest = judged.digest.clone();
        // Withdrawn before it was decided: the caller has already refused it. Otherwise the
        // decision is in the ledger before it is written, so a Withdraw racing the write finds it.
        let outcome = {
            let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
            match ledger.take_withdrawn(&req.request_id) {
                Some(why) => pb::Decision {
                    action_digest: judged.digest.clone(),
                    ..withdrawn(&decision_id, &why)
                },
                None => {
                    ledger.decided(&req.request_id, &decision_id, outcome.verdict);
                    outcome
                }
            }
        };
        // Borrowed, not cloned: the raw input may be up to `max_raw_input_bytes` long.
        let (kind, title, raw) = req
            .tool_call
            .as_ref()
            .map(|t| (t.kind.as_str(), t.title.as_str(), t.raw_input_json.as_str()))
            .unwrap_or_default();
        let record = pb::AuditRecord {
            decision_id: decision_id.clone(),
            request_id: req.request_id.clone(),
            subject: req.subject.clone(),
            tool_kind: kind.chars().take(64).collect(),
            tool_title: title.chars().take(512).collect(),
            raw_input_sha256: hex::encode(Sha256::digest(raw.as_bytes())),
            verdict: outcome.verdict,
            option_id: outcome.option_id.clone(),
            rule: outcome.rule.clone(),
            reason: outcome.reason.clone(),
            policy_version: active.version,
            latency_micros: t0.elapsed().as_micros() as u64,
            decided_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            end_turn: outcome.end_turn,
            supersedes_decision_id: String::new(),
            judged: Some(judged),
            // Set by the audit's bounds (`audit_bounds`) when a field is cut.
            elided_bytes: 0,
        };
        self.decisions.fetch_add(1, Ordering::Relaxed);
        let committing = Instant::now();
        let written = self
            .write_by(&record, active.audit.sync, req.deadline_unix_ms)
            .await;
        crate::metrics::audit_committed(committing.elapsed());
        if let Err(e) = written {
            crate::metrics::decided(pb::Verdict::Deny as i32, "audit.unavailable", t0.elapsed());
            // No record, no permission: the contract says the record exists before the answer.
            self.not_audited.fetch_add(1, Ordering::Relaxed);
            tracing::error!(decision_id = %decision_id, error = %e, "audit write failed; denying");
            let answer = pb::Decision {
                decision_id,
                verdict: pb::Verdict::Deny as i32,
                option_id: None,
                reason: format!("the audit log cannot be written ({e}); denying"),
                rule: "audit.unavailable".to_string(),
                end_turn: false,
                end_turn_reason: 0,
                request_id: String::new(),
                action_digest: String::new(),
            };
            // A Withdraw of this request finds the DENY that was answered, not the ALLOW decided.
            self.ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .decided(&req.request_id, &answer.decision_id, answer.verdict);
            // The record asked for may still land (a commit acknowledged after the deadline, a
            // journal synced late): what is recorded for this decision must be the DENY given.
            self.correct(enforced(record, &answer, t0.elapsed()));
            return answer;
        }
        let subject = record.subject.as_ref();
        let of_subject = |f: fn(&pb::Subject) -> &str| subject.map(f).unwrap_or("");
        tracing::info!(
            decision_id = %decision_id,
            request_id = %req.request_id,
            context_id = %of_subject(|s| &s.context_id),
            task_id = %of_subject(|s| &s.task_id),
            session_id = %of_subject(|s| &s.session_id),
            kind = %record.tool_kind,
            verdict = outcome.verdict,
            rule = %outcome.rule,
            policy_version = active.version,
            latency_us = record.latency_micros,
            "decided"
        );
        crate::metrics::decided(outcome.verdict, &outcome.rule, t0.elapsed());
        outcome
    }
}

impl PolicyState {
    /// Writes `record`, giving up at the caller's deadline (0 = none): past it the caller
    /// denies on its own, and an answer that waited longer would only arrive after that.
    async fn write_by(
        &self,
        record: &pb::AuditRecord,
        durable: bool,
        deadline_unix_ms: u64,
    ) -> Result<(), crate::audit::AuditError> {
        let write = self.audit.append_by(record, durable, deadline_unix_ms);
        if deadline_unix_ms == 0 {
            return write.await;
        }
        let left = deadline_unix_ms.saturating_sub(now_unix_ms());
        match tokio::time::timeout(std::time::Duration::from_millis(left), write).await {
            Ok(r) => r,
            Err(_) => Err(crate::audit::AuditError::Unavailable(
                "not written before the caller's deadline".into(),
            )),
        }
    }

    /// The audit store (retention runs on it).
    pub fn audit_store(&self) -> Arc<dyn AuditStore> {
        self.audit.clone()
    }

    /// Queues `record` (the answer actually given) for the audit log; see [`write_corrections`].
    fn correct(&self, record: pb::AuditRecord) {
        if let Err(e) = self.corrections.try_send(record) {
            self.corrections_dropped.fetch_add(1, Ordering::Relaxed);
            let id = match &e {
                tokio::sync::mpsc::error::TrySendError::Full(r)
                | tokio::sync::mpsc::error::TrySendError::Closed(r) => r.decision_id.clone(),
            };
            tracing::error!(decision_id = %id, "too many audit corrections waiting; this one is dropped");
        }
    }

    /// The audit backend's name.
    pub fn audit_backend(&self) -> &'static str {
        self.audit.backend()
    }

    /// Records that the caller did not act on `req.request_id`'s decision (see the contract's
    /// `Withdraw`): a recorded ALLOW gets a superseding DENY record; an undecided request is
    /// remembered and decided DENY when it arrives.
    pub async fn withdraw(
        &self,
        req: &pb::WithdrawRequest,
    ) -> Result<pb::WithdrawResponse, Status> {
        if req.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let found = {
            let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
            ledger.withdraw(&req.request_id, &req.reason)
        };
        let found = match found {
            Some(f) => Some(f),
            // Decided by another replica sharing the audit (the caller failed over since)?
            None => match self.audit.newest_of_request(&req.request_id).await {
                Ok(Some(r)) if r.supersedes_decision_id.is_empty() => {
                    Some((r.decision_id, r.verdict))
                }
                // Already superseded there: nothing left to withdraw.
                Ok(Some(r)) => {
                    return Ok(pb::WithdrawResponse {
                        decision_id: r.supersedes_decision_id,
                        superseded: false,
                    });
                }
                Ok(None) => None,
                Err(e) => {
                    return Err(Status::unavailable(format!(
                        "the audit log cannot be read: {e}"
                    )));
                }
            },
        };
        let (earlier, verdict) = match found {
            None => {
                tracing::info!(request_id = %req.request_id, "withdrawn before it was decided");
                return Ok(pb::WithdrawResponse::default());
            }
            Some(f) => f,
        };
        if verdict != pb::Verdict::Allow as i32 {
            return Ok(pb::WithdrawResponse {
                decision_id: earlier,
                superseded: false,
            });
        }
        let active = self.active();
        let decision_id = uuid::Uuid::new_v4().to_string();
        let d = withdrawn(&decision_id, &req.reason);
        let record = pb::AuditRecord {
            decision_id: decision_id.clone(),
            request_id: req.request_id.clone(),
            subject: req.subject.clone(),
            verdict: d.verdict,
            rule: d.rule.clone(),
            reason: format!("{} (supersedes the ALLOW of decision {earlier})", d.reason),
            policy_version: active.version,
            decided_at_unix_ms: now_unix_ms(),
            supersedes_decision_id: earlier.clone(),
            ..Default::default()
        };
        self.audit
            .append(&record, active.audit.sync)
            .await
            .map_err(|e| Status::unavailable(format!("the audit log cannot be written: {e}")))?;
        tracing::warn!(
            request_id = %req.request_id,
            decision_id = %decision_id,
            supersedes = %earlier,
            reason = %req.reason,
            "an ALLOW was not enforced: superseded"
        );
        Ok(pb::WithdrawResponse {
            decision_id: earlier,
            superseded: true,
        })
    }
}

/// Corrections waiting at most: each is one decision answered DENY while the audit log could not
/// be written, so this many is an outage of minutes at full rate.
const CORRECTIONS_QUEUE: usize = 65_536;

/// The record of a decision as it was enforced: `record` (what the rules decided, whose write
/// failed or came too late) answered `answer`, DENY `audit.unavailable`. Same decision id, so it
/// replaces the decided record wherever that one landed.
fn enforced(
    record: pb::AuditRecord,
    answer: &pb::Decision,
    took: std::time::Duration,
) -> pb::AuditRecord {
    let decided = match pb::Verdict::try_from(record.verdict) {
        Ok(pb::Verdict::Allow) => "ALLOW",
        Ok(pb::Verdict::Escalate) => "ESCALATE",
        _ => "DENY",
    };
    pb::AuditRecord {
        verdict: answer.verdict,
        option_id: None,
        rule: answer.rule.clone(),
        reason: format!(
            "answered DENY: the audit record was not written before the answer was due; the \
             rules had decided {decided} (rule {}), which was never enforced",
            record.rule
        ),
        end_turn: false,
        latency_micros: took.as_micros() as u64,
        ..record
    }
}

/// Writes each correction ([`enforced`]) to the audit log, in order, retrying until it is
/// written: the log was unavailable a moment ago and comes back by itself (a thawed or
/// restarted database, a disk that caught up). `AuditStore::correct` replaces a late record of
/// the same decision or adds the correction when none landed, so once this has run the log
/// says what was enforced. A process that dies with corrections still queued loses them (and
/// a decided record that landed late keeps its verdict): README, "What the audit records".
async fn write_corrections(
    audit: Arc<dyn AuditStore>,
    mut pending: tokio::sync::mpsc::Receiver<pb::AuditRecord>,
) {
    while let Some(record) = pending.recv().await {
        let mut wait = std::time::Duration::from_millis(50);
        loop {
            match audit.correct(&record).await {
                Ok(()) => {
                    tracing::info!(decision_id = %record.decision_id, "audit: recorded the DENY answered while the log was unavailable");
                    break;
                }
                Err(e) => {
                    tracing::warn!(decision_id = %record.decision_id, error = %e, "audit correction not written yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(2));
                }
            }
        }
    }
}

/// Recent requests (request id → the decision recorded for it) and requests withdrawn before
/// they were decided, each bounded to the newest [`LEDGER_CAP`]: a caller withdraws within its
/// deadline plus grace, long before that many decisions.
#[derive(Default)]
pub struct Ledger {
    decided: std::collections::HashMap<String, (String, i32)>,
    decided_order: std::collections::VecDeque<String>,
    withdrawn: std::collections::HashMap<String, String>,
    withdrawn_order: std::collections::VecDeque<String>,
}

const LEDGER_CAP: usize = 65_536;

impl Ledger {
    fn decided(&mut self, request_id: &str, decision_id: &str, verdict: i32) {
        if request_id.is_empty() {
            return;
        }
        if self
            .decided
            .insert(request_id.to_string(), (decision_id.to_string(), verdict))
            .is_none()
        {
            self.decided_order.push_back(request_id.to_string());
        }
        while self.decided_order.len() > LEDGER_CAP {
            if let Some(old) = self.decided_order.pop_front() {
                self.decided.remove(&old);
            }
        }
    }

    fn take_withdrawn(&mut self, request_id: &str) -> Option<String> {
        self.withdrawn.remove(request_id)
    }

    /// The decision `request_id` had (its verdict then; an ALLOW is now marked withdrawn so a
    /// second Withdraw supersedes nothing), or `None` after remembering the withdrawal.
    fn withdraw(&mut self, request_id: &str, reason: &str) -> Option<(String, i32)> {
        if let Some((decision, verdict)) = self.decided.get_mut(request_id) {
            let was = (decision.clone(), *verdict);
            *verdict = pb::Verdict::Deny as i32;
            return Some(was);
        }
        if self
            .withdrawn
            .insert(request_id.to_string(), reason.to_string())
            .is_none()
        {
            self.withdrawn_order.push_back(request_id.to_string());
        }
        while self.withdrawn_order.len() > LEDGER_CAP {
            if let Some(old) = self.withdrawn_order.pop_front() {
                self.withdrawn.remove(&old);
            }
        }
        None
    }
}

/// The DENY recorded for a decision the caller did not act on.
fn withdrawn(decision_id: &str, why: &str) -> pb::Decision {
    pb::Decision {
        decision_id: decision_id.to_string(),
        verdict: pb::Verdict::Deny as i32,
        option_id: None,
        reason: format!("withdrawn: the caller did not act on this request ({why})"),
        rule: "withdrawn".to_string(),
        end_turn: false,
        end_turn_reason: 0,
        request_id: String::new(),
        action_digest: String::new(),
    }
}

/// `PolicyService` over the shared state.
#[derive(Clone)]
pub struct PolicyApi(pub Arc<PolicyState>);

#[tonic::async_trait]
impl PolicyService for PolicyApi {
    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        let req = request.into_inner();
        let mut d = self.0.decide(&req).await;
        d.request_id = req.request_id;
        Ok(Response::new(d))
    }

    type DecideStreamStream = DecisionStream;

    /// Every request on the stream is decided as `Decide` decides it, concurrently (a durable
    /// decision waits for the journal's sync and the others must not wait behind it), and
    /// answered with its request id when ready. The stream ends when the caller's does, after
    /// the answers still being decided.
    async fn decide_stream(
        &self,
        request: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let state = self.0.clone();
        // One task per stream, the decisions under way polled in it (not a task each): a
        // spawned decision was a hand-off to the other worker, which cost more than most
        // decisions. A durable one waits for the journal's group commit meanwhile, so the next
        // request is read and decided while it waits.
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut deciding = futures::stream::FuturesUnordered::new();
            let decide = |req: pb::DecideRequest| {
                let state = state.clone();
                async move {
                    let mut d = state.decide(&req).await;
                    d.request_id = req.request_id;
                    d
                }
            };
            loop {
                tokio::select! {
                    next = inbound.message() => match next {
                        Ok(Some(req)) => deciding.push(decide(req)),
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(error = %status, "a decision stream ended");
                            break;
                        }
                    },
                    Some(d) = deciding.next(), if !deciding.is_empty() => {
                        // The caller gone: it denies on its own, the record stands.
                        let _ = tx.send(Ok(d));
                    }
                }
            }
            // The caller's side ended: what is under way is still decided, recorded, answered.
            while let Some(d) = deciding.next().await {
                let _ = tx.send(Ok(d));
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }

    async fn withdraw(
        &self,
        request: Request<pb::WithdrawRequest>,
    ) -> Result<Response<pb::WithdrawResponse>, Status> {
        let req = request.into_inner();
        self.0.withdraw(&req).await.map(Response::new)
    }

    /// The rules answer at once: a caller needs to allow no extra time. The request limits
    /// (`[decide]`) are stated, so the caller refuses an oversized request before sending it.
    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::PolicyDescription>, Status> {
        let mut d = pb::PolicyDescription {
            decide_deadline_ms: 0,
            agent_decide_deadline_ms: Default::default(),
            implementation: "warden-policy".into(),
            ..Default::default()
        };
        // The request limits in force: the caller refuses a request over them itself.
        self.0.active().decide.limits().describe(&mut d);
        Ok(Response::new(d))
    }
}

pub use warden_decide::DecisionStream;

/// `AdminService` over the shared state.
#[derive(Clone)]
pub struct AdminApi(pub Arc<PolicyState>);

const MAX_AUDIT_LIMIT: usize = 1000;

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = &self.0;
        let active = s.active();
        let mut details = std::collections::HashMap::new();
        details.insert("policy_version".to_string(), active.version.to_string());
        details.insert(
            "decisions".to_string(),
            s.decisions.load(Ordering::Relaxed).to_string(),
        );
        details.insert("config".to_string(), s.sources.describe());
        details.insert(
            "audit_records".to_string(),
            match s.audit.count().await {
                Ok(n) => n.to_string(),
                Err(e) => format!("unavailable: {e}"),
            },
        );
        details.insert("store_backend".to_string(), s.audit.backend().to_string());
        details.insert(
            "audit_pruned".to_string(),
            crate::retention::pruned_total().to_string(),
        );
        details.insert("store".to_string(), s.store.clone());
        details.insert(
            "decisions_not_audited".to_string(),
            s.not_audited.load(Ordering::Relaxed).to_string(),
        );
        details.insert(
            "audit_corrections_pending".to_string(),
            (CORRECTIONS_QUEUE - s.corrections.capacity()).to_string(),
        );
        details.insert(
            "audit_corrections_dropped".to_string(),
            s.corrections_dropped.load(Ordering::Relaxed).to_string(),
        );
        details.insert(
            "reload_attempts".to_string(),
            s.reload_attempts.load(Ordering::Acquire).to_string(),
        );
        details.insert(
            "last_reload_error".to_string(),
            s.last_reload_error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default(),
        );
        Ok(Response::new(warden_daemon::status::response(
            "warden-policy",
            s.started,
            s.listeners.read().map(|l| l.clone()).unwrap_or_default(),
            details,
        )))
    }

    async fn audit_query(
        &self,
        request: Request<pb::AuditQueryRequest>,
    ) -> Result<Response<pb::AuditQueryResponse>, Status> {
        let q = request.into_inner();
        let limit = match q.limit {
            0 => 50,
            n => (n as usize).min(MAX_AUDIT_LIMIT),
        };
        let records = if !q.decision_id.is_empty() {
            self.0
                .audit
                .by_decision_id(&q.decision_id)
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .into_iter()
                .filter(|r| q.context_id.is_empty() || ctx(r) == q.context_id)
                .collect()
        } else {
            self.0
                .audit
                .newest(limit, Some(q.context_id.as_str()).filter(|c| !c.is_empty()))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
        };
        Ok(Response::new(pb::AuditQueryResponse { records }))
    }

    type AuditFollowStream = FollowStream;

    async fn audit_follow(
        &self,
        request: Request<pb::AuditFollowRequest>,
    ) -> Result<Response<Self::AuditFollowStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(follow(self.0.audit.clone(), request.into_inner(), tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn reload(
        &self,
        _request: Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadResponse>, Status> {
        let s = self.0.clone();
        // Reading and parsing a file: keep it off the async workers.
        let result = tokio::task::spawn_blocking(move || {
            let r = s.reload();
            (r, s.active().version)
        })
        .await
        .map_err(|e| Status::internal(format!("reload task failed: {e}")))?;
        Ok(Response::new(match result {
            (Ok(v), _) => pb::ReloadResponse {
                reloaded: true,
                policy_version: v,
                error: String::new(),
            },
            (Err(e), v) => {
                tracing::warn!(error = %e, policy_version = v, "reload rejected; the rules in force stay");
                pb::ReloadResponse {
                    reloaded: false,
                    policy_version: v,
                    error: e.to_string(),
                }
            }
        }))
    }
}

/// What `AuditFollow` streams.
pub type FollowStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<pb::AuditFollowEvent, Status>> + Send + 'static>,
>;

/// How often a follower looks for new records when the last look found none.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Records read per look.
const FOLLOW_BATCH: usize = 512;

/// The backlog and then every record after it, in cursor order, each once: the follower
/// holds one cursor and asks the log for what lies after it. A hole in the cursors (a record
/// numbered but not yet visible: another replica's commit on PostgreSQL) is waited for up to
/// the log's `settle` time, so a late record is never sent after a newer one; past that it is
/// a hole for good (a write that failed).
async fn follow(
    audit: Arc<dyn AuditStore>,
    req: pb::AuditFollowRequest,
    tx: tokio::sync::mpsc::Sender<Result<pb::AuditFollowEvent, Status>>,
) {
    let internal = |e: crate::audit::AuditError| Status::unavailable(e.to_string());
    let context = req.context_id.clone();
    let wanted = |r: &pb::AuditRecord| context.is_empty() || ctx(r) == context;
    let send = |cursor: u64, record: pb::AuditRecord| {
        let tx = tx.clone();
        async move {
            tx.send(Ok(pb::AuditFollowEvent {
                cursor,
                record: Some(record),
            }))
            .await
            .is_ok()
        }
    };
    let mut cursor = match req.after_cursor {
        Some(c) => c,
        None => {
            // The head first: a record written between the two reads is after it, not in the
            // backlog, so it is sent once, by the loop below.
            let head = match audit.head().await {
                Ok(h) => h,
                Err(e) => {
                    let _ = tx.send(Err(internal(e))).await;
                    return;
                }
            };
            let limit = (req.backlog as usize).min(MAX_AUDIT_LIMIT);
            let mut backlog = if limit == 0 {
                Vec::new()
            } else {
                match audit
                    .newest_cursored(limit, Some(context.as_str()).filter(|c| !c.is_empty()))
                    .await
                {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(internal(e))).await;
                        return;
                    }
                }
            };
            backlog.retain(|(c, _)| *c <= head);
            backlog.reverse();
            for (c, r) in backlog {
                if !send(c, r).await {
                    return;
                }
            }
            head
        }
    };
    let settle = audit.settle();
    // The first cursor missing after `cursor`, and since when.
    let mut hole: Option<(u64, std::time::Instant)> = None;
    loop {
        if tx.is_closed() {
            return;
        }
        let got = match audit.after(cursor, FOLLOW_BATCH).await {
            Ok(g) => g,
            Err(e) => {
                // The log unreachable for a moment (the database restarting): try again; the
                // cursor keeps the place.
                tracing::warn!(error = %e, "audit follow: cannot read the log; retrying");
                tokio::time::sleep(FOLLOW_POLL * 10).await;
                continue;
            }
        };
        let full = got.len() == FOLLOW_BATCH;
        let mut advanced = false;
        for (c, r) in got {
            if c <= cursor {
                continue;
            }
            if c > cursor + 1 && !settle.is_zero() {
                let since = match hole {
                    Some((at, since)) if at == cursor + 1 => since,
                    _ => {
                        let now = std::time::Instant::now();
                        hole = Some((cursor + 1, now));
                        now
                    }
                };
                if since.elapsed() < settle {
                    break;
                }
            }
            hole = None;
            cursor = c;
            advanced = true;
            if wanted(&r) && !send(c, r).await {
                return;
            }
        }
        if !(full && advanced) {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
        }
    }
}

fn ctx(r: &pb::AuditRecord) -> &str {
    r.subject
        .as_ref()
        .map(|s| s.context_id.as_str())
        .unwrap_or("")
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Whether the caller's absolute deadline (0 = none) has passed.
fn past_deadline(deadline_unix_ms: u64) -> bool {
    deadline_unix_ms != 0 && now_unix_ms() >= deadline_unix_ms
}

/// The DENY for a decision that was not ready by the caller's deadline.
fn deadline_exceeded(decision_id: &str, req: &pb::DecideRequest) -> pb::Decision {
    pb::Decision {
        decision_id: decision_id.to_string(),
        verdict: pb::Verdict::Deny as i32,
        option_id: None,
        reason: format!(
            "deadline_exceeded: the decision was not ready before the caller's deadline ({} ms late)",
            now_unix_ms().saturating_sub(req.deadline_unix_ms)
        ),
        rule: "deadline_exceeded".to_string(),
        end_turn: false,
        end_turn_reason: 0,
        request_id: String::new(),
        action_digest: String::new(),
    }
}
