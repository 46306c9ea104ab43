//! What a spawn is asked for and what it gives back: `SpawnSpec` (program, environment, root,
//! home, profile, network, egress relay, execute-only install), `Containment` and `SpawnedAgent`.
//! Plain data; must never start anything.

use std::ffi::OsString;
use std::path::PathBuf;

use tokio::process::{ChildStderr, ChildStdout};

use crate::cgroup::{Limits, LimitsOutcome};
use crate::env::{ChildEnv, DepthGuard};
use crate::etc::AdapterPolicy;
use crate::kill::ProcessTree;
use crate::roots::Boundary;

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
pub(super) fn dynamic_loaders() -> Vec<PathBuf> {
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
    /// The principal's CPU group (`cpu_share.rs`): the child enters it between fork and exec,
    /// and its tree holds it until the tree is gone.
    pub cpu_group: Option<std::sync::Arc<crate::CpuGroup>>,
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
            cpu_group: None,
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
