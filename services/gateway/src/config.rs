//! The gateway's configuration (TOML, loaded by `warden-daemon`: file → `WARDEN_GATEWAY__…`
//! environment → `--set`), validated with errors that name the key and the file.
//!
//! Owns every section's type, the `[push]` and `[mcp]` ones included: the gateway's floors
//! (ARCHITECTURE.md) put configuration at the bottom, so this file imports nothing of the
//! gateway and every other file may import it. `[auth]` is [`auth`]'s, `[push]` [`push`]'s,
//! `[mcp]` [`mcp`]'s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use warden_daemon::config::{ConfigError, DaemonSection, ListenerConfig, Origin};

mod auth;
mod mcp;
mod push;

use auth::check_groups;
pub use auth::{
    AuthSection, CertEntry, OidcIssuerConfig, TokenEntry, check_fetch_url, parse_algorithm,
};
pub use mcp::McpSection;
pub use push::{PushSection, parse_nameserver};
use warden_egress::Cidr;

/// The embedded default: loopback HTTP, a token file in the state directory, the scripted agent.
pub const EMBEDDED: &str = r#"
[daemon]
state_dir = "/var/lib/warden/gateway"

[listen]
socket = "gateway.sock"

[supervisor]
socket = "/run/warden/supervisor.sock"

[http]
bind = "127.0.0.1:8080"
public_url = "http://127.0.0.1:8080"

[auth]
token_file = "gateway.token"
"#;

/// `[http]`: the caller-facing A2A listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// The address to bind. Loopback by default; anything wider turns the Host allowlist on.
    #[serde(default = "default_bind")]
    pub bind: String,
    /// The URL callers use to reach the gateway (the agent card's interface URLs are built from
    /// it, never from the bind address).
    pub public_url: String,
    /// Host header values accepted when bound to a non-loopback address, as `host` or
    /// `host:port`. The public URL's host is always accepted.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// `Cache-Control: max-age` of the agent card.
    #[serde(default = "default_card_max_age")]
    pub card_max_age_seconds: u64,
    /// How long a client has, from connecting or from the first byte of a later request on a
    /// kept-alive connection, to send the whole request head. A connection that has not is
    /// closed: a slow or stalled header never holds a connection slot longer than this.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout_ms: u64,
    /// How long a handler waits for the whole request body before answering 408.
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout_ms: u64,
    /// A kept-alive connection with no request in flight is closed after this long. A
    /// connection carrying an SSE stream has a request in flight and is never idle.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// Connections served at once. Beyond it a new connection is answered 503 at once and
    /// closed; the connections already served (and their SSE streams) are not affected. Keep it
    /// well below the process's file limit (`LimitNOFILE=` in the unit).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections that have not yet presented an authenticated request (a client connecting,
    /// sending its first head, or only fetching the agent card) get this share of
    /// `max_connections` of their own. When it is full, a new connection closes the oldest
    /// unauthenticated one: half-sent headers can never fill the gateway, and a caller's fresh
    /// connection, which presents its token at once, is served. Default: `max_connections` / 16
    /// (256 of 4096).
    #[serde(default)]
    pub max_unauthenticated_connections: Option<usize>,
    /// Connections attributed to one principal (from its first authenticated request on) at
    /// once. A request that would take a principal past it is answered 429 and its connection
    /// closed; only that principal is slowed. Default: `max_connections` / 4 (1024 of 4096).
    #[serde(default)]
    pub max_connections_per_principal: Option<usize>,
    /// Streams one principal holds open at once, over every front: A2A SSE
    /// (`SendStreamingMessage`, `SubscribeToTask`, their 0.3 forms and REST routes), the A2A
    /// gRPC streaming calls, and `/mcp` GETs and requests in flight (each may be an SSE stream;
    /// a POST of only notifications or responses takes none). One
    /// more is refused in the protocol's shape (HTTP 429, a JSON-RPC error, gRPC
    /// RESOURCE_EXHAUSTED) before anything is stored.
    #[serde(default = "default_max_streams_per_principal")]
    pub max_streams_per_principal: usize,
    /// Requests one principal has in flight at once on the A2A gRPC listener on TCP, over all
    /// its connections (HTTP/2 multiplexes many on one connection, where HTTP/1.1 has one). One
    /// more is answered RESOURCE_EXHAUSTED by the edge. Default: the connection share
    /// (`max_connections_per_principal`), what that principal may have in flight over HTTP/1.1.
    #[serde(default)]
    pub max_grpc_requests_per_principal: Option<usize>,
    /// Requests (HTTP/2 streams) open at once on one connection to the A2A gRPC listener on TCP;
    /// the client waits for one to end before it opens another.
    #[serde(default = "default_grpc_max_concurrent_streams")]
    pub grpc_max_concurrent_streams: u32,
    /// A stream with nothing to say (a queued or silent task) gets an SSE comment (A2A, MCP) or
    /// its current status again (A2A gRPC) at least this often, so a caller can tell waiting
    /// from dead.
    #[serde(default = "default_stream_keepalive")]
    pub stream_keepalive_ms: u64,
    /// TLS on the callers' listeners (this one and the A2A gRPC one on `grpc.tcp`), and whether
    /// callers may (`request`) or must (`require`) present a client certificate, which
    /// `[[auth.certs]]` maps to a principal (docs/identity.md). Left out: plain TCP.
    #[serde(default)]
    pub tls: Option<warden_daemon::tls::CallerTlsConfig>,
}

