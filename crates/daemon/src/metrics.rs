//! A daemon's Prometheus metrics listener: `GET /metrics` on the TCP address `[daemon]
//! metrics_listen` names (off when unset), answered with the OpenMetrics text exposition of the
//! service's registry, encoded by `prometheus-client` (never formatted by hand).
//!
//! A service keeps its own metrics (counters and histograms updated where things happen) and may
//! give a [`Refresh`]: run before each scrape, it sets the gauges that are read from the service's
//! state (queue depths, live agents) rather than kept in step by hand.
//!
//! Plain HTTP with no authentication (Prometheus cannot scrape a Unix socket): what it shows is
//! counts, rule names and latencies, never a request's content; the operator keeps it on
//! loopback or a monitoring network. Connections are bounded and must send their request head
//! promptly, like every other listener of warden's.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use prometheus_client;

use crate::config::DaemonSection;
use crate::listener::ListenerError;

/// Sets the gauges read from the service's state; run before each scrape.
pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The content type of the OpenMetrics text exposition `prometheus_client::encoding::text`
/// writes (Prometheus asks for it first in its Accept header).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Scrapes served at once; more connections wait for a place.
const MAX_CONNECTIONS: usize = 8;
/// How long a connection may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a daemon exports: its registry and the refresh of its state-read gauges.
pub struct Exporter {
    pub registry: Registry,
    pub refresh: Option<Refresh>,
}

/// A bound metrics listener.
pub struct MetricsListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl MetricsListener {
    /// `http://ADDR/metrics`, for logs and status answers.
    pub fn describe(&self) -> String {
        format!("metrics:http://{}/metrics", self.addr)
    }
}

/// Binds `[daemon] metrics_listen` when it is set (the section was validated, so it parses).
pub async fn bind(section: &DaemonSection) -> Result<Option<MetricsListener>, ListenerError> {
    let Some(raw) = &section.metrics_listen else {
        return Ok(None);
    };
    let what = format!("daemon.metrics_listen {raw}");
    let bind_err = |source| ListenerError::Bind {
        what: what.clone(),
        source,
    };
    let addr: SocketAddr = raw.parse().map_err(|_| {
        bind_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an IP address and port",
        ))
    })?;
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    Ok(Some(MetricsListener { listener, addr }))
}

/// Serves `exporter` on `listener` until `shutdown` is cancelled.
pub async fn serve(listener: MetricsListener, exporter: Exporter, shutdown: CancellationToken) {
    let exporter = Arc::new(exporter);
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let place = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = places.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // A full file table passes; wait a little rather than spin.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let exporter = exporter.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _place = place;
            let service = hyper::service::service_fn(move |req| {
                let exporter = exporter.clone();
                async move { Ok::<_, Infallible>(answer(&exporter, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                }
            }
        });
    }
}

async fn answer(exporter: &Exporter, req: Request<Incoming>) -> Response<String> {
    let reply = |status: StatusCode, ty: &'static str, body: String| {
        let mut r = Response::new(body);
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(ty),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "GET /metrics\n".into(),
        );
    }
    if let Some(refresh) = &exporter.refresh {
        refresh().await;
    }
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &exporter.registry) {
        Ok(()) => reply(StatusCode::OK, CONTENT_TYPE, body),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

/// Latency buckets in seconds, 100 µs to about 52 s (doubling): a decision from the rules takes
/// well under a millisecond, one that waits for a person or a fsync much longer.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_registry_and_refreshes_before_each_scrape() {
        let section: DaemonSection =
            toml::from_str("state_dir = \"/x\"\nmetrics_listen = \"127.0.0.1:0\"").unwrap();
        let l = bind(&section).await.unwrap().unwrap();
        let addr = l.addr;
        let mut registry = Registry::default();
        let hits = Counter::<u64>::default();
        registry.register("scrapes", "Scrapes seen", hits.clone());
        let h = hits.clone();
        let refresh: Refresh = Arc::new(move || {
            let h = h.clone();
            Box::pin(async move {
                h.inc();
            })
        });
        let token = CancellationToken::new();
        let task = tokio::spawn(serve(
            l,
            Exporter {
                registry,
                refresh: Some(refresh),
            },
            token.clone(),
        ));
        let first = get(addr, "/metrics").await;
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        assert!(first.contains("application/openmetrics-text"), "{first}");
        assert!(first.contains("scrapes_total 1\n"), "{first}");
        assert!(first.trim_end().ends_with("# EOF"), "{first}");
        let second = get(addr, "/metrics").await;
        assert!(second.contains("scrapes_total 2\n"), "{second}");
        assert!(get(addr, "/other").await.starts_with("HTTP/1.1 404"));
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn unset_is_off_and_a_bad_address_is_refused_naming_the_key() {
        let off: DaemonSection = toml::from_str("state_dir = \"/x\"").unwrap();
        assert!(off.metrics_listen.is_none());
        let bad: DaemonSection =
            toml::from_str("state_dir = \"/x\"\nmetrics_listen = \"localhost\"").unwrap();
        let e = bad
            .validate(&crate::config::Origin::Embedded)
            .unwrap_err()
            .to_string();
        assert!(e.contains("daemon.metrics_listen"), "{e}");
    }
}
