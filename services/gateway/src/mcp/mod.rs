//! The MCP front: `/mcp` on the gateway's HTTP listener (streamable HTTP, both protocol eras on
//! one endpoint: 2025-11-25 with sessions, `Mcp-Session-Id` and DELETE; 2026-07-28 stateless),
//! served by the official Rust SDK (`rmcp`) behind warden's own edge: Host and Origin
//! allowlists (DNS rebinding), the same bearer tokens and principals as A2A (401 with
//! `WWW-Authenticate` naming the RFC 9728 protected-resource metadata), a session bound to the
//! principal that opened it, the body limit and body timeout of the A2A routes, and the
//! inherited recursion depth (`Warden-Depth`).
//!
//! Owns: the MCP verbs as a second mapping onto the same supervisor conversations and turns the
//! A2A front uses (it holds no agent, no process, no permission of its own).
//! Must never: spawn a process, decide a permission, send a permission request to the MCP
//! caller (only an agent's *question* becomes an elicitation), take a workspace path from a
//! model, or let one principal reach another's session, job or conversation.

pub mod envelope;
pub mod server;
pub mod sessions;
pub mod tools;
pub mod turn;
pub mod workspace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthFailure, Authenticator, HostAllowlist};
use crate::config::GatewayConfig;
pub use server::{Caller, Handler, McpFront};

/// The MCP endpoint.
pub const MCP_PATH: &str = "/mcp";
/// RFC 9728 metadata for the MCP resource (also served at the root well-known path).
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource/mcp";
/// The header `warden mcp` sets from the inherited `WARDEN_DEPTH`.
pub use warden_daemon::depth::DEPTH_HEADER;

/// The DNS-rebinding checks: which `Host` and `Origin` values `/mcp` serves.
pub struct Gate {
    hosts: HostAllowlist,
    loopback: bool,
    public_host: Option<String>,
    origins: Vec<String>,
}

/// What the edge checks before rmcp sees a request.
pub struct Edge {
    pub front: Arc<McpFront>,
    pub auth: Authenticator,
    gate: Gate,
    resource: String,
    metadata_url: String,
    /// The `[[auth.oidc]]` issuers, the authorization servers RFC 9728 metadata names.
    issuers: Vec<String>,
    max_body: usize,
    body_timeout: Duration,
}

fn strip_port(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match h.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') => {
            host
        }
        _ => h,
    }
}

fn is_loopback_name(h: &str) -> bool {
    matches!(h, "localhost" | "127.0.0.1" | "::1")
}

impl Gate {
    pub fn from_config(cfg: &GatewayConfig) -> Self {
        let base = cfg.http.public_url.trim_end_matches('/').to_string();
        let public_host = base
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .map(|h| strip_port(&h.to_ascii_lowercase()).to_string());
        let mut origins: Vec<String> = cfg
            .mcp
            .allowed_origins
            .iter()
            .map(|o| o.to_ascii_lowercase())
            .collect();
        if let Some((scheme, rest)) = base.split_once("://") {
            origins.push(format!(
                "{}://{}",
                scheme.to_ascii_lowercase(),
                rest.split('/').next().unwrap_or(rest).to_ascii_lowercase()
            ));
        }
        Self {
            hosts: HostAllowlist::from_config(cfg),
            loopback: cfg.is_loopback(),
            public_host,
            origins,
        }
    }

    /// On a loopback bind only loopback names (and the public URL's host) are served, whatever
    /// the port; bound wide, the gateway's Host allowlist decides.
    pub fn host_ok(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let bare = strip_port(&host.trim().to_ascii_lowercase()).to_string();
        if self.public_host.as_deref() == Some(bare.as_str()) {
            return true;
        }
        if self.loopback {
            return is_loopback_name(&bare);
        }
        self.hosts.allows(Some(host))
    }

    /// A request without `Origin` is not from a browser page and passes; one with it must name
    /// the public URL's origin, a configured one, or (on a loopback bind) a loopback origin.
    pub fn origin_ok(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        let origin = origin.trim().to_ascii_lowercase();
        if self.origins.contains(&origin) {
            return true;
        }
        if self.loopback
            && let Some((scheme, rest)) = origin.split_once("://")
            && matches!(scheme, "http" | "https")
            && !rest.contains('/')
            && !rest.contains('@')
        {
            return is_loopback_name(strip_port(rest));
        }
        false
    }
}

