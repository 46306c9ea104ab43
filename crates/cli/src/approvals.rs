//! `warden approvals list|show|approve|deny|history|watch`: people answering what the policy
//! escalated, through warden-approver's admin socket (the kernel tells it who asks: the peer uid
//! is recorded as who answered).

use std::path::Path;

use tonic::transport::Channel;
use warden_proto::v1 as pb;
use warden_proto::v1::approval_service_client::ApprovalServiceClient;

#[derive(Debug, thiserror::Error)]
pub enum ApprovalsError {
    #[error("{0} (is warden-approver running? `warden up --approver`)")]
    Connect(#[from] warden_daemon::client::ConnectError),
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    #[error("terminal: {0}")]
    Terminal(String),
}

impl ApprovalsError {
    /// The exit code: 3 when the request does not exist, 4 when someone answered first, 1 else.
    pub fn exit_code(&self) -> u8 {
        match self {
            ApprovalsError::Rpc(s) if s.code() == tonic::Code::NotFound => 3,
            ApprovalsError::Rpc(s) if s.code() == tonic::Code::FailedPrecondition => 4,
            _ => 1,
        }
    }
}

pub async fn client(socket: &Path) -> Result<ApprovalServiceClient<Channel>, ApprovalsError> {
    Ok(ApprovalServiceClient::new(
        warden_daemon::client::connect_unix(socket).await?,
    ))
}

pub use crate::output::{now_ms, state_name};

fn tool(a: &pb::Approval) -> pb::ToolCall {
    a.request
        .as_ref()
        .and_then(|r| r.tool_call.clone())
        .unwrap_or_default()
}

fn subject(a: &pb::Approval) -> pb::Subject {
    a.request
        .as_ref()
        .and_then(|r| r.subject.clone())
        .unwrap_or_default()
}

/// One line: id, state, time left (or who answered), agent, principal, kind and title.
pub fn line(a: &pb::Approval) -> String {
    let t = tool(a);
    let s = subject(a);
    let when = if a.state() == pb::ApprovalState::Pending {
        format!(
            "{} left",
            crate::output::duration(a.deadline_unix_ms.saturating_sub(now_ms()).div_ceil(1000))
        )
    } else if a.state() == pb::ApprovalState::Withdrawn {
        format!("approved by {}, not enforced", a.answered_by)
    } else {
        format!("by {}", a.answered_by)
    };
    let shown = format!(
        "{}  {:<11} {:<12} agent={} principal={} {} {:?}",
        a.id,
        state_name(a),
        when,
        s.agent,
        s.principal,
        t.kind,
        t.title
    );
    // One request, one line, whatever the agent put in its title or the caller in its ids.
    warden_terminal_text::inline(&shown).into_owned()
}

/// Every field a person needs to decide, the raw input pretty-printed.
pub fn detail(a: &pb::Approval) -> String {
    let t = tool(a);
    let s = subject(a);
    let root = a
        .request
        .as_ref()
        .and_then(|r| r.boundary.clone())
        .unwrap_or_default();
    let raw = serde_json::from_str::<serde_json::Value>(&t.raw_input_json)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| t.raw_input_json.clone());
    let locations: Vec<String> = t
        .locations
        .iter()
        .map(|l| {
            let p = Path::new(&l.path);
            p.strip_prefix(&root.root)
                .map(|r| r.display().to_string())
                .unwrap_or_else(|_| l.path.clone())
        })
        .collect();
    let mut out = vec![
        format!("id              {}", a.id),
        format!("state           {}", state_name(a)),
        format!("tool            {} {:?}", t.kind, t.title),
        format!("locations       {}", locations.join(", ")),
        format!(
            "boundary        {} (owned {}, execute {})",
            root.root, root.owned, root.allow_execute
        ),
        format!(
            "escalated by    {}: {}",
            a.escalated_rule, a.escalated_reason
        ),
        format!("agent/principal {} / {}", s.agent, s.principal),
        format!("context/task    {} / {}", s.context_id, s.task_id),
        format!(
            "created         {}",
            crate::output::local_time(a.created_unix_ms)
        ),
        format!(
            "deadline        {}",
            crate::output::local_time(a.deadline_unix_ms)
        ),
    ];
    if a.state() != pb::ApprovalState::Pending {
        out.push(format!("answered by     {}", a.answered_by));
        out.push(format!(
            "time to decide  {} ms",
            a.answered_unix_ms.saturating_sub(a.created_unix_ms)
        ));
        out.push(format!("rule            {}", a.rule));
        out.push(format!("reason          {}", a.reason));
    }
    if a.state() == pb::ApprovalState::Withdrawn {
        out.push(format!(
            "enforced        DENY: the caller withdrew the request after the approval ({}) at {} ms",
            a.withdrawn_reason, a.withdrawn_unix_ms
        ));
    }
    // What an approval is bound to: the supervisor lets through only this command or content.
    let j = a.judged.clone().unwrap_or_default();
    out.push(format!("binds           {}", j.digest));
    if !j.argv.is_empty() {
        let line: Vec<String> = j.argv.iter().map(|w| format!("{w:?}")).collect();
        out.push(format!(
            "runs exactly    [{}] in {}",
            line.join(", "),
            j.cwd
        ));
    }
    if !j.content_sha256.is_empty() {
        out.push(format!("content sha256  {}", j.content_sha256));
    }
    // Each field one line; the raw input is prose (pretty-printed JSON keeps its lines), every
    // other control character the agent wrote shown escaped.
    let mut out: Vec<String> = out
        .iter()
        .map(|l| warden_terminal_text::inline(l).into_owned())
        .collect();
    out.push("raw input:".into());
    out.push(warden_terminal_text::block(&raw).into_owned());
    out.join("\n")
}

