//! `warden send [--agent NAME] [--context ID] "text"`: one task through a running `warden up`,
//! streamed live (agent text, tool calls, an edit's diff when the tool call carries it, every
//! permission decision with its verdict and reason, the final state). The exit status says how
//! it ended ([`EXIT_CODES`], also in `--help`).
//!
//! A permission that waits for a person is named while it waits: `send` watches the local
//! approver's admin socket (`warden up --approver`) for the requests of its own task and shows
//! the approval id, the time left and the command that answers it; a FAILED task's incident
//! record (in the local supervisor's state directory) is named. On a terminal a status line
//! shows a spinner and the time elapsed; piped, it is never drawn. `-o json` prints one JSON
//! object a line instead (`{"type": "event" | "approval" | "note" | "incident" | "end", …}`).
//!
//! It speaks A2A 1.0 HTTP+JSON to the gateway's loopback URL (from the state directory's
//! `run/gateway.url`) with the caller token `warden up` generated (`gateway/token`), through
//! [`warden_cli::client`]. Ctrl-C or SIGTERM asks the gateway to cancel the task (CancelTask) and
//! shows how it ends: closing the stream alone would not cancel, and a caller that was told
//! "interrupted" must not leave an agent working behind it.

use std::collections::{BTreeMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
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
use warden_cli::output;
use warden_proto::v1 as pb;

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
    /// `-C DIR`: the agent works on a copy of this directory.
    pub copy_from: Option<PathBuf>,
    /// `--workspace NAME`: the agent works in this operator workspace directly.
    pub workspace: Option<String>,
    /// `--model`, `--effort`, `--mode`: sent as `metadata.warden.model|effort|mode`.
    pub model: Option<String>,
    pub effort: Option<String>,
    pub mode: Option<String>,
    pub text: String,
    /// The gateway's URL instead of the one `warden up` wrote (a deployed gateway).
    pub url: Option<String>,
    /// A file holding the caller's token instead of `warden up`'s.
    pub token_file: Option<std::path::PathBuf>,
    /// One JSON object a line instead of the live view (`-o json`).
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Locate(#[from] client::LocateError),
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
    #[error("-C {0}: {1}; nothing was sent")]
    BadDir(String, String),
}

/// `-C DIR` as an absolute path (not resolved: a link is the supervisor's to refuse, and is
/// refused here first), after the checks a person should hear about before anything starts.
fn copy_source(dir: &Path) -> Result<String, SendError> {
    let shown = dir.display().to_string();
    let abs =
        std::path::absolute(dir).map_err(|e| SendError::BadDir(shown.clone(), e.to_string()))?;
    let meta = std::fs::symlink_metadata(&abs)
        .map_err(|_| SendError::BadDir(shown.clone(), "no such directory".into()))?;
    if meta.file_type().is_symlink() {
        return Err(SendError::BadDir(
            shown,
            "a symbolic link; name the directory itself".into(),
        ));
    }
    if !meta.is_dir() {
        return Err(SendError::BadDir(shown, "not a directory".into()));
    }
    abs.to_str()
        .map(str::to_string)
        .ok_or_else(|| SendError::BadDir(shown, "not UTF-8".into()))
}

/// One line of the live view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    /// Agent answer text, printed as it streams (no newline added).
    Text(String),
    /// A bracketed line such as `[policy] ALLOW Write hello.txt (edit): … [rule …]`.
    Line(String),
    /// Lines of data (an edit's diff), each shown indented, what the agent wrote escaped.
    Block(String),
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
    /// A tool call's edit as a diff, with the tool call's id (shown once per call).
    pub diff: Option<(String, String)>,
    /// The context id, from the stream's first event.
    pub context_id: Option<String>,
    /// The task's diff artifact (the change to its root), when this event carried it.
    pub patch: Option<Value>,
}

fn short_state(s: &str) -> String {
    s.trim_start_matches("TASK_STATE_").to_string()
}

