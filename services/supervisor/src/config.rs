//! The supervisor's configuration: the embedded default, the agent registry (with built-in
//! `scripted`, `claude` and `codex` entries that a file may override), operator workspaces by
//! name, the policy socket and every quota. The agents' types and built-ins are [`agents`]'s,
//! the quotas [`limits`]'s, loading and reloading [`load`]'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use warden_daemon::config::{ConfigError, Origin};
use warden_daemon::{DaemonSection, ListenerConfig};

mod agents;
mod limits;
mod load;

pub use agents::{
    AgentConfig, AgentsSection, CLAUDE_ADAPTER, CODEX_ADAPTER, GEMINI_ADAPTER, Network,
    OPENCODE_ADAPTER, QWEN_ADAPTER, builtin_agents,
};
pub use limits::Limits;
pub use load::{load, reloadable};

/// The configuration used when no file is given. Relative socket paths resolve against the
/// state directory.
pub const EMBEDDED_DEFAULT: &str = r#"
# warden-supervisor: embedded default configuration.
[daemon]
state_dir = "/var/lib/warden/supervisor"
log_format = "human"
log_level = "info"

# The SupervisorService (+ AdminService) socket. Only the gateway may call it: list its uid.
# Empty allow_uids and allow_gids = only this daemon's own uid.
[listen]
socket = "supervisor.sock"
mode = "0660"
allow_uids = []

[policy]
# The PolicyService socket (warden-policy, or warden-approver swapped in).
socket = "/run/warden/policy.sock"
# Replicas of the same policy (their audit shared in PostgreSQL), asked in order when the one in
# use is unavailable: failover_sockets = ["/run/warden/policy-b.sock"]
# When a decision must be made: it travels to the policy as an absolute deadline, and a policy
# that is not ready by then records and answers DENY deadline_exceeded.
decide_deadline_ms = 200
# How much longer its answer may take to arrive (audit write, trip back); past that the policy
# counts as hung and the request is denied here (policy_unavailable).
answer_grace_ms = 500

[limits]
task_text_bytes = 16384
turn_timeout_secs = 600
output_bytes = 262144
stderr_ring_bytes = 65536
transcript_bytes = 262144
idle_timeout_secs = 120
handshake_deadline_ms = 10000
cancel_grace_ms = 2000
kill_grace_ms = 2000
max_conversations = 512
# Agents alive at once (0 = from the host's memory at ~300 MiB per agent, at most
# max_conversations). At the limit the least recently used idle agent is stopped first.
max_live_agents = 0
# Turns running at once across all conversations (0 = sixteen per core); more wait in one FIFO,
# told their place, instead of competing for the CPU their permissions need.
max_active_turns = 0
# Turn slots one principal may hold at once (0 = three quarters of max_active_turns, or of
# max_live_agents when that is smaller, at least 1): one caller's hanging tasks leave room for
# the others. Waiting turns and waiting agent starts are served round robin across principals.
max_active_turns_per_principal = 0
# Open conversations one principal may hold at once, each with its root's fd and (with
# sandbox.agent_uid_range) a uid until it is closed. Unset: 384, or three quarters of the uid range
# when that is smaller, at least 1. One more open is refused (fault `capacity`); 0 is refused.
# max_open_conversations_per_principal = 384
# A turn whose conversation needs an agent while every live agent is busy waits for one this
# long (fault `capacity` after it); at most max_agent_waiters wait at once (more are refused).
capacity_wait_ms = 60000
max_agent_waiters = 1024
max_queued_turns = 64
# Agents starting at once (spawn to session/new; 0 = two per core): more wait before they spawn,
# served round robin across principals.
max_starting_agents = 0
# Start slots one principal may hold at once (0 = three quarters of max_starting_agents, at least
# 1): one caller's burst of new contexts leaves a slot for the others' starts.
max_starting_agents_per_principal = 0
fs_read_bytes = 2097152
# One agent's requests (fs/*, permissions, questions, terminals) handled at once; one more is
# answered with an error at once.
agent_requests_in_flight = 64
# The bytes of those requests together (each held until it is answered); one more whose line
# would pass it is answered with an error at once.
agent_requests_bytes = 33554432
# Answers queued for an agent and not read by it yet: past this the agent has stopped reading its
# stdin, and it is stopped (fault request-limit) instead of holding the supervisor's memory.
agent_queue_bytes = 33554432
# Requests of one turn; the next is refused and ends the turn with fault request-limit
# (0 = unbounded): fs/read_text_file + fs/write_text_file, permission requests (each an audit
# record written durably), elicitation/create (each a question stored at the gateway).
fs_requests_per_turn = 2048
permissions_per_turn = 1024
questions_per_turn = 16
# terminal/create requests of one turn (0 = unbounded; agents with terminal = true): each runs a
# command, decided on its own unless an allowed execute judged it.
terminals_per_turn = 64
# Terminals one conversation holds at once (created and not yet released, exited or not), and
# the output they hold together: each reserves its tail (its outputByteLimit, at most
# output_bytes) from terminal_output_bytes when it is created. One more is refused, naming the
# key; the turn goes on. Between turns the agent's requests are refused (and counted), never
# decided.
max_terminals = 16
terminal_output_bytes = 4194304
# Connections one agent's egress proxy holds open at once (network = "proxy"); more get 503.
egress_connections = 64
# A turn whose agent is refused the same destination this many times ends with fault
# egress-refused (0 = never): a model endpoint that is not allowed fails the turn in seconds.
egress_refusals_end_turn = 3

