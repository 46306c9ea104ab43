//! Spawning an agent: recursion guard, clean environment, own process group, parent-death
//! signal, own cgroup (entered between fork and exec), bubblewrap when installed, a lease on disk
//! before any agent code runs.
//!
//! When the supervisor is root the child switches to the agent identity between fork and exec,
//! after it has entered its cgroup (moving into a cgroup needs the supervisor's rights) and
//! before it arms `PR_SET_PDEATHSIG` (a credential change clears it): `setgroups([])`, `setgid`,
//! `setuid`. bubblewrap then runs unprivileged, in a user namespace.
//!
//! The child is started as `/bin/sh -c <gate> warden-gate CMD…` where the gate blocks on fd 3
//! until the parent has recorded the lease, then closes fd 3 and `exec`s CMD (bubblewrap or the
//! program). See `lease.rs` for why this ordering closes the crash race.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits. Call
//! [`Spawner::spawn`] from a runtime worker thread or the main thread, never from
//! `spawn_blocking` (those threads are retired after idling, which would kill the agent).

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{ChildStderr, ChildStdout, Command};
use warden_containment::{RealFs, resolve};
use warden_store::Store;

use crate::SandboxError;
use crate::cgroup::{CgroupBase, Limits, LimitsOutcome};
use crate::control::{ControlBind, prepare_home, prepare_root};
use crate::env::{ChildEnv, DEPTH_ENV, DepthGuard, TREE_MARKER_ENV};
use crate::etc::{AdapterPolicy, EtcBind, etc_plan};
use crate::git::GitBind;
use crate::identity::{AGENT_NAME, AgentIdentity, UidPool, UidRange, first_unsearchable};
use crate::kill::ProcessTree;
use crate::lease::{Lease, Leases, now_unix_ms};
use crate::procfs::ProcessIdentity;
use crate::roots::{Boundary, Profile, sanitize_label};
use warden_containment::rights::Rights;

const GATE: &str = "IFS= read -r _warden_gate <&3 || exit 111; exec 3<&-; exec \"$@\"";
const SH: &str = "/bin/sh";

/// The network an agent gets under bubblewrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// Own network namespace, loopback only.
    #[default]
    None,
    /// The host's network (a real agent must reach its model API).
    Host,
    /// Own network namespace, loopback only, and the egress relay in front of the program
    /// ([`SpawnSpec::egress`]): the only way out is the supervisor's proxy. Needs bubblewrap; a
    /// spawn without it is refused (never the host's network instead).
    Proxy,
}

/// Where the sandbox finds the directory holding the proxy's socket.
pub const EGRESS_DIR_INSIDE: &str = "/run/warden-egress";
/// The socket's name in that directory.
pub const EGRESS_SOCKET_NAME: &str = "proxy.sock";

/// The egress relay of a `Network::Proxy` spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSpec {
    /// The `warden-egress-relay` binary (bound read-only).
    pub relay: PathBuf,
    /// The host directory holding the proxy's socket [`EGRESS_SOCKET_NAME`], bound read-only at
    /// [`EGRESS_DIR_INSIDE`].
    pub socket_dir: PathBuf,
    /// The loopback port inside the namespace the proxy variables name.
    pub port: u16,
    /// Loopback addresses the relay also listens on, each tunnelled as a CONNECT to itself (the
    /// explicitly allowed `127.0.0.1:PORT` destinations, for clients that bypass proxies there).
    pub mirrors: Vec<std::net::SocketAddr>,
    /// `NO_PROXY` names loopback (else nothing bypasses the proxy). Loopback is the sandbox's
    /// own namespace's, where only the agent's processes, the relay and the mirrors above
    /// listen, so this reaches nothing outside; it is for an agent whose parts talk over
    /// loopback HTTP and honour the proxy variables (OpenCode's ACP front calls its own server
    /// on `127.0.0.1:4096`, which the relay would refuse).
    pub loopback_direct: bool,
}

/// `allow_execute = false` in a root warden did not create: no program outside the agent's own
/// install may run. `launcher` (`warden-exec-limit`) restricts itself with Landlock's execute
/// right inside the sandbox, after bubblewrap's mounts (a Landlock-restricted process cannot
/// mount), and becomes the agent; the restriction holds for everything the agent starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOnly {
    /// The `warden-exec-limit` binary (its directory bound read-only).
    pub launcher: PathBuf,
    /// Beyond the program file itself, the egress relay and the dynamic loader (added by the
    /// spawner): where the agent's install lies (an npm adapter's package directory).
    pub allow: Vec<PathBuf>,
}

/// The dynamic loaders of this host (`/lib64/ld-linux-x86-64.so.2`, `/lib/ld-musl-*.so.1`, …):
/// the kernel executes one for every dynamically linked program, so the execute right must
/// cover it.
fn dynamic_loaders() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["/lib64", "/lib", "/usr/lib64", "/usr/lib"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let n = name.to_string_lossy();
            if n.starts_with("ld-linux") || n.starts_with("ld-musl") {
                out.push(e.path());
            }
        }
    }
    out
}

/// Everything needed to start one agent.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub conversation_id: String,
    /// Absolute path, or a bare name looked up in the child's `PATH`.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub boundary: Boundary,
    /// Working directory; must resolve inside the root. Defaults to the root.
    pub cwd: Option<PathBuf>,
    pub env: ChildEnv,
    pub depth: DepthGuard,
    pub limits: Limits,
    pub network: Network,
    /// The agent's own home (this conversation's): bound read-write under bubblewrap, its
    /// adapter configuration files read-only, and set as `HOME`.
    pub home: Option<PathBuf>,
    /// Further directories the program needs read-only under bubblewrap (an interpreter's
    /// install tree, for instance).
    pub extra_ro_binds: Vec<PathBuf>,
    /// With `Network::Proxy`: the relay and the proxy's socket.
    pub egress: Option<EgressSpec>,
    /// This agent's adapter files in the sandbox's `/etc` (Codex's managed configuration).
    pub adapter_policy: AdapterPolicy,
    /// Only the agent's own install may be executed (`allow_execute = false`); needs Landlock,
    /// a spawn without it is refused.
    pub exec_only: Option<ExecOnly>,
    /// The program, arguments, working directory and part of the environment came from the
    /// agent (an ACP `terminal/create`), not from warden or its operator. The program is then
    /// never looked up, canonicalised or bound on the host: it is handed to the sandbox as
    /// written and found there, in the sandbox's own view (its `PATH`, its `/proc`, its fds),
    /// and the working directory is only opened beneath the root's fd, never resolved by name
    /// on the host. Refused together with [`SpawnSpec::exec_only`], whose allowlist would have
    /// to name a program resolved on the host.
    pub agent_supplied: bool,
}

