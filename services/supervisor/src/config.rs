//! The supervisor's configuration: the embedded default, the agent registry (with built-in
//! `scripted`, `claude` and `codex` entries that a file may override), operator workspaces by
//! name, the policy socket and every quota.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use warden_daemon::config::{ConfigError, Origin};
use warden_daemon::{DaemonSection, ListenerConfig};

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

/// Quotas (seed 004). Every bound is configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Task text over this many bytes is refused before anything starts.
    pub task_text_bytes: usize,
    /// Default turn timeout (the soft budget stated to the agent); hard cutoff at 1.2x.
    pub turn_timeout_secs: u64,
    /// Output retained per turn; beyond it the turn ends with fault `output-limit`.
    pub output_bytes: usize,
    /// Agent stderr kept in a ring of this many bytes.
    pub stderr_ring_bytes: usize,
    /// One transcript file is at most this big.
    pub transcript_bytes: usize,
    /// An idle conversation's agent is stopped after this long (0 = never).
    pub idle_timeout_secs: u64,
    /// An agent that does not answer `initialize` (and `session/new`) within this is killed.
    pub handshake_deadline_ms: u64,
    /// After `session/cancel`, how long the agent has to end the turn before it is killed.
    pub cancel_grace_ms: u64,
    /// SIGTERM → SIGKILL grace when a tree is killed.
    pub kill_grace_ms: u64,
    /// Conversations with a live agent at most (idle-stopped ones do not count): the upper
    /// bound of `max_live_agents`.
    pub max_conversations: usize,
    /// Agents alive at once; 0 = derived from the host's memory (see `live::default_cap`). At
    /// the limit the least recently used idle agent is stopped; with every one busy a start is
    /// refused (RESOURCE_EXHAUSTED / fault `capacity`).
    pub max_live_agents: usize,
    /// Turns running at once across all conversations; 0 = sixteen per core. More wait, in
    /// the fair order (round robin across principals).
    pub max_active_turns: usize,
    /// Turn slots one principal may hold; 0 = `admission::default_share`.
    pub max_active_turns_per_principal: usize,
    /// Open conversations one principal may hold at once (each holds its root's fd and, with
    /// `sandbox.agent_uid_range`, a uid until it is closed); unset = 384, or three quarters of
    /// the uid range when smaller, at least 1; 0 is refused. One more open is refused (RESOURCE_EXHAUSTED, fault `capacity`).
    pub max_open_conversations_per_principal: Option<usize>,
    /// How long a turn waits for a live agent when every one is busy (then fault `capacity`).
    pub capacity_wait_ms: u64,
    /// Turn starts waiting for a live agent at most; one more is refused (fault `capacity`).
    pub max_agent_waiters: usize,
    /// Turns waiting in one conversation's queue at most; more are refused.
    pub max_queued_turns: usize,
    /// Agents starting at once (spawn to `session/new`); 0 = two per core. More wait their turn
    /// before they spawn, so the handshake deadline measures the agent, not a crowd of starts.
    pub max_starting_agents: usize,
    /// Start slots one principal may hold at once; 0 = three quarters of
    /// `max_starting_agents`, at least 1 (`admission::default_share` of it). Waiting starts are
    /// served round robin across principals, so one caller's burst of new contexts cannot
    /// queue another's start behind it (issue 36).
    pub max_starting_agents_per_principal: usize,
    /// One `fs/read_text_file` answer is at most this many bytes (the file, or the selected
    /// lines); a larger one is refused with an error naming this key.
    pub fs_read_bytes: u64,
    /// One agent's requests handled at once (`warden_acp::ClientConfig::max_incoming_requests`);
    /// one more is answered with an error at once, unhandled.
    pub agent_requests_in_flight: usize,
    /// Bytes of the lines of one agent's requests handled at once
    /// (`warden_acp::ClientConfig::max_incoming_bytes`); one more that would pass it is
    /// answered with an error at once, unhandled.
    pub agent_requests_bytes: usize,
    /// Bytes queued for one agent's stdin and not read by it
    /// (`warden_acp::ClientConfig::max_queued_bytes`); past it the agent is stopped with fault
    /// `request-limit`.
    pub agent_queue_bytes: usize,
    /// `fs/read_text_file` and `fs/write_text_file` requests of one turn (0 = unbounded).
    pub fs_requests_per_turn: u32,
    /// Permission requests of one turn (0 = unbounded). A client write no ALLOW covers is
    /// decided too; it counts among `fs_requests_per_turn`.
    pub permissions_per_turn: u32,
    /// `elicitation/create` requests of one turn (0 = unbounded).
    pub questions_per_turn: u32,
    /// `terminal/create` requests of one turn (0 = unbounded); the next is refused and ends the
    /// turn with fault `request-limit`. A terminal no ALLOW of the turn judged is decided on its
    /// own: it counts here, not among `permissions_per_turn`.
    pub terminals_per_turn: u32,
    /// Terminals one conversation holds at once (created, not released yet: running or exited
    /// with their output kept). One more `terminal/create` is refused, before any decision.
    pub max_terminals: usize,
    /// Output one conversation's terminals hold together: each terminal reserves its tail bound
    /// (its `outputByteLimit`, at most `output_bytes`) at creation, and gives it back when
    /// released; a `terminal/create` whose bound does not fit what is left is refused.
    pub terminal_output_bytes: usize,
    /// Connections one agent's egress proxy holds open at once; more are answered 503.
    pub egress_connections: usize,
    /// Refusals of one destination within a turn that end the turn (fault `egress-refused`);
    /// 0 = never.
    pub egress_refusals_end_turn: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            task_text_bytes: 16 * 1024,
            turn_timeout_secs: 600,
            output_bytes: 256 * 1024,
            stderr_ring_bytes: 64 * 1024,
            transcript_bytes: 256 * 1024,
            idle_timeout_secs: 120,
            handshake_deadline_ms: 10_000,
            cancel_grace_ms: 2000,
            kill_grace_ms: 2000,
            max_conversations: 512,
            max_live_agents: 0,
            max_active_turns: 0,
            max_active_turns_per_principal: 0,
            max_open_conversations_per_principal: None,
            capacity_wait_ms: 60_000,
            max_agent_waiters: 1024,
            max_queued_turns: 64,
            max_starting_agents: 0,
            max_starting_agents_per_principal: 0,
            fs_read_bytes: 2 * 1024 * 1024,
            agent_requests_in_flight: warden_acp::DEFAULT_MAX_INCOMING_REQUESTS,
            agent_requests_bytes: warden_acp::DEFAULT_MAX_INCOMING_BYTES,
            agent_queue_bytes: warden_acp::DEFAULT_MAX_QUEUED_BYTES,
            fs_requests_per_turn: 2048,
            permissions_per_turn: 1024,
            questions_per_turn: 16,
            terminals_per_turn: 64,
            max_terminals: 16,
            terminal_output_bytes: 4 * 1024 * 1024,
            egress_connections: 64,
            egress_refusals_end_turn: 3,
        }
    }
}

