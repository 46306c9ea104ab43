//! Mutual TLS between hosts: a TCP gRPC listener that admits a peer by the identity in its
//! certificate, and the client that connects to one, exactly as the Unix listeners admit peers by
//! uid on one host.
//!
//! An identity is a SPIFFE ID — the certificate's `spiffe://<trust domain>/warden/<role>` URI
//! SAN, what cert-manager's SPIFFE CSI driver and SPIRE issue. Both ends verify the other's chain
//! against the configured CA (`ca_file`), then its SPIFFE ID against the identities they admit
//! (`admit`): a server names the roles that may call it, a client the role it must be talking to.
//! Certificate, key and CA are read from files and read again when any of them changes (checked
//! at each new connection), so a rotated certificate is used without a restart; a change that
//! does not load (a half-written file) keeps the last good material and says why.
//!
//! A refusal is a TLS alert the other end can read, not a closed connection: a server's
//! listener refuses an identity it does not admit inside the handshake (`access_denied`), so a
//! client tells "this peer refused my certificate" from "this peer is gone" ([`refusal`]), and
//! both ends log the identities involved.
//!
//! Must never: admit a connection whose chain does not verify or whose identity is not listed,
//! accept a certificate by DNS name (these certificates carry none), or fall back to plain TCP.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use x509_cert::der::Decode;
use x509_cert::der::oid::AssociatedOid;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

use crate::peer::{PeerInfo, PeerStream};

mod callers;
pub use callers::{CallerCert, CallerStream, CallerTls, CallerTlsConfig, ClientCerts, subject_cn};

/// How long a TLS handshake may take before the connection is dropped (a peer that opens a
/// connection and sends nothing must not hold anything).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many handshakes a listener runs at once. A peer that opens connections and sends
/// nothing would otherwise hold one descriptor each for [`HANDSHAKE_TIMEOUT`], as many as it
/// can open; past this many, the oldest unfinished handshake is dropped for the new one. A
/// real peer's handshake takes milliseconds, so a flood of silent connections cannot keep it
/// out: it is never the oldest for long.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// A client's HTTP/2 ping period on a channel to another host, and how long an unanswered ping
/// may wait before the connection counts as dead.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for a TCP connection to another host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `tls` of a listener or of a client: where this daemon's certificate, key and trust anchors
/// are, and which SPIFFE IDs the other end may have.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// This daemon's certificate chain (PEM, leaf first). Relative: against the state directory.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// The CA certificates a peer's chain must end in (PEM).
    pub ca_file: PathBuf,
    /// The SPIFFE IDs admitted: on a listener, the peers that may call it; on a client, the
    /// identity the server must present (any one of them).
    #[serde(default)]
    pub admit: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {what}")]
    Material { path: PathBuf, what: String },
    #[error("TLS set-up: {0}")]
    Setup(String),
    #[error("{0}")]
    Config(String),
}

impl TlsConfig {
    /// Checks what can be checked before a file is read; `key` is its place in the file.
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.admit.is_empty() {
            return Err((
                "tls.admit".into(),
                "name the SPIFFE IDs admitted, e.g. [\"spiffe://example.org/warden/gateway\"]"
                    .into(),
            ));
        }
        for (i, id) in self.admit.iter().enumerate() {
            if !is_spiffe_id(id) {
                return Err((
                    format!("tls.admit[{i}]"),
                    format!("{id:?} is not a SPIFFE ID like spiffe://example.org/warden/gateway"),
                ));
            }
        }
        Ok(())
    }

    fn resolved(&self, base: &Path) -> Self {
        let r = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        Self {
            cert_file: r(&self.cert_file),
            key_file: r(&self.key_file),
            ca_file: r(&self.ca_file),
            admit: self.admit.clone(),
        }
    }

    fn files(&self) -> [&Path; 3] {
        [&self.cert_file, &self.key_file, &self.ca_file]
    }
}

/// `spiffe://<trust domain>/<path>`: a scheme, a non-empty trust domain, a path.
fn is_spiffe_id(id: &str) -> bool {
    id.strip_prefix("spiffe://")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(domain, path)| {
            !domain.is_empty()
                && !path.is_empty()
                && domain
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
        })
}

