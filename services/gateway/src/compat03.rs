//! The A2A 0.3 binding on the same endpoints as 1.0: a request without `A2A-Version` (or with
//! `0.3`) that uses a 0.3 method (JSON-RPC `message/send`, `tasks/get`, …) or a 0.3 REST path
//! (`/v1/message:send`, …) is translated to the 1.0 request (`translate03.rs`), served by the same
//! core, and its answer translated back.
//! Owns: the 0.3 JSON-RPC methods and `/v1` routes. Must never: answer a 0.3 request before the
//! same Host, token and Content-Type checks as 1.0 (`admission.rs`), or import another binding.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::admission::{
    HttpState, admit_caller, json_body, json_response, query_map, requested_version, rest_response,
    sse,
};
use crate::auth::Identity;
use crate::core::{SendOutcome, Subscription};
use crate::error::A2aError;
use crate::events::StreamItem;
use crate::translate03::{
    Shape, bad, card_json, error_out, error_type, event_out, member, message_out, push_in,
    push_out, send_in, speaks_03, str_member, task_out,
};

// ------------------------------------------------------------------ JSON-RPC

fn rpc_result(id: &Value, result: Value) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
}

/// A 0.3 JSON-RPC error (HTTP 200, code and message).
pub fn rpc_error(id: &Value, e: &A2aError) -> Response {
    json_response(
        match e {
            A2aError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::OK,
        },
        &json!({"jsonrpc": "2.0", "id": id, "error": error_out(e)}),
    )
}

fn task_id_param(p: &Value) -> Result<String, A2aError> {
    str_member(p, &["id", "taskId", "task_id"]).ok_or_else(|| bad("id (the task id) is required"))
}

/// Serves one 0.3 JSON-RPC call.
pub async fn jsonrpc(
    state: &Arc<HttpState>,
    caller: &Identity,
    method: &str,
    p: Value,
    id: Value,
) -> Response {
    match dispatch_rpc(state, caller, method, p, &id).await {
        Ok(r) => r,
        Err(e) => rpc_error(&id, &e),
    }
}

fn rpc_stream(sub: Subscription, id: Value) -> Response {
    sse(sub, move |item| match item {
        StreamItem::Event(ev) => Event::default().data(
            json!({"jsonrpc": "2.0", "id": id, "result": event_out(&ev, Shape::Rpc)}).to_string(),
        ),
        StreamItem::Error(e) => Event::default()
            .data(json!({"jsonrpc": "2.0", "id": id, "error": error_out(&e)}).to_string()),
    })
}

async fn dispatch_rpc(
    state: &Arc<HttpState>,
    caller: &Identity,
    method: &str,
    p: Value,
    id: &Value,
) -> Result<Response, A2aError> {
    let core = &state.core;
    let principal = caller.principal.as_str();
    match method {
        "message/send" | "message/stream" => {
            let streaming = method == "message/stream";
            let req = send_in(&p, Shape::Rpc)?;
            Ok(match core.send(caller, req, streaming).await? {
                SendOutcome::Stream(sub) => rpc_stream(*sub, id.clone()),
                SendOutcome::Task(t) => rpc_result(id, task_out(&t, Shape::Rpc)),
                SendOutcome::Message(m) => rpc_result(id, message_out(&m, Shape::Rpc)),
            })
        }
        "tasks/get" => {
            let history = member(&p, &["historyLength", "history_length"])
                .and_then(Value::as_i64)
                .map(|n| n.clamp(-1, i32::MAX as i64) as i32);
            let t = core.get(principal, &task_id_param(&p)?, history).await?;
            Ok(rpc_result(id, task_out(&t, Shape::Rpc)))
        }
        "tasks/cancel" => {
            let t = core.cancel(principal, &task_id_param(&p)?).await?;
            Ok(rpc_result(id, task_out(&t, Shape::Rpc)))
        }
        "tasks/resubscribe" => Ok(rpc_stream(
            core.subscribe(principal, &task_id_param(&p)?).await?,
            id.clone(),
        )),
        "tasks/pushNotificationConfig/set" => {
            let task_id =
                str_member(&p, &["taskId", "task_id"]).ok_or_else(|| bad("taskId is required"))?;
            let inner = member(&p, &["pushNotificationConfig"])
                .ok_or_else(|| bad("pushNotificationConfig is required"))?;
            let cfg = push_in(inner, Some(&task_id))?;
            let created = core.create_push_config(principal, cfg).await?;
            Ok(rpc_result(id, push_out(&created, Shape::Rpc)))
        }
        "tasks/pushNotificationConfig/get" => {
            let task_id = task_id_param(&p)?;
            let cfg = match str_member(&p, &["pushNotificationConfigId"]) {
                Some(cid) => core.get_push_config(principal, &task_id, &cid).await?,
                // 0.3 allowed asking for "the" config of a task: the first one.
                None => core
                    .list_push_configs(principal, &task_id)
                    .await?
                    .configs
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        A2aError::TaskNotFound(format!("{task_id}/pushNotificationConfigs"))
                    })?,
            };
            Ok(rpc_result(id, push_out(&cfg, Shape::Rpc)))
        }
        "tasks/pushNotificationConfig/list" => {
            let listed = core
                .list_push_configs(principal, &task_id_param(&p)?)
                .await?;
            Ok(rpc_result(
                id,
                Value::Array(
                    listed
                        .configs
                        .iter()
                        .map(|c| push_out(c, Shape::Rpc))
                        .collect(),
                ),
            ))
        }
        "tasks/pushNotificationConfig/delete" => {
            let task_id = task_id_param(&p)?;
            let cid = str_member(&p, &["pushNotificationConfigId"])
                .ok_or_else(|| bad("pushNotificationConfigId is required"))?;
            core.delete_push_config(principal, &task_id, &cid).await?;
            Ok(rpc_result(id, Value::Null))
        }
        "agent/getAuthenticatedExtendedCard" => {
            let card = state.card.extended(core, caller);
            Ok(rpc_result(id, card_json(&card)))
        }
        m => Err(A2aError::MethodNotFound(format!("method {m:?} not found"))),
    }
}