impl Limits {
    /// The per-turn request bounds.
    pub fn turn_quotas(&self) -> crate::turn::Quotas {
        crate::turn::Quotas {
            fs_requests: self.fs_requests_per_turn,
            permissions: self.permissions_per_turn,
            questions: self.questions_per_turn,
            terminals: self.terminals_per_turn,
        }
    }
    pub fn handshake(&self) -> Duration {
        Duration::from_millis(self.handshake_deadline_ms)
    }
    pub fn cancel_grace(&self) -> Duration {
        Duration::from_millis(self.cancel_grace_ms)
    }
    pub fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms)
    }
    pub fn capacity_wait(&self) -> Duration {
        Duration::from_millis(self.capacity_wait_ms)
    }
    pub fn idle(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }
}

// No deny_unknown_fields here: serde does not support it together with `flatten`; every other
// key is an agent entry, itself strict.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentsSection {
    /// The agent used when a request names none.
    #[serde(default = "default_agent")]
    pub default: String,
    /// Entries by name. An entry named like a built-in overrides it key by key (setting
    /// `agents.scripted.terminal = true` keeps the rest of the built-in `scripted`).
    #[serde(flatten)]
    pub entries: BTreeMap<String, toml::Table>,
}

impl Default for AgentsSection {
    fn default() -> Self {
        AgentsSection {
            default: default_agent(),
            entries: BTreeMap::new(),
        }
    }
}

fn default_agent() -> String {
    "scripted".into()
}

