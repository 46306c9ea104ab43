//! warden-acp: the ACP v1 client the supervisor uses to talk to a coding agent
//! over the agent's stdio (newline-delimited JSON-RPC 2.0).
//!
//! It owns: the framing (bounded lines, default 16 MiB; a longer line is a
//! protocol fault), request/response correlation (integer and string ids),
//! tolerant typed decoding of ACP messages, routing of every agent -> client
//! request to a caller-supplied [`ClientHandler`] in its own tokio task (the
//! read loop never waits on a handler), the cancel protocol (answer pending
//! permissions `cancelled`, keep reading until the prompt response or a
//! deadline), and permission round-trip timings.
//!
//! It must never: decide a permission (that is the handler's job), pick an
//! option that was not offered, answer `cancelled` except for a cancel, spawn
//! or kill processes (the supervisor does), or panic on anything an agent sends.
//!
//! Entry point: [`AcpClient::connect`]. Types are this crate's own serde types
//! rather than `agent-client-protocol-schema`: that crate's enums fail the
//! whole message on an unknown permission-option kind, which ACP clients must
//! tolerate, and its API moves with every release.

mod client;
mod error;
mod handler;
mod rpc;
mod types;

pub use client::{
    AcpClient, AcpEvent, CancelOutcome, CancelReport, ClientConfig, ClientStats,
    DEFAULT_MAX_LINE_BYTES, IdStyle, PermissionAnswer, PermissionTiming, PromptEnd,
};
pub use error::{AcpError, Fault};
pub use handler::ClientHandler;
pub use rpc::{RequestId, RpcError, codes};
pub use types::*;
