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

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;
use warden_containment::{RealFs, resolve};
use warden_store::Store;

use crate::SandboxError;
use crate::cgroup::{CgroupBase, LimitsOutcome};
use crate::control::{prepare_home, prepare_root};
use crate::etc::etc_plan;
use crate::git::GitBind;
use crate::identity::{AGENT_NAME, AgentIdentity, UidPool, UidRange, first_unsearchable};
use crate::kill::ProcessTree;
use crate::lease::{Lease, Leases, now_unix_ms};
use crate::procfs::ProcessIdentity;
use crate::roots::{Profile, sanitize_label};
use warden_containment::rights::Rights;

mod bwrap;
mod fds;
mod host;
mod program;
mod spec;

use bwrap::{BwrapPlan, bwrap_args};
use fds::{data_fds, fill_fd, high_fd, sealed_fd};
use host::{HostPlan, host_command};
use program::{agent_program, check_env, resolve_program};
use spec::dynamic_loaders;
pub use spec::{
    Containment, EGRESS_DIR_INSIDE, EGRESS_SOCKET_NAME, EgressSpec, ExecOnly, Network, SpawnSpec,
    SpawnedAgent,
};

const GATE: &str = "IFS= read -r _warden_gate <&3 || exit 111; exec 3<&-; exec \"$@\"";
const SH: &str = "/bin/sh";

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
        let cpu_fd = spec.cpu_group.as_ref().map(|g| g.procs_fd());
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
                // And the principal's CPU group (a v1 `cpu` hierarchy), likewise.
                if let Some(fd) = cpu_fd
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
        let mut tree = ProcessTree::from_spawn(
            spec.conversation_id.clone(),
            child,
            leader,
            cgroup,
            marker.clone(),
            bwrapped,
            self.leases.clone(),
        );
        tree.hold_cpu_group(spec.cpu_group.clone());
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
mod tests;