[egress]
# The TCP listeners of the warden this supervisor belongs to (the gateway's HTTP and gRPC, the
# approver's page), "ip:port": no agent's egress proxy connects to them, whatever its allowlist
# says. 0.0.0.0 and [::] stand for every address of this host. `warden up` sets its own.
warden_listeners = ["127.0.0.1:8080"]

[agents]
default = "scripted"
"#;

/// The largest `pool_size` of one agent.
pub const MAX_POOL_SIZE: usize = 64;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorConfig {
    pub daemon: DaemonSection,
    pub listen: ListenerConfig,
    /// The same API for gateways on other hosts: a `tcp` listener with `tls` (mutual TLS;
    /// callers admitted by the SPIFFE ID of their certificate, `tls.admit`). Off by default;
    /// same-host callers stay on `listen`'s Unix socket.
    #[serde(default)]
    pub listen_remote: Option<ListenerConfig>,
    pub policy: PolicySection,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub agents: AgentsSection,
    /// Operator workspaces by name. A caller names one; it never sends a path.
    #[serde(default)]
    pub workspaces: BTreeMap<String, WorkspaceConfig>,
    #[serde(default)]
    pub sandbox: SandboxSection,
    /// Conversations that start as a copy of a caller's directory (`copy_from`).
    #[serde(default)]
    pub copies: CopiesSection,
    #[serde(default)]
    pub runtime: RuntimeSection,
    #[serde(default)]
    pub adapters: AdaptersSection,
    #[serde(default)]
    pub egress: EgressSection,
    /// This supervisor as one cell of many: registered in the shared store with its capacity,
    /// so gateways in `[cells]` mode place conversations on it (`cell.rs`). Off by default.
    #[serde(default)]
    pub cell: Option<CellSection>,
}

/// `[cell]`: who this cell is, where gateways reach it, and the shared store it reports to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellSection {
    /// Unique among the cells sharing the store (a StatefulSet pod name does): lowercase
    /// letters, digits, `-`, `.`, `_`; at most 63 bytes.
    pub id: String,
    /// `host:port` at which gateways reach `listen_remote` (the pod's Service name, say).
    pub address: String,
    /// The shared PostgreSQL store (`url`, pool, TLS, connect timeout as in `[store]`).
    pub store: warden_pgstate::StoreSection,
    /// How often the cell writes its capacity. A gateway counts a cell lost when it has not
    /// written for its `cells.lost_after_ms`, so keep this well under that (a third, say).
    #[serde(default = "default_cell_refresh_ms")]
    pub refresh_ms: u64,
}

fn default_cell_refresh_ms() -> u64 {
    2_000
}

impl CellSection {
    /// The store section as PostgreSQL (a cell's registry is never on sled).
    pub fn store(&self) -> warden_pgstate::StoreSection {
        warden_pgstate::StoreSection {
            backend: warden_pgstate::Backend::Postgres,
            ..self.store.clone()
        }
    }

    fn validate(&self, origin: &Origin, has_remote: bool) -> Result<(), ConfigError> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 63
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
        if !id_ok {
            return Err(ConfigError::invalid(
                origin,
                "cell.id",
                "1 to 63 of a-z, 0-9, '-', '.', '_'",
            ));
        }
        if !has_remote {
            return Err(ConfigError::invalid(
                origin,
                "cell",
                "a cell is reached over `listen_remote` (tcp with mutual TLS): configure it",
            ));
        }
        if self
            .address
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(ConfigError::invalid(
                origin,
                "cell.address",
                "host:port at which gateways reach listen_remote",
            ));
        }
        if !(200..=60_000).contains(&self.refresh_ms) {
            return Err(ConfigError::invalid(
                origin,
                "cell.refresh_ms",
                "must be between 200 and 60000",
            ));
        }
        self.store().validate(origin).map_err(|e| {
            // Keys are named as `[cell.store]` ones.
            ConfigError::invalid(origin, "cell.store", e.to_string())
        })
    }
}

