//! `warden send [--agent NAME] [--context ID] "text"`: one task through a running `warden up`,
//! streamed live (agent text, tool calls, every permission decision with its verdict and reason,
//! the final state). Exit status: 0 when the task COMPLETED, 1 when it ended otherwise, 2 when it
//! could not be sent, 3 when it waits for input that stdin could not give.
//!
//! It speaks A2A 1.0 HTTP+JSON to the gateway's loopback URL (from the state directory's
//! `run/gateway.url`) with the caller token `warden up` generated (`gateway/token`). Ctrl-C asks
//! the gateway to cancel the task and shows how it ends; closing the stream alone would not cancel.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio::net::TcpStream;

use warden_cli::layout::Layout;

/// What `warden send` was asked to do.
#[derive(Debug, Clone)]
pub struct SendArgs {
    pub agent: Option<String>,
    pub context: Option<String>,
    pub text: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(
        "warden does not seem to be running: cannot read {path} ({source}); start it with `warden up`"
    )]
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
    #[error("the gateway URL {0:?} is not a local http:// URL")]
    Url(String),
    #[error("cannot reach the gateway at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the gateway refused the request (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    /// The token or address cannot be put in a request (e.g. a control character in the file).
    #[error("cannot build the request to the gateway: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("the connection to the gateway failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the gateway's event stream broke: {0}")]
    Stream(#[from] sse_stream::Error),
    #[error("the connection to the gateway failed: {0}")]
    Io(#[from] std::io::Error),
}

/// At most this much of an error answer is read: it is shown to the user, never streamed.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// One line of the live view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    /// Agent answer text, printed as it streams (no newline added).
    Text(String),
    /// A bracketed line such as `[policy] ALLOW Write hello.txt (edit): … [rule …]`.
    Line(String),
}

/// What one stream event means for the view and the outcome.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rendered {
    pub shown: Vec<Shown>,
    /// The task id, from the stream's first event.
    pub task_id: Option<String>,
    /// The task's state after this event, when it carried one.
    pub state: Option<String>,
}

fn short_state(s: &str) -> String {
    s.trim_start_matches("TASK_STATE_").to_string()
}

/// Turns one A2A StreamResponse into what the user sees.
pub fn render(ev: &Value) -> Rendered {
    let mut r = Rendered::default();
    if let Some(task) = ev.get("task") {
        r.task_id = task["id"].as_str().map(str::to_string);
        r.state = task["status"]["state"].as_str().map(str::to_string);
        r.shown.push(Shown::Line(format!(
            "[task] {} (context {})",
            task["id"].as_str().unwrap_or("?"),
            task["contextId"].as_str().unwrap_or("?")
        )));
    } else if let Some(a) = ev.get("artifactUpdate") {
        for p in a["artifact"]["parts"].as_array().into_iter().flatten() {
            if let Some(t) = p["text"].as_str()
                && !t.is_empty()
            {
                r.shown.push(Shown::Text(t.to_string()));
            }
        }
    } else if let Some(s) = ev.get("statusUpdate") {
        let state = s["status"]["state"].as_str().unwrap_or("").to_string();
        let msg = &s["status"]["message"];
        let text = msg["parts"][0]["text"].as_str().unwrap_or("");
        let w = &msg["metadata"]["warden"];
        match w["kind"].as_str() {
            Some("permission") => r.shown.push(Shown::Line(format!(
                "[policy] {} {} ({}): {} [rule {}]",
                w["verdict"].as_str().unwrap_or("deny").to_uppercase(),
                w["toolTitle"]
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| w["toolCallId"].as_str().unwrap_or("?")),
                w["toolKind"].as_str().unwrap_or("other"),
                w["reason"].as_str().unwrap_or(""),
                w["rule"].as_str().unwrap_or("")
            ))),
            Some("tool_call") => r.shown.push(Shown::Line(format!("[tool] {text}"))),
            Some("stop") => r
                .shown
                .push(Shown::Line(format!("[{}] {text}", short_state(&state)))),
            Some(kind) if !text.is_empty() => r.shown.push(Shown::Line(format!("[{kind}] {text}"))),
            _ if !text.is_empty() => r
                .shown
                .push(Shown::Line(format!("[{}] {text}", short_state(&state)))),
            _ => {}
        }
        if !state.is_empty() {
            r.state = Some(state);
        }
    }
    r
}

fn is_final(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
            | "TASK_STATE_INPUT_REQUIRED"
            | "TASK_STATE_AUTH_REQUIRED"
    )
}

