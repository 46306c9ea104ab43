//! What containment this host offers, for `warden doctor` and for choosing fallbacks.

use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cgroup;

/// The containment features of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFeatures {
    /// cgroup2 mount point, if any.
    pub cgroup2_mount: Option<PathBuf>,
    /// This process's cgroup v2 path.
    pub own_cgroup: Option<PathBuf>,
    /// True when a child cgroup could be created (and removed) under this process's cgroup.
    pub cgroup_writable: bool,
    /// Controllers available in this process's cgroup (`cgroup.controllers`).
    pub cgroup_controllers: Vec<String>,
    /// v1 hierarchies mounted alongside (a hybrid host).
    pub cgroup_v1: Vec<String>,
    pub bwrap_path: Option<PathBuf>,
    pub bwrap_version: Option<String>,
    /// True when `bwrap --unshare-pid --unshare-net … true` ran successfully.
    pub bwrap_works: bool,
    pub user_namespaces: bool,
    pub network_namespaces: bool,
    /// Landlock ABI version, if the kernel has landlock enabled.
    pub landlock_abi: Option<u32>,
    pub pidfd: bool,
    /// How a supervisor started by this user would run its agents (with no `agent_user`
    /// configured), or why it could not start them.
    pub agent_identity: Result<crate::IdentityPlan, String>,
}

impl HostFeatures {
    /// Whether agents with `network = "proxy"` can run here: they need bubblewrap's network
    /// namespace (a supervisor without it refuses them, never giving them the host's network).
    pub fn proxy_egress(&self) -> Result<(), String> {
        match (&self.bwrap_path, self.bwrap_works) {
            (None, _) => Err("bubblewrap is missing".into()),
            (Some(_), false) => Err("bubblewrap does not work here".into()),
            (Some(_), true) => Ok(()),
        }
    }

    /// Limits that cannot be applied here because the controller is missing.
    pub fn missing_limit_controllers(&self) -> Vec<&'static str> {
        ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| !self.cgroup_controllers.iter().any(|h| h == c))
            .collect()
    }
}

