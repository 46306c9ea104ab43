//! Containment for agent processes: the roots they work in, how they are spawned (clean
//! environment, recursion guard, own process group, own cgroup, bubblewrap), and how whole
//! process trees are killed, including after a supervisor crash (leases).
//!
//! Owns: `Boundary` roots (owned sandboxes made with mkdtemp semantics under the supervisor's
//! state directory, and validated operator workspaces), per-conversation agent homes
//! (`AgentHomes`), `Spawner`/`SpawnSpec` (with the agent identity every child switches to, the
//! sandbox's generated `/etc` and managed adapter policy, read-only agent-control paths), the
//! termination ladder (`ProcessTree::kill`), leases and `reap_leftovers`, and `host_features`.
//!
//! Must never: turn a caller-chosen string into a path, inherit the supervisor's environment
//! wholesale, start a process when the inherited depth is at the limit, signal a pid read back
//! from storage without proving (start time + pidfd) it is the same process, or signal a stored
//! process group id; run a child as root or as the supervisor when an agent identity is set;
//! bind the host's `/etc` whole; follow a symlink the agent planted at an agent-control path.
//! Path containment comes from `warden-containment`, not from here.

mod cgroup;
mod control;
mod cpu_share;
mod env;
mod etc;
mod features;
mod git;
mod homes;
mod identity;
mod kill;
mod lease;
mod procfs;
mod reap;
mod roots;
mod spawn;

pub use cgroup::{CgroupBase, ConvCgroup, Limits, LimitsOutcome};
pub use control::{
    ControlBind, GEMINI_SETTINGS_JSON, HOME_CONTROL, HOME_ENTRIES, OPENCODE_GITIGNORE, ROOT_CONTROL,
};
pub use cpu_share::{CpuGroup, CpuShares};
pub use env::{
    BASE_KEYS, ChildEnv, DEFAULT_MAX_DEPTH, DEPTH_ENV, DepthGuard, EnvPolicy, TREE_MARKER_ENV,
};
pub use etc::{
    AdapterPolicy, CLAUDE_MANAGED_MCP, CLAUDE_MANAGED_MCP_JSON, CLAUDE_MANAGED_SETTINGS,
    CLAUDE_MANAGED_SETTINGS_JSON, CODEX_CONFIG_ON_REQUEST, CODEX_CONFIG_UNTRUSTED,
    CODEX_MANAGED_CONFIG, CODEX_REQUIREMENTS, CODEX_REQUIREMENTS_TOML,
    CODEX_REQUIREMENTS_UNTRUSTED, ETC_ENTRIES, ETC_FORBIDDEN, EtcBind, OPENCODE_CONFIG_JSON,
    OPENCODE_MANAGED_CONFIG, QWEN_SYSTEM_SETTINGS, QWEN_SYSTEM_SETTINGS_JSON, etc_plan,
};
pub use features::{
    BWRAP_PROBE, HostFeatures, bwrap_works, find_bwrap, host_features, landlock_abi,
};
pub use git::{GIT_COPIED_FILES, GIT_NESTED_DIRS, GIT_WRITABLE_DIRS};
pub use homes::{AgentHome, AgentHomes};
pub use identity::{
    AGENT_NAME, AgentIdentity, DEFAULT_AGENT_UID, IdentityPlan, UidRange, can_switch_ids,
    chown_tree, first_unsearchable,
};
pub use kill::{
    DEFAULT_GRACE, DEFAULT_KILL_TIMEOUT, KillOptions, KillReport, ProcessTree, reap_orphan_zombies,
    set_child_subreaper,
};
pub use lease::{Lease, Leases};
pub use procfs::ProcessIdentity;
pub use reap::{ReapReport, reap_leftovers};
pub use roots::{
    Boundary, OwnedRoots, Profile, RootOwner, WorkspacePolicy, sanitize_label, temp_tree_of,
};
pub use spawn::{
    Containment, EGRESS_DIR_INSIDE, EGRESS_SOCKET_NAME, EgressSpec, ExecOnly, Network, SpawnSpec,
    SpawnedAgent, Spawner,
};

use std::path::{Path, PathBuf};

/// Errors from this crate; each says what was being done and on which path.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error(
        "refusing to spawn: inherited {DEPTH_ENV}={inherited} is at or above the maximum {max}"
    )]
    DepthExceeded { inherited: u32, max: u32 },
    #[error("workspace {path} refused: {reason}")]
    WorkspaceRefused { path: PathBuf, reason: String },
    #[error("cannot spawn {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage: {0}")]
    Store(#[from] warden_store::StoreError),
    #[error("lease encoding: {0}")]
    Lease(String),
}

impl SandboxError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
