//! The PostgreSQL side of warden's durable state (`[store] backend = "postgres"`), so that
//! policies, approvers and gateways can run as replicas on one database instead of each owning
//! a sled store on one host.
//!
//! Owns: the `[store]` section every daemon with durable state reads (`config.rs`: backend,
//! URL, pool size, TLS, timeouts), the connection pool ([`Pg`]), the schema's versioned
//! migrations kept in `migrations/` and applied at start under a PostgreSQL advisory lock so
//! replicas starting together apply each exactly once (`migrate.rs`), the check
//! `--check-config` runs (reachable, migrated), the notification listener replicas use to see
//! each other's changes live (`listen.rs`), and, for tests only (`test-cluster` feature), a real
//! cluster started from the distribution's binaries in a temporary directory (`cluster.rs`).
//!
//! Must never: decide what a daemon stores or how it reads it (each daemon owns its own tables
//! and queries; a daemon touches only the tables its migrations name for it), log a password,
//! or retry a write on its own (a caller that answered on a failed write must know it failed).
#![forbid(unsafe_code)]

#[cfg(feature = "test-cluster")]
pub mod cluster;
pub mod config;
pub mod error;
pub mod listen;
pub mod migrate;
pub mod pool;

pub use config::{Backend, StoreSection};
pub use error::PgError;
pub use pool::Pg;

/// Re-exported so daemons use exactly the client types the pool hands out.
pub use deadpool_postgres;
pub use tokio_postgres;
