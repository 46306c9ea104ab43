//! The HTTP edge: the accept loop that serves the router over HTTP/1.1 with limits.
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
use crate::shares::{AtConnectionLimit, ConnShare, ConnTable};

/// The limits of the HTTP edge (from `[http]`).
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Connections that have not authenticated, at once (`http.max_unauthenticated_connections`).
    pub max_unauthenticated_connections: usize,
    /// Connections of one principal, at once (`http.max_connections_per_principal`).
    pub max_connections_per_principal: usize,
}

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

/// The connection's socket, noting when a new request head starts arriving.
struct TrackedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let a = &self.activity;
            if a.in_flight.load(Ordering::Relaxed) == 0 && a.head_since.load(Ordering::Relaxed) == 0
            {
                a.head_since.store(a.now_ms() + 1, Ordering::Relaxed);
            }
        }
        r
    }
}

impl tokio::io::AsyncWrite for TrackedIo {
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

/// Serves `app` on `listener` within `limits` until `shutdown`; then stops accepting, lets each
/// connection finish its current request (hyper's graceful shutdown) and returns once every
/// connection is gone. The caller bounds that wait (open SSE streams last as long as their task).
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
    serve_with(listener, app, limits, auth, table, shutdown).await
}

/// [`serve`] with the connection table given (the daemon reports it in `Status`).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: EdgeLimits,
    auth: Authenticator,
    table: Arc<ConnTable>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
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
                // EMFILE/ENFILE and aborted handshakes: back off briefly instead of spinning;
                // served connections keep working meanwhile.
                accept_errors = accept_errors.saturating_add(1);
                if accept_errors == 1 || accept_errors.is_power_of_two() {
                    tracing::warn!(error = %e, consecutive = accept_errors, "cannot accept an HTTP connection");
                }
                tokio::time::sleep(Duration::from_millis(10 * u64::from(accept_errors.min(50))))
                    .await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // A slot, then a place in the unauthenticated share (`None`: a burst of new connections
        // past twice that share, none of them old enough to be closed for it).
        let admitted = slots
            .clone()
            .try_acquire_owned()
            .ok()
            .and_then(|slot| Some((slot, table.accept()?)));
        match admitted {
            Some((slot, share)) => {
                let app = app.clone();
                let shutdown = shutdown.clone();
                let auth = auth.clone();
                tokio::spawn(async move {
                    connection(stream, app, limits, auth, share, shutdown).await;
                    drop(slot);
                });
            }
            None => match refusing.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(async move {
                        refuse(stream).await;
                        drop(permit);
                    });
                }
                Err(_) => drop(stream),
            },
        }
    }
    // Every slot back = every connection closed.
    let _ = slots.acquire_many(limits.max_connections as u32).await;
}

/// Answers 503 without reading the request, then lingers briefly so the client reads the answer
/// (closing with unread input would reset the connection and lose it).
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        stream.write_all(REFUSAL).await?;
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

async fn connection(
    stream: TcpStream,
    app: Router,
    limits: EdgeLimits,
    auth: Authenticator,
    share: Arc<ConnShare>,
    shutdown: CancellationToken,
) {
    let activity = Arc::new(Activity {
        epoch: Instant::now(),
        in_flight: AtomicUsize::new(0),
        idle_since: AtomicU64::new(0),
        // The first head is timed from the accept: a client that connects and sends nothing is
        // as slow as one that sends half a header.
        head_since: AtomicU64::new(1),
    });
    // Who is on the other end, for the MCP front's recursion check (`peer.rs`).
    let conn_peer = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(p), Ok(l)) => Some(crate::peer::ConnPeer::new(p, l)),
        _ => None,
    };
    let io = TrackedIo {
        inner: stream,
        activity: activity.clone(),
    };
    let service_activity = activity.clone();
    let service_share = share.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let in_flight = InFlight::begin(&service_activity);
        let app = app.clone();
        if let Some(p) = &conn_peer {
            req.extensions_mut().insert(p.clone());
        }
        // The token is checked here as well as by the handler (which answers a bad one): a
        // valid one makes the connection its principal's, within that principal's share.
        let refused = match auth.authenticate(req.headers()) {
            Ok(principal) => match service_share.attribute(&principal) {
                Ok(()) => None,
                Err(AtConnectionLimit(limit)) => {
                    tracing::info!(
                        principal,
                        limit,
                        "connection refused: the principal holds its whole connection share"
                    );
                    Some(at_share(req.uri().path(), limit))
                }
            },
            Err(_) => None,
        };
        async move {
            let response = match refused {
                Some(r) => r,
                None => app.oneshot(req.map(Body::new)).await?,
            };
            Ok::<_, std::convert::Infallible>(response.map(|inner| TrackedBody {
                inner,
                _in_flight: in_flight,
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        // hyper's header timer would also time idle keep-alive waits (see the module comment);
        // the watchdog below times heads and idleness separately.
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        let deadline = activity.deadline(&limits);
        // While a request is in flight nothing is timed here; look again after the shorter
        // timeout in case it has finished by then.
        let wake = deadline.unwrap_or_else(|| {
            Instant::now() + limits.header_read_timeout.min(limits.idle_timeout)
        });
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if let Some(d) = activity.deadline(&limits)
                    && Instant::now() >= d
                {
                    // Dropping the connection closes the socket: a head that did not arrive in
                    // time, or an idle keep-alive, gets no answer.
                    return;
                }
            }
            _ = share.closed() => {
                // The oldest unauthenticated connection, closed for a newer one (`shares.rs`).
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
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
