//! What every warden daemon shares, so that the three services differ only in their APIs.
//!
//! Owns: configuration loading (TOML file, then `WARDEN_<DAEMON>__KEY` environment overrides, then
//! `--set key=value` flags, validated with errors that name the key and the file), tracing setup
//! (human or JSON), gRPC listeners on Unix sockets (mode, group, stale-socket handling) or TCP, the
//! peer-credential allowlist that guards every listener, gRPC health, systemd readiness, a
//! bounded graceful shutdown on SIGTERM/SIGINT, reloads on SIGHUP and the admin `Reload`
//! ([`reload`]: one function per daemon, never a kill), and the start-up sequence itself
//! ([`start`]).
//!
//! Must never: hold service logic (decisions, processes, tasks), or let a request through a Unix
//! listener without first checking the peer's uid/gid against that listener's allowlist.

pub mod args;
pub mod client;
pub mod config;
pub mod depth;
pub mod listener;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod otel;
pub mod peer;
pub mod reload;
pub mod server;
pub mod start;
pub mod status;
pub mod tls;

pub use args::DaemonArgs;
pub use config::{ConfigError, DaemonSection, ListenerConfig, LoadedConfig};
pub use listener::{BoundListener, ListenerError};
pub use peer::{Peer, PeerGuard, PeerIdentity, PeerInfo, PeerStream};
pub use server::{ServeError, Server};
pub use start::{Daemon, Share, start};
