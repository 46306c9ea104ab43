//! The A2A gRPC binding: `lf.a2a.v1.A2AService` (the vendored `proto/lf/a2a/v1/a2a.proto`) over
//! the same task core, store, mapping and bearer tokens as the JSON bindings.
//!
//! Every call is checked in the same order as an HTTP request: the bearer token in the
//! `authorization` metadata (UNAUTHENTICATED otherwise), then `a2a-version` (absent or `1.0`: this
//! service is the 1.0 package; anything else is FAILED_PRECONDITION with VERSION_NOT_SUPPORTED),
//! then the request itself. Errors are `google.rpc.Status` details carrying the A2A
//! `ErrorInfo` (reason, domain `a2a-protocol.org`), with the status codes of spec 1.0.1 §5.4.
//! Must never: answer a call before its token is checked, or show a task to another principal.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use warden_proto::a2a::v1 as pb;
use warden_proto::a2a::v1::a2a_service_server::{A2aService, A2aServiceServer};

use crate::a2a::{CancelTaskRequest, PROTOCOL_VERSION};
use crate::auth::{AuthFailure, Authenticator, Identity};
use crate::core::{Core, SendOutcome, Subscription};
use crate::error::{A2aError, ERROR_DOMAIN};
use crate::events::{StreamItem, stream_items};
use crate::grpc_convert as cv;

/// `google.rpc.ErrorInfo`, encoded into the status details.
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: std::collections::HashMap<String, String>,
}

/// `google.rpc.Status`, the body of `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// The gRPC status for an A2A error (spec 1.0.1 §5.4), with the ErrorInfo in its details.
pub fn status_of(err: &A2aError) -> Status {
    use prost::Message;
    use tonic::Code;
    let code = match err {
        A2aError::TaskNotFound(_) => Code::NotFound,
        A2aError::ParseError(_)
        | A2aError::InvalidRequest(_)
        | A2aError::InvalidParams(_)
        | A2aError::ContentTypeNotSupported(_) => Code::InvalidArgument,
        A2aError::MethodNotFound(_) => Code::Unimplemented,
        A2aError::Internal(_) | A2aError::InvalidAgentResponse(_) => Code::Internal,
        A2aError::PayloadTooLarge(_) | A2aError::ResourceExhausted(_) => Code::ResourceExhausted,
        A2aError::RequestTimeout(_) => Code::DeadlineExceeded,
        A2aError::TaskNotCancelable(_)
        | A2aError::PushNotificationNotSupported
        | A2aError::UnsupportedOperation(_)
        | A2aError::ExtendedAgentCardNotConfigured
        | A2aError::ExtensionSupportRequired(_)
        | A2aError::VersionNotSupported(_) => Code::FailedPrecondition,
    };
    let message = err.to_string();
    let details: Vec<prost_types::Any> = err
        .reason()
        .map(|reason| prost_types::Any {
            type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
            value: ErrorInfo {
                reason: reason.into(),
                domain: ERROR_DOMAIN.into(),
                metadata: Default::default(),
            }
            .encode_to_vec(),
        })
        .into_iter()
        .collect();
    let body = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details,
    };
    Status::with_details(code, message, body.encode_to_vec().into())
}

/// UNAUTHENTICATED for a call without a valid token (also answered by the edge, `serve.rs`,
/// before the call is read).
pub fn unauthenticated(f: AuthFailure) -> Status {
    match f {
        AuthFailure::Missing => Status::unauthenticated(
            "authentication required: send the metadata authorization: Bearer <token>",
        ),
        f => Status::unauthenticated(f.message()),
    }
}

/// The service over the task core.
pub struct Grpc {
    pub core: Arc<Core>,
    pub auth: Authenticator,
    /// The card, for `GetExtendedAgentCard`.
    pub card: crate::card::CardResponse,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StreamResponse, Status>> + Send>>;

impl Grpc {
    pub fn server(self) -> A2aServiceServer<Self> {
        A2aServiceServer::new(self)
    }

