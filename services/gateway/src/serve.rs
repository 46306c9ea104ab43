//! The edge: the accept loop that serves the A2A listeners with limits — the HTTP listener
//! (HTTP/1.1: the JSON bindings, the card, MCP) and the A2A gRPC listener on TCP (HTTP/2, issue
//! 36 finding 4: it had been a separate tonic server with no cap and no deadline, and 4,196 idle
//! connections that never sent the HTTP/2 preface filled a 4096-file gateway). Both listeners
//! share one [`Edge`]: one connection cap, one table of connection shares, the same deadlines.
//!
//! `axum::serve` has no connection cap and no timeouts, so 1,100 connections that each sent half
//! a header held 1,100 file descriptors for ever (finding 3 of issue 13). Here:
//! - at most `max_connections` connections are served; one over the cap is answered a fixed 503
//!   at once and closed, without reading its request, so refusing costs almost nothing and the
//!   connections already served (their tasks, their SSE streams) are untouched;
//! - a connection must deliver a complete request head within `header_read_timeout` of being
//!   accepted, and later heads within the same time of their first byte;
//! - a kept-alive connection with no request in flight is closed after `idle_timeout`. A request
//!   is in flight until its response body has been written to the end, so an SSE stream keeps
//!   its connection however quiet it is;
//! - request bodies are timed by the handlers (`http.body_read_timeout_ms`), never responses;
//! - connections have fair shares (`shares.rs`, issue 31 case 4): a connection is
//!   unauthenticated until a request on it presents a valid token, and the unauthenticated ones
//!   have a share of their own (a new one closes the oldest), so half-sent headers cannot fill
//!   the cap; from its first authenticated request a connection counts against its principal,
//!   and a request that would take a principal past its share is answered 429 and its
//!   connection closed, in the shape of the route's protocol (a JSON-RPC error on the JSON-RPC
//!   and MCP endpoints, a `google.rpc.Status` body elsewhere), before any handler sees it.
//!
//! On the gRPC listener (HTTP/2, many requests on one connection) the same rules read:
//! - the preface and a first complete request head must arrive within `header_read_timeout` of
//!   the accept (a connection that sent nothing, or half a preface, is closed); after that the
//!   connection is idle while no stream is open and is closed (GOAWAY) after `idle_timeout`
//!   however many pings it sends;
//! - a request without a valid token is answered UNAUTHENTICATED by the edge itself (health
//!   checks excepted), so an unauthenticated connection never holds a stream open;
//! - an authenticated request attributes its connection to its principal, as above (past the
//!   share: RESOURCE_EXHAUSTED and the connection is shut down), and holds one of the
//!   principal's `max_grpc_requests_per_principal` requests in flight until its response ends
//!   (HTTP/1.1 has one request per connection; HTTP/2 multiplexes up to `grpc_max_concurrent_streams`);
//! - a connection over the cap is sent an HTTP/2 GOAWAY instead of the 503.
//!
//! With `http.tls` both listeners speak TLS: a connection's handshake (its client certificate
//! verified there, when one is asked for) must finish within `header_read_timeout` of the
//! accept, holding its slot meanwhile; the certificate rides in each of its requests'
//! extensions (`auth::ConnCert`) for the authenticator. Over the cap a TLS connection is closed
//! unanswered (a plain 503 would be garbage to it).
//!
//! hyper's own `header_read_timeout` is not used: it is armed whenever hyper waits for a head,
//! including on an idle kept-alive connection, so it would also be the idle timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::auth::Authenticator;
use crate::error::A2aError;
use crate::shares::{AtConnectionLimit, ConnShare, ConnTable, StreamPermit, StreamShares};

/// The limits of the edge (from `[http]`; they hold on every listener it serves).
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Connections that have not authenticated, at once (`http.max_unauthenticated_connections`).
    pub max_unauthenticated_connections: usize,
    /// Connections of one principal, at once (`http.max_connections_per_principal`).
    pub max_connections_per_principal: usize,
    /// Requests one principal has in flight on gRPC connections at once
    /// (`http.max_grpc_requests_per_principal`).
    pub max_grpc_requests_per_principal: usize,
    /// Streams (requests) open at once on one gRPC connection (`http.grpc_max_concurrent_streams`).
    pub grpc_max_concurrent_streams: u32,
}

