//! TLS for a listener that serves callers (the gateway's HTTP and A2A gRPC listeners), as
//! opposed to the daemons' peers: this end's certificate, and, when configured, the CA callers'
//! certificates must chain to. Unlike a peer listener it admits no identity itself: a verified
//! certificate's SPIFFE IDs and subject CN are handed to the service ([`CallerCert`]), which
//! alone decides whom (if anyone) they name. The chain is checked by rustls's own
//! `WebPkiClientVerifier` inside the handshake, so an expired certificate, one from another CA,
//! or (`require`) none at all is refused with the TLS alert that says so. Files are read again
//! when they change, as the peers' are.
//!
//! Must never: let a certificate that does not verify reach the service, or fall back to plain
//! TCP on a listener configured for TLS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;
use tokio::net::TcpStream;
use x509_cert::der::Decode;

use super::{Material, Reloading, TlsError, linger, provider, read, spiffe_ids};

/// Whether a callers' listener asks for a client certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCerts {
    /// None is asked for (bearer tokens only).
    #[default]
    Off,
    /// Asked for; a caller without one still connects (and signs in with a token).
    Request,
    /// Every connection must present one that verifies.
    Require,
}

/// `tls` of a listener for callers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerTlsConfig {
    /// This listener's certificate chain (PEM, leaf first). Relative: against the state
    /// directory.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA certificates a caller's certificate must chain to (PEM); needed unless
    /// `client_certs` is `off`.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// `off` (default), `request` or `require`.
    #[serde(default)]
    pub client_certs: ClientCerts,
}

impl CallerTlsConfig {
    /// Checks what can be checked before a file is read; the key is relative to the section.
    pub fn check(&self) -> Result<(), (String, String)> {
        match (self.client_certs, &self.client_ca_file) {
            (ClientCerts::Off, Some(_)) => Err((
                "client_certs".into(),
                "client_ca_file is set but client_certs is off: set \"request\" or \"require\""
                    .into(),
            )),
            (ClientCerts::Request | ClientCerts::Require, None) => Err((
                "client_ca_file".into(),
                "client certificates are asked for: name the CA they must chain to".into(),
            )),
            _ => Ok(()),
        }
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
            client_ca_file: self.client_ca_file.as_deref().map(r),
            client_certs: self.client_certs,
        }
    }
}

/// What a caller's verified certificate says: the material a service maps to a principal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerCert {
    /// Its SPIFFE IDs (URI SANs).
    pub spiffe_ids: Vec<String>,
    /// Its subject's common name, when it has one.
    pub subject_cn: Option<String>,
}

impl CallerCert {
    /// From a DER certificate (one that verified).
    pub fn of(cert: &CertificateDer<'_>) -> Self {
        Self {
            spiffe_ids: spiffe_ids(cert),
            subject_cn: subject_cn(cert),
        }
    }
}

/// The subject's common name (the first `CN`, a UTF8String or PrintableString) of a DER
/// certificate; none when it has none or does not parse.
pub fn subject_cn(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_cert::der::asn1::{PrintableStringRef, Utf8StringRef};
    const CN: x509_cert::der::oid::ObjectIdentifier =
        x509_cert::der::oid::ObjectIdentifier::new_unwrap("2.5.4.3");
    let cert = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    cert.tbs_certificate
        .subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .filter(|atv| atv.oid == CN)
        .find_map(|atv| {
            atv.value
                .decode_as::<Utf8StringRef<'_>>()
                .map(|s| s.as_str().to_string())
                .or_else(|_| {
                    atv.value
                        .decode_as::<PrintableStringRef<'_>>()
                        .map(|s| s.as_str().to_string())
                })
                .ok()
        })
}

/// A callers' listener's TLS side.
pub struct CallerTls {
    config: Reloading<rustls::ServerConfig>,
    mode: ClientCerts,
}

impl std::fmt::Debug for CallerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerTls")
            .field("cert", &self.config.cert_file)
            .field("client_certs", &self.mode)
            .finish()
    }
}

/// An accepted TLS connection of a caller, and its certificate when it presented one.
pub type CallerStream = tokio_rustls::server::TlsStream<TcpStream>;

