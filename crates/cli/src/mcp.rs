//! `warden mcp`: a stdio MCP server for hosts that launch their tools as processes
//! (`claude mcp add warden -- warden mcp`, Codex `[mcp_servers.warden]`). It is a thin relay:
//! each JSON-RPC line from stdin is POSTed to the local gateway's `/mcp` with the caller token
//! from the state directory, and every message of the answer (a JSON body or an SSE stream,
//! including the gateway's own requests such as elicitation) is written back as one line.
//!
//! Owns: the stdio framing, the MCP session the gateway mints (`Mcp-Session-Id`, ended with
//! DELETE at EOF), the per-request headers streamable HTTP wants (`MCP-Protocol-Version`,
//! `Mcp-Method`, `Mcp-Name`), and `Warden-Depth` from the inherited `WARDEN_DEPTH`, forwarded
//! verbatim so the gateway refuses a call from inside a warden-run agent.
//! Must never: talk to the supervisor or the policy, look at a tool call's arguments, or lower
//! the depth marker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::client::{self, ClientError};
use crate::layout::Layout;

/// One stdin line at most (a JSON-RPC message); a longer one is answered with an error.
pub const MAX_LINE: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the gateway is not running (no {path}: {source}); start it with `warden up`")]
    NotRunning {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the caller token {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Default)]
struct Session {
    id: Option<String>,
    protocol: Option<String>,
}

struct Relay {
    addr: String,
    token: String,
    depth: Option<String>,
    session: Mutex<Session>,
    /// In-flight requests by JSON-RPC id (text), so a stateless cancel can close the stream.
    inflight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    out: mpsc::UnboundedSender<String>,
}

fn id_key(v: &Value) -> Option<String> {
    match v.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.to_string()),
        _ => None,
    }
}

fn error_line(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

impl Relay {
    fn headers_for(&self, msg: &Value) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        let s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let meta_version = msg
            .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(v) = meta_version.or_else(|| s.protocol.clone()) {
            h.push(("mcp-protocol-version", v));
        }
        if let Some(id) = &s.id {
            h.push(("mcp-session-id", id.clone()));
        }
        if let Some(m) = msg.get("method").and_then(Value::as_str) {
            h.push(("mcp-method", m.to_string()));
            let name = match m {
                "tools/call" | "prompts/get" => msg.pointer("/params/name"),
                "resources/read" => msg.pointer("/params/uri"),
                _ => None,
            };
            if let Some(n) = name.and_then(Value::as_str) {
                h.push(("mcp-name", n.to_string()));
            }
        }
        if let Some(d) = &self.depth {
            h.push(("warden-depth", d.clone()));
        }
        h
    }

    async fn send(
        &self,
        method: Method,
        body: Option<String>,
        headers: Vec<(&'static str, String)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .map_err(|source| ClientError::Connect {
                addr: self.addr.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri("/mcp")
            .header(HOST, &self.addr)
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        Ok(sender.send_request(req).await?)
    }

    fn emit(&self, line: String) {
        let _ = self.out.send(line);
    }

    /// Notes what an answer tells about the session (initialize result).
    fn observe(&self, v: &Value) {
        if let Some(p) = v.pointer("/result/protocolVersion").and_then(Value::as_str) {
            let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
            s.protocol = Some(p.to_string());
        }
    }

    /// Relays one message and everything the gateway answers to it.
    async fn relay(self: Arc<Self>, msg: Value) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let is_request = msg.get("method").is_some() && id_key(&msg).is_some();
        let is_initialize = msg.get("method").and_then(Value::as_str) == Some("initialize");
        let headers = self.headers_for(&msg);
        let resp = match self
            .send(Method::POST, Some(msg.to_string()), headers)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                if is_request {
                    self.emit(error_line(&id, -32603, &format!("warden mcp: {e}")));
                }
                return;
            }
        };
        if is_initialize
            && let Some(sid) = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
        {
            let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
            s.id = Some(sid.to_string());
        }
        let status = resp.status();
        let sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            return;
        }
        if sse {
            let mut events = SseStream::new(resp.into_body());
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { break };
                let Some(data) = ev.data else { continue };
                if data.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(&data) {
                    Ok(v) => {
                        self.observe(&v);
                        self.emit(v.to_string());
                    }
                    Err(_) => continue,
                }
            }
            return;
        }
        match client::read_answer(resp).await {
            Ok((v, text)) if v.is_object() && v.get("jsonrpc").is_some() => {
                self.observe(&v);
                // An HTTP-level refusal carries a JSON-RPC error without the request's id.
                let mut v = v;
                if is_request && v.get("error").is_some() && v.get("id") == Some(&Value::Null) {
                    v["id"] = id.clone();
                }
                if is_request || v.get("method").is_some() {
                    self.emit(v.to_string());
                }
                let _ = text;
            }
            Ok((_, text)) => {
                if is_request {
                    self.emit(error_line(
                        &id,
                        -32603,
                        &format!(
                            "warden mcp: the gateway answered {status}: {}",
                            text.chars().take(500).collect::<String>()
                        ),
                    ));
                }
            }
            Err(e) => {
                if is_request {
                    self.emit(error_line(&id, -32603, &format!("warden mcp: {e}")));
                }
            }
        }
    }

    /// Ends the gateway session, if one was opened.
    async fn close(&self) {
        let sid = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .id
            .clone();
        if let Some(sid) = sid {
            let mut h = vec![("mcp-session-id", sid)];
            if let Some(d) = &self.depth {
                h.push(("warden-depth", d.clone()));
            }
            let _ = self.send(Method::DELETE, None, h).await;
        }
    }
}

