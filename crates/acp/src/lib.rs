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
//! or kill processes (the supervisor does), panic on anything an agent sends, or
//! hold memory without bound for it: the agent's requests in flight and the bytes
//! queued for an agent that does not read them are bounded (`ClientConfig`).
//!
//! Entry point: [`AcpClient::connect`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use warden_acp::*;
//!
//! struct Allow;
//! impl ClientHandler for Allow {
//!     async fn request_permission(&self, req: PermissionRequest) -> Result<PermissionOutcome, RpcError> {
//!         // Select by kind, never an "always" option; only ids that were offered.
//!         match req.selectable_options().find(|o| o.kind == PermissionOptionKind::AllowOnce) {
//!             Some(o) => Ok(PermissionOutcome::Selected { option_id: o.option_id.clone() }),
//!             None => Err(RpcError::internal("no one-shot allow offered")),
//!         }
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut child = tokio::process::Command::new("warden-scripted-agent")
//!     .stdin(std::process::Stdio::piped())
//!     .stdout(std::process::Stdio::piped())
//!     .spawn()?;
//! let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
//! let (client, mut events) = AcpClient::connect(stdout, stdin, Arc::new(Allow), ClientConfig::default());
//! client.initialize(ClientCapabilities::default()).await?;
//! let session = client.new_session(std::path::Path::new("/tmp/work")).await?;
//! tokio::spawn(async move {
//!     while let Some(ev) = events.recv().await {
//!         if let AcpEvent::Update(n) = ev { println!("{}: {:?}", n.session_id, n.event); }
//!     }
//! });
//! let resp = client.prompt(&session.session_id, "write hello.txt", serde_json::Value::Null).await?;
//! assert_eq!(resp.stop_reason, StopReason::EndTurn);
//! # Ok(()) }
//! ```
//!
//! Dropping every `AcpClient` clone does not stop the reader (it lives until
//! the agent's stdout closes); the owner of the process ends it. Types are this crate's own serde types
//! rather than `agent-client-protocol-schema`: that crate's enums fail the
//! whole message on an unknown permission-option kind, which ACP clients must
//! tolerate, and its API moves with every release.
#![forbid(unsafe_code)]

mod client;
mod config;
mod connection;
mod error;
mod events;
mod handler;
mod incoming;
mod io;
mod rpc;
mod types;

pub use client::AcpClient;
pub use config::{
    ClientConfig, DEFAULT_MAX_INCOMING_BYTES, DEFAULT_MAX_INCOMING_REQUESTS,
    DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_EVENT_BYTES, IdStyle,
};
pub use error::{AcpError, Fault};
pub use events::{
    AcpEvent, AcpEvents, CancelOutcome, CancelReport, ClientStats, PermissionAnswer,
    PermissionTiming, PromptEnd,
};
pub use handler::ClientHandler;
pub use rpc::{RequestId, RpcError, codes};
pub use types::*;