/// Turns one A2A StreamResponse into what the user sees.
pub fn render(ev: &Value) -> Rendered {
    let mut r = Rendered::default();
    if let Some(task) = ev.get("task") {
        r.task_id = task["id"].as_str().map(str::to_string);
        r.context_id = task["contextId"].as_str().map(str::to_string);
        r.state = task["status"]["state"].as_str().map(str::to_string);
        r.shown.push(Shown::Line(format!(
            "[task] {} (context {})",
            task["id"].as_str().unwrap_or("?"),
            task["contextId"].as_str().unwrap_or("?")
        )));
    } else if let Some(a) = ev.get("artifactUpdate") {
        if crate::tasks::is_diff(&a["artifact"]) {
            r.patch = Some(a["artifact"].clone());
            return r;
        }
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
            Some("tool_call") => {
                r.shown.push(Shown::Line(format!("[tool] {text}")));
                r.diff = edit_diff(&w["rawInput"])
                    .map(|d| (w["toolCallId"].as_str().unwrap_or("").to_string(), d));
            }
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

/// How many lines of one tool call's diff are shown; the rest is counted.
pub const MAX_DIFF_LINES: usize = 80;

/// One replacement as a unified diff's hunks under a `--- a` / `+++ b` header.
fn unified(from: &str, to: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::from_lines(old, new);
    let hunks = diff.unified_diff().context_radius(3).to_string();
    format!("--- {from}\n+++ {to}\n{hunks}")
}

/// The edit a tool call's raw input carries, as a unified diff: Claude's `Edit` (`file_path`,
/// `old_string`, `new_string`) and `MultiEdit` (`edits`), its `Write` (`content`: the whole new
/// content, the old one is not in the call), Codex's `changes` (`add` content, `update` with its
/// own `unified_diff`, `delete`). None when the input carries no edit.
pub fn edit_diff(raw: &Value) -> Option<String> {
    let mut out = String::new();
    let path = raw["file_path"].as_str().or(raw["path"].as_str());
    fn pair(e: &Value) -> Option<(&str, &str)> {
        Some((e["old_string"].as_str()?, e["new_string"].as_str()?))
    }
    if let (Some(p), Some((old, new))) = (path, pair(raw)) {
        out.push_str(&unified(p, p, old, new));
    } else if let (Some(p), Some(edits)) = (path, raw["edits"].as_array()) {
        for (old, new) in edits.iter().filter_map(pair) {
            out.push_str(&unified(p, p, old, new));
        }
    } else if let (Some(p), Some(content)) = (path, raw["content"].as_str()) {
        let to = format!("{p} (the whole content written; the old one is not in the call)");
        out.push_str(&unified(p, &to, "", content));
    } else if let Some(changes) = raw["changes"].as_object() {
        for (p, c) in changes {
            let kind = c["type"].as_str().or_else(|| {
                ["add", "update", "delete"]
                    .into_iter()
                    .find(|k| c.get(*k).is_some())
            });
            let body = |k: &str, field: &str| c[k][field].as_str().or(c[field].as_str());
            match kind {
                Some("add") => {
                    let to = format!("{p} (new file)");
                    out.push_str(&unified("/dev/null", &to, "", body("add", "content")?));
                }
                Some("update") => {
                    let d = body("update", "unified_diff")?;
                    out.push_str(&format!("--- {p}\n+++ {p}\n{d}"));
                    if !d.ends_with('\n') {
                        out.push('\n');
                    }
                }
                Some("delete") => out.push_str(&format!("--- {p}\n+++ /dev/null (deleted)\n")),
                _ => {}
            }
        }
    }
    if out.is_empty() {
        return None;
    }
    let lines: Vec<&str> = out.lines().collect();
    if lines.len() <= MAX_DIFF_LINES {
        return Some(out);
    }
    let mut shown = lines[..MAX_DIFF_LINES].join("\n");
    shown.push_str(&format!(
        "\n… {} more lines of the diff\n",
        lines.len() - MAX_DIFF_LINES
    ));
    Some(shown)
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
    context_id: Option<String>,
    /// The task's diff artifact, when it changed files.
    patch: Option<Value>,
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

/// The spinner's frames.
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// What `send` prints: the live view (with a status line on a terminal) or JSON lines.
struct View {
    at_line_start: bool,
    json: bool,
    /// Draw the status line (stdout is a terminal and the view is for people).
    tty: bool,
    started: std::time::Instant,
    status_drawn: bool,
    frame: usize,
    /// How people run `warden` here (`warden --state-dir DIR`), for the commands shown.
    command: String,
    /// The local approver's admin socket, when one is running on this state directory.
    approver: Option<PathBuf>,
    /// The approvals of this task waiting for a person: id → deadline (epoch ms).
    waiting: BTreeMap<String, u64>,
    /// Tool calls whose diff was shown (a tool call's updates repeat its raw input).
    diffs_shown: HashSet<String>,
}

impl View {
    fn new(layout: &Layout, json: bool) -> Self {
        let approver = Some(layout.approver_admin_socket()).filter(|s| s.exists());
        View {
            at_line_start: true,
            json,
            tty: !json && std::io::stdout().is_terminal(),
            started: std::time::Instant::now(),
            status_drawn: false,
            frame: 0,
            command: layout.command(),
            approver,
            waiting: BTreeMap::new(),
            diffs_shown: HashSet::new(),
        }
    }

    fn clear_status(&mut self, out: &mut impl Write) {
        if self.status_drawn {
            let _ = write!(out, "\r\x1b[2K");
            self.status_drawn = false;
        }
    }

    fn show(&mut self, shown: &[Shown]) {
        if self.json {
            // Notes of `send` itself (cancel, answer prompts); the events are printed whole.
            for s in shown {
                if let Shown::Line(l) = s {
                    output::print_line(&json!({"type": "note", "text": l}));
                }
            }
            return;
        }
        let mut out = std::io::stdout().lock();
        self.clear_status(&mut out);
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
                Shown::Block(b) => {
                    if !self.at_line_start {
                        let _ = writeln!(out);
                    }
                    for l in b.lines() {
                        let _ = writeln!(out, "    {}", warden_terminal_text::Inline(l));
                    }
                    self.at_line_start = true;
                }
            }
        }
        let _ = out.flush();
    }

    /// One A2A event, for `-o json`.
    fn event(&mut self, ev: &Value) {
        if self.json {
            output::print_line(&json!({"type": "event", "event": ev}));
        }
    }

    /// Redraws the status line: spinner, time elapsed, and what the task waits for. Only on a
    /// terminal, and only between lines (never in the middle of the agent's text).
    fn tick(&mut self) {
        if !self.tty || !self.at_line_start {
            return;
        }
        self.frame = (self.frame + 1) % SPINNER.len();
        let elapsed = output::duration(self.started.elapsed().as_secs());
        let what = match self.waiting.iter().next() {
            Some((id, deadline)) => format!(
                "waiting for a person: approval {id}, {} left",
                output::duration(
                    deadline
                        .saturating_sub(warden_cli::approvals::now_ms())
                        .div_ceil(1000)
                )
            ),
            None => "working".into(),
        };
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\r\x1b[2K{} {elapsed}  {}",
            SPINNER[self.frame],
            warden_terminal_text::Inline(&what)
        );
        let _ = out.flush();
        self.status_drawn = true;
    }

    /// Takes the status line away (before `send` ends or reads an answer).
    fn settle(&mut self) {
        let mut out = std::io::stdout().lock();
        self.clear_status(&mut out);
        let _ = out.flush();
    }

    /// A request of this task held by the approver: waiting (id, time left, the command that
    /// answers it), or decided.
    fn approval(&mut self, a: &pb::Approval) {
        if self.json {
            output::print_line(&json!({
                "type": "approval",
                "approval": output::approval_json(a, &self.command),
            }));
            return;
        }
        let t = a
            .request
            .as_ref()
            .and_then(|r| r.tool_call.clone())
            .unwrap_or_default();
        let what = if t.title.is_empty() {
            t.kind.clone()
        } else {
            t.title.clone()
        };
        if a.state() == pb::ApprovalState::Pending {
            if self
                .waiting
                .insert(a.id.clone(), a.deadline_unix_ms)
                .is_some()
            {
                return;
            }
            let left = a
                .deadline_unix_ms
                .saturating_sub(warden_cli::approvals::now_ms())
                .div_ceil(1000);
            self.show(&[
                Shown::Line(format!(
                    "[approval] {what} ({}) waits for a person: approval {}, {} left (denied then)",
                    t.kind,
                    a.id,
                    output::duration(left)
                )),
                Shown::Line(format!(
                    "[approval] approve: {} approvals approve {}",
                    self.command, a.id
                )),
                Shown::Line(format!(
                    "[approval] deny:    {} approvals deny {} --reason \"…\"",
                    self.command, a.id
                )),
            ]);
            return;
        }
        self.waiting.remove(&a.id);
        let state = warden_cli::approvals::state_name(a);
        let by = match a.state() {
            pb::ApprovalState::NoResponse => "nobody answered in time".to_string(),
            pb::ApprovalState::Revoked => "the task gave it up".to_string(),
            _ if a.answered_by.is_empty() => String::new(),
            _ => format!("by {}", a.answered_by),
        };
        let reason = if a.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", a.reason)
        };
        self.show(&[Shown::Line(format!(
            "[approval] {} {state} {by}{reason}",
            a.id
        ))]);
    }
}