/// The SPIFFE IDs (URI SANs with the `spiffe` scheme) of a DER certificate; none when it does
/// not parse.
pub fn spiffe_ids(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok(cert) = x509_cert::Certificate::from_der(cert.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ext in cert.tbs_certificate.extensions.iter().flatten() {
        if ext.extn_id != SubjectAltName::OID {
            continue;
        }
        let Ok(san) = SubjectAltName::from_der(ext.extn_value.as_bytes()) else {
            continue;
        };
        for name in san.0 {
            if let GeneralName::UniformResourceIdentifier(uri) = name
                && uri.as_str().starts_with("spiffe://")
            {
                out.push(uri.as_str().to_string());
            }
        }
    }
    out
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The certificate chain, key and trust anchors of a [`TlsConfig`].
struct Material {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

impl Material {
    fn load(cfg: &TlsConfig) -> Result<Self, TlsError> {
        let bad = |path: &Path, what: String| TlsError::Material {
            path: path.to_path_buf(),
            what,
        };
        let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let pem = read(path)?;
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| bad(path, format!("not PEM certificates: {e}")))?;
            if certs.is_empty() {
                return Err(bad(path, "holds no certificate".into()));
            }
            Ok(certs)
        };
        let chain = certs(&cfg.cert_file)?;
        let key = PrivateKeyDer::from_pem_slice(&read(&cfg.key_file)?)
            .map_err(|e| bad(&cfg.key_file, format!("no private key: {e}")))?;
        Ok(Self {
            chain,
            key,
            roots: Self::roots(&cfg.ca_file)?,
        })
    }

    /// The trust anchors in the PEM file `path`.
    fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
        let bad = |what: String| TlsError::Material {
            path: path.to_path_buf(),
            what,
        };
        let pem = read(path)?;
        let cas: Vec<_> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
        if cas.is_empty() {
            return Err(bad("holds no certificate".into()));
        }
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots
                .add(ca)
                .map_err(|e| bad(format!("not a CA certificate: {e}")))?;
        }
        Ok(Arc::new(roots))
    }
}

/// What the files looked like when they were last read: a change to any is a reload.
type Stamp = Vec<Option<(std::time::SystemTime, u64, u64)>>;

/// Files read again when they change; the last good result kept when a change does not load.
struct Reloading<T> {
    /// The files watched, and the certificate named in the log.
    files: Vec<PathBuf>,
    cert_file: PathBuf,
    build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    current: Mutex<(Stamp, Arc<T>)>,
}

fn stamp(files: &[PathBuf]) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    files
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())))
        })
        .collect()
}

impl<T: 'static> Reloading<T> {
    fn new(cfg: TlsConfig, build: fn(&TlsConfig) -> Result<T, TlsError>) -> Result<Self, TlsError> {
        let files = cfg.files().iter().map(|p| p.to_path_buf()).collect();
        let cert_file = cfg.cert_file.clone();
        Self::of(files, cert_file, Box::new(move || build(&cfg)))
    }

    fn of(
        files: Vec<PathBuf>,
        cert_file: PathBuf,
        build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    ) -> Result<Self, TlsError> {
        let s = stamp(&files);
        let first = build()?;
        Ok(Self {
            files,
            cert_file,
            build,
            current: Mutex::new((s, Arc::new(first))),
        })
    }

    fn current(&self) -> Arc<T> {
        let now = stamp(&self.files);
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.0 != now {
            match (self.build)() {
                Ok(fresh) => {
                    tracing::info!(cert = %self.cert_file.display(), "TLS certificate, key or CA changed: reloaded");
                    *cur = (now, Arc::new(fresh));
                }
                Err(e) => {
                    // Not stamped: the next connection tries again (the writer may be half done).
                    tracing::warn!(error = %e, "TLS files changed but do not load; keeping the last good ones");
                }
            }
        }
        cur.1.clone()
    }
}

fn server_config(cfg: &TlsConfig) -> Result<rustls::ServerConfig, TlsError> {
    let m = Material::load(cfg)?;
    let provider = provider();
    let chain = WebPkiClientVerifier::builder_with_provider(m.roots, provider.clone())
        .build()
        .map_err(|e| TlsError::Setup(format!("client verifier: {e}")))?;
    let verifier = Arc::new(AdmittingVerifier {
        chain,
        admit: cfg.admit.clone(),
    });
    let mut sc = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain, m.key)
        .map_err(|e| TlsError::Material {
            path: cfg.key_file.clone(),
            what: format!("does not go with the certificate: {e}"),
        })?;
    sc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(sc)
}