impl SpawnSpec {
    pub fn new(
        conversation_id: impl Into<String>,
        program: impl Into<PathBuf>,
        boundary: Boundary,
        env: ChildEnv,
        depth: DepthGuard,
    ) -> Self {
        Self {
            conversation_id: conversation_id.into(),
            program: program.into(),
            args: Vec::new(),
            boundary,
            cwd: None,
            env,
            depth,
            limits: Limits::default(),
            network: Network::None,
            home: None,
            extra_ro_binds: Vec::new(),
            egress: None,
            adapter_policy: AdapterPolicy::default(),
            exec_only: None,
            agent_supplied: false,
        }
    }
}

/// How the agent ended up contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containment {
    pub bwrap: bool,
    pub network: Network,
    pub cgroup: Option<PathBuf>,
    pub limits: LimitsOutcome,
}

/// A started agent: its tree (holding stdin), its stdout and stderr.
#[derive(Debug)]
pub struct SpawnedAgent {
    pub tree: ProcessTree,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
    pub containment: Containment,
}

/// Spawns agents; holds what was detected about the host.
#[derive(Debug, Clone)]
pub struct Spawner {
    leases: Leases,
    cgroups: Option<CgroupBase>,
    bwrap: Option<PathBuf>,
    identity: Option<AgentIdentity>,
    pool: Option<std::sync::Arc<UidPool>>,
    nice: i32,
}

impl Spawner {
    pub fn new(
        store: &Store,
        cgroups: Option<CgroupBase>,
        bwrap: Option<PathBuf>,
    ) -> Result<Self, SandboxError> {
        Ok(Self {
            leases: Leases::open(store)?,
            cgroups,
            bwrap,
            identity: None,
            pool: None,
            nice: 0,
        })
    }

    /// Every child starts at this nice value (0..=19; 0 = the supervisor's own): an agent that
    /// spins the CPU must not starve the daemons that decide its permissions in time.
    pub fn with_nice(mut self, nice: i32) -> Self {
        self.nice = nice.clamp(0, 19);
        self
    }

    /// Every process this spawner starts (agents and their ACP terminals) switches to
    /// `identity` before exec. `None`: children keep the supervisor's uid (a supervisor that is
    /// not root cannot switch).
    pub fn with_identity(mut self, identity: Option<AgentIdentity>) -> Self {
        self.identity = identity;
        self
    }

    /// One uid per open conversation from `range` (see [`Spawner::assign_identity`]); it
    /// takes the place of [`Spawner::with_identity`]'s single identity.
    pub fn with_uid_range(mut self, range: Option<UidRange>) -> Self {
        self.pool = range.map(|r| std::sync::Arc::new(UidPool::new(r)));
        self
    }

    /// The single uid/gid children run as when they are switched; `None` when they run as the
    /// supervisor's own uid, or when a uid range gives each conversation its own (then use
    /// [`Spawner::agent_identity_for`]).
    pub fn agent_identity(&self) -> Option<AgentIdentity> {
        self.identity
    }

    /// Every uid children may run as, as inclusive ranges (the uid range, or the single agent
    /// uid); empty when they keep the supervisor's own uid.
    pub fn agent_uid_ranges(&self) -> Vec<(u32, u32)> {
        match (&self.pool, self.identity) {
            (Some(p), _) => vec![(p.range().first, p.range().last)],
            (None, Some(i)) => vec![(i.uid, i.uid)],
            (None, None) => Vec::new(),
        }
    }

    /// The identity `conversation_id`'s agent and terminals run as (what files made on their
    /// behalf are chowned to); `None` when they run as the supervisor's own uid. With a uid
    /// range, only while the conversation holds one ([`Spawner::assign_identity`]).
    pub fn agent_identity_for(&self, conversation_id: &str) -> Option<AgentIdentity> {
        match &self.pool {
            Some(p) => p.held_by(conversation_id),
            None => self.identity,
        }
    }

    /// Gives `conversation_id` its identity before its root, home or agent are made: with a
    /// uid range the lowest free uid (the same one while it stays held), else the single one.
    /// Fails when every uid of the range is held.
    pub fn assign_identity(
        &self,
        conversation_id: &str,
    ) -> Result<Option<AgentIdentity>, SandboxError> {
        match &self.pool {
            Some(p) => p.assign(conversation_id).map(Some),
            None => Ok(self.identity),
        }
    }

    /// Whether handing `holder`'s identity to a new conversation gives it what
    /// [`Spawner::assign_identity`] would: with a uid range, the lowest free uid; always true
    /// without one.
    pub fn holds_next_identity(&self, holder: &str) -> bool {
        self.pool.as_ref().is_none_or(|p| p.is_lowest_free(holder))
    }

    /// Hands the identity `from` holds to `to` (a warm agent taken by its conversation: the
    /// agent already runs as it). Without a uid range every spawn has the one identity and
    /// this only returns it.
    pub fn transfer_identity(
        &self,
        from: &str,
        to: &str,
    ) -> Result<Option<AgentIdentity>, SandboxError> {
        match &self.pool {
            Some(p) => p.transfer(from, to).map(Some),
            None => Ok(self.identity),
        }
    }

    /// Returns a conversation's uid to the range (at close).
    pub fn release_identity(&self, conversation_id: &str) {
        if let Some(p) = &self.pool {
            p.release(conversation_id);
        }
    }

    /// What this spawn switches to. With a range, a spawn whose conversation holds no uid is
    /// refused rather than run as anybody else's.
    fn identity_for_spawn(&self, spawn_id: &str) -> Result<Option<AgentIdentity>, SandboxError> {
        match &self.pool {
            Some(p) => p.held_by(spawn_id).map(Some).ok_or_else(|| {
                SandboxError::InvalidInput(format!(
                    "no agent uid is assigned to conversation {spawn_id:?}"
                ))
            }),
            None => Ok(self.identity),
        }
    }

    /// Detects a writable cgroup v2 hierarchy (base `<own cgroup>/<cgroup_base_name>`) and a
    /// working bubblewrap.
    pub fn detect(store: &Store, cgroup_base_name: &str) -> Result<Self, SandboxError> {
        let cgroups = CgroupBase::detect(cgroup_base_name)?;
        let bwrap = crate::features::find_bwrap().filter(|b| crate::features::bwrap_works(b));
        Self::new(store, cgroups, bwrap)
    }

    pub fn cgroups(&self) -> Option<&CgroupBase> {
        self.cgroups.as_ref()
    }