// ------------------------------------------------------------------ REST (/v1/…)

/// A caller admitted on a `/v1` route: Host, token, then the version — a `/v1` path speaks 0.3
/// (absent or `0.3`). An axum extractor, as the 1.0 routes' [`crate::admission::Caller`].
struct Caller03(Identity);

impl FromRequestParts<Arc<HttpState>> for Caller03 {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<HttpState>,
    ) -> Result<Self, Response> {
        let principal = admit_caller(state, parts).await.map_err(|r| *r)?;
        match requested_version(&parts.headers, parts.uri.query()) {
            v if speaks_03(v.as_deref()) => Ok(Self(principal)),
            Some(v) => Err(rest_error(&A2aError::VersionNotSupported(format!(
                "/v1 paths are the A2A 0.3 REST binding; A2A-Version {v:?} is served without the /v1 prefix"
            )))),
            None => Ok(Self(principal)),
        }
    }
}

/// An A2A error in the 0.3 REST shape, so a `/v1` handler can use `?`.
struct Rest03Error(A2aError);

impl From<A2aError> for Rest03Error {
    fn from(e: A2aError) -> Self {
        Self(e)
    }
}

impl IntoResponse for Rest03Error {
    fn into_response(self) -> Response {
        rest_error(&self.0)
    }
}

type Answer = Result<Response, Rest03Error>;

fn ok(body: &Value) -> Response {
    rest_response(StatusCode::OK, body)
}

fn rest_sse(sub: Subscription) -> Response {
    sse(sub, |item| match item {
        StreamItem::Event(ev) => Event::default().data(event_out(&ev, Shape::Proto).to_string()),
        StreamItem::Error(e) => Event::default()
            .event("error")
            .data(json!({"type": error_type(&e), "message": e.to_string()}).to_string()),
    })
}

async fn rest_send(
    state: Arc<HttpState>,
    caller: Identity,
    req: Request,
    streaming: bool,
) -> Answer {
    let (parts, body) = req.into_parts();
    let v = json_body(&state, &parts.headers, body).await?;
    let req = send_in(&v, Shape::Proto)?;
    Ok(match state.core.send(&caller, req, streaming).await? {
        SendOutcome::Stream(sub) => rest_sse(*sub),
        SendOutcome::Task(t) => ok(&json!({"task": task_out(&t, Shape::Proto)})),
        SendOutcome::Message(m) => ok(&json!({"message": message_out(&m, Shape::Proto)})),
    })
}

/// GET /v1/tasks/{id}, GET /v1/tasks/{id}:subscribe.
async fn rest_task_get(
    State(state): State<Arc<HttpState>>,
    Caller03(caller): Caller03,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    if let Some(t) = id.strip_suffix(":subscribe") {
        return Ok(rest_sse(state.core.subscribe(&caller.principal, t).await?));
    }
    let q = query_map(query.as_deref())?;
    let history = q
        .get("historyLength")
        .map(|v| v.as_i64().unwrap_or(-1).clamp(-1, i32::MAX as i64) as i32);
    let t = state.core.get(&caller.principal, &id, history).await?;
    Ok(ok(&task_out(&t, Shape::Proto)))
}

