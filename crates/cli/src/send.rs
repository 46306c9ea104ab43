//! `warden send [--agent NAME] [--context ID] "text"`: one task through a running `warden up`,
//! streamed live (agent text, tool calls, every permission decision with its verdict and reason,
//! the final state). The exit status says how it ended ([`EXIT_CODES`], also in `--help`).
//!
//! It speaks A2A 1.0 HTTP+JSON to the gateway's loopback URL (from the state directory's
//! `run/gateway.url`) with the caller token `warden up` generated (`gateway/token`), through
//! [`warden_cli::client`]. Ctrl-C or SIGTERM asks the gateway to cancel the task (CancelTask) and
//! shows how it ends: closing the stream alone would not cancel, and a caller that was told
//! "interrupted" must not leave an agent working behind it.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use warden_cli::client::{self, ClientError};
use warden_cli::layout::Layout;

/// How long an interrupted `send` waits for the cancelled task to reach its end. The gateway
/// forces CANCELED itself after its own grace (`cancel_grace_ms`, 10 s by default).
pub const CANCEL_WAIT: Duration = Duration::from_secs(12);

/// The exit status of `warden send`, for `--help` and the README.
pub const EXIT_CODES: &str = "\
Ctrl-C or SIGTERM cancels the task: warden send asks the gateway to cancel it (A2A CancelTask),
shows how it ends (waiting up to 12 s), then exits non-zero. A second Ctrl-C stops waiting.

Exit status:
  0    the task COMPLETED and the policy allowed every permission it asked for
  1    the task FAILED (or ended in a state not listed here)
  2    the task could not be sent or followed: warden is not running, the gateway refused
       the request, or the connection broke before the task ended
  3    the task waits for input that stdin did not give
  4    the task COMPLETED, but the policy refused at least one permission (deny, or an
       escalation nobody approved)
  5    the task was CANCELED (by Ctrl-C/SIGTERM here, or by anyone else)
  6    the task was REJECTED by the agent
  130  interrupted by Ctrl-C (143: SIGTERM), and the task was not seen to end within the wait
       or COMPLETED before the cancel reached it";

/// What `warden send` was asked to do.
#[derive(Debug, Clone)]
pub struct SendArgs {
    pub agent: Option<String>,
    pub context: Option<String>,
    pub text: String,
    /// The gateway's URL instead of the one `warden up` wrote (a deployed gateway).
    pub url: Option<String>,
    /// A file holding the caller's token instead of `warden up`'s.
    pub token_file: Option<std::path::PathBuf>,
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
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the gateway refused the request (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("the gateway's event stream broke: {0}")]
    Stream(#[from] sse_stream::Error),
    #[error("cannot handle Ctrl-C/SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    #[error("cannot read the answer from stdin: {0}")]
    Stdin(#[source] std::io::Error),
}

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
    /// A permission decision that was not an ALLOW (deny, or an unresolved escalation).
    pub refused: bool,
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
        if w["kind"] == "permission" {
            // Anything but an explicit allow is a refusal, as the policy contract reads it.
            r.refused = w["verdict"].as_str() != Some("allow");
        }
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
    is_terminal(state)
        || matches!(
            state,
            "TASK_STATE_INPUT_REQUIRED" | "TASK_STATE_AUTH_REQUIRED"
        )
}

/// The states a task never leaves.
fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
    )
}

/// Which signal interrupted `send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    Int,
    Term,
}

impl Interrupt {
    /// The shell's convention: 128 + the signal number.
    fn code(self) -> u8 {
        match self {
            Interrupt::Int => 130,
            Interrupt::Term => 143,
        }
    }
}

/// The exit status for how the task ended ([`EXIT_CODES`]).
pub fn exit_code(state: &str, refused: bool, interrupt: Option<Interrupt>) -> u8 {
    match state {
        "TASK_STATE_CANCELED" => 5,
        "TASK_STATE_REJECTED" => 6,
        "TASK_STATE_FAILED" => 1,
        // An interrupted send never reports success, even if the task won the race.
        _ if interrupt.is_some() => interrupt.map_or(1, Interrupt::code),
        "TASK_STATE_COMPLETED" if refused => 4,
        "TASK_STATE_COMPLETED" => 0,
        "TASK_STATE_INPUT_REQUIRED" => 3,
        // The stream ended while the task was still going (or before it was named).
        s if !is_final(s) => 2,
        _ => 1,
    }
}

/// SIGINT and SIGTERM, caught for the whole of `send` so neither kills it before the cancel.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn install() -> Result<Self, SendError> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).map_err(SendError::Signal)?,
            term: signal(SignalKind::terminate()).map_err(SendError::Signal)?,
        })
    }

    async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            Some(()) = self.int.recv() => Interrupt::Int,
            Some(()) = self.term.recv() => Interrupt::Term,
            // Both streams closed: no signal will come any more.
            else => std::future::pending().await,
        }
    }
}

fn read(path: &Path) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