    pub fn bwrap(&self) -> Option<&Path> {
        self.bwrap.as_deref()
    }

    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Starts the agent. Refuses (before any process starts) when the inherited depth is at the
    /// limit, when the working directory is outside the root, or when the program is missing.
    pub fn spawn(&self, spec: SpawnSpec) -> Result<SpawnedAgent, SandboxError> {
        let child_depth = spec.depth.child_depth()?;
        if spec.network == Network::Proxy {
            if self.bwrap.is_none() {
                return Err(SandboxError::InvalidInput(
                    "network = \"proxy\" needs bubblewrap's network namespaces, and bubblewrap is off or not working on this host (warden doctor says which); refusing rather than giving the agent the host's network".into(),
                ));
            }
            if spec.egress.is_none() {
                return Err(SandboxError::InvalidInput(
                    "network = \"proxy\" without an egress relay".into(),
                ));
            }
        }
        if spec.exec_only.is_some() && crate::features::landlock_abi().is_none() {
            return Err(SandboxError::InvalidInput(
                "this workspace has allow_execute = false, which is enforced with Landlock's execute right, and this kernel has no Landlock (warden doctor says so); refusing to start an agent whose own shell nothing would stop".into(),
            ));
        }
        if spec.agent_supplied && spec.exec_only.is_some() {
            return Err(SandboxError::InvalidInput(
                "a command the agent asked for cannot run in an allow_execute = false workspace (its program would have to be resolved outside the sandbox to be allowlisted)".into(),
            ));
        }
        check_env(&spec.env)?;
        let identity = self.identity_for_spawn(&spec.conversation_id)?;
        let root = &spec.boundary.root;
        let cwd = match &spec.cwd {
            None => root.clone(),
            // The agent's own path: opened below beneath the root's fd (the kernel walks it,
            // `RESOLVE_BENEATH`), never resolved on the host, where its links would be read with
            // the supervisor's view (`/proc/self` is the supervisor there).
            Some(c) if spec.agent_supplied => {
                if !c.is_absolute() || !c.starts_with(root) {
                    return Err(SandboxError::InvalidInput(format!(
                        "working directory {} is outside the root",
                        c.display()
                    )));
                }
                c.clone()
            }
            Some(c) => {
                let r = resolve(c, root, &RealFs)
                    .map_err(|e| SandboxError::InvalidInput(format!("working directory: {e}")))?;
                if !r.starts_with(root) {
                    return Err(SandboxError::InvalidInput(format!(
                        "working directory {} is outside the root",
                        c.display()
                    )));
                }
                r
            }
        };
        // The working directory is opened beneath the root's fd and entered by that fd
        // (fchdir in the child), never by name: a component swapped for a symlink after the
        // check above cannot move the agent out of its root.
        // With the agent's rights (crates/containment rights.rs): its root is its own (0710),
        // and a directory it closed stops this open as it stops the agent.
        let rights = identity.map(Rights::from);
        let cwd_fd = warden_containment::beneath::RootDir::open_as(root, rights)
            .and_then(|r| r.open_dir(&cwd))
            .map_err(|e| {
                SandboxError::InvalidInput(format!("working directory {}: {e}", cwd.display()))
            })?;
        let program = if spec.agent_supplied {
            agent_program(&spec.program)?
        } else {
            resolve_program(&spec.program, &spec.env)?
        };
        let home = match &spec.home {
            None => None,
            Some(h) => {
                let h =
                    std::fs::canonicalize(h).map_err(|e| SandboxError::io("agent home", h, e))?;
                if !h.is_dir() {
                    return Err(SandboxError::InvalidInput(format!(
                        "agent home {} is not a directory",
                        h.display()
                    )));
                }
                Some(h)
            }
        };
        // A switched child (and bubblewrap, resolving its binds as the child) reaches every
        // path it needs by its own rights: say which one blocks rather than let bubblewrap fail
        // with a bare EACCES after the spawn.
        if let Some(who) = identity {
            let egress_dirs = spec
                .egress
                .as_ref()
                .map(|e| [e.relay.parent(), Some(e.socket_dir.as_path())]);
            let launcher_dir = spec.exec_only.as_ref().and_then(|x| x.launcher.parent());
            // An agent's own program is found inside the sandbox, by the agent: nothing of it
            // is looked at here.
            let program_dir = (!spec.agent_supplied).then(|| program.parent()).flatten();
            let dirs = [
                Some(root.as_path()),
                program_dir,
                home.as_deref(),
                launcher_dir,
            ]
            .into_iter()
            .chain(egress_dirs.into_iter().flatten())
            .flatten()
            .map(Path::to_path_buf)
            .chain(spec.extra_ro_binds.iter().filter_map(|p| {
                let p = std::fs::canonicalize(p).ok()?;
                if p.is_dir() {
                    Some(p)
                } else {
                    p.parent().map(Path::to_path_buf)
                }
            }));
            for d in dirs {
                if let Some(blocked) = first_unsearchable(&d, who) {
                    return Err(SandboxError::InvalidInput(format!(
                        "the agent (uid {}) cannot reach {}: {} does not let it search",
                        who.uid,
                        d.display(),
                        blocked.display()
                    )));
                }
            }
        }
        let mut env = spec.env.clone();
        if let Some(h) = &home {
            env.set_home(h);
        }
        if identity.is_some() {
            env.set_user(AGENT_NAME);
        }
        if let (Network::Proxy, Some(e)) = (spec.network, &spec.egress) {
            env.set_proxy(e.port, e.loopback_direct);
        }
        // What bubblewrap binds read-only over the writable root and home: checked and created
        // here, before any process of this spawn exists (see control.rs on planted symlinks).
        let mut control = Vec::new();
        let mut git = Vec::new();
        if self.bwrap.is_some() {
            if spec.boundary.profile == Profile::WorkspaceWrite {
                // Made with the agent's rights (what is created is the agent's, bound read-only
                // over it below), never with more than the agent has in its own root.
                control.extend(as_agent(rights, || prepare_root(root))?);
                // Every `.git` in the root by allowlist (git.rs), found with the agent's
                // rights; the copies' fds are raised above the gate's fd like the generated
                // /etc files'.
                for b in crate::git::plan(root, rights)? {
                    git.push(match b {
                        GitBind::Copy { fd, path } => GitBind::Copy {
                            fd: high_fd(&fd)?,
                            path,
                        },
                        other => other,
                    });
                }
            }
            if let Some(h) = &home {
                control.extend(as_agent(rights, || prepare_home(h, identity))?);
            }
        }
        let who = identity.unwrap_or(AgentIdentity {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        });
        let etc = if self.bwrap.is_some() {
            etc_plan(
                Path::new("/etc"),
                who,
                home.as_deref(),
                &spec.adapter_policy,
            )
        } else {
            Vec::new()
        };
        let data_fds = data_fds(&etc)?;

        // The cgroup exists, with its limits, before the child does.
        let label = sanitize_label(&spec.conversation_id);
        let mut limits = LimitsOutcome::default();
        let cgroup = match &self.cgroups {
            Some(base) => {
                let cg = base.create_conversation(&label)?;
                match cg.apply_limits(&spec.limits) {
                    Ok(l) => limits = l,
                    Err(e) => {
                        let _ = cg.remove_blocking(std::time::Duration::ZERO);
                        return Err(e);
                    }
                }
                Some(cg)
            }
            None => {
                for (set, name) in [
                    (spec.limits.memory_max.is_some(), "memory.max"),
                    (spec.limits.pids_max.is_some(), "pids.max"),
                    (spec.limits.cpu_max.is_some(), "cpu.max"),
                ] {
                    if set {
                        limits.unavailable.push(name.to_string());
                    }
                }
                None
            }
        };
        let cleanup_cgroup = |cg: &Option<crate::cgroup::ConvCgroup>| {
            if let Some(cg) = cg {
                cg.kill();
                // A failed spawn (rare): a short blocking wait for the killed gate to leave.
                let _ = cg.remove_blocking(std::time::Duration::from_millis(200));
            }
        };
        if !limits.unavailable.is_empty() {
            tracing::info!(
                context_id = %spec.conversation_id,
                unavailable = ?limits.unavailable,
                "resource limits requested but their cgroup controllers are not available"
            );
        }

        let marker = uuid::Uuid::new_v4().simple().to_string();
        let bwrapped = self.bwrap.is_some();
        // bubblewrap reads the sandbox's environment and working directory from this fd
        // (`--args`): made before the plan so the plan can name its number.
        let args_fd = if bwrapped {
            Some(sealed_fd("warden-bwrap-args", &[])?)
        } else {
            None
        };
        let raw_data_fds: Vec<i32> = data_fds.iter().map(|f| f.as_raw_fd()).collect();
        let host = host_command(&HostPlan {
            bwrap: self.bwrap.as_deref().zip(args_fd.as_ref()).map(|(b, fd)| {
                (
                    b,
                    fd.as_raw_fd(),
                    BwrapPlan {
                        spec: &spec,
                        program: &program,
                        cwd: &cwd,
                        home: home.as_deref(),
                        etc: &etc,
                        data_fds: &raw_data_fds,
                        control: &control,
                        git: &git,
                    },
                )
            }),
            spec: &spec,
            program: &program,
            env: &env,
            child_depth,
            marker: &marker,
        });
        if let (Some(fd), Some(inside)) = (&args_fd, &host.inside) {
            fill_fd(fd, inside)?;
        }
        let mut cmd = Command::new(SH);
        cmd.args(&host.args);
        cmd.env_clear();
        for (k, v) in &host.env {
            cmd.env(k, v);
        }
        cmd.process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());

