//! `[auth]`: static bearer tokens and OIDC issuers (their algorithms, keys' addresses, claims
//! and limits), with the checks that keep two issuers' principals apart.
//!
//! Owns: what `[auth]` may say. Must never: verify a token (`auth.rs` and `oidc.rs` do), or
//! import anything of the gateway.

use super::*;

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
pub(super) fn check_groups(groups: &[String]) -> Result<(), String> {
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

impl GatewayConfig {
    /// `http.tls` and `[[auth.certs]]`: each entry names one certificate by exactly one of its
    /// SPIFFE ID or subject CN, once; entries only where client certificates are asked for.
    pub(super) fn validate_certs(&self, origin: &Origin) -> Result<(), ConfigError> {
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
    pub(super) fn validate_oidc(&self, origin: &Origin) -> Result<(), ConfigError> {
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
}
