//! The connection: one reader task, one writer task, a table of our pending
//! requests, and one spawned task per incoming agent request — at most
//! `max_incoming_requests` of them at once, their lines together at most
//! `max_incoming_bytes` (one more is answered with an error at once), and at most `max_queued_bytes` of lines waiting for the agent to read
//! its stdin (an agent that stops reading faults the connection instead of
//! growing the queue).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{AcpError, Fault};
use crate::handler::ClientHandler;
use crate::rpc::{self, Incoming, LineRead, RequestId, RpcError};
use crate::types::{
    ClientCapabilities, CreateTerminalRequest, ElicitationRequest, InitializeResponse,
    LoadSessionResponse, NewSessionResponse, PROTOCOL_VERSION, PermissionOutcome,
    PermissionRequest, PromptResponse, ReadTextFileRequest, SessionEvent, SessionNotification,
    StopReason, TerminalRequest, WriteTextFileRequest,
};

/// Default bound on one incoming line: 16 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Default bound on the agent's requests being handled at once.
pub const DEFAULT_MAX_INCOMING_REQUESTS: usize = 64;
/// Default bound on the bytes of the agent's requests being handled at once: 32 MiB.
pub const DEFAULT_MAX_INCOMING_BYTES: usize = 32 * 1024 * 1024;
/// Default bound on the bytes queued for the agent's stdin and not written yet: 32 MiB.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
/// Default bound on the bytes of the agent's updates queued for the caller and not taken: 64 MiB.
pub const DEFAULT_MAX_QUEUED_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// Which JSON type our outgoing request ids use (the agent must echo either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdStyle {
    /// `0, 1, 2, ...`
    #[default]
    Int,
    /// `"warden-0", "warden-1", ...`
    Str,
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest accepted incoming line; a longer one is a protocol fault.
    pub max_line_bytes: usize,
    /// Timeout for requests other than `session/prompt` (`None` = wait forever).
    pub request_timeout: Option<Duration>,
    /// How long [`AcpClient::cancel`] waits for the prompt response.
    pub cancel_deadline: Duration,
    /// Id type for our requests.
    pub id_style: IdStyle,
    /// `clientInfo.name`.
    pub client_name: String,
    /// `clientInfo.version`.
    pub client_version: String,
    /// Refuse (answer `-32603`) when the handler picks an option id that was
    /// not offered or has an unknown kind. Only tests turn this off, to see how
    /// an agent reacts to a bogus id.
    pub enforce_offered_options: bool,
    /// After this many lines that are not JSON-RPC, fault the connection
    /// (`None` = log them and keep going).
    pub max_malformed_lines: Option<u64>,
    /// How many permission timings are kept (oldest dropped first), so a
    /// long-lived connection does not grow without bound.
    pub permission_timing_capacity: usize,
    /// The agent's requests handled at once (each is a task holding its answer until it
    /// is queued); one more is answered at once with an error saying so, unhandled.
    pub max_incoming_requests: usize,
    /// Bytes of the lines of the agent's requests being handled at once (each task holds
    /// its request until it is answered): one more whose line would pass it is answered at
    /// once with an error, unhandled. One request alone is always handled, whatever its size
    /// (`max_line_bytes` bounds it).
    pub max_incoming_bytes: usize,
    /// Bytes queued for the agent's stdin and not written yet. A line that would pass it
    /// while the queue is not empty faults the connection (`Fault::InputNotRead`): the
    /// agent stopped reading what it asked for, and the queue must not hold the
    /// supervisor's memory for it. One line alone is always queued, whatever its size.
    pub max_queued_bytes: usize,
    /// Bytes of the agent's updates (and protocol errors) queued for the caller and not
    /// taken from [`AcpEvents`] yet (between turns nobody takes them). One more line past it
    /// faults the connection (`Fault::UpdatesNotTaken`): reading stops, so the agent, not the
    /// caller's memory, waits. One event alone is always queued.
    pub max_queued_event_bytes: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            request_timeout: Some(Duration::from_secs(60)),
            cancel_deadline: Duration::from_secs(10),
            id_style: IdStyle::Int,
            client_name: "warden".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            enforce_offered_options: true,
            max_malformed_lines: None,
            permission_timing_capacity: 4096,
            max_incoming_requests: DEFAULT_MAX_INCOMING_REQUESTS,
            max_incoming_bytes: DEFAULT_MAX_INCOMING_BYTES,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            max_queued_event_bytes: DEFAULT_MAX_QUEUED_EVENT_BYTES,
        }
    }
}

/// What the caller receives from [`AcpClient::connect`]'s event channel.
// Updates dominate the stream and are moved once; boxing them would cost an
// allocation per update for no benefit.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum AcpEvent {
    /// A typed `session/update`.
    Update(SessionNotification),
    /// A line that was not usable JSON-RPC, or a known update with a malformed
    /// body (logged, skipped; the connection goes on).
    ProtocolError(String),
    /// The connection is dead (sent once).
    Fault(Fault),
}

