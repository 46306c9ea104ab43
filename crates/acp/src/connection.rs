//! One connection's shared state (`Inner`): our pending requests, the prompts being followed,
//! the agent's requests being handled, the queues' byte counts and the first fault. Must never block
//! or wait: every method moves map entries or counters and returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{ClientConfig, IdStyle};
use crate::error::Fault;
use crate::events::{AcpEvent, PermissionTiming, PromptEnd};
use crate::rpc::{RequestId, RpcError};
use crate::types::{ClientCapabilities, InitializeResponse, PromptResponse};

pub(crate) struct Pending {
    pub(crate) tx: oneshot::Sender<Result<Value, RpcError>>,
    pub(crate) prompt_session: Option<String>,
}

pub(crate) struct PromptTrack {
    pub(crate) id: RequestId,
    pub(crate) waiters: Vec<oneshot::Sender<PromptEnd>>,
}

pub(crate) struct IncomingEntry {
    /// The length of the line it came on (`max_incoming_bytes`).
    pub(crate) bytes: usize,
    pub(crate) session_id: Option<String>,
    pub(crate) is_permission: bool,
    pub(crate) cancel: Option<oneshot::Sender<()>>,
}

pub(crate) enum WriterMsg {
    Line(Vec<u8>),
    Close,
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    pub(crate) out: mpsc::UnboundedSender<WriterMsg>,
    pub(crate) events: mpsc::UnboundedSender<(AcpEvent, usize)>,
    /// Bytes of events sent and not taken (`config.max_queued_event_bytes`).
    pub(crate) event_bytes: Arc<AtomicUsize>,
    pub(crate) next_id: AtomicI64,
    pub(crate) pending: Mutex<HashMap<RequestId, Pending>>,
    pub(crate) prompts: Mutex<HashMap<String, PromptTrack>>,
    pub(crate) incoming: Mutex<HashMap<RequestId, IncomingEntry>>,
    pub(crate) timings: Mutex<std::collections::VecDeque<PermissionTiming>>,
    pub(crate) advertised: Mutex<Option<ClientCapabilities>>,
    pub(crate) agent: Mutex<Option<InitializeResponse>>,
    pub(crate) fault: watch::Sender<Option<Fault>>,
    /// Bytes handed to the writer and not written yet (`config.max_queued_bytes`).
    pub(crate) queued_bytes: AtomicUsize,
    /// Set by `close_stdin`: nothing more can be sent (reading goes on).
    pub(crate) stdin_closed: std::sync::atomic::AtomicBool,
    pub(crate) unknown_updates: AtomicU64,
    pub(crate) malformed_lines: AtomicU64,
    pub(crate) stray_responses: AtomicU64,
}

/// Lock a mutex, recovering from poisoning: every critical section here only
/// moves map entries, so a panic elsewhere cannot leave them inconsistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    pub(crate) fn send_line(&self, line: Vec<u8>) {
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
    pub(crate) fn event(&self, ev: AcpEvent, n: usize) {
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

    pub(crate) fn current_fault(&self) -> Option<Fault> {
        self.fault.borrow().clone()
    }

    /// Record the first fault, fail every waiter, tell the caller.
    pub(crate) fn set_fault(&self, fault: Fault) {
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

    pub(crate) fn malformed(&self, detail: String) {
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

    pub(crate) fn next_request_id(&self) -> RequestId {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        match self.config.id_style {
            IdStyle::Int => RequestId::Int(n),
            IdStyle::Str => RequestId::Str(format!("warden-{n}")),
        }
    }

    pub(crate) fn on_response(&self, id: RequestId, result: Result<Value, RpcError>) {
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
    pub(crate) fn cancel_permissions(&self, session_id: &str) -> usize {
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
