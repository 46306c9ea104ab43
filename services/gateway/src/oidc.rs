//! OpenID Connect / JWT bearer tokens (`[[auth.oidc]]`): which issuer a token claims, that
//! issuer's signing keys (discovery or a configured JWKS URL, cached, fetched again for an
//! unknown `kid` at most once per interval per issuer), and the signature, `iss`, `aud`, `exp`
//! and `nbf` checked by the `jsonwebtoken` crate; then the configured claim, with the issuer's
//! prefix, is the principal, and the groups claim its groups.
//!
//! Owns: the key caches and their fetches, the verification and the reason a token is refused.
//! Must never: accept `none` or a symmetric algorithm, let a token choose a key of another
//! issuer or family, wait on a key fetch without a bound, read an answer past its size limit,
//! or drop cached keys because a fetch failed.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::config::{AuthSection, OidcIssuerConfig};
pub use crate::config::{check_fetch_url, parse_algorithm};

/// Largest discovery document or JWKS read (a real one is a few KiB).
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// Most keys kept of one JWKS.
const MAX_KEYS: usize = 64;
/// Most groups taken from one token, and the longest group name or principal value.
const MAX_GROUPS: usize = 256;
const MAX_NAME: usize = 512;

/// Why a JWT was refused: the `reason` label of the refusal metric and the 401's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Longer than `auth.max_token_bytes`.
    TooLarge,
    /// Not a JWS compact serialisation, or its header or claims are not JSON.
    Malformed,
    /// `iss` names no configured issuer.
    UnknownIssuer,
    /// `alg` is not one of the issuer's algorithms, or not the key's.
    Algorithm,
    /// No key of the issuer has the token's `kid`, even after fetching them again.
    UnknownKey,
    /// The issuer's keys could not be fetched and none are cached.
    KeysUnavailable,
    /// The signature does not verify.
    Signature,
    /// Past `exp` (plus the leeway).
    Expired,
    /// Before `nbf` (minus the leeway).
    NotYetValid,
    /// `aud` names none of the issuer's audiences.
    Audience,
    /// A required claim is missing or of the wrong type (`exp`, `aud`, the principal claim, an
    /// unverified email).
    Claims,
}

impl Reject {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Reject::TooLarge => "too_large",
            Reject::Malformed => "malformed",
            Reject::UnknownIssuer => "unknown_issuer",
            Reject::Algorithm => "algorithm",
            Reject::UnknownKey => "unknown_key",
            Reject::KeysUnavailable => "keys_unavailable",
            Reject::Signature => "signature",
            Reject::Expired => "expired",
            Reject::NotYetValid => "not_yet_valid",
            Reject::Audience => "audience",
            Reject::Claims => "claims",
        }
    }

    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            Reject::TooLarge => "the bearer token is larger than this gateway accepts",
            Reject::Malformed => "the bearer token is not a well-formed JWT",
            Reject::UnknownIssuer => "the token's issuer (iss) is not one this gateway trusts",
            Reject::Algorithm => "the token's signature algorithm (alg) is not accepted",
            Reject::UnknownKey => "the token's signing key (kid) is not one of its issuer's keys",
            Reject::KeysUnavailable => "the token's issuer's signing keys cannot be fetched now",
            Reject::Signature => "the token's signature does not verify",
            Reject::Expired => "the token has expired (exp)",
            Reject::NotYetValid => "the token is not valid yet (nbf)",
            Reject::Audience => "the token's audience (aud) is not this gateway",
            Reject::Claims => "the token lacks a required claim or has one of the wrong type",
        }
    }
}

/// A verified token's caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The prefix and the claim's value.
    pub principal: String,
    pub issuer: String,
    /// Each with the issuer's prefix.
    pub groups: Vec<String>,
    /// `exp`, seconds since the epoch.
    pub expires: u64,
}

/// Seconds since the epoch (`exp` is compared with this).
pub fn now_secs() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Fetch settings shared by every issuer.
#[derive(Debug, Clone)]
struct Limits {
    timeout: Duration,
    refresh_interval: Duration,
    max_age: Duration,
}

/// One issuer's keys as last fetched.
#[derive(Default)]
struct Keys {
    keys: Vec<CachedKey>,
    /// The last fetch that succeeded.
    fetched: Option<Instant>,
    /// The last fetch tried, succeeded or not (the rate limit).
    attempted: Option<Instant>,
    /// The JWKS URL discovery found.
    jwks_url: Option<String>,
}

