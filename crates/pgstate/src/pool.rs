//! The connection pool: a daemon's connections to its database, each opened with the
//! configured timeouts (and TLS), handed out for one operation at a time.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;

use crate::config::{StoreSection, describe_config};
use crate::error::PgError;

/// A daemon's pool on one database. Cheap to clone.
#[derive(Clone)]
pub struct Pg {
    pool: Pool,
    config: Arc<tokio_postgres::Config>,
    tls: Tls,
    timeout: Duration,
    target: Arc<str>,
}

/// How new connections are opened: the pool's and the notification listener's alike.
#[derive(Clone)]
enum Tls {
    None,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Pg {
    /// Builds the pool. Connects lazily: a database that is down at start is an error only at
    /// the first use (see [`Pg::ping`] and [`crate::migrate::migrate`]).
    pub fn new(section: &StoreSection) -> Result<Self, PgError> {
        let mut config: tokio_postgres::Config = section.url.parse().map_err(PgError::Url)?;
        let timeout = Duration::from_millis(section.connect_timeout_ms);
        config.connect_timeout(timeout);
        if config.get_application_name().is_none() {
            config.application_name("warden");
        }
        // A connection whose peer vanished (the host crashed, a network cut) is noticed by the
        // kernel within seconds, not the default two hours.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(5));
        let tls = if section.tls {
            config.ssl_mode(SslMode::Require);
            Tls::Rustls(rustls_connector(section)?)
        } else {
            Tls::None
        };
        let mgr_config = ManagerConfig {
            // A connection back in the pool is checked with one round trip before reuse: a
            // database restart must not hand out dead connections.
            recycling_method: RecyclingMethod::Verified,
        };
        let manager = match &tls {
            Tls::None => Manager::from_config(config.clone(), tokio_postgres::NoTls, mgr_config),
            Tls::Rustls(t) => Manager::from_config(config.clone(), t.clone(), mgr_config),
        };
        let pool = Pool::builder(manager)
            .max_size(section.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| PgError::Build(e.to_string()))?;
        Ok(Pg {
            pool,
            target: describe_config(&config).into(),
            config: Arc::new(config),
            tls,
            timeout,
        })
    }

    /// A connection from the pool, within the connect timeout.
    pub async fn client(&self) -> Result<Object, PgError> {
        self.pool.get().await.map_err(|e| PgError::Unavailable {
            target: self.target.to_string(),
            timeout_ms: self.timeout.as_millis() as u64,
            reason: e.to_string(),
        })
    }

    /// Where the database is (no password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The connect timeout, which also bounds one operation's wait for the database.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One round trip: the database answers.
    pub async fn ping(&self) -> Result<(), PgError> {
        let c = self.client().await?;
        tokio::time::timeout(self.timeout, c.simple_query("SELECT 1"))
            .await
            .map_err(|_| PgError::Timeout(self.timeout.as_millis() as u64))??;
        Ok(())
    }

    /// A connection of its own, outside the pool, whose messages (notifications) the caller
    /// reads: the listener's. Returns the client and a stream of its messages; the connection
    /// lives as long as the stream is polled.
    pub(crate) async fn dedicated(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            futures::stream::BoxStream<
                'static,
                Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>,
            >,
        ),
        PgError,
    > {
        let connect = async {
            match &self.tls {
                Tls::None => {
                    let (c, conn) = self.config.connect(tokio_postgres::NoTls).await?;
                    Ok::<_, tokio_postgres::Error>((c, messages(conn)))
                }
                Tls::Rustls(t) => {
                    let (c, conn) = self.config.connect(t.clone()).await?;
                    Ok((c, messages(conn)))
                }
            }
        };
        tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| PgError::Timeout(self.timeout.as_millis() as u64))?
            .map_err(PgError::Db)
    }
}

/// A connection's messages as a stream (driving the connection as it is polled).
fn messages<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
) -> futures::stream::BoxStream<'static, Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    Box::pin(futures::stream::poll_fn(move |cx| conn.poll_message(cx)))
}

fn rustls_connector(
    section: &StoreSection,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let Some(ca) = &section.tls_ca_file else {
        return Err(PgError::Tls("tls = true needs tls_ca_file".into()));
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .map_err(|e| PgError::Tls(format!("{}: {e}", ca.display())))?;
    for cert in certs {
        let cert = cert.map_err(|e| PgError::Tls(format!("{}: {e}", ca.display())))?;
        roots
            .add(cert)
            .map_err(|e| PgError::Tls(format!("{}: {e}", ca.display())))?;
    }
    if roots.is_empty() {
        return Err(PgError::Tls(format!(
            "{}: no certificate in the file",
            ca.display()
        )));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| PgError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}
