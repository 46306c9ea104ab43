//! Peer credentials and the per-listener allowlist.
//!
//! On a Unix socket the kernel tells us who connected (SO_PEERCRED). Every request passes through
//! [`PeerGuard`] before any service sees it; a refused peer gets `PERMISSION_DENIED` and a log line.

use std::collections::BTreeSet;
use std::sync::Arc;

use tonic::transport::server::UdsConnectInfo;
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

#[derive(Debug)]
struct Allow {
    listener: String,
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
    any: bool,
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
            }),
        }
    }

    /// Whether a peer with these credentials may call.
    pub fn admits(&self, uid: u32, gid: u32) -> bool {
        self.allow.any || self.allow.uids.contains(&uid) || self.allow.gids.contains(&gid)
    }

    /// Whether a peer is admitted through a supplementary group. SO_PEERCRED reports only the
    /// primary gid, so an operator who is merely a member of the operators' group would be refused;
    /// the kernel's view of the peer process's groups is in /proc/PID/status while it is connected.
    fn admits_supplementary(&self, pid: Option<i32>) -> bool {
        let Some(pid) = pid.filter(|p| *p > 0) else {
            return false;
        };
        if self.allow.gids.is_empty() {
            return false;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|groups| {
                groups
                    .split_whitespace()
                    .filter_map(|g| g.parse::<u32>().ok())
                    .any(|g| self.allow.gids.contains(&g))
            })
            .unwrap_or(false)
    }
}

impl tonic::service::Interceptor for PeerGuard {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let cred = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred);
        match cred {
            Some(c) => {
                let peer = Peer {
                    uid: c.uid(),
                    gid: c.gid(),
                    pid: c.pid(),
                };
                if self.admits(peer.uid, peer.gid) || self.admits_supplementary(peer.pid) {
                    req.extensions_mut().insert(peer);
                    Ok(req)
                } else {
                    tracing::warn!(
                        listener = %self.allow.listener,
                        peer_uid = peer.uid,
                        peer_gid = peer.gid,
                        peer_pid = peer.pid,
                        "peer refused: uid/gid not on this listener's allowlist"
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
        assert!(PeerGuard::new("t", &[4242], &[], true).admits(9, 9));
    }

    #[test]
    fn supplementary_groups_of_the_peer_process_count() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::getuid().is_root() {
            eprintln!("SKIP: needs root to give a child process supplementary groups");
            return;
        }
        const OPERATORS: u32 = 4_100_123;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("5");
        // SAFETY: setgroups is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(OPERATORS)])
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        // Wait until the exec'd process shows its groups.
        for _ in 0..100 {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if st.contains(&OPERATORS.to_string()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let member = PeerGuard::new("t", &[4242], &[OPERATORS], false);
        let other = PeerGuard::new("t", &[4242], &[OPERATORS + 1], false);
        let by_member = member.admits_supplementary(Some(pid));
        let by_other = other.admits_supplementary(Some(pid));
        let _ = child.kill();
        let _ = child.wait();
        assert!(by_member, "a supplementary member was refused");
        assert!(!by_other, "a non-member was admitted");
        assert!(!member.admits_supplementary(None));
    }

    #[test]
    fn a_request_without_credentials_is_refused() {
        use tonic::service::Interceptor;
        let mut g = PeerGuard::new("t", &[], &[], false);
        let err = g.call(Request::new(())).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
    }
}
