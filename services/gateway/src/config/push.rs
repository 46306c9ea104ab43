//! `[push]`: push notifications and the webhook allowlist's section, its defaults and checks.
//!
//! Owns: what `[push]` may say. Must never: deliver a webhook (`push.rs` does), or import anything
//! of the gateway.

use super::*;

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
