//! The `warden-supervisor` daemon: loads configuration, reaps what a crashed predecessor left
//! behind, and serves `SupervisorService` + `AdminService` on its Unix socket (gateway only).

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use warden_daemon::args::DaemonArgs;
use warden_proto::v1::admin_service_server::AdminServiceServer;
use warden_proto::v1::supervisor_service_server::SupervisorServiceServer;
use warden_supervisor::service::{Api, Supervisor};
use warden_supervisor::shared::Shared;
use warden_supervisor::{config, policy::PolicyClient, records::Records};

const NAME: &str = "warden-supervisor";

#[derive(Debug, Parser)]
#[command(name = NAME, version, about = "warden-supervisor: conversations, agent processes, the permission bridge")]
struct Args {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// With `[cell]`: mark this cell draining in the shared store (gateways place no new
    /// conversation on it; placed ones keep running here) and exit. For an upgrade or a node
    /// drain; the daemon itself drains on SIGTERM.
    #[arg(long, conflicts_with = "undrain")]
    drain: bool,
    /// With `[cell]`: take this cell back into placement and exit.
    #[arg(long)]
    undrain: bool,
}

/// `--drain` / `--undrain`: one UPDATE of this cell's registry row.
fn set_drain(args: &DaemonArgs, draining: bool) -> Result<String, Box<dyn std::error::Error>> {
    let settings = config::load(args.config.as_deref(), &args.set)?;
    let Some(cell) = settings.file.cell.clone() else {
        return Err(format!(
            "{}: no [cell] section: this supervisor is not a cell",
            settings.origin
        )
        .into());
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let found = rt.block_on(async {
        let pg = warden_supervisor::cell::store(&cell)?;
        warden_supervisor::cell::set_draining(&pg, &cell.id, draining).await
    })?;
    if !found {
        return Err(format!(
            "no cell {:?} in the shared store (has it ever started?)",
            cell.id
        )
        .into());
    }
    Ok(format!(
        "cell {} {}",
        cell.id,
        if draining {
            "draining: no new conversations are placed on it"
        } else {
            "taking new conversations again"
        }
    ))
}

#[derive(Debug, thiserror::Error)]
enum StartupError {
    #[error("state directory {path}: {source}")]
    StateDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] warden_store::StoreError),
    #[error(transparent)]
    Sandbox(#[from] warden_sandbox::SandboxError),
    #[error(transparent)]
    Records(#[from] warden_supervisor::records::RecordError),
    #[error(transparent)]
    Listener(#[from] warden_daemon::ListenerError),
    #[error(transparent)]
    Serve(#[from] warden_daemon::ServeError),
}

/// The supervisor's start-up, through the sequence every daemon shares: its settings and the
/// flags a reload reads them with again.
struct SupervisorDaemon(config::Settings, DaemonArgs);

impl warden_daemon::Daemon for SupervisorDaemon {
    const NAME: &'static str = NAME;
    type Error = StartupError;

    fn load(args: &DaemonArgs) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(SupervisorDaemon(
            config::load(args.config.as_deref(), &args.set)?,
            args.clone(),
        ))
    }

    fn daemon_section(&self) -> &warden_daemon::DaemonSection {
        &self.0.file.daemon
    }

    fn health_socket(&self) -> Option<std::path::PathBuf> {
        let f = &self.0.file;
        f.listen.socket_path(&f.daemon.state_dir)
    }

    /// Every enabled agent that names a `command` must name a program that exists and may be
    /// executed (a misspelt command used to pass here and fail at the first task). An installed
    /// adapter that is missing is not a fault of the file — the operator installs adapters after
    /// the package — so the summary says so instead.
    fn check_host(&self) -> Result<(), Box<dyn std::error::Error>> {
        let s = &self.0;
        for (name, agent) in s.agents.iter().filter(|(_, a)| a.enabled) {
            if agent.command.is_empty() {
                continue;
            }
            if let Err(why) = config::find_program(&agent.command) {
                return Err(format!(
                    "{}: agents.{name}.command {:?}: {why}",
                    s.origin, agent.command
                )
                .into());
            }
        }
        Ok(())
    }

    fn shares(&self) -> Vec<warden_daemon::Share> {
        use warden_daemon::Share;
        let s = &self.0;
        vec![
            Share::new(
                "limits.max_active_turns_per_principal",
                s.max_active_turns_per_principal(),
            )
            .of("limits.max_active_turns", s.max_active_turns()),
            Share::new(
                "limits.max_starting_agents_per_principal",
                s.max_starting_agents_per_principal(),
            )
            .of("limits.max_starting_agents", s.max_starting_agents()),
            Share::new(
                "limits.max_open_conversations_per_principal",
                s.max_open_conversations_per_principal(),
            ),
        ]
    }

    fn summary(&self) -> String {
        let agents: Vec<String> = self
            .0
            .agents
            .iter()
            .map(|(name, a)| match self.0.adapter(a) {
                _ if !a.enabled => format!("{name} (disabled)"),
                Some(Err(_)) => format!("{name} (adapter not installed: its tasks fail)"),
                _ => name.clone(),
            })
            .collect();
        format!("{}; agents: {}", self.0.origin, agents.join(", "))
    }

    fn worker_threads(&self) -> usize {
        self.0.file.runtime.worker_threads
    }

    fn run(self) -> impl std::future::Future<Output = Result<(), StartupError>> {
        run(self.0, self.1)
    }
}

fn main() {
    let args = Args::parse();
    if args.drain || args.undrain {
        match set_drain(&args.daemon, args.drain) {
            Ok(said) => println!("{said}"),
            Err(e) => {
                eprintln!("{NAME}: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    warden_daemon::start::<SupervisorDaemon>(args.daemon);
}

async fn run(settings: config::Settings, args: DaemonArgs) -> Result<(), StartupError> {
    let state = settings.state_dir().to_path_buf();
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&state)
            .map_err(|source| StartupError::StateDir {
                path: state.clone(),
                source,
            })?;
    }
    // Orphaned descendants (setsid'ed tool processes) re-parent here, so the kill ladder sees them.
    if let Err(e) = warden_sandbox::set_child_subreaper() {
        tracing::warn!(error = %e, "cannot become child subreaper");
    }
    let store = warden_store::Store::open(&state.join("store"))?;
    let cgroups = if settings.file.sandbox.cgroup {
        warden_sandbox::CgroupBase::detect(&cgroup_name(&state)).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no usable cgroup v2; process groups and markers only");
            None
        })
    } else {
        None
    };
    let cpu = if settings.file.sandbox.cgroup && settings.file.sandbox.cpu_share {
        let found = warden_sandbox::CpuShares::detect(&cgroup_name(&state));
        match &found {
            Some(c) => tracing::info!(root = %c.root().display(), "agents share CPU per principal"),
            None => tracing::info!(
                "no writable cgroup v1 cpu hierarchy: agents share CPU per process, not per principal"
            ),
        }
        found
    } else {
        None
    };
    // A crashed predecessor's agents: whatever is left of every leased tree is killed in the
    // background, so the daemon serves (and reports healthy) at once; agent starts wait for it
    // (a new conversation must not meet a lease or cgroup the reaper is about to remove).
    let (reaped_tx, reaped) = tokio::sync::watch::channel(false);
    {
        let store = store.clone();
        let cgroups = cgroups.clone();
        let grace = settings.limits().kill_grace();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            match warden_sandbox::reap_leftovers(&store, cgroups.as_ref(), grace).await {
                Ok(r) => tracing::info!(
                    leases = r.leases,
                    trees_killed = r.trees_killed,
                    processes = r.processes,
                    elapsed_ms = t0.elapsed().as_millis() as u64,
                    "reaped leftovers of a previous run"
                ),
                Err(e) => tracing::error!(error = %e, "reaping leftovers failed"),
            }
            let _ = reaped_tx.send(true);
        });
    }
    let bwrap = if settings.file.sandbox.bubblewrap {
        let b = warden_sandbox::find_bwrap().filter(|b| warden_sandbox::bwrap_works(b));
        match &b {
            Some(path) => tracing::info!(bwrap = %path.display(), "agents run under bubblewrap"),
            None => tracing::warn!(
                "bubblewrap is not usable on this host: agents are contained by process group and cgroup only (see `warden doctor`)"
            ),
        }
        b
    } else {
        None
    };
    let plan = warden_sandbox::IdentityPlan::for_this_process(
        &settings.file.sandbox.agent_user,
        &settings.file.sandbox.agent_group,
    )?;
    let sb = &settings.file.sandbox;
    let range = warden_sandbox::UidRange::for_this_process(&sb.agent_uid_range, &sb.agent_group)?;
    if range.is_some() && !sb.agent_user.trim().is_empty() {
        return Err(StartupError::Sandbox(
            warden_sandbox::SandboxError::InvalidInput(
                "sandbox.agent_user and sandbox.agent_uid_range are exclusive: one user for all \
                 agents, or one uid per conversation"
                    .into(),
            ),
        ));
    }
    // With a range, each conversation's identity comes from it; the single one is unused.
    let identity = if range.is_some() {
        None
    } else {
        plan.switched()
    };
    match plan {
        warden_sandbox::IdentityPlan::Switch(i) => {
            tracing::info!(uid = i.uid, gid = i.gid, "agents run as their own uid")
        }
        warden_sandbox::IdentityPlan::SupervisorUid { uid, .. } => tracing::warn!(
            uid,
            "the supervisor is not root: agents run as its own uid and can reach whatever it can (see `warden doctor`)"
        ),
    }
    let spawner = warden_sandbox::Spawner::new(&store, cgroups, bwrap)?
        .with_identity(identity)
        .with_uid_range(range)
        .with_nice(settings.file.sandbox.agent_nice);
    let roots = warden_sandbox::OwnedRoots::open(&state, &store)?;
    let some_agent = identity.or(range.map(|r| warden_sandbox::AgentIdentity {
        uid: r.first,
        gid: r.group.unwrap_or(r.first),
    }));
    if let Some(r) = range {
        tracing::info!(
            first = r.first,
            last = r.last,
            "agents run as one uid per conversation"
        );
    }
    let homes = warden_sandbox::AgentHomes::open_keeping_leftovers(&state, some_agent.is_some())?;
    if let Some(i) = some_agent {
        open_path_to_agents(&state, roots.dir(), homes.dir(), i)?;
    }
    // After the way in is open: a leftover home is removed with its agent's rights, which
    // need search on the state directory (the unit's StateDirectoryMode= takes it away at
    // every start). Listed now, removed in the background: hundreds of homes held up health
    // for about a second, and no new home can meet one of them (each has a name of its own).
    let leftover_homes = homes.leftovers()?;
    if !leftover_homes.is_empty() {
        tokio::task::spawn_blocking(move || {
            warden_sandbox::AgentHomes::remove_homes(leftover_homes)
        });
    }
    let records = Records::new(&state, settings.limits().transcript_bytes)?;
    let policy = PolicyClient::with_failover(&settings.policy_sockets()).with_answer_grace(
        std::time::Duration::from_millis(settings.file.policy.answer_grace_ms),
    );
    // Made before the conversations' shared state, which holds its reloads (SIGHUP, admin
    // Reload).
    let grace = Duration::from_millis(settings.file.daemon.shutdown_grace_ms);
    let mut server = warden_daemon::Server::new(NAME, grace);
    let shared = Shared {
        depth: warden_sandbox::DepthGuard::from_process_env(warden_sandbox::DEFAULT_MAX_DEPTH),
        settings: std::sync::RwLock::new(Arc::new(settings.clone())),
        reloads: server.reloads(),
        policy,
        records,
        roots,
        workspaces: warden_sandbox::WorkspacePolicy::from_host(),
        spawner,
        homes,
        live: warden_supervisor::live::LiveAgents::new(
            settings.max_live_agents(),
            settings.limits().max_agent_waiters,
        ),
        admission: warden_supervisor::admission::Admission::new(
            settings.max_active_turns(),
            settings.max_active_turns_per_principal(),
        ),
        starts: warden_supervisor::admission::Admission::new(
            settings.max_starting_agents(),
            settings.max_starting_agents_per_principal(),
        ),
        reaped,
        cpu,
        fair: warden_fairshare::global().clone(),
    };
    let sup = Supervisor::new(shared);
    {
        let sup = sup.clone();
        let args = Arc::new(args);
        server.reloads().set(move || {
            let (sup, args) = (sup.clone(), args.clone());
            async move {
                // Reads files: off the async workers.
                tokio::task::spawn_blocking(move || {
                    let next = config::load(args.config.as_deref(), &args.set)
                        .map_err(|e| e.to_string())?;
                    let running = sup.shared.settings();
                    let (next, kept) = config::reloadable(&running, next);
                    let agents = next.agents.keys().cloned().collect::<Vec<_>>().join(", ");
                    sup.shared.reload_settings(next);
                    let mut said = format!(
                        "agents ({agents}), workspaces and limits for new conversations, agent starts and turns"
                    );
                    if !kept.is_empty() {
                        said.push_str(&format!(
                            "; changed but applied only at a restart: {}",
                            kept.join(", ")
                        ));
                    }
                    Ok(said)
                })
                .await
                .unwrap_or_else(|e| Err(format!("reload task failed: {e}")))
            }
        });
    }
    // Warm agents: a previous run's warm roots removed, then filled in the background.
    sup.pool.start().await;
    // As the child subreaper, orphans whose parent never waited for them come here (bubblewrap's
    // namespace init, for one): collect their zombies, leaving alone the leaders of live trees,
    // whose status tokio collects. Started after the start-up probes, which wait for their own.
    {
        let sup = sup.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                let owned: std::collections::HashSet<i32> = match sup.shared.spawner.leases().list()
                {
                    Ok(l) => l.into_iter().flatten().map(|l| l.leader.pid).collect(),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list leases; not reaping orphans");
                        continue;
                    }
                };
                // A walk of /proc: off the runtime thread (thousands of processes take a while).
                let n = tokio::task::spawn_blocking(move || {
                    warden_sandbox::reap_orphan_zombies(&owned)
                })
                .await
                .unwrap_or(0);
                if n > 0 {
                    tracing::debug!(reaped = n, "collected orphaned zombies");
                }
            }
        });
    }
    let cell = match &settings.file.cell {
        Some(section) => match warden_supervisor::cell::Cell::new(section) {
            Ok(cell) => {
                let figures = sup.clone();
                cell.start(Arc::new(move || {
                    let live = figures.shared.live.live();
                    let held = live.saturating_sub(figures.shared.live.pooled());
                    let cap = figures.shared.live.cap();
                    let (total, avail) = warden_supervisor::cell::memory();
                    warden_supervisor::cell::Capacity {
                        live_agents: live,
                        max_live_agents: cap,
                        free_slots: cap.saturating_sub(held),
                        mem_total_bytes: total,
                        mem_avail_bytes: avail,
                    }
                }))
                .await;
                tracing::info!(cell = %section.id, address = %section.address, "registering as a cell in the shared store");
                Some(cell)
            }
            Err(e) => {
                tracing::error!(error = %e, "[cell]: cannot set up the shared store; this cell is not registered");
                None
            }
        },
        None => None,
    };
    let listener = warden_daemon::listener::bind("listen", &settings.file.listen, &state).await?;
    let api = Api(sup.clone());
    let routes = tonic::service::Routes::new(SupervisorServiceServer::new(api.clone()))
        .add_service(AdminServiceServer::new(api));
    if let Some(remote) = &settings.file.listen_remote {
        let remote = warden_daemon::listener::bind("listen_remote", remote, &state).await?;
        server.serve(remote, routes.clone());
    }
    server.serve(listener, routes);
    let figures = sup.clone();
    let refresh: warden_daemon::metrics::Refresh = Arc::new(move || {
        let sup = figures.clone();
        Box::pin(async move {
            let (running, waiting, _) = sup.shared.admission.figures();
            warden_supervisor::metrics::set(warden_supervisor::metrics::Figures {
                live_agents: sup.shared.live.live(),
                warm_agents: sup.shared.live.pooled(),
                max_live_agents: sup.shared.live.cap(),
                conversations: sup.conversations().await.len(),
                turns_running: running,
                turns_waiting_admission: waiting,
                turns_waiting_agent: sup.shared.live.waiting().0,
            })
        })
    });
    warden_supervisor::metrics::known_refusals(
        (0..64)
            .filter_map(|i| warden_proto::v1::FaultClass::try_from(i).ok())
            .filter(|c| *c != warden_proto::v1::FaultClass::Unspecified)
            .map(warden_supervisor::fault::name),
    );
    server
        .serve_metrics(
            &settings.file.daemon,
            warden_supervisor::metrics::exporter(refresh),
        )
        .await?;
    if let Ok(mut l) = sup.listeners.lock() {
        *l = server.listeners();
    }
    let token = server.shutdown_token();
    let closer = {
        let sup: Arc<Supervisor> = sup.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            // First out of placement, so no gateway sends a new conversation to a cell that is
            // going away.
            if let Some(cell) = &cell {
                match cell.drain().await {
                    Ok(()) => tracing::info!(cell = %cell.id(), "draining: no new placements"),
                    Err(e) => {
                        tracing::warn!(cell = %cell.id(), error = %e, "cannot mark the cell draining")
                    }
                }
            }
            sup.close_all().await;
        })
    };
    let res = server.run().await;
    // Every agent tree goes before the daemon does: the closer started on the shutdown signal
    // is waited for (a close it has under way takes the conversation out of its slot, so a
    // second close_all would not see it and the daemon would exit mid-kill, leaving the tree's
    // lease behind), then anything opened meanwhile is closed too.
    let _ = closer.await;
    sup.close_all().await;
    // The kills dropped their leases without a flush each (one fsync per tree would hold up a
    // stop of hundreds); one flush now makes "a graceful stop releases every lease" durable.
    if let Err(e) = store.flush() {
        tracing::warn!(error = %e, "cannot flush the store on the way out");
    }
    res.map_err(Into::into)
}