fn client_config(cfg: &TlsConfig) -> Result<rustls::ClientConfig, TlsError> {
    let m = Material::load(cfg)?;
    let provider = provider();
    let verifier = Arc::new(IdentityVerifier {
        roots: m.roots,
        admit: cfg.admit.clone(),
        algs: provider.signature_verification_algorithms,
    });
    let mut cc = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(m.chain, m.key)
        .map_err(|e| TlsError::Material {
            path: cfg.key_file.clone(),
            what: format!("does not go with the certificate: {e}"),
        })?;
    cc.alpn_protocols = vec![b"h2".to_vec()];
    // No DNS name to send: the server is known by its SPIFFE ID.
    cc.enable_sni = false;
    Ok(cc)
}

/// A listener's check of a client: its chain (rustls's own), then its SPIFFE ID against the
/// identities admitted, both inside the handshake, so a refused client receives a TLS alert
/// (`access_denied` for an identity not admitted, `unknown_ca` for another CA) that says so.
#[derive(Debug)]
struct AdmittingVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    admit: Vec<String>,
}

impl ClientCertVerifier for AdmittingVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ids = spiffe_ids(end_entity);
        if let Err(e) = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)
        {
            tracing::warn!(identities = ?ids, error = %e, "peer refused: its certificate does not verify against this listener's CA");
            return Err(e);
        }
        if ids.iter().any(|id| self.admit.contains(id)) {
            return Ok(ClientCertVerified::assertion());
        }
        tracing::warn!(identities = ?ids, admitted = ?self.admit, "peer refused: its certificate's identity is not admitted on this listener");
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// Which end refused a mutual-TLS connection, from the error of a call over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The peer refused this end's certificate (the alert it sent, e.g. `AccessDenied`).
    ByPeer(String),
    /// This end refused the peer's certificate (why).
    OfPeer(String),
}

/// Whether `err` (a gRPC status's source, a transport error) is a refused certificate on either
/// end, found in its chain of sources (an `io::Error` is looked into: its `source()` skips the
/// error it wraps).
pub fn refusal(err: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut next = Some(err);
    while let Some(e) = next {
        let inner = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for candidate in [Some(e), inner].into_iter().flatten() {
            if let Some(r) = candidate.downcast_ref::<rustls::Error>() {
                use rustls::AlertDescription as A;
                match r {
                    rustls::Error::AlertReceived(
                        a @ (A::AccessDenied
                        | A::BadCertificate
                        | A::UnknownCA
                        | A::CertificateRequired
                        | A::CertificateUnknown
                        | A::UnsupportedCertificate
                        | A::CertificateExpired
                        | A::CertificateRevoked),
                    ) => return Some(Refusal::ByPeer(format!("{a:?}"))),
                    rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::General(_) => return Some(Refusal::OfPeer(r.to_string())),
                    _ => {}
                }
            }
        }
        next = inner.and_then(|i| i.source()).or_else(|| e.source());
    }
    None
}

/// A server is accepted when its chain ends in the CA and its SPIFFE ID is one admitted. The
/// name the client dialled plays no part (SPIFFE certificates carry no DNS name); the chain
/// check is rustls's own.
#[derive(Debug)]
struct IdentityVerifier {
    roots: Arc<RootCertStore>,
    admit: Vec<String>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for IdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )?;
        let ids = spiffe_ids(end_entity);
        if ids.iter().any(|id| self.admit.contains(id)) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's identity {ids:?} is not the one expected ({:?})",
                self.admit
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// A listener's TLS side: the server configuration (reloaded as its files change) and the
/// identities it admits.
pub struct ServerTls {
    config: Reloading<rustls::ServerConfig>,
    admit: Vec<String>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.config.cert_file)
            .field("admit", &self.admit)
            .finish()
    }
}

impl ServerTls {
    /// Reads the files now (a listener that cannot present its certificate does not start).
    pub fn new(cfg: &TlsConfig, state_dir: &Path) -> Result<Self, TlsError> {
        cfg.check()
            .map_err(|(k, why)| TlsError::Config(format!("{k}: {why}")))?;
        let cfg = cfg.resolved(state_dir);
        Ok(Self {
            admit: cfg.admit.clone(),
            config: Reloading::new(cfg, server_config)?,
        })
    }

