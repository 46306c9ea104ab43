//! `AdminService` over the shared state: Status, audit queries, the audit followed (polled in
//! bounded batches), and reload.
//!
//! Owns: the operator's view of the policy service. Must never: decide, or return more than
//! [`MAX_AUDIT_LIMIT`] records to one query.

use super::*;

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
