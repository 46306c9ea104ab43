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
pub mod audit_bounds;
pub mod audit_pg;
pub mod audit_store;
pub mod config;
pub mod journal;
pub mod metrics;
pub mod pruner;
pub mod retention;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tonic::service::Routes;
use warden_daemon::{DaemonArgs, ListenerError, ServeError, Server};
use warden_proto::v1::admin_service_server::AdminServiceServer;
use warden_proto::v1::policy_service_server::PolicyServiceServer;

use crate::audit::{AuditError, AuditLog};
use crate::audit_store::AuditStore;
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
    #[error("audit database: {0}")]
    Database(#[from] warden_pgstate::PgError),
    #[error("policy: {0}")]
    Policy(#[from] ReloadError),
    #[error("listener: {0}")]
    Listener(#[from] ListenerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("import: {0}")]
    Import(String),
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

    /// The admin socket: its default mode admits only the policy's own uid, as a probe runs.
    fn health_socket(&self) -> Option<std::path::PathBuf> {
        let c = &self.loaded.value;
        c.admin.socket_path(&c.daemon.state_dir)
    }

    fn summary(&self) -> String {
        format!(
            "{}; audit store: {}",
            self.loaded.origin,
            self.loaded.value.store.describe()
        )
    }

    /// With the PostgreSQL backend: the database answers and its schema is migrated to what
    /// this binary knows (nothing is changed).
    fn check_host(&self) -> Result<(), Box<dyn std::error::Error>> {
        let store = &self.loaded.value.store;
        if store.backend != warden_pgstate::Backend::Postgres {
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let pg = warden_pgstate::Pg::new(store)?;
            warden_pgstate::migrate::check(&pg).await
        })
        .map_err(|e| format!("store ({}): {e}", store.describe()))?;
        Ok(())
    }

    fn run(self) -> impl std::future::Future<Output = Result<(), RunError>> {
        run(self.sources, self.loaded.value)
    }
}

/// What [`import_sled`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Records in the sled store.
    pub records: usize,
    /// Of those, newly written to PostgreSQL (the others were there from an earlier run).
    pub inserted: u64,
}

/// Copies the audit log of this daemon's sled store (`<state_dir>/store`, its journal replayed
/// first) into the PostgreSQL database `[store]` names, oldest first, then checks that every
/// record is there. Re-running it copies nothing twice (`decision_id` is unique). The daemon
/// must be stopped: sled refuses a second opener.
pub async fn import_sled(cfg: &config::Config) -> Result<Imported, RunError> {
    use prost::Message;
    let dir = cfg
        .store
        .backend
        .sled_to_import(&cfg.daemon.state_dir)
        .map_err(RunError::Import)?;
    let log = AuditLog::open(warden_store::Store::open(&dir)?)?;
    let mut records = log.newest(usize::MAX, |_| true)?;
    records.reverse();
    let pg = warden_pgstate::Pg::new(&cfg.store)?;
    warden_pgstate::migrate::migrate(&pg).await?;
    let client = pg.client().await?;
    let mut inserted = 0u64;
    for chunk in records.chunks(500) {
        let ids: Vec<&str> = chunk.iter().map(|r| r.decision_id.as_str()).collect();
        let reqs: Vec<&str> = chunk.iter().map(|r| r.request_id.as_str()).collect();
        let ctxs: Vec<&str> = chunk
            .iter()
            .map(|r| {
                r.subject
                    .as_ref()
                    .map(|s| s.context_id.as_str())
                    .unwrap_or("")
            })
            .collect();
        let at: Vec<i64> = chunk
            .iter()
            .map(|r| r.decided_at_unix_ms.min(i64::MAX as u64) as i64)
            .collect();
        let bytes: Vec<Vec<u8>> = chunk.iter().map(|r| r.encode_to_vec()).collect();
        inserted += client
            .execute(
                "INSERT INTO policy_audit (decision_id, request_id, context_id, decided_at_unix_ms, record)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[])
                 ON CONFLICT (decision_id) DO NOTHING",
                &[&ids, &reqs, &ctxs, &at, &bytes],
            )
            .await
            .map_err(warden_pgstate::PgError::from)?;
        let there: i64 = client
            .query_one(
                "SELECT count(*) FROM policy_audit WHERE decision_id = ANY($1)",
                &[&ids],
            )
            .await
            .map_err(warden_pgstate::PgError::from)?
            .try_get(0)
            .map_err(warden_pgstate::PgError::from)?;
        if there as usize != chunk.len() {
            return Err(RunError::Import(format!(
                "{} of {} records were not found in the database after the copy",
                chunk.len() - there as usize,
                chunk.len()
            )));
        }
    }
    Ok(Imported {
        records: records.len(),
        inserted,
    })
}

/// Serves until SIGTERM/SIGINT.
async fn run(sources: Sources, cfg: config::Config) -> Result<(), RunError> {
    let audit: Arc<dyn AuditStore> = match cfg.store.backend {
        warden_pgstate::Backend::Sled => {
            let store = warden_store::Store::open(&cfg.daemon.state_dir.join("store"))?;
            Arc::new(AuditLog::open(store)?)
        }
        warden_pgstate::Backend::Postgres => {
            let pg = warden_pgstate::Pg::new(&cfg.store)?;
            // Replicas starting together queue on the migration's advisory lock.
            warden_pgstate::migrate::migrate(&pg).await?;
            Arc::new(audit_pg::PgAudit::start(pg))
        }
    };
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
        // The contract's message bound, stated (the caller keeps every request under it).
        Routes::new(
            PolicyServiceServer::new(PolicyApi(state.clone()))
                .max_decoding_message_size(warden_proto::limits::MAX_DECIDE_MESSAGE_BYTES),
        ),
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

    // Retention, with the `[audit]` in force (a reload changes it).
    let retention_state = state.clone();
    let token = server.shutdown_token();
    tokio::spawn(pruner::run(
        state.audit_store(),
        move || retention_state.active().audit.clone(),
        async move { token.cancelled().await },
    ));

    // SIGHUP (`systemctl reload`) runs what the admin Reload runs (warden_daemon::reload).
    let hup_state = state.clone();
    server.reloads().set(move || {
        let s = hup_state.clone();
        async move {
            match tokio::task::spawn_blocking(move || s.reload()).await {
                Ok(Ok(v)) => Ok(format!("policy version {v}")),
                Ok(Err(e)) => Err(format!("{e}; the rules in force stay")),
                Err(e) => Err(format!("reload task failed: {e}")),
            }
        }
    });
    tracing::info!(
        policy_version = state.active().version,
        store = %cfg.store.describe(),
        "warden-policy serving"
    );
    server.run().await?;
    Ok(())
}
