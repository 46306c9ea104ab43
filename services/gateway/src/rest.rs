//! The A2A 1.0 HTTP+JSON binding: its routes (served under `/a2a/rest` and at the root), each a
//! call of the core, answered in `application/a2a+json`, its streams as SSE.
//!
//! Owns: the 1.0 REST route table and the not-found answer. Must never: skip `admission.rs`'s
//! checks on a route or import another binding.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::Response;
use axum::response::sse::Event;
use axum::routing::{any, get, post};
use serde_json::{Value, json};

use crate::a2a::{
    ListTasksRequest, SendMessageRequest, StreamResponse, TaskPushNotificationConfig,
};
use crate::admission::{
    Caller, HttpState, RestError, check_content_type, host_ok, host_refused, json_body, json_value,
    params, query_map, read_body, rest_error, rest_ok,
};
use crate::auth::Identity;
use crate::core::{SendOutcome, Subscription};
use crate::error::A2aError;
use crate::events::StreamItem;

/// The stream's items as SSE events: each event's JSON, an error as an `error` event.
fn stream(sub: Subscription) -> Response {
    crate::admission::sse(sub, |item| match item {
        StreamItem::Event(ev) => {
            Event::default().data(serde_json::to_string(&*ev).unwrap_or_default())
        }
        StreamItem::Error(e) => Event::default()
            .event("error")
            .data(e.rest_body().to_string()),
    })
}

type Answer = Result<Response, RestError>;

async fn send(state: Arc<HttpState>, caller: Identity, req: Request, streaming: bool) -> Answer {
    let (parts, body) = req.into_parts();
    let value = json_body(&state, &parts.headers, body).await?;
    let req: SendMessageRequest = params(value)?;
    Ok(match state.core.send(&caller, req, streaming).await? {
        SendOutcome::Stream(sub) => stream(*sub),
        SendOutcome::Task(task) => rest_ok(&StreamResponse::Task(*task)),
        SendOutcome::Message(m) => rest_ok(&StreamResponse::Message(*m)),
    })
}

async fn list(
    State(state): State<Arc<HttpState>>,
    Caller(caller): Caller,
    RawQuery(query): RawQuery,
) -> Answer {
    let req: ListTasksRequest = params(Value::Object(query_map(query.as_deref())?))?;
    Ok(rest_ok(&state.core.list(&caller.principal, &req).await?))
}

/// GET /tasks/{id} and GET /tasks/{id}:subscribe.
async fn task_get(
    State(state): State<Arc<HttpState>>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    if let Some(task_id) = id.strip_suffix(":subscribe") {
        return Ok(stream(
            state.core.subscribe(&caller.principal, task_id).await?,
        ));
    }
    if id.contains(':') {
        return Err(A2aError::MethodNotFound(format!("no such operation: GET /tasks/{id}")).into());
    }
    let q = query_map(query.as_deref())?;
    let history_length = q
        .get("historyLength")
        .map(|v| v.as_i64().unwrap_or(-1).clamp(-1, i32::MAX as i64) as i32);
    Ok(rest_ok(
        &state
            .core
            .get(&caller.principal, &id, history_length)
            .await?,
    ))
}

/// POST /tasks/{id}:cancel and POST /tasks/{id}:subscribe.
async fn task_post(
    State(state): State<Arc<HttpState>>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    req: Request,
) -> Answer {
    let (parts, body) = req.into_parts();
    // A body is optional here (cancel carries only metadata); when present it must be JSON.
    let has_body = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v != "0")
        || parts.headers.contains_key(header::TRANSFER_ENCODING);
    if has_body {
        check_content_type(&parts.headers)?;
        let bytes = read_body(body, &parts.headers, state.max_body, state.body_timeout).await?;
        if !bytes.is_empty() {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| A2aError::ParseError(format!("request body is not JSON: {e}")))?;
            if !v.is_object() {
                return Err(
                    A2aError::InvalidRequest("the body must be a JSON object".into()).into(),
                );
            }
        }
    }
    if let Some(task_id) = id.strip_suffix(":cancel") {
        return Ok(rest_ok(
            &state.core.cancel(&caller.principal, task_id).await?,
        ));
    }
    if let Some(task_id) = id.strip_suffix(":subscribe") {
        return Ok(stream(
            state.core.subscribe(&caller.principal, task_id).await?,
        ));
    }
    Err(A2aError::MethodNotFound(format!("no such operation: POST /tasks/{id}")).into())
}

/// POST (create) and GET (list) `/tasks/{id}/pushNotificationConfigs`.
async fn push_collection(
    State(state): State<Arc<HttpState>>,
    Caller(caller): Caller,
    Path(task_id): Path<String>,
    req: Request,
) -> Answer {
    if state.core.push().is_none() {
        return Err(A2aError::PushNotificationNotSupported.into());
    }
    let (parts, body) = req.into_parts();
    match parts.method {
        Method::POST => {
            let value = json_value(&state, &parts.headers, body).await?;
            let mut cfg: TaskPushNotificationConfig = params(value)?;
            if !cfg.task_id.is_empty() && cfg.task_id != task_id {
                return Err(A2aError::InvalidParams(format!(
                    "taskId {:?} in the body is not the task {task_id:?} of the path",
                    cfg.task_id
                ))
                .into());
            }
            cfg.task_id = task_id;
            Ok(rest_ok(
                &state
                    .core
                    .create_push_config(&caller.principal, cfg)
                    .await?,
            ))
        }
        Method::GET => Ok(rest_ok(
            &state
                .core
                .list_push_configs(&caller.principal, &task_id)
                .await?,
        )),
        m => Err(A2aError::MethodNotFound(format!(
            "no such operation: {m} /tasks/{task_id}/pushNotificationConfigs"
        ))
        .into()),
    }
}

/// GET and DELETE `/tasks/{id}/pushNotificationConfigs/{config}`.
async fn push_item(
    State(state): State<Arc<HttpState>>,
    Caller(caller): Caller,
    Path((task_id, id)): Path<(String, String)>,
    method: Method,
) -> Answer {
    match method {
        Method::GET => Ok(rest_ok(
            &state
                .core
                .get_push_config(&caller.principal, &task_id, &id)
                .await?,
        )),
        Method::DELETE => {
            state
                .core
                .delete_push_config(&caller.principal, &task_id, &id)
                .await?;
            Ok(rest_ok(&json!({})))
        }
        m => Err(A2aError::MethodNotFound(format!(
            "no such operation: {m} /tasks/{task_id}/pushNotificationConfigs/{id}"
        ))
        .into()),
    }
}

async fn extended_card(State(state): State<Arc<HttpState>>, Caller(caller): Caller) -> Response {
    rest_ok(&state.card.extended(&state.core, &caller))
}

pub async fn not_found(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    if !host_ok(&state, &headers) {
        return host_refused();
    }
    rest_error(&A2aError::MethodNotFound(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    )))
}

/// The 1.0 HTTP+JSON routes.
pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route(
            "/message:send",
            post(|s: State<_>, c: Caller, r| send(s.0, c.0, r, false)),
        )
        .route(
            "/message:stream",
            post(|s: State<_>, c: Caller, r| send(s.0, c.0, r, true)),
        )
        .route("/tasks", get(list))
        .route("/tasks/{id}", get(task_get).post(task_post))
        .route("/tasks/{id}/pushNotificationConfigs", any(push_collection))
        .route(
            "/tasks/{id}/pushNotificationConfigs/{config}",
            any(push_item),
        )
        .route("/extendedAgentCard", get(extended_card))
}
