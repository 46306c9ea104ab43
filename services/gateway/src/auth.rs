//! Bearer-token and client-certificate authentication and the Host allowlist: the one place a
//! caller's identity is established, for every front (the edge in `serve.rs`, then each binding
//! and `/mcp`).
//!
//! Static tokens are held only as SHA-256 digests and compared in constant time against every
//! entry (no early exit), so neither the configuration nor the timing of a refusal reveals a
//! token. A token shaped as a JWT that matches none is verified against `[[auth.oidc]]`
//! (`oidc.rs`). A request without a token on a connection whose client certificate verified
//! (in the TLS handshake) is the caller `[[auth.certs]]` maps that certificate to, if any. The result is the request's [`Identity`] (principal, issuer, groups), which
//! travels with that request; nothing of it is kept here between requests.
//!
//! Must never: accept a token without a constant-time comparison or a verified signature, make
//! a caller of a certificate no `[[auth.certs]]` entry names, or answer a refusal without
//! counting its reason.

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
    #[error(transparent)]
    Oidc(#[from] crate::oidc::OidcConfigError),
}

/// One static token: its digest, principal and groups.
type Entries = Vec<([u8; 32], String, Vec<String>)>;

/// What a reload replaces whole: the static tokens, the issuers and the certificates' callers.
struct Accepted {
    entries: Entries,
    oidc: std::sync::Arc<crate::oidc::Issuers>,
    certs: Vec<crate::config::CertEntry>,
}

/// The accepted tokens. Clones share them: [`Authenticator::replace`] (a reload) changes
/// them for every front at once, each request reading one whole set.
#[derive(Clone)]
pub struct Authenticator {
    accepted: std::sync::Arc<std::sync::RwLock<std::sync::Arc<Accepted>>>,
}

/// Who a request is from. It travels with the request from the edge through its binding into
/// the core's access check (`core/access.rs`) and the turn it starts: a principal's groups are
/// what this request's token or certificate carried, never another request's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub principal: String,
    /// What vouched for it: the OIDC issuer, or `mtls:<SPIFFE ID>` / `mtls:CN=<name>` for a
    /// client certificate (None: a static token).
    pub issuer: Option<String>,
    pub groups: Vec<String>,
}

impl Identity {
    /// A principal with no issuer and no groups (a static token without groups).
    pub fn plain(principal: impl Into<String>) -> Self {
        Self {
            principal: principal.into(),
            issuer: None,
            groups: Vec::new(),
        }
    }
}

/// The client certificate of the connection a request came on (verified against
/// `http.tls.client_ca_file` in the handshake), put in its extensions by the edge.
#[derive(Debug, Clone)]
pub struct ConnCert(pub std::sync::Arc<warden_daemon::tls::CallerCert>);

/// An identity the edge (`serve.rs`) established for a request, carried in its extensions so
/// the binding that serves it does not verify the token again. Only this process inserts it.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Identity);

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.accepted();
        f.debug_struct("Authenticator")
            .field(
                "principals",
                &a.entries.iter().map(|e| &e.1).collect::<Vec<_>>(),
            )
            .field("oidc", &a.oidc)
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
    /// A token was presented but matches no static token (and is not a JWT).
    Invalid,
    /// A JWT was presented and refused.
    Token(crate::oidc::Reject),
    /// No token, and the connection's client certificate names no caller (`[[auth.certs]]`).
    Certificate,
}

impl AuthFailure {
    /// The `reason` label of `warden_gateway_auth_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Invalid => "invalid",
            AuthFailure::Token(r) => r.reason(),
            AuthFailure::Certificate => "certificate_unmapped",
        }
    }

    /// What the caller is told (every front says the same).
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => "authentication required: send Authorization: Bearer <token>",
            AuthFailure::Invalid => "the bearer token is not valid",
            AuthFailure::Token(r) => r.message(),
            AuthFailure::Certificate => {
                "the client certificate verified but names no caller of this gateway (auth.certs); send Authorization: Bearer <token>"
            }
        }
    }
}