        let procs_file = match cgroup.as_ref().map(|c| c.open_procs()).transpose() {
            Ok(f) => f,
            Err(e) => {
                cleanup_cgroup(&cgroup);
                return Err(e);
            }
        };
        let (gate_r, gate_w) = match pipe() {
            Ok(p) => p,
            Err(e) => {
                cleanup_cgroup(&cgroup);
                return Err(e);
            }
        };
        let parent = std::process::id() as libc::pid_t;
        let procs_fd = procs_file.as_ref().map(|f| f.as_raw_fd());
        let (r_fd, w_fd) = (gate_r.as_raw_fd(), gate_w.as_raw_fd());
        let keep: Vec<i32> = data_fds
            .iter()
            .chain(args_fd.as_ref())
            .map(|f| f.as_raw_fd())
            .chain(git.iter().filter_map(|b| match b {
                GitBind::Copy { fd, .. } => Some(fd.as_raw_fd()),
                _ => None,
            }))
            .collect();
        let cwd_raw = cwd_fd.as_raw_fd();
        let nice = self.nice;
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // system calls (fchdir, setpriority, write, setgroups, setgid, setuid, prctl, capset,
        // getppid, close, dup2, fcntl); it allocates nothing (`keep` was built before the fork). `cwd_fd` outlives the
        // spawn (it is dropped after `cmd.spawn()`).
        unsafe {
            cmd.pre_exec(move || {
                // Into the working directory by its fd (opened beneath the root), before the
                // switch of identity: the directory is already resolved, no lookup remains.
                // Lower priority before anything else (raising the nice value needs no right).
                if nice > 0 && libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::fchdir(cwd_raw) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Entering the cgroup needs the supervisor's rights: before the switch.
                if let Some(fd) = procs_fd
                    && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(id) = identity {
                    nix::unistd::setgroups(&[])?;
                    nix::unistd::setgid(nix::unistd::Gid::from_raw(id.gid))?;
                    nix::unistd::setuid(nix::unistd::Uid::from_raw(id.uid))?;
                    drop_all_capabilities()?;
                }
                // After the switch: a credential change clears the parent-death signal.
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The supervisor may have died before PDEATHSIG was armed.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                // Only the parent may hold the write end, so the gate sees EOF if it dies.
                libc::close(w_fd);
                if r_fd == 3 {
                    if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(r_fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // bubblewrap reads the generated /etc files from these (and closes them).
                for fd in &keep {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }

        let spawned = cmd.spawn();
        drop(cwd_fd);
        let mut child = match spawned {
            Ok(c) => c,
            Err(source) => {
                cleanup_cgroup(&cgroup);
                return Err(SandboxError::Spawn { program, source });
            }
        };
        drop(gate_r);
        drop(procs_file);
        drop(data_fds);
        drop(args_fd);
        drop(git);
        let (Some(stdout), Some(stderr), Some(pid)) =
            (child.stdout.take(), child.stderr.take(), child.id())
        else {
            cleanup_cgroup(&cgroup);
            return Err(SandboxError::InvalidInput("child without pipes".into()));
        };
        let pid = pid as i32;
        let leader = ProcessIdentity::of(pid).unwrap_or(ProcessIdentity { pid, start_time: 0 });
        let cgroup_path = cgroup.as_ref().map(|c| c.path().to_path_buf());
        let tree = ProcessTree::from_spawn(
            spec.conversation_id.clone(),
            child,
            leader,
            cgroup,
            marker.clone(),
            bwrapped,
            self.leases.clone(),
        );
        let lease = Lease {
            conversation_id: spec.conversation_id.clone(),
            leader,
            pgid: pid,
            cgroup: cgroup_path.clone(),
            marker,
            created_unix_ms: now_unix_ms(),
        };
        // Dropping `tree` on error SIGKILLs the gate; dropping `gate_w` unblocks it into exit.
        self.leases.record(&lease)?;
        release(gate_w)?;
        tracing::info!(
            context_id = %spec.conversation_id,
            pid,
            bwrap = bwrapped,
            cgroup = ?cgroup_path,
            "spawned agent"
        );
        Ok(SpawnedAgent {
            tree,
            stdout,
            stderr,
            containment: Containment {
                bwrap: bwrapped,
                network: spec.network,
                cgroup: cgroup_path,
                limits,
            },
        })
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| SandboxError::Os {
        what: "pipe2",
        source: e.into(),
    })
}

fn release(gate_w: OwnedFd) -> Result<(), SandboxError> {
    let mut f = File::from(gate_w);
    f.write_all(b"go\n").map_err(|source| SandboxError::Os {
        what: "release spawn gate",
        source,
    })
}

fn resolve_program(program: &Path, env: &ChildEnv) -> Result<PathBuf, SandboxError> {
    let missing =
        |p: &Path| SandboxError::InvalidInput(format!("program {} not found", p.display()));
    let found = if program.components().count() > 1 || program.is_absolute() {
        if !program.is_absolute() {
            return Err(SandboxError::InvalidInput(format!(
                "program {} must be absolute or a bare name",
                program.display()
            )));
        }
        program.to_path_buf()
    } else {
        let path = env.get("PATH").ok_or_else(|| missing(program))?;
        std::env::split_paths(path)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(program))
            .find(|c| c.is_file())
            .ok_or_else(|| missing(program))?
    };
    let real = std::fs::canonicalize(&found).map_err(|_| missing(&found))?;
    if !real.is_file() {
        return Err(missing(&found));
    }
    Ok(real)
}

/// System directories every sandbox sees read-only. `/etc` is not one of them: see etc.rs.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The lowest fd number a generated-file descriptor gets: above the gate's fd 3 (which the
/// child's `dup2` would otherwise close) and the standard streams.
const DATA_FD_MIN: i32 = 10;

/// A copy of `fd` at or above [`DATA_FD_MIN`] (close-on-exec until the child clears it).
fn high_fd(fd: &OwnedFd) -> Result<OwnedFd, SandboxError> {
    rustix::io::fcntl_dupfd_cloexec(fd, DATA_FD_MIN).map_err(|e| SandboxError::Os {
        what: "dup git file copy",
        source: e.into(),
    })
}

/// One in-memory file per generated `/etc` entry, for `--ro-bind-data FD DEST`.
fn data_fds(etc: &[EtcBind]) -> Result<Vec<OwnedFd>, SandboxError> {
    etc.iter()
        .filter_map(|b| match b {
            EtcBind::Data { content, .. } => Some(sealed_fd("warden-etc", content)),
            EtcBind::Host { .. } => None,
        })
        .collect()
}

/// Everything `bwrap_args` turns into arguments.
pub(crate) struct BwrapPlan<'a> {
    pub spec: &'a SpawnSpec,
    pub program: &'a Path,
    pub cwd: &'a Path,
    pub home: Option<&'a Path>,
    /// The sandbox's `/etc` (etc.rs); `Data` entries take their fd from `data_fds` in order.
    pub etc: &'a [EtcBind],
    pub data_fds: &'a [i32],
    /// Agent-control paths in the root and home, bound over them in this order.
    pub control: &'a [ControlBind],
    /// The root's git directories by allowlist (git.rs), after the control paths.
    pub git: &'a [GitBind],
}

pub(crate) fn bwrap_args(plan: &BwrapPlan<'_>) -> Vec<OsString> {
    let spec = plan.spec;
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    push(&[
        "--die-with-parent".as_ref(),
        // A new session: no controlling terminal, so TIOCSTI cannot push keystrokes into the
        // operator's terminal.
        "--new-session".as_ref(),
        "--unshare-pid".as_ref(),
        "--unshare-ipc".as_ref(),
        "--unshare-uts".as_ref(),
        "--unshare-cgroup-try".as_ref(),
        // Root inside the sandbox must not be able to remount the read-only binds.
        "--cap-drop".as_ref(),
        "ALL".as_ref(),
    ]);
    if matches!(spec.network, Network::None | Network::Proxy) {
        push(&["--unshare-net".as_ref()]);
    }
    let mut bound: Vec<PathBuf> = Vec::new();
    for d in SYSTEM_DIRS {
        let p = Path::new(d);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(p) {
                    push(&["--symlink".as_ref(), target.as_os_str(), p.as_os_str()]);
                }
            }
            Ok(m) if m.is_dir() => {
                push(&["--ro-bind".as_ref(), p.as_os_str(), p.as_os_str()]);
                bound.push(p.to_path_buf());
            }
            _ => {}
        }
    }
    let mut fds = plan.data_fds.iter();
    for b in plan.etc {
        match b {
            EtcBind::Host { src, dest } => {
                push(&["--ro-bind".as_ref(), src.as_os_str(), dest.as_os_str()])
            }
            EtcBind::Data { dest, .. } => {
                if let Some(fd) = fds.next() {
                    let fd = OsString::from(fd.to_string());
                    push(&["--ro-bind-data".as_ref(), fd.as_os_str(), dest.as_os_str()]);
                }
            }
        }
    }
    push(&[
        "--proc".as_ref(),
        "/proc".as_ref(),
        "--dev".as_ref(),
        "/dev".as_ref(),
        "--tmpfs".as_ref(),
        "/tmp".as_ref(),
    ]);
    for extra in &spec.extra_ro_binds {
        if let Ok(e) = std::fs::canonicalize(extra) {
            push(&["--ro-bind".as_ref(), e.as_os_str(), e.as_os_str()]);
            bound.push(e);
        }
    }
    if let Some(h) = plan.home {
        push(&["--bind".as_ref(), h.as_os_str(), h.as_os_str()]);
        bound.push(h.to_path_buf());
    }
    let root = spec.boundary.root.as_os_str();
    match spec.boundary.profile {
        Profile::ReadOnly => push(&["--ro-bind".as_ref(), root, root]),
        Profile::WorkspaceWrite => push(&["--bind".as_ref(), root, root]),
    }
    bound.push(spec.boundary.root.clone());
    // After the writable binds they lie in, so they are mounted over them.
    for c in plan.control {
        let p = c.path.as_os_str();
        let how = if c.pin_only { "--bind" } else { "--ro-bind" };
        push(&[how.as_ref(), p, p]);
    }
    for g in plan.git {
        let p = g.path().as_os_str();
        match g {
            GitBind::Tmpfs(_) => push(&["--tmpfs".as_ref(), p]),
            GitBind::Dir(_) => push(&["--dir".as_ref(), p]),
            GitBind::Writable(_) => push(&["--bind".as_ref(), p, p]),
            GitBind::ReadOnly(_) => push(&["--ro-bind".as_ref(), p, p]),
            GitBind::Symlink { target, .. } => push(&["--symlink".as_ref(), target.as_os_str(), p]),
            GitBind::Copy { fd, .. } => {
                let fd = OsString::from(fd.as_raw_fd().to_string());
                push(&["--file".as_ref(), fd.as_os_str(), p])
            }
        }
    }
    // The program's own directory (e.g. `target/debug`) when nothing above binds it, and the
    // egress relay's.
    let relay_dir = match (spec.network, &spec.egress) {
        (Network::Proxy, Some(e)) => e.relay.parent(),
        _ => None,
    };
    let launcher_dir = spec.exec_only.as_ref().and_then(|x| x.launcher.parent());
    // An agent's own program is never bound: it runs only if the sandbox already shows it.
    let program_dir = (!spec.agent_supplied)
        .then(|| plan.program.parent())
        .flatten();
    for dir in [program_dir, relay_dir, launcher_dir].into_iter().flatten() {
        if !bound.iter().any(|b| dir.starts_with(b)) {
            push(&["--ro-bind".as_ref(), dir.as_os_str(), dir.as_os_str()]);
            bound.push(dir.to_path_buf());
        }
    }
    // The proxy's socket: read-only (connecting needs no write access to the mount), so the
    // agent cannot replace it.
    if let (Network::Proxy, Some(e)) = (spec.network, &spec.egress) {
        push(&[
            "--ro-bind".as_ref(),
            e.socket_dir.as_os_str(),
            EGRESS_DIR_INSIDE.as_ref(),
        ]);
    }
    // The sandbox's own `/` is a tmpfs holding the mount points bwrap created (every parent of
    // the root, for instance); without this, writes there would succeed (into memory) and look
    // like writes outside the root.
    push(&["--remount-ro".as_ref(), "/".as_ref()]);
    a
}

