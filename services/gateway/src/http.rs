//! The caller-facing HTTP surface: the agent card, the JSON-RPC binding, the HTTP+JSON binding and
//! their SSE streams.
//!
//! Every request is checked in the same order before anything is parsed: Host allowlist (when
//! bound wide), bearer token (the card is public), `A2A-Version`, then for bodies the
//! Content-Type and the size limit. Nothing here panics on input; every refusal is an error in
//! the binding's own shape.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use futures::Stream;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill, CancelTaskRequest,
    GetTaskRequest, HttpAuthSecurityScheme, ListTaskPushNotificationConfigsRequest,
    ListTasksRequest, PROTOCOL_VERSION, SecurityRequirement, SecurityScheme, SendMessageRequest,
    StreamResponse, StringList, SubscribeToTaskRequest, Task, TaskPushNotificationConfig,
    TaskPushNotificationConfigRef,
};
use crate::auth::{AuthFailure, Authenticator, HostAllowlist};
use crate::config::GatewayConfig;
use crate::error::A2aError;
use crate::tasks::{Core, SendOutcome, SharedEvent, Subscription};

/// The JSON-RPC interface's path (also served with a trailing slash and at `/`).
pub const JSONRPC_PATH: &str = "/a2a/jsonrpc";
/// The HTTP+JSON interface's base path (its routes are also served at the root).
pub const REST_PATH: &str = "/a2a/rest";
/// The agent card's well-known path.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

pub use crate::card::{CardBody, CardResponse};

/// Builds the agent card from the configuration (URLs from `http.public_url`, never the bind
/// address; one skill per configured agent).
pub fn agent_card(cfg: &GatewayConfig) -> AgentCard {
    let base = cfg.http.public_url.trim_end_matches('/');
    let mut schemes = std::collections::BTreeMap::new();
    schemes.insert(
        "bearer".to_string(),
        SecurityScheme {
            http_auth_security_scheme: HttpAuthSecurityScheme {
                scheme: "Bearer".into(),
                description: Some("A token configured on the gateway (warden up writes one to its state directory)".into()),
            },
        },
    );
    let mut req = std::collections::BTreeMap::new();
    req.insert("bearer".to_string(), StringList { list: vec![] });
    let mut card = AgentCard {
        name: cfg.card.name.clone(),
        description: cfg.card.description.clone(),
        supported_interfaces: vec![
            AgentInterface {
                url: format!("{base}{JSONRPC_PATH}"),
                protocol_binding: "JSONRPC".into(),
                protocol_version: PROTOCOL_VERSION.into(),
            },
            AgentInterface {
                url: format!("{base}{REST_PATH}"),
                protocol_binding: "HTTP+JSON".into(),
                protocol_version: PROTOCOL_VERSION.into(),
            },
        ]
        .into_iter()
        .chain(cfg.grpc_url().map(|url| AgentInterface {
            url,
            protocol_binding: crate::a2a_grpc::BINDING.into(),
            protocol_version: PROTOCOL_VERSION.into(),
        }))
        .collect(),
        provider: match (&cfg.card.organization, &cfg.card.organization_url) {
            (Some(o), Some(u)) => Some(AgentProvider {
                organization: o.clone(),
                url: u.clone(),
            }),
            _ => None,
        },
        version: env!("CARGO_PKG_VERSION").to_string(),
        capabilities: AgentCapabilities {
            streaming: true,
            push_notifications: cfg.push.enabled,
            extended_agent_card: true,
        },
        security_schemes: schemes,
        security_requirements: vec![SecurityRequirement { schemes: req }],
        default_input_modes: vec!["text/plain".into(), "application/json".into()],
        default_output_modes: vec!["text/plain".into()],
        skills: cfg
            .agents
            .list
            .iter()
            .map(|a| AgentSkill {
                id: a.name.clone(),
                name: a.name.clone(),
                description: if a.description.is_empty() {
                    format!("the {} coding agent, supervised by warden", a.name)
                } else {
                    a.description.clone()
                },
                tags: if a.tags.is_empty() {
                    vec!["coding-agent".into()]
                } else {
                    a.tags.clone()
                },
                examples: vec![],
            })
            .collect(),
    };
    // The JSON endpoints also serve A2A 0.3 (compat03.rs): one 0.3 interface per JSON binding.
    let v03 = crate::compat03::interfaces_03(&card.supported_interfaces);
    card.supported_interfaces.extend(v03);
    card
}

