//! The A2A 1.0 JSON-RPC binding: each method as a call of the core, its answer in a JSON-RPC
//! response, its streams as SSE of JSON-RPC responses.
//!
//! Owns: the 1.0 method table. Must never: admit a call itself (`admission.rs` did, and
//! `http.rs` chose the version) or import another binding.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use serde_json::{Value, json};

use crate::a2a::{
    CancelTaskRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest, ListTasksRequest,
    SendMessageRequest, StreamResponse, SubscribeToTaskRequest, TaskPushNotificationConfig,
    TaskPushNotificationConfigRef,
};
use crate::admission::{HttpState, json_response, params, rpc_error};
use crate::auth::Identity;
use crate::core::{SendOutcome, Subscription};
use crate::error::A2aError;
use crate::events::StreamItem;

/// Serves one 1.0 JSON-RPC call; every failure is a JSON-RPC error with the call's id.
pub async fn serve(
    state: &Arc<HttpState>,
    caller: &Identity,
    method: &str,
    p: Value,
    id: &Value,
) -> Response {
    match dispatch(state, caller, method, p, id).await {
        Ok(r) => r,
        Err(e) => rpc_error(id, &e),
    }
}

fn result(id: &Value, value: impl serde::Serialize) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": value}),
    )
}

/// The stream's items as SSE events, each a JSON-RPC response carrying the call's id.
fn stream(sub: Subscription, id: &Value) -> Response {
    let id = id.clone();
    crate::admission::sse(sub, move |item| match item {
        StreamItem::Event(ev) => {
            Event::default().data(json!({"jsonrpc": "2.0", "id": id, "result": &*ev}).to_string())
        }
        StreamItem::Error(e) => Event::default()
            .event("error")
            .data(e.jsonrpc_response(id.clone()).to_string()),
    })
}

async fn dispatch(
    state: &Arc<HttpState>,
    caller: &Identity,
    method: &str,
    p: Value,
    id: &Value,
) -> Result<Response, A2aError> {
    let core = &state.core;
    let principal = caller.principal.as_str();
    match method {
        "SendMessage" | "SendStreamingMessage" => {
            let streaming = method == "SendStreamingMessage";
            let req: SendMessageRequest = params(p)?;
            Ok(match core.send(caller, req, streaming).await? {
                SendOutcome::Stream(sub) => stream(*sub, id),
                SendOutcome::Task(task) => result(id, StreamResponse::Task(*task)),
                SendOutcome::Message(m) => result(id, StreamResponse::Message(*m)),
            })
        }
        "GetTask" => {
            let req: GetTaskRequest = params(p)?;
            Ok(result(
                id,
                core.get(principal, &req.id, req.history_length).await?,
            ))
        }
        "ListTasks" => {
            let req: ListTasksRequest = params(p)?;
            Ok(result(id, core.list(principal, &req).await?))
        }
        "CancelTask" => {
            let req: CancelTaskRequest = params(p)?;
            Ok(result(id, core.cancel(principal, &req.id).await?))
        }
        "SubscribeToTask" => {
            let req: SubscribeToTaskRequest = params(p)?;
            Ok(stream(core.subscribe(principal, &req.id).await?, id))
        }
        "CreateTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfig = params(p)?;
            Ok(result(id, core.create_push_config(principal, req).await?))
        }
        "GetTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfigRef = params(p)?;
            Ok(result(
                id,
                core.get_push_config(principal, &req.task_id, &req.id)
                    .await?,
            ))
        }
        "ListTaskPushNotificationConfigs" => {
            let req: ListTaskPushNotificationConfigsRequest = params(p)?;
            Ok(result(
                id,
                core.list_push_configs(principal, &req.task_id).await?,
            ))
        }
        "DeleteTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfigRef = params(p)?;
            core.delete_push_config(principal, &req.task_id, &req.id)
                .await?;
            Ok(result(id, json!({})))
        }
        // warden's own: the caller's context closed and its conversation's root removed.
        "warden.CloseContext" => {
            let ctx = p
                .get("contextId")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| A2aError::InvalidParams("params.contextId is required".into()))?;
            Ok(result(id, core.close_context(principal, ctx).await?))
        }
        "GetExtendedAgentCard" => Ok(result(id, state.card.extended(core, caller))),
        m if m.contains('/') => Err(A2aError::MethodNotFound(format!(
            "method {m:?} is an A2A 0.3 method; this agent speaks A2A 1.0 (e.g. SendMessage)"
        ))),
        m => Err(A2aError::MethodNotFound(format!("method {m:?} not found"))),
    }
}