    /// Token, then version; the caller's identity.
    async fn admit<T>(&self, req: &Request<T>) -> Result<Identity, Status> {
        let headers = req.metadata().clone().into_headers();
        let caller = self
            .auth
            .authenticate_request(&headers, req.extensions())
            .await
            .map_err(unauthenticated)?;
        match headers
            .get("a2a-version")
            .map(|v| v.to_str().unwrap_or("?").trim())
        {
            None | Some(PROTOCOL_VERSION) | Some("") => Ok(caller),
            Some(v) => Err(status_of(&A2aError::VersionNotSupported(format!(
                "A2A version '{v}' is not supported on lf.a2a.v1.A2AService; it speaks A2A {PROTOCOL_VERSION}"
            )))),
        }
    }
}

/// A subscription as a gRPC stream: the snapshot, then events, ending after the first terminal or
/// interrupted status (the same sequence as the SSE bindings).
fn grpc_stream(sub: Subscription) -> EventStream {
    let every = sub.keepalive;
    Box::pin(
        with_keepalive(stream_items(sub), every).map(|item| match item {
            StreamItem::Event(ev) => Ok(cv::stream_response_to_pb(&ev)),
            StreamItem::Error(e) => Err(status_of(&e)),
        }),
    )
}

/// gRPC has no comment frame: a stream silent for `every` (a queued or quiet task) is sent its
/// task's current status again, so a caller can tell waiting from dead. The repeated status is
/// never terminal (the stream ends at a terminal one).
fn with_keepalive(
    items: impl Stream<Item = StreamItem> + Send + 'static,
    every: std::time::Duration,
) -> impl Stream<Item = StreamItem> + Send + 'static {
    use crate::a2a::{StreamResponse, TaskStatusUpdateEvent};
    let items: Pin<Box<dyn Stream<Item = StreamItem> + Send>> = Box::pin(items);
    futures::stream::unfold(
        (items, None::<TaskStatusUpdateEvent>),
        move |(mut items, mut last)| async move {
            loop {
                match tokio::time::timeout(every, items.next()).await {
                    Ok(Some(item)) => {
                        if let StreamItem::Event(ev) = &item {
                            match &**ev {
                                StreamResponse::Task(t) => {
                                    last = Some(TaskStatusUpdateEvent {
                                        task_id: t.id.clone(),
                                        context_id: t.context_id.clone(),
                                        status: t.status.clone(),
                                        metadata: None,
                                    });
                                }
                                StreamResponse::StatusUpdate(u) => last = Some(u.clone()),
                                _ => {}
                            }
                        }
                        return Some((item, (items, last)));
                    }
                    Ok(None) => return None,
                    Err(_) => {
                        if let Some(status) = &last {
                            let again = Arc::new(StreamResponse::StatusUpdate(status.clone()));
                            return Some((StreamItem::Event(again), (items, last)));
                        }
                    }
                }
            }
        },
    )
}

fn single(ev: crate::a2a::StreamResponse) -> EventStream {
    Box::pin(futures::stream::once(async move {
        Ok(cv::stream_response_to_pb(&ev))
    }))
}

fn err(e: A2aError) -> Status {
    status_of(&e)
}

