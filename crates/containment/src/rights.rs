//! Whose rights warden's own look at an agent's files runs with: the agent's.
//!
//! The supervisor opens a conversation's root, walks it (the files a turn changed, every `.git`
//! at spawn, the warm-agent checks), lays out its control paths and removes it at close. Done
//! with the supervisor's own identity, that needed `CAP_DAC_OVERRIDE` (the root is the agent's,
//! `0710`, and so is everything the agent makes in it), which passes over every mode on the
//! host: a symlink the agent planted, followed at the wrong moment, would reach what the agent
//! itself cannot. [`with_rights`] runs such an operation on a thread of its own whose filesystem
//! ids are the agent's (`setfsuid`/`setfsgid`), with no supplementary groups and no capability
//! at all: every permission check the kernel makes on that thread is the one it makes for the
//! agent. The thread ends with the operation, so nothing else ever runs with those credentials.
//!
//! Why a thread and not a helper process: Linux keeps credentials per thread (the filesystem
//! ids, the groups list and the capability sets are changed here with the raw per-thread system
//! calls, never glibc's `setgroups`, which changes every thread of the process), so the
//! operation keeps its borrowed fds and returns its result without a wire format, at the cost
//! of a thread start (tens of microseconds). Only the filesystem ids change: the thread's real
//! and effective uid stay the supervisor's, so an agent can neither signal nor trace it.
//!
//! Must never: change the credentials of a thread it did not start; run the operation when any
//! step of the switch failed; keep a capability the caller did not name.

use nix::unistd::{Gid, Uid, setfsgid, setfsuid};
use rustix::thread::{CapabilitySet, CapabilitySets};

pub use rustix::thread::CapabilitySet as Capabilities;

/// The identity whose filesystem rights an operation runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rights {
    pub uid: u32,
    pub gid: u32,
}

/// Why an operation was not run with the rights asked for.
#[derive(Debug, thiserror::Error)]
pub enum RightsError {
    #[error("cannot take the rights of uid {uid} gid {gid} ({step}): {source}")]
    Switch {
        uid: u32,
        gid: u32,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the operation run with the agent's rights panicked")]
    Panicked,
}

/// Runs `f` with `who`'s filesystem rights and no capability, on a thread of its own; `None`:
/// inline, as this process (the agent runs as the supervisor's own uid, which cannot switch).
pub fn with_rights<T: Send>(
    who: Option<Rights>,
    f: impl FnOnce() -> T + Send,
) -> Result<T, RightsError> {
    with_rights_keeping(who, CapabilitySet::empty(), f)
}

/// [`with_rights`] keeping the capabilities in `keep` effective (and nothing else): for the one
/// operation that must do more than the agent can, handing a reopened root from an earlier uid
/// of the range to the next (`CAP_CHOWN`, walking as the earlier uid).
pub fn with_rights_keeping<T: Send>(
    who: Option<Rights>,
    keep: CapabilitySet,
    f: impl FnOnce() -> T + Send,
) -> Result<T, RightsError> {
    let Some(who) = who else {
        return Ok(f());
    };
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("warden-as-agent".into())
            .spawn_scoped(s, move || {
                take(who, keep)?;
                Ok(f())
            })
            .map_err(|source| RightsError::Switch {
                uid: who.uid,
                gid: who.gid,
                step: "start a thread",
                source,
            })?;
        worker.join().map_err(|_| RightsError::Panicked)?
    })
}

/// This thread's filesystem uid and gid as the kernel checks them (`setfsuid(-1)` changes
/// nothing and answers the current one).
pub fn current_fs_ids() -> (u32, u32) {
    (
        setfsuid(Uid::from_raw(u32::MAX)).as_raw(),
        setfsgid(Gid::from_raw(u32::MAX)).as_raw(),
    )
}