/// The receiving end of a connection's events, from [`AcpClient::connect`]. What it holds
/// counts against `ClientConfig::max_queued_event_bytes` until it is taken: drain it.
pub struct AcpEvents {
    rx: mpsc::UnboundedReceiver<(AcpEvent, usize)>,
    bytes: Arc<AtomicUsize>,
}

impl AcpEvents {
    /// The next event; `None` once the connection is gone and everything was taken.
    pub async fn recv(&mut self) -> Option<AcpEvent> {
        let (ev, n) = self.rx.recv().await?;
        self.bytes.fetch_sub(n, Ordering::AcqRel);
        Some(ev)
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Result<AcpEvent, mpsc::error::TryRecvError> {
        let (ev, n) = self.rx.try_recv()?;
        self.bytes.fetch_sub(n, Ordering::AcqRel);
        Ok(ev)
    }
}

/// How a permission request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    /// An option id.
    Selected(String),
    /// `{"outcome":"cancelled"}`.
    Cancelled,
    /// A JSON-RPC error with this code.
    Error(i64),
}

/// One permission round trip as seen by the client: from the request line
/// being read to the answer being queued for writing.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionTiming {
    /// Session.
    pub session_id: String,
    /// The agent's request id.
    pub request_id: RequestId,
    /// Tool call id from the request.
    pub tool_call_id: String,
    /// Wall clock time the request was received.
    pub received_at: SystemTime,
    /// Received -> answered.
    pub elapsed: Duration,
    /// The answer.
    pub answer: PermissionAnswer,
}

/// How a prompt turn ended, as seen by [`AcpClient::cancel`].
#[derive(Debug, Clone, PartialEq)]
pub enum PromptEnd {
    /// The agent answered with this stop reason (`cancelled` expected; `end_turn` happens).
    Answered(StopReason),
    /// The agent answered the prompt with an error.
    Failed(RpcError),
    /// The connection faulted first.
    Fault(Fault),
}

/// Result of waiting for the prompt after a cancel.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The prompt response arrived.
    PromptEnded(PromptEnd),
    /// It did not arrive before the deadline (the caller should kill the agent).
    DeadlineExpired,
    /// No prompt was in flight for that session.
    NoPromptInFlight,
}

/// What [`AcpClient::cancel`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelReport {
    /// Pending permission requests answered `cancelled`.
    pub permissions_cancelled: usize,
    /// How the prompt ended.
    pub outcome: CancelOutcome,
}

/// Counters for diagnostics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientStats {
    /// `session/update`s with an unknown variant (skipped).
    pub unknown_updates: u64,
    /// Lines that were not JSON-RPC.
    pub malformed_lines: u64,
    /// Responses for ids we never sent (or already answered).
    pub stray_responses: u64,
}

struct Pending {
    tx: oneshot::Sender<Result<Value, RpcError>>,
    prompt_session: Option<String>,
}

struct PromptTrack {
    id: RequestId,
    waiters: Vec<oneshot::Sender<PromptEnd>>,
}

struct IncomingEntry {
    /// The length of the line it came on (`max_incoming_bytes`).
    bytes: usize,
    session_id: Option<String>,
    is_permission: bool,
    cancel: Option<oneshot::Sender<()>>,
}

enum WriterMsg {
    Line(Vec<u8>),
    Close,
}

struct Inner {
    config: ClientConfig,
    out: mpsc::UnboundedSender<WriterMsg>,
    events: mpsc::UnboundedSender<(AcpEvent, usize)>,
    /// Bytes of events sent and not taken (`config.max_queued_event_bytes`).
    event_bytes: Arc<AtomicUsize>,
    next_id: AtomicI64,
    pending: Mutex<HashMap<RequestId, Pending>>,
    prompts: Mutex<HashMap<String, PromptTrack>>,
    incoming: Mutex<HashMap<RequestId, IncomingEntry>>,
    timings: Mutex<std::collections::VecDeque<PermissionTiming>>,
    advertised: Mutex<Option<ClientCapabilities>>,
    agent: Mutex<Option<InitializeResponse>>,
    fault: watch::Sender<Option<Fault>>,
    /// Bytes handed to the writer and not written yet (`config.max_queued_bytes`).
    queued_bytes: AtomicUsize,
    /// Set by `close_stdin`: nothing more can be sent (reading goes on).
    stdin_closed: std::sync::atomic::AtomicBool,
    unknown_updates: AtomicU64,
    malformed_lines: AtomicU64,
    stray_responses: AtomicU64,
}

