//! The gRPC services over [`ApproverState`]: `PolicyService` for the supervisor, and
//! `ApprovalService` and `AdminService` for operators (who called, from the admin socket's peer
//! credentials). Must never decide anything itself: each call is one step of the state's.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_server::AdminService;
use warden_proto::v1::approval_service_server::ApprovalService;
use warden_proto::v1::policy_service_server::PolicyService;

use crate::service::{ApproverState, internal};

/// `PolicyService` for the supervisor.
#[derive(Clone)]
pub struct PolicyApi(pub Arc<ApproverState>);

#[tonic::async_trait]
impl PolicyService for PolicyApi {
    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        let t0 = std::time::Instant::now();
        let d = self.0.decide(request.into_inner()).await?;
        crate::metrics::decided(&d, t0.elapsed());
        Ok(Response::new(d))
    }

    async fn withdraw(
        &self,
        request: Request<pb::WithdrawRequest>,
    ) -> Result<Response<pb::WithdrawResponse>, Status> {
        self.0
            .withdraw(request.into_inner())
            .await
            .map(Response::new)
    }

    /// How long a decision may take here (a person's time plus the upstream's): the supervisor
    /// waits at least this long, so swapping the approver in is one line of its configuration.
    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::PolicyDescription>, Status> {
        Ok(Response::new(self.0.config.description()))
    }

    type DecideStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::Decision, Status>> + Send>>;

    /// A person answers one question at a time: the supervisor uses Decide here.
    async fn decide_stream(
        &self,
        _request: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStreamStream>, Status> {
        Err(Status::unimplemented(
            "warden-approver decides one call at a time: use Decide",
        ))
    }
}

/// Who called on the admin socket: "uid:1000 (alice)".
pub fn operator_of<T>(req: &Request<T>) -> String {
    match warden_daemon::Peer::of(req) {
        Some(p) => {
            match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(p.uid))
                .ok()
                .flatten()
            {
                Some(u) => format!("uid:{} ({})", p.uid, u.name),
                None => format!("uid:{}", p.uid),
            }
        }
        None => "unknown peer".into(),
    }
}

const MAX_LIST: usize = 1000;

fn limit(n: u32) -> usize {
    match n {
        0 => 100,
        n => (n as usize).min(MAX_LIST),
    }
}

/// `ApprovalService` for operators on the admin socket.
#[derive(Clone)]
pub struct ApprovalApi(pub Arc<ApproverState>);

type EventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn list(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        // Every pending request, then one of each principal in turn, then the page: a
        // principal with many requests waiting cannot push another's off the first page.
        let mut approvals = crate::queue_store::round_robin(
            self.0.queue.pending(MAX_LIST).await.map_err(internal)?,
        );
        approvals.truncate(limit(request.get_ref().limit));
        Ok(Response::new(pb::ListApprovalsResponse { approvals }))
    }

    async fn get(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let id = &request.get_ref().id;
        match self.0.queue.get(id).await.map_err(internal)? {
            Some(a) => Ok(Response::new(a)),
            None => Err(Status::not_found(format!(
                "no approval request {id:?} in this deployment"
            ))),
        }
    }

    async fn answer(
        &self,
        request: Request<pb::AnswerRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let by = operator_of(&request);
        let r = request.into_inner();
        self.0
            .answer(&r.id, r.verdict, &r.reason, by)
            .await
            .map(Response::new)
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        _request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use futures::StreamExt;
        // Subscribed before the snapshot, so nothing falls between the two.
        let rx = self.0.queue.subscribe();
        let now = self.0.queue.pending(MAX_LIST).await.map_err(internal)?;
        let snapshot = futures::stream::iter(
            now.into_iter()
                .rev()
                .map(|a| Ok(pb::ApprovalEvent { approval: Some(a) })),
        );
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|r| async move {
            // A watcher that fell behind skips what it missed; the next List shows the truth.
            r.ok().map(|a| Ok(pb::ApprovalEvent { approval: Some(a) }))
        });
        Ok(Response::new(Box::pin(snapshot.chain(live))))
    }

    async fn history(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let approvals = self
            .0
            .queue
            .history(limit(request.get_ref().limit))
            .await
            .map_err(internal)?;
        Ok(Response::new(pb::ListApprovalsResponse { approvals }))
    }
}

/// `AdminService` (Status, Reload) on the admin socket; its reloads are the daemon's
/// (`warden_daemon::reload`: the admin Reload and SIGHUP run the same one).
#[derive(Clone)]
pub struct AdminApi(pub Arc<ApproverState>, pub warden_daemon::reload::Reloads);

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = &self.0;
        let mut details = std::collections::HashMap::new();
        details.insert(
            "pending".to_string(),
            match s.queue.pending_count().await {
                Ok(n) => n.to_string(),
                Err(e) => format!("unavailable: {e}"),
            },
        );
        details.insert("store_backend".to_string(), s.queue.backend().to_string());
        details.insert("store".to_string(), s.config.store.describe());
        details.insert(
            "upstream".to_string(),
            s.config
                .upstream_socket()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "none (floor here, every mutating call escalates)".into()),
        );
        details.insert(
            "approval_deadline_ms".to_string(),
            s.config.approval.deadline_ms.to_string(),
        );
        // What Describe tells the supervisor (`warden doctor` compares it with the supervisor's
        // effective deadline): `decide_deadline_ms`, and `decide_deadline_ms.<agent>` per agent.
        let d = s.config.description();
        details.insert(
            "decide_deadline_ms".to_string(),
            d.decide_deadline_ms.to_string(),
        );
        for (agent, ms) in d.agent_decide_deadline_ms {
            details.insert(format!("decide_deadline_ms.{agent}"), ms.to_string());
        }
        self.1.details(&mut details);
        Ok(Response::new(warden_daemon::status::response(
            "warden-approver",
            s.started,
            s.listeners.read().map(|l| l.clone()).unwrap_or_default(),
            details,
        )))
    }

    async fn audit_query(
        &self,
        _request: Request<pb::AuditQueryRequest>,
    ) -> Result<Response<pb::AuditQueryResponse>, Status> {
        Err(Status::unimplemented(
            "warden-approver's decisions are in ApprovalService.History (`warden approvals history`)",
        ))
    }

    /// The approver has nothing it changes while it runs (its deadlines are what the
    /// supervisor learned through `Describe`); the answer, as for SIGHUP, says so and nothing
    /// changes.
    async fn reload(
        &self,
        _request: Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadResponse>, Status> {
        Ok(Response::new(self.1.reload("admin Reload").await))
    }

    type AuditFollowStream = futures::stream::Empty<Result<pb::AuditFollowEvent, Status>>;

    async fn audit_follow(
        &self,
        _request: Request<pb::AuditFollowRequest>,
    ) -> Result<Response<Self::AuditFollowStream>, Status> {
        Err(Status::unimplemented(
            "warden-approver's decisions are in ApprovalService.History (`warden approvals history`)",
        ))
    }
}
