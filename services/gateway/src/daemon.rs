//! Running the gateway as a daemon: configuration, store recovery, the admin gRPC listener
//! (health + AdminService.Status) and the HTTP listener, with a bounded graceful shutdown.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::service::Routes;
use tonic::{Request, Response, Status};
use warden_daemon::{DaemonArgs, Server};
use warden_proto::v1::admin_service_server::{AdminService, AdminServiceServer};
use warden_proto::v1::{
    AuditQueryRequest, AuditQueryResponse, ReloadRequest, ReloadResponse, StatusRequest,
    StatusResponse,
};

use crate::admission::HttpState;
use crate::auth::{AuthConfigError, Authenticator, HostAllowlist};
use crate::card::{CardResponse, agent_card};
use crate::config::{EMBEDDED, GatewayConfig};
use crate::core::{Core, CoreSettings, Retention};
use crate::http::router;
use crate::serve::EdgeLimits;
use crate::store::{TaskStore, TaskStoreError};
use crate::store_sled::SledStore;

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] warden_daemon::ConfigError),
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    #[error("task store: {0}")]
    Store(#[from] TaskStoreError),
    #[error("task database: {0}")]
    Database(#[from] warden_pgstate::PgError),
    #[error("--import-sled: {0}")]
    Import(String),
    #[error(transparent)]
    Listener(#[from] warden_daemon::ListenerError),
    #[error("cannot bind the HTTP listener {addr}: {source}")]
    HttpBind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind the A2A gRPC listener grpc.tcp = {addr}: {source}")]
    GrpcBind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Serve(#[from] warden_daemon::ServeError),
    #[error("push.ca_file: {0}")]
    PushTls(String),
    #[error("supervisor.tls: {0}")]
    SupervisorTls(#[from] warden_daemon::tls::TlsError),
    #[error(transparent)]
    Cells(#[from] crate::cells::CellsError),
}

/// Loads and validates the configuration the way the binary does.
pub fn load_config(
    args: &DaemonArgs,
) -> Result<warden_daemon::LoadedConfig<GatewayConfig>, RunError> {
    let loaded = warden_daemon::config::load::<GatewayConfig>(
        args.config.as_deref(),
        EMBEDDED,
        "WARDEN_GATEWAY",
        &args.set,
    )?;
    loaded.value.validate(&loaded.origin)?;
    Ok(loaded)
}

struct AdminApi {
    reloads: warden_daemon::reload::Reloads,
    core: Arc<Core>,
    conns: Arc<crate::shares::ConnTable>,
    push: Arc<crate::push::Push>,
    started: Instant,
    listeners: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let mut details = std::collections::HashMap::new();
        details.insert("tasks_live".to_string(), self.core.live_count().to_string());
        let store = self.core.store();
        // As the policy and the approver say it (`warden doctor` reads these).
        let backend = if store.shared() { "postgres" } else { "sled" };
        details.insert("store_backend".to_string(), backend.to_string());
        details.insert("store".to_string(), store.describe());
        if let Ok(n) = store.task_count().await {
            details.insert("tasks_stored".to_string(), n.to_string());
        }
        if let Some(bytes) = store.size_on_disk() {
            details.insert("store_bytes".to_string(), bytes.to_string());
        }
        details.insert(
            "streams_open".to_string(),
            self.core.streams().total().to_string(),
        );
        details.insert(
            "connections_authenticated".to_string(),
            self.conns.authenticated().to_string(),
        );
        details.insert(
            "connections_unauthenticated".to_string(),
            self.conns.unauthenticated().to_string(),
        );
        self.reloads.details(&mut details);
        if self.push.enabled() {
            let p = self.push.stats();
            details.insert("push_delivered".to_string(), p.delivered.to_string());
            details.insert("push_retries".to_string(), p.retries.to_string());
            details.insert("push_failed".to_string(), p.failed.to_string());
            if let Some(last) = p.last_failure {
                details.insert("push_last_failure".to_string(), last);
            }
        }
        Ok(Response::new(warden_daemon::status::response(
            "warden-gateway",
            self.started,
            self.listeners.lock().map(|l| l.clone()).unwrap_or_default(),
            details,
        )))
    }

    async fn audit_query(
        &self,
        _: Request<AuditQueryRequest>,
    ) -> Result<Response<AuditQueryResponse>, Status> {
        Err(Status::unimplemented(
            "the gateway keeps no audit log; ask warden-policy",
        ))
    }

    async fn reload(&self, _: Request<ReloadRequest>) -> Result<Response<ReloadResponse>, Status> {
        Ok(Response::new(self.reloads.reload("admin Reload").await))
    }

    type AuditFollowStream =
        futures::stream::Empty<Result<warden_proto::v1::AuditFollowEvent, Status>>;

    async fn audit_follow(
        &self,
        _: Request<warden_proto::v1::AuditFollowRequest>,
    ) -> Result<Response<Self::AuditFollowStream>, Status> {
        Err(Status::unimplemented(
            "the gateway keeps no audit log; ask warden-policy",
        ))
    }
}

/// What a reload (SIGHUP, `warden reload`) changes while the gateway runs: the callers'
/// tokens (`[auth]`: `tokens`, or the token file read again), who may use which agent and
/// workspace (`[[agents.access]]`) and the webhook allowlist (`push.allowed_hosts`,
/// `push.allowed_networks`). Everything is read and checked first; only a configuration that
/// loads whole is applied, so a bad file changes nothing. What needs a restart to change
/// (listeners, the supervisor, the store, HTTP limits, …) is named when it differs.
fn reload(
    args: &DaemonArgs,
    running: &GatewayConfig,
    auth: &Authenticator,
    core: &Core,
    push: &crate::push::Push,
) -> Result<String, String> {
    let next = load_config(args).map_err(|e| e.to_string())?.value;
    let tokens = Authenticator::from_config(&next).map_err(|e| e.to_string())?;
    // Checked whole; from here on nothing fails.
    auth.replace(&tokens);
    core.set_access(crate::core::AgentAccess::from_config(&next.agents.access));
    push.set_allowlist(&next.push);
    let mut said = format!(
        "{} caller token(s), {} [[agents.access]] entr(ies), push allowlist of {} host(s) and {} network(s)",
        tokens.len(),
        next.agents.access.len(),
        next.push.allowed_hosts.len(),
        next.push.allowed_networks.len()
    );
    let stale = restart_only_changes(running, &next);
    if !stale.is_empty() {
        said.push_str(&format!(
            "; changed but applied only at a restart: {}",
            stale.join(", ")
        ));
    }
    Ok(said)
}

/// The sections of `next` that differ from what the gateway started with, beyond what a
/// reload applies.
fn restart_only_changes(running: &GatewayConfig, next: &GatewayConfig) -> Vec<&'static str> {
    let same =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    let unreloadable_push = |p: &crate::config::PushSection| {
        let mut p = p.clone();
        p.allowed_hosts.clear();
        p.allowed_networks.clear();
        p
    };
    let unreloadable_agents = |a: &crate::config::AgentsSection| {
        let mut a = a.clone();
        a.access.clear();
        a
    };
    let mut out = Vec::new();
    for (name, differs) in [
        ("daemon", !same(&running.daemon, &next.daemon)),
        ("listen", !same(&running.listen, &next.listen)),
        ("supervisor", !same(&running.supervisor, &next.supervisor)),
        ("http", !same(&running.http, &next.http)),
        ("card", !same(&running.card, &next.card)),
        ("store", !same(&running.store, &next.store)),
        ("mcp", !same(&running.mcp, &next.mcp)),
        ("grpc", !same(&running.grpc, &next.grpc)),
        ("cells", !same(&running.cells, &next.cells)),
        (
            "push",
            !same(
                &unreloadable_push(&running.push),
                &unreloadable_push(&next.push),
            ),
        ),
        (
            "agents",
            !same(
                &unreloadable_agents(&running.agents),
                &unreloadable_agents(&next.agents),
            ),
        ),
    ] {
        if differs {
            out.push(name);
        }
    }
    out
}

/// warden-gateway as a daemon: its validated configuration, where it came from, and the
/// flags a reload reads it with again.
pub struct GatewayDaemon {
    loaded: warden_daemon::LoadedConfig<GatewayConfig>,
    args: DaemonArgs,
}

impl warden_daemon::Daemon for GatewayDaemon {
    const NAME: &'static str = "warden-gateway";
    type Error = RunError;

    fn load(args: &DaemonArgs) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(GatewayDaemon {
            loaded: load_config(args)?,
            args: args.clone(),
        })
    }

    fn daemon_section(&self) -> &warden_daemon::DaemonSection {
        &self.loaded.value.daemon
    }

    fn shares(&self) -> Vec<warden_daemon::Share> {
        use warden_daemon::Share;
        let c = &self.loaded.value;
        vec![
            Share::new(
                "http.max_connections_per_principal",
                c.http.principal_connection_share(),
            )
            .of("http.max_connections", c.http.max_connections),
            Share::new(
                "http.max_unauthenticated_connections",
                c.http.unauthenticated_share(),
            )
            .of("http.max_connections", c.http.max_connections),
            Share::new(
                "http.max_grpc_requests_per_principal",
                c.http.principal_grpc_request_share(),
            ),
            Share::new(
                "http.max_streams_per_principal",
                c.http.max_streams_per_principal,
            ),
            Share::new(
                "mcp.max_sessions_per_principal",
                c.mcp.sessions_per_principal(),
            )
            .of("mcp.max_sessions", c.mcp.max_sessions),
            Share::new("store.max_tasks", c.store.max_tasks),
            Share::new("push.max_configs_per_task", c.push.max_configs_per_task),
            Share::new(
                "push.max_lookups_per_principal",
                c.push.max_lookups_per_principal,
            )
            .of("push.max_lookups", c.push.max_lookups),
            Share::new(
                "push.max_deliveries_per_principal",
                c.push.max_deliveries_per_principal,
            )
            .of("push.max_deliveries", c.push.max_deliveries),
        ]
    }

    fn health_socket(&self) -> Option<std::path::PathBuf> {
        let c = &self.loaded.value;
        c.listen.socket_path(&c.daemon.state_dir)
    }

    fn summary(&self) -> String {
        format!(
            "{} (task store: {})",
            self.loaded.origin,
            self.loaded.value.store.database().describe()
        )
    }

    /// With `backend = "postgres"`: the database answers and its schema is migrated (nothing
    /// is changed).
    fn check_host(&self) -> Result<(), Box<dyn std::error::Error>> {
        let store = self.loaded.value.store.database();
        if store.backend != warden_pgstate::Backend::Postgres {
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let pg = warden_pgstate::Pg::new(&store)?;
            warden_pgstate::migrate::check(&pg).await?;
            Ok::<_, warden_pgstate::PgError>(())
        })?;
        Ok(())
    }

    fn run(self) -> impl std::future::Future<Output = Result<(), RunError>> {
        run(self.loaded.value, self.args)
    }
}

/// The task store `[store]` names: the gateway's own sled store, or the PostgreSQL database
/// its replicas share (migrated first, under the advisory lock).
pub async fn open_store(cfg: &GatewayConfig) -> Result<TaskStore, RunError> {
    Ok(match cfg.store.backend {
        warden_pgstate::Backend::Sled => std::sync::Arc::new(SledStore::open_with(
            &cfg.daemon.state_dir.join("store"),
            warden_store::StoreOptions {
                cache_capacity_bytes: cfg.store.cache_capacity_bytes,
            },
        )?),
        warden_pgstate::Backend::Postgres => {
            let pg = warden_pgstate::Pg::new(&cfg.store.database())?;
            warden_pgstate::migrate::migrate(&pg).await?;
            std::sync::Arc::new(crate::store_pg::PgStore::new(pg))
        }
    })
}

/// What [`import_sled`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub tasks: usize,
    pub contexts: usize,
    pub push_configs: usize,
}

