//! The operators' web page: served from the binary (no build step, no CDN) on a loopback address
//! (TLS is a reverse proxy's job). Login with an operator token from `web.token_file` (one
//! `principal token` pair per line, read at every login so a removed token stops working).
//!
//! The session is bound to the page, not to the host. A cookie would not do: cookies are not
//! scoped by port, so a cookie of `127.0.0.1:7421` travels to every other server on 127.0.0.1 —
//! another local user's among them — and `SameSite` does not help, every loopback port being the
//! same site. So login answers the session secret in its body; the page keeps it in
//! `sessionStorage` (scoped to scheme, host *and* port) and sends it as `Authorization: Bearer`,
//! which a browser never attaches on its own. The live stream (`EventSource` sends no headers)
//! takes a single-use ticket of 30 s in its URL instead. Sessions are stored (by their SHA-256,
//! never the secret) in the approver's store with their expiry and the Host they were issued
//! for, so they survive a restart and answer under that Host only. Every request must name an
//! accepted Host (the bound address, `localhost:PORT` on loopback, `web.hosts`): a rebound DNS
//! name is refused. State-changing calls also need the `x-warden: 1` header, and a foreign
//! `Origin` is refused. Failed logins are limited per minute (`web.login_failures_per_minute`).
//! Answers carry the principal as `web:<principal>`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use warden_proto::v1 as pb;
use warden_store::Tree;

use crate::config::Config;
use crate::queue::{now_ms, subject};
use crate::service::ApproverState;

const PAGE: &str = include_str!("page.html");
/// How long a live-stream ticket may wait for its `GET /api/events`.
const TICKET_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("cannot bind the web page to {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the web sessions' store: {0}")]
    Store(#[from] warden_store::StoreError),
}

/// A bound web listener, not yet serving.
pub struct WebListener {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl WebListener {
    pub fn describe(&self) -> String {
        format!("http:{}", self.addr)
    }

    /// Serves until `shutdown`.
    pub fn serve(
        self,
        state: Arc<ApproverState>,
        shutdown: CancellationToken,
    ) -> Result<(), WebError> {
        let sessions = state.queue.store().tree("web_sessions")?;
        let mut hosts = vec![self.addr.to_string()];
        if self.addr.ip().is_loopback() {
            hosts.push(format!("localhost:{}", self.addr.port()));
        }
        hosts.extend(state.config.web.hosts.iter().cloned());
        let web = Arc::new(Web {
            ttl: Duration::from_secs(state.config.web.session_ttl_secs),
            failures_per_minute: state.config.web.login_failures_per_minute as usize,
            state,
            sessions,
            hosts,
            tickets: Mutex::new(HashMap::new()),
            failures: Mutex::new(VecDeque::new()),
            shutdown: shutdown.clone(),
        });
        let app = axum::Router::new()
            .route("/", get(page))
            .route("/login", post(login))
            .route("/logout", post(logout))
            .route("/api/pending", get(pending))
            .route("/api/history", get(history))
            .route("/api/answer", post(answer))
            .route("/api/ticket", post(ticket))
            .route("/api/events", get(events))
            .layer(axum::middleware::from_fn_with_state(
                web.clone(),
                checked_host,
            ))
            .with_state(web);
        tracing::info!(at = %self.addr, "web page listening");
        tokio::spawn(async move {
            let r = axum::serve(self.listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "web page stopped");
            }
        });
        Ok(())
    }
}