/// Lock a mutex, recovering from poisoning: every critical section here only
/// moves map entries, so a panic elsewhere cannot leave them inconsistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn send_line(&self, line: Vec<u8>) {
        let n = line.len();
        let before = self.queued_bytes.fetch_add(n, Ordering::AcqRel);
        if before > 0 && before.saturating_add(n) > self.config.max_queued_bytes {
            // The agent is not reading its stdin: refuse to buffer for it (this line and the
            // queue are dropped with the writer, which stops at the fault).
            self.queued_bytes.fetch_sub(n, Ordering::AcqRel);
            self.set_fault(Fault::InputNotRead {
                limit: self.config.max_queued_bytes,
            });
            return;
        }
        // The writer task only goes away after a fault, which is recorded already.
        let _ = self.out.send(WriterMsg::Line(line));
    }

    /// Queues an event of about `n` bytes for the caller, within `config.max_queued_event_bytes`.
    fn event(&self, ev: AcpEvent, n: usize) {
        let before = self.event_bytes.fetch_add(n, Ordering::AcqRel);
        if before > 0 && before.saturating_add(n) > self.config.max_queued_event_bytes {
            self.event_bytes.fetch_sub(n, Ordering::AcqRel);
            self.set_fault(Fault::UpdatesNotTaken {
                limit: self.config.max_queued_event_bytes,
            });
            return;
        }
        if self.events.send((ev, n)).is_err() {
            self.event_bytes.fetch_sub(n, Ordering::AcqRel);
        }
    }

    fn current_fault(&self) -> Option<Fault> {
        self.fault.borrow().clone()
    }

    /// Record the first fault, fail every waiter, tell the caller.
    fn set_fault(&self, fault: Fault) {
        let first = self.fault.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(fault.clone());
                true
            } else {
                false
            }
        });
        if !first {
            return;
        }
        if matches!(fault, Fault::AgentClosed) && self.stdin_closed.load(Ordering::Relaxed) {
            // The end of an agent this client was stopping (its stdin closed first, then its
            // tree killed): the expected end, not a warning on every normal stop.
            tracing::debug!(%fault, "ACP connection closed after close_stdin");
        } else {
            tracing::warn!(%fault, "ACP connection fault");
        }
        // The event goes first, so a caller whose request fails below finds
        // the fault already queued behind the last update.
        let _ = self.events.send((AcpEvent::Fault(fault.clone()), 0));
        // Dropping the senders wakes the waiting callers, who read the fault.
        lock(&self.pending).clear();
        for (_, track) in lock(&self.prompts).drain() {
            for w in track.waiters {
                let _ = w.send(PromptEnd::Fault(fault.clone()));
            }
        }
    }

    fn malformed(&self, detail: String) {
        let count = self.malformed_lines.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::error!(%detail, "agent sent a line that is not JSON-RPC");
        let n = detail.len();
        self.event(AcpEvent::ProtocolError(detail), n);
        if let Some(max) = self.config.max_malformed_lines
            && count >= max
        {
            self.set_fault(Fault::Garbage { count });
        }
    }

    fn next_request_id(&self) -> RequestId {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        match self.config.id_style {
            IdStyle::Int => RequestId::Int(n),
            IdStyle::Str => RequestId::Str(format!("warden-{n}")),
        }
    }

    fn on_response(&self, id: RequestId, result: Result<Value, RpcError>) {
        let Some(p) = lock(&self.pending).remove(&id) else {
            self.stray_responses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(request_id = %id, "response for an unknown request id");
            return;
        };
        if let Some(session) = &p.prompt_session {
            let mut prompts = lock(&self.prompts);
            if prompts.get(session).is_some_and(|t| t.id == id)
                && let Some(track) = prompts.remove(session)
            {
                let end = match &result {
                    Ok(v) => match serde_json::from_value::<PromptResponse>(v.clone()) {
                        Ok(r) => PromptEnd::Answered(r.stop_reason),
                        Err(e) => PromptEnd::Failed(RpcError::internal(format!(
                            "malformed prompt response: {e}"
                        ))),
                    },
                    Err(e) => PromptEnd::Failed(e.clone()),
                };
                for w in track.waiters {
                    let _ = w.send(end.clone());
                }
            }
        }
        let _ = p.tx.send(result);
    }

    /// Answer every pending permission request of `session_id` with `cancelled`.
    fn cancel_permissions(&self, session_id: &str) -> usize {
        let mut n = 0;
        for entry in lock(&self.incoming).values_mut() {
            if entry.is_permission
                && entry.session_id.as_deref() == Some(session_id)
                && let Some(c) = entry.cancel.take()
                && c.send(()).is_ok()
            {
                n += 1;
            }
        }
        n
    }
}

/// A connection to one ACP agent. Cheap to clone; all clones share it.
///
/// Created with [`AcpClient::connect`] from the agent's stdout (reader), stdin
/// (writer), the caller's [`ClientHandler`] and a [`ClientConfig`]. Must be
/// created inside a tokio runtime.
#[derive(Clone)]
pub struct AcpClient {
    inner: Arc<Inner>,
}

