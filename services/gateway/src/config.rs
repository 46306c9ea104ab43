//! The gateway's configuration (TOML, loaded by `warden-daemon`: file → `WARDEN_GATEWAY__…`
//! environment → `--set`), validated with errors that name the key and the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use warden_daemon::config::{ConfigError, DaemonSection, ListenerConfig, Origin};

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

/// One accepted bearer token, stored as the hex SHA-256 of the token text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who presents this token: the owner of its tasks and the policy's subject.
    pub principal: String,
    /// Hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
    pub sha256: String,
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
}

fn default_file_principal() -> String {
    "local".into()
}

/// `[supervisor]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSection {
    /// The supervisor's Unix socket.
    pub socket: PathBuf,
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
}

impl GatewayConfig {
    /// Checks what serde cannot: addresses, URLs, digests, agent names.
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        self.daemon.validate(origin)?;
        self.listen.validate(origin, "listen")?;
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
        }
        if self.auth.tokens.is_empty() && self.auth.token_file.is_none() {
            return Err(ConfigError::invalid(
                origin,
                "auth.tokens",
                "no tokens configured and no auth.token_file: every request would be refused",
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
    fn url_hosts() {
        assert_eq!(url_host("http://127.0.0.1:8080/a"), Some("127.0.0.1:8080"));
        assert_eq!(url_host("https://gw.example"), Some("gw.example"));
        assert_eq!(url_host("https://u@gw.example"), None);
        assert_eq!(url_host("gw.example"), None);
    }
}