/// Everything a handler needs.
pub struct HttpState {
    pub core: Arc<Core>,
    pub auth: Authenticator,
    pub hosts: HostAllowlist,
    pub max_body: usize,
    /// How long a handler waits for a request body (`http.body_read_timeout_ms`).
    pub body_timeout: std::time::Duration,
    pub card: CardResponse,
}

/// Which binding a request came in on: it decides the error and SSE shapes.
#[derive(Debug, Clone)]
enum Binding {
    JsonRpc(Value),
    Rest,
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The HTTP+JSON binding's media type for its bodies (spec 1.0.1 §11: `application/a2a+json`
/// SHOULD be used for requests and responses); JSON-RPC and the card stay `application/json`.
pub const A2A_JSON: &str = "application/a2a+json";

/// An HTTP+JSON response body.
pub(crate) fn rest_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(A2A_JSON));
    r
}

fn error_response(binding: &Binding, err: &A2aError) -> Response {
    match binding {
        // JSON-RPC errors travel in a 200 response, except refusals at the HTTP level.
        Binding::JsonRpc(id) => {
            let status = match err {
                A2aError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                A2aError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
                A2aError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::OK,
            };
            json_response(status, &err.jsonrpc_response(id.clone()))
        }
        Binding::Rest => rest_response(err.http_status(), &err.rest_body()),
    }
}

pub(crate) fn unauthorized(failure: AuthFailure) -> Response {
    let (challenge, message) = match failure {
        AuthFailure::Missing => (
            "Bearer realm=\"warden\"",
            "authentication required: send Authorization: Bearer <token>",
        ),
        AuthFailure::Invalid => (
            "Bearer realm=\"warden\", error=\"invalid_token\"",
            "the bearer token is not valid",
        ),
    };
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        &json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": message}}),
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

pub(crate) fn host_refused() -> Response {
    json_response(
        StatusCode::FORBIDDEN,
        &json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "Host header not allowed"}}),
    )
}

pub(crate) fn host_ok(state: &HttpState, headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    state.hosts.allows(host)
}

/// `A2A-Version` from the header or the query string.
pub(crate) fn requested_version(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(v) = headers.get("a2a-version") {
        return Some(v.to_str().unwrap_or("?").trim().to_string());
    }
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("A2A-Version"))
        .map(|(_, v)| v.trim().to_string())
}

fn check_version(headers: &HeaderMap, query: Option<&str>) -> Result<(), A2aError> {
    match requested_version(headers, query) {
        Some(v) if v == PROTOCOL_VERSION => Ok(()),
        None => Err(A2aError::VersionNotSupported(format!(
            "A2A version '0.3' (a request without an A2A-Version header) is not supported; this agent speaks A2A {PROTOCOL_VERSION}: send the header A2A-Version: {PROTOCOL_VERSION}"
        ))),
        Some(v) => Err(A2aError::VersionNotSupported(format!(
            "A2A version '{v}' is not supported; this agent speaks A2A {PROTOCOL_VERSION}: send the header A2A-Version: {PROTOCOL_VERSION}"
        ))),
    }
}

pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), A2aError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if media == "application/json" || media == "application/a2a+json" {
        Ok(())
    } else if media.is_empty() {
        Err(A2aError::ContentTypeNotSupported(
            "missing Content-Type; send application/json".into(),
        ))
    } else {
        Err(A2aError::ContentTypeNotSupported(format!(
            "Content-Type {media:?} is not supported; send application/json"
        )))
    }
}

