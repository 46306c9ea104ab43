//! Peer credentials and the per-listener allowlist.
//!
//! On a Unix socket the kernel tells us who connected: SO_PEERCRED (uid, gid, pid) and
//! SO_PEERGROUPS (the supplementary groups), both as they were when the peer called `connect`.
//! They are read from the socket once, when the connection is accepted ([`PeerStream`]), and
//! every request on that connection passes through [`PeerGuard`] with them before any service
//! sees it; a refused peer gets `PERMISSION_DENIED` and a log line. Nothing is looked up by pid:
//! a pid can be reused by another process between connect and request, a socket's credentials
//! cannot change.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;
use tonic::{Request, Status};

/// Who called, as the kernel reported it. Inserted into every admitted request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl Peer {
    /// The peer of a request admitted by a [`PeerGuard`] on a Unix listener.
    pub fn of<T>(req: &Request<T>) -> Option<Peer> {
        req.extensions().get::<Peer>().copied()
    }
}

/// What the kernel said about a connection's peer when it was accepted. `None` fields mean the
/// kernel would not say; the guard then admits by what it has and refuses otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub peer: Option<Peer>,
    /// Supplementary groups at connect time (SO_PEERGROUPS).
    pub groups: Option<Arc<[u32]>>,
    /// On a mutual-TLS listener: the SPIFFE ID of the peer's verified certificate (`tls.rs`).
    pub identity: Option<Arc<str>>,
}

/// The SPIFFE ID of a caller admitted on a mutual-TLS listener, inserted into its requests'
/// extensions as [`Peer`] is on a Unix listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity(pub Arc<str>);

impl PeerInfo {
    /// A connection known by its certificate's verified identity (no kernel credentials).
    pub fn with_identity(id: String) -> Self {
        Self {
            peer: None,
            groups: None,
            identity: Some(Arc::from(id)),
        }
    }

    /// Reads SO_PEERCRED and SO_PEERGROUPS from a connected Unix socket.
    pub fn of_socket(stream: &UnixStream) -> Self {
        let peer = stream.peer_cred().ok().map(|c| Peer {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
        });
        let groups = match peer_groups(stream.as_fd()) {
            Ok(g) => Some(Arc::from(g)),
            Err(e) => {
                tracing::debug!(error = %e, "SO_PEERGROUPS unavailable; supplementary groups not considered");
                None
            }
        };
        Self {
            peer,
            groups,
            identity: None,
        }
    }
}

/// `SO_PEERGROUPS` (Linux 4.13). The libc crate does not export it for every Linux target; the
/// value is 59 on every architecture warden builds for except SPARC.
#[cfg(all(
    target_os = "linux",
    not(any(target_arch = "sparc", target_arch = "sparc64"))
))]
const SO_PEERGROUPS: libc::c_int = 59;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "sparc", target_arch = "sparc64")
))]
const SO_PEERGROUPS: libc::c_int = 0x003d;

/// The peer's supplementary groups, from the socket.
pub fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    // NGROUPS_MAX is 65536; start small and grow to what the kernel says it needs.
    let mut buf: Vec<libc::gid_t> = vec![0; 64];
    for _ in 0..4 {
        let mut len = libc::socklen_t::try_from(buf.len() * std::mem::size_of::<libc::gid_t>())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `fd` is a live descriptor for the duration of the call (borrowed); `buf` is a
        // writable buffer of exactly `len` bytes, and the kernel writes at most `len` bytes and
        // stores the length it wrote (or, on ERANGE, the length it needs) in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let need = usize::try_from(len).unwrap_or(0) / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            buf.truncate(need.min(buf.len()));
            return Ok(buf);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) || need <= buf.len() {
            return Err(err);
        }
        buf = vec![0; need];
    }
    Err(io::Error::other("SO_PEERGROUPS kept growing"))
}

/// This process's real uid (what a peer of the same user shows as).
pub fn own_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// An accepted connection with what is known of its peer, read once at accept: a Unix socket's
/// kernel credentials, or a mutual-TLS connection's verified identity (`tls.rs`).
#[derive(Debug)]
pub struct PeerStream<S = UnixStream> {
    inner: S,
    info: PeerInfo,
}

impl PeerStream<UnixStream> {
    pub fn accepted(inner: UnixStream) -> Self {
        let info = PeerInfo::of_socket(&inner);
        Self { inner, info }
    }
}

impl<S> PeerStream<S> {
    /// A connection whose peer was established another way (a TLS handshake).
    pub(crate) fn with_info(inner: S, info: PeerInfo) -> Self {
        Self { inner, info }
    }