struct CachedKey {
    kid: Option<String>,
    /// The JWK's own `alg`, when it names one: then only that algorithm verifies with it.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

struct Issuer {
    cfg: OidcIssuerConfig,
    prefix: String,
    algorithms: Vec<Algorithm>,
    tls: Arc<rustls::ClientConfig>,
    keys: RwLock<Keys>,
    /// One fetch at a time per issuer: callers with the same unknown `kid` share it.
    fetching: tokio::sync::Mutex<()>,
    limits: Limits,
}

/// Every configured issuer, and the token size limit.
pub struct Issuers {
    issuers: Vec<Arc<Issuer>>,
    max_token_bytes: usize,
}

impl std::fmt::Debug for Issuers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.issuers.iter().map(|i| &i.cfg.issuer))
            .finish()
    }
}

/// Why the issuers cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum OidcConfigError {
    #[error("auth.oidc issuer {issuer}: {why}")]
    Issuer { issuer: String, why: String },
}

/// The claims read before the signature is checked, only to choose the issuer (the signature
/// and `iss` are then verified with that issuer's keys).
#[derive(serde::Deserialize)]
struct Routing {
    iss: Option<String>,
}

impl Issuers {
    pub fn from_config(auth: &AuthSection) -> Result<Self, OidcConfigError> {
        // The process's JOSE backend: the pure-Rust one, unless something installed another.
        if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
            let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
        }
        let limits = Limits {
            timeout: Duration::from_millis(auth.jwks_timeout_ms),
            refresh_interval: Duration::from_secs(auth.jwks_refresh_interval_secs),
            max_age: Duration::from_secs(auth.jwks_max_age_secs),
        };
        let issuers = auth
            .oidc
            .iter()
            .map(|cfg| {
                let err = |why: String| OidcConfigError::Issuer {
                    issuer: cfg.issuer.clone(),
                    why,
                };
                let algorithms = cfg
                    .algorithms
                    .iter()
                    .map(|a| parse_algorithm(a))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?;
                let tls = crate::push::tls_config(cfg.ca_file.as_deref()).map_err(err)?;
                Ok(Arc::new(Issuer {
                    prefix: cfg.prefix(),
                    cfg: cfg.clone(),
                    algorithms,
                    tls,
                    keys: RwLock::new(Keys::default()),
                    fetching: tokio::sync::Mutex::new(()),
                    limits: limits.clone(),
                }))
            })
            .collect::<Result<_, OidcConfigError>>()?;
        Ok(Self {
            issuers,
            max_token_bytes: auth.max_token_bytes,
        })
    }

    /// No issuer: only static tokens are accepted.
    pub fn none() -> Self {
        Self {
            issuers: Vec::new(),
            max_token_bytes: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The discovery URL of each issuer configured without a JWKS URL, and the issuer (for the
    /// card's `openIdConnect` schemes).
    pub fn discovery_urls(auth: &AuthSection) -> Vec<(String, String)> {
        auth.oidc
            .iter()
            .map(|o| (o.issuer.clone(), discovery_url(&o.issuer)))
            .collect()
    }

    /// Whether `token` is shaped as a JWS (three base64url parts): only such a token is
    /// verified here; anything else is a static token or nothing.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }

    /// Verifies `token`: its issuer's key, signature, `iss`, `aud`, `exp`, `nbf`, then the
    /// principal and groups claims.
    pub async fn verify(&self, token: &str) -> Result<Verified, Reject> {
        if token.len() > self.max_token_bytes {
            return Err(Reject::TooLarge);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| {
            // `none` and other names the crate does not know are not JSON it reads into a
            // header: tell them apart from a token that is not a JWT at all.
            if header_alg(token).is_some_and(|a| a.parse::<Algorithm>().is_err()) {
                Reject::Algorithm
            } else {
                Reject::Malformed
            }
        })?;
        let routing: Routing = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|_| Reject::Malformed)?;
        let iss = routing.iss.ok_or(Reject::Claims)?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.cfg.issuer == iss)
            .ok_or(Reject::UnknownIssuer)?;
        if !issuer.algorithms.contains(&header.alg) {
            return Err(Reject::Algorithm);
        }
        let key = issuer.key_for(header.kid.as_deref(), header.alg).await?;
        issuer.check(token, header.alg, &key)
    }
}

/// The `alg` a token's header names, read without trusting anything else of it (only to say
/// why an unreadable header was refused).
fn header_alg(token: &str) -> Option<String> {
    use base64::Engine;
    let head = token.split('.').next()?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("alg")?.as_str().map(str::to_string)
}

fn discovery_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