impl Edge {
    /// `auth` is the daemon's one authenticator (shared, so a reload changes it here too).
    pub fn new(
        front: Arc<McpFront>,
        cfg: &GatewayConfig,
        auth: Authenticator,
    ) -> Result<Self, crate::auth::AuthConfigError> {
        let base = cfg.http.public_url.trim_end_matches('/').to_string();
        Ok(Self {
            front,
            auth,
            gate: Gate::from_config(cfg),
            resource: format!("{base}{MCP_PATH}"),
            metadata_url: format!("{base}{RESOURCE_METADATA_PATH}"),
            issuers: cfg.auth.oidc.iter().map(|o| o.issuer.clone()).collect(),
            max_body: cfg.http.max_body_bytes,
            body_timeout: Duration::from_millis(cfg.http.body_read_timeout_ms),
        })
    }
}

fn jsonrpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    let mut r = (
        status,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}})
            .to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn unauthorized(edge: &Edge, failure: AuthFailure) -> Response {
    let message = failure.message();
    let challenge = match failure {
        AuthFailure::Missing => format!(
            "Bearer realm=\"warden\", resource_metadata=\"{}\"",
            edge.metadata_url
        ),
        _ => format!(
            "Bearer realm=\"warden\", error=\"invalid_token\", resource_metadata=\"{}\"",
            edge.metadata_url
        ),
    };
    let mut r = jsonrpc_error(StatusCode::UNAUTHORIZED, -32001, message);
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// 1 when the connection's socket belongs to a uid the supervisor runs agents as (or to the
/// supervisor, whose egress proxy connects for agents), else 0: the depth a caller has whatever
/// `Warden-Depth` it sends or leaves out (`peer.rs`).
async fn inside_agent(edge: &Edge, conn: Option<Arc<crate::peer::ConnPeer>>) -> u32 {
    let Some(conn) = conn else {
        return 0;
    };
    let Some(uid) = conn.owner_uid().await else {
        return 0;
    };
    let core = &edge.front.core;
    if core.agents().supervisor_uid.is_none() {
        // The supervisor has not said yet which uids are its agents': ask before judging.
        let _ = core.refresh_agents().await;
    }
    let inside = core
        .agents()
        .is_agent_uid(uid, warden_daemon::peer::own_uid());
    if inside {
        tracing::info!(uid, peer = %conn.peer, "MCP caller connects as an agent uid: depth 1 at least");
    }
    u32::from(inside)
}

/// The inherited depth from `Warden-Depth`: absent = 0; anything but a plain number counts as
/// infinitely deep (the same rule as the sandbox's `DepthGuard`: a mangled marker only refuses).
pub fn depth_of(headers: &HeaderMap) -> u32 {
    match headers.get(DEPTH_HEADER) {
        None => 0,
        Some(v) => {
            warden_daemon::depth::inherited(Some(std::ffi::OsStr::new(v.to_str().unwrap_or("x"))))
        }
    }
}

/// One of `principal`'s stream share, or the 429 JSON-RPC error that refuses the request.
fn stream_permit(
    edge: &Edge,
    principal: &str,
) -> Result<crate::shares::StreamPermit, Box<Response>> {
    edge.front.core.streams().open(principal).map_err(|e| {
        let mut r = jsonrpc_error(
            StatusCode::TOO_MANY_REQUESTS,
            crate::error::RESOURCE_EXHAUSTED_CODE,
            &e.to_string(),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        Box::new(r)
    })
}

/// Whether a POST body holds a JSON-RPC request (a `method` with an `id`), alone or in a batch;
/// a body that is not JSON counts as one (rmcp refuses it, and the share is given back at once).
fn carries_request(body: &[u8]) -> bool {
    fn is_request(v: &serde_json::Value) -> bool {
        v.get("method").is_some() && v.get("id").is_some_and(|id| !id.is_null())
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(items)) => items.iter().any(is_request),
        Ok(v @ serde_json::Value::Object(_)) => is_request(&v),
        _ => true,
    }
}

/// The id of the `initialize` request a POST body carries (alone or in a batch), if it does:
/// rmcp opens a session for every `initialize` that names no session.
fn initialize_id(body: &[u8]) -> Option<serde_json::Value> {
    fn init(v: &serde_json::Value) -> Option<serde_json::Value> {
        (v.get("method").and_then(serde_json::Value::as_str) == Some("initialize"))
            .then(|| v.get("id").cloned().unwrap_or(serde_json::Value::Null))
    }
    match serde_json::from_slice::<serde_json::Value>(body).ok()? {
        serde_json::Value::Array(items) => items.iter().find_map(init),
        v => init(&v),
    }
}

/// The refusal of an `initialize` past a session share: 429 with a JSON-RPC error answering it.
fn session_refused(id: serde_json::Value, why: &sessions::Refused) -> Response {
    let mut r = (
        StatusCode::TOO_MANY_REQUESTS,
        json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": crate::error::RESOURCE_EXHAUSTED_CODE, "message": why.to_string()}})
        .to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Host, Origin, bearer token, session owner, body limit and timeout, then rmcp.
async fn guard(State(edge): State<Arc<Edge>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    if !edge.gate.host_ok(headers) {
        return jsonrpc_error(
            StatusCode::FORBIDDEN,
            -32600,
            "Forbidden: Host header is not allowed",
        );
    }
    if !edge.gate.origin_ok(headers) {
        return jsonrpc_error(
            StatusCode::FORBIDDEN,
            -32600,
            "Forbidden: Origin header is not allowed",
        );
    }
    let identity = match edge
        .auth
        .authenticate_request(headers, req.extensions())
        .await
    {
        Ok(id) => id,
        Err(f) => return unauthorized(&edge, f),
    };
    let principal = identity.principal.clone();
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(sid) = &session
        && edge
            .front
            .session_owner(sid)
            .is_some_and(|owner| owner != principal)
    {
        // Another principal's session does not exist for this caller.
        return jsonrpc_error(StatusCode::NOT_FOUND, -32600, "Session not found");
    }
    // A GET (the session's SSE stream) and a POST carrying a request (whose answer may be an SSE
    // stream) hold one of the caller's stream share until the response is written out; a caller
    // at its limit is refused before rmcp sees the request. A POST of only notifications or
    // responses (an answer to an elicitation) takes none: it must get through to end a wait.
    let mut permit = None;
    // The session is busy (never idle) until this request's response is written out.
    let activity = session
        .as_deref()
        .and_then(|sid| edge.front.sessions.activity(sid));
    let mut reservation = None;
    if req.method() == Method::GET {
        match stream_permit(&edge, &principal) {
            Ok(p) => permit = Some(p),
            Err(r) => return *r,
        }
    }
    let conn = req
        .extensions()
        .get::<Arc<crate::peer::ConnPeer>>()
        .cloned();
    let depth = depth_of(headers).max(inside_agent(&edge, conn).await);
    let method = req.method().clone();
    let (mut parts, body) = req.into_parts();
    let body = if method == Method::POST {
        if let Some(len) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > edge.max_body as u64
        {
            return jsonrpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                -32600,
                &format!("request body over {} bytes", edge.max_body),
            );
        }
        match tokio::time::timeout(edge.body_timeout, axum::body::to_bytes(body, edge.max_body))
            .await
        {
            Ok(Ok(b)) => {
                if session.is_none()
                    && let Some(id) = initialize_id(&b)
                {
                    match edge.front.sessions.reserve(&principal) {
                        Ok(r) => reservation = Some(r),
                        Err(why) => {
                            tracing::info!(principal = %principal, reason = %why, "MCP initialize refused");
                            return session_refused(id, &why);
                        }
                    }
                }
                if carries_request(&b) {
                    match stream_permit(&edge, &principal) {
                        Ok(p) => permit = Some(p),
                        Err(r) => return *r,
                    }
                }
                Body::from(b)
            }
            Ok(Err(_)) => {
                return jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    -32600,
                    &format!("request body over {} bytes", edge.max_body),
                );
            }
            Err(_) => {
                return jsonrpc_error(
                    StatusCode::REQUEST_TIMEOUT,
                    -32600,
                    "the request body did not arrive in time",
                );
            }
        }
    } else {
        body
    };
    parts.extensions.insert(Caller {
        identity: identity.clone(),
        depth,
    });
    let mut resp = next.run(Request::from_parts(parts, body)).await;
    if session.is_none()
        && let Some(sid) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        match reservation.take() {
            Some(r) => r.bind(sid),
            None => edge.front.sessions.adopt(sid, &principal),
        }
    }
    if method == Method::DELETE
        && resp.status().is_success()
        && let Some(sid) = &session
    {
        edge.front.session_closed(sid);
        // The spec's DELETE answer is 200 or 204; rmcp says 202, which clients warn about.
        if resp.status() == StatusCode::ACCEPTED {
            *resp.status_mut() = StatusCode::NO_CONTENT;
        }
    }
    let resp = match activity {
        Some(a) => resp.map(|b| crate::shares::HeldBody::wrap(b, a)),
        None => resp,
    };
    match permit {
        Some(p) => resp.map(|b| crate::shares::HeldBody::wrap(b, p)),
        None => resp,
    }
}