fn default_bind() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body() -> usize {
    1024 * 1024
}
fn default_card_max_age() -> u64 {
    300
}
fn default_header_read_timeout() -> u64 {
    10_000
}
fn default_body_read_timeout() -> u64 {
    30_000
}
fn default_idle_timeout() -> u64 {
    60_000
}
fn default_max_connections() -> usize {
    4096
}
fn default_max_streams_per_principal() -> usize {
    1024
}
fn default_grpc_max_concurrent_streams() -> u32 {
    128
}
fn default_stream_keepalive() -> u64 {
    15_000
}

impl HttpSection {
    /// `max_unauthenticated_connections`, or its default.
    pub fn unauthenticated_share(&self) -> usize {
        self.max_unauthenticated_connections
            .unwrap_or(self.max_connections / 16)
            .max(1)
    }

    /// `max_connections_per_principal`, or its default.
    pub fn principal_connection_share(&self) -> usize {
        self.max_connections_per_principal
            .unwrap_or(self.max_connections / 4)
            .max(1)
    }

    /// `max_grpc_requests_per_principal`, or its default.
    pub fn principal_grpc_request_share(&self) -> usize {
        self.max_grpc_requests_per_principal
            .unwrap_or_else(|| self.principal_connection_share())
            .max(1)
    }
}

/// `[store]`: the task store and what it keeps.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// sled's page cache. sled's own default is 1 GiB, which a long-running gateway fills with
    /// pages of old tasks; the store is read mostly for recent tasks.
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity_bytes: u64,
    /// A task that reached a terminal state is deleted this long after its last status change.
    #[serde(default = "default_task_retention")]
    pub task_retention_seconds: u64,
    /// At most this many stored tasks per principal; beyond it the oldest terminal tasks are
    /// deleted first (a task that is still running is never deleted).
    #[serde(default = "default_max_tasks")]
    pub max_tasks: usize,
    /// A context whose last task is terminal and that has been idle this long is closed at the
    /// supervisor (its agent stops and its slot is freed); a later task in it starts a new
    /// conversation. 0 = never close.
    #[serde(default = "default_conversation_ttl")]
    pub conversation_ttl_seconds: u64,
    /// How often the background sweep (task pruning, conversation TTL) runs.
    #[serde(default = "default_sweep_interval")]
    pub sweep_interval_ms: u64,
    /// `sled` (default: the gateway's own store under its state directory) or `postgres`
    /// (replicas sharing one database; `url`, `pool_size`, `tls`, `tls_ca_file`,
    /// `connect_timeout_ms` as for the policy and the approver, see `warden-pgstate`).
    #[serde(default)]
    pub backend: warden_pgstate::Backend,
    #[serde(default)]
    pub url: String,
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    #[serde(default)]
    pub tls: bool,
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

fn default_pool_size() -> usize {
    warden_pgstate::StoreSection::default().pool_size
}
fn default_connect_timeout_ms() -> u64 {
    warden_pgstate::StoreSection::default().connect_timeout_ms
}

impl StoreSection {
    /// The database half of the section, as every daemon with durable state reads it.
    pub fn database(&self) -> warden_pgstate::StoreSection {
        warden_pgstate::StoreSection {
            backend: self.backend,
            url: self.url.clone(),
            pool_size: self.pool_size,
            tls: self.tls,
            tls_ca_file: self.tls_ca_file.clone(),
            connect_timeout_ms: self.connect_timeout_ms,
        }
    }
}