impl Authenticator {
    fn of(entries: Entries) -> Self {
        Self::with(entries, crate::oidc::Issuers::none())
    }

    fn with(entries: Entries, oidc: crate::oidc::Issuers) -> Self {
        Self::with_certs(entries, oidc, Vec::new())
    }

    fn with_certs(
        entries: Entries,
        oidc: crate::oidc::Issuers,
        certs: Vec<crate::config::CertEntry>,
    ) -> Self {
        Self {
            accepted: std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(Accepted {
                entries,
                oidc: std::sync::Arc::new(oidc),
                certs,
            }))),
        }
    }

    fn accepted(&self) -> std::sync::Arc<Accepted> {
        match self.accepted.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Makes every clone of this authenticator accept `next`'s tokens and issuers instead (a
    /// reload; the issuers' keys are fetched again when first needed).
    pub fn replace(&self, next: &Authenticator) {
        let accepted = next.accepted();
        match self.accepted.write() {
            Ok(mut g) => *g = accepted,
            Err(p) => *p.into_inner() = accepted,
        }
    }

    /// How many static tokens are accepted, for the reload's log line.
    pub fn len(&self) -> usize {
        self.accepted().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// From `(principal, hex digest)` pairs; invalid digests are skipped (config validation
    /// rejects them before this).
    pub fn from_digests<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self::of(digests(pairs.into_iter().map(|(p, d)| (p, d, &[][..]))))
    }

    /// From the configuration: `auth.tokens`, or when there are none, the token file; and the
    /// `[[auth.oidc]]` issuers.
    pub fn from_config(cfg: &GatewayConfig) -> Result<Self, AuthConfigError> {
        let oidc = crate::oidc::Issuers::from_config(&cfg.auth)?;
        let certs = cfg.auth.certs.clone();
        if !cfg.auth.tokens.is_empty() {
            return Ok(Self::with_certs(
                digests(
                    cfg.auth
                        .tokens
                        .iter()
                        .map(|t| (t.principal.as_str(), t.sha256.as_str(), t.groups.as_slice())),
                ),
                oidc,
                certs,
            ));
        }
        let Some(path) = cfg.token_file_path() else {
            return Ok(Self::with_certs(Vec::new(), oidc, certs));
        };
        let token = ensure_token_file(&path)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        Ok(Self::with_certs(
            vec![(digest, cfg.auth.token_file_principal.clone(), Vec::new())],
            oidc,
            certs,
        ))
    }

    /// The caller of a request: the identity the edge established (see [`Authenticated`]), or
    /// else its bearer token's. A refusal is counted by reason.
    pub async fn authenticate_request(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Identity, AuthFailure> {
        if let Some(Authenticated(id)) = extensions.get::<Authenticated>() {
            return Ok(id.clone());
        }
        let cert = extensions.get::<ConnCert>().map(|c| &*c.0);
        let got = self.authenticate_with(headers, cert).await;
        if let Err(f) = got {
            crate::metrics::auth_refused(f.reason());
        }
        got
    }

    /// The caller of the request's bearer token: a static token, or a JWT of a configured
    /// issuer, with the groups it carries. Not counted (the front that
    /// answers the refusal counts it, through [`Authenticator::authenticate_request`]).
    pub async fn authenticate(&self, headers: &http::HeaderMap) -> Result<Identity, AuthFailure> {
        self.authenticate_with(headers, None).await
    }

    /// The caller of a request: its bearer token's when it sends one (a certificate then only
    /// carried the connection), else the caller `[[auth.certs]]` maps the connection's client
    /// certificate to. A verified certificate that maps to nothing is no caller
    /// ([`AuthFailure::Certificate`]): a certificate valid for a cell, or any other service of
    /// the same CA, does not sign anyone in unless it is mapped.
    pub async fn authenticate_with(
        &self,
        headers: &http::HeaderMap,
        cert: Option<&warden_daemon::tls::CallerCert>,
    ) -> Result<Identity, AuthFailure> {
        let accepted = self.accepted();
        let token = match (bearer(headers), cert) {
            (Err(AuthFailure::Missing), Some(cert)) => {
                return cert_caller(&accepted.certs, cert).ok_or(AuthFailure::Certificate);
            }
            (t, _) => t?,
        };
        if let Some((principal, groups)) = static_match(&accepted.entries, token) {
            return Ok(Identity {
                principal,
                issuer: None,
                groups,
            });
        }
        if accepted.oidc.is_empty() || !crate::oidc::Issuers::looks_like_jwt(token) {
            return Err(AuthFailure::Invalid);
        }
        let v = accepted
            .oidc
            .verify(token)
            .await
            .map_err(AuthFailure::Token)?;
        Ok(Identity {
            principal: v.principal,
            issuer: Some(v.issuer),
            groups: v.groups,
        })
    }
}

/// The caller `certs` maps `cert` to: the first entry naming one of its SPIFFE IDs or its
/// subject CN. Its "issuer" says which name matched (`mtls:spiffe://…`, `mtls:CN=…`).
fn cert_caller(
    certs: &[crate::config::CertEntry],
    cert: &warden_daemon::tls::CallerCert,
) -> Option<Identity> {
    certs.iter().find_map(|e| {
        let matched = match (&e.spiffe_id, &e.subject_cn) {
            (Some(id), _) if cert.spiffe_ids.contains(id) => id.clone(),
            (None, Some(cn)) if cert.subject_cn.as_ref() == Some(cn) => format!("CN={cn}"),
            _ => return None,
        };
        Some(Identity {
            principal: e.principal.clone(),
            issuer: Some(format!("mtls:{matched}")),
            groups: e.groups.clone(),
        })
    })
}

fn digests<'a>(pairs: impl Iterator<Item = (&'a str, &'a str, &'a [String])>) -> Entries {
    pairs
        .filter_map(|(principal, hexd, groups)| {
            let bytes = hex::decode(hexd).ok()?;
            let arr: [u8; 32] = bytes.try_into().ok()?;
            Some((arr, principal.to_string(), groups.to_vec()))
        })
        .collect()
}

