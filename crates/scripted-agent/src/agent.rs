//! The agent side of the wire: stdin reader, stdout writer, sessions, and the
//! agent's own requests to the client.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use crate::scenario::Scenario;
use crate::vocab::Vocab;

/// Process-wide settings from the command line.
pub struct Config {
    pub vocabulary: Vocab,
    pub report: Option<PathBuf>,
    pub ignore_stdin_eof: bool,
    pub file_scenario: Option<Scenario>,
}

pub enum Out {
    Line(Vec<u8>),
    Flush(oneshot::Sender<()>),
}

pub struct SessionState {
    pub vocab: Vocab,
    pub mode: String,
    /// Tool keys the user allowed "for the session" / "always".
    pub remembered: HashSet<String>,
    /// `(is_user, text)` for `session/load` replay.
    pub history: Vec<(bool, String)>,
    pub prompts: usize,
    /// The model and thought level (`session/set_config_option`), reported by `report_config`.
    pub model: String,
    pub thought_level: String,
    /// The `after_turn` steps running in the background (after their turn was answered), and
    /// the message lines they would have sent, for `after_turn_report` in a later turn.
    pub after_turn: Option<tokio::task::JoinHandle<()>>,
    pub after_turn_log: Vec<String>,
}

/// The models and thought levels the scripted agent offers as session config options, like the
/// real adapters do (the first of each is the default).
pub const MODELS: &[(&str, &str)] = &[("scripted-default", "Default"), ("scripted-large", "Large")];
pub const THOUGHT_LEVELS: &[&str] = &["medium", "low", "high", "xhigh"];

pub struct Session {
    pub id: String,
    pub cwd: PathBuf,
    pub state: Mutex<SessionState>,
    /// `true` once the client sent `session/cancel` for the current turn.
    pub cancel: watch::Sender<bool>,
}

impl Session {
    pub fn st(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What runs one `session/prompt` (the turn): given by `main.rs`, so this wire layer never
/// imports the turn logic that sits on top of it.
pub type OnPrompt = fn(
    Arc<Agent>,
    Arc<Session>,
    Value,
    Value,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pub struct Agent {
    pub cfg: Config,
    on_prompt: OnPrompt,
    out: mpsc::UnboundedSender<Out>,
    pending: Mutex<HashMap<String, oneshot::Sender<Result<Value, Value>>>>,
    next_id: AtomicU64,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    client_caps: Mutex<Value>,
    /// Set by an inline scenario asking to ignore stdin EOF.
    pub ignore_eof: AtomicBool,
    /// Set by a `flood` step with `stop_reading`: stdin is not read any more.
    pub stop_reading: watch::Sender<bool>,
}

impl Agent {
    pub fn send(&self, v: &Value) {
        let _ = self.out.send(Out::Line(v.to_string().into_bytes()));
    }

    pub fn raw(&self, line: Vec<u8>) {
        let _ = self.out.send(Out::Line(line));
    }

    /// Wait until everything queued so far is on stdout.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.out.send(Out::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    pub fn update(&self, session_id: &str, update: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session_id, "update": update}}));
    }

    pub fn respond(&self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    pub fn respond_err(&self, id: &Value, error: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "error": error}));
    }

