//! The A2A 1.0 HTTP+JSON binding: its routes (served under `/a2a/rest` and at the root), each a
//! call of the core, answered in `application/a2a+json`, its streams as SSE.
//!
//! Owns: the 1.0 REST route table and the not-found answer. Must never: skip `admission.rs`'s
//! checks on a route or import another binding.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::response::sse::Event;
use axum::routing::{any, get, post};
use serde_json::{Value, json};

use crate::a2a::{
    ListTasksRequest, SendMessageRequest, StreamResponse, TaskPushNotificationConfig,
};
use crate::admission::{
    HttpState, admit, check_content_type, host_ok, host_refused, json_body, json_value, params,
    query_map, read_body, rest_error, rest_response,
};
use crate::error::A2aError;
use crate::events::StreamItem;
use crate::tasks::{SendOutcome, Subscription};

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

async fn rest_send(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
    req: Request,
    streaming: bool,
) -> Response {
    let (parts, body) = req.into_parts();
    let principal = match admit(&state, &parts.headers, query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = async {
        let value = json_body(&state, &parts.headers, body).await?;
        let req: SendMessageRequest = params(value)?;
        Ok(match state.core.send(&principal, req, streaming).await? {
            SendOutcome::Stream(sub) => stream(*sub),
            SendOutcome::Task(task) => rest_response(
                StatusCode::OK,
                &serde_json::to_value(StreamResponse::Task(*task)).unwrap_or(Value::Null),
            ),
            SendOutcome::Message(m) => rest_response(
                StatusCode::OK,
                &serde_json::to_value(StreamResponse::Message(*m)).unwrap_or(Value::Null),
            ),
        })
    };
    match run.await {
        Ok(r) => r,
        Err(e) => rest_error(&e),
    }
}

async fn rest_list(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let principal = match admit(&state, &headers, query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = || -> Result<Response, A2aError> {
        let req: ListTasksRequest = params(Value::Object(query_map(query.as_deref())?))?;
        let resp = state.core.list(&principal, &req)?;
        Ok(rest_response(
            StatusCode::OK,
            &serde_json::to_value(resp).unwrap_or(Value::Null),
        ))
    };
    run().unwrap_or_else(|e| rest_error(&e))
}

/// GET /tasks/{id} and GET /tasks/{id}:subscribe.
async fn rest_task_get(
    State(state): State<Arc<HttpState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let principal = match admit(&state, &headers, query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = || -> Result<Response, A2aError> {
        if let Some(task_id) = id.strip_suffix(":subscribe") {
            return Ok(stream(state.core.subscribe(&principal, task_id)?));
        }
        if id.contains(':') {
            return Err(A2aError::MethodNotFound(format!(
                "no such operation: GET /tasks/{id}"
            )));
        }
        let q = query_map(query.as_deref())?;
        let history_length = q
            .get("historyLength")
            .map(|v| v.as_i64().unwrap_or(-1).clamp(-1, i32::MAX as i64) as i32);
        let task = state.core.get(&principal, &id, history_length)?;
        Ok(rest_response(
            StatusCode::OK,
            &serde_json::to_value(task).unwrap_or(Value::Null),
        ))
    };
    run().unwrap_or_else(|e| rest_error(&e))
}

/// POST /tasks/{id}:cancel and POST /tasks/{id}:subscribe.
async fn rest_task_post(
    State(state): State<Arc<HttpState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let principal = match admit(&state, &parts.headers, query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = async {
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
                    return Err(A2aError::InvalidRequest(
                        "the body must be a JSON object".into(),
                    ));
                }
            }
        }
        if let Some(task_id) = id.strip_suffix(":cancel") {
            let task = state.core.cancel(&principal, task_id).await?;
            return Ok(rest_response(
                StatusCode::OK,
                &serde_json::to_value(task).unwrap_or(Value::Null),
            ));
        }
        if let Some(task_id) = id.strip_suffix(":subscribe") {
            return Ok(stream(state.core.subscribe(&principal, task_id)?));
        }
        Err(A2aError::MethodNotFound(format!(
            "no such operation: POST /tasks/{id}"
        )))
    };
    match run.await {
        Ok(r) => r,
        Err(e) => rest_error(&e),
    }
}

/// POST (create) and GET (list) `/tasks/{id}/pushNotificationConfigs`.
async fn rest_push_collection(
    State(state): State<Arc<HttpState>>,
    Path(task_id): Path<String>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let principal = match admit(&state, &parts.headers, query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = async {
        if state.core.push().is_none() {
            return Err(A2aError::PushNotificationNotSupported);
        }
        match parts.method {
            http::Method::POST => {
                let value = json_value(&state, &parts.headers, body).await?;
                let mut cfg: TaskPushNotificationConfig = params(value)?;
                if !cfg.task_id.is_empty() && cfg.task_id != task_id {
                    return Err(A2aError::InvalidParams(format!(
                        "taskId {:?} in the body is not the task {task_id:?} of the path",
                        cfg.task_id
                    )));
                }
                cfg.task_id = task_id.clone();
                let created = state.core.create_push_config(&principal, cfg).await?;
                Ok(rest_response(
                    StatusCode::OK,
                    &serde_json::to_value(created).unwrap_or(Value::Null),
                ))
            }
            http::Method::GET => {
                let listed = state.core.list_push_configs(&principal, &task_id)?;
                Ok(rest_response(
                    StatusCode::OK,
                    &serde_json::to_value(listed).unwrap_or(Value::Null),
                ))
            }
            m => Err(A2aError::MethodNotFound(format!(
                "no such operation: {m} /tasks/{task_id}/pushNotificationConfigs"
            ))),
        }
    };
    match run.await {
        Ok(r) => r,
        Err(e) => rest_error(&e),
    }
}

/// GET and DELETE `/tasks/{id}/pushNotificationConfigs/{config}`.
async fn rest_push_item(
    State(state): State<Arc<HttpState>>,
    Path((task_id, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let principal = match admit(&state, req.headers(), query.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let run = || -> Result<Response, A2aError> {
        match *req.method() {
            http::Method::GET => {
                let cfg = state.core.get_push_config(&principal, &task_id, &id)?;
                Ok(rest_response(
                    StatusCode::OK,
                    &serde_json::to_value(cfg).unwrap_or(Value::Null),
                ))
            }
            http::Method::DELETE => {
                state.core.delete_push_config(&principal, &task_id, &id)?;
                Ok(rest_response(StatusCode::OK, &json!({})))
            }
            ref m => Err(A2aError::MethodNotFound(format!(
                "no such operation: {m} /tasks/{task_id}/pushNotificationConfigs/{id}"
            ))),
        }
    };
    run().unwrap_or_else(|e| rest_error(&e))
}

async fn rest_extended_card(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    match admit(&state, &headers, query.as_deref()) {
        Ok(principal) => rest_response(
            StatusCode::OK,
            &serde_json::to_value(state.card.extended(&state.core, &principal))
                .unwrap_or(Value::Null),
        ),
        Err(r) => *r,
    }
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
        .route("/message:send", post(|s, q, r| rest_send(s, q, r, false)))
        .route("/message:stream", post(|s, q, r| rest_send(s, q, r, true)))
        .route("/tasks", get(rest_list))
        .route("/tasks/{id}", get(rest_task_get).post(rest_task_post))
        .route(
            "/tasks/{id}/pushNotificationConfigs",
            any(rest_push_collection),
        )
        .route(
            "/tasks/{id}/pushNotificationConfigs/{config}",
            any(rest_push_item),
        )
        .route("/extendedAgentCard", get(rest_extended_card))
}
