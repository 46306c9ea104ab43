//! Bearer-token authentication and the Host allowlist.
//!
//! Tokens are held only as SHA-256 digests and compared in constant time against every entry (no
//! early exit), so neither the configuration nor the timing of a refusal reveals a token.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{GatewayConfig, url_host};

/// Why the token configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error(
        "no auth.tokens configured and the token file {path} cannot be read: {source} (run `warden up`, which generates it, or configure auth.tokens)"
    )]
    TokenFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {0} is readable by group or others; it must be mode 0600")]
    TokenFileMode(String),
    #[error("token file {0} holds a token shorter than 16 characters")]
    TokenTooShort(String),
}

type Entries = Vec<([u8; 32], String)>;

/// The accepted tokens. Clones share them: [`Authenticator::replace`] (a reload) changes
/// them for every front at once, each request reading one whole set.
#[derive(Clone)]
pub struct Authenticator {
    entries: std::sync::Arc<std::sync::RwLock<std::sync::Arc<Entries>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field(
                "principals",
                &self.entries().iter().map(|e| &e.1).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Hex SHA-256 of a token, as it goes into `auth.tokens[].sha256`.
pub fn token_digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token was presented but matches none.
    Invalid,
}

impl Authenticator {
    fn of(entries: Entries) -> Self {
        Self {
            entries: std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(entries))),
        }
    }

    fn entries(&self) -> std::sync::Arc<Entries> {
        match self.entries.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Makes every clone of this authenticator accept `next`'s tokens instead (a reload).
    pub fn replace(&self, next: &Authenticator) {
        let entries = next.entries();
        match self.entries.write() {
            Ok(mut g) => *g = entries,
            Err(p) => *p.into_inner() = entries,
        }
    }

    /// How many tokens are accepted, for the reload's log line.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// From `(principal, hex digest)` pairs; invalid digests are skipped (config validation
    /// rejects them before this).
    pub fn from_digests<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let entries = pairs
            .into_iter()
            .filter_map(|(principal, hexd)| {
                let bytes = hex::decode(hexd).ok()?;
                let arr: [u8; 32] = bytes.try_into().ok()?;
                Some((arr, principal.to_string()))
            })
            .collect();
        Self::of(entries)
    }

    /// From the configuration: `auth.tokens`, or when there are none, the token file.
    pub fn from_config(cfg: &GatewayConfig) -> Result<Self, AuthConfigError> {
        if !cfg.auth.tokens.is_empty() {
            return Ok(Self::from_digests(
                cfg.auth
                    .tokens
                    .iter()
                    .map(|t| (t.principal.as_str(), t.sha256.as_str())),
            ));
        }
        let Some(path) = cfg.token_file_path() else {
            return Ok(Self::of(Vec::new()));
        };
        let token = ensure_token_file(&path)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        Ok(Self::of(vec![(
            digest,
            cfg.auth.token_file_principal.clone(),
        )]))
    }

    /// The principal of the request's bearer token.
    pub fn authenticate(&self, headers: &http::HeaderMap) -> Result<String, AuthFailure> {
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err(AuthFailure::Missing);
        };
        let Ok(value) = value.to_str() else {
            return Err(AuthFailure::Invalid);
        };
        let Some((scheme, token)) = value.trim().split_once(' ') else {
            return Err(AuthFailure::Invalid);
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthFailure::Invalid);
        }
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        let mut found: Option<&str> = None;
        let entries = self.entries();
        for (d, principal) in entries.iter() {
            // Every entry is compared, whatever matched before, so timing reveals nothing.
            if bool::from(d.ct_eq(&digest)) && found.is_none() {
                found = Some(principal);
            }
        }
        found.map(str::to_string).ok_or(AuthFailure::Invalid)
    }
}

/// Reads the token file, generating a random one (mode 0600) when it does not exist yet.
pub fn ensure_token_file(path: &Path) -> Result<String, AuthConfigError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| AuthConfigError::TokenFile {
        path: path.display().to_string(),
        source,
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            let mut bytes = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut r| r.read_exact(&mut bytes))
                .map_err(err)?;
            f.write_all(format!("{}\n", hex::encode(bytes)).as_bytes())
                .map_err(err)?;
            tracing::info!(path = %path.display(), "generated a caller token");
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    read_token_file(path)
}