impl AcpClient {
    /// Start the reader and writer tasks. Returns the client and the event
    /// receiver. Events are queued (up to `max_queued_event_bytes`) so the read loop never waits
    /// on the caller: drain the receiver.
    pub fn connect<R, W, H>(
        reader: R,
        writer: W,
        handler: Arc<H>,
        config: ClientConfig,
    ) -> (AcpClient, AcpEvents)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
        H: ClientHandler,
    {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let event_bytes = Arc::new(AtomicUsize::new(0));
        let (fault_tx, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            config,
            out: out_tx,
            events: ev_tx,
            event_bytes: event_bytes.clone(),
            next_id: AtomicI64::new(0),
            pending: Mutex::new(HashMap::new()),
            prompts: Mutex::new(HashMap::new()),
            incoming: Mutex::new(HashMap::new()),
            timings: Mutex::new(std::collections::VecDeque::new()),
            advertised: Mutex::new(None),
            agent: Mutex::new(None),
            fault: fault_tx,
            queued_bytes: AtomicUsize::new(0),
            stdin_closed: std::sync::atomic::AtomicBool::new(false),
            unknown_updates: AtomicU64::new(0),
            malformed_lines: AtomicU64::new(0),
            stray_responses: AtomicU64::new(0),
        });
        let fault_rx = inner.fault.subscribe();
        tokio::spawn(write_loop(writer, out_rx, fault_rx, Arc::downgrade(&inner)));
        tokio::spawn(read_loop(reader, inner.clone(), handler));
        (
            AcpClient { inner },
            AcpEvents {
                rx: ev_rx,
                bytes: event_bytes,
            },
        )
    }

    /// The fault, if the connection is dead.
    pub fn fault(&self) -> Option<Fault> {
        self.inner.current_fault()
    }

    /// Wait until the connection faults (agent exit, garbage, oversize, ...).
    pub async fn faulted(&self) -> Fault {
        let mut rx = self.inner.fault.subscribe();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                return Fault::ClosedByClient;
            }
        }
    }

    /// Close the agent's stdin (the polite first step of a shutdown).
    /// Later requests fail at once with `Fault::ClosedByClient`; updates and
    /// the answers to requests already sent are still read.
    pub fn close_stdin(&self) {
        self.inner.stdin_closed.store(true, Ordering::Relaxed);
        let _ = self.inner.out.send(WriterMsg::Close);
    }

    /// The recorded permission round trips (received -> answered), oldest
    /// first; at most `config.permission_timing_capacity` of them.
    pub fn permission_timings(&self) -> Vec<PermissionTiming> {
        lock(&self.inner.timings).iter().cloned().collect()
    }

    /// Like [`AcpClient::permission_timings`], and forget them.
    pub fn take_permission_timings(&self) -> Vec<PermissionTiming> {
        lock(&self.inner.timings).drain(..).collect()
    }

    /// Number of permission requests not answered yet (all sessions).
    pub fn pending_permissions(&self) -> usize {
        lock(&self.inner.incoming)
            .values()
            .filter(|e| e.is_permission)
            .count()
    }

    /// Diagnostic counters.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            unknown_updates: self.inner.unknown_updates.load(Ordering::Relaxed),
            malformed_lines: self.inner.malformed_lines.load(Ordering::Relaxed),
            stray_responses: self.inner.stray_responses.load(Ordering::Relaxed),
        }
    }

    /// The agent's `initialize` answer, once received.
    pub fn agent_info(&self) -> Option<InitializeResponse> {
        lock(&self.inner.agent).clone()
    }

    /// Send a raw request and wait for its result, up to `config.request_timeout`
    /// (use [`AcpClient::prompt`] for prompts: it has no timeout and is tracked
    /// for [`AcpClient::cancel`]).
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, AcpError> {
        self.request_inner(method, params, None).await
    }

    /// Send a notification.
    pub fn notify(&self, method: &str, params: Value) -> Result<(), AcpError> {
        if let Some(f) = self.fault() {
            return Err(AcpError::Fault(f));
        }
        if self.inner.stdin_closed.load(Ordering::Relaxed) {
            return Err(AcpError::Fault(Fault::ClosedByClient));
        }
        self.inner
            .send_line(rpc::notification_line(method, &params));
        Ok(())
    }

    async fn request_inner(
        &self,
        method: &str,
        params: Value,
        prompt_session: Option<String>,
    ) -> Result<Value, AcpError> {
        let inner = &self.inner;
        if let Some(f) = inner.current_fault() {
            return Err(AcpError::Fault(f));
        }
        if inner.stdin_closed.load(Ordering::Relaxed) {
            return Err(AcpError::Fault(Fault::ClosedByClient));
        }
        let id = inner.next_request_id();
        let (tx, rx) = oneshot::channel();
        lock(&inner.pending).insert(
            id.clone(),
            Pending {
                tx,
                prompt_session: prompt_session.clone(),
            },
        );
        let is_prompt = prompt_session.is_some();
        if let Some(session) = prompt_session {
            lock(&inner.prompts).insert(
                session,
                PromptTrack {
                    id: id.clone(),
                    waiters: Vec::new(),
                },
            );
        }
        // A fault between the first check and the insert drained the table
        // before our entry existed: check again.
        if let Some(f) = inner.current_fault() {
            lock(&inner.pending).remove(&id);
            return Err(AcpError::Fault(f));
        }
        tracing::debug!(request_id = %id, method, "ACP request");
        inner.send_line(rpc::request_line(&id, method, &params));
        let timeout = if is_prompt {
            None
        } else {
            inner.config.request_timeout
        };
        let received = match timeout {
            Some(d) => match tokio::time::timeout(d, rx).await {
                Ok(r) => r,
                Err(_) => {
                    lock(&inner.pending).remove(&id);
                    return Err(AcpError::Timeout {
                        method: method.to_string(),
                        millis: d.as_millis(),
                    });
                }
            },
            None => rx.await,
        };
        match received {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(error)) => Err(AcpError::Rpc {
                method: method.to_string(),
                error,
            }),
            Err(_) => Err(AcpError::Fault(
                inner.current_fault().unwrap_or(Fault::ClosedByClient),
            )),
        }
    }

    async fn typed<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
        prompt_session: Option<String>,
    ) -> Result<T, AcpError> {
        let v = self.request_inner(method, params, prompt_session).await?;
        serde_json::from_value(v).map_err(|e| AcpError::BadResponse {
            method: method.to_string(),
            detail: e.to_string(),
        })
    }

    /// `initialize`, advertising exactly `caps`. Fails if the agent answers a
    /// protocol version other than 1.
    pub async fn initialize(
        &self,
        caps: ClientCapabilities,
    ) -> Result<InitializeResponse, AcpError> {
        *lock(&self.inner.advertised) = Some(caps);
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": caps.to_value(),
            "clientInfo": {"name": self.inner.config.client_name, "version": self.inner.config.client_version},
        });
        let resp: InitializeResponse = self.typed("initialize", params, None).await?;
        if resp.protocol_version != PROTOCOL_VERSION {
            return Err(AcpError::Unsupported(format!(
                "protocol version {}",
                resp.protocol_version
            )));
        }
        *lock(&self.inner.agent) = Some(resp.clone());
        Ok(resp)
    }

    /// `session/new` with an absolute `cwd` and no MCP servers.
    pub async fn new_session(&self, cwd: &Path) -> Result<NewSessionResponse, AcpError> {
        let cwd = absolute(cwd)?;
        self.typed("session/new", json!({"cwd": cwd, "mcpServers": []}), None)
            .await
    }

    /// `session/load` (history is replayed as events before this returns).
    /// `Unsupported` if the agent did not advertise `loadSession`.
    pub async fn load_session(
        &self,
        session_id: &str,
        cwd: &Path,
    ) -> Result<LoadSessionResponse, AcpError> {
        let supported = lock(&self.inner.agent)
            .as_ref()
            .is_some_and(|a| a.agent_capabilities.load_session);
        if !supported {
            return Err(AcpError::Unsupported("session/load".into()));
        }
        let cwd = absolute(cwd)?;
        let v = self
            .request_inner(
                "session/load",
                json!({"sessionId": session_id, "cwd": cwd, "mcpServers": []}),
                None,
            )
            .await?;
        if v.is_null() {
            return Ok(LoadSessionResponse::default());
        }
        serde_json::from_value(v).map_err(|e| AcpError::BadResponse {
            method: "session/load".into(),
            detail: e.to_string(),
        })
    }

    /// `session/set_mode`.
    pub async fn set_mode(&self, session_id: &str, mode_id: &str) -> Result<(), AcpError> {
        self.request_inner(
            "session/set_mode",
            json!({"sessionId": session_id, "modeId": mode_id}),
            None,
        )
        .await
        .map(|_| ())
    }

    /// `session/set_config_option`; returns the agent's complete `configOptions` list after the
    /// change (`null` when the agent answered without one).
    pub async fn set_config_option(
        &self,
        session_id: &str,
        config_id: &str,
        value: &str,
    ) -> Result<Value, AcpError> {
        let v = self
            .request_inner(
                "session/set_config_option",
                json!({"sessionId": session_id, "configId": config_id, "value": value}),
                None,
            )
            .await?;
        Ok(v.get("configOptions").cloned().unwrap_or(Value::Null))
    }

    /// `authenticate` with `method_id` (one of the `authMethods` the agent listed).
    pub async fn authenticate(&self, method_id: &str) -> Result<(), AcpError> {
        self.request_inner("authenticate", json!({"methodId": method_id}), None)
            .await
            .map(|_| ())
    }

    /// `session/prompt` with one text block. `meta` (if not `null`) is sent as
    /// the prompt's `_meta` (the gateway passes `{"warden":{"messageId":..}}`).
    /// No timeout: turn budgets are the caller's; use [`AcpClient::cancel`].
    pub async fn prompt(
        &self,
        session_id: &str,
        text: &str,
        meta: Value,
    ) -> Result<PromptResponse, AcpError> {
        self.prompt_blocks(
            session_id,
            vec![json!({"type": "text", "text": text})],
            meta,
        )
        .await
    }

    /// `session/prompt` with arbitrary content blocks.
    pub async fn prompt_blocks(
        &self,
        session_id: &str,
        blocks: Vec<Value>,
        meta: Value,
    ) -> Result<PromptResponse, AcpError> {
        let mut params = json!({"sessionId": session_id, "prompt": blocks});
        if !meta.is_null() {
            params["_meta"] = meta;
        }
        self.typed("session/prompt", params, Some(session_id.to_string()))
            .await
    }

    /// `session/cancel`, then answer every pending permission of the session
    /// `cancelled`, then wait (up to `config.cancel_deadline`) for the prompt
    /// response. The read loop keeps delivering updates meanwhile.
    pub async fn cancel(&self, session_id: &str) -> Result<CancelReport, AcpError> {
        self.cancel_with_deadline(session_id, self.inner.config.cancel_deadline)
            .await
    }

    /// [`AcpClient::cancel`] with an explicit deadline.
    pub async fn cancel_with_deadline(
        &self,
        session_id: &str,
        deadline: Duration,
    ) -> Result<CancelReport, AcpError> {
        // Register before sending, so a fast answer cannot slip past us.
        let waiter = lock(&self.inner.prompts).get_mut(session_id).map(|t| {
            let (tx, rx) = oneshot::channel();
            t.waiters.push(tx);
            rx
        });
        self.notify("session/cancel", json!({"sessionId": session_id}))?;
        let permissions_cancelled = self.inner.cancel_permissions(session_id);
        tracing::info!(session_id, permissions_cancelled, "session cancelled");
        let outcome = match waiter {
            None => CancelOutcome::NoPromptInFlight,
            Some(rx) => match tokio::time::timeout(deadline, rx).await {
                Ok(Ok(end)) => CancelOutcome::PromptEnded(end),
                Ok(Err(_)) => CancelOutcome::PromptEnded(PromptEnd::Fault(
                    self.fault().unwrap_or(Fault::ClosedByClient),
                )),
                Err(_) => CancelOutcome::DeadlineExpired,
            },
        };
        Ok(CancelReport {
            permissions_cancelled,
            outcome,
        })
    }
}

