//! The approver's one shared state: what `PolicyService.Decide` does for the supervisor (chain
//! to the upstream, hold what it escalates, answer from what a person chose) and what operators
//! see and resolve. The gRPC services over it are in `api.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::Channel;
use warden_containment::RealFs;
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_rules::{AgentHomes, Engine, Mode, PolicyConfig, RootCheck, ScopePolicy};

use crate::config::Config;
use crate::queue::{Queue, QueueError, Resolution, ResolveError, now_ms};

/// Rules the approver answers with.
pub mod rule {
    pub const APPROVED: &str = "approval.approved";
    pub const DENIED: &str = "approval.denied";
    pub const NO_RESPONSE: &str = "approval.no-response";
    pub const REVOKED: &str = "approval.revoked";
    pub const EXPIRED: &str = "approval.expired";
    // The queue's shares (`queue_store::admit`): `approval.queue-full`,
    // `approval.principal-share-full`, `approval.conversation-share-full`.
    pub const REQUEST_MISMATCH: &str = "approval.request-mismatch";
    pub const UNAVAILABLE: &str = "approval.unavailable";
    /// A person approved, but the caller withdrew the request (did not act on the approval).
    pub const WITHDRAWN: &str = "approval.withdrawn";
}

/// Where decisions come from before a person is asked.
enum First {
    /// warden-policy with `return_escalations = true`.
    Upstream(PolicyServiceClient<Channel>),
    /// No upstream: the boundary floor here, then every mutating call escalates
    /// (`approve-reads`: read, search and think pass).
    Local(Box<Engine>),
}

/// State shared by every service.
pub struct ApproverState {
    pub config: Config,
    pub queue: Queue,
    first: First,
    pub(crate) started: Instant,
    shutdown: CancellationToken,
    pub(crate) listeners: std::sync::RwLock<Vec<String>>,
    /// Held from the share check to the hold of one escalation.
    admission: tokio::sync::Mutex<()>,
}

