//! Test harness: a real agent process on real pipes, and a ClientHandler that
//! answers permissions from a script and serves fs/terminal inside a root.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use warden_acp::*;

/// How the test handler answers one permission request.
#[derive(Debug, Clone)]
pub enum Pick {
    /// The first offered option of this kind.
    Kind(PermissionOptionKind),
    /// This id, offered or not.
    Id(String),
    /// `{"outcome":"cancelled"}` without any session cancel.
    Cancelled,
    /// A JSON-RPC error.
    Error,
    /// Never answer (until the client cancels).
    Hang,
}

#[derive(Default)]
struct Term {
    output: String,
    exit: Option<TerminalExitStatus>,
}

pub struct TestHandler {
    picks: Mutex<VecDeque<Pick>>,
    default_pick: Pick,
    root: PathBuf,
    pub seen: Mutex<Vec<PermissionRequest>>,
    pub calls: Mutex<Vec<String>>,
    terms: Mutex<HashMap<String, watch::Receiver<Arc<Mutex<Term>>>>>,
    elicitation: Option<Value>,
}

impl TestHandler {
    pub fn new(root: &Path, picks: Vec<Pick>, default_pick: Pick) -> Arc<Self> {
        Arc::new(TestHandler {
            picks: Mutex::new(picks.into()),
            default_pick,
            root: root.canonicalize().unwrap(),
            seen: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            terms: Mutex::new(HashMap::new()),
            elicitation: Some(serde_json::json!({"answer": "blue"})),
        })
    }

    fn inside(&self, path: &str) -> Result<PathBuf, RpcError> {
        let p = PathBuf::from(path);
        if !p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(RpcError::invalid_params("path must be absolute without .."));
        }
        let parent = p.parent().and_then(|d| d.canonicalize().ok());
        match parent {
            Some(d) if d.starts_with(&self.root) => Ok(p),
            _ => Err(RpcError::invalid_params("path outside the session root")),
        }
    }

    fn log(&self, s: &str) {
        self.calls.lock().unwrap().push(s.to_string());
    }
}

impl ClientHandler for TestHandler {
    async fn request_permission(
        &self,
        req: PermissionRequest,
    ) -> Result<PermissionOutcome, RpcError> {
        self.seen.lock().unwrap().push(req.clone());
        let pick = self
            .picks
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| self.default_pick.clone());
        match pick {
            Pick::Kind(k) => match req.selectable_options().find(|o| o.kind == k) {
                Some(o) => Ok(PermissionOutcome::Selected {
                    option_id: o.option_id.clone(),
                }),
                None => Err(RpcError::internal(format!("no option of kind {k}"))),
            },
            Pick::Id(id) => Ok(PermissionOutcome::Selected { option_id: id }),
            Pick::Cancelled => Ok(PermissionOutcome::Cancelled),
            Pick::Error => Err(RpcError::internal("driver refuses")),
            Pick::Hang => std::future::pending().await,
        }
    }

    async fn read_text_file(&self, req: ReadTextFileRequest) -> Result<String, RpcError> {
        self.log("fs/read_text_file");
        let p = self.inside(&req.path)?;
        std::fs::read_to_string(p).map_err(|e| RpcError::not_found(e.to_string()))
    }

    async fn write_text_file(&self, req: WriteTextFileRequest) -> Result<(), RpcError> {
        self.log("fs/write_text_file");
        let p = self.inside(&req.path)?;
        std::fs::write(p, req.content).map_err(|e| RpcError::internal(e.to_string()))
    }

    async fn create_terminal(&self, req: CreateTerminalRequest) -> Result<String, RpcError> {
        self.log("terminal/create");
        let cwd = match &req.cwd {
            Some(c) => self
                .inside(&format!("{c}/x"))?
                .parent()
                .unwrap()
                .to_path_buf(),
            None => self.root.clone(),
        };
        let id = format!("term-{}", self.terms.lock().unwrap().len());
        let state = Arc::new(Mutex::new(Term::default()));
        let (tx, rx) = watch::channel(state.clone());
        self.terms.lock().unwrap().insert(id.clone(), rx);
        let mut cmd = Command::new(&req.command);
        cmd.args(&req.args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        tokio::spawn(async move {
            let out = cmd.output().await;
            {
                let mut t = state.lock().unwrap();
                match out {
                    Ok(o) => {
                        t.output = String::from_utf8_lossy(&o.stdout).into_owned()
                            + &String::from_utf8_lossy(&o.stderr);
                        t.exit = Some(TerminalExitStatus {
                            exit_code: o.status.code().map(|c| c as u32),
                            signal: None,
                        });
                    }
                    Err(e) => {
                        t.output = e.to_string();
                        t.exit = Some(TerminalExitStatus {
                            exit_code: Some(127),
                            signal: None,
                        });
                    }
                }
            }
            tx.send_modify(|_| {});
            // Keep the sender alive so receivers can still read the state.
            std::future::pending::<()>().await;
        });
        Ok(id)
    }

    async fn terminal_output(
        &self,
        req: TerminalRequest,
    ) -> Result<TerminalOutputResponse, RpcError> {
        self.log("terminal/output");
        let rx = self.terms.lock().unwrap().get(&req.terminal_id).cloned();
        let rx = rx.ok_or_else(|| RpcError::not_found("no such terminal"))?;
        let st = rx.borrow().clone();
        let t = st.lock().unwrap();
        Ok(TerminalOutputResponse {
            output: t.output.clone(),
            truncated: false,
            exit_status: t.exit.clone(),
        })
    }

    async fn wait_for_terminal_exit(
        &self,
        req: TerminalRequest,
    ) -> Result<TerminalExitStatus, RpcError> {
        self.log("terminal/wait_for_exit");
        let rx = self.terms.lock().unwrap().get(&req.terminal_id).cloned();
        let mut rx = rx.ok_or_else(|| RpcError::not_found("no such terminal"))?;
        loop {
            let done = rx.borrow().lock().unwrap().exit.clone();
            if let Some(e) = done {
                return Ok(e);
            }
            if rx.changed().await.is_err() {
                return Err(RpcError::internal("terminal vanished"));
            }
        }
    }

    async fn kill_terminal(&self, _req: TerminalRequest) -> Result<(), RpcError> {
        self.log("terminal/kill");
        Ok(())
    }

    async fn release_terminal(&self, req: TerminalRequest) -> Result<(), RpcError> {
        self.log("terminal/release");
        self.terms.lock().unwrap().remove(&req.terminal_id);
        Ok(())
    }

    async fn elicitation(&self, req: ElicitationRequest) -> Result<ElicitationResponse, RpcError> {
        self.log(&format!("elicitation: {}", req.message));
        Ok(match &self.elicitation {
            Some(c) => ElicitationResponse::Accept {
                content: c.clone(),
                message_id: None,
            },
            None => ElicitationResponse::Decline,
        })
    }
}