/// The variables every process warden starts on the host side of a sandbox (the gate shell and
/// bubblewrap) runs with, whatever the spawn: written here, nothing from the agent or its
/// configured environment (a dynamic-loader or shell variable there would run the agent's
/// code outside its sandbox, as its uid, in the host's namespaces).
pub const HOST_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The fixed host-side environment of a spawn: [`HOST_PATH`], and the depth and tree markers
/// (the kill ladder's fallback finds the tree's processes by the marker, bubblewrap included).
pub(crate) fn host_env(child_depth: u32, marker: &str) -> Vec<(OsString, OsString)> {
    vec![
        ("PATH".into(), HOST_PATH.into()),
        (DEPTH_ENV.into(), child_depth.to_string().into()),
        (TREE_MARKER_ENV.into(), marker.into()),
    ]
}

/// Everything [`host_command`] turns into the host-side command.
pub(crate) struct HostPlan<'a> {
    /// bubblewrap's path, the fd it reads the sandbox's environment and working directory from
    /// (`--args`), and its binds; `None` without bubblewrap.
    pub bwrap: Option<(&'a Path, i32, BwrapPlan<'a>)>,
    pub spec: &'a SpawnSpec,
    pub program: &'a Path,
    pub env: &'a ChildEnv,
    pub child_depth: u32,
    pub marker: &'a str,
}