/// The approver's requests for one task, as they are held and decided (its `Watch`, filtered
/// to the task). Nothing arrives when no approver answers on the socket.
fn watch_approvals(
    socket: PathBuf,
    task_id: String,
) -> tokio::sync::mpsc::UnboundedReceiver<pb::Approval> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let Ok(mut c) = warden_cli::approvals::client(&socket).await else {
            return;
        };
        let Ok(stream) = c.watch(pb::WatchRequest {}).await else {
            return;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(ev)) = stream.message().await {
            let Some(a) = ev.approval else { continue };
            let ours = a
                .request
                .as_ref()
                .and_then(|r| r.subject.as_ref())
                .is_some_and(|s| s.task_id == task_id);
            if ours && tx.send(a).is_err() {
                return;
            }
        }
    });
    rx
}

/// The supervisor's incident record of this task, in the local deployment's state directory
/// (records written since `send` started; the newest when there are several).
fn incident_of(layout: &Layout, task_id: &str, since_ms: u64) -> Option<PathBuf> {
    // The supervisor's file label of a caller's id (records::label): 32 safe characters.
    let label: String = task_id
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = layout.state_of("supervisor").join("incidents");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            // `<at_unix_ms>-<class>-<random>.json`: older records are not read at all.
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('-').next()?.parse::<u64>().ok())
                .is_some_and(|at| at + 1000 >= since_ms)
        })
        .filter(|p| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["turn_label"].as_str() == Some(label.as_str()))
        })
        .collect();
    found.sort();
    found.pop()
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
        context_id: None,
        patch: None,
        state: String::new(),
        refused: false,
        interrupt: None,
    };
    let mut cancel: Option<Cancel> = None;
    // A second signal: stop waiting for the end, including for the cancel's answer.
    let mut gave_up = false;
    // This task's requests held by the local approver, once the task has an id.
    let mut approvals: Option<tokio::sync::mpsc::UnboundedReceiver<pb::Approval>> = None;
    let mut ticks = tokio::time::interval(Duration::from_millis(125));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        if let (Some(c), Some(id)) = (cancel.as_mut(), end.task_id.as_deref()) {
            c.send(addr, token, id, view);
        }
        if approvals.is_none()
            && let (Some(socket), Some(id)) = (view.approver.clone(), end.task_id.clone())
        {
            approvals = Some(watch_approvals(socket, id));
        }
        let deadline = cancel.as_ref().map(|c| c.deadline);
        let sse = tokio::select! {
            sse = events.next() => sse,
            _ = ticks.tick(), if view.tty => {
                view.tick();
                continue;
            }
            a = async {
                match approvals.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                match a {
                    Some(a) => view.approval(&a),
                    // The watch ended (no approver, or it stopped): nothing more to show.
                    None => view.approver = None,
                }
                continue;
            }
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
        view.event(&ev);
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
            end.context_id = r.context_id.clone();
        }
        if r.patch.is_some() {
            end.patch = r.patch.clone();
        }
        end.refused |= r.refused;
        if !view.json {
            view.show(&r.shown);
            if let Some((id, diff)) = r.diff
                && view.diffs_shown.insert(id)
            {
                view.show(&[Shown::Block(diff)]);
            }
        }
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
    let json = args.json;
    match send(layout, args).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("warden send: {e}");
            if json {
                // A script reading the lines learns the end the same way as any other.
                output::print_line(&json!({"type": "end", "error": e.to_string(), "exitCode": 2}));
            }
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
    let (addr, token) = client::locate(layout, args.url.as_deref(), args.token_file.as_deref())?;
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
    let mut warden = serde_json::Map::new();
    if let Some(dir) = &args.copy_from {
        warden.insert("copyFrom".into(), json!(copy_source(dir)?));
    }
    for (key, v) in [
        ("workspace", &args.workspace),
        ("model", &args.model),
        ("effort", &args.effort),
        ("mode", &args.mode),
    ] {
        if let Some(v) = v {
            warden.insert(key.into(), json!(v));
        }
    }
    if !warden.is_empty() {
        if !message["metadata"].is_object() {
            message["metadata"] = json!({});
        }
        message["metadata"]["warden"] = Value::Object(warden);
    }
    let mut view = View::new(layout, args.json);
    let since_ms = warden_cli::approvals::now_ms();
    let mut refused = false;
    loop {
        let end = stream(&addr, &token, message, &mut view, &mut signals).await;
        view.settle();
        let end = end?;
        refused |= end.refused;
        if !is_final(&end.state) && end.interrupt.is_none() {
            eprintln!("warden send: the stream ended before the task did");
        }
        if end.state != "TASK_STATE_INPUT_REQUIRED" || end.interrupt.is_some() {
            let code = exit_code(&end.state, refused, end.interrupt);
            // A fault's record is written before the task's end is told: it is there now.
            let incident = end
                .task_id
                .as_deref()
                .filter(|_| is_terminal(&end.state))
                .and_then(|id| incident_of(layout, id, since_ms));
            // The change the task made, kept on disk for the person and for `git apply`.
            let patch = match (&end.patch, end.task_id.as_deref()) {
                (Some(a), Some(id)) => crate::tasks::decode(id, a)
                    .and_then(|d| Ok((crate::tasks::save_diff(layout, id, &d.text)?, d)))
                    .map_err(|e| eprintln!("warden send: {e}"))
                    .ok(),
                _ => None,
            };
            if view.json {
                output::print_line(&json!({
                    "type": "end", "taskId": end.task_id, "contextId": end.context_id,
                    "state": end.state, "exitCode": code, "refused": refused,
                    "incident": incident.as_ref().map(|p| p.display().to_string()),
                    "diff": patch.as_ref().map(|(p, _)| p.display().to_string()),
                    "filesChanged": patch.as_ref().map(|(_, d)| d.files.clone()).unwrap_or_default(),
                }));
                return Ok(code);
            }
            if let Some((path, d)) = &patch {
                let id = end.task_id.as_deref().unwrap_or("");
                view.show(&[Shown::Line(format!(
                    "[diff] changed {}{}: `warden tasks diff {short}` shows it, `warden tasks apply {short} -C DIR` applies it (saved as {})",
                    warden_terminal_text::inline(&d.files.join(", ")),
                    if d.cut { " (cut at its cap)" } else { "" },
                    path.display(),
                    short = crate::tasks::short(id),
                ))]);
            }
            if let Some(p) = incident {
                view.show(&[Shown::Line(format!(
                    "[incident] what went wrong is recorded in {}",
                    p.display()
                ))]);
            }
            return Ok(code);
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
    fn edits_in_a_tool_calls_raw_input_are_shown_as_diffs() {
        let edit = edit_diff(&json!({"file_path": "/r/a.txt",
            "old_string": "one\ntwo\nthree\n", "new_string": "one\n2\nthree\n"}))
        .unwrap();
        assert_eq!(
            edit,
            "--- /r/a.txt\n+++ /r/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
        );
        let write = edit_diff(&json!({"file_path": "/r/b.txt", "content": "hi\n"})).unwrap();
        assert!(
            write.contains("+++ /r/b.txt (the whole content written"),
            "{write}"
        );
        assert!(write.ends_with("+hi\n"), "{write}");
        let codex = edit_diff(&json!({"changes": {
            "/r/c.txt": {"add": {"content": "new\n"}},
            "/r/d.txt": {"type": "update", "unified_diff": "@@ -1 +1 @@\n-a\n+b\n"},
            "/r/e.txt": {"delete": {}}}}))
        .unwrap();
        assert!(
            codex.contains("+++ /r/c.txt (new file)\n@@ -0,0 +1 @@\n+new\n"),
            "{codex}"
        );
        assert!(
            codex.contains("--- /r/d.txt\n+++ /r/d.txt\n@@ -1 +1 @@\n-a\n+b\n"),
            "{codex}"
        );
        assert!(
            codex.contains("--- /r/e.txt\n+++ /dev/null (deleted)"),
            "{codex}"
        );
        assert_eq!(edit_diff(&json!({"command": "ls"})), None);
        let long: String = (0..200).map(|i| format!("{i}\n")).collect();
        let cut = edit_diff(&json!({"file_path": "/r/f", "content": long})).unwrap();
        assert_eq!(cut.lines().count(), MAX_DIFF_LINES + 1, "{cut}");
        assert!(cut.contains("more lines of the diff"), "{cut}");
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