/// Reads the whole body within `limit` bytes and `within`: a client that trickles its body (or
/// sends a Content-Length and stops) is answered 408 instead of holding its handler open. Only
/// request bodies are timed; a response stream (SSE) is not.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    within: std::time::Duration,
) -> Result<Bytes, A2aError> {
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(A2aError::PayloadTooLarge(limit));
    }
    match tokio::time::timeout(within, axum::body::to_bytes(body, limit)).await {
        Ok(read) => read.map_err(|_| A2aError::PayloadTooLarge(limit)),
        Err(_) => Err(A2aError::RequestTimeout(within.as_millis() as u64)),
    }
}

pub(crate) fn params<T: DeserializeOwned>(value: Value) -> Result<T, A2aError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            A2aError::InvalidParams(format!("invalid params: {inner}"))
        } else {
            A2aError::InvalidParams(format!("invalid params at {path}: {inner}"))
        }
    })
}

/// The events of one stream, ending after the first terminal or interrupted status.
fn events(sub: Subscription) -> impl Stream<Item = Result<StreamItem, Infallible>> {
    use futures::StreamExt;
    // The caller's stream share is held for as long as the stream exists.
    let permit = sub.permit;
    enum St {
        First(Box<Task>, Option<broadcast::Receiver<SharedEvent>>),
        Events(broadcast::Receiver<SharedEvent>),
        Done,
    }
    futures::stream::unfold(St::First(Box::new(sub.task), sub.events), |st| async move {
        match st {
            St::First(task, rx) => {
                let next = match rx {
                    Some(rx) => St::Events(rx),
                    None => St::Done,
                };
                Some((
                    Ok(StreamItem::Event(Arc::new(StreamResponse::Task(*task)))),
                    next,
                ))
            }
            St::Events(mut rx) => match rx.recv().await {
                Ok(ev) => {
                    let end = matches!(&*ev, StreamResponse::StatusUpdate(s)
                        if s.status.state.is_terminal() || s.status.state.is_interrupted());
                    Some((
                        Ok(StreamItem::Event(ev)),
                        if end { St::Done } else { St::Events(rx) },
                    ))
                }
                Err(broadcast::error::RecvError::Lagged(n)) => Some((
                    Ok(StreamItem::Error(A2aError::Internal(format!(
                        "this stream fell {n} events behind and was closed; use SubscribeToTask or GetTask to catch up"
                    )))),
                    St::Done,
                )),
                Err(broadcast::error::RecvError::Closed) => None,
            },
            St::Done => None,
        }
    })
    .map(move |item| {
        let _held = &permit;
        item
    })
}

/// One item of a task's event stream (shared by the SSE and gRPC bindings).
pub enum StreamItem {
    Event(SharedEvent),
    Error(A2aError),
}

/// The snapshot, then the events of a subscription, ending after the first terminal or
/// interrupted status (or with an error item when the subscriber fell behind).
pub fn stream_items(sub: Subscription) -> impl Stream<Item = StreamItem> {
    use futures::StreamExt;
    events(sub).map(|item| match item {
        Ok(i) => i,
        Err(never) => match never {},
    })
}

fn sse(binding: Binding, sub: Subscription) -> Response {
    use futures::StreamExt;
    let keepalive = sub.keepalive;
    let stream = events(sub).map(move |item| {
        let Ok(item) = item;
        let ev = match (&binding, item) {
            (Binding::JsonRpc(id), StreamItem::Event(ev)) => Event::default()
                .data(json!({"jsonrpc": "2.0", "id": id, "result": &*ev}).to_string()),
            (Binding::Rest, StreamItem::Event(ev)) => {
                Event::default().data(serde_json::to_string(&*ev).unwrap_or_default())
            }
            (Binding::JsonRpc(id), StreamItem::Error(e)) => Event::default()
                .event("error")
                .data(e.jsonrpc_response(id.clone()).to_string()),
            (Binding::Rest, StreamItem::Error(e)) => Event::default()
                .event("error")
                .data(e.rest_body().to_string()),
        };
        Ok::<_, Infallible>(ev)
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keepalive))
        .into_response()
}

