//! The bubblewrap view of an agent as arguments (`bwrap_args`): system directories and the
//! generated `/etc` read-only, root and home writable, control paths and every `.git` by allowlist,
//! the network namespace. Pure; must never bind the host's `/etc` whole.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{EGRESS_DIR_INSIDE, Network, SpawnSpec};
use crate::control::ControlBind;
use crate::etc::EtcBind;
use crate::git::GitBind;
use crate::roots::Profile;

/// System directories every sandbox sees read-only. `/etc` is not one of them: see etc.rs.
pub(super) const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

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