/// What every agent's egress proxy refuses whatever its allowlist says.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressSection {
    /// The TCP listeners of this warden (gateway HTTP and gRPC, the approver's page) as
    /// `ip:port`: an agent never reaches warden's own doors through its proxy. `0.0.0.0:p` and
    /// `[::]:p` stand for port p on every address of this host.
    pub warden_listeners: Vec<String>,
}

/// Where installed ACP adapters are found (`adapter = "<package>@<version>"` entries).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptersSection {
    /// One directory per adapter below it, `<name without scope>-<version>`, as made by
    /// `npm install --prefix <dir>/<name>-<version> <package>@<version>` (`warden doctor` prints
    /// the command for each built-in). Bound read-only into the agent's sandbox.
    pub dir: PathBuf,
    /// The Node.js that runs them ("" = /usr/bin/node, else /usr/local/bin/node).
    pub node: PathBuf,
}

/// The default `[adapters] dir`.
pub const DEFAULT_ADAPTERS_DIR: &str = "/usr/local/lib/warden/adapters";

impl Default for AdaptersSection {
    fn default() -> Self {
        AdaptersSection {
            dir: PathBuf::from(DEFAULT_ADAPTERS_DIR),
            node: PathBuf::new(),
        }
    }
}

/// The async runtime.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// Worker threads: 0 = one per core, 1 = a single thread (the default), n = n threads.
    ///
    /// Why one: every permission and every streamed chunk crosses several tasks (ACP reader,
    /// handler, policy client, event stream, ACP writer). On a multi-threaded runtime each hop
    /// may wake a parked worker, and on a small host those wake-ups and context switches were
    /// most of the supervisor's CPU: one thread measured about 30 % less CPU per permission
    /// and about 20 % more streamed chunks per second on 2 cores. Nothing in the supervisor
    /// blocks a thread for long (file and procfs work is short and local).
    pub worker_threads: usize,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection { worker_threads: 1 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    pub socket: PathBuf,
    /// Replicas of the same policy service (sharing their audit in PostgreSQL), asked in order
    /// when the one in use is unavailable; empty = `socket` alone.
    #[serde(default)]
    pub failover_sockets: Vec<PathBuf>,
    #[serde(default = "default_decide_deadline")]
    pub decide_deadline_ms: u64,
    #[serde(default = "default_answer_grace")]
    pub answer_grace_ms: u64,
}

fn default_answer_grace() -> u64 {
    crate::policy::DEFAULT_ANSWER_GRACE_MS
}

fn default_decide_deadline() -> u64 {
    200
}

/// An operator workspace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    pub path: PathBuf,
    /// Allow execute/fetch/other in this (not owned) root.
    #[serde(default)]
    pub allow_execute: bool,
}

/// `[copies]`: a conversation's root made as a copy of a directory the caller names
/// (`OpenConversationRequest.copy_from`, `warden send -C DIR`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CopiesSection {
    /// Honour `copy_from` at all (off by default; `warden up` turns it on for a local
    /// deployment, where the caller is the person who owns the directory). A deployed host
    /// offers operator workspaces instead.
    pub local_dirs: bool,
    /// Bytes of file content a copy holds at most; a larger directory is refused.
    pub max_bytes: u64,
    /// Entries a copied directory holds at most; a larger one is refused.
    pub max_entries: usize,
}

impl Default for CopiesSection {
    fn default() -> Self {
        Self {
            local_dirs: false,
            max_bytes: 64 << 20,
            max_entries: 20_000,
        }
    }
}

/// OS containment settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSection {
    /// Use bubblewrap when the host has it (detected at start; the default). Without it an agent
    /// is contained by its process group and cgroup only, and `warden doctor` says so.
    pub bubblewrap: bool,
    /// Use a cgroup v2 per agent where writable.
    pub cgroup: bool,
    /// One CPU group per principal, of equal weight, for its agents and terminals, where the
    /// host has a writable `cpu` hierarchy of cgroup v1 (`warden_sandbox::CpuShares`): under
    /// contention a principal with eight agents gets the CPU of one with one.
    pub cpu_share: bool,
    /// Extra environment names passed to every agent (operator-only).
    pub env_extra: Vec<String>,
    /// The user every agent (and ACP terminal) runs as: a name from /etc/passwd or a number.
    /// Empty: a root supervisor uses the fixed uid/gid 61000 (`warden_sandbox::DEFAULT_AGENT_UID`,
    /// refused if the host already uses it); a non-root supervisor cannot switch and runs agents
    /// as itself (setting this then is an error). Never root, never the supervisor's own uid.
    pub agent_user: String,
    /// The agent's group (name or number). Empty: the user's primary group (or the same number).
    pub agent_group: String,
    /// `[first, last]`: one uid per open conversation from this range instead of one
    /// `agent_user` for all (gid = uid unless `agent_group` is set), so agents of two
    /// conversations cannot touch each other's files even without bubblewrap. Empty: off.
    pub agent_uid_range: Vec<u32>,
    /// The nice value every agent (and ACP terminal) starts at, 0..=19 (0 = the supervisor's):
    /// agents that spin the CPU leave it to the daemons deciding their permissions in time.
    pub agent_nice: i32,
}

