//! Fair shares of the gateway's open capacity (issue 31, case 4): connections and streams are
//! bounded per principal, and connections that have not authenticated have a small share of
//! their own, so one caller at its limit slows only itself.
//!
//! - [`ConnTable`]: every accepted HTTP connection starts *unauthenticated*; when
//!   `max_unauthenticated` of those exist, a new one closes the oldest (refusing the new one
//!   instead would refuse the honest caller's fresh connection, which presents its token in its
//!   first packet, while the half-sent heads that filled the share keep it). Only a connection
//!   older than [`EVICTION_GRACE`] is closed so: a burst of new connections must not close each
//!   other before the gateway has read their heads; while the oldest is younger, up to twice
//!   the share are admitted, and beyond that a new connection is refused (503, like the cap).
//!   The first authenticated request moves its connection into its principal's share, at most
//!   `max_per_principal` at once.
//! - [`StreamShares`]: streams (A2A SSE and gRPC streams, `/mcp` requests in flight) one
//!   principal holds open, at most `max_per_principal`; a permit is taken before anything of
//!   the request is stored and given back when the stream ends.
//!
//! Must never: let a connection that presented no valid token count against a principal, or a
//! refused request change anything but the counters it was refused by.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::A2aError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these maps leaves them consistent (every update is one statement).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Streams per principal.
#[derive(Debug)]
pub struct StreamShares {
    max_per_principal: usize,
    /// The refusal's message, given the limit.
    refusal: fn(usize) -> String,
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream of a principal; its share is given back on drop.
#[derive(Debug)]
pub struct StreamPermit {
    shares: Arc<StreamShares>,
    principal: String,
}

impl StreamShares {
    pub fn new(max_per_principal: usize) -> Arc<Self> {
        Self::with_refusal(max_per_principal, |limit| {
            format!(
                "this caller already holds {limit} open streams, its limit (http.max_streams_per_principal); close one or poll with GetTask"
            )
        })
    }