/// Host, token and version checks shared by every A2A route.
fn admit(
    state: &HttpState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<String, Box<Response>> {
    let principal = admit_caller(state, headers)?;
    check_version(headers, query).map_err(|e| Box::new(error_response(&Binding::Rest, &e)))?;
    Ok(principal)
}

/// The Host and the bearer token, the first two checks of every route (each binding then checks
/// the version its way); the caller's principal.
pub(crate) fn admit_caller(
    state: &HttpState,
    headers: &HeaderMap,
) -> Result<String, Box<Response>> {
    if !host_ok(state, headers) {
        return Err(Box::new(host_refused()));
    }
    state
        .auth
        .authenticate(headers)
        .map_err(|f| Box::new(unauthorized(f)))
}

async fn card(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !host_ok(&state, &headers) {
        return host_refused();
    }
    // A fetch that asks for 1.0 gets the card exactly as 1.0 defines it; one that names no
    // version (every 0.3 client) gets the 0.3 fields beside the 1.0 ones.
    let with_03 = requested_version(&headers, None).as_deref() != Some(PROTOCOL_VERSION);
    let c = state.card.current(&state.core, with_03);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == c.etag || t.trim() == "*"));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = (StatusCode::OK, c.body.clone()).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("public, max-age={}", c.max_age)) {
        h.insert(header::CACHE_CONTROL, v);
    }
    if let Ok(v) = HeaderValue::from_str(&c.etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::VARY, HeaderValue::from_static("A2A-Version"));
    if let Ok(v) = HeaderValue::from_str(&c.last_modified) {
        h.insert(header::LAST_MODIFIED, v);
    }
    r
}

// ----------------------------------------------------------------------------- JSON-RPC

async fn jsonrpc(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = &parts.headers;
    let null = Binding::JsonRpc(Value::Null);
    if !host_ok(&state, headers) {
        return host_refused();
    }
    let principal = match state.auth.authenticate(headers) {
        Ok(p) => p,
        Err(f) => return unauthorized(f),
    };
    if let Err(e) = check_content_type(headers) {
        return error_response(&null, &e);
    }
    let bytes = match read_body(body, headers, state.max_body, state.body_timeout).await {
        Ok(b) => b,
        Err(e) => return error_response(&null, &e),
    };
    let value: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                &null,
                &A2aError::ParseError(format!("request body is not JSON: {e}")),
            );
        }
    };
    let Value::Object(mut obj) = value else {
        return error_response(
            &null,
            &A2aError::InvalidRequest(
                "a JSON-RPC request must be an object (batches are not supported)".into(),
            ),
        );
    };
    let id = obj.remove("id").unwrap_or(Value::Null);
    let binding = match &id {
        Value::String(_) | Value::Number(_) => Binding::JsonRpc(id.clone()),
        _ => {
            return error_response(
                &null,
                &A2aError::InvalidRequest(
                    "a JSON-RPC request needs an id (string or number)".into(),
                ),
            );
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error_response(
            &binding,
            &A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into()),
        );
    }
    let Some(method) = obj
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return error_response(
            &binding,
            &A2aError::InvalidRequest("method must be a string".into()),
        );
    };
    // A request without A2A-Version (or with 0.3) that calls a 0.3 method is served as 0.3;
    // a 1.0 method name without the header is told to send it.
    let v03 = crate::compat03::speaks_03(requested_version(headers, query.as_deref()).as_deref())
        && crate::compat03::is_03_method(&method);
    if !v03 && let Err(e) = check_version(headers, query.as_deref()) {
        return error_response(&binding, &e);
    }
    let params_value = match obj.remove("params") {
        Some(p @ Value::Object(_)) => p,
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(_) => {
            return error_response(
                &binding,
                &A2aError::InvalidParams("params must be an object".into()),
            );
        }
    };
    if v03 {
        return crate::compat03::jsonrpc(&state, &principal, &method, params_value, id).await;
    }
    match dispatch_jsonrpc(&state, &principal, &method, params_value, &binding).await {
        Ok(r) => r,
        Err(e) => error_response(&binding, &e),
    }
}

