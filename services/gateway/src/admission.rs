//! What every HTTP binding does on the way in and out, in one place under them: the checks each
//! request passes before anything is parsed — Host allowlist (when bound wide), bearer token
//! (the card is public), `A2A-Version`, then for bodies the Content-Type, the size limit and the
//! read timeout — and the JSON-RPC envelope, query and parameter decoding, the response shapes
//! and SSE framing the bindings share.
//!
//! Owns: admission and the shared wire helpers. Must never: serve an operation (the bindings do,
//! over the core), panic on input, or answer a refusal in any shape but the binding's own.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::a2a::PROTOCOL_VERSION;
use crate::auth::{AuthFailure, Authenticator, HostAllowlist, Identity};
use crate::card::CardResponse;
use crate::core::{Core, Subscription};
use crate::endpoints::A2A_JSON;
use crate::error::A2aError;
use crate::events::{StreamItem, stream_items};

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

pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An HTTP+JSON response body.
pub fn rest_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(A2A_JSON));
    r
}

/// A JSON-RPC error response: errors travel in a 200 response, except refusals at the HTTP
/// level (a body too large or too slow, a caller over its share).
pub fn rpc_error(id: &Value, err: &A2aError) -> Response {
    let status = match err {
        A2aError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        A2aError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        A2aError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::OK,
    };
    json_response(status, &err.jsonrpc_response(id.clone()))
}

/// An HTTP+JSON error response: the status of spec 1.0.1 §5.4 and the error body.
pub fn rest_error(err: &A2aError) -> Response {
    rest_response(err.http_status(), &err.rest_body())
}

pub fn unauthorized(failure: AuthFailure) -> Response {
    let message = failure.message();
    let challenge = match failure {
        AuthFailure::Missing => "Bearer realm=\"warden\"",
        _ => "Bearer realm=\"warden\", error=\"invalid_token\"",
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

pub fn host_refused() -> Response {
    json_response(
        StatusCode::FORBIDDEN,
        &json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "Host header not allowed"}}),
    )
}

pub fn host_ok(state: &HttpState, headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    state.hosts.allows(host)
}

/// `A2A-Version` from the header or the query string.
pub fn requested_version(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(v) = headers.get("a2a-version") {
        return Some(v.to_str().unwrap_or("?").trim().to_string());
    }
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("A2A-Version"))
        .map(|(_, v)| v.trim().to_string())
}

/// `A2A-Version` must be this agent's: a request naming none is a 0.3 request, and 0.3 is
/// served only on its own methods and paths.
pub fn check_version(version: Option<&str>) -> Result<(), A2aError> {
    match version {
        Some(v) if v == PROTOCOL_VERSION => Ok(()),
        None => Err(A2aError::VersionNotSupported(format!(
            "A2A version '0.3' (a request without an A2A-Version header) is not supported; this agent speaks A2A {PROTOCOL_VERSION}: send the header A2A-Version: {PROTOCOL_VERSION}"
        ))),
        Some(v) => Err(A2aError::VersionNotSupported(format!(
            "A2A version '{v}' is not supported; this agent speaks A2A {PROTOCOL_VERSION}: send the header A2A-Version: {PROTOCOL_VERSION}"
        ))),
    }
}