/// Runs the relay until stdin ends.
pub async fn run(layout: &Layout) -> Result<(), RelayError> {
    let url_file = layout.url_file();
    let url = std::fs::read_to_string(&url_file).map_err(|source| RelayError::NotRunning {
        path: url_file.display().to_string(),
        source,
    })?;
    let token_file = layout.token_file();
    let token = std::fs::read_to_string(&token_file)
        .map_err(|source| RelayError::Token {
            path: token_file.display().to_string(),
            source,
        })?
        .trim()
        .to_string();
    let addr = client::gateway_addr(&url)?;
    // Forwarded as written: the gateway applies `warden_daemon::depth` (a mangled value is deep).
    let depth =
        std::env::var_os(warden_daemon::depth::DEPTH_ENV).map(|v| v.to_string_lossy().into_owned());
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err()
                || stdout.write_all(b"\n").await.is_err()
                || stdout.flush().await.is_err()
            {
                break;
            }
        }
    });
    let relay = Arc::new(Relay {
        addr,
        token,
        depth,
        session: Mutex::new(Session::default()),
        inflight: Mutex::new(HashMap::new()),
        out: tx,
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        if line.len() > MAX_LINE {
            relay.emit(error_line(&Value::Null, -32600, "message too large"));
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                relay.emit(error_line(
                    &Value::Null,
                    -32700,
                    &format!("parse error: {e}"),
                ));
                continue;
            }
        };
        // Statelessly (no session), cancelling a request is closing its stream.
        if msg.get("method").and_then(Value::as_str) == Some("notifications/cancelled") {
            let stateless = relay
                .session
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .id
                .is_none();
            if stateless {
                if let Some(key) = msg.pointer("/params/requestId").map(Value::to_string)
                    && let Some(h) = relay
                        .inflight
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&key)
                {
                    h.abort();
                }
                continue;
            }
        }
        // Requests run concurrently (a long tool call must not hold up a cancel or an answer
        // to an elicitation); everything else, and `initialize` (its answer carries the
        // session id every later message needs), is relayed in order before the next line.
        let key = if msg.get("method").is_some() {
            id_key(&msg)
        } else {
            None
        };
        let initialize = msg.get("method").and_then(Value::as_str) == Some("initialize");
        if key.is_none() || initialize {
            relay.clone().relay(msg).await;
            continue;
        }
        let r = relay.clone();
        let handle = tasks.spawn(r.relay(msg));
        if let Some(key) = key {
            let mut m = relay.inflight.lock().unwrap_or_else(|p| p.into_inner());
            m.retain(|_, h| !h.is_finished());
            m.insert(key, handle);
        }
    }
    // stdin closed: every request already read is still answered — a host or a script that
    // pipes its messages in and closes its end expects the answers (the MCP stdio shutdown is
    // "close stdin, wait for the server to exit, then SIGTERM"). SIGTERM or Ctrl-C stops the
    // wait: the calls in flight are dropped (a stateless call's stream closes, which cancels
    // it). Then the session is ended.
    let drained = async { while tasks.join_next().await.is_some() {} };
    tokio::select! {
        _ = drained => {}
        _ = stop_signal() => tasks.shutdown().await,
    }
    relay.close().await;
    drop(relay);
    let _ = writer.await;
    Ok(())
}

/// SIGTERM or SIGINT; pending forever if neither can be watched (the default action of an
/// unwatched signal still ends the process).
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay(depth: Option<&str>) -> Relay {
        let (out, _) = mpsc::unbounded_channel();
        Relay {
            addr: "127.0.0.1:1".into(),
            token: "t".into(),
            depth: depth.map(str::to_string),
            session: Mutex::new(Session::default()),
            inflight: Mutex::new(HashMap::new()),
            out,
        }
    }

    fn get<'a>(h: &'a [(&'static str, String)], k: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_streamable_http_headers_come_from_the_message_and_the_session() {
        let r = relay(Some("1"));
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "advise", "arguments": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let h = r.headers_for(&call);
        assert_eq!(get(&h, "mcp-method"), Some("tools/call"));
        assert_eq!(get(&h, "mcp-name"), Some("advise"));
        assert_eq!(get(&h, "mcp-protocol-version"), Some("2026-07-28"));
        assert_eq!(
            get(&h, "warden-depth"),
            Some("1"),
            "the marker is forwarded as inherited"
        );
        assert_eq!(get(&h, "mcp-session-id"), None);
        // After a 2025-11-25 initialize: the session and its version ride on every message.
        r.observe(&json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}}));
        r.session.lock().unwrap().id = Some("s1".into());
        let h = r.headers_for(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert_eq!(get(&h, "mcp-session-id"), Some("s1"));
        assert_eq!(get(&h, "mcp-protocol-version"), Some("2025-11-25"));
        assert_eq!(get(&h, "mcp-name"), None);
        let h = relay(None).headers_for(&json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "x://y"}}));
        assert_eq!(get(&h, "mcp-name"), Some("x://y"));
        assert_eq!(get(&h, "warden-depth"), None);
    }
}
