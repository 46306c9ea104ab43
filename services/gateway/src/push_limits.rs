//! What webhook work may hold, and for whom (issue 36, finding 2): webhook host names are
//! resolved on the runtime by an async stub resolver ([`Resolver`], hickory), never by
//! getaddrinfo on tokio's blocking pool, where a name whose nameserver never answers held a
//! thread past the lookup's timeout and the task store's flushes waited behind hundreds of them;
//! and each principal has its own share of the lookups and of the deliveries in flight
//! ([`Shares`]), the gateway-wide limit being the sum the shares draw from.
//!
//! Owns: the resolver (the system's nameservers, or the operator's `push.nameservers`) and the
//! two shares (`push.max_lookups_per_principal` of `push.max_lookups`, refused at once past
//! either; `push.max_deliveries_per_principal` of `push.max_deliveries`, waited for in turn).
//!
//! Must never: decide whether an address may be connected to (push.rs checks every address a
//! lookup returns and connects to the checked address itself); run a lookup on a blocking
//! thread; let one principal's lookups or deliveries take another principal's share.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Resolver as Hickory, TokioResolver};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::parse_nameserver;
use crate::error::A2aError;

/// How long one webhook lookup may take in all (every nameserver, every attempt).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves webhook host names without a blocking thread.
pub struct Resolver {
    inner: Result<TokioResolver, String>,
}

impl Resolver {
    /// The system's configuration (`/etc/resolv.conf`, `/etc/hosts`) when `nameservers` is
    /// empty, else those servers (UDP, TCP for truncated answers). A system configuration that
    /// cannot be read is not fatal: every lookup then fails (logged once here), and literal IP
    /// webhooks still work.
    pub fn new(nameservers: &[String]) -> Self {
        let inner = if nameservers.is_empty() {
            Hickory::builder_tokio()
                .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))
        } else {
            let servers = nameservers
                .iter()
                .filter_map(|s| parse_nameserver(s))
                .map(|a| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = a.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = a.port();
                    NameServerConfig::new(a.ip(), true, vec![udp, tcp])
                })
                .collect();
            Ok(Hickory::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                TokioRuntimeProvider::default(),
            ))
        }
        .and_then(|mut b| {
            let o = b.options_mut();
            // Both families, IPv4 first: every address is checked, the first one is used.
            o.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
            o.timeout = Duration::from_secs(2);
            o.attempts = 2;
            b.build()
                .map_err(|e| format!("cannot set up the resolver: {e}"))
        });
        if let Err(e) = &inner {
            tracing::warn!(error = %e, "webhook host names will not resolve (push.nameservers can name the servers)");
        }
        Self { inner }
    }

    /// Every address `host` resolves to, with `port`; an error says why there is none (no
    /// answer within [`LOOKUP_TIMEOUT`], no such name, no nameserver).
    pub async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let r = self
            .inner
            .as_ref()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?;
        // Dropping the lookup on the timeout ends it: nothing is left running for it.
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, r.lookup_ip(host))
            .await
            .map_err(|_| format!("resolving {host} timed out"))?
            .map_err(|e| format!("cannot resolve {host}: {e}"))?;
        let addrs: Vec<SocketAddr> = found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        if addrs.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        Ok(addrs)
    }
}

/// One kind of webhook work: each principal holds at most `per_principal` at once, everyone
/// together at most `total`.
pub struct Shares {
    per_principal: usize,
    total: Arc<Semaphore>,
    limit: usize,
    principals: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// The config keys named in a refusal: (per principal, total).
    keys: (&'static str, &'static str),
}

/// A share held; given back on drop.
#[derive(Debug)]
pub struct SharePermit {
    _mine: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

impl Shares {
    pub fn new(per_principal: usize, total: usize, keys: (&'static str, &'static str)) -> Self {
        Self {
            per_principal: per_principal.max(1),
            total: Arc::new(Semaphore::new(total.max(1))),
            limit: total.max(1),
            principals: Mutex::new(HashMap::new()),
            keys,
        }
    }