/// The host side of one spawn: the gate shell's arguments (after `/bin/sh`), its environment,
/// and what bubblewrap reads from the `--args` fd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostCommand {
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// NUL-separated bubblewrap arguments: `--clearenv`, one `--setenv` per variable of the
    /// program's environment, `--chdir`. Read from an fd so that neither the host-side
    /// environment nor a command line any user can read (`/proc/PID/cmdline`) carries them.
    pub inside: Option<Vec<u8>>,
}

/// The host-side command of a spawn. With bubblewrap, its environment is [`host_env`] and its
/// arguments up to the `--` before the program depend only on warden's own plan (binds, the
/// fd numbers): the agent's environment and working directory are in `inside`, the program and
/// its arguments after that `--`, where bubblewrap only hands them to `execvp` inside the
/// sandbox (which looks the program up in the sandbox's own view and `PATH`). Without
/// bubblewrap there is no inside: the program runs on the host as the agent's uid, and the
/// gate (the same uid, with no more power) carries its environment.
pub(crate) fn host_command(plan: &HostPlan<'_>) -> HostCommand {
    let spec = plan.spec;
    let mut args: Vec<OsString> = vec!["-c".into(), GATE.into(), "warden-gate".into()];
    let mut inside = None;
    let env = match &plan.bwrap {
        Some((bwrap, args_fd, binds)) => {
            args.push(bwrap.as_os_str().to_os_string());
            args.push("--args".into());
            args.push(args_fd.to_string().into());
            args.extend(bwrap_args(binds));
            args.push("--".into());
            let mut words: Vec<&std::ffi::OsStr> = vec!["--clearenv".as_ref()];
            let depth = plan.child_depth.to_string();
            for (k, v) in plan.env.iter().chain([
                (DEPTH_ENV.as_ref(), depth.as_ref()),
                (TREE_MARKER_ENV.as_ref(), plan.marker.as_ref()),
            ]) {
                words.extend(["--setenv".as_ref(), k, v]);
            }
            words.extend(["--chdir".as_ref(), binds.cwd.as_os_str()]);
            let mut bytes = Vec::new();
            for w in words {
                bytes.extend_from_slice(w.as_encoded_bytes());
                bytes.push(0);
            }
            inside = Some(bytes);
            host_env(plan.child_depth, plan.marker)
        }
        None => plan
            .env
            .iter()
            .map(|(k, v)| (k.to_os_string(), v.to_os_string()))
            .chain(host_env(plan.child_depth, plan.marker).into_iter().skip(1))
            .collect(),
    };
    if let Some(x) = &spec.exec_only {
        args.push(x.launcher.clone().into());
        let relay = match (spec.network, &spec.egress) {
            (Network::Proxy, Some(e)) => Some(e.relay.clone()),
            _ => None,
        };
        for p in x
            .allow
            .iter()
            .cloned()
            .chain([plan.program.to_path_buf()])
            .chain(relay)
            .chain(dynamic_loaders())
        {
            args.push("--allow".into());
            args.push(p.into());
        }
        args.push("--".into());
    }
    if let (Network::Proxy, Some(e)) = (spec.network, &spec.egress) {
        args.push(e.relay.clone().into());
        args.push("--socket".into());
        args.push(Path::new(EGRESS_DIR_INSIDE).join(EGRESS_SOCKET_NAME).into());
        args.push("--listen".into());
        args.push(format!("127.0.0.1:{}", e.port).into());
        for m in &e.mirrors {
            args.push("--mirror".into());
            args.push(m.to_string().into());
        }
        args.push("--".into());
    }
    args.push(plan.program.as_os_str().to_os_string());
    args.extend(spec.args.iter().cloned());
    HostCommand { args, env, inside }
}