fn default_cache_capacity() -> u64 {
    64 * 1024 * 1024
}
fn default_task_retention() -> u64 {
    7 * 24 * 3600
}
fn default_max_tasks() -> usize {
    10_000
}
fn default_conversation_ttl() -> u64 {
    3600
}
fn default_sweep_interval() -> u64 {
    60_000
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            cache_capacity_bytes: default_cache_capacity(),
            task_retention_seconds: default_task_retention(),
            max_tasks: default_max_tasks(),
            conversation_ttl_seconds: default_conversation_ttl(),
            sweep_interval_ms: default_sweep_interval(),
            backend: warden_pgstate::Backend::Sled,
            url: String::new(),
            pool_size: default_pool_size(),
            tls: false,
            tls_ca_file: None,
            connect_timeout_ms: default_connect_timeout_ms(),
        }
    }
}

/// `[supervisor]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSection {
    /// The supervisor's Unix socket (on this host).
    pub socket: PathBuf,
    /// A supervisor on another host: its `listen_remote` address (`host:port`), reached over
    /// mutual TLS with `tls` (this gateway's certificate; `tls.admit` names the supervisor's
    /// SPIFFE ID). Set both or neither; when set, `socket` is not used.
    #[serde(default)]
    pub tcp: Option<String>,
    #[serde(default)]
    pub tls: Option<warden_daemon::tls::TlsConfig>,
    /// Turn timeout asked of the supervisor (0 = its configured default).
    #[serde(default)]
    pub turn_timeout_seconds: u32,
    /// How long a cancelled task waits for the supervisor's stop before it is ended CANCELED
    /// by the gateway itself.
    #[serde(default = "default_cancel_grace")]
    pub cancel_grace_ms: u64,
}

fn default_cancel_grace() -> u64 {
    10_000
}

/// One configured agent, shown as a skill on the card.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `[agents]`: optional. The agent names callers may use come from the supervisor
/// (`ListAgents`, fetched at start and whenever a request names an agent not yet known).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsSection {
    /// The agent used when a message names none ("" = the supervisor's default).
    #[serde(default)]
    pub default: String,
    /// How the card describes agents (description, tags), by name; also the names accepted
    /// while the supervisor has not answered yet.
    #[serde(default)]
    pub list: Vec<AgentEntry>,
    /// Which agents and operator workspaces a principal may use, on every front (A2A in each
    /// binding, gRPC, 0.3, MCP): a principal with an entry may use only the agents it names (as
    /// the agent of a new context, asked or by default) and, when the entry has `workspaces`,
    /// only those workspaces (MCP `bind_workspace`); one without an entry, or a list left out,
    /// may use every one. The extended agent card and MCP `status` show each caller its own.
    #[serde(default)]
    pub access: Vec<AgentAccessEntry>,
}

/// `[[agents.access]]`: the agents (and operator workspaces) one principal may use.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentAccessEntry {
    /// The principal this entry is for; or, with `group`, left out.
    #[serde(default)]
    pub principal: String,
    /// A group this entry is for (from `auth.tokens[].groups` or an issuer's `groups_claim`,
    /// with its prefix): used for a caller without an entry of its own; a member of several
    /// groups may use the agents of all of them.
    #[serde(default)]
    pub group: Option<String>,
    /// The agents it may use (left out: every agent).
    #[serde(default)]
    pub agents: Option<Vec<String>>,
    /// The operator workspaces (names of the supervisor's `[workspaces]`) it may bind (left
    /// out: every workspace).
    #[serde(default)]
    pub workspaces: Option<Vec<String>>,
}

/// `[card]`: how the agent card describes this gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CardSection {
    #[serde(default = "default_card_name")]
    pub name: String,
    #[serde(default = "default_card_description")]
    pub description: String,
    pub organization: Option<String>,
    pub organization_url: Option<String>,
    /// The gRPC interface's URL on the card (`host:port`, or `unix:/path` for a socket). Default:
    /// `grpc.tcp`, or `unix:` and the absolute `grpc.socket` path.
    #[serde(default)]
    pub grpc_url: Option<String>,
}

fn default_card_name() -> String {
    "warden".into()
}
fn default_card_description() -> String {
    "Coding agents whose every action is decided by an independent policy service".into()
}

impl Default for CardSection {
    fn default() -> Self {
        Self {
            name: default_card_name(),
            description: default_card_description(),
            organization: None,
            organization_url: None,
            grpc_url: None,
        }
    }
}