/// Network access of an agent's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    None,
    Host,
    /// Own network namespace; the only way out is the supervisor's egress proxy, to the
    /// destinations `egress_allow` (and the agent's `*_BASE_URL` variables) name.
    Proxy,
}

impl Network {
    /// The sandbox's spelling.
    pub fn sandbox(self) -> warden_sandbox::Network {
        match self {
            Network::None => warden_sandbox::Network::None,
            Network::Host => warden_sandbox::Network::Host,
            Network::Proxy => warden_sandbox::Network::Proxy,
        }
    }
}

/// One registry entry.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// For people: the agent card's skill description at the gateway ("" = a generic one).
    #[serde(default)]
    pub description: String,
    /// The program. Empty for `scripted` = `warden-scripted-agent` next to this executable,
    /// and for an `adapter` entry.
    #[serde(default)]
    pub command: String,
    /// An installed npm adapter, `"<package>@<version>"`, run with Node.js from under
    /// `[adapters] dir` when `command` is empty (its `node_modules` bound read-only). Never
    /// fetched at spawn.
    #[serde(default)]
    pub adapter: String,
    /// Codex's managed configuration (TOML, `/etc/codex/managed_config.toml` in the sandbox;
    /// it outranks the agent's own `~/.codex/config.toml`). "" = none written. With
    /// `OPENAI_BASE_URL` in the agent's environment a model provider for it is added.
    #[serde(default)]
    pub codex_config: String,
    /// Codex's requirements (TOML, `/etc/codex/requirements.toml`); "" = warden's default.
    #[serde(default)]
    pub codex_requirements: String,
    /// OpenCode's managed configuration (JSON, `/etc/opencode/opencode.json` in the sandbox,
    /// merged after the global and project configuration). "" = none written. With
    /// `OPENAI_BASE_URL` (and `OPENAI_MODEL`) in the agent's environment an OpenAI-compatible
    /// provider for it is added and chosen.
    #[serde(default)]
    pub opencode_config: String,
    /// `"<config id>=<value>"` set after `session/new` when the conversation's verb asks for
    /// planning (`advise`, `review`), e.g. Codex 2.6's `collaboration_mode=plan`; "" = none.
    /// It changes how the agent works, never what it may do without asking.
    #[serde(default)]
    pub plan_config_option: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variable names added to the allowlist for this agent (operator-only).
    #[serde(default)]
    pub env: Vec<String>,
    /// Fixed environment values set for this agent (operator-only; e.g. IS_SANDBOX=1).
    #[serde(default)]
    pub set_env: BTreeMap<String, String>,
    #[serde(default)]
    pub network: Network,
    /// With `network = "proxy"`: the `host:port` destinations the agent may reach
    /// (`*.domain:port` = its subdomains, public addresses only). The value of every
    /// `*_BASE_URL` variable in the agent's environment is allowed too. Loopback and private
    /// addresses only when named exactly here (or by a base URL).
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// The mode forced after `session/new` ("" = the agent has no modes; nothing is forced).
    #[serde(default)]
    pub supervised_mode: String,
    /// Further mode ids that still ask for every call (e.g. Claude `plan`). Every other mode
    /// the agent reports is elevated.
    #[serde(default)]
    pub supervised_modes: Vec<String>,
    /// Advertise ACP terminals to this agent: commands then run contained like the agent,
    /// each only after an ALLOW of an execute tool call.
    #[serde(default)]
    pub terminal: bool,
    /// Advertise `fs/read_text_file` and `fs/write_text_file` (the default): the agent's reads
    /// and writes in its root then go through warden, each decided. `false` for an adapter that
    /// cannot use them: it then reads and writes itself, inside its sandbox, after the
    /// permission request of each edit (as Codex does). Gemini CLI 0.61 cannot create a file
    /// through them (it takes the "not found" of its read-before-write for a failure).
    #[serde(default = "yes")]
    pub fs: bool,
    /// Decide deadline override for this agent (e.g. long when an approver decides).
    #[serde(default)]
    pub decide_deadline_ms: Option<u64>,
    /// Process limits of the agent's tree.
    #[serde(default)]
    pub max_processes: Option<u64>,
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
    /// State the turn's soft time budget as a second text block of the prompt (for model-driven
    /// agents). It is always in the prompt's `_meta.warden.budgetSeconds`.
    #[serde(default = "yes")]
    pub budget_in_prompt: bool,
    /// Operators opt an agent in; the built-in real adapters are listed but not started unless
    /// a request names them.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The template of the agent's home (operator-only). Each conversation gets a fresh copy
    /// under `<state>/homes/` (owned by the agent, removed with the conversation), bound
    /// read-write under bubblewrap and set as `HOME`; the template itself is never bound, so
    /// nothing one conversation writes there reaches another. Unset: an empty fresh home.
    #[serde(default)]
    pub home: Option<PathBuf>,
    /// Further host paths the agent may read under bubblewrap (operator-only), e.g. a Node.js
    /// installation outside /usr or a scenario file. Never writable.
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Warm agents kept ready for new conversations (`pool.rs`): spawned contained, initialized
    /// and given their session in a fresh owned root ahead of time, so that opening a
    /// conversation in a fresh owned sandbox with the `workspace-write` profile takes one
    /// instead of starting an agent. They are live agents (`limits.max_live_agents`) and the
    /// first stopped when a conversation needs room. 0 (the default; the built-in `scripted`: 1)
    /// = none.
    #[serde(default)]
    pub pool_size: usize,
}