/// Ends idle sessions (as DELETE does), forgets the ones rmcp ended by itself, and once they are
/// gone hands their memory back: the maps shrink and the allocator returns its free pages.
fn spawn_reaper(
    front: Arc<McpFront>,
    manager: Arc<LocalSessionManager>,
    shutdown: CancellationToken,
) {
    let table = front.sessions.clone();
    let every = (table.idle() / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut trim = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if trim {
                // The sessions ended a tick ago: their workers have stopped and freed since.
                trim = false;
                {
                    let mut live = manager.sessions.write().await;
                    if live.capacity() > 2 * live.len() + 64 {
                        live.shrink_to_fit();
                    }
                }
                table.shrink();
                let before = warden_daemon::memory::resident_bytes().unwrap_or(0);
                let _ =
                    tokio::task::spawn_blocking(warden_daemon::memory::return_free_memory).await;
                tracing::info!(
                    open = table.open(),
                    rss_before = before,
                    rss_after = warden_daemon::memory::resident_bytes().unwrap_or(0),
                    "MCP sessions ended; memory handed back"
                );
            }
            let idle = table.idle_sessions(Instant::now());
            if !idle.is_empty() {
                tracing::info!(
                    sessions = idle.len(),
                    idle_seconds = table.idle().as_secs(),
                    "ending idle MCP sessions"
                );
            }
            for sid in idle {
                let id: rmcp::transport::streamable_http_server::session::SessionId =
                    sid.as_str().into();
                // A worker that does not take the close at once is not waited for: the session is
                // out of rmcp's map already, and its worker ends when its channel closes.
                match tokio::time::timeout(Duration::from_secs(5), manager.close_session(&id)).await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(session = %sid, error = %e, "idle MCP session was already ending")
                    }
                    Err(_) => {
                        tracing::warn!(session = %sid, "idle MCP session's worker did not take the close within 5 s")
                    }
                }
                front.session_closed(&sid);
            }
            // A session whose rmcp worker stopped by itself (its transport failed, shutdown).
            let gone: Vec<String> = {
                let live = manager.sessions.read().await;
                table
                    .ids()
                    .into_iter()
                    .filter(|sid| !live.contains_key(sid.as_str()))
                    .collect()
            };
            for sid in gone {
                front.session_closed(&sid);
            }
            if table.take_ended() > 0 {
                trim = true;
            }
        }
    });
}

