//! What the client hands its caller: the event stream (`AcpEvent`, `AcpEvents`), permission
//! answers and their timings, how a prompt or a cancel ended, and the counters. Plain data; must
//! never hold the connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::error::Fault;
use crate::rpc::{RequestId, RpcError};
use crate::types::{SessionNotification, StopReason};

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
    pub(crate) rx: mpsc::UnboundedReceiver<(AcpEvent, usize)>,
    pub(crate) bytes: Arc<AtomicUsize>,
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