impl Default for SandboxSection {
    fn default() -> Self {
        SandboxSection {
            bubblewrap: true,
            cgroup: true,
            cpu_share: true,
            env_extra: Vec::new(),
            agent_user: String::new(),
            agent_group: String::new(),
            agent_uid_range: Vec::new(),
            agent_nice: 10,
        }
    }
}

/// The configuration after validation, with built-ins merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub file: SupervisorConfig,
    pub agents: BTreeMap<String, AgentConfig>,
    pub origin: Origin,
}

/// The open conversations one principal may hold when `limits.max_open_conversations_per_principal`
/// is unset (and no smaller uid range bounds it): each holds its root's directory fd, so with the
/// packaged unit's 65536 fds many principals fit; the 1024-fd default of a shell holds two.
pub const DEFAULT_OPEN_CONVERSATIONS_PER_PRINCIPAL: usize = 384;

impl Settings {
    pub fn state_dir(&self) -> &Path {
        &self.file.daemon.state_dir
    }

    /// The policy socket, relative paths resolved against the state directory.
    pub fn policy_socket(&self) -> PathBuf {
        self.resolve(&self.file.policy.socket)
    }

    /// `policy.socket`, then `policy.failover_sockets`, resolved.
    pub fn policy_sockets(&self) -> Vec<PathBuf> {
        std::iter::once(&self.file.policy.socket)
            .chain(&self.file.policy.failover_sockets)
            .map(|p| self.resolve(p))
            .collect()
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.state_dir().join(p)
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.file.limits
    }

    /// `[egress] warden_listeners`, checked at load.
    pub fn warden_listeners(&self) -> crate::egress::WardenListeners {
        crate::egress::WardenListeners::new(
            self.file
                .egress
                .warden_listeners
                .iter()
                .filter_map(|l| l.parse().ok())
                .collect(),
        )
    }

    /// The cap on agents starting at once in force.
    pub fn max_starting_agents(&self) -> usize {
        match self.file.limits.max_starting_agents {
            0 => std::thread::available_parallelism()
                .map(|n| n.get() * 2)
                .unwrap_or(4)
                .max(2),
            n => n,
        }
    }

    /// The start slots one principal may hold: the configured share (never above the cap), or
    /// three quarters of the cap, at least 1.
    pub fn max_starting_agents_per_principal(&self) -> usize {
        let cap = self.max_starting_agents();
        match self.file.limits.max_starting_agents_per_principal {
            0 => crate::admission::default_share(cap, cap),
            n => n.min(cap),
        }
    }

    /// The turn-slot cap in force.
    pub fn max_active_turns(&self) -> usize {
        match self.file.limits.max_active_turns {
            0 => crate::admission::default_cap(),
            n => n,
        }
    }

    /// The turn slots one principal may hold: the configured share (never above the cap), or
    /// `admission::default_share`.
    pub fn max_active_turns_per_principal(&self) -> usize {
        match self.file.limits.max_active_turns_per_principal {
            0 => crate::admission::default_share(self.max_active_turns(), self.max_live_agents()),
            n => n.min(self.max_active_turns()),
        }
    }

    /// The open conversations one principal may hold in force: the configured share, or
    /// [`DEFAULT_OPEN_CONVERSATIONS_PER_PRINCIPAL`] — three quarters of the size of
    /// `sandbox.agent_uid_range` when that is smaller (each open conversation holds a uid), at
    /// least 1, so one principal's idle conversations always leave a quarter of the uids to the
    /// others. Not derived from `max_conversations`: that bounds conversations with a live
    /// agent, and idle-stopped ones (which still hold a root's fd) are not counted there.
    pub fn max_open_conversations_per_principal(&self) -> usize {
        let l = &self.file.limits;
        if let Some(n) = l.max_open_conversations_per_principal {
            return n;
        }
        let mut share = DEFAULT_OPEN_CONVERSATIONS_PER_PRINCIPAL;
        if let [first, last] = self.file.sandbox.agent_uid_range[..]
            && last >= first
        {
            share = share.min(((last - first) as usize + 1) * 3 / 4);
        }
        share.max(1)
    }