    /// Send a request to the client; returns its id and the answer receiver.
    pub fn call(
        &self,
        method: &str,
        params: Value,
        string_id: bool,
    ) -> (Value, oneshot::Receiver<Result<Value, Value>>) {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = if string_id {
            Value::from(uuid::Uuid::new_v4().to_string())
        } else {
            Value::from(n)
        };
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.to_string(), tx);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        (id, rx)
    }

    /// A request whose answer is awaited plainly (fs/terminal).
    pub async fn call_wait(&self, method: &str, params: Value) -> Result<Value, String> {
        let (_, rx) = self.call(method, params, false);
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!(
                "{method} failed: {}",
                e.get("message").and_then(Value::as_str).unwrap_or("error")
            )),
            Err(_) => Err(format!("{method}: no answer")),
        }
    }

    pub fn client_caps(&self) -> Value {
        lock(&self.client_caps).clone()
    }

    pub fn cap(&self, pointer: &str) -> bool {
        let caps = self.client_caps();
        match caps.pointer(pointer) {
            Some(Value::Bool(b)) => *b,
            Some(Value::Null) | None => false,
            Some(_) => true,
        }
    }

    /// Append one JSON line to the permission report.
    pub fn report(&self, session: &Session, scenario_report: Option<&str>, line: &Value) {
        let path = scenario_report
            .map(|p| session.cwd.join(p))
            .or_else(|| self.cfg.report.clone());
        match path {
            Some(p) => {
                let res = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .and_then(|mut f| {
                        use std::io::Write;
                        // One write per line: `writeln!` on an unbuffered file issues a write per
                        // formatting fragment (about a hundred), which distorted the measured
                        // round trips this report exists for.
                        let mut buf = line.to_string();
                        buf.push('\n');
                        f.write_all(buf.as_bytes())
                    });
                if let Err(e) = res {
                    eprintln!(
                        "warden-scripted-agent: cannot write report {}: {e}",
                        p.display()
                    );
                }
            }
            None => eprintln!("{line}"),
        }
    }

    fn session(&self, params: &Value) -> Result<Arc<Session>, Value> {
        let id = params
            .get("sessionId")
            .and_then(Value::as_str)
            .unwrap_or("");
        lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| json!({"code": -32002, "message": format!("unknown session {id:?}")}))
    }

    fn modes_json(vocab: Vocab, current: &str) -> Value {
        Self::session_json(vocab, current, MODELS[0].0, THOUGHT_LEVELS[0])
    }

    /// Modes and the complete config option list (mode, model, thought level).
    fn session_json(vocab: Vocab, current: &str, model: &str, thought: &str) -> Value {
        let modes: Vec<Value> = vocab
            .modes()
            .iter()
            .map(|(id, name)| json!({"id": id, "name": name}))
            .collect();
        let options: Vec<Value> = vocab
            .modes()
            .iter()
            .map(|(id, name)| json!({"value": id, "name": name}))
            .collect();
        json!({
            "modes": {"currentModeId": current, "availableModes": modes},
            "configOptions": [{"id": "mode", "name": "Mode", "category": "mode", "type": "select",
                               "currentValue": current, "options": options},
                              {"id": "model", "name": "Model", "category": "model", "type": "select",
                               "currentValue": model,
                               "options": MODELS.iter().map(|(v, n)| json!({"value": v, "name": n})).collect::<Vec<_>>()},
                              {"id": "reasoning_effort", "name": "Reasoning effort", "category": "thought_level",
                               "type": "select", "currentValue": thought,
                               "options": THOUGHT_LEVELS.iter().map(|v| json!({"value": v, "name": v})).collect::<Vec<_>>()}],
        })
    }

    fn on_request(self: &Arc<Self>, id: Value, method: &str, params: Value) {
        match method {
            "initialize" => {
                *lock(&self.client_caps) = params
                    .get("clientCapabilities")
                    .cloned()
                    .unwrap_or(Value::Null);
                self.respond(
                    &id,
                    json!({
                        "protocolVersion": 1,
                        "agentCapabilities": {"loadSession": true,
                            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                            "mcpCapabilities": {"http": false, "sse": false}},
                        "agentInfo": {"name": "warden-scripted-agent", "title": "warden scripted agent",
                                      "version": env!("CARGO_PKG_VERSION")},
                        "authMethods": [],
                    }),
                );
            }
            "authenticate" => self.respond(&id, json!({})),
            "session/new" => {
                let Some(cwd) = params.get("cwd").and_then(Value::as_str).map(PathBuf::from) else {
                    return self
                        .respond_err(&id, json!({"code": -32602, "message": "cwd is required"}));
                };
                if !cwd.is_absolute() {
                    return self.respond_err(
                        &id,
                        json!({"code": -32602, "message": "cwd must be absolute"}),
                    );
                }
                let fs = self.cfg.file_scenario.as_ref();
                let vocab = fs.and_then(|s| s.vocabulary).unwrap_or(self.cfg.vocabulary);
                let mode = match fs.and_then(|s| s.initial_mode.as_deref()) {
                    Some("adapter") => vocab.adapter_initial_mode().to_string(),
                    Some(m) => m.to_string(),
                    None => vocab.prompting_mode().to_string(),
                };
                let sid = format!("sess-{}", uuid::Uuid::new_v4());
                let mut result = Self::modes_json(vocab, &mode);
                result["sessionId"] = Value::from(sid.clone());
                let session = Arc::new(Session {
                    id: sid.clone(),
                    cwd,
                    state: Mutex::new(SessionState {
                        vocab,
                        mode,
                        remembered: HashSet::new(),
                        history: Vec::new(),
                        prompts: 0,
                        model: MODELS[0].0.to_string(),
                        thought_level: THOUGHT_LEVELS[0].to_string(),
                        after_turn: None,
                        after_turn_log: Vec::new(),
                    }),
                    cancel: watch::channel(false).0,
                });
                lock(&self.sessions).insert(sid, session);
                self.respond(&id, result);
            }
            "session/load" => match self.session(&params) {
                Err(e) => self.respond_err(&id, e),
                Ok(s) => {
                    let (history, vocab, mode) = {
                        let st = s.st();
                        (st.history.clone(), st.vocab, st.mode.clone())
                    };
                    for (user, text) in history {
                        let kind = if user {
                            "user_message_chunk"
                        } else {
                            "agent_message_chunk"
                        };
                        self.update(&s.id, json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}));
                    }
                    let mut r = Self::modes_json(vocab, &mode);
                    r.as_object_mut().map(|o| o.remove("configOptions"));
                    self.respond(&id, r);
                }
            },
            "session/set_mode" => {
                match self.session(&params) {
                    Err(e) => self.respond_err(&id, e),
                    Ok(s) => {
                        let mode = params.get("modeId").and_then(Value::as_str).unwrap_or("");
                        let mut st = s.st();
                        if st.vocab.modes().iter().any(|(m, _)| *m == mode) {
                            st.mode = mode.to_string();
                            drop(st);
                            self.respond(&id, json!({}));
                        } else {
                            drop(st);
                            self.respond_err(&id, json!({"code": -32602, "message": format!("unknown mode {mode:?}")}));
                        }
                    }
                }
            }
            "session/set_config_option" => match self.session(&params) {
                Err(e) => self.respond_err(&id, e),
                Ok(s) => {
                    let config = params.get("configId").and_then(Value::as_str).unwrap_or("");
                    let value = params.get("value").and_then(Value::as_str).unwrap_or("");
                    let mut st = s.st();
                    let ok = match config {
                        "mode" if st.vocab.modes().iter().any(|(m, _)| *m == value) => {
                            st.mode = value.to_string();
                            true
                        }
                        "model" if MODELS.iter().any(|(m, _)| *m == value) => {
                            st.model = value.to_string();
                            true
                        }
                        "reasoning_effort" if THOUGHT_LEVELS.contains(&value) => {
                            st.thought_level = value.to_string();
                            true
                        }
                        _ => false,
                    };
                    let all = Self::session_json(st.vocab, &st.mode, &st.model, &st.thought_level);
                    drop(st);
                    if ok {
                        self.respond(&id, json!({"configOptions": all["configOptions"]}));
                    } else {
                        self.respond_err(&id, json!({"code": -32602, "message": format!("unknown value {value:?} for {config:?}")}));
                    }
                }
            },
            "session/prompt" => match self.session(&params) {
                Err(e) => self.respond_err(&id, e),
                Ok(s) => {
                    let agent = self.clone();
                    tokio::spawn((self.on_prompt)(agent, s, id, params));
                }
            },
            other => self.respond_err(
                &id,
                json!({"code": -32601, "message": format!("method not found: {other}")}),
            ),
        }
    }

    fn on_notification(&self, method: &str, params: &Value) {
        if method == "session/cancel"
            && let Ok(s) = self.session(params)
        {
            eprintln!("warden-scripted-agent: session/cancel for {}", s.id);
            s.cancel.send_replace(true);
        }
    }

    fn on_line(self: &Arc<Self>, line: &str) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            eprintln!("warden-scripted-agent: ignoring a line that is not JSON");
            return;
        };
        let method = v.get("method").and_then(Value::as_str).map(str::to_string);
        let id = v.get("id").cloned();
        match (method, id) {
            (Some(m), Some(id)) => {
                let params = v.get("params").cloned().unwrap_or(Value::Null);
                self.on_request(id, &m, params)
            }
            (Some(m), None) => self.on_notification(&m, v.get("params").unwrap_or(&Value::Null)),
            (None, Some(id)) => {
                let tx = lock(&self.pending).remove(&id.to_string());
                let answer = match v.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                };
                match tx {
                    Some(tx) => {
                        let _ = tx.send(answer);
                    }
                    None => eprintln!("warden-scripted-agent: answer for unknown id {id}"),
                }
            }
            (None, None) => {
                eprintln!("warden-scripted-agent: ignoring a message with neither method nor id")
            }
        }
    }
}

