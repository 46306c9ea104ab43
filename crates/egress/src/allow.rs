//! Egress allowlists: `host:port` entries, the canonical form of a host, and the check of every
//! address a name resolved to.
//!
//! An entry naming one `host:port` exactly lets a connection reach whatever that host is (an
//! operator who names `127.0.0.1:8080` or `llm.internal:443` means it); a `*.domain:port`
//! entry reaches public addresses only. Whatever matched, the unspecified address, multicast
//! and reserved space are never reached.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::address::{never_connectable, non_public};

/// Why a host is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("{0:?} is a numeric address in a non-canonical form (write it as a.b.c.d)")]
    NumericForm(String),
    #[error("{0:?} is not a host name")]
    Invalid(String),
}

/// A host in its one spelling: lower case, no trailing dot, IPv6 without brackets, IP literals
/// in canonical form. A name made of numbers (`127.1`, `2130706433`, `0x7f000001`,
/// `127.000.0.1`) is refused: a resolver would read it as an address nobody named.
pub fn canonical_host(host: &str) -> Result<String, HostError> {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    if h.is_empty() {
        return Err(HostError::Empty);
    }
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    if h.len() > 253
        || !h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    {
        return Err(HostError::Invalid(host.to_string()));
    }
    // inet_aton reads decimal, octal (leading 0) and hex (0x) parts; no real top-level domain
    // is numeric, so a name whose last label is one of these is an address in disguise.
    let numeric = |l: &str| {
        l.chars().all(|c| c.is_ascii_digit())
            || l.strip_prefix("0x")
                .is_some_and(|x| x.chars().all(|c| c.is_ascii_hexdigit()))
    };
    if h.rsplit('.').next().is_some_and(numeric) {
        return Err(HostError::NumericForm(host.to_string()));
    }
    Ok(h)
}

/// A host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// Canonical (see [`canonical_host`]).
    pub host: String,
    pub port: u16,
}

impl Destination {
    pub fn new(host: &str, port: u16) -> Result<Self, HostError> {
        Ok(Self {
            host: canonical_host(host)?,
            port,
        })
    }

    /// `host:port` (`[v6]:port`); the port is required and not 0.
    pub fn parse_authority(s: &str) -> Result<Self, EntryError> {
        let (host, port) = split_authority(s).ok_or_else(|| EntryError::Form(s.to_string()))?;
        let port = port.ok_or_else(|| EntryError::Form(s.to_string()))?;
        Self::new(host, port).map_err(EntryError::Host)
    }

    /// The IP address when the host is a literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.parse::<Ipv6Addr>().is_ok() {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` → (host, port). None when malformed (a port that
/// is not 1..=65535, an unclosed bracket, an IPv6 literal without brackets).
pub fn split_authority(s: &str) -> Option<(&str, Option<u16>)> {
    let port = |p: &str| -> Option<u16> {
        if p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        p.parse::<u16>().ok().filter(|p| *p != 0)
    };
    if let Some(v6) = s.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        h.parse::<Ipv6Addr>().ok()?;
        return match after {
            "" => Some((h, None)),
            p => Some((h, Some(port(p.strip_prefix(':')?)?))),
        };
    }
    match s.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => None,
        Some((h, p)) => Some((h, Some(port(p)?))),
        None => Some((s, None)),
    }
}

/// Why an allowlist entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("{0:?} is not host:port (e.g. api.example.com:443, 127.0.0.1:8080, *.example.com:443)")]
    Form(String),
    #[error(transparent)]
    Host(HostError),
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    /// Exactly this host and port.
    Exact(Destination),
    /// Any subdomain of `domain` (not `domain` itself) on `port`; public addresses only.
    Subdomains { domain: String, port: u16 },
}