/// `host:port` of a local `http://` gateway URL.
pub fn gateway_addr(url: &str) -> Result<String, SendError> {
    let rest = url
        .trim()
        .strip_prefix("http://")
        .ok_or_else(|| SendError::Url(url.trim().to_string()))?;
    let addr = rest.split('/').next().unwrap_or("");
    if addr.is_empty() || addr.contains('@') {
        return Err(SendError::Url(url.trim().to_string()));
    }
    Ok(addr.to_string())
}

fn read(path: &Path) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

/// Sends one request on a fresh HTTP/1.1 connection and returns the response head; its body is
/// read by the caller. One connection per request: `send` makes two at most (the stream and a
/// cancel), so a pool would buy nothing.
async fn request(
    addr: &str,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> Result<Response<Incoming>, SendError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| SendError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    // The connection is driven on its own task until the response body is read or dropped; its
    // errors also surface through `send_request` or the body, where they are reported.
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header("A2A-Version", "1.0")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(
            body.map(Value::to_string).unwrap_or_default(),
        )))?;
    Ok(sender.send_request(req).await?)
}

/// The refusal in a non-200 answer: the A2A error's message, else the body as text.
async fn refusal(resp: Response<Incoming>) -> SendError {
    let status = resp.status().as_u16();
    let body = match Limited::new(resp.into_body(), ERROR_BODY_LIMIT)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return SendError::Refused {
                status,
                message: format!("(the answer could not be read: {e})"),
            };
        }
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let message = v["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or(text);
    SendError::Refused { status, message }
}

struct View {
    at_line_start: bool,
}

impl View {
    fn show(&mut self, shown: &[Shown]) {
        let mut out = std::io::stdout().lock();
        for s in shown {
            match s {
                Shown::Text(t) => {
                    let _ = write!(out, "{t}");
                    self.at_line_start = t.ends_with('\n');
                }
                Shown::Line(l) => {
                    if !self.at_line_start {
                        let _ = writeln!(out);
                    }
                    let _ = writeln!(out, "{l}");
                    self.at_line_start = true;
                }
            }
        }
        let _ = out.flush();
    }
}

/// Streams one message; returns the task id and the state the stream ended in.
async fn stream(
    addr: &str,
    token: &str,
    message: Value,
    view: &mut View,
) -> Result<(Option<String>, String), SendError> {
    let resp = request(
        addr,
        Method::POST,
        "/a2a/rest/message:stream",
        token,
        Some(&json!({"message": message})),
    )
    .await?;
    if resp.status() != StatusCode::OK {
        return Err(refusal(resp).await);
    }
    let mut events = SseStream::new(resp.into_body());
    let mut task_id: Option<String> = None;
    let mut state = String::new();
    let mut cancel_sent = false;
    loop {
        let sse = tokio::select! {
            sse = events.next() => sse,
            _ = tokio::signal::ctrl_c(), if !cancel_sent && task_id.is_some() => {
                cancel_sent = true;
                if let Some(id) = &task_id {
                    view.show(&[Shown::Line(format!("[cancel] asking the gateway to cancel {id}"))]);
                    // The answer is read in the background; the stream shows how the task ends.
                    let (addr, token, id) = (addr.to_string(), token.to_string(), id.clone());
                    tokio::spawn(async move {
                        if let Ok(r) = request(&addr, Method::POST, &format!("/a2a/rest/tasks/{id}:cancel"), &token, None).await {
                            let _ = r.into_body().collect().await;
                        }
                    });
                }
                continue;
            }
        };
        let Some(sse) = sse else {
            break;
        };
        // Comments, keep-alives and blocks without data carry no event.
        let Some(data) = sse?.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        let ev: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        if ev.get("error").is_some() {
            view.show(&[Shown::Line(format!(
                "[error] {}",
                ev["error"]["message"].as_str().unwrap_or("stream error")
            ))]);
            continue;
        }
        let r = render(&ev);
        if task_id.is_none() {
            task_id = r.task_id.clone();
        }
        view.show(&r.shown);
        if let Some(s) = r.state {
            state = s;
            if is_final(&state) {
                break;
            }
        }
    }
    Ok((task_id, state))
}

/// Runs `warden send`.
pub async fn run(layout: &Layout, args: SendArgs) -> ExitCode {
    match send(layout, args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warden send: {e}");
            ExitCode::from(2)
        }
    }
}

