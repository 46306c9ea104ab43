//! The caller-facing HTTP surface, wired: the agent card, the JSON-RPC endpoint (1.0 and 0.3 on
//! the same path, chosen per call), the 1.0 HTTP+JSON routes and the 0.3 `/v1` routes, and the
//! fallback.
//!
//! This is the top floor of the HTTP side: it may import every binding; no binding imports it.
//! Every request passes `admission.rs`'s checks, in the same order, before anything is parsed;
//! nothing here panics on input; every refusal is an error in the binding's own shape.

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::a2a::PROTOCOL_VERSION;
use crate::admission::{
    HttpState, RpcCall, check_version, host_ok, host_refused, requested_version, rpc_error,
};
use crate::endpoints::{CARD_PATH, JSONRPC_PATH, REST_PATH};
use crate::translate03::{is_03_method, speaks_03};

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

/// The JSON-RPC endpoint: the envelope, then the version — a request without `A2A-Version` (or
/// with 0.3) that calls a 0.3 method is served as 0.3; a 1.0 method name without the header is
/// told to send it — then the params, then the call.
async fn jsonrpc(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let version = requested_version(req.headers(), query.as_deref());
    let mut call = match RpcCall::read(&state, req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let v03 = speaks_03(version.as_deref()) && is_03_method(&call.method);
    if !v03 && let Err(e) = check_version(version.as_deref()) {
        return rpc_error(&call.id, &e);
    }
    let params = match call.params() {
        Ok(p) => p,
        Err(e) => return rpc_error(&call.id, &e),
    };
    if v03 {
        crate::compat03::jsonrpc(&state, &call.caller, &call.method, params, call.id).await
    } else {
        crate::jsonrpc::serve(&state, &call.caller, &call.method, params, &call.id).await
    }
}

/// The 1.0 HTTP+JSON routes with the 0.3 `/v1` ones beside them.
fn rest_routes() -> Router<Arc<HttpState>> {
    crate::rest::routes().merge(crate::compat03::rest_routes())
}

/// Times each HTTP request to its response head for `warden_gateway_http_request_duration_seconds`
/// (the layer over every front, MCP included).
pub async fn observe(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = req.uri().path();
    let front = if path == CARD_PATH {
        "card"
    } else if path.starts_with("/mcp") {
        "mcp"
    } else if path == JSONRPC_PATH || path == format!("{JSONRPC_PATH}/") || path == "/" {
        "jsonrpc"
    } else {
        "rest"
    };
    let t0 = std::time::Instant::now();
    let resp = next.run(req).await;
    crate::metrics::http_request(front, resp.status().as_u16(), t0.elapsed());
    resp
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
        .fallback(crate::rest::not_found)
        .with_state(state)
}