impl ApproverState {
    pub fn new(config: Config, queue: Queue, shutdown: CancellationToken) -> Result<Self, String> {
        let first = match config.upstream_socket() {
            Some(p) => First::Upstream(PolicyServiceClient::new(
                warden_daemon::client::unix_channel(&p),
            )),
            None => {
                let policy = PolicyConfig {
                    global: ScopePolicy {
                        mode: Some(Mode::ApproveReads),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let engine = Engine::new(policy)
                    .map_err(|e| e.to_string())?
                    .with_root_check(RootCheck::new(&AgentHomes::from_host(), &RealFs));
                First::Local(Box::new(engine))
            }
        };
        Ok(Self {
            config,
            queue,
            first,
            started: Instant::now(),
            shutdown,
            listeners: Default::default(),
            admission: tokio::sync::Mutex::new(()),
        })
    }

    pub fn set_listeners(&self, l: Vec<String>) {
        if let Ok(mut g) = self.listeners.write() {
            *g = l;
        }
    }

    /// Marks a request found pending at start-up: expired when its deadline is gone, otherwise
    /// held until its deadline (its caller may come back with the same request id).
    pub async fn recover(self: &Arc<Self>, pending: Vec<pb::Approval>) {
        for a in pending {
            if a.deadline_unix_ms <= now_ms() {
                let r = self
                    .queue
                    .resolve(
                        &a.id,
                        Resolution {
                            state: pb::ApprovalState::Expired,
                            by: "warden-approver".into(),
                            reason: "the approver restarted after the request's deadline; nobody answered it".into(),
                            rule: rule::EXPIRED,
                        },
                    )
                    .await;
                if let Err(e) = r
                    && !matches!(e, ResolveError::AlreadyDecided(_))
                {
                    tracing::warn!(decision_id = %a.id, error = %e, "cannot expire a stale request");
                }
            } else {
                tracing::info!(decision_id = %a.id, "pending request kept across the restart");
                self.arm_deadline(&a);
            }
        }
    }

    /// At the request's deadline, nobody having answered: DENY `approval.no-response`.
    fn arm_deadline(self: &Arc<Self>, a: &pb::Approval) {
        let me = self.clone();
        let id = a.id.clone();
        let wait = Duration::from_millis(a.deadline_unix_ms.saturating_sub(now_ms()));
        let secs = a.deadline_unix_ms.saturating_sub(a.created_unix_ms) as f64 / 1000.0;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = me.shutdown.cancelled() => return,
            }
            let r = me
                .queue
                .resolve(
                    &id,
                    Resolution {
                        state: pb::ApprovalState::NoResponse,
                        by: "warden-approver".into(),
                        reason: format!("approval.no-response: nobody answered within {secs:.1} s"),
                        rule: rule::NO_RESPONSE,
                    },
                )
                .await;
            match r {
                Ok(_) | Err(ResolveError::AlreadyDecided(_)) | Err(ResolveError::NotFound(_)) => {}
                Err(e) => {
                    tracing::error!(decision_id = %id, error = %e, "cannot record the missed deadline")
                }
            }
        });
    }

    /// The first opinion: the upstream's, or the floor's here.
    async fn first(&self, req: &pb::DecideRequest) -> pb::Decision {
        match &self.first {
            First::Upstream(client) => {
                let mut client = client.clone();
                let mut budget = Duration::from_millis(self.config.upstream.deadline_ms);
                if req.deadline_unix_ms != 0 {
                    budget = budget.min(Duration::from_millis(
                        req.deadline_unix_ms.saturating_sub(now_ms()),
                    ));
                }
                // Asked as a caller that can hold an escalation for a person, so the policy's
                // configuration need not change when the approver is swapped in.
                let mut upstream_req = req.clone();
                upstream_req.return_escalations = true;
                let mut d = warden_decide::contract::decide_with_deadline(
                    &mut client,
                    upstream_req,
                    budget,
                )
                .await;
                if d.decision_id.is_empty() {
                    // The caller-side helper's own fail-closed DENY: give it an id to be found by.
                    d.decision_id = format!("approver-{}", uuid::Uuid::new_v4());
                    tracing::warn!(decision_id = %d.decision_id, reason = %d.reason, "upstream policy unavailable: denying");
                }
                d
            }
            First::Local(engine) => {
                let decision_id = uuid::Uuid::new_v4().to_string();
                match warden_decide::convert::to_input(req, &self.config.decide) {
                    Ok(input) => {
                        let fs = warden_decide::fsview::DecisionFs::new(RealFs);
                        let d = engine.decide_with_approver(&input, &fs);
                        pb::Decision {
                            decision_id,
                            verdict: warden_decide::convert::verdict(d.verdict) as i32,
                            option_id: d.option_id,
                            reason: d.reason,
                            rule: d.rule,
                            end_turn: d.end_turn.is_some(),
                            end_turn_reason: warden_decide::convert::end_turn_reason(d.end_turn)
                                as i32,
                            request_id: String::new(),
                            action_digest: warden_decide::convert::judged(req).digest,
                        }
                    }
                    Err(m) => deny(
                        decision_id,
                        m.rule,
                        format!("malformed request: {}", m.reason),
                    ),
                }
            }
        }
    }

    /// Decides one request: the upstream's ALLOW/DENY as is, its ESCALATE held for a person.
    /// `Err` only while shutting down (UNAVAILABLE: the caller retries and finds it again).
    pub async fn decide(self: &Arc<Self>, req: pb::DecideRequest) -> Result<pb::Decision, Status> {
        // A retried call (after a restart, or a broken connection) finds its request again.
        match self.queue.by_request(&req.request_id).await {
            Ok(Some(a)) => {
                if a.request.as_ref() != Some(&req) {
                    tracing::warn!(request_id = %req.request_id, decision_id = %a.id, "request id reused with different content");
                    return Ok(deny(
                        uuid::Uuid::new_v4().to_string(),
                        rule::REQUEST_MISMATCH,
                        "a different request is already held under this request id".into(),
                    ));
                }
                tracing::info!(request_id = %req.request_id, decision_id = %a.id, "caller came back for a held request");
                if a.state() == pb::ApprovalState::Pending {
                    // Held by a replica that may be gone (or before a restart): its deadline
                    // is kept here too; the first to act wins.
                    self.arm_deadline(&a);
                }
                return self.wait(a).await;
            }
            Ok(None) => {}
            Err(e) => return Ok(unavailable(&e)),
        }
        let first = self.first(&req).await;
        if first.verdict != pb::Verdict::Escalate as i32 {
            return Ok(first);
        }
        let subject = req.subject.clone().unwrap_or_default();
        // The share check and the hold are one step on this replica (two escalations of one
        // principal cannot both take its last place); replicas on one database may overshoot
        // a share by the requests they admit at the same moment.
        let admission = self.admission.lock().await;
        let pending = match self.queue.pending(self.config.approval.max_pending).await {
            Ok(p) => p,
            Err(e) => return Ok(unavailable(&e)),
        };
        let shares = crate::queue_store::Shares {
            total: self.config.approval.max_pending,
            per_principal: self.config.approval.max_pending_per_principal,
            per_conversation: self.config.approval.max_pending_per_conversation,
        };
        if let Err(refused) = crate::queue_store::admit(&pending, &subject, shares) {
            tracing::warn!(
                context_id = %subject.context_id,
                task_id = %subject.task_id,
                rule = refused.rule,
                "escalation refused: {}", refused.reason
            );
            return Ok(deny(
                first.decision_id,
                refused.rule,
                format!(
                    "escalated ({}: {}) but {}",
                    first.rule, first.reason, refused.reason
                ),
            ));
        }
        let now = now_ms();
        let own = now + self.config.approval.deadline_for(&subject.agent);
        let deadline = match req.deadline_unix_ms {
            0 => own,
            caller if caller < own => {
                tracing::warn!(
                    request_id = %req.request_id,
                    context_id = %subject.context_id,
                    caller_ms = caller.saturating_sub(now),
                    approver_ms = own.saturating_sub(now),
                    "the caller's deadline is shorter than the approval deadline (its own setting, or a supervisor that could not read this approver's description: see `warden doctor`); people get the shorter one"
                );
                caller
            }
            _ => own,
        };
        let upstream = matches!(self.first, First::Upstream(_));
        let judged = warden_decide::convert::judged(&req);
        let a = pb::Approval {
            id: uuid::Uuid::new_v4().to_string(),
            request: Some(req),
            escalated_rule: first.rule,
            escalated_reason: first.reason,
            upstream_decision_id: if upstream {
                first.decision_id
            } else {
                String::new()
            },
            created_unix_ms: now,
            deadline_unix_ms: deadline,
            escalated_option_id: first.option_id,
            judged: Some(judged),
            ..Default::default()
        };
        match self.queue.hold(a.clone()).await {
            Ok(crate::queue::Holding::New(_)) => {}
            Ok(crate::queue::Holding::Exists(existing)) => {
                // The supervisor's retry reached another replica first: one request, one wait.
                if existing.request.as_ref() != a.request.as_ref() {
                    return Ok(deny(
                        uuid::Uuid::new_v4().to_string(),
                        rule::REQUEST_MISMATCH,
                        "a different request is already held under this request id".into(),
                    ));
                }
                return self.wait(*existing).await;
            }
            Err(e) => return Ok(unavailable(&e)),
        }
        drop(admission);
        tracing::info!(
            decision_id = %a.id,
            request_id = %a.request.as_ref().map(|r| r.request_id.as_str()).unwrap_or(""),
            context_id = %subject.context_id,
            task_id = %subject.task_id,
            rule = %a.escalated_rule,
            deadline_ms = deadline.saturating_sub(now),
            "waiting for a person"
        );
        self.arm_deadline(&a);
        self.wait(a).await
    }

    /// Waits for the held request's decision. Dropped before it (the caller cancelled: its
    /// turn was cancelled, or it gave up), the request is revoked at once.
    async fn wait(self: &Arc<Self>, a: pb::Approval) -> Result<pb::Decision, Status> {
        let watched = match self.queue.watch(&a.id).await {
            Ok(w) => w,
            Err(e) => return Ok(unavailable(&e)),
        };
        let Some(mut rx) = watched else {
            // Decided already (e.g. answered while the caller was reconnecting).
            return Ok(match self.queue.get(&a.id).await {
                Ok(Some(done)) => to_decision(&done),
                Ok(None) => deny(
                    a.id.clone(),
                    rule::UNAVAILABLE,
                    "the held request is gone".into(),
                ),
                Err(e) => unavailable(&e),
            });
        };
        let mut guard = RevokeOnDrop {
            state: Some(self.clone()),
            id: a.id.clone(),
        };
        let outcome = tokio::select! {
            r = rx.wait_for(|x| x.state() != pb::ApprovalState::Pending) => {
                r.map(|x| x.clone()).ok()
            }
            _ = self.shutdown.cancelled() => {
                // Not revoked: the request stays pending in the store for the next run, and the
                // caller's retry (UNAVAILABLE) finds it there.
                guard.state = None;
                return Err(Status::unavailable("warden-approver is restarting; retry"));
            }
        };
        guard.state = None;
        let done = match outcome {
            Some(x) => x,
            None => match self.queue.get(&a.id).await {
                Ok(Some(x)) => x,
                Ok(None) => {
                    return Ok(deny(
                        a.id,
                        rule::UNAVAILABLE,
                        "the held request is gone".into(),
                    ));
                }
                Err(e) => return Ok(unavailable(&e)),
            },
        };
        Ok(to_decision(&done))
    }

    /// A person's answer. `by` is who, as recorded.
    pub async fn answer(
        &self,
        id: &str,
        verdict: i32,
        reason: &str,
        by: String,
    ) -> Result<pb::Approval, Status> {
        let reason = reason.trim();
        let (state, rule) = match pb::Verdict::try_from(verdict) {
            Ok(pb::Verdict::Allow) => (pb::ApprovalState::Approved, rule::APPROVED),
            Ok(pb::Verdict::Deny) => {
                if reason.is_empty() {
                    return Err(Status::invalid_argument(
                        "a denial needs a reason: it travels back to the caller",
                    ));
                }
                (pb::ApprovalState::Denied, rule::DENIED)
            }
            _ => {
                return Err(Status::invalid_argument(
                    "answer with ALLOW (approve once) or DENY",
                ));
            }
        };
        if reason.chars().count() > 2000 {
            return Err(Status::invalid_argument(
                "the reason is longer than 2000 characters",
            ));
        }
        let r = self
            .queue
            .resolve(
                id,
                Resolution {
                    state,
                    by,
                    reason: reason.to_string(),
                    rule,
                },
            )
            .await;
        match r {
            Ok(a) => Ok(a),
            Err(ResolveError::NotFound(id)) => Err(Status::not_found(format!(
                "no approval request {id:?} in this deployment"
            ))),
            Err(ResolveError::AlreadyDecided(a)) => Err(Status::failed_precondition(format!(
                "already decided: {}",
                crate::queue::describe(&a)
            ))),
            Err(ResolveError::Queue(e)) => Err(Status::internal(e.to_string())),
        }
    }
}