/// Binds `web.bind`.
pub async fn bind(cfg: &Config) -> Result<WebListener, WebError> {
    let err = |source| WebError::Bind {
        addr: cfg.web.bind.clone(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(&cfg.web.bind)
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    Ok(WebListener { listener, addr })
}

/// A stored session: who, under which Host, until when.
#[derive(serde::Serialize, serde::Deserialize)]
struct Session {
    principal: String,
    host: String,
    expires_unix_ms: u64,
}

struct Web {
    state: Arc<ApproverState>,
    /// Key: hex SHA-256 of the session secret (the secret itself is never stored).
    sessions: Tree,
    ttl: Duration,
    /// The Host names a request may carry.
    hosts: Vec<String>,
    /// Live-stream tickets: ticket -> (session key, valid until).
    tickets: Mutex<HashMap<String, (String, Instant)>>,
    /// When recent failed logins happened (the last minute's).
    failures: Mutex<VecDeque<Instant>>,
    failures_per_minute: usize,
    shutdown: CancellationToken,
}

fn session_key(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn new_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The request's Host header (HTTP/1.1 always has one).
fn host_of(headers: &HeaderMap) -> &str {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The bearer secret of the request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

impl Web {
    /// The principal of the live session whose key is `key`, issued under `host`.
    fn session(&self, key: &str, host: &str) -> Option<String> {
        let raw = self.sessions.get(key).ok()??;
        let s: Session = serde_json::from_slice(&raw).ok()?;
        if s.expires_unix_ms <= now_ms() {
            let _ = self.sessions.delete(key);
            return None;
        }
        // A secret replayed under another name for this page (a rebound DNS name, a proxy's
        // other host) is not this session.
        (s.host == host).then_some(s.principal)
    }

    /// The principal of the request's bearer session.
    fn principal(&self, headers: &HeaderMap) -> Option<String> {
        self.session(&session_key(bearer(headers)?), host_of(headers))
    }

    fn open_session(&self, principal: &str, host: &str) -> Option<String> {
        let secret = new_secret();
        let s = Session {
            principal: principal.to_string(),
            host: host.to_string(),
            expires_unix_ms: now_ms().saturating_add(self.ttl.as_millis() as u64),
        };
        let value = serde_json::to_vec(&s).ok()?;
        self.sessions.put(session_key(&secret), value).ok()?;
        // Expired sessions go at each login: the tree holds live ones (and the last expired).
        if let Ok(all) = self.sessions.scan_prefix([]) {
            for e in all {
                let expired = serde_json::from_slice::<Session>(&e.1)
                    .map(|s| s.expires_unix_ms <= now_ms())
                    .unwrap_or(true);
                if expired {
                    let _ = self.sessions.delete(&e.0);
                }
            }
        }
        let _ = self.sessions.flush();
        Some(secret)
    }

    /// Whether another failed login may be tried now; records nothing.
    fn login_allowed(&self) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        while f
            .front()
            .is_some_and(|t| t.elapsed() >= Duration::from_secs(60))
        {
            f.pop_front();
        }
        f.len() < self.failures_per_minute
    }

    fn login_failed(&self) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Instant::now());
    }

    /// The principal whose token this is, reading the token file now.
    fn check_token(&self, token: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.state.config.token_file()).ok()?;
        let mut found = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((principal, t)) = line.split_once(char::is_whitespace) else {
                continue;
            };
            let t = t.trim();
            // Every line is compared (constant time each), so timing says nothing about which.
            if !t.is_empty() && bool::from(t.as_bytes().ct_eq(token.as_bytes())) {
                found = Some(principal.to_string());
            }
        }
        found
    }
}

fn refused(code: StatusCode, error: &str) -> Response {
    (code, Json(json!({ "error": error }))).into_response()
}

/// Every request names an accepted Host, and a request that says where it comes from
/// (`Origin`, sent by browsers on every POST and cross-origin fetch) comes from this page.
async fn checked_host(
    State(web): State<Arc<Web>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = host_of(req.headers());
    if !web.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            "this page is not served under that Host",
        );
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin.to_str().ok().is_some_and(|o| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|o| o.eq_ignore_ascii_case(host))
        });
        if !ok {
            return refused(StatusCode::FORBIDDEN, "a request from another origin");
        }
    }
    next.run(req).await
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "log in with an operator token"})),
    )
        .into_response()
}

