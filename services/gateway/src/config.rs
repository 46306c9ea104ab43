//! The gateway's configuration (TOML, loaded by `warden-daemon`: file → `WARDEN_GATEWAY__…`
//! environment → `--set`), validated with errors that name the key and the file.
//!
//! Owns every section's type, the `[push]` and `[mcp]` ones included: the gateway's floors
//! (ARCHITECTURE.md) put configuration at the bottom, so this file imports nothing of the
//! gateway and every other file may import it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use warden_daemon::config::{ConfigError, DaemonSection, ListenerConfig, Origin};
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

/// One accepted bearer token, stored as the hex SHA-256 of the token text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who presents this token: the owner of its tasks and the policy's subject.
    pub principal: String,
    /// Hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
    pub sha256: String,
    /// Groups this token's principal belongs to, for `[[agents.access]]` rules naming a group.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `[[auth.certs]]`: a client certificate (verified against `http.tls.client_ca_file`) that
/// names a caller, by its SPIFFE ID or its subject's common name (exactly one).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertEntry {
    /// A SPIFFE ID (URI SAN) the certificate must carry.
    #[serde(default)]
    pub spiffe_id: Option<String>,
    /// The subject CN the certificate must have.
    #[serde(default)]
    pub subject_cn: Option<String>,
    /// The caller it is: the owner of its tasks and the policy's subject.
    pub principal: String,
    /// Its groups, for `[[agents.access]]` and policy rules naming a group.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A credential's configured groups: as many and as long as the policy's Decide accepts (a
/// subject over them would have every permission of its turns denied as malformed).
fn check_groups(groups: &[String]) -> Result<(), String> {
    use warden_proto::limits::{MAX_GROUP_BYTES, MAX_SUBJECT_GROUPS};
    if groups.len() > MAX_SUBJECT_GROUPS {
        return Err(format!("at most {MAX_SUBJECT_GROUPS} groups"));
    }
    match groups
        .iter()
        .find(|g| g.trim().is_empty() || g.len() > MAX_GROUP_BYTES)
    {
        Some(g) => Err(format!(
            "{g:?}: a group is non-empty and at most {MAX_GROUP_BYTES} bytes"
        )),
        None => Ok(()),
    }
}

/// An algorithm name of `algorithms`: asymmetric ones only.
pub fn parse_algorithm(name: &str) -> Result<jsonwebtoken::Algorithm, String> {
    use jsonwebtoken::Algorithm;
    let alg: Algorithm = name
        .parse()
        .map_err(|_| format!("{name:?} is not a JWS algorithm this gateway knows"))?;
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Err(format!(
            "{name} is symmetric: a gateway holding the issuer's secret could mint tokens; use an asymmetric algorithm"
        )),
        a => Ok(a),
    }
}

/// A discovery or JWKS URL: https, or http to a loopback host only (nothing else can read it).
pub fn check_fetch_url(url: &str) -> Result<(), String> {
    let u = warden_egress::HttpUrl::parse(url)?;
    let loopback = u.host == "localhost"
        || u.host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !u.tls && !loopback {
        return Err(format!(
            "{url}: must be https (http only to a loopback host)"
        ));
    }
    Ok(())
}

/// `[[auth.oidc]]`: one OpenID Connect issuer whose signed JWTs are accepted as bearer tokens
/// (`src/oidc.rs` verifies them; docs/identity.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcIssuerConfig {
    /// The issuer URL, exactly as the tokens' `iss` claim says it (https; http only on a
    /// loopback host).
    pub issuer: String,
    /// Accepted `aud` values: a token must name at least one of them.
    pub audiences: Vec<String>,
    /// Where the signing keys are: left out, `jwks_uri` of the issuer's
    /// `/.well-known/openid-configuration` (discovery).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// Accepted signature algorithms (asymmetric only: RS*, PS*, ES*, EdDSA). Default RS256
    /// and ES256.
    #[serde(default = "default_oidc_algorithms")]
    pub algorithms: Vec<String>,
    /// The claim naming the caller: `sub` (default) or `email` (then `email_verified` must not
    /// be false).
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// Put before the claim's value to make the principal (and before each group): default
    /// the issuer followed by `#`, which no issuer URL contains, so two issuers never collide.
    #[serde(default)]
    pub principal_prefix: Option<String>,
    /// The claim listing the caller's groups (a string array, or one string); left out: none.
    #[serde(default)]
    pub groups_claim: Option<String>,
    /// Certificates (PEM) trusted for the discovery and JWKS fetches besides the public roots:
    /// an issuer behind a private CA.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds (at most 300).
    #[serde(default = "default_oidc_leeway")]
    pub leeway_secs: u64,
}

