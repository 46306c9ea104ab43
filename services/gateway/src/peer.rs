//! Who is on the other end of a loopback TCP connection: the uid that owns the client's socket,
//! read from the kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`).
//!
//! The MCP front uses it so a call made from inside a warden-run agent counts as deep whatever
//! headers it sends: the supervisor lists the uids its agents run as (`ListAgentsResponse`), and
//! a connection whose socket one of them owns is at recursion depth 1 or more. That includes a
//! connection the supervisor's egress proxy made for an agent: the proxy creates each such socket
//! with the agent's uid as owner (where it may switch; else it is the supervisor's uid, also
//! counted when it differs from ours), so a call that reaches us through it by any route is
//! nested even under `warden up` as root, where every daemon is uid 0. Headers can be omitted;
//! the owner of a socket cannot be chosen by the process that made it.
//!
//! Must never: trust a header over the kernel, or block the runtime thread (the table is read in
//! `spawn_blocking`, once per connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::sync::OnceCell;

/// One accepted connection's addresses, carried in every request's extensions; the socket
/// owner is looked up on first use and kept for the connection's life.
#[derive(Debug)]
pub struct ConnPeer {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    owner: OnceCell<Option<u32>>,
}

impl ConnPeer {
    pub fn new(peer: SocketAddr, local: SocketAddr) -> Arc<Self> {
        Arc::new(ConnPeer {
            peer,
            local,
            owner: OnceCell::new(),
        })
    }

    /// The uid owning the client's socket, when the client is on this host's loopback and the
    /// kernel's table names it; `None` otherwise (a remote client has no local owner).
    pub async fn owner_uid(&self) -> Option<u32> {
        *self
            .owner
            .get_or_init(|| async {
                if !self.peer.ip().is_loopback() {
                    return None;
                }
                let (peer, local) = (self.peer, self.local);
                tokio::task::spawn_blocking(move || socket_owner(peer, local))
                    .await
                    .ok()
                    .flatten()
            })
            .await
    }
}

/// Reads the socket tables for the socket whose local address is `peer` and remote address is
/// `local` (the client's end of our connection).
pub fn socket_owner(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table)
            && let Some(uid) = owner_in(&text, peer, local)
        {
            return Some(uid);
        }
    }
    None
}

/// Finds the owner in one table's text. An IPv4 client of an IPv6 listener appears in `tcp6`
/// with mapped addresses; both spellings are matched.
pub fn owner_in(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let mut f = line.split_whitespace();
        let (_sl, l, r) = (f.next()?, f.next()?, f.next()?);
        let uid = f.nth(4)?;
        if same(parse_addr(l)?, peer) && same(parse_addr(r)?, local) {
            uid.parse().ok()
        } else {
            None
        }
    })
}

fn same(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// `0100007F:1F90` (IPv4: one 32-bit word in host order) or 32 hex digits (IPv6: four words,
/// each in host order), then the port in hex.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(a, 16).ok()?.to_ne_bytes(),
        )),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                let w = u32::from_str_radix(a.get(i * 8..i * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_socket_table_names_the_owner_of_the_clients_end() {
        // Little-endian spelling, as on x86_64 and aarch64.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 61000        0 2 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000   999        0 3 1 0000000000000000 20 4 30 10 -1\n";
        if cfg!(target_endian = "little") {
            assert_eq!(
                owner_in(table, addr("127.0.0.1:54321"), addr("127.0.0.1:8080")),
                Some(61000)
            );
            // Our own end of the connection is not the client's.
            assert_eq!(
                owner_in(table, addr("127.0.0.1:8080"), addr("127.0.0.1:54321")),
                Some(999)
            );
            assert_eq!(
                owner_in(table, addr("127.0.0.1:54322"), addr("127.0.0.1:8080")),
                None
            );
        }
        assert_eq!(
            owner_in("header only\n", addr("127.0.0.1:1"), addr("127.0.0.1:2")),
            None
        );
        assert_eq!(
            owner_in(
                "h\n 0: garbage\n 1: 1:2 3:4 x x x x x\n",
                addr("127.0.0.1:1"),
                addr("127.0.0.1:2")
            ),
            None
        );
    }

    #[test]
    fn a_live_loopback_connection_is_found_with_this_processs_uid() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        let me = warden_daemon::peer::own_uid();
        assert_eq!(socket_owner(peer, s.local_addr().unwrap()), Some(me));
        drop(c);
        // An IPv6 loopback client too, when the host has IPv6.
        if let Ok(l6) = std::net::TcpListener::bind("[::1]:0") {
            let _c6 = std::net::TcpStream::connect(l6.local_addr().unwrap()).unwrap();
            let (s6, peer6) = l6.accept().unwrap();
            assert_eq!(socket_owner(peer6, s6.local_addr().unwrap()), Some(me));
        }
    }
}