    pub fn info(&self) -> &PeerInfo {
        &self.info
    }
}

impl<S> Connected for PeerStream<S> {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PeerStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PeerStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[derive(Debug)]
struct Allow {
    listener: String,
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
    any: bool,
    /// SPIFFE IDs admitted on a mutual-TLS listener.
    identities: BTreeSet<String>,
}

/// The allowlist of one listener, as a tonic interceptor.
#[derive(Debug, Clone)]
pub struct PeerGuard {
    allow: Arc<Allow>,
}

impl PeerGuard {
    /// `uids`/`gids` empty (and `any` false) admits only this process's own uid.
    pub fn new(listener: impl Into<String>, uids: &[u32], gids: &[u32], any: bool) -> Self {
        let mut uids: BTreeSet<u32> = uids.iter().copied().collect();
        if uids.is_empty() && gids.is_empty() {
            uids.insert(nix::unistd::getuid().as_raw());
        }
        PeerGuard {
            allow: Arc::new(Allow {
                listener: listener.into(),
                uids,
                gids: gids.iter().copied().collect(),
                any,
                identities: BTreeSet::new(),
            }),
        }
    }

    /// A guard for a mutual-TLS listener: it admits connections whose verified certificate
    /// carries one of `identities` (checked at the handshake, and again here for every call).
    pub fn identities(listener: impl Into<String>, identities: &[String]) -> Self {
        PeerGuard {
            allow: Arc::new(Allow {
                listener: listener.into(),
                uids: BTreeSet::new(),
                gids: BTreeSet::new(),
                any: false,
                identities: identities.iter().cloned().collect(),
            }),
        }
    }

    /// Whether a peer with these credentials may call.
    pub fn admits(&self, uid: u32, gid: u32) -> bool {
        self.allow.any || self.allow.uids.contains(&uid) || self.allow.gids.contains(&gid)
    }

    /// Whether a peer is admitted through a supplementary group. SO_PEERCRED reports only the
    /// primary gid, so an operator who is merely a member of the operators' group needs these.
    pub fn admits_groups(&self, groups: &[u32]) -> bool {
        groups.iter().any(|g| self.allow.gids.contains(g))
    }