    /// The live-agent cap in force: the configured one, or derived from memory, never above
    /// `max_conversations` nor the size of `sandbox.agent_uid_range`.
    pub fn max_live_agents(&self) -> usize {
        let l = &self.file.limits;
        let cap = if l.max_live_agents == 0 {
            crate::live::default_cap(l.max_conversations)
        } else {
            l.max_live_agents
        };
        let mut cap = cap.min(l.max_conversations);
        // With a uid range every live agent (warm ones included) holds one of its uids, and
        // only they do (an idle-stopped conversation gives its uid back): a live-agent slot is
        // then a uid, waited for in the fair order, never a start that finds none free.
        if let [first, last] = self.file.sandbox.agent_uid_range[..]
            && last >= first
        {
            cap = cap.min((last - first) as usize + 1);
        }
        cap.max(1)
    }

    /// The warm agents of `agent` in force: its `pool_size` (0 when disabled), never more than
    /// the live-agent cap leaves (the cap is derived from memory when unset). A
    /// `network = "proxy"` agent is kept warm too: its egress proxy forwards nothing until the
    /// take binds it to the taking conversation (`pool.rs`).
    pub fn pool_size(&self, agent: &AgentConfig) -> usize {
        if !agent.enabled {
            return 0;
        }
        agent.pool_size.min(self.max_live_agents())
    }

    /// The deadline for one Decide for `agent`.
    pub fn decide_deadline(&self, agent: &AgentConfig) -> Duration {
        Duration::from_millis(
            agent
                .decide_deadline_ms
                .unwrap_or(self.file.policy.decide_deadline_ms),
        )
    }

    /// Looks an agent up ("" = default).
    pub fn agent(&self, name: &str) -> Option<(&str, &AgentConfig)> {
        let name = if name.is_empty() {
            self.file.agents.default.as_str()
        } else {
            name
        };
        self.agents
            .get_key_value(name)
            .filter(|(_, a)| a.enabled)
            .map(|(k, v)| (k.as_str(), v))
    }

    /// The program an agent runs: `scripted` with an empty command is the
    /// `warden-scripted-agent` binary next to this executable.
    pub fn agent_program(&self, agent: &AgentConfig) -> Result<PathBuf, String> {
        if !agent.command.is_empty() {
            return Ok(PathBuf::from(&agent.command));
        }
        shipped_binary("warden-scripted-agent")
    }
}