/// What a listener of the edge speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1: the A2A JSON bindings, the agent card, MCP.
    Http1,
    /// HTTP/2 with gRPC's refusals: the A2A gRPC binding on TCP.
    Grpc,
}

/// The health service a load balancer may ask without a token.
const GRPC_HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Refusals being written at once; beyond it an over-the-cap connection is closed without a 503
/// so that refusing cannot itself hold an unbounded number of descriptors.
const MAX_REFUSING: usize = 64;
/// How long a refused connection is given to read its 503 before it is closed.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: application/json\r\n\
Retry-After: 1\r\n\
Connection: close\r\n\
Content-Length: 114\r\n\r\n\
{\"error\":{\"code\":503,\"status\":\"UNAVAILABLE\",\"message\":\"the gateway is serving its maximum number of connections\"}}";

/// What a gRPC client over the cap reads: the server's HTTP/2 preface (an empty SETTINGS frame)
/// and a GOAWAY that admits no stream (last stream id 0, NO_ERROR, a reason as debug data), so
/// its calls fail UNAVAILABLE and may be retried.
fn grpc_refusal() -> Vec<u8> {
    const WHY: &[u8] = b"the gateway is serving its maximum number of connections";
    let mut out = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let len = (8 + WHY.len()) as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(WHY);
    out
}

/// A gRPC answer given by the edge itself (trailers-only), in the binding's own status shape.
fn grpc_answer(status: tonic::Status) -> axum::response::Response {
    status.into_http::<Body>()
}

/// The answer to a request whose principal holds its whole connection share: 429 in the route's
/// own shape, and the connection closed after it (it is not counted for the principal).
fn at_share(path: &str, limit: usize) -> axum::response::Response {
    use axum::http::{HeaderValue, StatusCode, header};
    use axum::response::IntoResponse;
    let message = format!(
        "this caller already holds {limit} connections to the gateway, its limit (http.max_connections_per_principal); reuse or close one"
    );
    let jsonrpc = path == crate::mcp::MCP_PATH
        || path == "/"
        || path.trim_end_matches('/') == crate::endpoints::JSONRPC_PATH;
    let body = if jsonrpc {
        serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": crate::error::RESOURCE_EXHAUSTED_CODE, "message": message}})
    } else {
        serde_json::json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": message}})
    };
    let mut r = (StatusCode::TOO_MANY_REQUESTS, body.to_string()).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// What a connection is doing, shared by its IO, its requests and its watchdog (all on the
/// connection's own task; atomics only because hyper requires `Send`).
struct Activity {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// ms since `epoch` at which the connection became idle (no request in flight).
    idle_since: AtomicU64,
    /// ms since `epoch` + 1 at which the current head began (accept, or a byte read while idle);
    /// 0 while no head is being read.
    head_since: AtomicU64,
}

impl Activity {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// When this connection must be closed if nothing changes, or `None` if a request is in
    /// flight (then it is never closed for time here).
    fn deadline(&self, limits: &EdgeLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let at = match self.head_since.load(Ordering::Relaxed) {
            0 => self.idle_since.load(Ordering::Relaxed) + limits.idle_timeout.as_millis() as u64,
            h => h - 1 + limits.header_read_timeout.as_millis() as u64,
        };
        Some(self.epoch + Duration::from_millis(at))
    }
}

/// The connection's socket, noting when a new request head starts arriving (on HTTP/1.1: on
/// HTTP/2 bytes arrive while idle without starting a request — pings, window updates — so only
/// the first request is timed from the accept and idleness from the last stream's end).
struct TrackedIo<S> {
    inner: S,
    activity: Arc<Activity>,
    heads_timed: bool,
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.heads_timed && buf.filled().len() > before {
            let a = &self.activity;
            if a.in_flight.load(Ordering::Relaxed) == 0 && a.head_since.load(Ordering::Relaxed) == 0
            {
                a.head_since.store(a.now_ms() + 1, Ordering::Relaxed);
            }
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for TrackedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Held by a response body: the request is in flight until the body is dropped (written out or
/// abandoned).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.head_since.store(0, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle_since.store(self.0.now_ms(), Ordering::Relaxed);
        }
    }
}

/// A response body that keeps its request in flight while it is being written.
struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
    /// A gRPC request's place in its principal's share of requests in flight.
    _permit: Option<StreamPermit>,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The fair-share key of requests without a valid token: a principal is a configured name or
/// `ISSUER#sub`, never this.
const UNAUTHENTICATED: &str = "(unauthenticated)";

/// The edge every A2A listener is served by: one connection cap and one table of connection
/// shares over all of them (a flood on one listener is bounded by the same shares as on the
/// other, and the file descriptors it can take by one cap).
pub struct Edge {
    limits: EdgeLimits,
    auth: Authenticator,
    table: Arc<ConnTable>,
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    grpc_requests: Arc<StreamShares>,
    /// Each principal's share of the poll time spent on requests (`warden-fairshare`): a
    /// principal with hundreds of requests in flight is polled no more than one with one.
    fair: Arc<warden_fairshare::Scheduler>,
}

impl Edge {
    pub fn new(limits: EdgeLimits, auth: Authenticator, table: Arc<ConnTable>) -> Arc<Self> {
        Arc::new(Self {
            limits,
            auth,
            table,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            fair: warden_fairshare::global().clone(),
            grpc_requests: StreamShares::with_refusal(
                limits.max_grpc_requests_per_principal,
                |limit| {
                    format!(
                        "this caller already has {limit} gRPC requests in flight, its limit (http.max_grpc_requests_per_principal); wait for one to finish"
                    )
                },
            ),
        })
    }

    /// Serves `app` on `listener` speaking `protocol` until `shutdown`; then stops accepting,
    /// lets each connection finish its current requests (hyper's graceful shutdown) and returns
    /// once every connection of this listener is gone. The caller bounds that wait (open SSE
    /// and gRPC streams last as long as their task). With `tls`, each connection's handshake
    /// comes first, within the head timeout, and holds its slot meanwhile.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        app: Router,
        protocol: Protocol,
        tls: Option<Arc<warden_daemon::tls::CallerTls>>,
        shutdown: CancellationToken,
    ) {
        // Every connection task holds a sender: all gone = every connection closed.
        let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
        let mut accept_errors = 0u32;
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.cancelled() => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => {
                    accept_errors = 0;
                    stream
                }
                Err(e) => {
                    // EMFILE/ENFILE and aborted handshakes: back off briefly instead of
                    // spinning; served connections keep working meanwhile.
                    accept_errors = accept_errors.saturating_add(1);
                    if accept_errors == 1 || accept_errors.is_power_of_two() {
                        tracing::warn!(error = %e, consecutive = accept_errors, ?protocol, "cannot accept a connection");
                    }
                    tokio::time::sleep(Duration::from_millis(
                        10 * u64::from(accept_errors.min(50)),
                    ))
                    .await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            // A slot, then a place in the unauthenticated share (`None`: a burst of new
            // connections past twice that share, none of them old enough to be closed for it).
            let admitted = self
                .slots
                .clone()
                .try_acquire_owned()
                .ok()
                .and_then(|slot| Some((slot, self.table.accept()?)));
            match admitted {
                Some((slot, share)) => {
                    let (edge, app, shutdown, open, tls) = (
                        self.clone(),
                        app.clone(),
                        shutdown.clone(),
                        open.clone(),
                        tls.clone(),
                    );
                    tokio::spawn(async move {
                        // Who is on the other end, for the MCP front's recursion check
                        // (`peer.rs`).
                        let conn_peer = match (stream.peer_addr(), stream.local_addr()) {
                            (Ok(p), Ok(l)) => Some(crate::peer::ConnPeer::new(p, l)),
                            _ => None,
                        };
                        match tls {
                            None => {
                                edge.connection(
                                    stream, conn_peer, None, app, protocol, share, shutdown,
                                )
                                .await
                            }
                            Some(tls) => {
                                let timeout = edge.limits.header_read_timeout;
                                if let Some((stream, cert)) = tls.accept(stream, timeout).await {
                                    let cert = cert.map(|c| crate::auth::ConnCert(Arc::new(c)));
                                    edge.connection(
                                        stream, conn_peer, cert, app, protocol, share, shutdown,
                                    )
                                    .await
                                }
                            }
                        }
                        drop(slot);
                        drop(open);
                    });
                }
                // Over the cap, a TLS listener's connection is closed unanswered: a plain 503
                // would be garbage to a TLS client.
                None if tls.is_some() => drop(stream),
                None => match self.refusing.clone().try_acquire_owned() {
                    Ok(permit) => {
                        tokio::spawn(async move {
                            refuse(stream, protocol).await;
                            drop(permit);
                        });
                    }
                    Err(_) => drop(stream),
                },
            }
        }
        drop(open);
        let _ = all_closed.recv().await;
    }
}

/// Serves `app` over HTTP/1.1 on `listener` within `limits` until `shutdown`, as the only
/// listener of its edge (the bench's).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: EdgeLimits,
    auth: Authenticator,
    shutdown: CancellationToken,
) {
    let table = ConnTable::new(
        limits.max_unauthenticated_connections,
        limits.max_connections_per_principal,
    );
    Edge::new(limits, auth, table)
        .serve(listener, app, Protocol::Http1, None, shutdown)
        .await
}