fn result(binding: &Binding, value: impl serde::Serialize) -> Response {
    let id = match binding {
        Binding::JsonRpc(id) => id.clone(),
        Binding::Rest => Value::Null,
    };
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": value}),
    )
}

async fn dispatch_jsonrpc(
    state: &Arc<HttpState>,
    principal: &str,
    method: &str,
    p: Value,
    binding: &Binding,
) -> Result<Response, A2aError> {
    let core = &state.core;
    match method {
        "SendMessage" | "SendStreamingMessage" => {
            let streaming = method == "SendStreamingMessage";
            let req: SendMessageRequest = params(p)?;
            Ok(match core.send(principal, req, streaming).await? {
                SendOutcome::Stream(sub) => sse(binding.clone(), *sub),
                SendOutcome::Task(task) => result(binding, StreamResponse::Task(*task)),
                SendOutcome::Message(m) => result(binding, StreamResponse::Message(*m)),
            })
        }
        "GetTask" => {
            let req: GetTaskRequest = params(p)?;
            Ok(result(
                binding,
                core.get(principal, &req.id, req.history_length)?,
            ))
        }
        "ListTasks" => {
            let req: ListTasksRequest = params(p)?;
            Ok(result(binding, core.list(principal, &req)?))
        }
        "CancelTask" => {
            let req: CancelTaskRequest = params(p)?;
            Ok(result(binding, core.cancel(principal, &req.id).await?))
        }
        "SubscribeToTask" => {
            let req: SubscribeToTaskRequest = params(p)?;
            Ok(sse(binding.clone(), core.subscribe(principal, &req.id)?))
        }
        "CreateTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfig = params(p)?;
            Ok(result(
                binding,
                core.create_push_config(principal, req).await?,
            ))
        }
        "GetTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfigRef = params(p)?;
            Ok(result(
                binding,
                core.get_push_config(principal, &req.task_id, &req.id)?,
            ))
        }
        "ListTaskPushNotificationConfigs" => {
            let req: ListTaskPushNotificationConfigsRequest = params(p)?;
            Ok(result(
                binding,
                core.list_push_configs(principal, &req.task_id)?,
            ))
        }
        "DeleteTaskPushNotificationConfig" => {
            let req: TaskPushNotificationConfigRef = params(p)?;
            core.delete_push_config(principal, &req.task_id, &req.id)?;
            Ok(result(binding, json!({})))
        }
        "GetExtendedAgentCard" => Ok(result(binding, state.card.extended(core, principal))),
        m if m.contains('/') => Err(A2aError::MethodNotFound(format!(
            "method {m:?} is an A2A 0.3 method; this agent speaks A2A 1.0 (e.g. SendMessage)"
        ))),
        m => Err(A2aError::MethodNotFound(format!("method {m:?} not found"))),
    }
}

// ----------------------------------------------------------------------------- HTTP+JSON

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
        check_content_type(&parts.headers)?;
        let bytes = read_body(body, &parts.headers, state.max_body, state.body_timeout).await?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| A2aError::ParseError(format!("request body is not JSON: {e}")))?;
        if !value.is_object() {
            return Err(A2aError::InvalidRequest(
                "the body must be a JSON object".into(),
            ));
        }
        let req: SendMessageRequest = params(value)?;
        Ok(match state.core.send(&principal, req, streaming).await? {
            SendOutcome::Stream(sub) => sse(Binding::Rest, *sub),
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
        Err(e) => error_response(&Binding::Rest, &e),
    }
}