fn default_oidc_algorithms() -> Vec<String> {
    vec!["RS256".into(), "ES256".into()]
}
fn default_principal_claim() -> String {
    "sub".into()
}
fn default_oidc_leeway() -> u64 {
    30
}
fn default_max_token_bytes() -> usize {
    8192
}
fn default_jwks_timeout_ms() -> u64 {
    5000
}
fn default_jwks_refresh_interval() -> u64 {
    30
}
fn default_jwks_max_age() -> u64 {
    3600
}

impl OidcIssuerConfig {
    /// What goes before the claim's value in the principal (and each group).
    pub fn prefix(&self) -> String {
        self.principal_prefix
            .clone()
            .unwrap_or_else(|| format!("{}#", self.issuer))
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
    /// Read when `tokens` is empty: a file (mode 0600, relative paths against the state
    /// directory) holding one token. `warden up` generates it; if it is missing the gateway
    /// generates it itself.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The principal of the token file's token.
    #[serde(default = "default_file_principal")]
    pub token_file_principal: String,
    /// OpenID Connect issuers whose JWTs are accepted besides the static tokens.
    #[serde(default)]
    pub oidc: Vec<OidcIssuerConfig>,
    /// A bearer token longer than this is refused unread (`too_large`).
    #[serde(default = "default_max_token_bytes")]
    pub max_token_bytes: usize,
    /// A discovery or JWKS fetch (connect, TLS, request, body) gives up after this long.
    #[serde(default = "default_jwks_timeout_ms")]
    pub jwks_timeout_ms: u64,
    /// An issuer's keys are fetched again for an unknown `kid` at most once per this many
    /// seconds (one fetch per issuer for every caller, not per caller).
    #[serde(default = "default_jwks_refresh_interval")]
    pub jwks_refresh_interval_secs: u64,
    /// Keys older than this are fetched again in the background while still used.
    #[serde(default = "default_jwks_max_age")]
    pub jwks_max_age_secs: u64,
    /// Client certificates that name callers (with `http.tls.client_certs`).
    #[serde(default)]
    pub certs: Vec<CertEntry>,
}

fn default_file_principal() -> String {
    "local".into()
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

    /// `http.tls` and `[[auth.certs]]`: each entry names one certificate by exactly one of its
    /// SPIFFE ID or subject CN, once; entries only where client certificates are asked for.
    fn validate_certs(&self, origin: &Origin) -> Result<(), ConfigError> {
        let bad = |k: String, why: String| Err(ConfigError::invalid(origin, &k, why));
        if let Some(t) = &self.http.tls
            && let Err((k, why)) = t.check()
        {
            return bad(format!("http.tls.{k}"), why);
        }
        let asked = self
            .http
            .tls
            .as_ref()
            .is_some_and(|t| t.client_certs != warden_daemon::tls::ClientCerts::Off);
        if !self.auth.certs.is_empty() && !asked {
            return bad(
                "auth.certs".into(),
                "certificates are mapped but no listener asks for them: set http.tls.client_certs (and client_ca_file)".into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.auth.certs.iter().enumerate() {
            let k = |f: &str| format!("auth.certs[{i}].{f}");
            let key = match (&c.spiffe_id, &c.subject_cn) {
                (Some(id), None) => {
                    let ok = id
                        .strip_prefix("spiffe://")
                        .and_then(|r| r.split_once('/'))
                        .is_some_and(|(d, p)| !d.is_empty() && !p.is_empty());
                    if !ok {
                        return bad(
                            k("spiffe_id"),
                            format!(
                                "{id:?} is not a SPIFFE ID like spiffe://example.org/ci/builder"
                            ),
                        );
                    }
                    format!("spiffe:{id}")
                }
                (None, Some(cn)) if !cn.is_empty() => format!("cn:{cn}"),
                _ => {
                    return bad(
                        format!("auth.certs[{i}]"),
                        "name exactly one of spiffe_id or subject_cn".into(),
                    );
                }
            };
            if !seen.insert(key) {
                return bad(
                    format!("auth.certs[{i}]"),
                    "this certificate is mapped more than once".into(),
                );
            }
            if c.principal.trim().is_empty() {
                return bad(k("principal"), "must not be empty".into());
            }
            check_groups(&c.groups).or_else(|why| bad(k("groups"), why))?;
            if let Some(o) = self
                .auth
                .oidc
                .iter()
                .find(|o| c.principal.starts_with(&o.prefix()))
            {
                return bad(
                    k("principal"),
                    format!("starts with the issuer {:?}'s prefix", o.issuer),
                );
            }
        }
        Ok(())
    }

    /// `[[auth.oidc]]` and its limits: https issuers, asymmetric algorithms, prefixes that
    /// cannot make two issuers' (or a static token's) principals collide.
    fn validate_oidc(&self, origin: &Origin) -> Result<(), ConfigError> {
        let a = &self.auth;
        let bad = |k: String, why: String| Err(ConfigError::invalid(origin, &k, why));
        if !(1024..=65536).contains(&a.max_token_bytes) {
            return bad(
                "auth.max_token_bytes".into(),
                "must be 1024 to 65536".into(),
            );
        }
        if !(100..=60_000).contains(&a.jwks_timeout_ms) {
            return bad("auth.jwks_timeout_ms".into(), "must be 100 to 60000".into());
        }
        if !(1..=3600).contains(&a.jwks_refresh_interval_secs) {
            return bad(
                "auth.jwks_refresh_interval_secs".into(),
                "must be 1 to 3600".into(),
            );
        }
        if !(60..=604_800).contains(&a.jwks_max_age_secs) {
            return bad(
                "auth.jwks_max_age_secs".into(),
                "must be 60 to 604800".into(),
            );
        }
        let mut prefixes: Vec<String> = Vec::new();
        for (i, o) in a.oidc.iter().enumerate() {
            let k = |f: &str| format!("auth.oidc[{i}].{f}");
            check_fetch_url(&o.issuer).or_else(|e| bad(k("issuer"), e))?;
            if o.issuer.contains('#') || o.issuer.contains('?') {
                return bad(k("issuer"), "an issuer URL has no query or fragment".into());
            }
            if let Some(u) = &o.jwks_url {
                check_fetch_url(u).or_else(|e| bad(k("jwks_url"), e))?;
            }
            if o.audiences.is_empty() || o.audiences.iter().any(|x| x.is_empty()) {
                return bad(k("audiences"), "name at least one, none empty".into());
            }
            if o.algorithms.is_empty() {
                return bad(k("algorithms"), "name at least one".into());
            }
            for alg in &o.algorithms {
                parse_algorithm(alg)
                    .map(|_| ())
                    .or_else(|e| bad(k("algorithms"), e))?;
            }
            if !matches!(o.principal_claim.as_str(), "sub" | "email") {
                return bad(k("principal_claim"), "must be \"sub\" or \"email\"".into());
            }
            if o.groups_claim.as_deref().is_some_and(str::is_empty) {
                return bad(k("groups_claim"), "must not be empty".into());
            }
            if o.leeway_secs > 300 {
                return bad(k("leeway_secs"), "at most 300".into());
            }
            let p = o.prefix();
            if p.is_empty() {
                return bad(k("principal_prefix"), "must not be empty".into());
            }
            // A prefixed group (a claim's value is at most 512 bytes) must stay within what the
            // policy's Decide accepts.
            if p.len() > warden_proto::limits::MAX_GROUP_BYTES / 2 {
                return bad(
                    k("principal_prefix"),
                    format!(
                        "at most {} bytes (the issuer URL, when it is the prefix)",
                        warden_proto::limits::MAX_GROUP_BYTES / 2
                    ),
                );
            }
            if let Some(other) = prefixes
                .iter()
                .find(|q| q.starts_with(p.as_str()) || p.starts_with(q.as_str()))
            {
                return bad(
                    k("principal_prefix"),
                    format!("{p:?} and another issuer's {other:?} could name the same principal"),
                );
            }
            let file_principal = a.token_file.as_ref().map(|_| &a.token_file_principal);
            if let Some(t) = a
                .tokens
                .iter()
                .map(|t| &t.principal)
                .chain(file_principal)
                .find(|t| t.starts_with(p.as_str()))
            {
                return bad(
                    k("principal_prefix"),
                    format!("the static token principal {t:?} starts with {p:?}"),
                );
            }
            prefixes.push(p);
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

/// `[push]`: push notifications and the webhook allowlist.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSection {
    /// Serve push notifications (the card says `pushNotifications: true`). Off: every push
    /// method answers PushNotificationNotSupported (-32003).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Webhook hosts callers may name: `*` (any host), `*.example.com` (that domain's
    /// subdomains), or an exact host name or IP literal. Every address still passes the network
    /// check below.
    #[serde(default = "default_hosts")]
    pub allowed_hosts: Vec<String>,
    /// Networks (CIDR, `127.0.0.1/32`, `fd00::/8`) a webhook may be in although they are not
    /// public (loopback, private, link-local, …). Empty: public addresses only.
    #[serde(default)]
    pub allowed_networks: Vec<String>,
    /// Tries per notification before it is counted as failed.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Wait before the first retry; doubled each time up to `retry_max_ms`.
    #[serde(default = "default_retry_base")]
    pub retry_base_ms: u64,
    #[serde(default = "default_retry_max")]
    pub retry_max_ms: u64,
    /// One POST (connect, send, answer) may take this long.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Configs one task may have.
    #[serde(default = "default_max_configs")]
    pub max_configs_per_task: usize,
    /// Extra trust anchors for https webhooks (PEM file of CA certificates, e.g. an internal
    /// CA), beside the public roots (webpki-roots). Relative paths: against the state directory.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// The nameservers webhook host names are asked (`IP` or `IP:PORT`, UDP with TCP for long
    /// answers). Empty: the system's (`/etc/resolv.conf`, and `/etc/hosts`). Read at start.
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Webhook host lookups one principal may have in flight while creating configs; one more
    /// is refused (ResourceExhausted, -32029 / 429) before anything is looked up or stored.
    #[serde(default = "default_lookups_per_principal")]
    pub max_lookups_per_principal: usize,
    /// Lookups in flight for config creation, every principal together (the sum the shares
    /// draw from); one more is refused the same way.
    #[serde(default = "default_lookups")]
    pub max_lookups: usize,
    /// Webhook deliveries (lookup, connect, POST) in flight for one principal's configs; more
    /// wait, in order, behind that principal's own.
    #[serde(default = "default_deliveries_per_principal")]
    pub max_deliveries_per_principal: usize,
    /// Deliveries in flight, every principal together; a principal within its share waits in
    /// turn for one.
    #[serde(default = "default_deliveries")]
    pub max_deliveries: usize,
}

fn default_lookups_per_principal() -> usize {
    16
}
fn default_lookups() -> usize {
    256
}
fn default_deliveries_per_principal() -> usize {
    32
}
fn default_deliveries() -> usize {
    512
}

/// One nameserver of `push.nameservers`: `IP` (port 53) or `IP:PORT` (`[v6]:PORT`).
pub fn parse_nameserver(s: &str) -> Option<std::net::SocketAddr> {
    s.parse::<std::net::SocketAddr>().ok().or_else(|| {
        s.parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| std::net::SocketAddr::new(ip, 53))
    })
}

fn default_true() -> bool {
    true
}
fn default_hosts() -> Vec<String> {
    vec!["*".into()]
}
fn default_attempts() -> u32 {
    5
}
fn default_retry_base() -> u64 {
    500
}
fn default_retry_max() -> u64 {
    30_000
}
fn default_timeout() -> u64 {
    10_000
}
fn default_max_configs() -> usize {
    10
}

impl Default for PushSection {
    fn default() -> Self {
        Self {
            enabled: true,
            allowed_hosts: default_hosts(),
            allowed_networks: Vec::new(),
            max_attempts: default_attempts(),
            retry_base_ms: default_retry_base(),
            retry_max_ms: default_retry_max(),
            timeout_ms: default_timeout(),
            max_configs_per_task: default_max_configs(),
            ca_file: None,
            nameservers: Vec::new(),
            max_lookups_per_principal: default_lookups_per_principal(),
            max_lookups: default_lookups(),
            max_deliveries_per_principal: default_deliveries_per_principal(),
            max_deliveries: default_deliveries(),
        }
    }
}

impl PushSection {
    /// What serde cannot check; the error names the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (i, n) in self.allowed_networks.iter().enumerate() {
            if Cidr::parse(n).is_none() {
                return Err((
                    format!("push.allowed_networks[{i}]"),
                    format!("{n:?} is not a network like 127.0.0.1/32 or fd00::/8"),
                ));
            }
        }
        for (i, h) in self.allowed_hosts.iter().enumerate() {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if h.is_empty() || bare.is_empty() || bare.contains(['/', ':', '@', '*']) && h != "*" {
                return Err((
                    format!("push.allowed_hosts[{i}]"),
                    format!("{h:?} is not `*`, `*.domain` or a host"),
                ));
            }
        }
        if self.max_attempts == 0 || self.max_attempts > 100 {
            return Err(("push.max_attempts".into(), "must be 1 to 100".into()));
        }
        if self.timeout_ms < 100 {
            return Err(("push.timeout_ms".into(), "must be at least 100".into()));
        }
        if self.max_configs_per_task == 0 {
            return Err((
                "push.max_configs_per_task".into(),
                "must be at least 1".into(),
            ));
        }
        for (i, n) in self.nameservers.iter().enumerate() {
            if parse_nameserver(n).is_none() {
                return Err((
                    format!("push.nameservers[{i}]"),
                    format!("{n:?} is not an address like 192.0.2.53 or 127.0.0.1:5353"),
                ));
            }
        }
        for (key, n) in [
            (
                "push.max_lookups_per_principal",
                self.max_lookups_per_principal,
            ),
            ("push.max_lookups", self.max_lookups),
            (
                "push.max_deliveries_per_principal",
                self.max_deliveries_per_principal,
            ),
            ("push.max_deliveries", self.max_deliveries),
        ] {
            if !(1..=100_000).contains(&n) {
                return Err((key.into(), "must be 1 to 100000".into()));
            }
        }
        Ok(())
    }
}

/// `[mcp]` of the gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpSection {
    /// Serve `/mcp` at all.
    pub enabled: bool,
    /// Browser origins (`scheme://host[:port]`) allowed besides the public URL's and, on a
    /// loopback bind, `http(s)://localhost|127.0.0.1|[::1]` on any port. A request carrying any
    /// other `Origin` is refused 403 (DNS rebinding).
    pub allowed_origins: Vec<String>,
    /// Longest accepted `task` argument in bytes (UTF-8); longer is refused before anything starts.
    pub task_max_bytes: usize,
    /// The soft budget of a verb call that names no `timeout_seconds`.
    pub default_timeout_seconds: u32,
    /// The largest `timeout_seconds` a caller may ask for.
    pub max_timeout_seconds: u32,
    /// Finished background jobs are kept (for `job_result`) this long.
    pub job_retention_seconds: u64,
    /// Background jobs per principal at once (running or kept).
    pub max_jobs: usize,
    /// 2025-11-25 sessions open at once on this gateway, of every principal (each costs tens of
    /// KiB of memory). An `initialize` past it is refused 429 with a JSON-RPC error.
    pub max_sessions: usize,
    /// Sessions one principal holds open at once; default `max_sessions` / 4, so three
    /// principals at their share still leave a quarter for everyone else. An `initialize` past
    /// it is refused 429 with a JSON-RPC error naming this key; other principals are served.
    pub max_sessions_per_principal: Option<usize>,
    /// A session with no request in flight (an open GET stream counts) and none for this long
    /// is ended as a DELETE ends it: its binding goes, its conversations are closed, its share
    /// comes back, and the memory it held is returned to the system.
    pub session_idle_seconds: u64,
}

impl Default for McpSection {
    fn default() -> Self {
        Self {
            enabled: true,
            allowed_origins: Vec::new(),
            task_max_bytes: 16 * 1024,
            default_timeout_seconds: 600,
            max_timeout_seconds: 3600,
            job_retention_seconds: 3600,
            max_jobs: 16,
            max_sessions: 2048,
            max_sessions_per_principal: None,
            session_idle_seconds: 300,
        }
    }
}

impl McpSection {
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        for o in &self.allowed_origins {
            if !(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with('/') {
                return Err(ConfigError::invalid(
                    origin,
                    "mcp.allowed_origins",
                    format!("{o:?} is not an origin like https://app.example:443"),
                ));
            }
        }
        if self.task_max_bytes == 0 || self.task_max_bytes > 1024 * 1024 {
            return Err(ConfigError::invalid(
                origin,
                "mcp.task_max_bytes",
                "must be between 1 and 1048576",
            ));
        }
        if self.max_timeout_seconds == 0
            || self.default_timeout_seconds == 0
            || self.default_timeout_seconds > self.max_timeout_seconds
        {
            return Err(ConfigError::invalid(
                origin,
                "mcp.default_timeout_seconds",
                "must be at least 1 and at most mcp.max_timeout_seconds",
            ));
        }
        if self.max_jobs == 0 {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_jobs",
                "must be at least 1",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_sessions) {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_sessions",
                "must be between 1 and 1000000",
            ));
        }
        if self
            .max_sessions_per_principal
            .is_some_and(|n| n == 0 || n > self.max_sessions)
        {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_sessions_per_principal",
                "must be at least 1 and at most mcp.max_sessions",
            ));
        }
        if !(1..=86_400).contains(&self.session_idle_seconds) {
            return Err(ConfigError::invalid(
                origin,
                "mcp.session_idle_seconds",
                "must be between 1 and 86400",
            ));
        }
        Ok(())
    }

    /// Sessions one principal may hold open: the configured share, else a quarter of the whole.
    pub fn sessions_per_principal(&self) -> usize {
        self.max_sessions_per_principal
            .unwrap_or(self.max_sessions / 4)
            .clamp(1, self.max_sessions)
    }
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