/// Revokes a held request when the waiting Decide call is dropped before its decision: hyper
/// drops the handler when the supervisor resets the stream (its turn was cancelled).
struct RevokeOnDrop {
    state: Option<Arc<ApproverState>>,
    id: String,
}

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        let Some(s) = self.state.take() else { return };
        let id = std::mem::take(&mut self.id);
        // Dropped inside the runtime (hyper drops the handler there); the revocation is
        // written on a task of its own.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(decision_id = %id, "no runtime to record the revocation on");
            return;
        };
        rt.spawn(async move {
            let r = s
                .queue
                .resolve(
                    &id,
                    Resolution {
                        state: pb::ApprovalState::Revoked,
                        by: "caller".into(),
                        reason:
                            "the caller stopped waiting (its turn was cancelled, or it gave up)"
                                .into(),
                        rule: rule::REVOKED,
                    },
                )
                .await;
            match r {
                Ok(_) | Err(ResolveError::AlreadyDecided(_)) | Err(ResolveError::NotFound(_)) => {}
                Err(e) => {
                    tracing::error!(decision_id = %id, error = %e, "cannot record the revocation")
                }
            }
        });
    }
}

fn deny(decision_id: String, rule: &str, reason: String) -> pb::Decision {
    pb::Decision {
        decision_id,
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

fn unavailable(e: &QueueError) -> pb::Decision {
    tracing::error!(error = %e, "the approval store failed; denying");
    deny(
        uuid::Uuid::new_v4().to_string(),
        rule::UNAVAILABLE,
        format!("the approval store cannot be used ({e}); denying"),
    )
}

/// What the supervisor is told about a decided request.
pub fn to_decision(a: &pb::Approval) -> pb::Decision {
    let who = &a.answered_by;
    match a.state() {
        pb::ApprovalState::Approved => pb::Decision {
            decision_id: a.id.clone(),
            verdict: pb::Verdict::Allow as i32,
            // Only the option the escalating rule chose, and only a once-option: a person's
            // approval never widens to "always".
            option_id: a.escalated_option_id.clone().filter(|id| {
                a.request.as_ref().is_some_and(|r| {
                    r.options
                        .iter()
                        .any(|o| &o.id == id && o.kind == "allow_once")
                })
            }),
            reason: if a.reason.is_empty() {
                format!("approved once by {who}")
            } else {
                format!("approved once by {who}: {}", a.reason)
            },
            rule: rule::APPROVED.into(),
            end_turn: false,
            end_turn_reason: 0,
            request_id: String::new(),
            // What the person saw is what the approval is bound to: the digest of the request
            // as held (computed again from it, so a record from before the field still binds).
            action_digest: a
                .request
                .as_ref()
                .map(|r| warden_decide::convert::judged(r).digest)
                .unwrap_or_default(),
        },
        pb::ApprovalState::Denied => deny(
            a.id.clone(),
            rule::DENIED,
            format!("denied by {who}: {}", a.reason),
        ),
        pb::ApprovalState::Pending => deny(
            a.id.clone(),
            rule::UNAVAILABLE,
            "still pending; denying".into(),
        ),
        pb::ApprovalState::Withdrawn => deny(
            a.id.clone(),
            rule::WITHDRAWN,
            format!(
                "approved by {who}, but the caller withdrew the request ({})",
                a.withdrawn_reason
            ),
        ),
        _ => deny(a.id.clone(), &a.rule, a.reason.clone()),
    }
}

impl ApproverState {
    /// The caller did not act on `req.request_id`'s decision (`PolicyService.Withdraw`): a
    /// request still waiting for a person is revoked, and the withdrawal goes on to the upstream
    /// policy, whose audit then supersedes an ALLOW it recorded.
    pub async fn withdraw(&self, req: pb::WithdrawRequest) -> Result<pb::WithdrawResponse, Status> {
        if req.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let mut out = pb::WithdrawResponse::default();
        if let Some(a) = self
            .queue
            .by_request(&req.request_id)
            .await
            .map_err(internal)?
        {
            out.decision_id = a.id.clone();
            let r = self
                .queue
                .resolve(
                    &a.id,
                    Resolution {
                        state: pb::ApprovalState::Revoked,
                        by: "caller".into(),
                        reason: format!("the caller withdrew the request ({})", req.reason),
                        rule: rule::REVOKED,
                    },
                )
                .await;
            match r {
                Ok(_) => tracing::info!(decision_id = %a.id, "withdrawn: revoked while pending"),
                Err(ResolveError::AlreadyDecided(_)) => {
                    // A person's approval the caller did not act on: history says so.
                    if self
                        .queue
                        .supersede(&a.id, &req.reason)
                        .await
                        .map_err(internal)?
                        .is_some()
                    {
                        out.superseded = true;
                    }
                }
                Err(ResolveError::NotFound(_)) => {}
                Err(ResolveError::Queue(e)) => return Err(Status::internal(e.to_string())),
            }
        }
        if let First::Upstream(client) = &self.first {
            let mut client = client.clone();
            match client.withdraw(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    if out.decision_id.is_empty() {
                        out.decision_id = r.decision_id;
                    }
                    out.superseded |= r.superseded;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the upstream policy did not take the withdrawal")
                }
            }
        }
        Ok(out)
    }
}

/// A queue failure as the gRPC status operators see.
pub(crate) fn internal(e: QueueError) -> Status {
    Status::internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approved(escalated_option: Option<&str>) -> pb::Approval {
        let opt = |id: &str, kind: &str| pb::PermissionOption {
            id: id.into(),
            name: id.into(),
            kind: kind.into(),
        };
        pb::Approval {
            id: "a1".into(),
            request: Some(pb::DecideRequest {
                options: vec![
                    opt("allow-once", "allow_once"),
                    opt("allow-always", "allow_always"),
                    opt("reject", "reject_once"),
                ],
                ..Default::default()
            }),
            state: pb::ApprovalState::Approved as i32,
            answered_by: "uid:1000 (alice)".into(),
            escalated_option_id: escalated_option.map(str::to_string),
            ..Default::default()
        }
    }

    /// A person's approval narrows to "once" and never widens to "always": the only option it
    /// ever names is the escalating rule's, and only when that is a one-time allow.
    #[test]
    fn an_approval_never_names_an_always_option() {
        let d = to_decision(&approved(Some("allow-always")));
        assert_eq!(d.verdict, pb::Verdict::Allow as i32);
        assert_eq!(d.option_id, None, "{d:?}");
        let d = to_decision(&approved(Some("not-offered")));
        assert_eq!(d.option_id, None, "{d:?}");
        let d = to_decision(&approved(Some("allow-once")));
        assert_eq!(d.option_id.as_deref(), Some("allow-once"));
        let d = to_decision(&approved(None));
        assert_eq!(d.option_id, None);
        assert!(
            d.reason.contains("approved once by uid:1000 (alice)"),
            "{d:?}"
        );
        // Withdrawn after the approval: what a retry is told is the refusal that was enforced.
        let mut w = approved(Some("allow-once"));
        w.state = pb::ApprovalState::Withdrawn as i32;
        w.withdrawn_reason = "the turn was cancelled".into();
        let d = to_decision(&w);
        assert_eq!(d.verdict, pb::Verdict::Deny as i32);
        assert_eq!(d.rule, rule::WITHDRAWN);
        assert!(d.reason.contains("the turn was cancelled"), "{d:?}");
    }
}