async fn send(layout: &Layout, args: SendArgs) -> Result<ExitCode, SendError> {
    let url_file = layout.url_file();
    let url = read(&url_file).map_err(|source| SendError::NotRunning {
        path: url_file.display().to_string(),
        source,
    })?;
    let token_file = layout.token_file();
    let token = read(&token_file).map_err(|source| SendError::Token {
        path: token_file.display().to_string(),
        source,
    })?;
    let addr = gateway_addr(&url)?;
    let mut message = json!({
        "messageId": uuid::Uuid::new_v4().to_string(),
        "role": "ROLE_USER",
        "parts": [{"text": args.text}],
    });
    if let Some(c) = &args.context {
        message["contextId"] = json!(c);
    }
    if let Some(a) = &args.agent {
        message["metadata"] = json!({"agent": a});
    }
    let mut view = View {
        at_line_start: true,
    };
    loop {
        let (task_id, state) = stream(&addr, &token, message, &mut view).await?;
        match state.as_str() {
            "TASK_STATE_COMPLETED" => return Ok(ExitCode::SUCCESS),
            "TASK_STATE_INPUT_REQUIRED" => {
                let Some(task_id) = task_id else {
                    return Ok(ExitCode::from(3));
                };
                view.show(&[Shown::Line(
                    "[answer] type the answer and press Enter (EOF gives up):".into(),
                )]);
                // Blocking read on a thread: the answer comes from the person at the terminal.
                let (n, answer) = tokio::task::spawn_blocking(|| {
                    let mut answer = String::new();
                    std::io::stdin().read_line(&mut answer).map(|n| (n, answer))
                })
                .await
                .map_err(|e| SendError::Io(std::io::Error::other(e)))??;
                if n == 0 {
                    eprintln!("warden send: task {task_id} waits for input; none was given");
                    return Ok(ExitCode::from(3));
                }
                message = json!({
                    "messageId": uuid::Uuid::new_v4().to_string(),
                    "role": "ROLE_USER",
                    "taskId": task_id,
                    "parts": [{"text": answer.trim_end_matches(['\r', '\n'])}],
                });
            }
            "" => {
                eprintln!("warden send: the stream ended before the task did");
                return Ok(ExitCode::from(2));
            }
            _ => return Ok(ExitCode::from(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_shows_decisions_with_verdict_and_reason() {
        let ev = json!({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {
            "state": "TASK_STATE_WORKING",
            "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "permission deny: …"}],
              "metadata": {"warden": {"kind": "permission", "verdict": "deny", "toolTitle": "Write /etc/x",
                "toolKind": "edit", "reason": "path is outside the root", "rule": "floor.change.outside-root"}}}}}});
        let r = render(&ev);
        assert_eq!(
            r.shown,
            vec![Shown::Line("[policy] DENY Write /etc/x (edit): path is outside the root [rule floor.change.outside-root]".into())]
        );
        assert_eq!(r.state.as_deref(), Some("TASK_STATE_WORKING"));
    }

    #[test]
    fn text_tools_and_the_final_state_are_shown() {
        let task = render(
            &json!({"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_SUBMITTED"}}}),
        );
        assert_eq!(task.task_id.as_deref(), Some("t1"));
        let art = render(
            &json!({"artifactUpdate": {"taskId": "t1", "contextId": "c1", "artifact": {"artifactId": "a", "parts": [{"text": "Hello"}]}}}),
        );
        assert_eq!(art.shown, vec![Shown::Text("Hello".into())]);
        assert_eq!(art.state, None);
        let tool = render(
            &json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING", "message": {"parts": [{"text": "tool call pending: Write a (edit)"}], "metadata": {"warden": {"kind": "tool_call"}}}}}}),
        );
        assert_eq!(
            tool.shown,
            vec![Shown::Line(
                "[tool] tool call pending: Write a (edit)".into()
            )]
        );
        let stop = render(
            &json!({"statusUpdate": {"status": {"state": "TASK_STATE_CANCELED", "message": {"parts": [{"text": "refused by policy: x"}], "metadata": {"warden": {"kind": "stop"}}}}}}),
        );
        assert_eq!(
            stop.shown,
            vec![Shown::Line("[CANCELED] refused by policy: x".into())]
        );
        assert!(is_final(stop.state.as_deref().unwrap()));
        assert!(
            render(&json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING"}}}))
                .shown
                .is_empty()
        );
    }

    #[test]
    fn only_local_http_urls_are_used() {
        assert_eq!(
            gateway_addr("http://127.0.0.1:7420\n").unwrap(),
            "127.0.0.1:7420"
        );
        assert_eq!(
            gateway_addr("http://127.0.0.1:7420/").unwrap(),
            "127.0.0.1:7420"
        );
        assert!(gateway_addr("https://gw.example").is_err());
        assert!(gateway_addr("http://user@host").is_err());
        assert!(gateway_addr("").is_err());
    }
}
