//! Typed errors of the client.

use crate::rpc::RpcError;

/// Why the connection to the agent is no longer usable. Once a fault is
/// recorded, every pending and later request fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// The agent closed its stdout (exited or crashed).
    #[error("agent closed its output")]
    AgentClosed,
    /// Reading the agent's output failed.
    #[error("reading from the agent failed: {0}")]
    ReadFailed(String),
    /// The agent sent a line longer than the configured limit.
    #[error("agent sent a line longer than {limit} bytes")]
    OversizedLine {
        /// The limit in bytes.
        limit: usize,
    },
    /// Too many lines that are not JSON-RPC (see `ClientConfig::max_malformed_lines`).
    #[error("agent sent {count} lines that are not JSON-RPC")]
    Garbage {
        /// How many.
        count: u64,
    },
    /// Writing to the agent's stdin failed.
    #[error("writing to the agent failed: {0}")]
    WriteFailed(String),
    /// The agent left more than `limit` bytes of what was sent to it unread (it stopped
    /// reading its stdin while it made requests): the connection is not usable and the
    /// queue is dropped rather than held.
    #[error("the agent stopped reading its input: more than {limit} bytes were queued for it")]
    InputNotRead {
        /// `ClientConfig::max_queued_bytes`.
        limit: usize,
    },
    /// More than `limit` bytes of the agent's updates were queued and not taken by the caller
    /// (an agent flooding updates while no turn reads them): reading stops.
    #[error("the agent sent more than {limit} bytes of updates that were not taken")]
    UpdatesNotTaken {
        /// `ClientConfig::max_queued_event_bytes`.
        limit: usize,
    },
    /// The client closed the connection itself.
    #[error("connection closed by the client")]
    ClosedByClient,
}

/// Errors of client calls.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AcpError {
    /// The agent answered with a JSON-RPC error.
    #[error("agent answered {method} with an error: {error}")]
    Rpc {
        /// The method called.
        method: String,
        /// The error.
        error: RpcError,
    },
    /// The connection faulted.
    #[error("connection fault: {0}")]
    Fault(Fault),
    /// No answer in time.
    #[error("{method} got no answer within {millis} ms")]
    Timeout {
        /// The method called.
        method: String,
        /// The timeout.
        millis: u128,
    },
    /// The agent's answer does not have the expected shape.
    #[error("agent's answer to {method} is malformed: {detail}")]
    BadResponse {
        /// The method called.
        method: String,
        /// What was wrong.
        detail: String,
    },
    /// The caller passed something unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The agent did not advertise what this call needs.
    #[error("agent does not support {0}")]
    Unsupported(String),
}