/// POST /v1/tasks/{id}:cancel, POST /v1/tasks/{id}:subscribe.
async fn rest_task_post(
    State(state): State<Arc<HttpState>>,
    Caller03(caller): Caller03,
    Path(id): Path<String>,
) -> Answer {
    if let Some(t) = id.strip_suffix(":cancel") {
        let t = state.core.cancel(&caller.principal, t).await?;
        return Ok(ok(&task_out(&t, Shape::Proto)));
    }
    if let Some(t) = id.strip_suffix(":subscribe") {
        return Ok(rest_sse(state.core.subscribe(&caller.principal, t).await?));
    }
    Err(A2aError::MethodNotFound(format!("no such operation: POST /v1/tasks/{id}")).into())
}

/// POST (create) and GET (list) /v1/tasks/{id}/pushNotificationConfigs.
async fn rest_push_collection(
    State(state): State<Arc<HttpState>>,
    Caller03(caller): Caller03,
    Path(task_id): Path<String>,
    req: Request,
) -> Answer {
    let (parts, body) = req.into_parts();
    if parts.method == Method::GET {
        let listed = state
            .core
            .list_push_configs(&caller.principal, &task_id)
            .await?;
        return Ok(ok(&json!({
            "configs": listed.configs.iter().map(|c| push_out(c, Shape::Proto)).collect::<Vec<_>>(),
            "nextPageToken": "",
        })));
    }
    let v = json_body(&state, &parts.headers, body).await?;
    // CreateTaskPushNotificationConfigRequest {parent, configId, config: {name?, pushNotificationConfig}}
    // or the config itself.
    let config = member(&v, &["config"]).unwrap_or(&v);
    let inner = member(
        config,
        &["pushNotificationConfig", "push_notification_config"],
    )
    .ok_or_else(|| bad("config.pushNotificationConfig is required"))?;
    let mut cfg = push_in(inner, Some(&task_id))?;
    if cfg.id.is_empty() {
        cfg.id = str_member(&v, &["configId", "config_id"]).unwrap_or_default();
    }
    let created = state
        .core
        .create_push_config(&caller.principal, cfg)
        .await?;
    Ok(ok(&push_out(&created, Shape::Proto)))
}

/// GET and DELETE /v1/tasks/{id}/pushNotificationConfigs/{config}.
async fn rest_push_item(
    State(state): State<Arc<HttpState>>,
    Caller03(caller): Caller03,
    Path((task_id, cid)): Path<(String, String)>,
    method: Method,
) -> Answer {
    if method == Method::DELETE {
        state
            .core
            .delete_push_config(&caller.principal, &task_id, &cid)
            .await?;
        return Ok(ok(&json!({})));
    }
    let cfg = state
        .core
        .get_push_config(&caller.principal, &task_id, &cid)
        .await?;
    Ok(ok(&push_out(&cfg, Shape::Proto)))
}

/// GET /v1/card: the authenticated (extended) card in 0.3 form.
async fn rest_card(State(state): State<Arc<HttpState>>, Caller03(caller): Caller03) -> Response {
    ok(&card_json(&state.card.extended(&state.core, &caller)))
}

/// The 0.3 REST routes (`/v1/…`), merged into the HTTP+JSON routes.
pub fn rest_routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route(
            "/v1/message:send",
            post(|s: State<_>, c: Caller03, r| rest_send(s.0, c.0, r, false)),
        )
        .route(
            "/v1/message:stream",
            post(|s: State<_>, c: Caller03, r| rest_send(s.0, c.0, r, true)),
        )
        .route("/v1/tasks/{id}", get(rest_task_get).post(rest_task_post))
        .route(
            "/v1/tasks/{id}/pushNotificationConfigs",
            get(rest_push_collection).post(rest_push_collection),
        )
        .route(
            "/v1/tasks/{id}/pushNotificationConfigs/{config}",
            get(rest_push_item).delete(rest_push_item),
        )
        .route("/v1/card", get(rest_card))
}

fn rest_error(e: &A2aError) -> Response {
    rest_response(
        e.http_status(),
        &json!({"type": error_type(e), "code": e.code(), "message": e.to_string()}),
    )
}
