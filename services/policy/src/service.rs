//! The PolicyService and AdminService implementations over one shared state: the engine in
//! force (swapped whole on reload), the audit log, and the figures for Status. Writing the audit
//! and correcting it is [`audit`]'s, `AdminService` [`admin`]'s.

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

mod admin;
mod audit;

pub use admin::{AdminApi, FollowStream};
pub use audit::Ledger;
use audit::{CORRECTIONS_QUEUE, enforced, withdrawn, write_corrections};

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
            Err(m) => deny(
                &decision_id,
                m.rule,
                format!("malformed request: {}", m.reason),
            ),
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
            let answer = deny(
                &decision_id,
                "audit.unavailable",
                format!("the audit log cannot be written ({e}); denying"),
            );
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
    deny(
        decision_id,
        "deadline_exceeded",
        format!(
            "deadline_exceeded: the decision was not ready before the caller's deadline ({} ms late)",
            now_unix_ms().saturating_sub(req.deadline_unix_ms)
        ),
    )
}

/// A DENY this service answers itself (not the rules'): named by `rule`, saying `reason`, and
/// keeping the turn going.
fn deny(decision_id: &str, rule: &str, reason: String) -> pb::Decision {
    pb::Decision {
        decision_id: decision_id.to_string(),
        verdict: pb::Verdict::Deny as i32,
        option_id: None,
        reason,
        rule: rule.to_string(),
        end_turn: false,
        end_turn_reason: 0,
        request_id: String::new(),
        action_digest: String::new(),
    }
}