impl AllowEntry {
    pub fn parse(s: &str) -> Result<Self, EntryError> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("*.") {
            let d = Destination::parse_authority(rest)?;
            if d.ip().is_some() {
                return Err(EntryError::Form(s.to_string()));
            }
            return Ok(AllowEntry::Subdomains {
                domain: d.host,
                port: d.port,
            });
        }
        Destination::parse_authority(s).map(AllowEntry::Exact)
    }

    fn matches(&self, d: &Destination) -> bool {
        match self {
            AllowEntry::Exact(e) => e == d,
            AllowEntry::Subdomains { domain, port } => {
                *port == d.port
                    && d.ip().is_none()
                    && d.host.len() > domain.len() + 1
                    && d.host.ends_with(domain.as_str())
                    && d.host.as_bytes()[d.host.len() - domain.len() - 1] == b'.'
            }
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Exact(d) => d.fmt(f),
            AllowEntry::Subdomains { domain, port } => write!(f, "*.{domain}:{port}"),
        }
    }
}

/// Which entry let a destination through, and where it came from (a setting's name, for
/// messages and records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub entry: AllowEntry,
    pub source: String,
}

/// The entries one agent may reach, each with the setting it came from.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    entries: Vec<(AllowEntry, String)>,
}

impl Allowlist {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, entry: AllowEntry, source: impl Into<String>) {
        if !self.entries.iter().any(|(e, _)| *e == entry) {
            self.entries.push((entry, source.into()));
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = (&AllowEntry, &str)> {
        self.entries.iter().map(|(e, s)| (e, s.as_str()))
    }

    /// The exact loopback destinations named (the relay mirrors them inside the sandbox).
    pub fn loopback_exact(&self) -> Vec<SocketAddr> {
        self.entries
            .iter()
            .filter_map(|(e, _)| match e {
                AllowEntry::Exact(d) => d
                    .ip()
                    .filter(|ip| ip.is_loopback())
                    .map(|ip| SocketAddr::new(ip, d.port)),
                _ => None,
            })
            .collect()
    }

    /// The first entry that lets `d` through.
    pub fn find(&self, d: &Destination) -> Option<Matched> {
        self.entries
            .iter()
            .find(|(e, _)| e.matches(d))
            .map(|(e, s)| Matched {
                entry: e.clone(),
                source: s.clone(),
            })
    }
}

/// The address to connect to out of what `d` resolved to. Every address must pass (a name that
/// also resolves to a forbidden one is refused as a whole, so which address a later lookup
/// returns first cannot matter): never the unspecified address, multicast or reserved space;
/// non-public addresses only through an entry naming `d` exactly. The caller connects to the
/// returned address itself, never to the name again.
pub fn check_addresses(
    d: &Destination,
    matched: &Matched,
    addrs: &[SocketAddr],
) -> Result<SocketAddr, String> {
    let first = addrs
        .first()
        .copied()
        .ok_or_else(|| format!("{} resolves to no address", d.host))?;
    let exact = matches!(matched.entry, AllowEntry::Exact(_));
    for a in addrs {
        let ip = a.ip();
        if let Some(why) = never_connectable(ip) {
            return Err(format!(
                "{} resolves to {ip}, a {why} address, which is never reachable",
                d.host
            ));
        }
        if let Some(why) = non_public(ip)
            && !exact
        {
            return Err(format!(
                "{} resolves to {ip}, a {why} address: only a host:port named exactly may reach it ({} names a domain)",
                d.host, matched.entry
            ));
        }
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(s: &str) -> Destination {
        Destination::parse_authority(s).unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn hosts_have_one_spelling_and_numeric_disguises_are_refused() {
        assert_eq!(
            canonical_host("API.Example.COM.").unwrap(),
            "api.example.com"
        );
        assert_eq!(
            canonical_host("::FFFF:127.0.0.1").unwrap(),
            "::ffff:127.0.0.1"
        );
        assert_eq!(canonical_host("127.0.0.1").unwrap(), "127.0.0.1");
        for bad in [
            "127.1",
            "2130706433",
            "0x7f000001",
            "0x7f.0.0.1",
            "127.000.0.1",
            "0177.0.0.1",
            "1.2.3.4.5",
            "017700000001",
        ] {
            assert!(
                matches!(canonical_host(bad), Err(HostError::NumericForm(_))),
                "{bad}: {:?}",
                canonical_host(bad)
            );
        }
        for bad in ["", "a b", "a..b", "evil/x", "x@y", "é.example"] {
            assert!(canonical_host(bad).is_err(), "{bad}");
        }
        assert!(canonical_host("0x.example").is_ok());
        assert!(canonical_host("123.example").is_ok());
    }

    #[test]
    fn authorities() {
        assert_eq!(split_authority("h:1"), Some(("h", Some(1))));
        assert_eq!(split_authority("[::1]:9"), Some(("::1", Some(9))));
        assert_eq!(split_authority("[::1]"), Some(("::1", None)));
        assert_eq!(split_authority("h"), Some(("h", None)));
        for bad in [
            "h:0", "h:65536", "h:", "h:+1", "::1:80", "[::1", "[::1]x", "[nope]:1",
        ] {
            assert!(split_authority(bad).and_then(|(_, p)| p).is_none(), "{bad}");
        }
        assert_eq!(
            dest("[::ffff:7f00:1]:80").to_string(),
            "[::ffff:127.0.0.1]:80"
        );
        assert!(
            Destination::parse_authority("h").is_err(),
            "the port is required"
        );
    }

    #[test]
    fn entries_match_exactly_or_by_subdomain() {
        let mut l = Allowlist::new();
        l.push(
            AllowEntry::parse("api.anthropic.com:443").unwrap(),
            "egress_allow",
        );
        l.push(
            AllowEntry::parse("*.corp.example:443").unwrap(),
            "egress_allow",
        );
        l.push(
            AllowEntry::parse("127.0.0.1:8080").unwrap(),
            "ANTHROPIC_BASE_URL",
        );
        assert!(l.find(&dest("API.anthropic.com:443")).is_some());
        assert!(l.find(&dest("api.anthropic.com:80")).is_none(), "port");
        assert!(l.find(&dest("a.corp.example:443")).is_some());
        assert!(l.find(&dest("corp.example:443")).is_none());
        assert!(l.find(&dest("evilcorp.example:443")).is_none());
        assert!(l.find(&dest("127.0.0.1:8080")).is_some());
        assert!(l.find(&dest("127.0.0.1:8081")).is_none(), "another port");
        assert!(l.find(&dest("[::ffff:127.0.0.1]:8080")).is_none());
        assert!(l.find(&dest("localhost:8080")).is_none());
        assert!(l.find(&dest("[::1]:8080")).is_none());
        assert_eq!(l.loopback_exact(), vec![sa("127.0.0.1:8080")]);
        assert!(AllowEntry::parse("*.10.0.0.1:1").is_err());
        assert!(AllowEntry::parse("api.example.com").is_err());
        assert!(AllowEntry::parse("127.1:80").is_err());
    }

    #[test]
    fn every_resolved_address_is_checked() {
        let exact = Matched {
            entry: AllowEntry::parse("llm.internal:443").unwrap(),
            source: "egress_allow".into(),
        };
        let wild = Matched {
            entry: AllowEntry::parse("*.example.com:443").unwrap(),
            source: "egress_allow".into(),
        };
        let d = dest("llm.internal:443");
        assert_eq!(
            check_addresses(&d, &exact, &[sa("10.0.0.5:443")]).unwrap(),
            sa("10.0.0.5:443"),
            "a name the operator wrote exactly may be private"
        );
        let d = dest("a.example.com:443");
        assert!(check_addresses(&d, &wild, &[sa("8.8.8.8:443")]).is_ok());
        for bad in [
            "127.0.0.1:443",
            "10.0.0.1:443",
            "169.254.169.254:443",
            "[::1]:443",
            "[::ffff:127.0.0.1]:443",
            "[64:ff9b::7f00:1]:443",
            "100.64.0.1:443",
        ] {
            assert!(
                check_addresses(&d, &wild, &[sa("8.8.8.8:443"), sa(bad)]).is_err(),
                "{bad}"
            );
            assert!(
                check_addresses(&d, &wild, &[sa(bad), sa("8.8.8.8:443")]).is_err(),
                "{bad}"
            );
        }
        for never in [
            "0.0.0.0:443",
            "[::]:443",
            "224.0.0.1:443",
            "[::ffff:0.0.0.0]:443",
        ] {
            assert!(
                check_addresses(&d, &exact, &[sa(never)]).is_err(),
                "{never}"
            );
        }
        assert!(check_addresses(&d, &exact, &[]).is_err());
    }
}
