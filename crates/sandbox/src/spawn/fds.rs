//! The descriptors a spawn hands its child: sealed in-memory files (the generated `/etc`, the
//! `--args` of bubblewrap), copied above [`DATA_FD_MIN`] so the gate's fd 3 and the standard
//! streams stay free. Must never hand the child a descriptor it did not mean to.

use std::os::fd::OwnedFd;

use crate::SandboxError;
use crate::etc::EtcBind;

/// The lowest fd number a generated-file descriptor gets: above the gate's fd 3 (which the
/// child's `dup2` would otherwise close) and the standard streams.
pub(super) const DATA_FD_MIN: i32 = 10;

/// A copy of `fd` at or above [`DATA_FD_MIN`] (close-on-exec until the child clears it).
pub(super) fn high_fd(fd: &OwnedFd) -> Result<OwnedFd, SandboxError> {
    rustix::io::fcntl_dupfd_cloexec(fd, DATA_FD_MIN).map_err(|e| SandboxError::Os {
        what: "dup git file copy",
        source: e.into(),
    })
}

/// One in-memory file per generated `/etc` entry, for `--ro-bind-data FD DEST`.
pub(super) fn data_fds(etc: &[EtcBind]) -> Result<Vec<OwnedFd>, SandboxError> {
    etc.iter()
        .filter_map(|b| match b {
            EtcBind::Data { content, .. } => Some(sealed_fd("warden-etc", content)),
            EtcBind::Host { .. } => None,
        })
        .collect()
}

/// A close-on-exec memfd at or above [`DATA_FD_MIN`] holding `content`, read from its start.
pub(super) fn sealed_fd(name: &str, content: &[u8]) -> Result<OwnedFd, SandboxError> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(|e| SandboxError::Os {
        what: "memfd_create",
        source: std::io::Error::from(e),
    })?;
    let high = rustix::io::fcntl_dupfd_cloexec(&fd, DATA_FD_MIN).map_err(|e| SandboxError::Os {
        what: "dup memfd",
        source: e.into(),
    })?;
    if !content.is_empty() {
        fill_fd(&high, content)?;
    }
    Ok(high)
}

/// Writes `content` into the memfd `fd` and rewinds it (bubblewrap reads from the offset).
pub(super) fn fill_fd(fd: &OwnedFd, content: &[u8]) -> Result<(), SandboxError> {
    let os = |what: &'static str| {
        move |e: nix::errno::Errno| SandboxError::Os {
            what,
            source: std::io::Error::from(e),
        }
    };
    let mut off = 0;
    while off < content.len() {
        let n = nix::unistd::write(fd, &content[off..]).map_err(os("write memfd"))?;
        if n == 0 {
            return Err(SandboxError::InvalidInput("short write to a memfd".into()));
        }
        off += n;
    }
    nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekSet).map_err(os("lseek"))?;
    Ok(())
}