pub(crate) fn query_map(query: Option<&str>) -> Result<serde_json::Map<String, Value>, A2aError> {
    let mut map = serde_json::Map::new();
    let Some(q) = query else {
        return Ok(map);
    };
    let pairs = query_pairs(q)?;
    for (k, v) in pairs {
        if k.eq_ignore_ascii_case("A2A-Version") || k.eq_ignore_ascii_case("A2A-Extensions") {
            continue;
        }
        // Query parameters may use the proto field name (`history_length`) as well as the
        // ProtoJSON one (`historyLength`); both mean the same field.
        let k = camel_case(&k);
        let value = match k.as_str() {
            "pageSize" | "historyLength" => Value::Number(
                v.parse::<i64>()
                    .map_err(|_| {
                        A2aError::InvalidParams(format!("{k} must be an integer, not {v:?}"))
                    })?
                    .into(),
            ),
            "includeArtifacts" => match v.as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => {
                    return Err(A2aError::InvalidParams(format!(
                        "{k} must be true or false"
                    )));
                }
            },
            _ => Value::String(v),
        };
        map.insert(k, value);
    }
    Ok(map)
}

/// `history_length` → `historyLength`; names without `_` are returned as they are.
fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The query's name/value pairs, decoded as `application/x-www-form-urlencoded` (`+` is a space)
/// by `form_urlencoded`.
///
/// That decoder follows the WHATWG URL standard, which never fails: a `%` not followed by two hex
/// digits is kept as it is, and bytes that are not UTF-8 become U+FFFD. Either would make the
/// gateway look up an id or filter the caller did not write (and answer "not found" or an empty
/// list, hiding the caller's bug), so both are refused first as InvalidParams, naming the piece.
fn query_pairs(q: &str) -> Result<Vec<(String, String)>, A2aError> {
    for piece in q.split('&') {
        let bytes = piece.as_bytes();
        let escapes_ok = bytes.iter().enumerate().all(|(i, b)| {
            *b != b'%'
                || bytes
                    .get(i + 1..i + 3)
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        });
        if !escapes_ok {
            return Err(A2aError::InvalidParams(format!(
                "bad percent-encoding in {piece:?}"
            )));
        }
        // `+` and the `=`/`&` separators are ASCII, so whether the escapes decode to UTF-8 does not
        // depend on how the piece is split or whether `+` has become a space yet.
        if percent_encoding::percent_decode_str(piece)
            .decode_utf8()
            .is_err()
        {
            return Err(A2aError::InvalidParams(format!(
                "query is not UTF-8 once decoded: {piece:?}"
            )));
        }
    }
    Ok(form_urlencoded::parse(q.as_bytes()).into_owned().collect())
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
    run().unwrap_or_else(|e| error_response(&Binding::Rest, &e))
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
            return Ok(sse(
                Binding::Rest,
                state.core.subscribe(&principal, task_id)?,
            ));
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
    run().unwrap_or_else(|e| error_response(&Binding::Rest, &e))
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
            return Ok(sse(
                Binding::Rest,
                state.core.subscribe(&principal, task_id)?,
            ));
        }
        Err(A2aError::MethodNotFound(format!(
            "no such operation: POST /tasks/{id}"
        )))
    };
    match run.await {
        Ok(r) => r,
        Err(e) => error_response(&Binding::Rest, &e),
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
                check_content_type(&parts.headers)?;
                let bytes =
                    read_body(body, &parts.headers, state.max_body, state.body_timeout).await?;
                let value: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| A2aError::ParseError(format!("request body is not JSON: {e}")))?;
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
        Err(e) => error_response(&Binding::Rest, &e),
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
    run().unwrap_or_else(|e| error_response(&Binding::Rest, &e))
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

async fn not_found(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    if !host_ok(&state, &headers) {
        return host_refused();
    }
    error_response(
        &Binding::Rest,
        &A2aError::MethodNotFound(format!(
            "no route for {} {}",
            req.method(),
            req.uri().path()
        )),
    )
}

fn rest_routes() -> Router<Arc<HttpState>> {
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
        // A2A 0.3's REST paths (`/v1/…`), served by compat03.rs.
        .merge(crate::compat03::rest_routes())
}

/// The whole HTTP router.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route(CARD_PATH, get(card))
        .route(JSONRPC_PATH, post(jsonrpc))
        .route(&format!("{JSONRPC_PATH}/"), post(jsonrpc))
        .route("/", post(jsonrpc))
        .nest(REST_PATH, rest_routes())
        .merge(rest_routes())
        .fallback(not_found)
        .with_state(state)
}