async fn page() -> impl IntoResponse {
    (
        [
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline' 'self'; connect-src 'self'; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Html(PAGE),
    )
}

async fn login(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if headers.get("x-warden").is_none() {
        return refused(StatusCode::FORBIDDEN, "missing x-warden header");
    }
    if !web.login_allowed() {
        tracing::warn!("web login refused: too many failed logins in the last minute");
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "60")],
            Json(json!({"error": "too many failed logins; try again in a minute"})),
        )
            .into_response();
    }
    let token = body["token"].as_str().unwrap_or("").trim().to_string();
    let Some(principal) = web.check_token(&token).filter(|_| !token.is_empty()) else {
        web.login_failed();
        tracing::warn!("web login refused: unknown or removed operator token");
        return refused(
            StatusCode::UNAUTHORIZED,
            "unknown or expired operator token",
        );
    };
    let Some(secret) = web.open_session(&principal, host_of(&headers)) else {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the session cannot be stored",
        );
    };
    tracing::info!(principal = %principal, "operator logged in on the web page");
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(json!({"principal": principal, "session": secret, "expires_in_secs": web.ttl.as_secs()})),
    )
        .into_response()
}

async fn logout(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if headers.get("x-warden").is_none() {
        return refused(StatusCode::FORBIDDEN, "missing x-warden header");
    }
    if let Some(secret) = bearer(&headers) {
        let _ = web.sessions.delete(session_key(secret));
        let _ = web.sessions.flush();
    }
    Json(json!({})).into_response()
}

/// A single-use ticket for the live stream, which a browser opens without headers.
async fn ticket(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if web.principal(&headers).is_none() {
        return unauthorized();
    }
    if headers.get("x-warden").is_none() {
        return refused(StatusCode::FORBIDDEN, "missing x-warden header");
    }
    let Some(secret) = bearer(&headers) else {
        return unauthorized();
    };
    let t = new_secret();
    let mut tickets = web.tickets.lock().unwrap_or_else(|p| p.into_inner());
    tickets.retain(|_, (_, until)| *until > Instant::now());
    tickets.insert(
        t.clone(),
        (session_key(secret), Instant::now() + TICKET_TTL),
    );
    Json(json!({ "ticket": t })).into_response()
}

/// An approval as the page shows it: locations relative to the root, raw input parsed.
pub fn view(a: &pb::Approval) -> Value {
    let s = subject(a);
    let req = a.request.clone().unwrap_or_default();
    let b = req.boundary.clone().unwrap_or_default();
    let t = req.tool_call.clone().unwrap_or_default();
    let rel = |p: &str| {
        std::path::Path::new(p)
            .strip_prefix(&b.root)
            .map(|r| r.display().to_string())
            .unwrap_or_else(|_| p.to_string())
    };
    let raw: Value = serde_json::from_str(&t.raw_input_json)
        .unwrap_or_else(|_| Value::String(t.raw_input_json.clone()));
    // What an approval is bound to (held with the request; computed from it for one held
    // before the field existed).
    let j = a
        .judged
        .clone()
        .unwrap_or_else(|| warden_decide::convert::judged(&req));
    let judged = json!({
        "kind": j.kind, "digest": j.digest,
        "locations": j.locations.iter().map(|l| rel(l)).collect::<Vec<_>>(),
        "argv": j.argv, "command_line": warden_rules::shell_line(&j.argv), "cwd": j.cwd,
        "content_sha256": j.content_sha256,
    });
    let state = match a.state() {
        pb::ApprovalState::Pending => "pending",
        pb::ApprovalState::Approved => "approved",
        pb::ApprovalState::Denied => "denied",
        pb::ApprovalState::NoResponse => "no-response",
        pb::ApprovalState::Revoked => "revoked",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Withdrawn => "withdrawn",
    };
    json!({
        "id": a.id, "state": state,
        "agent": s.agent, "principal": s.principal, "context": s.context_id, "task": s.task_id,
        // The title names absolute paths ("Write /…/root/a.txt"): shown relative to the root.
        "kind": t.kind, "title": if b.root.is_empty() { t.title.clone() } else { t.title.replace(&format!("{}/", b.root.trim_end_matches('/')), "") },
        "locations": t.locations.iter().map(|l| rel(&l.path)).collect::<Vec<_>>(),
        "root": b.root, "owned": b.owned, "allow_execute": b.allow_execute,
        "profile": if b.profile == pb::Profile::WorkspaceWrite as i32 { "workspace-write" } else { "read-only" },
        "escalated_rule": a.escalated_rule, "escalated_reason": a.escalated_reason,
        "created_ms": a.created_unix_ms, "deadline_ms": a.deadline_unix_ms,
        "answered_by": a.answered_by, "answered_ms": a.answered_unix_ms,
        "reason": a.reason, "rule": a.rule, "raw_input": raw,
        "withdrawn_reason": a.withdrawn_reason, "withdrawn_ms": a.withdrawn_unix_ms,
        "judged": judged,
        "now_ms": now_ms(),
    })
}

