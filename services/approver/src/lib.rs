//! warden-approver: the human-approval `PolicyService`. It asks its upstream policy
//! (warden-policy with `decide.return_escalations = true`) first and passes ALLOW and DENY through
//! unchanged; what the upstream escalates it holds in a persisted queue until a person answers
//! (admin socket: `warden approvals`; or the web page with an operator token), the deadline passes
//! (DENY `approval.no-response`), or the caller cancels (the request is revoked).
//!
//! Owns: the pending queue and the record of every human decision (who, when, how long it took,
//! why) in its own sled store; the approval API on the admin socket; the operators' web page.
//!
//! Must never: answer ALLOW without a person's approval or the upstream's ALLOW; widen a person's
//! approval to an "always" option; let an answer from anyone but an admitted operator through;
//! answer a request twice; read another daemon's store.
#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
pub mod queue;
pub mod service;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Routes;
use warden_daemon::{DaemonArgs, ListenerError, ServeError, Server};
use warden_proto::v1::admin_service_server::AdminServiceServer;
use warden_proto::v1::approval_service_server::ApprovalServiceServer;
use warden_proto::v1::policy_service_server::PolicyServiceServer;

use crate::queue::{Queue, QueueError};
use crate::service::{AdminApi, ApprovalApi, ApproverState, PolicyApi};

/// Fatal start-up and serving errors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] warden_daemon::ConfigError),
    #[error("cannot open the approval store: {0}")]
    Store(#[from] warden_store::StoreError),
    #[error("approval queue: {0}")]
    Queue(#[from] QueueError),
    #[error("cannot build the floor check: {0}")]
    Rules(String),
    #[error("listener: {0}")]
    Listener(#[from] ListenerError),
    #[error("web page: {0}")]
    Web(#[from] web::WebError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(args: DaemonArgs) -> Result<(), RunError> {
    let loaded = config::load(args.config.as_deref(), &args.set)?;
    let cfg = loaded.value;
    if args.check_config {
        println!("{}: configuration OK", loaded.origin);
        return Ok(());
    }
    let format = args
        .log_format
        .clone()
        .unwrap_or_else(|| cfg.daemon.log_format.clone());
    warden_daemon::logging::init("warden-approver", &format, &cfg.daemon.log_level);

    let store = warden_store::Store::open(&cfg.daemon.state_dir.join("store"))?;
    let (queue, pending) = Queue::open(store, cfg.approval.history)?;

    let listen =
        warden_daemon::listener::bind("listen", &cfg.listen, &cfg.daemon.state_dir).await?;
    let admin = warden_daemon::listener::bind("admin", &cfg.admin, &cfg.daemon.state_dir).await?;
    let web_listener = if cfg.web.bind.is_empty() {
        None
    } else {
        Some(web::bind(&cfg).await?)
    };
    let mut server = Server::new(
        "warden-approver",
        Duration::from_millis(cfg.daemon.shutdown_grace_ms),
    );
    let state =
        Arc::new(ApproverState::new(cfg, queue, server.shutdown_token()).map_err(RunError::Rules)?);
    state.recover(pending);
    server.serve(
        listen,
        Routes::new(PolicyServiceServer::new(PolicyApi(state.clone()))),
    );
    server.serve_admin(
        admin,
        Routes::new(ApprovalServiceServer::new(ApprovalApi(state.clone())))
            .add_service(AdminServiceServer::new(AdminApi(state.clone()))),
        &[
            warden_proto::v1::approval_service_server::SERVICE_NAME,
            warden_proto::v1::admin_service_server::SERVICE_NAME,
        ],
    );
    let figures = state.clone();
    let refresh: warden_daemon::metrics::Refresh = Arc::new(move || {
        let state = figures.clone();
        Box::pin(async move {
            let pending = state.queue.pending(usize::MAX).unwrap_or_default();
            let oldest = pending.iter().map(|a| a.created_unix_ms).min();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            metrics::set_pending(pending.len(), oldest, now);
        })
    });
    server
        .serve_metrics(&state.config.daemon, metrics::exporter(refresh))
        .await?;
    let mut listeners = server.listeners();
    if let Some(l) = web_listener {
        listeners.push(l.describe());
        l.serve(state.clone(), server.shutdown_token())?;
    }
    state.set_listeners(listeners);
    tracing::info!(
        upstream = %state.config.upstream_socket().map(|p| p.display().to_string()).unwrap_or_default(),
        approval_deadline_ms = state.config.approval.deadline_ms,
        "warden-approver serving"
    );
    let ran = server.run().await;
    // The spans of the last requests are exported before the process ends.
    warden_daemon::otel::shutdown();
    ran?;
    Ok(())
}