pub fn check_content_type(headers: &HeaderMap) -> Result<(), A2aError> {
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
pub async fn read_body(
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

/// A request body that must be one JSON object: Content-Type, size, time, then JSON.
pub async fn json_body(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, A2aError> {
    let v = json_value(state, headers, body).await?;
    if !v.is_object() {
        return Err(A2aError::InvalidRequest(
            "the body must be a JSON object".into(),
        ));
    }
    Ok(v)
}

pub fn params<T: DeserializeOwned>(value: Value) -> Result<T, A2aError> {
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

pub fn query_map(query: Option<&str>) -> Result<serde_json::Map<String, Value>, A2aError> {
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

/// Host, token and version checks shared by every 1.0 HTTP+JSON route.
pub async fn admit(
    state: &HttpState,
    parts: &Parts,
    query: Option<&str>,
) -> Result<Identity, Box<Response>> {
    let headers = &parts.headers;
    let caller = admit_caller(state, parts).await?;
    check_version(requested_version(headers, query).as_deref())
        .map_err(|e| Box::new(rest_error(&e)))?;
    Ok(caller)
}

/// The Host and the bearer token, the first two checks of every route (each binding then checks
/// the version its way); the caller's identity, which travels with the request into the core.
pub async fn admit_caller(state: &HttpState, parts: &Parts) -> Result<Identity, Box<Response>> {
    if !host_ok(state, &parts.headers) {
        return Err(Box::new(host_refused()));
    }
    state
        .auth
        .authenticate_request(&parts.headers, &parts.extensions)
        .await
        .map_err(|f| Box::new(unauthorized(f)))
}

/// A caller admitted on a 1.0 HTTP+JSON route (Host, token, then `A2A-Version`), as an axum
/// extractor: a handler taking one runs only for an admitted caller, and holds its identity.
pub struct Caller(pub Identity);

impl FromRequestParts<Arc<HttpState>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<HttpState>,
    ) -> Result<Self, Response> {
        admit(state, parts, parts.uri.query())
            .await
            .map(Caller)
            .map_err(|r| *r)
    }
}

/// An A2A error answered in the HTTP+JSON shape, so a 1.0 REST handler can use `?`.
pub struct RestError(pub A2aError);

impl From<A2aError> for RestError {
    fn from(e: A2aError) -> Self {
        Self(e)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        rest_error(&self.0)
    }
}

/// A 200 HTTP+JSON answer carrying `body`.
pub fn rest_ok(body: &impl serde::Serialize) -> Response {
    rest_response(
        StatusCode::OK,
        &serde_json::to_value(body).unwrap_or(Value::Null),
    )
}

/// A task's events as an SSE response, each item framed by `frame` (the binding's shape), with
/// comment keep-alives while the task is quiet.
pub fn sse(sub: Subscription, frame: impl FnMut(StreamItem) -> Event + Send + 'static) -> Response {
    let keepalive = sub.keepalive;
    let stream = stream_items(sub).map(frame).map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keepalive))
        .into_response()
}

/// One JSON-RPC call, admitted and taken out of its envelope (both A2A versions use this one).
pub struct RpcCall {
    pub caller: Identity,
    pub id: Value,
    pub method: String,
    params: Option<Value>,
}

impl RpcCall {
    /// Host, token, Content-Type, body, then the envelope: an object with `jsonrpc: "2.0"`, a
    /// string or number `id` and a string `method`. The version is checked by the caller (it
    /// depends on the method), then [`RpcCall::params`].
    pub async fn read(state: &HttpState, req: Request) -> Result<Self, Response> {
        let (parts, body) = req.into_parts();
        let headers = &parts.headers;
        if !host_ok(state, headers) {
            return Err(host_refused());
        }
        let caller = state
            .auth
            .authenticate_request(headers, &parts.extensions)
            .await
            .map_err(unauthorized)?;
        let null = Value::Null;
        let value = json_value(state, headers, body)
            .await
            .map_err(|e| rpc_error(&null, &e))?;
        let Value::Object(mut obj) = value else {
            return Err(rpc_error(
                &null,
                &A2aError::InvalidRequest(
                    "a JSON-RPC request must be an object (batches are not supported)".into(),
                ),
            ));
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        if !matches!(id, Value::String(_) | Value::Number(_)) {
            return Err(rpc_error(
                &null,
                &A2aError::InvalidRequest(
                    "a JSON-RPC request needs an id (string or number)".into(),
                ),
            ));
        }
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(rpc_error(
                &id,
                &A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into()),
            ));
        }
        let Some(method) = obj
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(rpc_error(
                &id,
                &A2aError::InvalidRequest("method must be a string".into()),
            ));
        };
        Ok(Self {
            caller,
            id,
            method,
            params: obj.remove("params"),
        })
    }

    /// The params object (absent or null: an empty one).
    pub fn params(&mut self) -> Result<Value, A2aError> {
        match self.params.take() {
            Some(p @ Value::Object(_)) => Ok(p),
            None | Some(Value::Null) => Ok(Value::Object(Default::default())),
            Some(_) => Err(A2aError::InvalidParams("params must be an object".into())),
        }
    }
}

/// A body that must be JSON, of any kind (the caller checks its shape).
pub async fn json_value(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, A2aError> {
    check_content_type(headers)?;
    let bytes = read_body(body, headers, state.max_body, state.body_timeout).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| A2aError::ParseError(format!("request body is not JSON: {e}")))
}