fn absolute(cwd: &Path) -> Result<String, AcpError> {
    if !cwd.is_absolute() {
        return Err(AcpError::InvalidArgument(format!(
            "cwd must be absolute: {}",
            cwd.display()
        )));
    }
    cwd.to_str()
        .map(str::to_string)
        .ok_or_else(|| AcpError::InvalidArgument("cwd is not valid UTF-8".into()))
}

/// Lines already queued are written together, up to this many bytes per write.
const WRITE_BATCH_BYTES: usize = 64 * 1024;

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    mut fault: watch::Receiver<Option<Fault>>,
    inner: std::sync::Weak<Inner>,
) {
    let mut batch: Vec<u8> = Vec::new();
    let mut closing = false;
    while !closing {
        // After a fault nothing is sent any more: what is queued is dropped (with the
        // receiver) instead of waiting, perhaps forever, for an agent that does not read.
        let msg = tokio::select! {
            biased;
            _ = fault.wait_for(Option::is_some) => return,
            m = rx.recv() => m,
        };
        let Some(msg) = msg else { break };
        let mut line = match msg {
            WriterMsg::Line(l) => l,
            WriterMsg::Close => break,
        };
        // Lines carry their newline; whatever else is queued already goes in the same write,
        // so a burst of answers costs one syscall (and one wake-up of the agent), not one each.
        loop {
            match rx.try_recv() {
                Ok(WriterMsg::Line(next)) => {
                    if batch.is_empty() {
                        batch = std::mem::take(&mut line);
                    }
                    batch.extend_from_slice(&next);
                    if batch.len() >= WRITE_BATCH_BYTES {
                        break;
                    }
                }
                Ok(WriterMsg::Close) => {
                    closing = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let out = if batch.is_empty() { &line } else { &batch };
        let res = tokio::select! {
            biased;
            _ = fault.wait_for(Option::is_some) => return,
            r = async {
                writer.write_all(out).await?;
                writer.flush().await
            } => r,
        };
        if let Err(e) = res {
            if let Some(inner) = inner.upgrade() {
                inner.set_fault(Fault::WriteFailed(e.to_string()));
            }
            return;
        }
        if let Some(inner) = inner.upgrade() {
            inner.queued_bytes.fetch_sub(out.len(), Ordering::AcqRel);
        }
        batch.clear();
        // A burst must not pin a large buffer for the life of the connection.
        if batch.capacity() > WRITE_BATCH_BYTES * 2 {
            batch = Vec::new();
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_loop<R, H>(reader: R, inner: Arc<Inner>, handler: Arc<H>)
where
    R: AsyncRead + Unpin + Send + 'static,
    H: ClientHandler,
{
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut buf = Vec::new();
    let max = inner.config.max_line_bytes;
    loop {
        if inner.current_fault().is_some() {
            return;
        }
        // One huge (allowed) line must not pin its buffer for the life of
        // the connection.
        if buf.capacity() > 1 << 20 {
            buf = Vec::new();
        }
        match rpc::read_line_bounded(&mut reader, &mut buf, max).await {
            Ok(LineRead::Line) => {}
            Ok(LineRead::Eof) => return inner.set_fault(Fault::AgentClosed),
            Ok(LineRead::TooLong) => return inner.set_fault(Fault::OversizedLine { limit: max }),
            Err(e) => return inner.set_fault(Fault::ReadFailed(e.to_string())),
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match rpc::classify(&buf) {
            Err(e) => {
                let shown = String::from_utf8_lossy(&buf[..buf.len().min(120)]).into_owned();
                inner.malformed(format!("not JSON ({e}): {shown}"));
            }
            Ok(Incoming::Invalid { id, reason }) => {
                if let Some(id) = id {
                    inner.send_line(rpc::response_line(
                        &id,
                        Err(RpcError::new(rpc::codes::INVALID_REQUEST, reason.clone())),
                    ));
                }
                inner.malformed(reason);
            }
            Ok(Incoming::Response { id, result }) => inner.on_response(id, result),
            Ok(Incoming::Notification { method, params }) => {
                on_notification(&inner, &method, params, buf.len())
            }
            Ok(Incoming::Request { id, method, params }) => {
                on_request(&inner, &handler, id, method, params, buf.len())
            }
        }
    }
}

fn on_notification(inner: &Arc<Inner>, method: &str, params: Value, line_bytes: usize) {
    match method {
        "session/update" => {
            let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
                inner.malformed("session/update without sessionId".into());
                return;
            };
            let update = params.get("update").unwrap_or(&Value::Null);
            match SessionEvent::from_update(update) {
                Ok(Some(event)) => {
                    inner.event(
                        AcpEvent::Update(SessionNotification {
                            session_id: session_id.to_string(),
                            event,
                            meta: params.get("_meta").cloned(),
                        }),
                        line_bytes,
                    );
                }
                Ok(None) => {
                    inner.unknown_updates.fetch_add(1, Ordering::Relaxed);
                    let kind = update
                        .get("sessionUpdate")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    tracing::info!(session_id, kind, "skipping unknown session/update variant");
                }
                Err(detail) => {
                    tracing::warn!(session_id, %detail, "malformed session/update skipped");
                    let text = format!("malformed session/update: {detail}");
                    let n = text.len();
                    inner.event(AcpEvent::ProtocolError(text), n);
                }
            }
        }
        "$/cancel_request" => {
            let Some(id) = params.get("requestId").and_then(RequestId::from_value) else {
                tracing::warn!("$/cancel_request without a usable requestId");
                return;
            };
            if let Some(entry) = lock(&inner.incoming).get_mut(&id)
                && let Some(c) = entry.cancel.take()
            {
                let _ = c.send(());
            }
        }
        other => tracing::debug!(method = other, "ignoring notification"),
    }
}

fn on_request<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    id: RequestId,
    method: String,
    params: Value,
    line_bytes: usize,
) {
    let received = Instant::now();
    let received_at = SystemTime::now();
    let session_id = params
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (cancel_tx, cancel_rx) = oneshot::channel();
    let is_permission = method == "session/request_permission";
    {
        let mut incoming = lock(&inner.incoming);
        if incoming.len() >= inner.config.max_incoming_requests {
            // Not handled: no task, no answer held. The agent must wait for its answers.
            drop(incoming);
            tracing::warn!(request_id = %id, method, limit = inner.config.max_incoming_requests,
                "agent request refused: too many of its requests in flight");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::internal(format!(
                    "too many requests in flight: at most {} of this agent's requests are handled at once; wait for their answers",
                    inner.config.max_incoming_requests
                ))),
            ));
            return;
        }
        let held: usize = incoming.values().map(|e| e.bytes).sum();
        if !incoming.is_empty() && held.saturating_add(line_bytes) > inner.config.max_incoming_bytes
        {
            // Not handled either: what the agent's requests hold waiting for their answers is
            // bounded in bytes, not only in count.
            drop(incoming);
            tracing::warn!(request_id = %id, method, held, line_bytes,
                limit = inner.config.max_incoming_bytes,
                "agent request refused: too many bytes of its requests in flight");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::internal(format!(
                    "too many bytes of requests in flight: this agent's requests being handled \
                     hold {held} bytes and this one has {line_bytes}, past {}; wait for their answers",
                    inner.config.max_incoming_bytes
                ))),
            ));
            return;
        }
        if incoming.contains_key(&id) {
            // Two live requests with one id could not be told apart when answered.
            drop(incoming);
            tracing::warn!(request_id = %id, method, "agent reused the id of a pending request");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::new(
                    rpc::codes::INVALID_REQUEST,
                    "id already in use by a pending request",
                )),
            ));
            return;
        }
        incoming.insert(
            id.clone(),
            IncomingEntry {
                bytes: line_bytes,
                session_id,
                is_permission,
                cancel: Some(cancel_tx),
            },
        );
    }
    let inner = inner.clone();
    let handler = handler.clone();
    tokio::spawn(async move {
        let answer = if is_permission {
            handle_permission(
                &inner,
                &handler,
                &id,
                params,
                cancel_rx,
                received,
                received_at,
            )
            .await
        } else {
            tokio::select! {
                r = dispatch(&inner, &handler, &method, params) => r,
                Ok(()) = cancel_rx => Err(RpcError::cancelled()),
            }
        };
        lock(&inner.incoming).remove(&id);
        if let Err(e) = &answer {
            tracing::debug!(request_id = %id, method, code = e.code, "answering with an error");
        }
        inner.send_line(rpc::response_line(&id, answer));
    });
}