async fn write_loop(mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut stdout = tokio::io::stdout();
    while let Some(msg) = rx.recv().await {
        match msg {
            Out::Line(mut l) => {
                l.push(b'\n');
                if stdout.write_all(&l).await.is_err() || stdout.flush().await.is_err() {
                    // The client is gone; nothing left to talk to.
                    std::process::exit(0);
                }
            }
            Out::Flush(ack) => {
                let _ = stdout.flush().await;
                let _ = ack.send(());
            }
        }
    }
}

pub async fn run(cfg: Config, on_prompt: OnPrompt) -> ExitCode {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(write_loop(rx));
    let ignore = cfg.ignore_stdin_eof;
    let agent = Arc::new(Agent {
        cfg,
        on_prompt,
        out: tx,
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        sessions: Mutex::new(HashMap::new()),
        client_caps: Mutex::new(Value::Null),
        ignore_eof: AtomicBool::new(ignore),
        stop_reading: watch::Sender::new(false),
    });
    let mut stop = agent.stop_reading.subscribe();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = tokio::select! {
            biased;
            // A hostile agent that asks and never reads the answers: stdin is left alone
            // from now on (the process lives until it is killed).
            _ = stop.wait_for(|s| *s) => std::future::pending::<Result<Option<String>, std::io::Error>>().await,
            l = lines.next_line() => l,
        };
        let Ok(Some(line)) = line else { break };
        if !line.trim().is_empty() {
            agent.on_line(&line);
        }
    }
    if agent.ignore_eof.load(Ordering::Relaxed) {
        eprintln!("warden-scripted-agent: stdin closed; ignoring it as asked");
        std::future::pending::<()>().await;
    }
    agent.flush().await;
    ExitCode::SUCCESS
}