/// The whole gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    pub daemon: DaemonSection,
    /// The gateway's own gRPC listener: health and AdminService.Status only.
    pub listen: ListenerConfig,
    pub supervisor: SupervisorSection,
    pub http: HttpSection,
    pub auth: AuthSection,
    #[serde(default)]
    pub agents: AgentsSection,
    #[serde(default)]
    pub card: CardSection,
    #[serde(default)]
    pub store: StoreSection,
    /// The MCP front (`/mcp`); every key has a default.
    #[serde(default)]
    pub mcp: McpSection,
    /// The A2A gRPC binding (`lf.a2a.v1.A2AService`): off unless configured. A Unix `socket`
    /// (peer allowlist as on every warden listener) or `tcp` with `allow_any_peer = true`;
    /// callers authenticate with the same bearer tokens either way.
    #[serde(default)]
    pub grpc: Option<ListenerConfig>,
    /// Push notifications and the webhook allowlist (delivered by `src/push.rs`).
    #[serde(default)]
    pub push: PushSection,
    /// Many supervisor cells instead of the one `[supervisor]`: each new conversation is placed
    /// on a cell of the shared store's registry, and every turn of it goes there (`cells.rs`).
    /// Off by default; `[supervisor]` keeps its turn timeout and cancel grace either way.
    #[serde(default)]
    pub cells: Option<CellsSection>,
}

/// `[cells]`: the registry the cells report to, and how this gateway reaches and judges them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellsSection {
    /// The shared PostgreSQL store the cells register in (as their `[cell.store]`).
    pub store: warden_pgstate::StoreSection,
    /// This gateway's certificate towards the cells; `tls.admit` names the cells' SPIFFE ID.
    pub tls: warden_daemon::tls::TlsConfig,
    /// K in "the best of K random cells by free slots".
    #[serde(default = "default_choices")]
    pub choices: usize,
    /// A cell whose last report is older than this is lost: its running turns end FAILED
    /// `cell-lost`, and the next message to one of its contexts starts over on another cell.
    #[serde(default = "default_lost_after_ms")]
    pub lost_after_ms: u64,
    /// How often this gateway reads the registry.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
}

fn default_choices() -> usize {
    2
}

fn default_lost_after_ms() -> u64 {
    6_000
}

fn default_poll_ms() -> u64 {
    1_000
}

impl CellsSection {
    /// The store section as PostgreSQL (the registry is never on sled).
    pub fn store(&self) -> warden_pgstate::StoreSection {
        warden_pgstate::StoreSection {
            backend: warden_pgstate::Backend::Postgres,
            ..self.store.clone()
        }
    }

    fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        self.store()
            .validate(origin)
            .map_err(|e| ConfigError::invalid(origin, "cells.store", e.to_string()))?;
        if let Err((k, why)) = self.tls.check() {
            return Err(ConfigError::invalid(origin, &format!("cells.{k}"), why));
        }
        if !(1..=16).contains(&self.choices) {
            return Err(ConfigError::invalid(
                origin,
                "cells.choices",
                "must be between 1 and 16",
            ));
        }
        if !(100..=60_000).contains(&self.poll_ms) {
            return Err(ConfigError::invalid(
                origin,
                "cells.poll_ms",
                "must be between 100 and 60000",
            ));
        }
        if self.lost_after_ms < 2 * self.poll_ms || self.lost_after_ms > 600_000 {
            return Err(ConfigError::invalid(
                origin,
                "cells.lost_after_ms",
                "must be at least twice cells.poll_ms and at most 600000",
            ));
        }
        Ok(())
    }
}