async fn handle_permission<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    id: &RequestId,
    params: Value,
    cancel_rx: oneshot::Receiver<()>,
    received: Instant,
    received_at: SystemTime,
) -> Result<Value, RpcError> {
    let req: PermissionRequest = match serde_json::from_value(params) {
        Ok(r) => r,
        Err(e) => {
            return Err(RpcError::invalid_params(format!(
                "bad permission request: {e}"
            )));
        }
    };
    let session_id = req.session_id.clone();
    let tool_call_id = req.tool_call.tool_call_id.clone();
    let offered = req.clone();
    let outcome = tokio::select! {
        r = handler.request_permission(req) => r,
        Ok(()) = cancel_rx => Ok(PermissionOutcome::Cancelled),
    };
    let outcome = match outcome {
        Ok(PermissionOutcome::Selected { option_id })
            if inner.config.enforce_offered_options && !offered.offers(&option_id) =>
        {
            tracing::error!(
                session_id,
                option_id,
                "handler picked an option that was not offered; refusing to send it"
            );
            Err(RpcError::internal(
                "client chose an option that was not offered",
            ))
        }
        other => other,
    };
    let answer = match &outcome {
        Ok(PermissionOutcome::Selected { option_id }) => {
            PermissionAnswer::Selected(option_id.clone())
        }
        Ok(PermissionOutcome::Cancelled) => PermissionAnswer::Cancelled,
        Err(e) => PermissionAnswer::Error(e.code),
    };
    let elapsed = received.elapsed();
    // The caller logs each decision at info; a selected option is only repeated here at debug
    // (one formatted line per permission is a measurable share of the round trip). Cancelled
    // and refused answers are rare and stay visible.
    if matches!(answer, PermissionAnswer::Selected(_)) {
        tracing::debug!(
            session_id,
            tool_call_id,
            ?answer,
            elapsed_us = elapsed.as_micros() as u64,
            "permission answered"
        );
    } else {
        tracing::info!(
            session_id,
            tool_call_id,
            ?answer,
            elapsed_us = elapsed.as_micros() as u64,
            "permission answered"
        );
    }
    let mut timings = lock(&inner.timings);
    if timings.len() >= inner.config.permission_timing_capacity.max(1) {
        timings.pop_front();
    }
    timings.push_back(PermissionTiming {
        session_id,
        request_id: id.clone(),
        tool_call_id,
        received_at,
        elapsed,
        answer,
    });
    drop(timings);
    outcome.map(|o| o.to_result())
}