fn yes() -> bool {
    true
}

impl AgentConfig {
    fn builtin(command: &str, args: &[&str], mode: &str, modes: &[&str], env: &[&str]) -> Self {
        AgentConfig {
            description: String::new(),
            command: command.into(),
            adapter: String::new(),
            codex_config: String::new(),
            codex_requirements: String::new(),
            opencode_config: String::new(),
            plan_config_option: String::new(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
            set_env: BTreeMap::new(),
            network: Network::None,
            egress_allow: Vec::new(),
            supervised_mode: mode.into(),
            supervised_modes: modes.iter().map(|s| s.to_string()).collect(),
            terminal: false,
            fs: true,
            decide_deadline_ms: None,
            max_processes: None,
            memory_max_bytes: None,
            budget_in_prompt: true,
            enabled: true,
            home: None,
            read_only_paths: Vec::new(),
            pool_size: 0,
        }
    }

    /// Whether `mode` keeps supervision for this agent.
    pub fn is_supervised_mode(&self, mode: &str) -> bool {
        mode.is_empty()
            || mode == self.supervised_mode
            || self.supervised_modes.iter().any(|m| m == mode)
    }
}

/// The adapter the built-in `claude` runs (installed under `[adapters] dir`).
pub const CLAUDE_ADAPTER: &str = "@agentclientprotocol/claude-agent-acp@0.101.0";
/// The adapter the built-in `codex` runs (installed under `[adapters] dir`).
pub const CODEX_ADAPTER: &str = "@agentclientprotocol/codex-acp@2.6.0";
/// The agent the built-in `gemini` runs (Gemini CLI, itself the ACP agent with
/// `--experimental-acp`; installed under `[adapters] dir`).
pub const GEMINI_ADAPTER: &str = "@google/gemini-cli@0.61.0";
/// The agent the built-in `qwen` runs (Qwen Code, itself the ACP agent with `--acp`).
pub const QWEN_ADAPTER: &str = "@qwen-code/qwen-code@0.24.4";
/// The agent the built-in `opencode` runs (OpenCode, a native executable, itself the ACP agent
/// with `acp`).
pub const OPENCODE_ADAPTER: &str = "opencode-ai@1.18.33";

/// The built-in registry: `scripted` (default, no network), `claude` and `codex` (installed
/// adapters; they reach their model API through the egress proxy, `network = "proxy"`, and
/// nothing else unless the operator adds it).
pub fn builtin_agents() -> BTreeMap<String, AgentConfig> {
    let mut m = BTreeMap::new();
    // The scripted agent reads its budget from `_meta` (its prompt text may be a scenario).
    let mut scripted = AgentConfig::builtin(
        "",
        &[],
        "default",
        &["plan"],
        &[
            "WARDEN_SCENARIO",
            "WARDEN_SCRIPTED_VOCABULARY",
            "WARDEN_SCRIPTED_REPORT",
        ],
    );
    scripted.budget_in_prompt = false;
    // One warm scripted agent: the demo and the tests answer at once.
    scripted.pool_size = 1;
    scripted.description = "warden's scripted demo agent".into();
    m.insert("scripted".into(), scripted);
    let mut claude = AgentConfig::builtin(
        "",
        &[],
        "default",
        &["plan"],
        &[
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "CLAUDE_CONFIG_DIR",
        ],
    );
    claude.adapter = CLAUDE_ADAPTER.into();
    claude.network = Network::Proxy;
    claude.egress_allow = vec!["api.anthropic.com:443".into()];
    // Claude Code's own switch for everything it sends besides the model's requests (telemetry,
    // error reports, update checks): under the egress proxy each would be a refusal shown to the
    // caller, and repeated ones end the turn (limits.egress_refusals_end_turn).
    claude.set_env.insert(
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
        "1".into(),
    );
    claude.description = "Claude Code through its ACP adapter, supervised by warden".into();
    m.insert("claude".into(), claude);
    let mut codex = AgentConfig::builtin(
        "",
        &[],
        "read-only",
        &[],
        &["OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_HOME"],
    );
    codex.adapter = CODEX_ADAPTER.into();
    codex.codex_config = warden_sandbox::CODEX_CONFIG_ON_REQUEST.into();
    codex.plan_config_option = "collaboration_mode=plan".into();
    codex.network = Network::Proxy;
    codex.egress_allow = vec!["api.openai.com:443".into()];
    codex.description = "Codex through its ACP adapter, supervised by warden".into();
    m.insert("codex".into(), codex);
    // Gemini CLI: `default` asks for every edit and command; `plan` is read-only. `autoEdit`
    // and `yolo` are elevated. Its user settings are warden's (`warden_sandbox::
    // GEMINI_SETTINGS_JSON`, read-only in the home).
    let mut gemini = AgentConfig::builtin(
        "",
        &["--experimental-acp"],
        "default",
        &["plan"],
        &["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL"],
    );
    gemini.adapter = GEMINI_ADAPTER.into();
    gemini.plan_config_option = "mode=plan".into();
    gemini.fs = false;
    gemini.network = Network::Proxy;
    gemini.egress_allow = vec!["generativelanguage.googleapis.com:443".into()];
    // Its launcher otherwise starts Gemini CLI a second time as its child (to raise Node's
    // heap limit) and ignores SIGTERM itself.
    gemini
        .set_env
        .insert("GEMINI_CLI_NO_RELAUNCH".into(), "1".into());
    gemini.description = "Gemini CLI over ACP, supervised by warden".into();
    m.insert("gemini".into(), gemini);
    // Qwen Code: `default` asks for every edit and command; `plan` is read-only. Its own
    // default, `auto` (a model classifier approves), and `auto-edit`, `yolo` are elevated. Its
    // model is any OpenAI-compatible endpoint: `OPENAI_BASE_URL` names it, and the egress proxy
    // allows that and nothing else.
    let mut qwen = AgentConfig::builtin(
        "",
        &["--acp"],
        "default",
        &["plan"],
        &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"],
    );
    qwen.adapter = QWEN_ADAPTER.into();
    qwen.plan_config_option = "mode=plan".into();
    qwen.network = Network::Proxy;
    // Its launcher otherwise starts Qwen Code again as its child (with --expose-gc). Where its
    // settings live (`QWEN_HOME`, its system settings, trusted folders, ...) is set by the
    // supervisor over `set_env` (`adapters::config_env`): Qwen Code takes each from a `.env` in
    // the home unless it is set.
    qwen.set_env
        .insert("QWEN_CODE_NO_RELAUNCH".into(), "1".into());
    qwen.description = "Qwen Code over ACP, supervised by warden".into();
    m.insert("qwen".into(), qwen);
    // OpenCode: `build` asks for every edit, command, fetch and subagent under warden's managed
    // configuration (`warden_sandbox::OPENCODE_CONFIG_JSON`), `plan` too (it denies edits
    // itself); its modes are its primary agents, published as the `mode` config option. Its
    // model is any OpenAI-compatible endpoint (`OPENAI_BASE_URL`, `OPENAI_MODEL`): warden adds
    // it as the only provider, and the egress proxy allows it and nothing else. Its fixed
    // environment is `adapters::OPENCODE_ENV`, set over `set_env`.
    let mut opencode = AgentConfig::builtin(
        "",
        &["acp", "--port", "4096"],
        "build",
        &["plan"],
        &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"],
    );
    opencode.adapter = OPENCODE_ADAPTER.into();
    opencode.opencode_config = warden_sandbox::OPENCODE_CONFIG_JSON.into();
    opencode.plan_config_option = "mode=plan".into();
    opencode.network = Network::Proxy;
    opencode.description = "OpenCode over ACP, supervised by warden".into();
    m.insert("opencode".into(), opencode);
    m
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

/// Loads and validates.
/// What a reload (SIGHUP, `warden reload`) puts in force, out of `next` (a configuration
/// that loaded and validated whole): the agents (their programs, models, environment, pool
/// sizes; a new conversation or agent start gets them, a running one keeps what it started
/// with, and a warm agent of an agent's old settings is discarded at its take), the operator
/// workspaces, the adapters, the egress rules of agents started from now on, and the limits
/// read as they are used (timeouts, graces, per-turn quotas, sizes). Kept from `running`,
/// because the daemon built its structures from them at start: `[daemon]`, the listeners,
/// `[policy]`, `[sandbox]`, `[runtime]`, `[cell]`, and the capacity limits (`max_live_agents`,
/// `max_active_turns`, `max_active_turns_per_principal`, `max_agent_waiters`,
/// `max_starting_agents`, `max_starting_agents_per_principal`, `max_conversations`,
/// `transcript_bytes`). Returns the settings to
/// put in force and the names of the kept ones whose value `next` changed (they need a
/// restart).
pub fn reloadable(running: &Settings, next: Settings) -> (Settings, Vec<&'static str>) {
    let mut out = next;
    let mut kept = Vec::new();
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    macro_rules! keep {
        ($($field:ident).+, $name:expr) => {
            if differs(&running.$($field).+, &out.$($field).+) {
                kept.push($name);
            }
            out.$($field).+ = running.$($field).+.clone();
        };
    }
    keep!(file.daemon, "daemon");
    keep!(file.listen, "listen");
    keep!(file.listen_remote, "listen_remote");
    keep!(file.policy, "policy");
    keep!(file.sandbox, "sandbox");
    keep!(file.runtime, "runtime");
    keep!(file.cell, "cell");
    keep!(file.limits.max_live_agents, "limits.max_live_agents");
    keep!(file.limits.max_active_turns, "limits.max_active_turns");
    keep!(
        file.limits.max_active_turns_per_principal,
        "limits.max_active_turns_per_principal"
    );
    keep!(file.limits.max_agent_waiters, "limits.max_agent_waiters");
    keep!(
        file.limits.max_starting_agents,
        "limits.max_starting_agents"
    );
    keep!(
        file.limits.max_starting_agents_per_principal,
        "limits.max_starting_agents_per_principal"
    );
    keep!(file.limits.max_conversations, "limits.max_conversations");
    keep!(file.limits.transcript_bytes, "limits.transcript_bytes");
    (out, kept)
}

pub fn load(file: Option<&Path>, sets: &[String]) -> Result<Settings, ConfigError> {
    let loaded = warden_daemon::config::load::<SupervisorConfig>(
        file,
        EMBEDDED_DEFAULT,
        "WARDEN_SUPERVISOR",
        sets,
    )?;
    let origin = loaded.origin;
    let cfg = loaded.value;
    cfg.daemon.validate(&origin)?;
    cfg.listen.validate(&origin, "listen")?;
    if let Some(remote) = &cfg.listen_remote {
        if remote.tcp.is_none() || remote.tls.is_none() {
            return Err(ConfigError::invalid(
                &origin,
                "listen_remote",
                "the remote listener is `tcp` with `tls` (mutual TLS); same-host callers use `listen`",
            ));
        }
        remote.validate(&origin, "listen_remote")?;
    }
    if let Some(cell) = &cfg.cell {
        cell.validate(&origin, cfg.listen_remote.is_some())?;
    }
    if cfg.policy.socket.as_os_str().is_empty() {
        return Err(ConfigError::invalid(
            &origin,
            "policy.socket",
            "must not be empty",
        ));
    }
    for (i, p) in cfg.policy.failover_sockets.iter().enumerate() {
        if p.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                &origin,
                &format!("policy.failover_sockets[{i}]"),
                "must not be empty",
            ));
        }
    }
    if cfg.policy.failover_sockets.len() > 16 {
        return Err(ConfigError::invalid(
            &origin,
            "policy.failover_sockets",
            "at most 16 replicas",
        ));
    }
    if cfg.policy.decide_deadline_ms == 0 {
        return Err(ConfigError::invalid(
            &origin,
            "policy.decide_deadline_ms",
            "must be > 0",
        ));
    }
    if !(0..=19).contains(&cfg.sandbox.agent_nice) {
        return Err(ConfigError::invalid(
            &origin,
            "sandbox.agent_nice",
            "must be 0..=19 (an agent may be given less CPU than the daemons, never more)",
        ));
    }
    let l = &cfg.limits;
    for (key, v) in [
        ("limits.task_text_bytes", l.task_text_bytes as u64),
        ("limits.turn_timeout_secs", l.turn_timeout_secs),
        ("limits.output_bytes", l.output_bytes as u64),
        ("limits.transcript_bytes", l.transcript_bytes as u64),
        ("limits.handshake_deadline_ms", l.handshake_deadline_ms),
        ("limits.egress_connections", l.egress_connections as u64),
        (
            "limits.agent_requests_in_flight",
            l.agent_requests_in_flight as u64,
        ),
        ("limits.agent_queue_bytes", l.agent_queue_bytes as u64),
        ("limits.agent_requests_bytes", l.agent_requests_bytes as u64),
        ("limits.max_terminals", l.max_terminals as u64),
        (
            "limits.max_open_conversations_per_principal",
            l.max_open_conversations_per_principal.unwrap_or(1) as u64,
        ),
        (
            "limits.terminal_output_bytes",
            l.terminal_output_bytes as u64,
        ),
    ] {
        if v == 0 {
            return Err(ConfigError::invalid(&origin, key, "must be > 0"));
        }
    }
    for l in &cfg.egress.warden_listeners {
        if l.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                &origin,
                "egress.warden_listeners",
                format!("{l:?} is not an address like 127.0.0.1:8080"),
            ));
        }
    }
    let mut agents = builtin_agents();
    for (name, table) in &cfg.agents.entries {
        let key = format!("agents.{name}");
        let mut merged = match agents.get(name) {
            Some(builtin) => match toml::Value::try_from(builtin) {
                Ok(toml::Value::Table(t)) => t,
                _ => toml::Table::new(),
            },
            None => toml::Table::new(),
        };
        for (k, v) in table {
            merged.insert(k.clone(), v.clone());
        }
        let a: AgentConfig =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    ConfigError::invalid(&origin, &key, e.to_string().trim().replace('\n', " "))
                })?;
        let a = &a;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}"),
                "agent names are letters, digits, '-' and '_'",
            ));
        }
        if a.command.is_empty() && a.adapter.is_empty() && name != "scripted" {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.command"),
                "must name the program to run",
            ));
        }
        agents.insert(name.clone(), a.clone());
    }
    if !agents.contains_key(&cfg.agents.default) {
        return Err(ConfigError::invalid(
            &origin,
            "agents.default",
            format!("no agent named {:?}", cfg.agents.default),
        ));
    }
    for (name, a) in &agents {
        for (i, e) in a.egress_allow.iter().enumerate() {
            if let Err(err) = warden_egress::AllowEntry::parse(e) {
                return Err(ConfigError::invalid(
                    &origin,
                    &format!("agents.{name}.egress_allow[{i}]"),
                    err.to_string(),
                ));
            }
        }
        if a.home.as_ref().is_some_and(|h| !h.is_absolute()) {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.home"),
                "must be an absolute path (the template of the agent's home)",
            ));
        }
    }
    for (name, a) in &agents {
        if a.pool_size > MAX_POOL_SIZE {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.pool_size"),
                format!("must be at most {MAX_POOL_SIZE}"),
            ));
        }
    }
    let pooled: usize = agents
        .values()
        .filter(|a| a.enabled)
        .map(|a| a.pool_size)
        .sum();
    if cfg.limits.max_live_agents > 0 && pooled > cfg.limits.max_live_agents {
        return Err(ConfigError::invalid(
            &origin,
            "limits.max_live_agents",
            format!(
                "is {} but the agents' pool_size add up to {pooled}: warm agents are live agents",
                cfg.limits.max_live_agents
            ),
        ));
    }
    for (name, w) in &cfg.workspaces {
        if !w.path.is_absolute() {
            return Err(ConfigError::invalid(
                &origin,
                &format!("workspaces.{name}.path"),
                "must be an absolute path",
            ));
        }
    }
    Ok(Settings {
        file: cfg,
        agents,
        origin,
    })
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
