//! warden-gateway: the only part of warden a caller talks to. It serves A2A 1.0 (JSON-RPC and
//! HTTP+JSON, with SSE streams) and maps each A2A task onto one turn of a supervisor
//! conversation, over the supervisor's gRPC contract on a Unix socket.
//!
//! Owns: the A2A wire types and error table, bearer authentication and per-principal isolation,
//! the durable task store, and the TurnEvent → A2A mapping.
//! Must never: spawn a process, decide a permission, or forward a permission request to the
//! caller (a permission is reported, never turned into INPUT_REQUIRED — seed 000); only an
//! agent's *question* becomes INPUT_REQUIRED.

pub mod a2a;
pub mod auth;
pub mod config;
pub mod daemon;
pub mod error;
pub mod http;
pub mod mapping;
pub mod store;
pub mod tasks;
pub mod time;
