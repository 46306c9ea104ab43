//! warden-policy: serves `PolicyService.Decide` (the rules of `warden-rules`) on a Unix socket
//! that only the supervisor's uid/gid may use, serves `AdminService` (Status, AuditQuery,
//! Reload) to operators on a second socket, and writes one audit record per decision to its own
//! sled store before answering.
//!
//! Owns: the audit log, atomic reloads (SIGHUP or admin Reload; a bad file changes nothing), and
//! serving the rules; what every PolicyService implementation shares (the request conversion,
//! the decision's filesystem view, the contract kit) is `warden-decide`'s.
//!
//! Must never: answer ALLOW to anything it could not judge, answer before the audit record is
//! written, name an option that was not offered, or spawn, edit or execute anything itself.
#![forbid(unsafe_code)]

pub mod audit;
pub mod config;
pub mod journal;
pub mod metrics;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Routes;
use warden_daemon::{DaemonArgs, ListenerError, ServeError, Server};
use warden_proto::v1::admin_service_server::AdminServiceServer;
use warden_proto::v1::policy_service_server::PolicyServiceServer;

use crate::audit::{AuditError, AuditLog};
use crate::config::Sources;
use crate::service::{AdminApi, PolicyApi, PolicyState, ReloadError};

/// Fatal start-up and serving errors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] warden_daemon::ConfigError),
    #[error("cannot open the audit store: {0}")]
    Store(#[from] warden_store::StoreError),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("policy: {0}")]
    Policy(#[from] ReloadError),
    #[error("listener: {0}")]
    Listener(#[from] ListenerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot install the SIGHUP handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// warden-policy as a daemon: its loaded configuration and where it came from (reloads read
/// the same sources again).
pub struct PolicyDaemon {
    sources: Sources,
    loaded: warden_daemon::LoadedConfig<config::Config>,
}

impl warden_daemon::Daemon for PolicyDaemon {
    const NAME: &'static str = "warden-policy";
    type Error = RunError;

    fn load(args: &DaemonArgs) -> Result<Self, Box<dyn std::error::Error>> {
        let sources = Sources {
            file: args.config.clone(),
            sets: args.set.clone(),
        };
        let loaded = sources.load()?;
        Ok(PolicyDaemon { sources, loaded })
    }

    fn daemon_section(&self) -> &warden_daemon::DaemonSection {
        &self.loaded.value.daemon
    }

    fn summary(&self) -> String {
        self.loaded.origin.to_string()
    }

    fn run(self) -> impl std::future::Future<Output = Result<(), RunError>> {
        run(self.sources, self.loaded.value)
    }
}

/// Serves until SIGTERM/SIGINT.
async fn run(sources: Sources, cfg: config::Config) -> Result<(), RunError> {
    let store = warden_store::Store::open(&cfg.daemon.state_dir.join("store"))?;
    let audit = AuditLog::open(store)?;
    let state = Arc::new(PolicyState::new(&cfg, sources, audit)?);

    let listen =
        warden_daemon::listener::bind("listen", &cfg.listen, &cfg.daemon.state_dir).await?;
    let admin = warden_daemon::listener::bind("admin", &cfg.admin, &cfg.daemon.state_dir).await?;
    let mut server = Server::new(
        "warden-policy",
        Duration::from_millis(cfg.daemon.shutdown_grace_ms),
    );
    server.serve(
        listen,
        Routes::new(PolicyServiceServer::new(PolicyApi(state.clone()))),
    );
    server.serve_admin(
        admin,
        Routes::new(AdminServiceServer::new(AdminApi(state.clone()))),
        &[warden_proto::v1::admin_service_server::SERVICE_NAME],
    );
    server
        .serve_metrics(&cfg.daemon, metrics::exporter())
        .await?;
    state.set_listeners(server.listeners());

    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(RunError::Signal)?;
    let hup_state = state.clone();
    let token = server.shutdown_token();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                got = hup.recv() => {
                    if got.is_none() { break; }
                    tracing::info!("SIGHUP: reloading the policy");
                    let s = hup_state.clone();
                    match tokio::task::spawn_blocking(move || s.reload()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "reload rejected; the rules in force stay"),
                        Err(e) => tracing::error!(error = %e, "reload task failed"),
                    }
                }
            }
        }
    });
    tracing::info!(
        policy_version = state.active().version,
        "warden-policy serving"
    );
    server.run().await?;
    Ok(())
}
