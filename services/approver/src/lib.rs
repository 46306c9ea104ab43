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

pub mod api;
pub mod config;
pub mod metrics;
pub mod queue;
pub mod queue_pg;
pub mod queue_sled;
pub mod queue_store;
pub mod service;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Routes;
use warden_daemon::{DaemonArgs, ListenerError, ServeError, Server};
use warden_proto::v1::admin_service_server::AdminServiceServer;
use warden_proto::v1::approval_service_server::ApprovalServiceServer;
use warden_proto::v1::policy_service_server::PolicyServiceServer;

use crate::api::{AdminApi, ApprovalApi, PolicyApi};
use crate::queue::{Queue, QueueError};
use crate::service::ApproverState;

/// Fatal start-up and serving errors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] warden_daemon::ConfigError),
    #[error("cannot open the approval store: {0}")]
    Store(#[from] warden_store::StoreError),
    #[error("approval queue: {0}")]
    Queue(#[from] QueueError),
    #[error("approval database: {0}")]
    Database(#[from] warden_pgstate::PgError),
    #[error("cannot build the floor check: {0}")]
    Rules(String),
    #[error("listener: {0}")]
    Listener(#[from] ListenerError),
    #[error("web page: {0}")]
    Web(#[from] web::WebError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("import: {0}")]
    Import(String),
}

/// Copies every request of this approver's sled store (`<state_dir>/store`: pending and
/// decided) into the PostgreSQL database `[store]` names, then checks each is there. Re-running
/// copies nothing twice. The approver must be stopped (sled refuses a second opener). Web
/// sessions are not copied (they stay each replica's own). Returns (requests, newly written).
pub async fn import_sled(args: &DaemonArgs) -> Result<(usize, usize), RunError> {
    let cfg = config::load(args.config.as_deref(), &args.set)?.value;
    let dir = cfg
        .store
        .backend
        .sled_to_import(&cfg.daemon.state_dir)
        .map_err(RunError::Import)?;
    let sled = queue_sled::SledQueue::open(warden_store::Store::open(&dir)?, usize::MAX)?;
    let all = sled.all()?;
    let pg = warden_pgstate::Pg::new(&cfg.store)?;
    warden_pgstate::migrate::migrate(&pg).await?;
    let target = queue_pg::PgQueue::new(pg, cfg.approval.history);
    let mut inserted = 0;
    for a in &all {
        if target.import(a).await? {
            inserted += 1;
        }
        use queue_store::QueueStore;
        if target.get(&a.id).await?.is_none() {
            return Err(RunError::Import(format!(
                "request {} is not in the database after the copy (its request id {:?} is held there by another)",
                a.id,
                a.request
                    .as_ref()
                    .map(|r| r.request_id.as_str())
                    .unwrap_or("")
            )));
        }
    }
    println!(
        "warden-approver: imported the queue into {}: {} requests, {inserted} new, {} already there",
        cfg.store.describe(),
        all.len(),
        all.len() - inserted
    );
    Ok((all.len(), inserted))
}

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(args: DaemonArgs) -> Result<(), RunError> {
    let loaded = config::load(args.config.as_deref(), &args.set)?;
    let cfg = loaded.value;
    if args.check_config {
        if cfg.store.backend == warden_pgstate::Backend::Postgres {
            // The database answers and is migrated (nothing is changed).
            let pg = warden_pgstate::Pg::new(&cfg.store)?;
            warden_pgstate::migrate::check(&pg).await?;
        }
        println!(
            "warden-approver: configuration OK ({}; approval store: {})",
            loaded.origin,
            cfg.store.describe()
        );
        let a = &cfg.approval;
        warden_daemon::start::print_shares(&[
            warden_daemon::Share::new(
                "approval.max_pending_per_principal",
                a.max_pending_per_principal,
            )
            .of("approval.max_pending", a.max_pending),
            warden_daemon::Share::new(
                "approval.max_pending_per_conversation",
                a.max_pending_per_conversation,
            )
            .of(
                "approval.max_pending_per_principal",
                a.max_pending_per_principal,
            ),
        ]);
        return Ok(());
    }
    if args.health {
        // The admin socket: its default mode admits only the approver's own uid, as a probe runs.
        warden_daemon::args::health_async(
            "warden-approver",
            cfg.admin.socket_path(&cfg.daemon.state_dir).as_deref(),
        )
        .await;
        return Ok(());
    }
    // SIGHUP's default action ends the process: caught from here on (tokio keeps the handler
    // for the process's life); from `Server::new` on each one is a reload.
    if let Err(e) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tracing::error!(error = %e, "cannot catch SIGHUP: a reload signal would end the daemon");
    }
    let format = args
        .log_format
        .clone()
        .unwrap_or_else(|| cfg.daemon.log_format.clone());
    warden_daemon::logging::init(
        "warden-approver",
        &format,
        &cfg.daemon.log_level,
        cfg.daemon.otlp_endpoint.as_deref(),
    );

    let store = warden_store::Store::open(&cfg.daemon.state_dir.join("store"))?;
    let (queue, pending) = match cfg.store.backend {
        warden_pgstate::Backend::Sled => Queue::open(store, cfg.approval.history)?,
        warden_pgstate::Backend::Postgres => {
            let pg = warden_pgstate::Pg::new(&cfg.store)?;
            // Replicas starting together queue on the migration's advisory lock.
            warden_pgstate::migrate::migrate(&pg).await?;
            Queue::open_pg(store, pg, cfg.approval.history).await?
        }
    };

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
    // A reload checks the file and says what it would take: the approver changes nothing while
    // it runs (its deadlines are what the supervisor learned through `Describe` at its start),
    // so a valid file is applied by a restart, and a broken one is named without a restart.
    {
        let args = Arc::new(args.clone());
        server.reloads().set(move || {
            let args = args.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    config::load(args.config.as_deref(), &args.set)
                        .map(|_| {
                            "the configuration is valid; warden-approver changes nothing while it runs: restart it to apply it".to_string()
                        })
                        .map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|e| Err(format!("reload task failed: {e}")))
            }
        });
    }
    let state =
        Arc::new(ApproverState::new(cfg, queue, server.shutdown_token()).map_err(RunError::Rules)?);
    state.recover(pending).await;
    server.serve(
        listen,
        // The contract's message bound, stated (the caller keeps every request under it).
        Routes::new(
            PolicyServiceServer::new(PolicyApi(state.clone()))
                .max_decoding_message_size(warden_proto::limits::MAX_DECIDE_MESSAGE_BYTES),
        ),
    );
    server.serve_admin(
        admin,
        Routes::new(ApprovalServiceServer::new(ApprovalApi(state.clone()))).add_service(
            AdminServiceServer::new(AdminApi(state.clone(), server.reloads())),
        ),
        &[
            warden_proto::v1::approval_service_server::SERVICE_NAME,
            warden_proto::v1::admin_service_server::SERVICE_NAME,
        ],
    );
    let figures = state.clone();
    let refresh: warden_daemon::metrics::Refresh = Arc::new(move || {
        let state = figures.clone();
        Box::pin(async move {
            let pending = state.queue.pending(usize::MAX).await.unwrap_or_default();
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
        store = %state.config.store.describe(),
        "warden-approver serving"
    );
    let ran = server.run().await;
    // The spans of the last requests are exported before the process ends.
    warden_daemon::otel::shutdown();
    ran?;
    Ok(())
}