/// Asks the gateway to cancel the task; the state in its answer (the gateway answers once the
/// task has ended, or after forcing CANCELED), if any.
async fn cancel_task(addr: String, token: String, id: String) -> Option<String> {
    let path = format!("/a2a/rest/tasks/{id}:cancel");
    let resp = client::request(&addr, Method::POST, &path, &token, None)
        .await
        .ok()?;
    let ok = resp.status() == StatusCode::OK;
    let (v, _) = client::read_answer(resp).await.ok()?;
    ok.then(|| v["status"]["state"].as_str().map(str::to_string))
        .flatten()
}

/// How one stream (one message) ended.
struct Ended {
    task_id: Option<String>,
    /// The last state seen ("" if none).
    state: String,
    /// Whether the policy refused any permission on the way.
    refused: bool,
    interrupt: Option<Interrupt>,
}

/// The cancel asked for after an interrupt: sent once the task has an id.
struct Cancel {
    deadline: Instant,
    sent: Option<tokio::task::JoinHandle<Option<String>>>,
}

impl Cancel {
    fn new() -> Self {
        Cancel {
            deadline: Instant::now() + CANCEL_WAIT,
            sent: None,
        }
    }

    fn send(&mut self, addr: &str, token: &str, id: &str, view: &mut View) {
        if self.sent.is_none() {
            view.show(&[Shown::Line(format!(
                "[cancel] asking the gateway to cancel {id}"
            ))]);
            self.sent = Some(tokio::spawn(cancel_task(
                addr.to_string(),
                token.to_string(),
                id.to_string(),
            )));
        }
    }

    /// The state the gateway's cancel answer reported, waiting until the deadline.
    async fn answer(self) -> Option<String> {
        let handle = self.sent?;
        tokio::time::timeout_at(self.deadline, handle)
            .await
            .ok()?
            .ok()?
    }
}

struct View {
    at_line_start: bool,
}

impl View {
    fn show(&mut self, shown: &[Shown]) {
        let mut out = std::io::stdout().lock();
        for s in shown {
            match s {
                // What the agent wrote is shown as data: its prose keeps its lines, a status
                // line stays one line (a title cannot forge a `[policy]` line of its own).
                Shown::Text(t) => {
                    let _ = write!(out, "{}", warden_terminal_text::block(t));
                    self.at_line_start = t.ends_with('\n');
                }
                Shown::Line(l) => {
                    if !self.at_line_start {
                        let _ = writeln!(out);
                    }
                    let _ = writeln!(out, "{}", warden_terminal_text::Inline(l));
                    self.at_line_start = true;
                }
            }
        }
        let _ = out.flush();
    }
}

/// Streams one message until the task reaches a final state, the stream ends, or (after an
/// interrupt) the cancel wait runs out.
async fn stream(
    addr: &str,
    token: &str,
    message: Value,
    view: &mut View,
    signals: &mut Signals,
) -> Result<Ended, SendError> {
    let resp = client::request(
        addr,
        Method::POST,
        "/a2a/rest/message:stream",
        token,
        Some(&json!({"message": message})),
    )
    .await?;
    if resp.status() != StatusCode::OK {
        let status = resp.status().as_u16();
        let (v, text) = client::read_answer(resp).await?;
        let message = v["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or(text);
        return Err(SendError::Refused { status, message });
    }
    let mut events = SseStream::new(resp.into_body());
    let mut end = Ended {
        task_id: None,
        state: String::new(),
        refused: false,
        interrupt: None,
    };
    let mut cancel: Option<Cancel> = None;
    // A second signal: stop waiting for the end, including for the cancel's answer.
    let mut gave_up = false;
    loop {
        if let (Some(c), Some(id)) = (cancel.as_mut(), end.task_id.as_deref()) {
            c.send(addr, token, id, view);
        }
        let deadline = cancel.as_ref().map(|c| c.deadline);
        let sse = tokio::select! {
            sse = events.next() => sse,
            sig = signals.recv() => {
                if cancel.is_some() {
                    view.show(&[Shown::Line("[cancel] not waiting any longer".into())]);
                    gave_up = true;
                    break;
                }
                if end.task_id.is_none() {
                    view.show(&[Shown::Line(
                        "[cancel] the task is cancelled as soon as the gateway names it".into(),
                    )]);
                }
                end.interrupt = Some(sig);
                cancel = Some(Cancel::new());
                continue;
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                view.show(&[Shown::Line("[cancel] the task was not seen to end in time".into())]);
                break;
            }
        };
        let sse = match sse {
            None => break,
            // Once cancelling, a broken stream is not the end: the cancel's answer still is.
            Some(Err(_)) if cancel.is_some() => break,
            Some(r) => r?,
        };
        // Comments, keep-alives and blocks without data carry no event.
        let Some(data) = sse.data.filter(|d| !d.is_empty()) else {
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
        if end.task_id.is_none() {
            end.task_id = r.task_id.clone();
        }
        end.refused |= r.refused;
        view.show(&r.shown);
        if let Some(s) = r.state {
            end.state = s;
            if is_final(&end.state) {
                break;
            }
        }
    }
    // Interrupted and the stream did not show the end (it closed, or the task stopped to wait
    // for input): the cancel's own answer says how the task ended.
    if let Some(c) = cancel
        && !gave_up
        && !is_terminal(&end.state)
        && let Some(state) = c.answer().await
    {
        view.show(&[Shown::Line(format!(
            "[{}] (the gateway's answer to the cancel)",
            short_state(&state)
        ))]);
        end.state = state;
    }
    Ok(end)
}

/// Runs `warden send`.
pub async fn run(layout: &Layout, args: SendArgs) -> ExitCode {
    match send(layout, args).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("warden send: {e}");
            ExitCode::from(2)
        }
    }
}