/// Copies this gateway's sled store (`<state_dir>/store`) into the PostgreSQL database
/// `[store]` names: contexts, then each task (head, history, artifacts merged, push configs),
/// then reads every task back from PostgreSQL and compares it with sled's. A task the stopped
/// gateway left running is first ended FAILED, as its restart would. Re-running it rewrites the
/// same rows. The gateway must be stopped: sled refuses a second opener.
pub async fn import_sled(cfg: &GatewayConfig) -> Result<Imported, RunError> {
    let dir = cfg
        .store
        .backend
        .sled_to_import(&cfg.daemon.state_dir)
        .map_err(RunError::Import)?;
    let sled = SledStore::open(&dir)?;
    sled.recover()?;
    sled.flush()?;
    let pg = warden_pgstate::Pg::new(&cfg.store.database())?;
    warden_pgstate::migrate::migrate(&pg).await?;
    let to = crate::store_pg::PgStore::with_owner(pg, "import-sled".into());
    use crate::store::TaskBackend;
    let contexts = sled.contexts()?;
    for (id, rec) in &contexts {
        to.put_context(id, rec).await?;
    }
    let heads = sled.heads()?;
    let mut push_configs = 0;
    for head in &heads {
        let id = head.task.id.as_str();
        let Some((task, _)) = sled.load(id)? else {
            continue;
        };
        to.put_head(head).await?;
        to.put_history_segment(id, 0, &task.history).await?;
        let chunks: Vec<(u32, u64, crate::store::ArtifactChunk)> = task
            .artifacts
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (
                    i as u32,
                    0,
                    crate::store::ArtifactChunk {
                        artifact: a.clone(),
                        append: false,
                    },
                )
            })
            .collect();
        to.put_artifact_chunks(id, &chunks).await?;
        for p in sled.push_configs(id)? {
            to.put_push(&p).await?;
            push_configs += 1;
        }
        // Read back: the task as PostgreSQL has it is the task sled had.
        match TaskBackend::load(&to, id).await? {
            Some((moved, rec)) if moved == task && rec.principal == head.principal => {}
            _ => {
                return Err(RunError::Import(format!(
                    "task {id} does not read back the same from PostgreSQL; the sled store is left as it was"
                )));
            }
        }
    }
    Ok(Imported {
        tasks: heads.len(),
        contexts: contexts.len(),
        push_configs,
    })
}