/// `list` / `history`: one line each, or (`json`) one JSON array.
pub async fn list(
    socket: &Path,
    history: bool,
    limit: u32,
    json: bool,
    command: &str,
) -> Result<(), ApprovalsError> {
    let mut c = client(socket).await?;
    let req = pb::ListApprovalsRequest { limit };
    let got = if history {
        c.history(req).await?
    } else {
        c.list(req).await?
    }
    .into_inner()
    .approvals;
    if json {
        let all: Vec<serde_json::Value> = got
            .iter()
            .map(|a| crate::output::approval_json(a, command))
            .collect();
        crate::output::print_doc(&serde_json::Value::Array(all));
        return Ok(());
    }
    if got.is_empty() && !history {
        println!("no pending requests");
    }
    for a in &got {
        println!("{}", line(a));
    }
    Ok(())
}

pub async fn show(
    socket: &Path,
    id: &str,
    json: bool,
    command: &str,
) -> Result<(), ApprovalsError> {
    let mut c = client(socket).await?;
    let a = c
        .get(pb::GetApprovalRequest { id: id.to_string() })
        .await?
        .into_inner();
    if json {
        crate::output::print_doc(&crate::output::approval_json(&a, command));
    } else {
        println!("{}", detail(&a));
    }
    Ok(())
}

/// `watch -o json`: the pending requests, then every change, one JSON object a line (no keys:
/// a script answers with `approvals approve|deny`).
pub async fn watch_json(socket: &Path, command: &str) -> Result<(), ApprovalsError> {
    let mut c = client(socket).await?;
    let mut stream = c.watch(pb::WatchRequest {}).await?.into_inner();
    while let Some(ev) = stream.message().await? {
        if let Some(a) = ev.approval {
            crate::output::print_line(&crate::output::approval_json(&a, command));
        }
    }
    Ok(())
}

pub async fn answer(
    socket: &Path,
    id: &str,
    verdict: pb::Verdict,
    reason: &str,
) -> Result<pb::Approval, ApprovalsError> {
    let mut c = client(socket).await?;
    Ok(c.answer(pb::AnswerRequest {
        id: id.to_string(),
        verdict: verdict as i32,
        reason: reason.to_string(),
    })
    .await?
    .into_inner())
}