static BUILD: Once = Once::new();

/// Whether the agent's sources changed after the binary was built (a lone
/// `cargo test -p warden-acp` does not rebuild other packages' binaries).
fn stale(bin: &Path) -> bool {
    let built = match std::fs::metadata(bin).and_then(|m| m.modified()) {
        Ok(t) => t,
        Err(_) => return true,
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripted-agent/src");
    std::fs::read_dir(src)
        .map(|entries| {
            entries.flatten().any(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t > built)
            })
        })
        .unwrap_or(false)
}

/// Path of the scripted agent binary next to this test's target dir, built on
/// demand when missing (e.g. `cargo test -p warden-acp` alone).
pub fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    // target/<profile>/deps/<test> -> target/<profile>/warden-scripted-agent
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("warden-scripted-agent");
    BUILD.call_once(|| {
        if !bin.exists() || stale(&bin) {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "warden-scripted-agent"])
                .status()
                .expect("running cargo build -p warden-scripted-agent");
            assert!(
                status.success(),
                "cargo build -p warden-scripted-agent failed"
            );
        }
    });
    assert!(
        bin.exists(),
        "warden-scripted-agent not found at {}; run `cargo build -p warden-scripted-agent`",
        bin.display()
    );
    bin
}

pub struct Harness {
    pub client: AcpClient,
    pub events: AcpEvents,
    pub child: Child,
    pub handler: Arc<TestHandler>,
    pub dir: tempfile::TempDir,
    pub session: String,
}

pub fn config() -> ClientConfig {
    ClientConfig {
        request_timeout: Some(Duration::from_secs(20)),
        ..ClientConfig::default()
    }
}

/// Spawn `program args` on pipes (stderr inherited), connect a client.
pub fn connect(
    mut cmd: Command,
    handler: Arc<TestHandler>,
    dir: tempfile::TempDir,
    cfg: ClientConfig,
) -> Harness {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn agent");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (client, events) = AcpClient::connect(stdout, stdin, handler.clone(), cfg);
    Harness {
        client,
        events,
        child,
        handler,
        dir,
        session: String::new(),
    }
}

/// Scripted agent + initialize (all capabilities) + session/new.
pub async fn start(
    args: &[&str],
    picks: Vec<Pick>,
    default_pick: Pick,
    cfg: ClientConfig,
) -> Harness {
    start_caps(args, picks, default_pick, cfg, ClientCapabilities::all()).await
}

pub async fn start_caps(
    args: &[&str],
    picks: Vec<Pick>,
    default_pick: Pick,
    cfg: ClientConfig,
    caps: ClientCapabilities,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let handler = TestHandler::new(dir.path(), picks, default_pick);
    let mut cmd = Command::new(agent_bin());
    cmd.args(args).current_dir(dir.path());
    let mut h = connect(cmd, handler, dir, cfg);
    let init = h.client.initialize(caps).await.expect("initialize");
    assert_eq!(init.protocol_version, 1);
    let s = h
        .client
        .new_session(&h.dir.path().canonicalize().unwrap())
        .await
        .expect("session/new");
    h.session = s.session_id;
    h
}

impl Harness {
    pub fn cwd(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    /// Everything received so far (all updates of a finished prompt are
    /// already queued when its response has been read).
    pub fn drain(&mut self) -> Vec<AcpEvent> {
        let mut v = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            v.push(e);
        }
        v
    }

    pub async fn prompt(&self, text: &str) -> Result<PromptResponse, AcpError> {
        tokio::time::timeout(
            Duration::from_secs(30),
            self.client.prompt(&self.session, text, Value::Null),
        )
        .await
        .expect("prompt timed out")
    }

    pub fn report_lines(&self, name: &str) -> Vec<Value> {
        std::fs::read_to_string(self.cwd().join(name))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("report line is JSON"))
            .collect()
    }
}

pub fn updates(events: &[AcpEvent]) -> Vec<SessionEvent> {
    events
        .iter()
        .filter_map(|e| match e {
            AcpEvent::Update(n) => Some(n.event.clone()),
            _ => None,
        })
        .collect()
}

pub fn messages(events: &[AcpEvent]) -> Vec<String> {
    updates(events)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::AgentMessageChunk(c) => c.content.as_text().map(str::to_string),
            _ => None,
        })
        .collect()
}

pub fn kinds(events: &[AcpEvent]) -> Vec<&'static str> {
    updates(events).iter().map(|e| e.kind()).collect()
}