/// Serves until SIGTERM/SIGINT; reloads on SIGHUP ([`reload`]).
async fn run(cfg: GatewayConfig, args: DaemonArgs) -> Result<(), RunError> {
    let store = open_store(&cfg).await?;
    tracing::info!(store = %store.describe(), "task store open");
    let auth = Authenticator::from_config(&cfg)?;
    let settings = CoreSettings {
        agents: cfg.agents.list.iter().map(|a| a.name.clone()).collect(),
        default_agent: cfg.agents.default.clone(),
        turn_timeout_seconds: cfg.supervisor.turn_timeout_seconds,
        cancel_grace: Duration::from_millis(cfg.supervisor.cancel_grace_ms),
        coalesce_bytes: crate::mapping::DEFAULT_COALESCE_BYTES,
        retention: Retention::from_config(&cfg.store),
        max_streams_per_principal: cfg.http.max_streams_per_principal,
        stream_keepalive: Duration::from_millis(cfg.http.stream_keepalive_ms),
    };
    let channel = match (&cfg.supervisor.tcp, &cfg.supervisor.tls) {
        (Some(addr), Some(tls)) => {
            tracing::info!(supervisor = %addr, "supervisor on another host: mutual TLS");
            warden_daemon::tls::ClientTls::new(tls, &cfg.daemon.state_dir)?.channel(addr)?
        }
        _ => warden_daemon::client::unix_channel(&cfg.supervisor.socket),
    };
    let core = Core::new(store.clone(), channel, settings);
    let push = crate::push::Push::new(cfg.push.clone(), store, &cfg.daemon.state_dir)
        .map_err(RunError::PushTls)?;
    core.set_push(push.clone());
    core.set_access(crate::core::AgentAccess::from_config(&cfg.agents.access));
    if let Some(section) = &cfg.cells {
        let cells = crate::cells::Cells::start(section, &cfg.daemon.state_dir).await?;
        tracing::info!(
            choices = section.choices,
            lost_after_ms = section.lost_after_ms,
            "cells mode: conversations are placed on the registered cells"
        );
        core.set_cells(cells);
    }
    // The supervisor's registry is the one source of agent names; until it answers, the
    // configured list stands (an unknown name asks again).
    if let Err(e) = core.refresh_agents().await {
        tracing::warn!(error = %e, "cannot list the supervisor's agents yet; using agents.list");
    }
    let recovered = core.recover().await?;
    if recovered > 0 {
        tracing::warn!(
            tasks = recovered,
            "marked tasks left running by a previous gateway FAILED"
        );
    }

    // The A2A port is bound before the admin socket serves health: a caller that sees the
    // gateway healthy can connect (until the accept loop runs, the kernel queues it).
    let http = tokio::net::TcpListener::bind(&cfg.http.bind)
        .await
        .map_err(|source| RunError::HttpBind {
            addr: cfg.http.bind.clone(),
            source,
        })?;
    let grace = Duration::from_millis(cfg.daemon.shutdown_grace_ms);
    let mut server = Server::new("warden-gateway", grace);
    {
        let (running, auth, core, push) = (cfg.clone(), auth.clone(), core.clone(), push.clone());
        let args = Arc::new(args);
        server.reloads().set(move || {
            let (args, running, auth, core, push) = (
                args.clone(),
                running.clone(),
                auth.clone(),
                core.clone(),
                push.clone(),
            );
            async move {
                // Reads files: off the async workers.
                tokio::task::spawn_blocking(move || reload(&args, &running, &auth, &core, &push))
                    .await
                    .unwrap_or_else(|e| Err(format!("reload task failed: {e}")))
            }
        });
    }
    // The A2A gRPC binding, when configured, bound before health is served like the A2A port:
    // the same core and tokens as the HTTP bindings. On
    // plain TCP it is served by the HTTP edge (`serve.rs`: one cap, one table of shares, the
    // same deadlines); on a Unix socket (peers admitted by uid) or with mutual TLS (by
    // certificate) by the daemon's gRPC server with its peer guard.
    let mut grpc_edge = None;
    if let Some(g) = &cfg.grpc {
        let service = crate::a2a_grpc::Grpc {
            core: core.clone(),
            auth: auth.clone(),
            card: CardResponse::new(&agent_card(&cfg), cfg.http.card_max_age_seconds),
        }
        .server();
        match (&g.tcp, &g.tls) {
            (Some(addr), None) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| RunError::GrpcBind {
                        addr: addr.clone(),
                        source,
                    })?;
                let at = listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| addr.clone());
                tracing::info!(listener = %format!("tcp:{at}"), "A2A gRPC listening (HTTP edge)");
                let health = tonic_health::pb::health_server::HealthServer::new(
                    tonic_health::server::HealthService::from_health_reporter(server.health()),
                );
                let app = Routes::new(service)
                    .add_service(health)
                    .into_axum_router()
                    .layer(warden_daemon::otel::TraceLayer);
                grpc_edge = Some((listener, app, format!("tcp:{at}")));
            }
            _ => {
                let listener =
                    warden_daemon::listener::bind("grpc", g, &cfg.daemon.state_dir).await?;
                tracing::info!(listener = %listener.describe(), "A2A gRPC listening");
                server.serve(listener, Routes::new(service));
            }
        }
    }

    let listeners = Arc::new(Mutex::new(Vec::new()));
    let listen =
        warden_daemon::listener::bind("listen", &cfg.listen, &cfg.daemon.state_dir).await?;
    let conns = crate::shares::ConnTable::new(
        cfg.http.unauthenticated_share(),
        cfg.http.principal_connection_share(),
    );
    // The gateway's gRPC socket is the operators' (health and Status).
    server.serve_admin(
        listen,
        Routes::new(AdminServiceServer::new(AdminApi {
            reloads: server.reloads(),
            core: core.clone(),
            conns: conns.clone(),
            push: push.clone(),
            started: Instant::now(),
            listeners: listeners.clone(),
        })),
        &[warden_proto::v1::admin_service_server::SERVICE_NAME],
    );

    let bound = http
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| cfg.http.bind.clone());
    let figures = core.clone();
    let refresh: warden_daemon::metrics::Refresh = Arc::new(move || {
        let c = figures.clone();
        Box::pin(async move {
            let stored = c.store().task_count().await.unwrap_or(0);
            crate::metrics::set(c.live_count(), stored, c.streams().total())
        })
    });
    server
        .serve_metrics(&cfg.daemon, crate::metrics::exporter(refresh))
        .await?;
    if let Ok(mut l) = listeners.lock() {
        *l = server.listeners();
        l.push(format!("tcp:{bound}"));
        if let Some((_, _, at)) = &grpc_edge {
            l.push(at.clone());
        }
    }
    // Pruning and conversation TTL in the background, until shutdown.
    let sweeper = tokio::spawn(core.clone().sweep_forever(server.shutdown_token()));
    // With replicas on one database: this replica's leases, and the tasks of stopped ones.
    let leases = tokio::spawn(core.clone().leases_forever(server.shutdown_token()));
    // …and the answers other replicas hold for the tasks this one follows.
    let answers = tokio::spawn(core.clone().answers_forever(server.shutdown_token()));
    let core_for_mcp = core.clone();
    let edge_auth = auth.clone();
    let state = Arc::new(HttpState {
        core,
        auth,
        hosts: HostAllowlist::from_config(&cfg),
        max_body: cfg.http.max_body_bytes,
        body_timeout: Duration::from_millis(cfg.http.body_read_timeout_ms),
        card: CardResponse::new(&agent_card(&cfg), cfg.http.card_max_age_seconds),
    });
    let token = server.shutdown_token();
    let mut app = router(state);
    if cfg.mcp.enabled {
        let front = crate::mcp::McpFront::new(
            core_for_mcp,
            cfg.mcp.clone(),
            Duration::from_millis(cfg.supervisor.cancel_grace_ms),
        );
        let edge = Arc::new(crate::mcp::Edge::new(front, &cfg, edge_auth.clone())?);
        app = app.merge(crate::mcp::routes(edge, server.shutdown_token()));
        tracing::info!(path = crate::mcp::MCP_PATH, "MCP listening");
    }
    tracing::info!(bind = %bound, public_url = %cfg.http.public_url, "A2A listening");
    let limits = EdgeLimits {
        header_read_timeout: Duration::from_millis(cfg.http.header_read_timeout_ms),
        idle_timeout: Duration::from_millis(cfg.http.idle_timeout_ms),
        max_connections: cfg.http.max_connections,
        max_unauthenticated_connections: cfg.http.unauthenticated_share(),
        max_connections_per_principal: cfg.http.principal_connection_share(),
        max_grpc_requests_per_principal: cfg.http.principal_grpc_request_share(),
        grpc_max_concurrent_streams: cfg.http.grpc_max_concurrent_streams,
    };
    // Each HTTP request continues its caller's trace (W3C traceparent) when tracing is on.
    let app = app
        .layer(axum::middleware::from_fn(crate::http::observe))
        .layer(warden_daemon::otel::TraceLayer);
    // The HTTP listener and the A2A gRPC one on TCP: one edge, one cap, one table of shares.
    let edge = crate::serve::Edge::new(limits, edge_auth, conns);
    // `http.tls`: both callers' listeners speak TLS, each with its own ALPN.
    let caller_tls = |alpn: &[&[u8]]| {
        cfg.http
            .tls
            .as_ref()
            .map(|t| warden_daemon::tls::CallerTls::new(t, &cfg.daemon.state_dir, alpn))
            .transpose()
            .map(|t| t.map(Arc::new))
    };
    let http_tls = caller_tls(&[b"http/1.1"])?;
    let grpc_tls = caller_tls(&[b"h2"])?;
    if let Some(t) = &http_tls {
        tracing::info!(client_certs = ?t.client_certs(), "callers' listeners speak TLS");
    }
    let mut http_task = tokio::spawn(async move {
        let grpc = async {
            if let Some((listener, app, _)) = grpc_edge {
                edge.clone()
                    .serve(
                        listener,
                        app,
                        crate::serve::Protocol::Grpc,
                        grpc_tls,
                        token.clone(),
                    )
                    .await
            }
        };
        tokio::join!(
            edge.clone().serve(
                http,
                app,
                crate::serve::Protocol::Http1,
                http_tls,
                token.clone()
            ),
            grpc
        );
    });
    let shutdown = server.shutdown_token();
    let run = server.run();
    tokio::pin!(run);
    let result = tokio::select! {
        r = &mut run => r,
        r = &mut http_task => {
            if shutdown.is_cancelled() {
                // Shutting down: the HTTP side drained first; let the gRPC side finish its own
                // drain and remove its socket. (The HTTP task is complete: not polled again.)
                return run.await.map_err(RunError::from);
            } else {
                tracing::error!(result = ?r, "the HTTP server stopped");
                shutdown.cancel();
                let _ = run.await;
                return Err(RunError::HttpBind { addr: bound, source: std::io::Error::other("HTTP server stopped") });
            }
        }
    };
    // Open SSE streams would hold the HTTP server open; they get the same grace as gRPC calls.
    if tokio::time::timeout(grace, &mut http_task).await.is_err() {
        http_task.abort();
    }
    sweeper.abort();
    leases.abort();
    answers.abort();
    result?;
    Ok(())
}
