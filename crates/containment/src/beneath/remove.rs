//! Removing a root or a home ([`remove_tree`]) through directory fds, with the agent's rights when
//! given. Must never follow a link, nor descend deeper than [`REMOVE_MAX_DEPTH`].

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{BeneathError, io_err, map_errno};
use crate::rights::{Rights, with_rights};

/// Directory levels [`remove_tree`] descends at most: each level holds one fd while its entries
/// are removed, and deeper is refused (the tree is left, the error says why) rather than
/// running out of fds half-way.
pub const REMOVE_MAX_DEPTH: usize = 512;

/// Removes the directory `path` and everything beneath it: the contents with `rights` (the
/// agent's, for its root or home), walked through directory fds only — every entry unlinked by
/// name beneath its parent's fd (`unlinkat`), every directory entered by one name with
/// `O_NOFOLLOW` — so a symbolic link is removed as a link and never followed, and nothing
/// outside the tree is touched; a directory the owner closed to itself (`chmod 000`) is opened
/// again as its owner could (`u+rwx`, through the fd, never by name). The directory itself is
/// then removed with the caller's own rights, from its parent (the caller's own directory of
/// roots or homes, where `rights` may not write). Absent: nothing to do.
pub fn remove_tree(path: &Path, rights: Option<Rights>) -> Result<(), BeneathError> {
    let shown = path.display().to_string();
    let emptied = with_rights(rights, || {
        let top = match rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(map_errno(e, &shown)),
        };
        let top = enter(top, &shown)?;
        empty_beneath(top, &shown)?;
        Ok(true)
    })??;
    if emptied {
        match std::fs::remove_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&shown, e)),
        }
    }
    Ok(())
}

/// The directory behind `path_fd` (an `O_PATH` fd) opened for listing, after giving its owner
/// back `rwx` when the owner is who this thread is and closed it to itself (a `chmod` through
/// `/proc/self/fd`, which names exactly this directory: a name could be swapped for a link).
pub(super) fn enter(path_fd: OwnedFd, shown: &str) -> Result<OwnedFd, BeneathError> {
    let st = rustix::fs::fstat(&path_fd).map_err(|e| io_err(shown, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(BeneathError::NotRegular(shown.to_string()));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o700 != 0o700 && st.st_uid == crate::rights::current_fs_ids().0 {
        use std::os::fd::AsRawFd;
        let by_fd = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
        rustix::fs::chmod(by_fd.as_str(), Mode::from_raw_mode(mode | 0o700))
            .map_err(|e| io_err(shown, e))?;
    }
    rustix::fs::openat(
        &path_fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(shown, e))
}

/// Removes every entry beneath `top` (iteratively: one fd per level, at most
/// [`REMOVE_MAX_DEPTH`] levels). Entries that vanish meanwhile are simply gone; the first
/// failure ends the removal with that error.
fn empty_beneath(top: OwnedFd, shown: &str) -> Result<(), BeneathError> {
    struct Level {
        fd: OwnedFd,
        names: Vec<std::ffi::OsString>,
        /// The name of this level in its parent (removed there once this level is empty).
        name: Option<std::ffi::OsString>,
    }
    let names_of = |fd: &OwnedFd| -> Result<Vec<std::ffi::OsString>, BeneathError> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(fd).map_err(|e| io_err(shown, e))? {
            let entry = entry.map_err(|e| io_err(shown, e))?;
            let b = entry.file_name().to_bytes();
            if b != b"." && b != b".." {
                out.push(OsStr::from_bytes(b).to_os_string());
            }
        }
        Ok(out)
    };
    let names = names_of(&top)?;
    let mut stack = vec![Level {
        fd: top,
        names,
        name: None,
    }];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else { break };
        let Some(name) = level.names.pop() else {
            let Some(done) = stack.pop() else { break };
            if let (Some(parent), Some(name)) = (stack.last(), done.name) {
                drop(done.fd);
                match rustix::fs::unlinkat(
                    &parent.fd,
                    name.as_os_str(),
                    rustix::fs::AtFlags::REMOVEDIR,
                ) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(io_err(shown, e)),
                }
            }
            continue;
        };
        let st = match rustix::fs::statat(
            &level.fd,
            name.as_os_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io_err(shown, e)),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            match rustix::fs::unlinkat(&level.fd, name.as_os_str(), rustix::fs::AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(io_err(shown, e)),
            }
            continue;
        }
        if depth > REMOVE_MAX_DEPTH {
            return Err(io_err(
                shown,
                std::io::Error::other("the tree is nested too deeply to be removed"),
            ));
        }
        let sub = match rustix::fs::openat(
            &level.fd,
            name.as_os_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            // Swapped for a link or a file since the stat: removed as what it is now (a
            // directory again by then is left, and the removal of its parent says so).
            Err(Errno::NOTDIR | Errno::LOOP) => {
                match rustix::fs::unlinkat(
                    &level.fd,
                    name.as_os_str(),
                    rustix::fs::AtFlags::empty(),
                ) {
                    Ok(()) | Err(Errno::NOENT | Errno::ISDIR) => {}
                    Err(e) => return Err(io_err(shown, e)),
                }
                continue;
            }
            Err(e) => return Err(io_err(shown, e)),
        };
        let fd = enter(sub, shown)?;
        let names = names_of(&fd)?;
        stack.push(Level {
            fd,
            names,
            name: Some(name),
        });
    }
    Ok(())
}