/// The bearer token of the `Authorization` header.
fn bearer(headers: &http::HeaderMap) -> Result<&str, AuthFailure> {
    {
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
        Ok(token.trim())
    }
}

/// The static token `token` is, if any: its principal and groups.
fn static_match(entries: &Entries, token: &str) -> Option<(String, Vec<String>)> {
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let mut found: Option<&([u8; 32], String, Vec<String>)> = None;
    for e in entries.iter() {
        // Every entry is compared, whatever matched before, so timing reveals nothing.
        if bool::from(e.0.ct_eq(&digest)) && found.is_none() {
            found = Some(e);
        }
    }
    found.map(|e| (e.1.clone(), e.2.clone()))
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

    #[tokio::test]
    async fn tokens_map_to_principals_and_anything_else_is_refused() {
        let alice = "alice-token-0123456789";
        let bob = "bob-token-0123456789";
        let da = token_digest_hex(alice);
        let db = token_digest_hex(bob);
        let auth = Authenticator::from_digests([("alice", da.as_str()), ("bob", db.as_str())]);
        assert_eq!(
            auth.authenticate(&headers(Some(&format!("Bearer {alice}"))))
                .await
                .map(|i| i.principal),
            Ok("alice".into())
        );
        assert_eq!(
            auth.authenticate(&headers(Some(&format!("bearer {bob}"))))
                .await
                .map(|i| i.principal),
            Ok("bob".into())
        );
        assert_eq!(
            auth.authenticate(&headers(None)).await,
            Err(AuthFailure::Missing)
        );
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
                auth.authenticate(&headers(Some(&bad))).await,
                Err(AuthFailure::Invalid),
                "{bad}"
            );
        }
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
        );
        assert_eq!(auth.authenticate(&h).await, Err(AuthFailure::Invalid));
    }

    #[tokio::test]
    async fn a_static_token_carries_its_groups_and_a_jwt_without_issuers_is_invalid() {
        let tok = "carol-token-0123456789";
        let d = token_digest_hex(tok);
        let groups = vec!["ops".to_string()];
        let auth = Authenticator::of(digests(
            [("carol", d.as_str(), groups.as_slice())].into_iter(),
        ));
        let id = auth
            .authenticate(&headers(Some(&format!("Bearer {tok}"))))
            .await
            .unwrap();
        assert_eq!(id.groups, groups);
        assert_eq!(id.issuer, None);
        // Shaped as a JWT, but no issuer is configured: an invalid static token.
        assert_eq!(
            auth.authenticate(&headers(Some("Bearer aaa.bbb.ccc")))
                .await,
            Err(AuthFailure::Invalid)
        );
    }

    #[tokio::test]
    async fn a_client_certificate_is_a_caller_only_when_mapped_and_a_token_wins() {
        use warden_daemon::tls::CallerCert;
        let tok = "erin-token-0123456789";
        let d = token_digest_hex(tok);
        let certs = vec![
            crate::config::CertEntry {
                spiffe_id: Some("spiffe://example.org/ci/builder".into()),
                subject_cn: None,
                principal: "ci".into(),
                groups: vec!["builders".into()],
            },
            crate::config::CertEntry {
                spiffe_id: None,
                subject_cn: Some("laptop-of-frank".into()),
                principal: "frank".into(),
                groups: vec![],
            },
        ];
        let auth = Authenticator::with_certs(
            digests([("erin", d.as_str(), &[][..])].into_iter()),
            crate::oidc::Issuers::none(),
            certs,
        );
        let builder = CallerCert {
            spiffe_ids: vec!["spiffe://example.org/ci/builder".into()],
            subject_cn: Some("whatever".into()),
        };
        let id = auth
            .authenticate_with(&headers(None), Some(&builder))
            .await
            .unwrap();
        assert_eq!(id.principal, "ci");
        assert_eq!(id.groups, ["builders"]);
        assert_eq!(
            id.issuer.as_deref(),
            Some("mtls:spiffe://example.org/ci/builder")
        );
        let laptop = CallerCert {
            spiffe_ids: vec![],
            subject_cn: Some("laptop-of-frank".into()),
        };
        let id = auth
            .authenticate_with(&headers(None), Some(&laptop))
            .await
            .unwrap();
        assert_eq!(
            (id.principal.as_str(), id.issuer.as_deref()),
            ("frank", Some("mtls:CN=laptop-of-frank"))
        );
        // A cell's certificate (same CA, a SPIFFE ID nobody mapped) signs no one in; neither
        // does a CN that only looks like a mapped SPIFFE ID.
        for unmapped in [
            CallerCert {
                spiffe_ids: vec!["spiffe://example.org/warden/supervisor".into()],
                subject_cn: None,
            },
            CallerCert {
                spiffe_ids: vec![],
                subject_cn: Some("spiffe://example.org/ci/builder".into()),
            },
        ] {
            assert_eq!(
                auth.authenticate_with(&headers(None), Some(&unmapped))
                    .await,
                Err(AuthFailure::Certificate)
            );
        }
        // A bearer token decides when one is sent, with or without a certificate; a bad one is
        // refused even on a mapped certificate's connection.
        let id = auth
            .authenticate_with(&headers(Some(&format!("Bearer {tok}"))), Some(&builder))
            .await
            .unwrap();
        assert_eq!(id.principal, "erin");
        assert_eq!(
            auth.authenticate_with(&headers(Some("Bearer nope-nope-nope")), Some(&builder))
                .await,
            Err(AuthFailure::Invalid)
        );
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