    fn semaphore(&self, principal: &str) -> Arc<Semaphore> {
        let mut m = self.principals.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(principal.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_principal)))
            .clone()
    }

    /// One of `principal`'s share now, or ResourceExhausted naming the limit it is at.
    pub fn try_take(&self, principal: &str, what: &str) -> Result<SharePermit, A2aError> {
        let mine = self.semaphore(principal).try_acquire_owned().map_err(|_| {
            tracing::info!(principal, limit = self.per_principal, what, "refused: the principal holds its whole share");
            A2aError::ResourceExhausted(format!(
                "this caller already has {} {what} in flight, its limit ({}); try again when they end",
                self.per_principal, self.keys.0
            ))
        })?;
        let total = self.total.clone().try_acquire_owned().map_err(|_| {
            tracing::info!(
                principal,
                limit = self.limit,
                what,
                "refused: the gateway's whole limit is in use"
            );
            A2aError::ResourceExhausted(format!(
                "the gateway has {} {what} in flight, its limit ({}); try again shortly",
                self.limit, self.keys.1
            ))
        })?;
        Ok(SharePermit {
            _mine: mine,
            _total: total,
        })
    }

    /// One of `principal`'s share, waiting for it: a principal waits behind its own work first,
    /// so at most its share of it waits for the gateway-wide limit (FIFO), beside every other
    /// principal's share.
    pub async fn take(&self, principal: &str) -> Result<SharePermit, A2aError> {
        let closed = |_| A2aError::Internal("the push shares are closed".into());
        let mine = self
            .semaphore(principal)
            .acquire_owned()
            .await
            .map_err(closed)?;
        let total = self.total.clone().acquire_owned().await.map_err(closed)?;
        Ok(SharePermit {
            _mine: mine,
            _total: total,
        })
    }

    /// Held now by `principal` (for tests and figures).
    pub fn held_by(&self, principal: &str) -> usize {
        let m = self.principals.lock().unwrap_or_else(|p| p.into_inner());
        m.get(principal)
            .map(|s| self.per_principal - s.available_permits())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_with_and_without_a_port() {
        assert_eq!(
            parse_nameserver("127.0.0.1:5353"),
            Some("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(
            parse_nameserver("10.0.0.2"),
            Some("10.0.0.2:53".parse().unwrap())
        );
        assert_eq!(
            parse_nameserver("[::1]:5353"),
            Some("[::1]:5353".parse().unwrap())
        );
        assert_eq!(parse_nameserver("::1"), Some("[::1]:53".parse().unwrap()));
        assert_eq!(parse_nameserver("ns.example.com"), None);
    }

    #[test]
    fn one_principal_at_its_share_leaves_the_others_theirs() {
        let s = Shares::new(2, 5, ("push.max_lookups_per_principal", "push.max_lookups"));
        let b1 = s.try_take("bob", "lookups").unwrap();
        let _b2 = s.try_take("bob", "lookups").unwrap();
        let e = s.try_take("bob", "lookups").unwrap_err();
        assert!(
            e.to_string().contains("push.max_lookups_per_principal"),
            "{e}"
        );
        let _a1 = s.try_take("alice", "lookups").unwrap();
        let _a2 = s.try_take("alice", "lookups").unwrap();
        drop(b1);
        assert_eq!(s.held_by("bob"), 1);
        let _b3 = s.try_take("bob", "lookups").unwrap();
        // 5 in all: carol gets one, then the total is reached.
        let _c1 = s.try_take("carol", "lookups").unwrap();
        let e = s.try_take("carol", "lookups").unwrap_err();
        assert!(e.to_string().contains("push.max_lookups)"), "{e}");
    }

    #[tokio::test]
    async fn a_lookup_that_never_gets_an_answer_ends_at_its_timeout_without_a_thread() {
        // A nameserver that reads and never answers.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = Resolver::new(&[silent.local_addr().unwrap().to_string()]);
        let started = std::time::Instant::now();
        let e = r.lookup("hook.example.com", 443).await.unwrap_err();
        assert!(
            e.contains("timed out") || e.contains("cannot resolve"),
            "{e}"
        );
        assert!(started.elapsed() < LOOKUP_TIMEOUT + Duration::from_secs(2));
        // Special names are answered without a nameserver.
        let lo = r.lookup("localhost", 80).await.unwrap();
        assert!(lo.iter().all(|a| a.ip().is_loopback()), "{lo:?}");
    }
}