    /// Whether a connection's peer, as accepted, may call.
    pub fn admits_info(&self, info: &PeerInfo) -> bool {
        match info.peer {
            Some(p) => {
                self.admits(p.uid, p.gid)
                    || info
                        .groups
                        .as_deref()
                        .is_some_and(|g| self.admits_groups(g))
            }
            None => self.allow.any,
        }
    }
}

impl tonic::service::Interceptor for PeerGuard {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let info = req.extensions().get::<PeerInfo>().cloned();
        if let Some(id) = info.as_ref().and_then(|i| i.identity.clone()) {
            if self.allow.identities.contains(&*id) {
                req.extensions_mut().insert(PeerIdentity(id));
                return Ok(req);
            }
            tracing::warn!(listener = %self.allow.listener, identity = %id, "peer refused: identity not admitted on this listener");
            return Err(Status::permission_denied(format!(
                "{id} may not call {}",
                self.allow.listener
            )));
        }
        match info.as_ref().and_then(|i| i.peer.map(|p| (i, p))) {
            Some((info, peer)) => {
                if self.admits_info(info) {
                    req.extensions_mut().insert(peer);
                    Ok(req)
                } else {
                    tracing::warn!(
                        listener = %self.allow.listener,
                        peer_uid = peer.uid,
                        peer_gid = peer.gid,
                        peer_pid = peer.pid,
                        peer_groups = ?info.groups.as_deref(),
                        "peer refused: uid/gid/groups not on this listener's allowlist"
                    );
                    Err(Status::permission_denied(format!(
                        "uid {} / gid {} may not call {}",
                        peer.uid, peer.gid, self.allow.listener
                    )))
                }
            }
            None if self.allow.any => Ok(req),
            None => {
                tracing::warn!(listener = %self.allow.listener, "peer refused: no credentials");
                Err(Status::permission_denied("peer credentials unavailable"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn empty_lists_admit_only_our_own_uid() {
        let me = nix::unistd::getuid().as_raw();
        let g = PeerGuard::new("t", &[], &[], false);
        assert!(g.admits(me, 12345));
        assert!(!g.admits(me.wrapping_add(1), 12345));
    }

    #[test]
    fn gids_admit_members_and_any_admits_all() {
        let g = PeerGuard::new("t", &[4242], &[77], false);
        assert!(g.admits(4242, 1));
        assert!(g.admits(1, 77));
        assert!(!g.admits(1, 1));
        assert!(g.admits_groups(&[5, 77]));
        assert!(!g.admits_groups(&[5, 78]));
        assert!(PeerGuard::new("t", &[4242], &[], true).admits(9, 9));
    }

    fn call(g: &mut PeerGuard, info: PeerInfo) -> Result<Option<Peer>, tonic::Code> {
        let mut req = Request::new(());
        req.extensions_mut().insert(info);
        g.call(req).map(|r| Peer::of(&r)).map_err(|s| s.code())
    }

    #[tokio::test]
    async fn a_socket_pair_reports_our_own_credentials_and_groups()
    -> Result<(), Box<dyn std::error::Error>> {
        let (a, _b) = UnixStream::pair()?;
        let s = PeerStream::accepted(a);
        let info = s.connect_info();
        let me = nix::unistd::getuid().as_raw();
        let peer = info.peer.ok_or("no SO_PEERCRED")?;
        assert_eq!(peer.uid, me);
        assert_eq!(peer.pid, Some(std::process::id() as i32));
        let mut want: Vec<u32> = nix::unistd::getgroups()?
            .iter()
            .map(|g| g.as_raw())
            .collect();
        let mut got: Vec<u32> = info.groups.as_deref().ok_or("no SO_PEERGROUPS")?.to_vec();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        // The guard admits what the socket says, and records who called.
        let mut own = PeerGuard::new("t", &[], &[], false);
        assert_eq!(call(&mut own, info.clone()), Ok(Some(peer)));
        let mut other = PeerGuard::new("t", &[me.wrapping_add(1)], &[], false);
        assert_eq!(call(&mut other, info), Err(tonic::Code::PermissionDenied));
        Ok(())
    }

    /// A peer that is a member of the operators' group only through a supplementary group is
    /// admitted by the groups its socket carries, read when the connection was accepted — even
    /// after the process is gone and its pid could belong to anyone.
    #[tokio::test]
    async fn supplementary_groups_come_from_the_socket_at_accept()
    -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        if !nix::unistd::getuid().is_root() {
            eprintln!("SKIP: needs root to give a child process supplementary groups");
            return Ok(());
        }
        const OPERATORS: u32 = 4_100_123;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path)?;
        // Everything the child touches after fork is prepared here: only raw syscalls run there.
        // SAFETY (zeroed): sockaddr_un is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= addr.sun_path.len() {
            return Err("socket path too long".into());
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("5");
        // SAFETY: setgroups, socket and connect are async-signal-safe system calls; `addr` was
        // built before the fork and is only read. The connected fd is left open across exec so
        // the peer stays connected while the parent accepts.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(OPERATORS)])
                    .map_err(io::Error::from)?;
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let rc = libc::connect(
                    fd,
                    (&raw const addr).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                );
                if rc < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let accepted =
            tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept()).await;
        let _ = child.kill();
        let _ = child.wait();
        let (stream, _) = accepted??;
        // The child is gone now: nothing about it can be looked up any more, the socket's
        // answer is all there is.
        let s = PeerStream::accepted(stream);
        let info = s.connect_info();
        assert_eq!(info.groups.as_deref(), Some(&[OPERATORS][..]));
        let mut member = PeerGuard::new("t", &[4242], &[OPERATORS], false);
        let mut other = PeerGuard::new("t", &[4242], &[OPERATORS + 1], false);
        assert!(
            call(&mut member, info.clone()).is_ok(),
            "a supplementary member was refused"
        );
        assert_eq!(call(&mut other, info), Err(tonic::Code::PermissionDenied));
        Ok(())
    }

    #[test]
    fn a_tls_guard_admits_only_its_identities() {
        let mut g = PeerGuard::identities("t", &["spiffe://e.org/warden/gateway".into()]);
        let ok = PeerInfo::with_identity("spiffe://e.org/warden/gateway".into());
        assert!(call(&mut g, ok).is_ok());
        let other = PeerInfo::with_identity("spiffe://e.org/warden/policy".into());
        assert_eq!(call(&mut g, other), Err(tonic::Code::PermissionDenied));
        // No identity and no uid: refused (a TLS guard is not `any`).
        assert!(g.call(Request::new(())).is_err());
    }

    #[test]
    fn a_request_without_credentials_is_refused() {
        let mut g = PeerGuard::new("t", &[], &[], false);
        let err = g.call(Request::new(())).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        let none = PeerInfo {
            peer: None,
            groups: Some(Arc::from(vec![0u32])),
            identity: None,
        };
        assert_eq!(call(&mut g, none), Err(tonic::Code::PermissionDenied));
    }
}
