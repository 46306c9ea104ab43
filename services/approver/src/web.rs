//! The operators' web page: served from the binary (no build step, no CDN) on a loopback address
//! (TLS is a reverse proxy's job). Login with an operator token from `web.token_file` (one
//! `principal token` pair per line, read at every login so a removed token stops working), then a
//! session cookie (HttpOnly, SameSite=Strict) for `web.session_ttl_secs`. Answers carry the
//! principal as `web:<principal>`. State-changing calls also need the `x-warden: 1` header, which
//! a cross-site form cannot send.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use warden_proto::v1 as pb;

use crate::config::Config;
use crate::queue::subject;
use crate::service::ApproverState;

const PAGE: &str = include_str!("page.html");
const COOKIE: &str = "warden_session";

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("cannot bind the web page to {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
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
    pub fn serve(self, state: Arc<ApproverState>, shutdown: CancellationToken) {
        let web = Arc::new(Web {
            state: state.clone(),
            sessions: Mutex::new(HashMap::new()),
            ttl: Duration::from_secs(state.config.web.session_ttl_secs),
            shutdown: shutdown.clone(),
        });
        let app = axum::Router::new()
            .route("/", get(page))
            .route("/login", post(login))
            .route("/logout", post(logout))
            .route("/api/pending", get(pending))
            .route("/api/history", get(history))
            .route("/api/answer", post(answer))
            .route("/api/events", get(events))
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

struct Web {
    state: Arc<ApproverState>,
    sessions: Mutex<HashMap<String, (String, Instant)>>,
    ttl: Duration,
    shutdown: CancellationToken,
}

impl Web {
    /// The principal of a live session named by the request's cookie.
    fn principal(&self, headers: &HeaderMap) -> Option<String> {
        let sid = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| {
                c.trim()
                    .strip_prefix(&format!("{COOKIE}="))
                    .map(str::to_string)
            })?;
        let mut s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        match s.get(&sid) {
            Some((p, until)) if *until > Instant::now() => Some(p.clone()),
            Some(_) => {
                s.remove(&sid);
                None
            }
            None => None,
        }
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
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "missing x-warden header"})),
        )
            .into_response();
    }
    let token = body["token"].as_str().unwrap_or("").trim().to_string();
    let Some(principal) = web.check_token(&token).filter(|_| !token.is_empty()) else {
        tracing::warn!("web login refused: unknown or removed operator token");
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "unknown or expired operator token"})),
        )
            .into_response();
    };
    let sid = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    web.sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(sid.clone(), (principal.clone(), Instant::now() + web.ttl));
    tracing::info!(principal = %principal, "operator logged in on the web page");
    (
        [(
            header::SET_COOKIE,
            format!(
                "{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                web.ttl.as_secs()
            ),
        )],
        Json(json!({"principal": principal})),
    )
        .into_response()
}

async fn logout(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if let Some(sid) = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(';').find_map(|c| {
                c.trim()
                    .strip_prefix(&format!("{COOKIE}="))
                    .map(str::to_string)
            })
        })
    {
        web.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sid);
    }
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Json(json!({})),
    )
        .into_response()
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
        .unwrap_or_else(|| warden_policy::convert::judged(&req));
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
        "now_ms": crate::queue::now_ms(),
    })
}

async fn pending(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if web.principal(&headers).is_none() {
        return unauthorized();
    }
    match web.state.queue.pending(1000) {
        Ok(v) => Json(v.iter().map(view).collect::<Vec<_>>()).into_response(),
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
    match web.state.queue.history(100) {
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
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "missing x-warden header"})),
        )
            .into_response();
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
    {
        Ok(a) => Json(view(&a)).into_response(),
        Err(s) => {
            let code = match s.code() {
                tonic::Code::NotFound => StatusCode::NOT_FOUND,
                tonic::Code::FailedPrecondition => StatusCode::CONFLICT,
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let current = web.state.queue.get(id).ok().flatten().map(|a| view(&a));
            (
                code,
                Json(json!({"error": s.message(), "approval": current})),
            )
                .into_response()
        }
    }
}

async fn events(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    if web.principal(&headers).is_none() {
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
        let digest = warden_policy::convert::judged(&req).digest;
        // Held before the field existed: computed from the request, the same digest.
        for judged in [None, Some(warden_policy::convert::judged(&req))] {
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