impl CallerTls {
    /// Reads the files now (a listener that cannot present its certificate does not start).
    /// `alpn`: the protocols the listener speaks (`http/1.1`, or `h2` for gRPC).
    pub fn new(cfg: &CallerTlsConfig, state_dir: &Path, alpn: &[&[u8]]) -> Result<Self, TlsError> {
        cfg.check()
            .map_err(|(k, why)| TlsError::Config(format!("tls.{k}: {why}")))?;
        let cfg = cfg.resolved(state_dir);
        let mut files = vec![cfg.cert_file.clone(), cfg.key_file.clone()];
        files.extend(cfg.client_ca_file.clone());
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let mode = cfg.client_certs;
        let cert_file = cfg.cert_file.clone();
        Ok(Self {
            config: Reloading::of(
                files,
                cert_file,
                Box::new(move || caller_server_config(&cfg, &alpn)),
            )?,
            mode,
        })
    }

    /// Whether client certificates are asked for.
    pub fn client_certs(&self) -> ClientCerts {
        self.mode
    }

    /// The handshake of one accepted connection, within `timeout`: the stream and the caller's
    /// certificate (None: it presented none, which `require` refuses). A refused or failed
    /// handshake is logged with its reason and the connection closed after its alert is sent.
    pub async fn accept(
        &self,
        tcp: TcpStream,
        timeout: Duration,
    ) -> Option<(CallerStream, Option<CallerCert>)> {
        let peer = tcp.peer_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.current());
        let stream = match tokio::time::timeout(timeout, acceptor.accept(tcp).into_fallible()).await
        {
            Ok(Ok(s)) => s,
            Ok(Err((e, tcp))) => {
                tracing::info!(peer = ?peer, error = %e, "caller refused: TLS handshake failed");
                linger(tcp).await;
                return None;
            }
            Err(_) => {
                tracing::info!(peer = ?peer, "caller refused: TLS handshake timed out");
                return None;
            }
        };
        let cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(CallerCert::of);
        Some((stream, cert))
    }
}

fn caller_server_config(
    cfg: &CallerTlsConfig,
    alpn: &[Vec<u8>],
) -> Result<rustls::ServerConfig, TlsError> {
    let bad = |path: &Path, what: String| TlsError::Material {
        path: path.to_path_buf(),
        what,
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(&cfg.cert_file)?)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&cfg.cert_file, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(bad(&cfg.cert_file, "holds no certificate".into()));
    }
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&read(&cfg.key_file)?)
        .map_err(|e| bad(&cfg.key_file, format!("no private key: {e}")))?;
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match (&cfg.client_ca_file, cfg.client_certs) {
        (Some(ca), ClientCerts::Request | ClientCerts::Require) => {
            let roots = Material::roots(ca)?;
            let v = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let v = if cfg.client_certs == ClientCerts::Request {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(
                v.build()
                    .map_err(|e| TlsError::Setup(format!("client verifier: {e}")))?,
            )
        }
        _ => builder.with_no_client_auth(),
    };
    let mut sc = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Material {
            path: cfg.key_file.clone(),
            what: format!("does not go with the certificate: {e}"),
        })?;
    sc.alpn_protocols = alpn.to_vec();
    Ok(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_need_a_ca_and_a_ca_needs_them_asked_for() {
        let base = CallerTlsConfig {
            cert_file: "g.pem".into(),
            key_file: "g.key".into(),
            client_ca_file: None,
            client_certs: ClientCerts::Off,
        };
        assert!(base.check().is_ok());
        let asked = CallerTlsConfig {
            client_certs: ClientCerts::Require,
            ..base.clone()
        };
        assert_eq!(asked.check().unwrap_err().0, "client_ca_file");
        let unasked = CallerTlsConfig {
            client_ca_file: Some("ca.pem".into()),
            ..base.clone()
        };
        assert_eq!(unasked.check().unwrap_err().0, "client_certs");
        let both = CallerTlsConfig {
            client_ca_file: Some("ca.pem".into()),
            client_certs: ClientCerts::Request,
            ..base
        };
        assert!(both.check().is_ok());
    }
}