/// Where an agent's `command` is found: a path (with a `/`) as it is, a bare name on the
/// supervisor's `PATH`. Refused unless it is a regular file someone may execute.
pub fn find_program(command: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if command.contains('/') {
        let p = PathBuf::from(command);
        return if executable(&p) {
            Ok(p)
        } else {
            Err("no such executable file".into())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(command))
        .find(|p| executable(p))
        .ok_or_else(|| "not found on PATH".into())
}

/// A binary shipped with warden, next to this executable (`warden-scripted-agent`,
/// `warden-egress-relay`).
pub fn shipped_binary(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let dir = me
        .parent()
        .ok_or_else(|| "own executable has no directory".to_string())?;
    // Tests run from target/<profile>/deps; the binaries live one level up.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!("{name} not found next to {}", me.display()))
}

impl Settings {
    /// The egress allowlist of `agent` (named `name`): its `egress_allow` entries (checked at
    /// load) and every `*_BASE_URL` value of its environment `env` (unparseable ones skipped,
    /// with a warning).
    pub fn egress_allowlist(
        &self,
        name: &str,
        agent: &AgentConfig,
        env: &warden_sandbox::ChildEnv,
    ) -> warden_egress::Allowlist {
        let mut l = warden_egress::Allowlist::new();
        for e in &agent.egress_allow {
            if let Ok(entry) = warden_egress::AllowEntry::parse(e) {
                l.push(entry, format!("agents.{name}.egress_allow"));
            }
        }
        for (k, v) in env.iter() {
            let k = k.to_string_lossy();
            if !k.ends_with("_BASE_URL") {
                continue;
            }
            let v = v.to_string_lossy();
            match warden_egress::HttpUrl::parse(&v) {
                Ok(u) => match warden_egress::Destination::new(&u.host, u.port) {
                    Ok(d) => l.push(warden_egress::AllowEntry::Exact(d), k.into_owned()),
                    Err(e) => {
                        tracing::warn!(agent = name, variable = %k, error = %e, "base URL not allowed for egress")
                    }
                },
                Err(e) => {
                    tracing::warn!(agent = name, variable = %k, error = %e, "base URL not allowed for egress")
                }
            }
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_loads_with_builtins() {
        let s = load(None, &[]).unwrap();
        assert_eq!(s.limits().task_text_bytes, 16384);
        assert_eq!(s.file.policy.decide_deadline_ms, 200);
        assert_eq!(s.agent("").unwrap().0, "scripted");
        assert_eq!(s.agent("claude").unwrap().1.supervised_mode, "default");
        assert_eq!(s.agent("codex").unwrap().1.supervised_mode, "read-only");
        // The real adapters reach their model API through the proxy only; scripted, nothing.
        assert_eq!(s.agent("claude").unwrap().1.network, Network::Proxy);
        assert_eq!(s.agent("codex").unwrap().1.network, Network::Proxy);
        assert_eq!(s.agent("scripted").unwrap().1.network, Network::None);
        assert_eq!(
            s.agent("claude").unwrap().1.egress_allow,
            ["api.anthropic.com:443"]
        );
        assert_eq!(
            s.agent("codex").unwrap().1.egress_allow,
            ["api.openai.com:443"]
        );
        let gemini = s.agent("gemini").unwrap().1;
        assert_eq!(gemini.network, Network::Proxy);
        assert_eq!(
            gemini.egress_allow,
            ["generativelanguage.googleapis.com:443"]
        );
        assert_eq!(gemini.args, ["--experimental-acp"]);
        assert_eq!(gemini.adapter, GEMINI_ADAPTER);
        assert!(gemini.is_supervised_mode("default") && gemini.is_supervised_mode("plan"));
        assert!(!gemini.is_supervised_mode("yolo") && !gemini.is_supervised_mode("autoEdit"));
        assert!(!gemini.fs && s.agent("claude").unwrap().1.fs);
        let qwen = s.agent("qwen").unwrap().1;
        assert_eq!(qwen.network, Network::Proxy);
        assert!(qwen.egress_allow.is_empty(), "only its OPENAI_BASE_URL");
        assert_eq!(qwen.args, ["--acp"]);
        assert_eq!(qwen.adapter, QWEN_ADAPTER);
        assert!(qwen.is_supervised_mode("default") && qwen.is_supervised_mode("plan"));
        for elevated in ["auto", "auto-edit", "yolo"] {
            assert!(!qwen.is_supervised_mode(elevated), "{elevated}");
        }
        // QWEN_HOME is fixed by the spawn (adapters::config_env), never by set_env a file
        // or an operator could change.
        assert!(!qwen.set_env.contains_key("QWEN_HOME"));
        assert_eq!(s.limits().egress_connections, 64);
        assert!(s.agent("nope").is_none());
        // One runtime thread unless the operator asks for more (see RuntimeSection).
        assert_eq!(s.file.runtime.worker_threads, 1);
        let s = load(None, &["runtime.worker_threads=0".into()]).unwrap();
        assert_eq!(s.file.runtime.worker_threads, 0);
    }

    #[test]
    fn agents_and_workspaces_from_overrides() {
        let s = load(
            None,
            &[
                "agents.mine.command=/bin/true".into(),
                "agents.mine.supervised_mode=ask".into(),
                "workspaces.proj.path=/srv/proj".into(),
            ],
        )
        .unwrap();
        let (_, a) = s.agent("mine").unwrap();
        assert!(a.is_supervised_mode("ask"));
        assert!(!a.is_supervised_mode("auto"));
        assert_eq!(s.file.workspaces["proj"].path, PathBuf::from("/srv/proj"));
    }

    #[test]
    fn an_entry_named_like_a_builtin_overrides_it_key_by_key() {
        let s = load(None, &["agents.scripted.terminal=true".into()]).unwrap();
        let (_, a) = s.agent("scripted").unwrap();
        assert!(a.terminal);
        assert!(!a.budget_in_prompt, "the built-in's other keys stay");
        assert!(a.env.iter().any(|e| e == "WARDEN_SCENARIO"));
        let e = load(None, &["agents.scripted.termnial=true".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.scripted"), "{e}");
        assert!(e.to_string().contains("termnial"), "{e}");
    }

    #[test]
    fn the_builtin_real_agents_reach_only_their_model_api_and_claude_sends_nothing_else() {
        let s = load(None, &[]).unwrap();
        let (_, c) = s.agent("claude").unwrap();
        assert_eq!(c.network, Network::Proxy);
        assert_eq!(c.egress_allow, ["api.anthropic.com:443"]);
        assert_eq!(
            c.set_env
                .get("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")
                .map(String::as_str),
            Some("1")
        );
        let (_, x) = s.agent("codex").unwrap();
        assert_eq!(x.network, Network::Proxy);
        assert_eq!(x.egress_allow, ["api.openai.com:443"]);
    }

    #[test]
    fn the_egress_allowlist_is_the_entries_and_every_base_url_of_the_environment() {
        let s = load(
            None,
            &[
                "agents.claude.egress_allow=[\"api.anthropic.com:443\", \"*.corp.example:443\"]"
                    .into(),
            ],
        )
        .unwrap();
        let (_, a) = s.agent("claude").unwrap();
        let env = warden_sandbox::EnvPolicy::new(
            ["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OTHER"],
            [""; 0],
        )
        .unwrap()
        .build_from([
            (
                "ANTHROPIC_BASE_URL".into(),
                "http://127.0.0.1:8080/v1".into(),
            ),
            ("OPENAI_BASE_URL".into(), "not a url".into()),
            ("OTHER".into(), "http://evil.example/".into()),
        ]);
        let l = s.egress_allowlist("claude", a, &env);
        let d = |h: &str, p| warden_egress::Destination::new(h, p).unwrap();
        let m = l
            .find(&d("127.0.0.1", 8080))
            .expect("the base URL is allowed");
        assert_eq!(m.source, "ANTHROPIC_BASE_URL");
        assert_eq!(
            l.find(&d("api.anthropic.com", 443)).unwrap().source,
            "agents.claude.egress_allow"
        );
        assert!(l.find(&d("x.corp.example", 443)).is_some());
        assert!(
            l.find(&d("evil.example", 80)).is_none(),
            "only *_BASE_URL variables count"
        );
        assert!(l.find(&d("127.0.0.1", 8081)).is_none());
        let e = load(None, &["limits.egress_connections=0".into()]).unwrap_err();
        assert!(e.to_string().contains("limits.egress_connections"), "{e}");
    }

    #[test]
    fn pool_sizes_default_to_one_warm_scripted_agent_and_are_bounded() {
        let s = load(None, &[]).unwrap();
        assert_eq!(s.agents["scripted"].pool_size, 1);
        assert_eq!(s.agents["claude"].pool_size, 0);
        assert_eq!(s.agents["codex"].pool_size, 0);
        let s = load(None, &["agents.mine.command=/bin/true".into()]).unwrap();
        assert_eq!(s.agents["mine"].pool_size, 0, "operator agents: none");
        let s = load(None, &["agents.claude.pool_size=2".into()]).unwrap();
        assert_eq!(
            s.pool_size(&s.agents["claude"]),
            2,
            "a proxy agent is kept warm when asked"
        );
        let s = load(
            None,
            &[
                "agents.claude.enabled=false".into(),
                "agents.claude.pool_size=2".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            s.pool_size(&s.agents["claude"]),
            0,
            "a disabled agent is not"
        );
        let s = load(
            None,
            &[
                "agents.claude.pool_size=2".into(),
                "agents.claude.network=\"host\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.pool_size(&s.agents["claude"]), 2);
        let e = load(
            None,
            &[
                "agents.claude.pool_size=3".into(),
                "limits.max_live_agents=3".into(),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("limits.max_live_agents"), "{e}");
        let e = load(None, &["agents.scripted.pool_size=65".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.scripted.pool_size"), "{e}");
        let s = load(
            None,
            &[
                "agents.scripted.pool_size=4".into(),
                "limits.max_conversations=2".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.pool_size(&s.agents["scripted"]), 2, "bounded by the cap");
    }

    #[test]
    fn terminal_bounds_have_documented_defaults_and_refuse_zero() {
        // The embedded file and the serde default say the same (a file without [limits] keys
        // gets the struct's default).
        for l in [load(None, &[]).unwrap().limits().clone(), Limits::default()] {
            assert_eq!(l.terminals_per_turn, 64);
            assert_eq!(l.max_terminals, 16);
            assert_eq!(l.terminal_output_bytes, 4 * 1024 * 1024);
            assert_eq!(l.turn_quotas().terminals, 64);
            assert_eq!(l.agent_requests_bytes, 32 * 1024 * 1024);
        }
        let s = load(
            None,
            &[
                "limits.terminals_per_turn=5".into(),
                "limits.max_terminals=3".into(),
                "limits.terminal_output_bytes=65536".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.limits().turn_quotas().terminals, 5);
        assert_eq!(s.limits().max_terminals, 3);
        assert_eq!(s.limits().terminal_output_bytes, 65536);
        // 0 terminals per turn is "unbounded" like the other quotas; a cap of 0 is a mistake.
        assert!(load(None, &["limits.terminals_per_turn=0".into()]).is_ok());
        for key in [
            "limits.max_terminals",
            "limits.terminal_output_bytes",
            "limits.agent_requests_bytes",
        ] {
            let e = load(None, &[format!("{key}=0")]).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn the_open_conversation_share_is_configured_or_three_quarters_of_what_is_held() {
        // Unset: 384 (whatever max_conversations, which bounds live agents only) ...
        let s = load(None, &[]).unwrap();
        assert_eq!(s.limits().max_open_conversations_per_principal, None);
        assert_eq!(s.max_open_conversations_per_principal(), 384);
        // ... or of the uid range when that is smaller (each open conversation holds a uid):
        // with 6 uids one principal holds 4 and another still opens 2.
        let s = load(None, &["sandbox.agent_uid_range=[200000, 200005]".into()]).unwrap();
        assert_eq!(s.max_open_conversations_per_principal(), 4);
        let s = load(None, &["sandbox.agent_uid_range=[200000, 200000]".into()]).unwrap();
        assert_eq!(s.max_open_conversations_per_principal(), 1);
        let s = load(
            None,
            &["limits.max_open_conversations_per_principal=3".into()],
        )
        .unwrap();
        assert_eq!(s.max_open_conversations_per_principal(), 3);
        // A share of nothing is a mistake, named.
        let e = load(
            None,
            &["limits.max_open_conversations_per_principal=0".into()],
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("limits.max_open_conversations_per_principal"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let e = load(None, &["limits.output_bytes=0".into()]).unwrap_err();
        assert!(e.to_string().contains("limits.output_bytes"), "{e}");
        let e = load(None, &["workspaces.w.path=rel".into()]).unwrap_err();
        assert!(e.to_string().contains("workspaces.w.path"), "{e}");
        let e = load(None, &["agents.default=ghost".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.default"), "{e}");
        let e = load(None, &["agents.x.command=\"\"".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.x.command"), "{e}");
        let e = load(None, &["agents.scripted.home=\"rel/home\"".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.scripted.home"), "{e}");
        let e = load(None, &["sandbox.agent_uid_ragne=[1, 2]".into()]).unwrap_err();
        assert!(e.to_string().contains("agent_uid_ragne"), "{e}");
        let s = load(None, &[]).unwrap();
        assert_eq!(s.file.sandbox.agent_nice, 10);
        let e = load(None, &["sandbox.agent_nice=-5".into()]).unwrap_err();
        assert!(e.to_string().contains("sandbox.agent_nice"), "{e}");
        let s = load(None, &["sandbox.agent_uid_range=[200000, 200009]".into()]).unwrap();
        assert_eq!(s.file.sandbox.agent_uid_range, vec![200_000, 200_009]);
        let e = load(None, &["agents.claude.egress_allow=[\"127.1:80\"]".into()]).unwrap_err();
        assert!(
            e.to_string().contains("agents.claude.egress_allow[0]"),
            "{e}"
        );
        let e = load(None, &["agents.claude.network=\"open\"".into()]).unwrap_err();
        assert!(e.to_string().contains("agents.claude"), "{e}");
        let e = load(None, &["limits.typo=1".into()]).unwrap_err();
        assert!(e.to_string().contains("typo"), "{e}");
    }

    #[test]
    fn a_cell_names_itself_its_address_and_its_store_and_needs_the_remote_listener() {
        let remote = [
            "listen_remote.tcp=\"10.0.0.2:7443\"",
            "listen_remote.tls.cert_file=\"s.pem\"",
            "listen_remote.tls.key_file=\"s.key\"",
            "listen_remote.tls.ca_file=\"ca.pem\"",
            "listen_remote.tls.admit=[\"spiffe://example.org/warden/gateway\"]",
        ];
        let cell = [
            "cell.id=\"cell-0\"",
            "cell.address=\"cell-0.cells:7443\"",
            "cell.store.url=\"host=/run/postgresql dbname=warden\"",
        ];
        let sets = |extra: &[&str], with_remote: bool| -> Vec<String> {
            let mut v: Vec<String> = cell.iter().map(|s| s.to_string()).collect();
            if with_remote {
                v.extend(remote.iter().map(|s| s.to_string()));
            }
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };
        let s = load(None, &sets(&[], true)).unwrap();
        let c = s.file.cell.unwrap();
        assert_eq!((c.id.as_str(), c.refresh_ms), ("cell-0", 2_000));
        assert_eq!(c.store().backend, warden_pgstate::Backend::Postgres);
        let e = load(None, &sets(&[], false)).unwrap_err();
        assert!(e.to_string().contains("listen_remote"), "{e}");
        for (extra, key) in [
            ("cell.id=\"Cell 0\"", "cell.id"),
            ("cell.address=\"nowhere\"", "cell.address"),
            ("cell.refresh_ms=10", "cell.refresh_ms"),
            ("cell.store.url=\"\"", "cell.store"),
        ] {
            let e = load(None, &sets(&[extra], true)).unwrap_err();
            assert!(e.to_string().contains(key), "{extra}: {e}");
        }
    }
}