    /// The first of `ids` this listener admits.
    fn admitted(&self, ids: &[String]) -> Option<String> {
        ids.iter().find(|id| self.admit.contains(id)).cloned()
    }
}

/// An accepted, verified and admitted TLS connection with its peer's identity.
pub type TlsPeerStream = PeerStream<tokio_rustls::server::TlsStream<TcpStream>>;

/// The connections of a TLS listener that completed a handshake and whose identity is admitted.
/// Handshakes run concurrently (a slow one holds no other), at most
/// [`MAX_PENDING_HANDSHAKES`] at once (the oldest is dropped for a new one); a refused peer is
/// logged and its connection closed. Ends when the server stops taking connections.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    name: String,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsPeerStream>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Unfinished handshakes by arrival order: each removes itself when it ends.
        let pending: Arc<Mutex<BTreeMap<u64, tokio::task::AbortHandle>>> = Arc::default();
        let mut next: u64 = 0;
        let mut dropped: u64 = 0;
        loop {
            let (tcp, addr) = tokio::select! {
                _ = tx.closed() => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(listener = %name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // A turn's events are small writes answered by nothing: without this, Nagle's
            // algorithm holds each behind the peer's delayed ACK (~40 ms per event across hosts,
            // measured by tests/benches/cells.rs).
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.current());
            let (tx, tls, name2, pending2) =
                (tx.clone(), tls.clone(), name.clone(), pending.clone());
            let id = next;
            next += 1;
            // Registered before it can finish, under the lock its own removal takes.
            let mut waiting = pending.lock().unwrap_or_else(|p| p.into_inner());
            let task = tokio::spawn(async move {
                let admitted = handshake(acceptor, tcp, addr, &tls, &name2).await;
                pending2
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                if let Some(stream) = admitted {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
            waiting.insert(id, task.abort_handle());
            while waiting.len() > MAX_PENDING_HANDSHAKES {
                if let Some((_, oldest)) = waiting.pop_first() {
                    oldest.abort();
                    dropped += 1;
                    // One line per 1,000 dropped: a flood must not flood the log too.
                    if dropped % 1000 == 1 {
                        tracing::warn!(listener = %name, dropped, "too many unfinished TLS handshakes: dropping the oldest");
                    }
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    tls: &ServerTls,
    name: &str,
) -> Option<TlsPeerStream> {
    let accept = acceptor.accept(tcp).into_fallible();
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
        Ok(Ok(s)) => s,
        Ok(Err((e, tcp))) => {
            tracing::warn!(listener = %name, peer = %addr, error = %e, "peer refused: TLS handshake failed");
            linger(tcp).await;
            return None;
        }
        Err(_) => {
            tracing::warn!(listener = %name, peer = %addr, "peer refused: TLS handshake timed out");
            return None;
        }
    };
    let ids = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(spiffe_ids)
        .unwrap_or_default();
    match tls.admitted(&ids) {
        Some(id) => Some(PeerStream::with_info(stream, PeerInfo::with_identity(id))),
        None => {
            tracing::warn!(listener = %name, peer = %addr, identities = ?ids, admitted = ?tls.admit, "peer refused: its certificate's identity is not admitted on this listener");
            None
        }
    }
}

/// How long a refused connection is kept open for its peer to read the alert.
const LINGER: Duration = Duration::from_millis(500);

/// Closes a refused connection so that its peer reads the TLS alert already written: the write
/// side first (FIN after the alert), then whatever the peer sent meanwhile is read and dropped
/// for at most [`LINGER`]. Closed at once with the peer's bytes unread, the kernel would send a
/// reset, which can arrive first and discard the alert: the peer would see a lost connection,
/// not a refusal.
async fn linger(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = tcp.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// A client's TLS side: connects to `addr` and presents this daemon's certificate; the server
/// must prove one of `tls.admit`. Reloaded as its files change, at each new connection.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<Reloading<rustls::ClientConfig>>,
    /// Per address dialled, the refusal its last connection ended with (a TLS alert read from
    /// the stream, or this end's verdict on the peer's certificate), cleared once a connection
    /// there reads its first bytes. HTTP/2 reports a connection that died under a pending call
    /// only as "operation was canceled"; this is where the reason is kept.
    refusals: Arc<Mutex<std::collections::HashMap<String, Refusal>>>,
}

/// The TLS stream of one client connection, noting a refusal it meets in [`ClientTls`].
struct Watched<S> {
    inner: S,
    addr: String,
    refusals: Arc<Mutex<std::collections::HashMap<String, Refusal>>>,
    accepted: bool,
}

impl<S> Watched<S> {
    fn note(&mut self, err: &io::Error) {
        if let Some(r) = refusal(err) {
            self.refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.addr.clone(), r);
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &r {
            std::task::Poll::Ready(Err(e)) => self.note(e),
            std::task::Poll::Ready(Ok(())) if !self.accepted && buf.filled().len() > before => {
                // The server spoke after the handshake: it took this end's certificate.
                self.accepted = true;
                self.refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.addr);
            }
            _ => {}
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Err(e)) = &r {
            self.note(e);
        }
        r
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl ClientTls {
    pub fn new(cfg: &TlsConfig, state_dir: &Path) -> Result<Self, TlsError> {
        cfg.check()
            .map_err(|(k, why)| TlsError::Config(format!("{k}: {why}")))?;
        Ok(Self {
            config: Arc::new(Reloading::new(cfg.resolved(state_dir), client_config)?),
            refusals: Arc::default(),
        })
    }

    /// The refusal the last connection to `addr` ended with, if it was one (see the field).
    pub fn refused(&self, addr: &str) -> Option<Refusal> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(addr)
            .cloned()
    }

    /// The SPIFFE IDs of the certificate this end presents (read now; empty when it does not
    /// load): what a refusal is logged with.
    pub fn identities(&self) -> Vec<String> {
        CertificateDer::pem_file_iter(&self.config.cert_file)
            .ok()
            .and_then(|mut certs| certs.next()?.ok())
            .map(|c| spiffe_ids(&c))
            .unwrap_or_default()
    }

    /// A lazily connecting gRPC channel to `addr` (`host:port`) over mutual TLS.
    pub fn channel(&self, addr: &str) -> Result<tonic::transport::Channel, TlsError> {
        // Between hosts a link can go silent without a reset (a partition, a dead host): HTTP/2
        // pings find that out, so a turn streamed over this channel fails within
        // KEEPALIVE_EVERY + KEEPALIVE_TIMEOUT instead of waiting on a connection that is gone.
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| TlsError::Config(format!("{addr:?} is not host:port: {e}")))?
            .http2_keep_alive_interval(KEEPALIVE_EVERY)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let me = self.clone();
        let addr = addr.to_string();
        Ok(
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
                let (me, addr) = (me.clone(), addr.clone());
                async move {
                    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr))
                        .await
                        .map_err(|_| {
                            io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
                        })??;
                    let _ = tcp.set_nodelay(true);
                    let connector = tokio_rustls::TlsConnector::from(me.config.current());
                    // Not a name that is checked (see IdentityVerifier); rustls needs one.
                    let name = ServerName::try_from("warden.invalid")
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    let tls = match connector.connect(name, tcp).await {
                        Ok(tls) => tls,
                        Err(e) => {
                            if let Some(r) = refusal(&e) {
                                me.refusals
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .insert(addr.clone(), r);
                            }
                            return Err(e);
                        }
                    };
                    Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(Watched {
                        inner: tls,
                        addr: addr.clone(),
                        refusals: me.refusals.clone(),
                        accepted: false,
                    }))
                }
            })),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_are_checked_before_anything_is_read() {
        assert!(is_spiffe_id("spiffe://example.org/warden/gateway"));
        assert!(!is_spiffe_id("spiffe://example.org"));
        assert!(!is_spiffe_id("spiffe:///warden/gateway"));
        assert!(!is_spiffe_id("https://example.org/warden/gateway"));
        assert!(!is_spiffe_id("spiffe://Example.org/x"));
        let cfg = TlsConfig {
            cert_file: "c".into(),
            key_file: "k".into(),
            ca_file: "a".into(),
            admit: vec![],
        };
        assert_eq!(cfg.check().unwrap_err().0, "tls.admit");
        let cfg = TlsConfig {
            admit: vec!["gateway".into()],
            ..cfg
        };
        assert_eq!(cfg.check().unwrap_err().0, "tls.admit[0]");
    }
}