/// Probes the host. Spawns a few short-lived processes (bwrap, namespace probes).
pub fn host_features() -> HostFeatures {
    let mount = cgroup::cgroup2_mount();
    let own = cgroup::own_cgroup();
    let own_dir = match (&mount, &own) {
        (Some(m), Some(o)) => Some(m.join(o.strip_prefix("/").unwrap_or(o))),
        _ => None,
    };
    let cgroup_controllers = own_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("cgroup.controllers")).ok())
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let cgroup_writable = own_dir.as_ref().is_some_and(|d| {
        let probe = d.join(format!("warden-probe-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&probe).is_ok() && std::fs::remove_dir(&probe).is_ok()
    });
    let cgroup_v1 = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| {
            info.lines()
                .filter_map(|l| {
                    let (left, right) = l.split_once(" - ")?;
                    let mut r = right.split_whitespace();
                    (r.next()? == "cgroup").then_some(())?;
                    left.split_whitespace().nth(4).map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let bwrap_path = find_bwrap();
    let bwrap_version = bwrap_path.as_ref().and_then(|b| {
        Command::new(b)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    });
    let bwrap_works = bwrap_path.as_deref().is_some_and(bwrap_works);
    HostFeatures {
        cgroup2_mount: mount,
        own_cgroup: own,
        cgroup_writable,
        cgroup_controllers,
        cgroup_v1,
        bwrap_path,
        bwrap_version,
        bwrap_works,
        user_namespaces: unshare_works(libc::CLONE_NEWUSER),
        network_namespaces: unshare_works(libc::CLONE_NEWNET),
        landlock_abi: landlock_abi(),
        pidfd: pidfd_works(),
        agent_identity: crate::IdentityPlan::for_this_process("", "").map_err(|e| e.to_string()),
    }
}

/// The arguments of the bubblewrap probe: a pid and network namespace, a read-only root, a fresh
/// `/proc`, `/dev` and `/tmp`, a cleared and set environment (the spawn hands the program its
/// environment only inside, `--clearenv`/`--setenv`: a bubblewrap without them is not one the
/// spawner can use), running `/bin/true` (what an agent's sandbox needs at least).
pub const BWRAP_PROBE: [&str; 18] = [
    "--die-with-parent",
    "--clearenv",
    "--setenv",
    "WARDEN_PROBE",
    "1",
    "--unshare-pid",
    "--unshare-net",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--",
    "/bin/true",
];

/// `bwrap` on this process's `PATH`, or in `/usr/bin`.
pub fn find_bwrap() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .filter(|d| d.is_absolute())
            .map(|d| d.join("bwrap"))
            .find(|c| c.is_file())
    });
    from_path.or_else(|| {
        let p = PathBuf::from("/usr/bin/bwrap");
        p.is_file().then_some(p)
    })
}

/// True when bubblewrap can build the kind of sandbox the spawner asks for.
pub fn bwrap_works(bwrap: &Path) -> bool {
    Command::new(bwrap)
        .args(BWRAP_PROBE)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn unshare_works(flag: libc::c_int) -> bool {
    let mut cmd = Command::new("/bin/true");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: unshare is a single system call, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(flag) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// The kernel's Landlock ABI version, `None` without Landlock (or with it disabled).
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attr and size 0 this only queries the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as u32)
}

fn pidfd_works() -> bool {
    rustix::process::Pid::from_raw(std::process::id() as i32).is_some_and(|me| {
        rustix::process::pidfd_open(me, rustix::process::PidfdFlags::empty()).is_ok()
    })
}

fn yn(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

impl fmt::Display for HostFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "containment features of this host:")?;
        match &self.cgroup2_mount {
            Some(m) => writeln!(
                f,
                "  cgroup v2:          mounted at {} (own cgroup {}), writable: {}",
                m.display(),
                self.own_cgroup
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "?".into()),
                yn(self.cgroup_writable)
            )?,
            None => writeln!(f, "  cgroup v2:          not mounted (process groups only)")?,
        }
        let ctl = if self.cgroup_controllers.is_empty() {
            "none".to_string()
        } else {
            self.cgroup_controllers.join(" ")
        };
        writeln!(f, "  v2 controllers:     {ctl}")?;
        let missing = self.missing_limit_controllers();
        if !missing.is_empty() {
            writeln!(
                f,
                "  limits unavailable: {} (controllers missing from cgroup v2; limits are not applied)",
                missing
                    .iter()
                    .map(|c| format!("{c}.max"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        if !self.cgroup_v1.is_empty() {
            writeln!(f, "  cgroup v1 (hybrid): {}", self.cgroup_v1.join(" "))?;
        }
        match &self.bwrap_path {
            Some(p) => writeln!(
                f,
                "  bubblewrap:         {} ({}), works: {}",
                p.display(),
                self.bwrap_version.as_deref().unwrap_or("unknown version"),
                yn(self.bwrap_works)
            )?,
            None => writeln!(
                f,
                "  bubblewrap:         MISSING - agents run without an OS sandbox (install the bubblewrap package)"
            )?,
        }
        writeln!(f, "  user namespaces:    {}", yn(self.user_namespaces))?;
        writeln!(f, "  network namespaces: {}", yn(self.network_namespaces))?;
        match self.proxy_egress() {
            Ok(()) => writeln!(
                f,
                "  proxy egress:       available (network = \"proxy\": own namespace, the supervisor's egress proxy)"
            )?,
            Err(why) => writeln!(
                f,
                "  proxy egress:       UNAVAILABLE ({why}): agents with network = \"proxy\" (the built-in claude and codex) are refused"
            )?,
        }
        match self.landlock_abi {
            Some(v) => writeln!(
                f,
                "  landlock:           ABI {v} (allow_execute = false workspaces: only the agent's own install may be executed)"
            )?,
            None => writeln!(
                f,
                "  landlock:           unavailable (an agent in an allow_execute = false workspace is refused: nothing could stop its own shell)"
            )?,
        }
        writeln!(f, "  pidfd:              {}", yn(self.pidfd))?;
        match &self.agent_identity {
            Ok(crate::IdentityPlan::Switch(i)) => write!(
                f,
                "  agent identity:     a supervisor run by this user (root) switches every agent to \
                 uid {} gid {} (or [sandbox] agent_user): agents cannot read what only root or \
                 the supervisor can, and a file an agent makes is the agent's",
                i.uid, i.gid
            ),
            Ok(crate::IdentityPlan::SupervisorUid { uid, .. }) => write!(
                f,
                "  agent identity:     NOT SEPARATED - this user (uid {uid}) is not root and holds \
                 no CAP_SETUID/CAP_SETGID, so a supervisor run by it starts agents as its own uid. Cost: an agent can read and \
                 write everything the supervisor can (its store, records and transcripts, every \
                 other conversation's root and home) wherever bubblewrap does not hide it, and \
                 without bubblewrap nothing does. Run the supervisor as root or with those \
                 capabilities (deploy/systemd/warden-supervisor.service; it then switches agents \
                 to their own uid) or accept that conversations are separated only by \
                 bubblewrap and the policy"
            ),
            Err(e) => write!(f, "  agent identity:     UNAVAILABLE - {e}"),
        }
    }
}