/// Agents reach their roots and homes by path (bubblewrap runs as the agent and resolves its
/// bind sources on the host), so the agent uid needs search (`x`, never listing) on the state
/// directory and the two directories below it that hold roots and homes. The store, which is
/// created with the default umask, is closed to everyone else first. A directory above the
/// state directory that the agent cannot search is the operator's to open: start-up refuses,
/// naming it.
fn open_path_to_agents(
    state: &std::path::Path,
    sandboxes: &std::path::Path,
    homes: &std::path::Path,
    who: warden_sandbox::AgentIdentity,
) -> Result<(), StartupError> {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &std::path::Path, f: &dyn Fn(u32) -> u32| -> Result<(), StartupError> {
        let mode = std::fs::metadata(p)
            .map_err(|source| StartupError::StateDir {
                path: p.to_path_buf(),
                source,
            })?
            .permissions()
            .mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(f(mode) & 0o7777)).map_err(
            |source| StartupError::StateDir {
                path: p.to_path_buf(),
                source,
            },
        )
    };
    set(&state.join("store"), &|_| 0o700)?;
    for d in [state, sandboxes, homes] {
        set(d, &|m| m | 0o001)?;
    }
    for d in [sandboxes, homes] {
        if let Some(blocked) = warden_sandbox::first_unsearchable(d, who) {
            return Err(StartupError::Sandbox(
                warden_sandbox::SandboxError::InvalidInput(format!(
                    "agents run as uid {} but cannot search {}; give it search permission \
                     (chmod o+x, or an ACL for that uid) or move daemon.state_dir",
                    who.uid,
                    blocked.display()
                )),
            ));
        }
    }
    Ok(())
}

/// The cgroup base of this supervisor: one per state directory, so two supervisors on one host
/// (tests, or two deployments) never reap each other's conversation cgroups at start-up.
fn cgroup_name(state: &std::path::Path) -> String {
    let canon = std::fs::canonicalize(state).unwrap_or_else(|_| state.to_path_buf());
    // FNV-1a: stable across releases, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canon.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("warden-supervisor-{:08x}", h as u32)
}