/// Every variable of a child's environment is a plain `NAME=value` with no NUL anywhere: a NUL
/// would end the word early in the `--args` bytes bubblewrap reads, and what follows would be
/// read as bubblewrap's own options (a bind of the host's `/`, say).
fn check_env(env: &ChildEnv) -> Result<(), SandboxError> {
    for (k, v) in env.iter() {
        let kb = k.as_encoded_bytes();
        if kb.is_empty() || kb.contains(&0) || kb.contains(&b'=') || kb[0] == b'-' {
            return Err(SandboxError::InvalidInput(format!(
                "environment variable name {:?} is not a plain name",
                k
            )));
        }
        if v.as_encoded_bytes().contains(&0) {
            return Err(SandboxError::InvalidInput(format!(
                "environment variable {} holds a NUL byte",
                k.to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// The program of a command the agent asked for, as it wrote it: an absolute path or a bare
/// name, checked only as text. It is never looked up, canonicalised or opened here: bubblewrap
/// finds it inside the sandbox (a `/proc/self/fd/N/…` there names the command's own fds, a
/// symlink resolves in the sandbox's view).
fn agent_program(program: &Path) -> Result<PathBuf, SandboxError> {
    let b = program.as_os_str().as_encoded_bytes();
    if b.is_empty() || b.contains(&0) {
        return Err(SandboxError::InvalidInput(
            "the program is empty or holds a NUL byte".into(),
        ));
    }
    if !program.is_absolute() && program.components().count() != 1 {
        return Err(SandboxError::InvalidInput(format!(
            "program {} must be absolute or a bare name",
            program.display()
        )));
    }
    Ok(program.to_path_buf())
}

/// A close-on-exec memfd at or above [`DATA_FD_MIN`] holding `content`, read from its start.
fn sealed_fd(name: &str, content: &[u8]) -> Result<OwnedFd, SandboxError> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(|e| SandboxError::Os {
        what: "memfd_create",
        source: std::io::Error::from(e),
    })?;
    let high = rustix::io::fcntl_dupfd_cloexec(&fd, DATA_FD_MIN).map_err(|e| SandboxError::Os {
        what: "dup memfd",
        source: e.into(),
    })?;
    if !content.is_empty() {
        fill_fd(&high, content)?;
    }
    Ok(high)
}

/// Writes `content` into the memfd `fd` and rewinds it (bubblewrap reads from the offset).
fn fill_fd(fd: &OwnedFd, content: &[u8]) -> Result<(), SandboxError> {
    let os = |what: &'static str| {
        move |e: nix::errno::Errno| SandboxError::Os {
            what,
            source: std::io::Error::from(e),
        }
    };
    let mut off = 0;
    while off < content.len() {
        let n = nix::unistd::write(fd, &content[off..]).map_err(os("write memfd"))?;
        if n == 0 {
            return Err(SandboxError::InvalidInput("short write to a memfd".into()));
        }
        off += n;
    }
    nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekSet).map_err(os("lseek"))?;
    Ok(())
}

/// Empties the ambient, effective, permitted and inheritable capability sets of the calling
/// process. Called in the child after its switch to the agent's ids: a supervisor that is not
/// root holds `CAP_SETUID`/`CAP_SETGID` (and what else its unit grants) as ambient capabilities,
/// and a uid change between two non-zero uids keeps them, so without this an agent would inherit
/// the power to become any user. (From root the kernel clears them itself at the `setuid`.)
/// Async-signal-safe: two system calls, no allocation.
fn drop_all_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // struct __user_cap_header_struct { u32 version; int pid; } and two
    // struct __user_cap_data_struct { u32 effective, permitted, inheritable; } (version 3).
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header: [u32; 2] = [LINUX_CAPABILITY_VERSION_3, 0];
    let data: [u32; 6] = [0; 6];
    // SAFETY: both pointers are to live, correctly sized arrays for the v3 ABI.
    if unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` with the agent's filesystem rights (`None`: the supervisor's own, which is then the
/// agent's): what the supervisor lays out in an agent's root and home.
fn as_agent<T: Send>(
    rights: Option<Rights>,
    f: impl FnOnce() -> Result<T, SandboxError> + Send,
) -> Result<T, SandboxError> {
    warden_containment::rights::with_rights(rights, f)
        .map_err(|e| SandboxError::InvalidInput(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvPolicy;

    fn args_of(profile: Profile, control: &[ControlBind]) -> Vec<String> {
        args_with(profile, control, Network::None, None)
    }

    fn args_with(
        profile: Profile,
        control: &[ControlBind],
        network: Network,
        egress: Option<EgressSpec>,
    ) -> Vec<String> {
        let env = EnvPolicy::new([""; 0], [""; 0])
            .expect("policy")
            .build_from(std::iter::empty::<(OsString, OsString)>());
        let boundary = Boundary {
            root: PathBuf::from("/srv/sandboxes/r-1"),
            owned: true,
            allow_execute: true,
            profile,
        };
        let spec = SpawnSpec::new(
            "c",
            "/usr/bin/true",
            boundary,
            env,
            DepthGuard::from_marker(None, 1),
        );
        let mut spec = spec;
        spec.network = network;
        spec.egress = egress;
        let who = AgentIdentity {
            uid: 61000,
            gid: 61000,
        };
        let home = PathBuf::from("/srv/homes/c-1");
        let etc = etc_plan(
            Path::new("/etc"),
            who,
            Some(&home),
            &AdapterPolicy::default(),
        );
        let fds: Vec<i32> = (0..etc
            .iter()
            .filter(|b| matches!(b, EtcBind::Data { .. }))
            .count())
            .map(|i| 10 + i as i32)
            .collect();
        let plan = BwrapPlan {
            spec: &spec,
            program: Path::new("/usr/bin/true"),
            cwd: Path::new("/srv/sandboxes/r-1"),
            home: Some(&home),
            etc: &etc,
            data_fds: &fds,
            control,
            git: &[],
        };
        bwrap_args(&plan)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn pos(args: &[String], window: &[&str]) -> Option<usize> {
        args.windows(window.len())
            .position(|w| w.iter().zip(window).all(|(a, b)| a == b))
    }

    /// The host-side command of a terminal-like spawn whose program, arguments, cwd and
    /// environment came from the agent.
    fn host_of(
        program: &str,
        args: &[String],
        cwd: &str,
        env: &[(String, String)],
        network: Network,
    ) -> HostCommand {
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        let env = EnvPolicy::new(names, [""; 0]).expect("policy").build_from(
            env.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        let boundary = Boundary {
            root: PathBuf::from("/srv/sandboxes/r-1"),
            owned: true,
            allow_execute: true,
            profile: Profile::WorkspaceWrite,
        };
        let mut spec = SpawnSpec::new(
            "c~term-1",
            program,
            boundary,
            env.clone(),
            DepthGuard::from_marker(None, 1),
        );
        spec.args = args.iter().map(OsString::from).collect();
        spec.cwd = Some(PathBuf::from(cwd));
        spec.network = network;
        spec.agent_supplied = true;
        if network == Network::Proxy {
            spec.egress = Some(EgressSpec {
                relay: PathBuf::from("/opt/warden/bin/warden-egress-relay"),
                socket_dir: PathBuf::from("/srv/state/egress/c-1"),
                port: 3128,
                mirrors: vec![],
                loopback_direct: false,
            });
        }
        let program = agent_program(Path::new(program)).expect("program");
        let plan = HostPlan {
            bwrap: Some((
                Path::new("/usr/bin/bwrap"),
                12,
                BwrapPlan {
                    spec: &spec,
                    program: &program,
                    cwd: Path::new(cwd),
                    home: None,
                    etc: &[],
                    data_fds: &[],
                    control: &[],
                    git: &[],
                },
            )),
            spec: &spec,
            program: &program,
            env: &env,
            child_depth: 1,
            marker: "m",
        };
        host_command(&plan)
    }

    /// The words of a host command up to (and with) the `--` after which bubblewrap only hands
    /// the rest to exec inside the sandbox.
    fn before_program(h: &HostCommand, tail: usize) -> Vec<OsString> {
        h.args[..h.args.len() - tail].to_vec()
    }

    proptest::proptest! {
        /// Whatever the agent puts in a terminal's program, arguments, working directory and
        /// environment, the host side runs the same: the gate and bubblewrap with the fixed
        /// environment and the same arguments up to the program; the agent's values are only
        /// in the bytes bubblewrap reads from its `--args` fd and after the last `--`.
        #[test]
        fn agent_values_never_reach_the_host_side_of_a_spawn(
            program in "(/[a-z./]{1,12}|[a-z]{1,8}|/proc/self/fd/[0-9]{1,3}/build\\.sh)",
            args in proptest::collection::vec("[ -~]{0,16}", 0..4),
            cwd in "/srv/sandboxes/r-1(/[a-z.]{1,6}){0,3}",
            env in proptest::collection::vec(
                (
                    "(LD_PRELOAD|LD_AUDIT|LD_LIBRARY_PATH|BASH_ENV|ENV|PATH|GCONV_PATH|HOME|[A-Z_]{1,10})",
                    "[ -~]{0,24}",
                ),
                0..6,
            ),
            proxy in proptest::bool::ANY,
        ) {
            let network = if proxy { Network::Proxy } else { Network::None };
            let h = host_of(&program, &args, &cwd, &env, network);
            let template = host_of("/bin/true", &[], "/srv/sandboxes/r-1", &[], network);
            proptest::prop_assert_eq!(&h.env, &host_env(1, "m"));
            proptest::prop_assert_eq!(&template.env, &host_env(1, "m"));
            proptest::prop_assert_eq!(
                before_program(&h, 1 + args.len()),
                before_program(&template, 1)
            );
            let inside = h.inside.clone().unwrap_or_default();
            let words: Vec<&[u8]> = inside.split(|b| *b == 0).collect();
            proptest::prop_assert_eq!(words[0], b"--clearenv".as_slice());
            for (k, v) in &env {
                let set = words
                    .windows(3)
                    .any(|w| w[0] == b"--setenv" && w[1] == k.as_bytes() && w[2] == v.as_bytes());
                let last = env.iter().rev().find(|(k2, _)| k2 == k).map(|(_, v2)| v2);
                if last == Some(v) {
                    proptest::prop_assert!(set, "{} not set inside", k);
                }
            }
        }
    }

    #[test]
    fn a_nul_in_the_environment_is_refused_before_anything_runs() {
        let env = EnvPolicy::new(["X"], [""; 0])
            .expect("policy")
            .build_from([(OsString::from("X"), OsString::from("a\0--bind\0/\0/"))]);
        assert!(check_env(&env).is_err());
        assert!(agent_program(Path::new("/bin/true\0x")).is_err());
        assert!(agent_program(Path::new("bin/true")).is_err());
        assert!(agent_program(Path::new("true")).is_ok());
    }

    #[test]
    fn proxy_egress_is_its_own_namespace_with_the_socket_read_only_and_the_relay_bound() {
        let e = EgressSpec {
            relay: PathBuf::from("/opt/warden/bin/warden-egress-relay"),
            socket_dir: PathBuf::from("/srv/state/egress/c-1"),
            port: 3128,
            mirrors: vec![],
            loopback_direct: false,
        };
        let a = args_with(Profile::WorkspaceWrite, &[], Network::Proxy, Some(e));
        assert!(a.iter().any(|x| x == "--unshare-net"), "{a:?}");
        let sock = pos(
            &a,
            &["--ro-bind", "/srv/state/egress/c-1", EGRESS_DIR_INSIDE],
        )
        .unwrap();
        let relay = pos(&a, &["--ro-bind", "/opt/warden/bin", "/opt/warden/bin"]).unwrap();
        let ro = pos(&a, &["--remount-ro", "/"]).unwrap();
        assert!(sock < ro && relay < ro, "{a:?}");
        let host = args_with(Profile::WorkspaceWrite, &[], Network::Host, None);
        assert!(!host.iter().any(|x| x == "--unshare-net"), "{host:?}");
        assert!(!host.iter().any(|x| x == EGRESS_DIR_INSIDE), "{host:?}");
    }

    #[test]
    fn bwrap_gets_a_new_session_and_no_whole_etc() {
        let a = args_of(Profile::WorkspaceWrite, &[]);
        assert!(a.iter().any(|x| x == "--new-session"), "{a:?}");
        assert!(pos(&a, &["--ro-bind", "/etc", "/etc"]).is_none(), "{a:?}");
        for never in ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh"] {
            assert!(!a.iter().any(|x| x == never), "{never} in {a:?}");
        }
        for generated in [
            "/etc/passwd",
            "/etc/group",
            "/etc/claude-code/managed-settings.json",
            "/etc/codex/requirements.toml",
        ] {
            let i = a.iter().position(|x| x == generated).unwrap_or(0);
            assert!(i >= 2 && a[i - 2] == "--ro-bind-data", "{generated}: {a:?}");
            assert!(a[i - 1].parse::<i32>().is_ok_and(|fd| fd >= DATA_FD_MIN));
        }
    }

    #[test]
    fn control_paths_are_bound_read_only_after_the_writable_root_and_home() {
        let bind = |p: &str, pin_only| ControlBind {
            path: PathBuf::from(p),
            pin_only,
        };
        let ctl = vec![
            bind("/srv/sandboxes/r-1/.claude", false),
            bind("/srv/homes/c-1/.claude", true),
            bind("/srv/homes/c-1/.claude/settings.json", false),
        ];
        let a = args_of(Profile::WorkspaceWrite, &ctl);
        let root = pos(&a, &["--bind", "/srv/sandboxes/r-1", "/srv/sandboxes/r-1"]).unwrap();
        let home = pos(&a, &["--bind", "/srv/homes/c-1", "/srv/homes/c-1"]).unwrap();
        let mut last = 0;
        for c in &ctl {
            let p = c.path.to_string_lossy();
            let how = if c.pin_only { "--bind" } else { "--ro-bind" };
            let i = pos(&a, &[how, &p, &p]).unwrap_or_else(|| panic!("{p}: {a:?}"));
            assert!(
                i > root && i > home,
                "{p} must be mounted over the writable binds"
            );
            assert!(i > last, "{p} out of order");
            last = i;
        }
    }
}