impl Issuer {
    fn keys(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let keys = self.keys();
        let usable =
            |k: &&CachedKey| k.key.family() == alg.family() && k.alg.is_none_or(|a| a == alg);
        match kid {
            Some(kid) => keys
                .keys
                .iter()
                .filter(usable)
                .find(|k| k.kid.as_deref() == Some(kid))
                .map(|k| k.key.clone()),
            // Without a `kid` the token names no key: only an issuer with a single key of
            // that family can be meant.
            None => {
                let mut it = keys.keys.iter().filter(usable);
                match (it.next(), it.next()) {
                    (Some(k), None) => Some(k.key.clone()),
                    _ => None,
                }
            }
        }
    }

    /// The key for `kid`: cached, or after one fetch (unless the issuer's keys were fetched
    /// within the refresh interval), else refused.
    async fn key_for(
        self: &Arc<Self>,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<DecodingKey, Reject> {
        if let Some(k) = self.find(kid, alg) {
            let stale = {
                let keys = self.keys();
                keys.fetched
                    .is_some_and(|t| t.elapsed() > self.limits.max_age)
                    && keys
                        .attempted
                        .is_none_or(|t| t.elapsed() >= self.limits.refresh_interval)
            };
            if stale {
                // Old keys keep working while fresh ones are fetched in the background.
                let me = self.clone();
                tokio::spawn(async move {
                    let _ = me.refresh().await;
                });
            }
            return Ok(k);
        }
        let fetched = self.refresh().await;
        if let Some(k) = self.find(kid, alg) {
            return Ok(k);
        }
        let none_cached = self.keys().fetched.is_none();
        match fetched {
            Err(_) if none_cached => Err(Reject::KeysUnavailable),
            _ => Err(Reject::UnknownKey),
        }
    }

    /// Fetches the keys again unless a fetch was tried within the refresh interval (by this or
    /// any other caller); a failure keeps the cached keys.
    async fn refresh(&self) -> Result<(), String> {
        let _one = self.fetching.lock().await;
        {
            let keys = self.keys();
            if keys
                .attempted
                .is_some_and(|t| t.elapsed() < self.limits.refresh_interval)
            {
                return Ok(());
            }
        }
        {
            let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
            keys.attempted = Some(Instant::now());
        }
        let got = tokio::time::timeout(self.limits.timeout, self.fetch_keys())
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {:?} (auth.jwks_timeout_ms)",
                    self.limits.timeout
                ))
            });
        match got {
            Ok((url, fresh)) => {
                tracing::info!(issuer = %self.cfg.issuer, keys = fresh.len(), "fetched the issuer's signing keys");
                let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
                keys.keys = fresh;
                keys.fetched = Some(Instant::now());
                keys.jwks_url = Some(url);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(issuer = %self.cfg.issuer, error = %e, "cannot fetch the issuer's signing keys; the cached ones stay");
                Err(e)
            }
        }
    }

    /// Discovery (unless a JWKS URL is configured or already discovered), then the JWKS.
    async fn fetch_keys(&self) -> Result<(String, Vec<CachedKey>), String> {
        let known = self
            .cfg
            .jwks_url
            .clone()
            .or_else(|| self.keys().jwks_url.clone());
        let url = match known {
            Some(u) => u,
            None => {
                let url = discovery_url(&self.cfg.issuer);
                let doc = fetch_json(&url, &self.tls).await?;
                // OpenID Connect Discovery 1.0 §4.3: the document's issuer must be the one asked.
                if doc.get("issuer").and_then(Value::as_str) != Some(self.cfg.issuer.as_str()) {
                    return Err(format!("{url}: its issuer is not {}", self.cfg.issuer));
                }
                let jwks = doc
                    .get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{url}: no jwks_uri"))?;
                check_fetch_url(jwks)?;
                jwks.to_string()
            }
        };
        let doc = fetch_json(&url, &self.tls).await?;
        let keys = parse_jwks(&doc).map_err(|e| format!("{url}: {e}"))?;
        Ok((url, keys))
    }

    /// Signature and claims, then the caller's principal and groups.
    fn check(&self, token: &str, alg: Algorithm, key: &DecodingKey) -> Result<Verified, Reject> {
        use jsonwebtoken::errors::ErrorKind as K;
        let mut v = Validation::new(alg);
        v.leeway = self.cfg.leeway_secs;
        v.validate_nbf = true;
        v.set_issuer(&[self.cfg.issuer.as_str()]);
        v.set_audience(&self.cfg.audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, key, &v).map_err(
            |e| match e.kind() {
                K::ExpiredSignature => Reject::Expired,
                K::ImmatureSignature => Reject::NotYetValid,
                K::InvalidAudience => Reject::Audience,
                K::InvalidIssuer => Reject::UnknownIssuer,
                K::InvalidSignature => Reject::Signature,
                K::InvalidAlgorithm | K::InvalidAlgorithmName | K::UnsupportedAlgorithm => {
                    Reject::Algorithm
                }
                K::MissingRequiredClaim(_) | K::InvalidClaimFormat(_) => Reject::Claims,
                K::InvalidEcdsaKey | K::InvalidEddsaKey | K::InvalidRsaKey(_) => Reject::Signature,
                _ => Reject::Malformed,
            },
        )?;
        let claims = data.claims;
        let name = |v: &Value| {
            v.as_str()
                .filter(|s| {
                    !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control)
                })
                .map(str::to_string)
        };
        let value = claims
            .get(&self.cfg.principal_claim)
            .and_then(name)
            .ok_or(Reject::Claims)?;
        if self.cfg.principal_claim == "email"
            && claims.get("email_verified").and_then(Value::as_bool) == Some(false)
        {
            return Err(Reject::Claims);
        }
        let groups = match self.cfg.groups_claim.as_ref().and_then(|c| claims.get(c)) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(_)) => claims
                .get(self.cfg.groups_claim.as_deref().unwrap_or_default())
                .and_then(name)
                .into_iter()
                .collect(),
            Some(Value::Array(a)) if a.len() <= MAX_GROUPS => a
                .iter()
                .map(name)
                .collect::<Option<Vec<_>>>()
                .ok_or(Reject::Claims)?,
            Some(_) => return Err(Reject::Claims),
        };
        let expires = claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or(Reject::Claims)?;
        Ok(Verified {
            principal: format!("{}{value}", self.prefix),
            issuer: self.cfg.issuer.clone(),
            groups: groups
                .into_iter()
                .map(|g| format!("{}{g}", self.prefix))
                .collect(),
            expires,
        })
    }
}

