//! The connection: one reader task, one writer task, a table of our pending
//! requests, and one spawned task per incoming agent request — at most
//! `max_incoming_requests` of them at once, their lines together at most
//! `max_incoming_bytes` (one more is answered with an error at once), and at most `max_queued_bytes` of lines waiting for the agent to read
//! its stdin (an agent that stops reading faults the connection instead of
//! growing the queue).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::ClientConfig;
use crate::connection::{Inner, Pending, PromptTrack, WriterMsg, lock};
use crate::error::{AcpError, Fault};
use crate::events::{
    AcpEvents, CancelOutcome, CancelReport, ClientStats, PermissionTiming, PromptEnd,
};
use crate::handler::ClientHandler;
use crate::io::{read_loop, write_loop};
use crate::rpc::{self};
use crate::types::{
    ClientCapabilities, InitializeResponse, LoadSessionResponse, NewSessionResponse,
    PROTOCOL_VERSION, PromptResponse,
};

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