/// Puts the terminal into single-key mode for the life of the value, and back afterwards.
struct KeyMode {
    saved: nix::sys::termios::Termios,
}

impl KeyMode {
    fn enter() -> Result<Self, ApprovalsError> {
        let saved = nix::sys::termios::tcgetattr(std::io::stdin())
            .map_err(|e| ApprovalsError::Terminal(e.to_string()))?;
        let m = KeyMode { saved };
        m.keys();
        Ok(m)
    }

    fn keys(&self) {
        use nix::sys::termios::{LocalFlags, SetArg, tcsetattr};
        let mut raw = self.saved.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO);
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &raw);
    }

    fn restore(&self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.saved,
        );
    }

    /// Back to line mode to read a reason, then single keys again.
    fn line(&self, keys: &mut tokio::sync::mpsc::Receiver<u8>) -> String {
        self.restore();
        // The key reader thread owns stdin: the reason arrives through it, up to Enter.
        let mut bytes = Vec::new();
        while let Some(b) = keys.blocking_recv() {
            if b == b'\n' {
                break;
            }
            bytes.push(b);
        }
        self.keys();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Streams pending requests and decisions as they happen. On a terminal, single keys answer the
/// selected request (the newest pending one unless `n` moved on).
pub async fn watch(socket: &Path) -> Result<(), ApprovalsError> {
    use std::io::{IsTerminal, Read};
    let mut c = client(socket).await?;
    let mut stream = c.watch(pb::WatchRequest {}).await?.into_inner();
    let interactive = std::io::stdin().is_terminal();
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<u8>(16);
    let mode = if interactive {
        let m = KeyMode::enter()?;
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            let mut stdin = std::io::stdin();
            while stdin.read_exact(&mut b).is_ok() {
                if keys_tx.blocking_send(b[0]).is_err() {
                    break;
                }
            }
        });
        eprintln!("keys: a approve, d deny, n next, q quit");
        Some(m)
    } else {
        drop(keys_tx);
        None
    };
    let mut pending: Vec<pb::Approval> = Vec::new();
    let mut selected: Option<String> = None;
    loop {
        tokio::select! {
            ev = stream.message() => {
                let Some(ev) = ev? else { return Ok(()) };
                let Some(a) = ev.approval else { continue };
                println!("{}", line(&a));
                pending.retain(|p| p.id != a.id);
                if a.state() == pb::ApprovalState::Pending {
                    selected = Some(a.id.clone());
                    pending.push(a);
                } else if selected.as_deref() == Some(a.id.as_str()) {
                    selected = pending.last().map(|p| p.id.clone());
                }
                if interactive && let Some(id) = &selected {
                    eprintln!("selected {id}");
                }
            }
            Some(k) = keys.recv(), if mode.is_some() => {
                match (k, selected.clone()) {
                    (b'q', _) => return Ok(()),
                    (b'n', Some(cur)) => {
                        let i = pending.iter().position(|p| p.id == cur).unwrap_or(0);
                        selected = pending.get((i + 1) % pending.len().max(1)).map(|p| p.id.clone());
                        if let Some(id) = &selected { eprintln!("selected {id}"); }
                    }
                    (b'a', Some(id)) => report(answer(socket, &id, pb::Verdict::Allow, "").await),
                    (b'd', Some(id)) => {
                        eprint!("reason for denying {id}: ");
                        let reason = match &mode {
                            Some(m) => tokio::task::block_in_place(|| m.line(&mut keys)),
                            None => String::new(),
                        };
                        report(answer(socket, &id, pb::Verdict::Deny, &reason).await);
                    }
                    (_, None) => eprintln!("nothing pending"),
                    _ => {}
                }
            }
        }
    }
}

fn report(r: Result<pb::Approval, ApprovalsError>) {
    match r {
        Ok(a) => eprintln!("answered: {}", line(&a)),
        Err(e) => eprintln!("not answered: {e}"),
    }
}