fn parse<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

async fn dispatch<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    let caps = lock(&inner.advertised).unwrap_or_default();
    let gate = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(RpcError::method_not_found(method))
        }
    };
    match method {
        "fs/read_text_file" => {
            gate(caps.fs.read_text_file)?;
            let req: ReadTextFileRequest = parse(params)?;
            let content = handler.read_text_file(req).await?;
            Ok(json!({"content": content}))
        }
        "fs/write_text_file" => {
            gate(caps.fs.write_text_file)?;
            let req: WriteTextFileRequest = parse(params)?;
            handler.write_text_file(req).await?;
            Ok(json!({}))
        }
        "terminal/create" => {
            gate(caps.terminal)?;
            let req: CreateTerminalRequest = parse(params)?;
            let terminal_id = handler.create_terminal(req).await?;
            Ok(json!({"terminalId": terminal_id}))
        }
        "terminal/output" => {
            gate(caps.terminal)?;
            let r = handler
                .terminal_output(parse::<TerminalRequest>(params)?)
                .await?;
            serde_json::to_value(r).map_err(|e| RpcError::internal(e.to_string()))
        }
        "terminal/wait_for_exit" => {
            gate(caps.terminal)?;
            let r = handler
                .wait_for_terminal_exit(parse::<TerminalRequest>(params)?)
                .await?;
            serde_json::to_value(r).map_err(|e| RpcError::internal(e.to_string()))
        }
        "terminal/kill" => {
            gate(caps.terminal)?;
            handler
                .kill_terminal(parse::<TerminalRequest>(params)?)
                .await?;
            Ok(json!({}))
        }
        "terminal/release" => {
            gate(caps.terminal)?;
            handler
                .release_terminal(parse::<TerminalRequest>(params)?)
                .await?;
            Ok(json!({}))
        }
        "elicitation/create" => {
            gate(caps.elicitation)?;
            let req = ElicitationRequest::from_params(&params).map_err(RpcError::invalid_params)?;
            Ok(handler.elicitation(req).await?.to_result())
        }
        other => handler.ext_request(other.to_string(), params).await,
    }
}