/// The signature keys of a JWKS document: asymmetric keys whose `use` is `sig` or unset; any
/// other key, or one this crate cannot read, is skipped. A document without a `keys` array,
/// or without one usable key, is refused (the cached keys stay).
fn parse_jwks(doc: &Value) -> Result<Vec<CachedKey>, String> {
    let list = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("not a JWKS (no \"keys\" array)")?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for k in list.iter().take(MAX_KEYS) {
        let Ok(jwk) = serde_json::from_value::<Jwk>(k.clone()) else {
            continue;
        };
        if matches!(
            jwk.algorithm,
            AlgorithmParameters::OctetKey(_) | AlgorithmParameters::Other(_)
        ) {
            continue;
        }
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            continue;
        }
        let alg = match &jwk.common.key_algorithm {
            None => None,
            Some(a) => match parse_algorithm(&a.to_string()) {
                Ok(a) => Some(a),
                Err(_) => continue,
            },
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        if let Some(kid) = &jwk.common.key_id
            && !seen.insert(kid.clone())
        {
            // Two keys under one `kid`: which one a token means is ambiguous; keep the first.
            continue;
        }
        out.push(CachedKey {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
        });
    }
    if out.is_empty() {
        return Err("no usable signature key".into());
    }
    Ok(out)
}