    /// Shares of another per-principal resource, refused with `refusal(limit)` (e.g. the gRPC
    /// requests in flight of `serve.rs`).
    pub fn with_refusal(max_per_principal: usize, refusal: fn(usize) -> String) -> Arc<Self> {
        Arc::new(Self {
            max_per_principal,
            refusal,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A permit for one more stream of `principal`, or `ResourceExhausted` at its limit.
    pub fn open(self: &Arc<Self>, principal: &str) -> Result<StreamPermit, A2aError> {
        let mut open = lock(&self.open);
        let n = open.entry(principal.to_string()).or_insert(0);
        if *n >= self.max_per_principal {
            tracing::info!(
                principal,
                limit = self.max_per_principal,
                "refused: the principal holds its whole share"
            );
            return Err(A2aError::ResourceExhausted((self.refusal)(
                self.max_per_principal,
            )));
        }
        *n += 1;
        Ok(StreamPermit {
            shares: self.clone(),
            principal: principal.to_string(),
        })
    }

    /// Streams open now, of every principal.
    pub fn total(&self) -> usize {
        lock(&self.open).values().sum()
    }

    /// Streams `principal` holds open now.
    pub fn open_of(&self, principal: &str) -> usize {
        lock(&self.open).get(principal).copied().unwrap_or(0)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = lock(&self.shares.open);
        if let Some(n) = open.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

/// How long an unauthenticated connection is safe from being closed for a newer one: time for
/// the gateway to read the head its client sent with the connect, on a busy host.
pub const EVICTION_GRACE: Duration = Duration::from_millis(250);

/// The connection shares of the HTTP edge.
#[derive(Debug)]
pub struct ConnTable {
    max_unauthenticated: usize,
    max_per_principal: usize,
    inner: Mutex<ConnInner>,
}

#[derive(Debug, Default)]
struct ConnInner {
    next_id: u64,
    /// Unauthenticated connections by accept order (ids only grow): the first is the oldest.
    unauthenticated: BTreeMap<u64, (Instant, CancellationToken)>,
    principals: HashMap<String, usize>,
}

/// Whose a connection is now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    Unauthenticated,
    /// Closed for its share before it authenticated: counted nowhere any more.
    Evicted,
    Principal(String),
}

/// One accepted connection's place in the table; leaves it on drop.
#[derive(Debug)]
pub struct ConnShare {
    table: Arc<ConnTable>,
    id: u64,
    close: CancellationToken,
    owner: Mutex<Owner>,
}

/// A principal already holds its whole connection share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtConnectionLimit(pub usize);

impl ConnTable {
    pub fn new(max_unauthenticated: usize, max_per_principal: usize) -> Arc<Self> {
        Arc::new(Self {
            max_unauthenticated: max_unauthenticated.max(1),
            max_per_principal: max_per_principal.max(1),
            inner: Mutex::new(ConnInner::default()),
        })
    }

    /// A connection just accepted: unauthenticated, or `None` when it must be refused. When
    /// their share is full the oldest unauthenticated connection is told to close (its
    /// `closed()` fires) if it is older than [`EVICTION_GRACE`].
    pub fn accept(self: &Arc<Self>) -> Option<Arc<ConnShare>> {
        self.accept_at(Instant::now())
    }

    fn accept_at(self: &Arc<Self>, now: Instant) -> Option<Arc<ConnShare>> {
        let close = CancellationToken::new();
        let mut inner = lock(&self.inner);
        while inner.unauthenticated.len() >= self.max_unauthenticated {
            let Some(mut oldest) = inner.unauthenticated.first_entry() else {
                break;
            };
            let (since, _) = oldest.get_mut();
            if now.saturating_duration_since(*since) < EVICTION_GRACE {
                // A burst: nobody here has had the time to present a token yet.
                if inner.unauthenticated.len() >= 2 * self.max_unauthenticated {
                    return None;
                }
                break;
            }
            let (_, token) = oldest.remove();
            token.cancel();
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.unauthenticated.insert(id, (now, close.clone()));
        drop(inner);
        Some(Arc::new(ConnShare {
            table: self.clone(),
            id,
            close,
            owner: Mutex::new(Owner::Unauthenticated),
        }))
    }

    /// Unauthenticated connections counted now.
    pub fn unauthenticated(&self) -> usize {
        lock(&self.inner).unauthenticated.len()
    }

    /// Connections attributed to a principal now, of every principal.
    pub fn authenticated(&self) -> usize {
        lock(&self.inner).principals.values().sum()
    }

    /// Connections attributed to `principal` now.
    pub fn of(&self, principal: &str) -> usize {
        lock(&self.inner)
            .principals
            .get(principal)
            .copied()
            .unwrap_or(0)
    }
}

impl ConnShare {
    /// Resolves when the table closes this connection (evicted from the unauthenticated share).
    pub async fn closed(&self) {
        self.close.cancelled().await
    }

    /// A request on this connection authenticated as `principal`: the connection is now that
    /// principal's, unless it is at its limit (then nothing changes and the caller refuses the
    /// request and closes the connection).
    pub fn attribute(&self, principal: &str) -> Result<(), AtConnectionLimit> {
        let mut owner = lock(&self.owner);
        if matches!(&*owner, Owner::Principal(p) if p == principal) {
            return Ok(());
        }
        let table = &self.table;
        let mut inner = lock(&table.inner);
        let n = inner.principals.get(principal).copied().unwrap_or(0);
        if n >= table.max_per_principal {
            return Err(AtConnectionLimit(table.max_per_principal));
        }
        match &*owner {
            Owner::Unauthenticated => {
                inner.unauthenticated.remove(&self.id);
            }
            Owner::Principal(before) => release(&mut inner, before),
            Owner::Evicted => {}
        }
        inner.principals.insert(principal.to_string(), n + 1);
        *owner = Owner::Principal(principal.to_string());
        Ok(())
    }
}

fn release(inner: &mut ConnInner, principal: &str) {
    if let Some(n) = inner.principals.get_mut(principal) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            inner.principals.remove(principal);
        }
    }
}

impl Drop for ConnShare {
    fn drop(&mut self) {
        let owner = std::mem::replace(&mut *lock(&self.owner), Owner::Evicted);
        let mut inner = lock(&self.table.inner);
        match owner {
            Owner::Unauthenticated => {
                inner.unauthenticated.remove(&self.id);
            }
            Owner::Principal(p) => release(&mut inner, &p),
            Owner::Evicted => {}
        }
    }
}

/// A response body that holds something (a stream permit, an MCP session's activity) until it
/// is written out or dropped.
pub struct HeldBody<T> {
    inner: axum::body::Body,
    _held: T,
}

impl<T: Send + Unpin + 'static> HeldBody<T> {
    pub fn wrap(inner: axum::body::Body, held: T) -> axum::body::Body {
        axum::body::Body::new(Self { inner, _held: held })
    }
}

impl<T: Send + Unpin + 'static> hyper::body::Body for HeldBody<T> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_at_its_stream_share_is_refused_and_others_are_not() {
        let s = StreamShares::new(2);
        let a1 = s.open("alice").unwrap();
        let _a2 = s.open("alice").unwrap();
        let e = s.open("alice").unwrap_err();
        assert!(matches!(e, A2aError::ResourceExhausted(_)), "{e:?}");
        let _b = s.open("bob").expect("bob has his own share");
        drop(a1);
        let _a3 = s
            .open("alice")
            .expect("a closed stream gives its share back");
        assert_eq!(s.open_of("alice"), 2);
    }

