//! warden-gateway: the only part of warden a caller talks to. It serves A2A 1.0 (JSON-RPC and
//! HTTP+JSON with SSE streams, and gRPC `lf.a2a.v1.A2AService`), A2A 0.3 on the same JSON
//! endpoints, and push notifications, and maps each A2A task onto one turn of a supervisor
//! conversation, over the supervisor's gRPC contract on a Unix socket.
//!
//! Owns: the A2A wire types and error table, bearer authentication and per-principal isolation,
//! the durable task store (sled, or PostgreSQL shared by replicas that follow, cancel and take
//! over each other's tasks), the TurnEvent → A2A mapping, webhook delivery with its
//! address checks (`push.rs`: never a connection to an address it has not checked), and the
//! fair shares of connections and streams per principal (`shares.rs`: one caller at its limit
//! slows only itself; connections without a valid token cannot fill the cap).
//! Layout: the floors below, drawn in ARCHITECTURE.md ("The gateway in floors").
//! Must never: spawn a process, decide a permission, or forward a permission request to the
//! caller (a permission is reported, never turned into INPUT_REQUIRED — seed 000); only an
//! agent's *question* becomes INPUT_REQUIRED.
//!
//! Conformance: checked against the A2A TCK (a2aproject/a2a-tck, branch 1.0-dev) run on a real
//! `warden up`; its behaviours are reproduced without the TCK by `tests/e2e_tck_behaviours.rs`.
//! Where the TCK still follows spec 1.0.0 the gateway follows 1.0.1: ContentTypeNotSupported is
//! HTTP 400, not 415 (§5.4). The TCK cannot send a bearer token, so it runs with a local pytest
//! plugin that adds one; warden never turns authentication off.
#![forbid(unsafe_code)]

// The floors (ARCHITECTURE.md draws them; tests/tests/code_map.rs keeps them): each module
// imports only from its own floor or below.
// Floor 0, pure: A2A types, errors, time, names, configuration, the mappings.
pub mod a2a;
pub mod config;
pub mod endpoints;
pub mod error;
pub mod grpc_convert;
pub mod mapping;
pub mod placement;
pub mod time;
pub mod translate03;
// Floor 1, state and delivery: the store, webhooks, shares, peers, tokens and OIDC issuers, the
// metrics registry.
pub mod auth;
pub mod cells;
pub mod metrics;
pub mod oidc;
pub mod peer;
pub mod push;
pub mod push_limits;
pub mod shares;
pub mod store;
#[cfg(test)]
mod store_contract;
pub mod store_pg;
pub mod store_sled;
// Floor 2, the A2A core (`core/`, one module per step of a task's life); the card; what a
// subscriber sees.
pub mod card;
pub mod core;
pub mod events;
// Floor 3, what the HTTP bindings share: admission and wire helpers.
pub mod admission;
// Floor 4, the bindings, leaves that never import each other.
pub mod a2a_grpc;
pub mod compat03;
pub mod jsonrpc;
pub mod mcp;
pub mod rest;
// Floor 5, the wiring: the HTTP router, the listener, the daemon.
pub mod daemon;
pub mod http;
pub mod serve;