/// GETs `url` and parses its JSON body: status 200, at most [`MAX_DOCUMENT_BYTES`]. The caller
/// bounds the time.
async fn fetch_json(url: &str, tls: &Arc<rustls::ClientConfig>) -> Result<Value, String> {
    use http_body_util::BodyExt;
    let u = warden_egress::HttpUrl::parse(url)?;
    let tcp = tokio::net::TcpStream::connect((u.host.as_str(), u.port))
        .await
        .map_err(|e| format!("connect {}: {e}", u.authority))?;
    let req = http::Request::builder()
        .method(http::Method::GET)
        .uri(u.target.as_str())
        .header(http::header::HOST, u.authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, "warden-gateway")
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let resp = if u.tls {
        let name = rustls::pki_types::ServerName::try_from(u.host.clone())
            .map_err(|e| format!("{} is not a TLS server name: {e}", u.host))?;
        let io = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", u.host))?;
        send(io, req).await?
    } else {
        send(tcp, req).await?
    };
    if resp.status() != http::StatusCode::OK {
        return Err(format!("{url} answered {}", resp.status()));
    }
    let body = http_body_util::Limited::new(resp.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("{url}: {e} (at most {MAX_DOCUMENT_BYTES} bytes)"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}

async fn send<IO>(
    io: IO,
    req: http::Request<http_body_util::Empty<axum::body::Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(conn);
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("GET: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A private key made by the openssl CLI (PEM), once per test binary.
    fn openssl_key(args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    struct Keys3 {
        rsa: EncodingKey,
        rsa_other: EncodingKey,
        ec: EncodingKey,
    }

    fn keys() -> &'static Keys3 {
        static K: std::sync::OnceLock<Keys3> = std::sync::OnceLock::new();
        K.get_or_init(|| {
            let rsa = [
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ];
            let ec = [
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ];
            Keys3 {
                rsa: EncodingKey::from_rsa_pem(&openssl_key(&rsa)).unwrap(),
                rsa_other: EncodingKey::from_rsa_pem(&openssl_key(&rsa)).unwrap(),
                ec: EncodingKey::from_ec_pem(&openssl_key(&ec)).unwrap(),
            }
        })
    }

    fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Value {
        let mut j = Jwk::from_encoding_key(key, alg).unwrap();
        j.common.key_id = Some(kid.into());
        serde_json::to_value(j).unwrap()
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Serve,
        Garbage,
        Hang,
        Huge,
    }

    /// A real HTTP issuer on loopback: discovery and a JWKS whose content and behaviour the
    /// test changes; counts the JWKS fetches.
    struct Idp {
        issuer: String,
        jwks: Mutex<Value>,
        mode: Mutex<Mode>,
        hits: AtomicUsize,
    }

    async fn idp(keys: Vec<Value>) -> Arc<Idp> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let idp = Arc::new(Idp {
            issuer,
            jwks: Mutex::new(json!({ "keys": keys })),
            mode: Mutex::new(Mode::Serve),
            hits: AtomicUsize::new(0),
        });
        let s1 = idp.clone();
        let s2 = idp.clone();
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || {
                    let s = s1.clone();
                    async move {
                        axum::Json(
                            json!({"issuer": s.issuer, "jwks_uri": format!("{}/jwks", s.issuer)}),
                        )
                    }
                }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    let s = s2.clone();
                    async move {
                        s.hits.fetch_add(1, Ordering::SeqCst);
                        let mode = *s.mode.lock().unwrap();
                        match mode {
                            Mode::Serve => s.jwks.lock().unwrap().to_string(),
                            Mode::Garbage => "<html>not a key set</html>".to_string(),
                            Mode::Hang => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                                String::new()
                            }
                            Mode::Huge => format!(
                                "{{\"keys\":[],\"pad\":\"{}\"}}",
                                "x".repeat(MAX_DOCUMENT_BYTES + 1)
                            ),
                        }
                    }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        idp
    }

    fn issuers(idp: &Idp, tweak: impl FnOnce(&mut OidcIssuerConfig, &mut AuthSection)) -> Issuers {
        let mut auth: AuthSection = toml::from_str("").unwrap();
        let mut o = OidcIssuerConfig {
            issuer: idp.issuer.clone(),
            audiences: vec!["warden".into()],
            jwks_url: None,
            algorithms: vec!["RS256".into(), "ES256".into()],
            principal_claim: "sub".into(),
            principal_prefix: None,
            groups_claim: Some("groups".into()),
            ca_file: None,
            leeway_secs: 30,
        };
        auth.jwks_timeout_ms = 500;
        auth.jwks_refresh_interval_secs = 3600;
        tweak(&mut o, &mut auth);
        auth.oidc = vec![o];
        Issuers::from_config(&auth).unwrap()
    }

    fn claims(idp: &Idp) -> serde_json::Map<String, Value> {
        let now = now_secs();
        json!({
            "iss": idp.issuer, "aud": "warden", "sub": "alice", "exp": now + 600,
            "iat": now, "nbf": now - 5, "groups": ["eng", "ops"], "email": "alice@example.com",
        })
        .as_object()
        .unwrap()
        .clone()
    }

    fn sign(
        alg: Algorithm,
        kid: Option<&str>,
        claims: &serde_json::Map<String, Value>,
        key: &EncodingKey,
    ) -> String {
        let mut h = Header::new(alg);
        h.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&h, claims, key).unwrap()
    }

    fn with(
        mut c: serde_json::Map<String, Value>,
        k: &str,
        v: Value,
    ) -> serde_json::Map<String, Value> {
        c.insert(k.into(), v);
        c
    }

    #[tokio::test]
    async fn a_signed_token_of_the_issuer_is_its_prefixed_subject_with_prefixed_groups() {
        let k = keys();
        let idp = idp(vec![
            jwk(&k.rsa, Algorithm::RS256, "r1"),
            jwk(&k.ec, Algorithm::ES256, "e1"),
        ])
        .await;
        let iss = issuers(&idp, |_, _| {});
        let v = iss
            .verify(&sign(Algorithm::RS256, Some("r1"), &claims(&idp), &k.rsa))
            .await
            .unwrap();
        assert_eq!(v.principal, format!("{}#alice", idp.issuer));
        assert_eq!(
            v.groups,
            vec![format!("{}#eng", idp.issuer), format!("{}#ops", idp.issuer)]
        );
        assert_eq!(v.issuer, idp.issuer);
        let v = iss
            .verify(&sign(Algorithm::ES256, Some("e1"), &claims(&idp), &k.ec))
            .await
            .unwrap();
        assert_eq!(v.principal, format!("{}#alice", idp.issuer));
        // One fetch served both: keys are cached.
        assert_eq!(idp.hits.load(Ordering::SeqCst), 1);
        // `aud` as a list naming this gateway among others is accepted too.
        let c = with(claims(&idp), "aud", json!(["other", "warden"]));
        assert!(
            iss.verify(&sign(Algorithm::RS256, Some("r1"), &c, &k.rsa))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn email_as_the_principal_must_not_be_unverified() {
        let k = keys();
        let idp = idp(vec![jwk(&k.rsa, Algorithm::RS256, "r1")]).await;
        let iss = issuers(&idp, |o, _| {
            o.principal_claim = "email".into();
            o.principal_prefix = Some("corp:".into());
        });
        let v = iss
            .verify(&sign(Algorithm::RS256, Some("r1"), &claims(&idp), &k.rsa))
            .await
            .unwrap();
        assert_eq!(v.principal, "corp:alice@example.com");
        let c = with(claims(&idp), "email_verified", json!(false));
        assert_eq!(
            iss.verify(&sign(Algorithm::RS256, Some("r1"), &c, &k.rsa))
                .await,
            Err(Reject::Claims)
        );
        let mut c = claims(&idp);
        c.remove("email");
        assert_eq!(
            iss.verify(&sign(Algorithm::RS256, Some("r1"), &c, &k.rsa))
                .await,
            Err(Reject::Claims)
        );
    }

    #[tokio::test]
    async fn time_audience_issuer_and_shape_are_each_refused_with_their_reason() {
        let k = keys();
        let idp = idp(vec![jwk(&k.rsa, Algorithm::RS256, "r1")]).await;
        let iss = issuers(&idp, |_, _| {});
        let now = now_secs();
        let t = |c: serde_json::Map<String, Value>| sign(Algorithm::RS256, Some("r1"), &c, &k.rsa);
        let cases: Vec<(&str, String, Reject)> = vec![
            (
                "expired",
                t(with(claims(&idp), "exp", json!(now - 120))),
                Reject::Expired,
            ),
            (
                "not yet valid",
                t(with(claims(&idp), "nbf", json!(now + 120))),
                Reject::NotYetValid,
            ),
            (
                "wrong audience",
                t(with(claims(&idp), "aud", json!("someone-else"))),
                Reject::Audience,
            ),
            (
                "unknown issuer",
                t(with(claims(&idp), "iss", json!("https://evil.example"))),
                Reject::UnknownIssuer,
            ),
            (
                "no exp",
                {
                    let mut c = claims(&idp);
                    c.remove("exp");
                    t(c)
                },
                Reject::Claims,
            ),
            (
                "no aud",
                {
                    let mut c = claims(&idp);
                    c.remove("aud");
                    t(c)
                },
                Reject::Claims,
            ),
            (
                "no sub",
                {
                    let mut c = claims(&idp);
                    c.remove("sub");
                    t(c)
                },
                Reject::Claims,
            ),
            (
                "groups not strings",
                t(with(claims(&idp), "groups", json!([1, 2]))),
                Reject::Claims,
            ),
            (
                "groups an object",
                t(with(claims(&idp), "groups", json!({"admins": true}))),
                Reject::Claims,
            ),
            (
                "more groups than are kept",
                t(with(
                    claims(&idp),
                    "groups",
                    json!(
                        (0..=MAX_GROUPS)
                            .map(|i| format!("g{i}"))
                            .collect::<Vec<_>>()
                    ),
                )),
                Reject::Claims,
            ),
            ("not a JWT", "abc.def.ghi".to_string(), Reject::Malformed),
            (
                "too large",
                format!("{}.{}.x", "a".repeat(5000), "b".repeat(5000)),
                Reject::TooLarge,
            ),
        ];
        for (what, token, want) in cases {
            assert_eq!(iss.verify(&token).await, Err(want), "{what}");
        }
        // Within the leeway (30 s) a just-expired or almost-valid token is accepted.
        assert!(
            iss.verify(&t(with(claims(&idp), "exp", json!(now - 10))))
                .await
                .is_ok()
        );
        assert!(
            iss.verify(&t(with(claims(&idp), "nbf", json!(now + 10))))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn algorithm_confusion_none_and_foreign_signatures_are_refused() {
        use base64::Engine;
        let k = keys();
        let idp = idp(vec![
            jwk(&k.rsa, Algorithm::RS256, "r1"),
            jwk(&k.ec, Algorithm::ES256, "e1"),
        ])
        .await;
        let iss = issuers(&idp, |o, _| o.algorithms = vec!["RS256".into()]);
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let body = b64(&Value::Object(claims(&idp)));
        // alg none, with or without a signature.
        let none = format!("{}.{body}.", b64(&json!({"alg": "none", "kid": "r1"})));
        assert_eq!(iss.verify(&none).await, Err(Reject::Algorithm));
        // HS256 "signed" with the issuer's public RSA key as the HMAC secret (the classic
        // confusion): refused before any key is used.
        let public_n = jwk(&k.rsa, Algorithm::RS256, "r1")["n"]
            .as_str()
            .unwrap()
            .to_string();
        let hs = sign(
            Algorithm::HS256,
            Some("r1"),
            &claims(&idp),
            &EncodingKey::from_secret(public_n.as_bytes()).unwrap(),
        );
        assert_eq!(iss.verify(&hs).await, Err(Reject::Algorithm));
        // ES256 is a real key of the issuer, but not an algorithm this gateway accepts for it.
        let es = sign(Algorithm::ES256, Some("e1"), &claims(&idp), &k.ec);
        assert_eq!(iss.verify(&es).await, Err(Reject::Algorithm));
        // RS256 naming the EC key's kid: that key cannot verify RS256.
        let iss2 = issuers(&idp, |_, _| {});
        let mixed = sign(Algorithm::RS256, Some("e1"), &claims(&idp), &k.rsa);
        assert_eq!(iss2.verify(&mixed).await, Err(Reject::UnknownKey));
        // Signed by another key under the issuer's kid.
        let forged = sign(Algorithm::RS256, Some("r1"), &claims(&idp), &k.rsa_other);
        assert_eq!(iss2.verify(&forged).await, Err(Reject::Signature));
        // A signature from one token on another's claims.
        let good = sign(Algorithm::RS256, Some("r1"), &claims(&idp), &k.rsa);
        let other = sign(
            Algorithm::RS256,
            Some("r1"),
            &with(claims(&idp), "sub", json!("mallory")),
            &k.rsa,
        );
        let swapped = format!(
            "{}.{}.{}",
            good.split('.').next().unwrap(),
            other.split('.').nth(1).unwrap(),
            good.split('.').nth(2).unwrap()
        );
        assert_eq!(iss2.verify(&swapped).await, Err(Reject::Signature));
        // The configuration refuses symmetric algorithms and `none` outright.
        assert!(parse_algorithm("HS256").is_err());
        assert!(parse_algorithm("none").is_err());
        assert!(parse_algorithm("RS256").is_ok());
    }

    #[tokio::test]
    async fn an_unknown_kid_fetches_the_keys_once_per_interval_and_a_rotated_key_is_taken() {
        let k = keys();
        let idp = idp(vec![jwk(&k.rsa, Algorithm::RS256, "r1")]).await;
        let iss = issuers(&idp, |_, _| {});
        let t =
            |kid: &str, key: &EncodingKey| sign(Algorithm::RS256, Some(kid), &claims(&idp), key);
        assert!(iss.verify(&t("r1", &k.rsa)).await.is_ok());
        assert_eq!(idp.hits.load(Ordering::SeqCst), 1);
        // The issuer rotates in a new key: the first token naming it makes one fetch.
        *idp.jwks.lock().unwrap() = json!({"keys": [jwk(&k.rsa, Algorithm::RS256, "r1"), jwk(&k.rsa_other, Algorithm::RS256, "r2")]});
        // ...but not within the refresh interval after the first fetch (3600 s here).
        assert_eq!(
            iss.verify(&t("r2", &k.rsa_other)).await,
            Err(Reject::UnknownKey)
        );
        for _ in 0..20 {
            assert_eq!(
                iss.verify(&t("nope", &k.rsa)).await,
                Err(Reject::UnknownKey)
            );
        }
        assert_eq!(
            idp.hits.load(Ordering::SeqCst),
            1,
            "unknown kids within the interval fetch nothing"
        );
        // With an interval of zero, an unknown kid fetches once, and the rotated key works.
        let iss = issuers(&idp, |_, a| a.jwks_refresh_interval_secs = 0);
        assert!(iss.verify(&t("r2", &k.rsa_other)).await.is_ok());
        assert_eq!(idp.hits.load(Ordering::SeqCst), 2);
        assert_eq!(iss.verify(&t("r3", &k.rsa)).await, Err(Reject::UnknownKey));
        assert_eq!(
            idp.hits.load(Ordering::SeqCst),
            3,
            "one fetch for the unknown kid, then refused"
        );
    }

    #[tokio::test]
    async fn a_broken_jwks_endpoint_keeps_the_cached_keys_and_refuses_unknown_ones() {
        let k = keys();
        let idp = idp(vec![jwk(&k.rsa, Algorithm::RS256, "r1")]).await;
        let iss = issuers(&idp, |_, a| a.jwks_refresh_interval_secs = 0);
        let t = |kid: &str| sign(Algorithm::RS256, Some(kid), &claims(&idp), &k.rsa);
        assert!(iss.verify(&t("r1")).await.is_ok());
        for mode in [Mode::Garbage, Mode::Huge, Mode::Hang] {
            *idp.mode.lock().unwrap() = mode;
            let before = idp.hits.load(Ordering::SeqCst);
            // Bounded: the hanging endpoint is given up on after jwks_timeout_ms (500 ms); the
            // outer limit only keeps a broken build from hanging the suite.
            let r = tokio::time::timeout(Duration::from_secs(60), iss.verify(&t("unknown")))
                .await
                .expect("verification is bounded");
            assert_eq!(r, Err(Reject::UnknownKey));
            assert_eq!(idp.hits.load(Ordering::SeqCst), before + 1);
            assert!(
                iss.verify(&t("r1")).await.is_ok(),
                "cached keys keep working"
            );
        }
        // An issuer whose endpoint never gave keys: nothing is accepted, with its own reason.
        let fresh = issuers(&idp, |_, _| {});
        *idp.mode.lock().unwrap() = Mode::Garbage;
        assert_eq!(fresh.verify(&t("r1")).await, Err(Reject::KeysUnavailable));
    }

    #[tokio::test]
    async fn a_configured_jwks_url_skips_discovery_and_a_key_without_kid_is_used_only_alone() {
        let k = keys();
        let mut plain = jwk(&k.rsa, Algorithm::RS256, "x");
        plain.as_object_mut().unwrap().remove("kid");
        let idp = idp(vec![plain]).await;
        let url = format!("{}/jwks", idp.issuer);
        let iss = issuers(&idp, |o, _| o.jwks_url = Some(url));
        assert!(
            iss.verify(&sign(Algorithm::RS256, None, &claims(&idp), &k.rsa))
                .await
                .is_ok()
        );
        // Two keys and no kid: which one is meant is not guessed.
        *idp.jwks.lock().unwrap() = json!({"keys": [jwk(&k.rsa, Algorithm::RS256, "a"), jwk(&k.rsa_other, Algorithm::RS256, "b")]});
        let iss = issuers(&idp, |_, _| {});
        assert_eq!(
            iss.verify(&sign(Algorithm::RS256, None, &claims(&idp), &k.rsa))
                .await,
            Err(Reject::UnknownKey)
        );
    }

    #[test]
    fn jwks_parsing_keeps_only_asymmetric_signature_keys() {
        let k = keys();
        let doc = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "s", "alg": "HS256"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": jwk(&k.rsa, Algorithm::RS256, "x")["n"], "e": "AQAB"},
            {"kty": "weird", "kid": "w"},
            jwk(&k.rsa, Algorithm::RS256, "r1"),
        ]});
        let keys = parse_jwks(&doc).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid.as_deref(), Some("r1"));
        assert!(parse_jwks(&json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]})).is_err());
        assert!(parse_jwks(&json!(["not", "a", "set"])).is_err());
    }

    #[test]
    fn fetch_urls_must_be_https_unless_loopback() {
        assert!(check_fetch_url("https://idp.example/keys").is_ok());
        assert!(check_fetch_url("http://127.0.0.1:8080/keys").is_ok());
        assert!(check_fetch_url("http://localhost/keys").is_ok());
        assert!(check_fetch_url("http://idp.example/keys").is_err());
        assert!(check_fetch_url("ftp://idp.example/keys").is_err());
    }
}