    #[test]
    fn a_new_connection_closes_the_oldest_unauthenticated_one() {
        let t = ConnTable::new(2, 8);
        let t0 = Instant::now();
        let later = t0 + EVICTION_GRACE;
        let c1 = t.accept_at(t0).unwrap();
        let c2 = t.accept_at(t0).unwrap();
        assert!(!c1.close.is_cancelled());
        let c3 = t.accept_at(later).unwrap();
        assert!(c1.close.is_cancelled(), "the oldest is closed");
        assert!(!c2.close.is_cancelled() && !c3.close.is_cancelled());
        assert_eq!(t.unauthenticated(), 2);
        drop(c1);
        assert_eq!(
            t.unauthenticated(),
            2,
            "an evicted one was already uncounted"
        );
        // An authenticated connection leaves the unauthenticated share: it is never evicted.
        c2.attribute("bob").unwrap();
        let evict_at = later + EVICTION_GRACE;
        let _c4 = t.accept_at(evict_at).unwrap();
        let _c5 = t.accept_at(evict_at).unwrap();
        assert!(!c2.close.is_cancelled());
        assert!(c3.close.is_cancelled());
        assert_eq!(t.of("bob"), 1);
        drop(c2);
        assert_eq!(t.of("bob"), 0);
    }

    #[test]
    fn a_burst_is_not_closed_before_its_heads_are_read() {
        let t = ConnTable::new(2, 8);
        let t0 = Instant::now();
        let burst: Vec<_> = (0..4).map(|_| t.accept_at(t0).unwrap()).collect();
        assert!(burst.iter().all(|c| !c.close.is_cancelled()));
        assert!(
            t.accept_at(t0).is_none(),
            "past twice the share, a young burst is refused, not evicted"
        );
        // Once the oldest have had their grace, a new one closes them, oldest first, until the
        // share holds it.
        let c = t.accept_at(t0 + EVICTION_GRACE).unwrap();
        assert!(burst[..3].iter().all(|c| c.close.is_cancelled()));
        assert!(!burst[3].close.is_cancelled() && !c.close.is_cancelled());
        assert_eq!(t.unauthenticated(), 2);
    }

    #[test]
    fn a_principal_at_its_connection_share_is_refused_and_others_are_not() {
        let t = ConnTable::new(4, 2);
        let a1 = t.accept().unwrap();
        let a2 = t.accept().unwrap();
        let a3 = t.accept().unwrap();
        a1.attribute("alice").unwrap();
        a2.attribute("alice").unwrap();
        a2.attribute("alice").unwrap();
        assert_eq!(a3.attribute("alice"), Err(AtConnectionLimit(2)));
        assert_eq!(t.of("alice"), 2);
        let b = t.accept().unwrap();
        b.attribute("bob").unwrap();
        // Moving a connection to another principal gives the first one's share back.
        a1.attribute("bob").unwrap();
        assert_eq!((t.of("alice"), t.of("bob")), (1, 2));
        a3.attribute("alice").unwrap();
        drop((a1, a2, a3, b));
        assert_eq!((t.of("alice"), t.of("bob"), t.unauthenticated()), (0, 0, 0));
    }
}
