//! What `warden up` keeps in its state directory besides the daemons' own: the one-`up` lock
//! (`flock(2)`, handed from `up -d` to the background `up`), the callers' and operator's
//! tokens (0600, never overwritten), and the pid record `warden down` checks.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use super::*;

pub(super) fn make_dir(path: &Path) -> Result<(), UpError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| UpError::Dir {
            path: path.to_path_buf(),
            source,
        })
}

/// The environment variable naming the descriptor of the lock `warden up -d` hands to the
/// background `up` it starts.
pub(super) const LOCK_FD_ENV: &str = "WARDEN_UP_LOCK_FD";

/// The lock one `warden up` holds on its state directory while it runs.
pub struct UpLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl std::os::fd::AsRawFd for UpLock {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// Takes the state directory's `up` lock without waiting: [`UpError::AlreadyRunning`] when
/// another `warden up` holds it. The state directory itself is created (0700) first, nothing
/// else. A background `up` started by `up -d` adopts the descriptor it was handed (the same
/// open file, already locked) instead of opening a new one.
pub fn lock(l: &Layout) -> Result<UpLock, UpError> {
    use nix::fcntl::{Flock, FlockArg};
    make_dir(&l.root)?;
    let path = l.up_lock_file();
    let err = |source: std::io::Error| UpError::Lock {
        path: path.clone(),
        source,
    };
    let file = match inherited_lock(&path) {
        Some(f) => f,
        None => std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(err)?,
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(UpLock(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(UpError::AlreadyRunning(l.root.clone())),
        Err((_, e)) => Err(err(std::io::Error::from(e))),
    }
}

/// The lock file's descriptor `warden up -d` handed over (`WARDEN_UP_LOCK_FD`), when it is
/// there and is that file (same device and inode); marked close-on-exec again so that no
/// daemon inherits it.
pub(super) fn inherited_lock(path: &Path) -> Option<std::fs::File> {
    use std::os::fd::{FromRawFd, RawFd};
    use std::os::unix::fs::MetadataExt;
    std::env::var_os(DETACHED_ENV)?;
    let fd: RawFd = std::env::var(LOCK_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open; it changes nothing.
    let open = nix::fcntl::fcntl(
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .is_ok();
    if fd < 3 || !open {
        return None;
    }
    // SAFETY: the descriptor is open, was handed to this process for this purpose by its
    // parent, and nothing else in this process owns it (it is read once, here).
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let (m, want) = (file.metadata().ok()?, std::fs::metadata(path).ok()?);
    if (m.dev(), m.ino()) != (want.dev(), want.ino()) {
        // Not the lock file: leave the descriptor as it was found.
        std::mem::forget(file);
        return None;
    }
    let _ = nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    Some(file)
}

/// Writes a fresh random token (mode 0600) unless one exists.
pub(super) fn ensure_token(path: &Path) -> Result<bool, UpError> {
    write_secret(path, "")
}

/// Writes `operator <random token>` (mode 0600) unless the file exists: the web page's login.
pub(super) fn ensure_operator_token(path: &Path) -> Result<bool, UpError> {
    write_secret(path, "operator ")
}

/// Writes `<prefix><32 random bytes in hex>` to a new file of mode 0600; false when it exists.
pub(super) fn write_secret(path: &Path, prefix: &str) -> Result<bool, UpError> {
    if path.exists() {
        return Ok(false);
    }
    let err = |source| UpError::Token {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = [0u8; 32];
    use std::io::{Read, Write};
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(err)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(format!("{prefix}{token}\n").as_bytes())
        .map_err(err)?;
    Ok(true)
}

/// `<pid> <start time in clock ticks since boot>` (field 22 of /proc/PID/stat): a pid and the
/// moment its process started name that process and no later one.
pub(super) fn pid_record(pid: u32) -> Option<String> {
    Some(format!("{pid} {}", start_time(pid)?))
}

pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