/// Reads the token file, refusing one that others could read.
pub fn read_token_file(path: &Path) -> Result<String, AuthConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|source| AuthConfigError::TokenFile {
        path: shown.clone(),
        source,
    })?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(AuthConfigError::TokenFileMode(shown));
    }
    let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::TokenFile {
        path: shown.clone(),
        source,
    })?;
    let token = text.trim().to_string();
    if token.len() < 16 {
        return Err(AuthConfigError::TokenTooShort(shown));
    }
    Ok(token)
}

/// The Host allowlist (active only when the listener is not loopback).
#[derive(Debug, Clone)]
pub struct HostAllowlist {
    hosts: Option<Vec<String>>,
}

impl HostAllowlist {
    /// Accepts every Host.
    pub fn off() -> Self {
        Self { hosts: None }
    }

    pub fn new(hosts: impl IntoIterator<Item = String>) -> Self {
        Self {
            hosts: Some(hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect()),
        }
    }

    pub fn from_config(cfg: &GatewayConfig) -> Self {
        if cfg.is_loopback() {
            return Self::off();
        }
        let mut hosts = cfg.http.allowed_hosts.clone();
        if let Some(h) = url_host(cfg.http.public_url.trim_end_matches('/')) {
            hosts.push(h.to_string());
        }
        Self::new(hosts)
    }

    /// True when `host` (the Host header) may be served. An entry without a port matches any
    /// port of that host.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        let Some(host) = host else {
            return false;
        };
        let host = host.trim().to_ascii_lowercase();
        let bare = strip_port(&host);
        hosts.iter().any(|h| *h == host || *h == bare)
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return match rest.find(']') {
            Some(i) => &host[..i + 2],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn tokens_map_to_principals_and_anything_else_is_refused() {
        let alice = "alice-token-0123456789";
        let bob = "bob-token-0123456789";
        let da = token_digest_hex(alice);
        let db = token_digest_hex(bob);
        let auth = Authenticator::from_digests([("alice", da.as_str()), ("bob", db.as_str())]);
        assert_eq!(
            auth.authenticate(&headers(Some(&format!("Bearer {alice}")))),
            Ok("alice".into())
        );
        assert_eq!(
            auth.authenticate(&headers(Some(&format!("bearer {bob}")))),
            Ok("bob".into())
        );
        assert_eq!(auth.authenticate(&headers(None)), Err(AuthFailure::Missing));
        for bad in [
            "Bearer".to_string(),
            "Bearer ".to_string(),
            format!("Basic {alice}"),
            format!("Bearer {alice}x"),
            format!("Bearer {}", &alice[..alice.len() - 1]),
            // The digest itself is not a token.
            format!("Bearer {da}"),
        ] {
            assert_eq!(
                auth.authenticate(&headers(Some(&bad))),
                Err(AuthFailure::Invalid),
                "{bad}"
            );
        }
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
        );
        assert_eq!(auth.authenticate(&h), Err(AuthFailure::Invalid));
    }

    #[test]
    fn the_token_file_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_token_file(&p),
            Err(AuthConfigError::TokenFileMode(_))
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_token_file(&p).unwrap(), "0123456789abcdef0123");
        std::fs::write(&p, "short").unwrap();
        assert!(matches!(
            read_token_file(&p),
            Err(AuthConfigError::TokenTooShort(_))
        ));
        assert!(matches!(
            read_token_file(&dir.path().join("missing")),
            Err(AuthConfigError::TokenFile { .. })
        ));
        // A missing file is generated private and random, and then kept.
        let g = dir.path().join("generated");
        let t1 = ensure_token_file(&g).unwrap();
        assert_eq!(t1.len(), 64);
        assert_eq!(
            std::fs::metadata(&g).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(ensure_token_file(&g).unwrap(), t1);
        assert_ne!(ensure_token_file(&dir.path().join("other")).unwrap(), t1);
    }

    #[test]
    fn host_allowlist() {
        let a = HostAllowlist::new([
            "gw.example".to_string(),
            "10.0.0.5:8080".to_string(),
            "[::1]".to_string(),
        ]);
        assert!(a.allows(Some("gw.example")));
        assert!(a.allows(Some("GW.example:443")));
        assert!(a.allows(Some("10.0.0.5:8080")));
        assert!(!a.allows(Some("10.0.0.5:9090")));
        assert!(!a.allows(Some("10.0.0.5")));
        assert!(a.allows(Some("[::1]:8080")));
        assert!(!a.allows(Some("evil.example")));
        assert!(!a.allows(Some("gw.example.evil.example")));
        assert!(!a.allows(None));
        assert!(HostAllowlist::off().allows(None));
    }
}