fn take(who: Rights, keep: CapabilitySet) -> Result<(), RightsError> {
    let fail = |step: &'static str, source: std::io::Error| RightsError::Switch {
        uid: who.uid,
        gid: who.gid,
        step,
        source,
    };
    // Groups and gid while CAP_SETGID is held, the uid while CAP_SETUID is, capabilities last.
    // rustix's set_thread_groups is the raw per-thread system call.
    rustix::thread::set_thread_groups(&[]).map_err(|e| fail("setgroups", e.into()))?;
    // setfsgid/setfsuid only ever change this thread's ids and answer the previous id whether
    // or not they succeeded, hence the check after each.
    setfsgid(Gid::from_raw(who.gid));
    if current_fs_ids().1 != who.gid {
        return Err(fail(
            "setfsgid",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        ));
    }
    setfsuid(Uid::from_raw(who.uid));
    if current_fs_ids().0 != who.uid {
        return Err(fail(
            "setfsuid",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        ));
    }
    // Permitted emptied too (ambient with it): nothing can raise a capability again on this
    // thread. A filesystem uid changed away from 0 has cleared the file capabilities already;
    // from another uid it has not, which is why this step is never skipped.
    let sets = CapabilitySets {
        effective: keep,
        permitted: keep,
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, sets).map_err(|e| fail("capset", e.into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn none_runs_inline_as_this_process() {
        let me = std::thread::current().id();
        let (id, fs) =
            with_rights(None, || (std::thread::current().id(), current_fs_ids())).unwrap();
        assert_eq!(id, me);
        assert_eq!(fs.0, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn the_thread_has_the_agents_rights_and_no_more_and_nothing_else_changes() {
        if !is_root() {
            println!("SKIP: switching ids needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        std::fs::write(&secret, "s").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let who = Rights {
            uid: 61_234,
            gid: 61_234,
        };
        let (fs, read, made, caps) = with_rights(Some(who), || {
            let made = t.path().join("agent-made");
            let wrote = std::fs::write(&made, "x");
            (
                current_fs_ids(),
                std::fs::read(&secret).map_err(|e| e.kind()),
                wrote.map_err(|e| e.kind()),
                rustix::thread::capabilities(None).unwrap(),
            )
        })
        .unwrap();
        assert_eq!(fs, (61_234, 61_234));
        // Root's 0600 file and root's 0755 directory stop it as they stop the agent.
        assert_eq!(read, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(made, Err(std::io::ErrorKind::PermissionDenied));
        assert!(caps.effective.is_empty() && caps.permitted.is_empty());
        // This thread (and every other) is untouched.
        assert_eq!(current_fs_ids(), (0, 0));
        assert_eq!(std::fs::read(&secret).unwrap(), b"s");
        assert!(
            !rustix::thread::capabilities(None)
                .unwrap()
                .effective
                .is_empty()
        );
    }

    #[test]
    fn a_panic_is_an_error_not_a_crash() {
        let r = with_rights(
            Some(Rights {
                uid: rustix::process::geteuid().as_raw(),
                gid: rustix::process::getegid().as_raw(),
            }),
            || -> u8 { panic!("boom") },
        );
        if is_root() {
            assert!(matches!(r, Err(RightsError::Panicked)));
        } else {
            // Unprivileged: setgroups is refused, so the operation never ran.
            assert!(matches!(r, Err(RightsError::Switch { .. })));
        }
    }

    /// By hand (`cargo test -p warden-containment --lib rights -- --ignored --nocapture`, as
    /// root): what one operation with the agent's rights costs over the same inline (the thread
    /// start and the switch).
    #[test]
    #[ignore]
    fn switch_cost() {
        if !is_root() {
            println!("SKIP: switching ids needs root");
            return;
        }
        let who = Some(Rights {
            uid: 61_234,
            gid: 61_234,
        });
        let n = 2000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            with_rights(None, || std::hint::black_box(1)).unwrap();
        }
        let inline = t.elapsed();
        let t = std::time::Instant::now();
        for _ in 0..n {
            with_rights(who, || std::hint::black_box(1)).unwrap();
        }
        let switched = t.elapsed();
        println!(
            "inline {:?}/op, with the agent's rights {:?}/op",
            inline / n,
            switched / n
        );
    }
}