/// One line from stdin, read on its own thread: the answer comes from the person at the
/// terminal, and a plain thread (unlike a runtime blocking task) does not hold up the exit when
/// a signal ends `send` while the read is still waiting.
fn read_answer_line() -> tokio::sync::oneshot::Receiver<std::io::Result<(usize, String)>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut answer = String::new();
        let r = std::io::stdin().read_line(&mut answer).map(|n| (n, answer));
        let _ = tx.send(r);
    });
    rx
}

async fn send(layout: &Layout, args: SendArgs) -> Result<u8, SendError> {
    let mut signals = Signals::install()?;
    let url = match &args.url {
        Some(u) => u.clone(),
        None => {
            let url_file = layout.url_file();
            read(&url_file).map_err(|source| SendError::NotRunning {
                path: url_file.display().to_string(),
                source,
            })?
        }
    };
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| layout.token_file());
    let token = read(&token_file).map_err(|source| SendError::Token {
        path: token_file.display().to_string(),
        source,
    })?;
    let addr = client::gateway_addr(&url)?;
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
    let mut refused = false;
    loop {
        let end = stream(&addr, &token, message, &mut view, &mut signals).await?;
        refused |= end.refused;
        if !is_final(&end.state) && end.interrupt.is_none() {
            eprintln!("warden send: the stream ended before the task did");
        }
        if end.state != "TASK_STATE_INPUT_REQUIRED" || end.interrupt.is_some() {
            return Ok(exit_code(&end.state, refused, end.interrupt));
        }
        let Some(task_id) = end.task_id else {
            return Ok(3);
        };
        view.show(&[Shown::Line(
            "[answer] type the answer and press Enter (EOF gives up):".into(),
        )]);
        let line = tokio::select! {
            line = read_answer_line() => line,
            sig = signals.recv() => {
                let mut c = Cancel::new();
                c.send(&addr, &token, &task_id, &mut view);
                let state = c.answer().await.unwrap_or_default();
                if !state.is_empty() {
                    view.show(&[Shown::Line(format!("[{}]", short_state(&state)))]);
                }
                return Ok(exit_code(&state, refused, Some(sig)));
            }
        };
        let (n, answer) = line
            .map_err(|_| SendError::Stdin(std::io::Error::other("the reader thread ended")))?
            .map_err(SendError::Stdin)?;
        if n == 0 {
            eprintln!("warden send: task {task_id} waits for input; none was given");
            return Ok(3);
        }
        message = json!({
            "messageId": uuid::Uuid::new_v4().to_string(),
            "role": "ROLE_USER",
            "taskId": task_id,
            "parts": [{"text": answer.trim_end_matches(['\r', '\n'])}],
        });
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
    fn refusals_are_counted_and_only_an_allow_is_not_one() {
        let perm = |verdict: &str| {
            render(
                &json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING", "message": {
                "parts": [{"text": "permission"}],
                "metadata": {"warden": {"kind": "permission", "verdict": verdict}}}}}}),
            )
        };
        assert!(!perm("allow").refused);
        assert!(perm("deny").refused);
        assert!(perm("escalate").refused);
        assert!(perm("").refused);
    }

    #[test]
    fn the_exit_status_tells_each_ending_apart() {
        let c = |s: &str, refused, i| exit_code(s, refused, i);
        assert_eq!(c("TASK_STATE_COMPLETED", false, None), 0);
        assert_eq!(c("TASK_STATE_FAILED", false, None), 1);
        assert_eq!(c("TASK_STATE_AUTH_REQUIRED", false, None), 1);
        assert_eq!(c("", false, None), 2);
        assert_eq!(c("TASK_STATE_WORKING", false, None), 2);
        assert_eq!(c("TASK_STATE_INPUT_REQUIRED", false, None), 3);
        assert_eq!(c("TASK_STATE_COMPLETED", true, None), 4);
        assert_eq!(c("TASK_STATE_CANCELED", false, None), 5);
        assert_eq!(c("TASK_STATE_CANCELED", true, Some(Interrupt::Int)), 5);
        assert_eq!(c("TASK_STATE_REJECTED", false, None), 6);
        assert_eq!(c("TASK_STATE_WORKING", false, Some(Interrupt::Int)), 130);
        assert_eq!(c("TASK_STATE_COMPLETED", false, Some(Interrupt::Term)), 143);
        assert!(EXIT_CODES.contains(&format!("up to {} s", CANCEL_WAIT.as_secs())));
        // Every code is documented in --help.
        for code in [0, 1, 2, 3, 4, 5, 6, 130, 143] {
            assert!(EXIT_CODES.contains(&format!("{code}")), "{code}");
        }
    }
}
