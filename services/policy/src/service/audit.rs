//! Writing a decision's audit record, and what happens when it cannot be: a decision answered DENY
//! while the audit log could not be written is corrected in the log (`enforced`, written in the
//! background, bounded), and a withdrawn request's decision recorded as withdrawn (the
//! `Ledger`).
//!
//! Owns: the audit's truth about what was enforced. Must never: let an unwritten ALLOW stand (it is
//! a DENY), or grow without bound.

use super::*;

impl PolicyState {
    /// Writes `record`, giving up at the caller's deadline (0 = none): past it the caller
    /// denies on its own, and an answer that waited longer would only arrive after that.
    pub(super) async fn write_by(
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
    pub(super) fn correct(&self, record: pb::AuditRecord) {
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
pub(super) const CORRECTIONS_QUEUE: usize = 65_536;

/// The record of a decision as it was enforced: `record` (what the rules decided, whose write
/// failed or came too late) answered `answer`, DENY `audit.unavailable`. Same decision id, so it
/// replaces the decided record wherever that one landed.
pub(super) fn enforced(
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
pub(super) async fn write_corrections(
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
    pub(super) fn decided(&mut self, request_id: &str, decision_id: &str, verdict: i32) {
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

    pub(super) fn take_withdrawn(&mut self, request_id: &str) -> Option<String> {
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
pub(super) fn withdrawn(decision_id: &str, why: &str) -> pb::Decision {
    deny(
        decision_id,
        "withdrawn",
        format!("withdrawn: the caller did not act on this request ({why})"),
    )
}
