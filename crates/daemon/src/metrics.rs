//! A daemon's Prometheus metrics listener: `GET /metrics` on the TCP address `[daemon]
//! metrics_listen` names (off when unset), answered with the OpenMetrics text exposition of the
//! service's registry, encoded by `prometheus-client` (never formatted by hand).
//!
//! A service keeps its own metrics (counters and histograms updated where things happen) and may
//! give a [`Refresh`]: run before each scrape, it sets the gauges that are read from the service's
//! state (queue depths, live agents) rather than kept in step by hand.
//!
//! Every daemon also exports, beside its service's registry, what an SRE alerts on whatever the
//! service: `warden_build_info{daemon,version}` (always 1) and the standard process metrics
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_threads`, `process_start_time_seconds`), read
//! from `/proc/self` at each scrape ([`ProcessCollector`]; `prometheus-client` has none).
//!
//! Plain HTTP (Prometheus cannot scrape a Unix socket): what it shows is counts, rule names and
//! latencies, never a principal, an id or a request's content; the operator keeps it on loopback
//! or a monitoring network, and may require a bearer token (`[daemon] metrics_token_file`,
//! Prometheus's `authorization.credentials_file`). No client can hold it (issue 36): a connection
//! must send its request head within [`HEADER_TIMEOUT`]; at most [`MAX_CONNECTIONS`] are open, and
//! when a new one finds them all taken, the oldest that is not being answered right now (idle, or
//! still sending its head) is closed to make room, so a client holding half-sent requests loses
//! its places to the next scraper instead of keeping it out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use prometheus_client;

use crate::config::DaemonSection;
use crate::listener::ListenerError;

/// Sets the gauges read from the service's state; run before each scrape.
pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The content type of the OpenMetrics text exposition `prometheus_client::encoding::text`
/// writes (Prometheus asks for it first in its Accept header).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections open at once (many more than scrapers: Prometheus keeps one per target); a new
/// one beyond them takes the place of the oldest that is not being answered.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send its request head (a scraper sends it at once).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// What a daemon exports: its registry and the refresh of its state-read gauges.
pub struct Exporter {
    pub registry: Registry,
    pub refresh: Option<Refresh>,
}

/// A bound metrics listener.
pub struct MetricsListener {
    listener: TcpListener,
    addr: SocketAddr,
    /// `[daemon] metrics_token_file`'s token: every request must carry it as a bearer.
    token: Option<String>,
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
    let token = match &section.metrics_token_file {
        None => None,
        Some(f) => {
            let t = std::fs::read_to_string(f).map_err(|source| ListenerError::Bind {
                what: format!("daemon.metrics_token_file {}", f.display()),
                source,
            })?;
            let t = t.trim().to_string();
            if t.is_empty() {
                return Err(ListenerError::Bind {
                    what: format!("daemon.metrics_token_file {}", f.display()),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the file is empty",
                    ),
                });
            }
            Some(t)
        }
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    Ok(Some(MetricsListener {
        listener,
        addr,
        token,
    }))
}

/// What every daemon exports besides its service's metrics: its build and its process.
fn common_registry(daemon: &str) -> Registry {
    let mut r = Registry::default();
    r.register(
        "warden_build",
        "The daemon and the version of its binary (always 1)",
        prometheus_client::metrics::info::Info::new(vec![
            ("daemon", daemon.to_string()),
            ("version", env!("CARGO_PKG_VERSION").to_string()),
        ]),
    );
    r.register_collector(Box::new(ProcessCollector));
    r
}

/// The standard `process_*` metrics of this process, read from `/proc/self` when scraped.
#[derive(Debug)]
pub struct ProcessCollector;

/// Clock ticks per second in `/proc/<pid>/stat`: `USER_HZ`, fixed at 100 in Linux's user ABI.
const USER_HZ: f64 = 100.0;

/// What [`ProcessCollector`] reads.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
}

impl ProcessFigures {
    /// This process's figures; a file that cannot be read leaves its figures at 0.
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let mut f = Self::parse(&stat, &status, boot);
        f.open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        f.max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(0);
        f
    }

    /// The figures of `/proc/self/stat` (the fields after the command, which may hold spaces
    /// and parentheses, so it is split at its last `)`), `/proc/self/status` (kB) and the boot
    /// time.
    pub fn parse(stat: &str, status: &str, boot_unix_s: u64) -> Self {
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // Field n of proc(5) (1-based) is index n - 3 here: pid and comm come before `)`.
        let field = |n: usize| {
            fields
                .get(n - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Self {
            cpu_seconds: (field(14) + field(15)) as f64 / USER_HZ,
            resident_bytes: kb("VmRSS:") * 1024,
            virtual_bytes: kb("VmSize:") * 1024,
            threads: field(20),
            start_time_seconds: boot_unix_s as f64 + field(22) as f64 / USER_HZ,
            open_fds: 0,
            max_fds: 0,
        }
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::registry::Unit;
        let f = ProcessFigures::read();
        let cpu = ConstCounter::new(f.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<Unit>, f64); 6] = [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                f.resident_bytes as f64,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                f.virtual_bytes as f64,
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(Unit::Seconds),
                f.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                f.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                f.max_fds as f64,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                None,
                f.threads as f64,
            ),
        ];
        for (name, help, unit, v) in gauges {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
        }
        Ok(())
    }
}

/// Serves `exporter` on `listener` until `shutdown` is cancelled; `daemon` names it in
/// `warden_build_info`.
pub async fn serve(
    listener: MetricsListener,
    exporter: Exporter,
    shutdown: CancellationToken,
    daemon: &str,
) {
    let common = Arc::new(common_registry(daemon));
    let exporter = Arc::new(exporter);
    let token = listener.token.map(Arc::new);
    let open = Arc::new(Mutex::new(Open::default()));
    loop {
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
        let answering = Arc::new(AtomicUsize::new(0));
        let Some(id) = open
            .lock()
            .map(|mut o| o.admit(answering.clone()))
            .unwrap_or(None)
        else {
            // Every place is a scrape being answered: this one is closed at once (the
            // scraper tries again at its next interval).
            continue;
        };
        let exporter = exporter.clone();
        let common = common.clone();
        let shutdown = shutdown.clone();
        let token = token.clone();
        let open_then = open.clone();
        let task = tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let exporter = exporter.clone();
                let common = common.clone();
                let token = token.clone();
                let answering = answering.clone();
                async move {
                    answering.fetch_add(1, Ordering::SeqCst);
                    let r = answer(
                        &exporter,
                        &common,
                        token.as_deref().map(String::as_str),
                        req,
                    )
                    .await;
                    answering.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(r)
                }
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
            if let Ok(mut o) = open_then.lock() {
                o.conns.remove(&id);
            }
        });
        if let Ok(mut o) = open.lock()
            && let Some(c) = o.conns.get_mut(&id)
        {
            c.abort = Some(task.abort_handle());
        }
    }
}

/// One open metrics connection.
struct Conn {
    opened: Instant,
    /// Requests being answered on it now.
    answering: Arc<AtomicUsize>,
    abort: Option<tokio::task::AbortHandle>,
}

/// The metrics listener's open connections.
#[derive(Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Conn>,
}

impl Open {
    /// A place for a new connection: free, or taken from the oldest connection that is not
    /// being answered (idle, or still sending its head), which is closed; `None` when every
    /// place is a request being answered.
    fn admit(&mut self, answering: Arc<AtomicUsize>) -> Option<u64> {
        self.conns
            .retain(|_, c| c.abort.as_ref().is_none_or(|a| !a.is_finished()));
        if self.conns.len() >= MAX_CONNECTIONS {
            let oldest = self
                .conns
                .iter()
                .filter(|(_, c)| c.answering.load(Ordering::SeqCst) == 0)
                .min_by_key(|(_, c)| c.opened)
                .map(|(id, _)| *id)?;
            if let Some(c) = self.conns.remove(&oldest)
                && let Some(a) = c.abort
            {
                a.abort();
            }
        }
        self.next += 1;
        self.conns.insert(
            self.next,
            Conn {
                opened: Instant::now(),
                answering,
                abort: None,
            },
        );
        Some(self.next)
    }
}

/// Whether `req` carries `Authorization: Bearer <token>` (compared in constant time).
fn authorized(req: &Request<Incoming>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| bool::from(given.trim().as_bytes().ct_eq(token.as_bytes())))
}

async fn answer(
    exporter: &Exporter,
    common: &Registry,
    token: Option<&str>,
    req: Request<Incoming>,
) -> Response<String> {
    let reply = |status: StatusCode, ty: &'static str, body: String| {
        let mut r = Response::new(body);
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(ty),
        );
        r
    };
    if let Some(t) = token
        && !authorized(&req, t)
    {
        let mut r = reply(
            StatusCode::UNAUTHORIZED,
            "text/plain; charset=utf-8",
            "a bearer token is required (daemon.metrics_token_file)\n".into(),
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
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
    let encoded = prometheus_client::encoding::text::encode_registry(&mut body, &exporter.registry)
        .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut body, common))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut body));
    match encoded {
        Ok(()) => reply(StatusCode::OK, CONTENT_TYPE, body),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

/// Latency buckets in seconds, 100 µs to about 52 s (doubling): a decision from the rules takes
/// well under a millisecond, one that waits for a fsync or a database longer.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 20)
}

/// Buckets in seconds for what may wait for a person or run as long as a turn: 1 ms to about
/// 2.3 hours (doubling), past `MAX_DECIDE_DEADLINE_MS` (an hour), so an answer given within any
/// deadline warden allows lands in a bucket of its own, never only in `+Inf`.
pub fn long_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 24)
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

    fn serve_on(
        section: &str,
    ) -> impl std::future::Future<Output = (SocketAddr, CancellationToken)> {
        let section: DaemonSection = toml::from_str(section).unwrap();
        async move {
            let l = bind(&section).await.unwrap().unwrap();
            let addr = l.addr;
            let token = CancellationToken::new();
            tokio::spawn(serve(
                l,
                Exporter {
                    registry: Registry::default(),
                    refresh: None,
                },
                token.clone(),
                "warden-test",
            ));
            (addr, token)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_holding_half_sent_requests_cannot_keep_a_scraper_out() {
        // Issue 36, finding 7: one client opening connection after connection, each sending
        // half a request head and never the rest (and opening another whenever one closes).
        // Before, 8 such connections held every place and no scrape got in (0 of 5).
        let (addr, token) = serve_on("state_dir = \"/x\"\nmetrics_listen = \"127.0.0.1:0\"").await;
        let stop = CancellationToken::new();
        let holder = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while !stop.is_cancelled() {
                    held.retain(|s: &tokio::net::TcpStream| {
                        let mut b = [0u8; 1];
                        !matches!(s.try_read(&mut b), Ok(0))
                    });
                    while held.len() < 4 * MAX_CONNECTIONS {
                        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                            break;
                        };
                        let _ = s.write_all(b"GET /metr").await;
                        held.push(s);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                held.len()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut served = 0;
        for _ in 0..5 {
            if let Ok(r) = tokio::time::timeout(Duration::from_secs(5), get(addr, "/metrics")).await
                && r.starts_with("HTTP/1.1 200")
            {
                served += 1;
            }
        }
        stop.cancel();
        let held = holder.await.unwrap();
        assert_eq!(
            served, 5,
            "scrapes served while a client held {held} connections"
        );
        token.cancel();
    }

    #[tokio::test]
    async fn with_a_token_file_a_scrape_without_the_bearer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("metrics-token");
        std::fs::write(&f, "s3cret-token\n").unwrap();
        let (addr, token) = serve_on(&format!(
            "state_dir = \"/x\"\nmetrics_listen = \"127.0.0.1:0\"\nmetrics_token_file = {:?}",
            f.display().to_string()
        ))
        .await;
        let ask = |auth: Option<&'static str>| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = match auth {
                Some(a) => format!(
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {a}\r\nConnection: close\r\n\r\n"
                ),
                None => "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(),
            };
            s.write_all(head.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(ask(None).await.starts_with("HTTP/1.1 401"));
        assert!(ask(Some("Bearer wrong")).await.starts_with("HTTP/1.1 401"));
        let ok = ask(Some("Bearer s3cret-token")).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("warden_build_info"), "{ok}");
        token.cancel();
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
            "warden-test",
        ));
        let first = get(addr, "/metrics").await;
        // Every daemon's build and process, after the service's own metrics.
        for want in [
            "warden_build_info{daemon=\"warden-test\",version=\"",
            "\nprocess_cpu_seconds_total ",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_virtual_memory_bytes ",
            "\nprocess_start_time_seconds ",
            "\nprocess_open_fds ",
            "\nprocess_max_fds ",
            "\nprocess_threads ",
        ] {
            assert!(first.contains(want), "{want} in {first}");
        }
        assert_eq!(first.matches("# EOF").count(), 1, "{first}");
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

    /// The fields of `/proc/self/stat` are counted after the command's last `)` (a command may
    /// hold both spaces and parentheses).
    #[test]
    fn process_figures_are_read_from_proc_stat_and_status() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 \
                    1000 123456789 2000 18446744073709551615";
        let status = "Name:\tx\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\nThreads:\t7\n";
        let f = ProcessFigures::parse(stat, status, 1_700_000_000);
        assert_eq!(f.cpu_seconds, 3.0);
        assert_eq!(f.threads, 7);
        assert_eq!(f.start_time_seconds, 1_700_000_010.0);
        assert_eq!(f.resident_bytes, 2048 * 1024);
        assert_eq!(f.virtual_bytes, 123456 * 1024);
        let me = ProcessFigures::read();
        assert!(
            me.threads >= 1 && me.resident_bytes > 0 && me.open_fds > 0,
            "{me:?}"
        );
        assert!(me.max_fds >= me.open_fds, "{me:?}");
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