impl GatewayConfig {
    /// Checks what serde cannot: addresses, URLs, digests, agent names.
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        self.daemon.validate(origin)?;
        self.listen.validate(origin, "listen")?;
        self.mcp.validate(origin)?;
        match (&self.supervisor.tcp, &self.supervisor.tls) {
            (Some(_), None) => {
                return Err(ConfigError::invalid(
                    origin,
                    "supervisor.tls",
                    "a supervisor on `tcp` is reached over mutual TLS only: set supervisor.tls",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::invalid(
                    origin,
                    "supervisor.tcp",
                    "supervisor.tls is for a supervisor on another host: set its address in supervisor.tcp",
                ));
            }
            (Some(_), Some(tls)) => {
                if let Err((k, why)) = tls.check() {
                    return Err(ConfigError::invalid(
                        origin,
                        &format!("supervisor.{k}"),
                        why,
                    ));
                }
            }
            (None, None) => {}
        }
        if let Some(cells) = &self.cells {
            cells.validate(origin)?;
        }
        if let Some(g) = &self.grpc {
            g.validate(origin, "grpc")?;
        }
        if let Err((key, why)) = self.push.validate() {
            return Err(ConfigError::invalid(origin, &key, why));
        }
        if self.http.bind.parse::<SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                origin,
                "http.bind",
                format!("{:?} is not an address like 127.0.0.1:8080", self.http.bind),
            ));
        }
        let url = self.http.public_url.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) || url_host(url).is_none() {
            return Err(ConfigError::invalid(
                origin,
                "http.public_url",
                format!("{:?} is not an http(s) URL", self.http.public_url),
            ));
        }
        if self.http.max_body_bytes < 1024 {
            return Err(ConfigError::invalid(
                origin,
                "http.max_body_bytes",
                "must be at least 1024",
            ));
        }
        for (key, value) in [
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.body_read_timeout_ms", self.http.body_read_timeout_ms),
            ("http.idle_timeout_ms", self.http.idle_timeout_ms),
            ("store.sweep_interval_ms", self.store.sweep_interval_ms),
        ] {
            // Zero would close every connection at once (or sweep in a busy loop).
            if value < 100 {
                return Err(ConfigError::invalid(
                    origin,
                    key,
                    "must be at least 100 (milliseconds)",
                ));
            }
        }
        // The cap is a semaphore's permit count; far beyond any file limit is a typo.
        if !(1..=1_000_000).contains(&self.http.max_connections) {
            return Err(ConfigError::invalid(
                origin,
                "http.max_connections",
                "must be between 1 and 1000000",
            ));
        }
        // The shares leave room for others: unauthenticated connections can never take the
        // whole cap, and neither can one principal.
        let max = self.http.max_connections;
        for (key, value, limit) in [
            (
                "http.max_unauthenticated_connections",
                self.http.max_unauthenticated_connections,
                max.saturating_sub(1),
            ),
            (
                "http.max_connections_per_principal",
                self.http.max_connections_per_principal,
                max.saturating_sub(self.http.unauthenticated_share()),
            ),
        ] {
            if let Some(value) = value
                && (value == 0 || value > limit)
            {
                return Err(ConfigError::invalid(
                    origin,
                    key,
                    format!(
                        "must be between 1 and {limit} (leaving room under http.max_connections = {max})"
                    ),
                ));
            }
        }
        if !(1..=1_000_000).contains(&self.http.max_streams_per_principal) {
            return Err(ConfigError::invalid(
                origin,
                "http.max_streams_per_principal",
                "must be between 1 and 1000000",
            ));
        }
        if let Some(n) = self.http.max_grpc_requests_per_principal
            && !(1..=1_000_000).contains(&n)
        {
            return Err(ConfigError::invalid(
                origin,
                "http.max_grpc_requests_per_principal",
                "must be between 1 and 1000000",
            ));
        }
        if !(1..=10_000).contains(&self.http.grpc_max_concurrent_streams) {
            return Err(ConfigError::invalid(
                origin,
                "http.grpc_max_concurrent_streams",
                "must be between 1 and 10000",
            ));
        }
        if !(100..=15_000).contains(&self.http.stream_keepalive_ms) {
            return Err(ConfigError::invalid(
                origin,
                "http.stream_keepalive_ms",
                "must be between 100 and 15000 (milliseconds): a waiting stream is never silent longer than 15 s",
            ));
        }
        self.store.database().validate(origin)?;
        if self.store.max_tasks == 0 {
            return Err(ConfigError::invalid(
                origin,
                "store.max_tasks",
                "must be at least 1",
            ));
        }
        if self.store.cache_capacity_bytes < 1024 * 1024 {
            return Err(ConfigError::invalid(
                origin,
                "store.cache_capacity_bytes",
                "must be at least 1048576 (1 MiB)",
            ));
        }
        for (i, t) in self.auth.tokens.iter().enumerate() {
            let ok = t.sha256.len() == 64 && hex::decode(&t.sha256).is_ok();
            if !ok {
                return Err(ConfigError::invalid(
                    origin,
                    &format!("auth.tokens[{i}].sha256"),
                    "must be 64 hex digits (the SHA-256 of the token)",
                ));
            }
            if t.principal.trim().is_empty() {
                return Err(ConfigError::invalid(
                    origin,
                    &format!("auth.tokens[{i}].principal"),
                    "must not be empty",
                ));
            }
            check_groups(&t.groups).map_err(|why| {
                ConfigError::invalid(origin, &format!("auth.tokens[{i}].groups"), why)
            })?;
        }
        let mut seen = std::collections::HashSet::new();
        let mut seen_groups = std::collections::HashSet::new();
        for (i, a) in self.agents.access.iter().enumerate() {
            match (&a.group, a.principal.is_empty()) {
                (None, false) => {
                    if !seen.insert(a.principal.as_str()) {
                        return Err(ConfigError::invalid(
                            origin,
                            &format!("agents.access[{i}].principal"),
                            format!("{:?} has more than one entry", a.principal),
                        ));
                    }
                }
                (Some(g), true) if !g.is_empty() => {
                    if !seen_groups.insert(g.as_str()) {
                        return Err(ConfigError::invalid(
                            origin,
                            &format!("agents.access[{i}].group"),
                            format!("{g:?} has more than one entry"),
                        ));
                    }
                }
                _ => {
                    return Err(ConfigError::invalid(
                        origin,
                        &format!("agents.access[{i}]"),
                        "name exactly one of principal or group",
                    ));
                }
            }
        }
        self.validate_oidc(origin)?;
        self.validate_certs(origin)?;
        if self.auth.tokens.is_empty()
            && self.auth.token_file.is_none()
            && self.auth.oidc.is_empty()
            && self.auth.certs.is_empty()
        {
            return Err(ConfigError::invalid(
                origin,
                "auth.tokens",
                "no tokens, no auth.token_file and no auth.oidc issuer: every request would be refused",
            ));
        }
        Ok(())
    }

    /// The token file's path, relative paths resolved against the state directory.
    pub fn token_file_path(&self) -> Option<PathBuf> {
        self.auth
            .token_file
            .as_ref()
            .map(|p| resolve(&self.daemon.state_dir, p))
    }

    /// The gRPC interface's URL for the card, when the gRPC binding is served.
    pub fn grpc_url(&self) -> Option<String> {
        let g = self.grpc.as_ref()?;
        if let Some(u) = &self.card.grpc_url {
            return Some(u.clone());
        }
        match (&g.tcp, &g.socket) {
            (Some(addr), _) => Some(addr.clone()),
            (None, Some(p)) => Some(format!(
                "unix:{}",
                resolve(&self.daemon.state_dir, p).display()
            )),
            (None, None) => None,
        }
    }

    /// True when the HTTP listener is bound to a loopback address.
    pub fn is_loopback(&self) -> bool {
        self.http
            .bind
            .parse::<SocketAddr>()
            .map(|a| a.ip().is_loopback())
            .unwrap_or(false)
    }
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The `host[:port]` authority of an http(s) URL.
pub fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_daemon::config::load;

    #[test]
    fn the_embedded_default_is_valid_and_loopback() {
        let c = load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_TEST_A", &[]).unwrap();
        c.value.validate(&c.origin).unwrap();
        assert!(c.value.is_loopback());
        assert_eq!(c.value.http.max_body_bytes, 1024 * 1024);
        assert_eq!(c.value.http.header_read_timeout_ms, 10_000);
        assert_eq!(c.value.http.max_connections, 4096);
        assert_eq!(c.value.http.unauthenticated_share(), 256);
        assert_eq!(c.value.http.principal_connection_share(), 1024);
        assert_eq!(c.value.http.max_streams_per_principal, 1024);
        assert_eq!(c.value.http.stream_keepalive_ms, 15_000);
        assert_eq!(c.value.store.task_retention_seconds, 7 * 24 * 3600);
        assert_eq!(c.value.store.conversation_ttl_seconds, 3600);
        assert_eq!(c.value.mcp.max_sessions, 2048);
        assert_eq!(c.value.mcp.sessions_per_principal(), 512);
        assert_eq!(c.value.mcp.session_idle_seconds, 300);
        assert_eq!(
            c.value.token_file_path().unwrap(),
            PathBuf::from("/var/lib/warden/gateway/gateway.token")
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (set, key) in [
            ("http.bind=nowhere", "http.bind"),
            ("http.public_url=ftp://x", "http.public_url"),
            ("http.max_body_bytes=10", "http.max_body_bytes"),
            (
                "http.header_read_timeout_ms=0",
                "http.header_read_timeout_ms",
            ),
            ("http.max_connections=0", "http.max_connections"),
            ("http.max_connections=99999999999", "http.max_connections"),
            (
                "http.max_unauthenticated_connections=4096",
                "http.max_unauthenticated_connections",
            ),
            (
                "http.max_connections_per_principal=4000",
                "http.max_connections_per_principal",
            ),
            (
                "http.max_streams_per_principal=0",
                "http.max_streams_per_principal",
            ),
            ("http.stream_keepalive_ms=60000", "http.stream_keepalive_ms"),
            ("store.max_tasks=0", "store.max_tasks"),
            ("mcp.max_sessions=0", "mcp.max_sessions"),
            (
                "mcp.max_sessions_per_principal=4096",
                "mcp.max_sessions_per_principal",
            ),
            ("mcp.session_idle_seconds=0", "mcp.session_idle_seconds"),
            ("store.sweep_interval_ms=5", "store.sweep_interval_ms"),
            ("http.listn=1", "listn"),
        ] {
            let err = load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_TEST_B", &[set.into()])
                .and_then(|c| c.value.validate(&c.origin));
            let text = err.expect_err(set).to_string();
            assert!(text.contains(key), "{set}: {text}");
        }
        let with_bad_digest =
            format!("{EMBEDDED}\n[[auth.tokens]]\nprincipal = \"a\"\nsha256 = \"xyz\"\n");
        let c =
            load::<GatewayConfig>(None, &with_bad_digest, "WARDEN_GATEWAY_TEST_C", &[]).unwrap();
        let text = c.value.validate(&c.origin).unwrap_err().to_string();
        assert!(text.contains("auth.tokens[0].sha256"), "{text}");
    }

    #[test]
    fn oidc_issuers_and_group_rules_are_checked() {
        let iss = |extra: &str| {
            format!(r#"auth.oidc=[{{issuer="https://idp.example", audiences=["warden"]{extra}}}]"#)
        };
        let ok =
            load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_TEST_O", &[iss("")]).unwrap();
        ok.value.validate(&ok.origin).unwrap();
        assert_eq!(ok.value.auth.oidc[0].prefix(), "https://idp.example#");
        let two = r#"auth.oidc=[{issuer="https://a.example", audiences=["w"], principal_prefix="corp:"}, {issuer="https://b.example", audiences=["w"], principal_prefix="corp:eu:"}]"#.to_string();
        for (set, key) in [
            (iss(r#", algorithms=["HS256"]"#), "auth.oidc[0].algorithms"),
            (iss(r#", algorithms=["none"]"#), "auth.oidc[0].algorithms"),
            (
                iss(r#", jwks_url="http://idp.example/keys""#),
                "auth.oidc[0].jwks_url",
            ),
            (
                iss(r#", principal_claim="name""#),
                "auth.oidc[0].principal_claim",
            ),
            (iss(r#", leeway_secs=3600"#), "auth.oidc[0].leeway_secs"),
            (
                iss(r#", principal_prefix="""#),
                "auth.oidc[0].principal_prefix",
            ),
            (
                r#"auth.oidc=[{issuer="http://idp.example", audiences=["w"]}]"#.into(),
                "auth.oidc[0].issuer",
            ),
            (
                r#"auth.oidc=[{issuer="https://idp.example", audiences=[]}]"#.into(),
                "auth.oidc[0].audiences",
            ),
            (two, "auth.oidc[1].principal_prefix"),
            (
                r#"agents.access=[{principal="a", group="g"}]"#.into(),
                "agents.access[0]",
            ),
            (
                r#"agents.access=[{agents=["x"]}]"#.into(),
                "agents.access[0]",
            ),
            (
                r#"agents.access=[{group="g"}, {group="g"}]"#.into(),
                "agents.access[1].group",
            ),
            ("auth.max_token_bytes=10".into(), "auth.max_token_bytes"),
            ("auth.jwks_timeout_ms=0".into(), "auth.jwks_timeout_ms"),
        ] {
            let err = load::<GatewayConfig>(
                None,
                EMBEDDED,
                "WARDEN_GATEWAY_TEST_O",
                std::slice::from_ref(&set),
            )
            .and_then(|c| c.value.validate(&c.origin));
            let text = err.expect_err(&set).to_string();
            assert!(text.contains(key), "{set}: {text}");
        }
        // A static token's principal inside an issuer's namespace would collide with it.
        let clash = format!(
            "{EMBEDDED}\n[[auth.tokens]]\nprincipal = \"https://idp.example#alice\"\nsha256 = \"{}\"\n",
            "0".repeat(64)
        );
        let c = load::<GatewayConfig>(None, &clash, "WARDEN_GATEWAY_TEST_O", &[iss("")]).unwrap();
        let text = c.value.validate(&c.origin).unwrap_err().to_string();
        assert!(text.contains("auth.oidc[0].principal_prefix"), "{text}");
    }

    #[test]
    fn client_certificates_are_mapped_once_by_one_name_where_they_are_asked_for() {
        let tls = r#"http.tls={cert_file="g.pem", key_file="g.key", client_ca_file="ca.pem", client_certs="require"}"#;
        let check = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_TEST_M", &sets)
                .and_then(|c| c.value.validate(&c.origin))
        };
        check(&[
            tls,
            r#"auth.certs=[{spiffe_id="spiffe://example.org/ci", principal="ci"}, {subject_cn="frank", principal="frank"}]"#,
        ])
        .unwrap();
        for (sets, key) in [
            (
                vec![r#"auth.certs=[{subject_cn="frank", principal="frank"}]"#],
                "auth.certs",
            ),
            (
                vec![r#"http.tls={cert_file="g.pem", key_file="g.key", client_certs="request"}"#],
                "http.tls.client_ca_file",
            ),
            (
                vec![r#"http.tls={cert_file="g.pem", key_file="g.key", client_ca_file="ca.pem"}"#],
                "http.tls.client_certs",
            ),
            (
                vec![
                    tls,
                    r#"auth.certs=[{spiffe_id="spiffe://x/y", subject_cn="y", principal="p"}]"#,
                ],
                "auth.certs[0]",
            ),
            (
                vec![tls, r#"auth.certs=[{principal="p"}]"#],
                "auth.certs[0]",
            ),
            (
                vec![
                    tls,
                    r#"auth.certs=[{spiffe_id="ci-builder", principal="p"}]"#,
                ],
                "auth.certs[0].spiffe_id",
            ),
            (
                vec![
                    tls,
                    r#"auth.certs=[{subject_cn="a", principal="p"}, {subject_cn="a", principal="q"}]"#,
                ],
                "auth.certs[1]",
            ),
            (
                vec![tls, r#"auth.certs=[{subject_cn="a", principal=" "}]"#],
                "auth.certs[0].principal",
            ),
            (
                vec![
                    tls,
                    r#"auth.certs=[{subject_cn="a", principal="p", groups=[""]}]"#,
                ],
                "auth.certs[0].groups",
            ),
            (
                vec![
                    tls,
                    r#"auth.oidc=[{issuer="https://idp.example", audiences=["w"]}]"#,
                    r#"auth.certs=[{subject_cn="a", principal="https://idp.example#alice"}]"#,
                ],
                "auth.certs[0].principal",
            ),
        ] {
            let text = check(&sets).expect_err(&sets.join(" ")).to_string();
            assert!(text.contains(key), "{sets:?}: {text}");
        }
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("http://127.0.0.1:8080/a"), Some("127.0.0.1:8080"));
        assert_eq!(url_host("https://gw.example"), Some("gw.example"));
        assert_eq!(url_host("https://u@gw.example"), None);
        assert_eq!(url_host("gw.example"), None);
    }

    #[test]
    fn cells_need_a_store_and_mutual_tls_and_judge_lost_cells_slower_than_they_poll() {
        let tls = [
            "cells.tls.cert_file=\"g.pem\"",
            "cells.tls.key_file=\"g.key\"",
            "cells.tls.ca_file=\"ca.pem\"",
            "cells.tls.admit=[\"spiffe://example.org/warden/supervisor\"]",
        ];
        let with = |extra: &[&str]| {
            let mut sets: Vec<String> = tls.iter().map(|s| s.to_string()).collect();
            sets.extend(extra.iter().map(|s| s.to_string()));
            let c = load::<GatewayConfig>(None, EMBEDDED, "WARDEN_GATEWAY_TEST_C", &sets);
            c.and_then(|c| c.value.validate(&c.origin).map(|()| c.value))
        };
        let ok = with(&["cells.store.url=\"host=/run/postgresql dbname=warden\""]).unwrap();
        let cells = ok.cells.unwrap();
        assert_eq!(
            (cells.choices, cells.lost_after_ms, cells.poll_ms),
            (2, 6_000, 1_000)
        );
        assert_eq!(cells.store().backend, warden_pgstate::Backend::Postgres);
        for (extra, key) in [
            (vec!["cells.store.url=\"\""], "cells.store"),
            (
                vec![
                    "cells.store.url=\"host=/x\"",
                    "cells.tls.admit=[\"supervisor\"]",
                ],
                "cells.tls.admit[0]",
            ),
            (
                vec!["cells.store.url=\"host=/x\"", "cells.choices=0"],
                "cells.choices",
            ),
            (
                vec!["cells.store.url=\"host=/x\"", "cells.lost_after_ms=1500"],
                "cells.lost_after_ms",
            ),
        ] {
            let e = with(&extra).unwrap_err();
            assert!(e.to_string().contains(key), "{extra:?}: {e}");
        }
    }
}