#[tonic::async_trait]
impl A2aService for Grpc {
    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let caller = self.admit(&request).await?;
        let req = cv::send_request_from_pb(request.get_ref()).map_err(err)?;
        use pb::send_message_response::Payload;
        let payload = match self.core.send(&caller, req, false).await.map_err(err)? {
            SendOutcome::Task(t) => Payload::Task(cv::task_to_pb(&t)),
            SendOutcome::Message(m) => Payload::Message(cv::message_to_pb(&m)),
            SendOutcome::Stream(sub) => Payload::Task(cv::task_to_pb(&sub.task)),
        };
        Ok(Response::new(pb::SendMessageResponse {
            payload: Some(payload),
        }))
    }

    type SendStreamingMessageStream = EventStream;

    async fn send_streaming_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self.admit(&request).await?;
        let req = cv::send_request_from_pb(request.get_ref()).map_err(err)?;
        Ok(Response::new(
            match self.core.send(&caller, req, true).await.map_err(err)? {
                SendOutcome::Stream(sub) => grpc_stream(*sub),
                SendOutcome::Task(t) => single(crate::a2a::StreamResponse::Task(*t)),
                SendOutcome::Message(m) => single(crate::a2a::StreamResponse::Message(*m)),
            },
        ))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let caller = self.admit(&request).await?;
        let r = request.get_ref();
        let task = self
            .core
            .get(&caller.principal, &r.id, r.history_length)
            .await
            .map_err(err)?;
        Ok(Response::new(cv::task_to_pb(&task)))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let caller = self.admit(&request).await?;
        let req = cv::list_request_from_pb(request.get_ref());
        let resp = self.core.list(&caller.principal, &req).await.map_err(err)?;
        Ok(Response::new(cv::list_response_to_pb(&resp)))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let caller = self.admit(&request).await?;
        let req = CancelTaskRequest {
            tenant: None,
            id: request.get_ref().id.clone(),
            metadata: None,
        };
        let task = self
            .core
            .cancel(&caller.principal, &req.id)
            .await
            .map_err(err)?;
        Ok(Response::new(cv::task_to_pb(&task)))
    }

    type SubscribeToTaskStream = EventStream;

    async fn subscribe_to_task(
        &self,
        request: Request<pb::SubscribeToTaskRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self.admit(&request).await?;
        let sub = self
            .core
            .subscribe(&caller.principal, &request.get_ref().id)
            .await
            .map_err(err)?;
        Ok(Response::new(grpc_stream(sub)))
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<pb::TaskPushNotificationConfig>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let caller = self.admit(&request).await?;
        let cfg = cv::push_config_from_pb(request.get_ref());
        let created = self
            .core
            .create_push_config(&caller.principal, cfg)
            .await
            .map_err(err)?;
        Ok(Response::new(cv::push_config_to_pb(&created)))
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<pb::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let caller = self.admit(&request).await?;
        let r = request.get_ref();
        let cfg = self
            .core
            .get_push_config(&caller.principal, &r.task_id, &r.id)
            .await
            .map_err(err)?;
        Ok(Response::new(cv::push_config_to_pb(&cfg)))
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<pb::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<pb::ListTaskPushNotificationConfigsResponse>, Status> {
        let caller = self.admit(&request).await?;
        let listed = self
            .core
            .list_push_configs(&caller.principal, &request.get_ref().task_id)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::ListTaskPushNotificationConfigsResponse {
            configs: listed.configs.iter().map(cv::push_config_to_pb).collect(),
            next_page_token: listed.next_page_token,
        }))
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<pb::GetExtendedAgentCardRequest>,
    ) -> Result<Response<pb::AgentCard>, Status> {
        let caller = self.admit(&request).await?;
        Ok(Response::new(cv::card_to_pb(
            &self.card.extended(&self.core, &caller),
        )))
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<pb::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let caller = self.admit(&request).await?;
        let r = request.get_ref();
        self.core
            .delete_push_config(&caller.principal, &r.task_id, &r.id)
            .await
            .map_err(err)?;
        Ok(Response::new(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn errors_carry_the_spec_code_and_the_a2a_error_info() {
        let s = status_of(&A2aError::TaskNotFound("t".into()));
        assert_eq!(s.code(), tonic::Code::NotFound);
        let body = RpcStatus::decode(s.details()).unwrap();
        assert_eq!(body.code, tonic::Code::NotFound as i32);
        let info = ErrorInfo::decode(body.details[0].value.as_slice()).unwrap();
        assert_eq!(info.reason, "TASK_NOT_FOUND");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(
            status_of(&A2aError::TaskNotCancelable("x".into())).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            status_of(&A2aError::InvalidParams("x".into())).code(),
            tonic::Code::InvalidArgument
        );
        // The standard JSON-RPC errors have no ErrorInfo.
        let body = RpcStatus::decode(status_of(&A2aError::Internal("x".into())).details()).unwrap();
        assert!(body.details.is_empty());
    }
}