/// Answers 503 (on gRPC: a GOAWAY) without reading the request, then lingers briefly so the
/// client reads the answer (closing with unread input would reset the connection and lose it).
async fn refuse(mut stream: TcpStream, protocol: Protocol) {
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        match protocol {
            Protocol::Http1 => stream.write_all(REFUSAL).await?,
            Protocol::Grpc => stream.write_all(&grpc_refusal()).await?,
        }
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        loop {
            use tokio::io::AsyncReadExt;
            if stream.read(&mut sink).await? == 0 {
                return Ok::<_, std::io::Error>(());
            }
        }
    })
    .await;
}

impl Edge {
    #[allow(clippy::too_many_arguments)]
    async fn connection<S>(
        self: Arc<Self>,
        stream: S,
        conn_peer: Option<Arc<crate::peer::ConnPeer>>,
        cert: Option<crate::auth::ConnCert>,
        app: Router,
        protocol: Protocol,
        share: Arc<ConnShare>,
        shutdown: CancellationToken,
    ) where
        S: AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let limits = self.limits;
        let activity = Arc::new(Activity {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            // The first head is timed from the accept: a client that connects and sends
            // nothing is as slow as one that sends half a header (or half a preface).
            head_since: AtomicU64::new(1),
        });
        let io = TokioIo::new(TrackedIo {
            inner: stream,
            activity: activity.clone(),
            heads_timed: protocol == Protocol::Http1,
        });
        // Cancelled by a request refused at the principal's connection share on HTTP/2 (on
        // HTTP/1.1 its `Connection: close` ends the connection).
        let close = CancellationToken::new();
        let service_activity = activity.clone();
        let service_share = share.clone();
        let service_close = close.clone();
        let edge = self.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let in_flight = InFlight::begin(&service_activity);
            let app = app.clone();
            if let Some(p) = &conn_peer {
                req.extensions_mut().insert(p.clone());
            }
            if let Some(c) = &cert {
                req.extensions_mut().insert(c.clone());
            }
            let edge = edge.clone();
            let share = service_share.clone();
            let close = service_close.clone();
            async move {
                let answered = edge.admit(&mut req, protocol, &share, &close).await;
                let (response, permit) = match answered {
                    Err(r) => (*r, None),
                    Ok((permit, principal)) => {
                        // The request's work is its principal's (the callers without a valid
                        // token share one key, which no principal can be named).
                        let key = principal.as_deref().unwrap_or(UNAUTHENTICATED);
                        let served = edge.fair.fair(key, app.oneshot(req.map(Body::new)));
                        (served.await?, permit)
                    }
                };
                Ok::<_, std::convert::Infallible>(response.map(|inner| TrackedBody {
                    inner,
                    _in_flight: in_flight,
                    _permit: permit,
                }))
            }
        });
        // One loop for both protocols; only the connection type differs.
        macro_rules! drive {
            ($conn:expr) => {{
                let conn = $conn;
                tokio::pin!(conn);
                // Set once the connection is being shut down for idleness (HTTP/2): it gets a
                // head timeout more to say goodbye, then it is dropped.
                let mut closing_by: Option<Instant> = None;
                let mut draining = false;
                loop {
                    let busy = activity.in_flight.load(Ordering::Relaxed) > 0;
                    // A connection told GOAWAY lets the requests it had accepted finish.
                    let deadline = match closing_by {
                        Some(by) => (!busy).then_some(by),
                        None => activity.deadline(&limits),
                    };
                    // While a request is in flight nothing is timed here; look again after
                    // the shorter timeout in case it has finished by then.
                    let wake = deadline.unwrap_or_else(|| {
                        Instant::now() + limits.header_read_timeout.min(limits.idle_timeout)
                    });
                    tokio::select! {
                        r = conn.as_mut() => {
                            if let Err(e) = r {
                                tracing::debug!(error = %e, ?protocol, "connection ended with an error");
                            }
                            return;
                        }
                        _ = tokio::time::sleep_until(wake.into()) => {
                            if let Some(by) = closing_by {
                                if activity.in_flight.load(Ordering::Relaxed) == 0
                                    && Instant::now() >= by
                                {
                                    return;
                                }
                                continue;
                            }
                            if let Some(d) = activity.deadline(&limits)
                                && Instant::now() >= d
                            {
                                // A head (or preface and first request) that did not arrive
                                // in time gets no answer: dropping the connection closes the
                                // socket. An idle HTTP/2 connection that has served requests
                                // is told GOAWAY first, so its client does not send on it.
                                if protocol == Protocol::Http1
                                    || activity.head_since.load(Ordering::Relaxed) != 0
                                {
                                    return;
                                }
                                conn.as_mut().graceful_shutdown();
                                closing_by = Some(Instant::now() + limits.header_read_timeout);
                            }
                        }
                        _ = share.closed() => {
                            // The oldest unauthenticated connection, closed for a newer one
                            // (`shares.rs`).
                            return;
                        }
                        _ = close.cancelled(), if !draining => {
                            draining = true;
                            conn.as_mut().graceful_shutdown();
                        }
                        _ = shutdown.cancelled(), if !draining => {
                            draining = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }};
        }
        match protocol {
            Protocol::Http1 => drive!(
                hyper::server::conn::http1::Builder::new()
                    // hyper's header timer would also time idle keep-alive waits (see the
                    // module comment); the loop above times heads and idleness separately.
                    .header_read_timeout(None)
                    .serve_connection(io, service)
            ),
            Protocol::Grpc => drive!(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .max_concurrent_streams(limits.grpc_max_concurrent_streams)
                    .serve_connection(io, service)
            ),
        }
    }

    /// The edge's own checks of a request, before the router sees it: the token makes the
    /// connection its principal's, within that principal's share; on gRPC a request without a
    /// valid token is answered here (so it never holds a stream), and one with a token takes a
    /// place in its principal's share of requests in flight. `Err` is the answer.
    async fn admit(
        &self,
        req: &mut hyper::Request<Incoming>,
        protocol: Protocol,
        share: &ConnShare,
        close: &CancellationToken,
    ) -> Result<(Option<StreamPermit>, Option<String>), Box<axum::response::Response>> {
        // The token is checked here once; the identity rides in the request's extensions to
        // the handler, which answers a bad token in its binding's shape (and counts it).
        let cert = req
            .extensions()
            .get::<crate::auth::ConnCert>()
            .map(|c| c.0.clone());
        let principal = match self
            .auth
            .authenticate_with(req.headers(), cert.as_deref())
            .await
        {
            Ok(id) => {
                let p = id.principal.clone();
                req.extensions_mut().insert(crate::auth::Authenticated(id));
                p
            }
            Err(f) => {
                return match protocol {
                    Protocol::Grpc if !req.uri().path().starts_with(GRPC_HEALTH_PREFIX) => {
                        crate::metrics::auth_refused(f.reason());
                        Err(Box::new(grpc_answer(crate::a2a_grpc::unauthenticated(f))))
                    }
                    _ => Ok((None, None)),
                };
            }
        };
        if let Err(AtConnectionLimit(limit)) = share.attribute(&principal) {
            tracing::info!(
                principal,
                limit,
                ?protocol,
                "connection refused: the principal holds its whole connection share"
            );
            return Err(Box::new(match protocol {
                Protocol::Http1 => at_share(req.uri().path(), limit),
                Protocol::Grpc => {
                    close.cancel();
                    grpc_answer(crate::a2a_grpc::status_of(&A2aError::ResourceExhausted(
                        format!(
                            "this caller already holds {limit} connections to the gateway, its limit (http.max_connections_per_principal); reuse or close one"
                        ),
                    )))
                }
            }));
        }
        match protocol {
            Protocol::Http1 => Ok((None, Some(principal))),
            Protocol::Grpc => match self.grpc_requests.open(&principal) {
                Ok(permit) => Ok((Some(permit), Some(principal))),
                Err(e) => Err(Box::new(grpc_answer(crate::a2a_grpc::status_of(&e)))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_well_formed_response_with_a_json_error() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["status"], "UNAVAILABLE");
    }

    #[test]
    fn the_grpc_refusal_is_a_settings_frame_then_a_goaway_admitting_no_stream() {
        let r = grpc_refusal();
        assert_eq!(&r[..9], &[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let goaway = &r[9..];
        let len = u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize;
        assert_eq!(goaway.len(), 9 + len);
        assert_eq!(goaway[3], 0x7, "type GOAWAY");
        assert_eq!(
            &goaway[5..17],
            &[0; 12],
            "stream 0, last stream 0, NO_ERROR"
        );
        assert!(
            std::str::from_utf8(&goaway[17..])
                .unwrap()
                .contains("maximum")
        );
    }

    #[tokio::test]
    async fn a_refusal_at_the_share_speaks_the_routes_protocol_and_closes() {
        for (path, jsonrpc) in [
            ("/a2a/jsonrpc", true),
            ("/a2a/jsonrpc/", true),
            ("/", true),
            ("/mcp", true),
            ("/a2a/rest/tasks/t1", false),
            ("/v1/tasks/t1:subscribe", false),
        ] {
            let r = at_share(path, 7);
            assert_eq!(r.status(), 429, "{path}");
            assert_eq!(r.headers()["connection"], "close", "{path}");
            assert_eq!(r.headers()["retry-after"], "1", "{path}");
            let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if jsonrpc {
                assert_eq!(v["jsonrpc"], "2.0", "{path}");
                assert_eq!(v["error"]["code"], -32029, "{path}");
            } else {
                assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED", "{path}");
                assert_eq!(v["error"]["code"], 429, "{path}");
            }
        }
    }

    #[test]
    fn heads_are_timed_from_their_start_and_idleness_from_the_last_response() {
        let limits = EdgeLimits {
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(1000),
            max_connections: 1,
            max_unauthenticated_connections: 1,
            max_connections_per_principal: 1,
            max_grpc_requests_per_principal: 1,
            grpc_max_concurrent_streams: 1,
        };
        let a = Arc::new(Activity {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(1),
        });
        assert_eq!(
            a.deadline(&limits),
            Some(a.epoch + Duration::from_millis(100))
        );
        let req = InFlight::begin(&a);
        assert_eq!(
            a.deadline(&limits),
            None,
            "nothing is timed while a request is in flight"
        );
        drop(req);
        let idle = a.deadline(&limits).unwrap();
        assert!(idle >= a.epoch + Duration::from_millis(1000), "{idle:?}");
    }
}