async fn pending(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if web.principal(&headers).is_none() {
        return unauthorized();
    }
    match web.state.queue.pending(1000).await {
        // One request of each principal in turn (as `ApprovalService.List`).
        Ok(v) => Json(
            crate::queue_store::round_robin(v)
                .iter()
                .map(view)
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn history(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if web.principal(&headers).is_none() {
        return unauthorized();
    }
    match web.state.queue.history(100).await {
        Ok(v) => Json(v.iter().map(view).collect::<Vec<_>>()).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn answer(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let Some(principal) = web.principal(&headers) else {
        return unauthorized();
    };
    if headers.get("x-warden").is_none() {
        return refused(StatusCode::FORBIDDEN, "missing x-warden header");
    }
    let id = body["id"].as_str().unwrap_or("");
    let verdict = match body["verdict"].as_str() {
        Some("approve") => pb::Verdict::Allow,
        Some("deny") => pb::Verdict::Deny,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": "verdict must be approve or deny"})),
            )
                .into_response();
        }
    };
    let reason = body["reason"].as_str().unwrap_or("");
    match web
        .state
        .answer(id, verdict as i32, reason, format!("web:{principal}"))
        .await
    {
        Ok(a) => Json(view(&a)).into_response(),
        Err(s) => {
            let code = match s.code() {
                tonic::Code::NotFound => StatusCode::NOT_FOUND,
                tonic::Code::FailedPrecondition => StatusCode::CONFLICT,
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let current = web
                .state
                .queue
                .get(id)
                .await
                .ok()
                .flatten()
                .map(|a| view(&a));
            (
                code,
                Json(json!({"error": s.message(), "approval": current})),
            )
                .into_response()
        }
    }
}

#[derive(serde::Deserialize)]
struct EventsQuery {
    #[serde(default)]
    ticket: String,
}

async fn events(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Response {
    // The ticket is used up by this request, whatever comes of it.
    let taken = web
        .tickets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&q.ticket);
    let live = taken
        .filter(|(_, until)| *until > Instant::now())
        .and_then(|(key, _)| web.session(&key, host_of(&headers)));
    if live.is_none() {
        return unauthorized();
    }
    let rx = web.state.queue.subscribe();
    let stop = web.shutdown.clone();
    let stream = tokio_stream::wrappers::BroadcastStream::new(rx)
        .filter_map(|r| async move {
            // A slow page that missed changes reloads the list on its next event.
            r.ok().map(|a| {
                Ok::<_, std::convert::Infallible>(
                    Event::default()
                        .event("approval")
                        .data(view(&a).to_string()),
                )
            })
        })
        .take_until(stop.cancelled_owned());
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_shows_what_an_approval_binds() {
        let req = pb::DecideRequest {
            boundary: Some(pb::Boundary {
                root: "/r".into(),
                ..Default::default()
            }),
            tool_call: Some(pb::ToolCall {
                kind: "execute".into(),
                title: "sh -c 'echo hi > x'".into(),
                raw_input_json: r#"{"command":["sh","-c","echo hi > x"],"cwd":"/r/sub"}"#.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let digest = warden_decide::convert::judged(&req).digest;
        // Held before the field existed: computed from the request, the same digest.
        for judged in [None, Some(warden_decide::convert::judged(&req))] {
            let a = pb::Approval {
                id: "a1".into(),
                request: Some(req.clone()),
                judged,
                ..Default::default()
            };
            let v = view(&a);
            assert_eq!(v["judged"]["digest"], digest.as_str());
            assert_eq!(v["judged"]["command_line"], "sh -c 'echo hi > x'");
            assert_eq!(v["judged"]["cwd"], "/r/sub");
        }
    }
}