async fn resource_metadata(State(edge): State<Arc<Edge>>, headers: HeaderMap) -> Response {
    if !edge.gate.host_ok(&headers) {
        return jsonrpc_error(
            StatusCode::FORBIDDEN,
            -32600,
            "Forbidden: Host header is not allowed",
        );
    }
    let mut r = (
        StatusCode::OK,
        json!({
            "resource": edge.resource,
            "authorization_servers": edge.issuers,
            "bearer_methods_supported": ["header"],
            "resource_name": "warden (supervised coding agents over MCP)",
            "resource_documentation": "A bearer token configured on the gateway (`warden up` writes one to <state>/gateway/token), or a JWT of one of the authorization servers listed (docs/identity.md).",
        })
        .to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The `/mcp` routes (and the RFC 9728 metadata), to be merged into the gateway's router.
pub fn routes(edge: Arc<Edge>, shutdown: CancellationToken) -> Router {
    let front = edge.front.clone();
    // Idle sessions are ended by the reaper (`mcp.session_idle_seconds`, nothing in flight),
    // not by rmcp's own timer, which would also end a session in the middle of a quiet call.
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    spawn_reaper(front.clone(), manager.clone(), shutdown.clone());
    let service = StreamableHttpService::new(
        move || {
            Ok(Handler {
                front: front.clone(),
            })
        },
        manager,
        StreamableHttpServerConfig::default()
            .with_cancellation_token(shutdown)
            // The edge (above) checks Host and Origin with the gateway's own rules.
            .disable_allowed_hosts()
            .disable_allowed_origins()
            .with_max_request_body_bytes(edge.max_body)
            // A silent SSE stream (a queued or quiet turn) hears a comment this often.
            .with_sse_keep_alive(Some(edge.front.core.stream_keepalive())),
    );
    Router::new()
        .route_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(edge.clone(), guard))
        .route(RESOURCE_METADATA_PATH, get(resource_metadata))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .with_state(edge)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(bind: &str, public: &str, extra: &str) -> Gate {
        let toml = format!(
            "[daemon]\nstate_dir = \"/nonexistent\"\n[listen]\nsocket = \"g.sock\"\n[supervisor]\nsocket = \"/s.sock\"\n[http]\nbind = \"{bind}\"\npublic_url = \"{public}\"\n{extra}\n[auth]\ntoken_file = \"t\"\n"
        );
        let cfg: GatewayConfig = toml::from_str(&toml).unwrap();
        Gate::from_config(&cfg)
    }

    fn with(name: header::HeaderName, v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn loopback_hosts_pass_and_lookalikes_do_not() {
        let g = gate("127.0.0.1:7420", "http://127.0.0.1:7420", "");
        for ok in [
            "127.0.0.1:7420",
            "localhost:9",
            "LOCALHOST",
            "[::1]:7420",
            "127.0.0.1",
        ] {
            assert!(g.host_ok(&with(header::HOST, ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:7420",
            "evil.example:7420",
            "127.0.0.2",
            "[::2]:7420",
            "",
        ] {
            assert!(!g.host_ok(&with(header::HOST, bad)), "{bad}");
        }
        assert!(!g.host_ok(&HeaderMap::new()), "no Host at all");
    }

    #[test]
    fn origins_must_be_loopback_public_or_configured() {
        let g = gate(
            "127.0.0.1:7420",
            "http://127.0.0.1:7420",
            "[mcp]\nallowed_origins = [\"https://app.example:8443\"]",
        );
        assert!(
            g.origin_ok(&HeaderMap::new()),
            "no Origin: not a browser page"
        );
        for ok in [
            "http://localhost:5173",
            "http://127.0.0.1:7420",
            "https://[::1]:1",
            "https://app.example:8443",
        ] {
            assert!(g.origin_ok(&with(header::ORIGIN, ok)), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://localhost@evil.example",
            "https://app.example",
            "null",
            "file://localhost",
            "http://127.0.0.1.nip.io",
        ] {
            assert!(!g.origin_ok(&with(header::ORIGIN, bad)), "{bad}");
        }
    }

    #[test]
    fn bound_wide_only_the_allowlist_and_public_host_pass() {
        let g = gate(
            "0.0.0.0:7420",
            "https://gw.example",
            "allowed_hosts = [\"gw.internal:7420\"]",
        );
        assert!(g.host_ok(&with(header::HOST, "gw.example")));
        assert!(g.host_ok(&with(header::HOST, "gw.internal:7420")));
        assert!(
            !g.host_ok(&with(header::HOST, "localhost:7420")),
            "loopback names are not special when bound wide"
        );
        assert!(!g.origin_ok(&with(header::ORIGIN, "http://localhost:3000")));
        assert!(g.origin_ok(&with(header::ORIGIN, "https://gw.example")));
    }

    #[test]
    fn only_requests_take_a_stream_share() {
        assert!(carries_request(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#
        ));
        assert!(carries_request(
            br#"[{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":"a","method":"ping"}]"#
        ));
        assert!(!carries_request(
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        ));
        assert!(!carries_request(
            br#"{"jsonrpc":"2.0","id":4,"result":{"action":"accept"}}"#
        ));
        assert!(carries_request(b"not json"));
    }

    #[test]
    fn a_mangled_depth_marker_counts_as_deep() {
        assert_eq!(depth_of(&HeaderMap::new()), 0);
        let h = |v: &str| with(header::HeaderName::from_static(DEPTH_HEADER), v);
        assert_eq!(depth_of(&h("0")), 0);
        assert_eq!(depth_of(&h("1")), 1);
        for v in ["-1", "one", "", " 1", "1.0", "99999999999999999999"] {
            assert_eq!(depth_of(&h(v)), u32::MAX, "{v:?}");
        }
    }
}
