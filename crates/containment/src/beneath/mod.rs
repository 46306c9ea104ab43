//! The one way warden touches an agent's files: a directory fd of the root, opened once when the
//! conversation opens, and every open beneath it with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`.
//!
//! Why not "check the path, then open it by name": the agent lives inside the root and can flip
//! any component between a directory and a symlink to a host directory while warden acts
//! (measured: 3–4 of every ~140 client writes landed on the host that way). Here the kernel walks
//! the path once, refuses every step that would leave the directory fd (`..` above it, an absolute
//! symlink, a symlink pointing out, `/proc/self/root` style magic links) and the last component of a
//! write is never followed (`O_NOFOLLOW`). A rename racing the walk makes the kernel answer `EAGAIN`;
//! that is retried a few times and then refused, never answered by a fallback to path checks.
//!
//! Must never: open an agent path by name outside this module; fall back to the path resolver
//! where `openat2` is missing (that is a refusal, [`BeneathError::Unsupported`]); read more than the
//! caller's byte bound; block on a FIFO or device; write through a symlink or into a file with
//! other hard links.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::rights::{Rights, with_rights};
use crate::{RealFs, resolve};

mod chown;
mod contents;
mod find;
mod remove;
mod snapshot;

pub use chown::{CHOWN_MAX_DEPTH, chown_beneath};
pub use contents::Content;
pub use find::{EntryKind, FIND_MAX_DEPTH};
pub use remove::{REMOVE_MAX_DEPTH, remove_tree};
pub use snapshot::{SNAPSHOT_MAX_DEPTH, Snapshot};

/// How often an open that raced a rename (`EAGAIN` from `openat2`) is tried before refusing.
const EAGAIN_RETRIES: usize = 8;

/// Why an operation beneath the root was refused. Every variant leaves the filesystem as it was
/// (a refused write writes nothing).
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("this kernel has no openat2 (Linux 5.6+): agent files cannot be opened safely")]
    Unsupported,
    #[error("the root {0} must be an absolute path")]
    RelativeRoot(PathBuf),
    #[error("cannot open the root {path}: {source}")]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is outside the session boundary")]
    Outside(String),
    #[error("{0}: a symbolic link where none may be followed")]
    Symlink(String),
    #[error("no such file: {0}")]
    NotFound(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    #[error("{0} has other hard links: it is not written through")]
    HardLinked(String),
    #[error("{path} is larger than the read limit of {limit} bytes (limits.fs_read_bytes)")]
    TooLarge { path: String, limit: u64 },
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    #[error("{0}: the path names no file")]
    NoFileName(String),
    #[error(transparent)]
    Rights(#[from] crate::rights::RightsError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl BeneathError {
    /// Whether the refusal is about where the path leads (outside, symlink, not a file), as
    /// opposed to an I/O failure or a missing file.
    pub fn is_boundary(&self) -> bool {
        matches!(
            self,
            Self::Outside(_) | Self::Symlink(_) | Self::RelativeRoot(_)
        )
    }
}

/// A bounded read: at most `max_bytes` returned; `line` (1-based) and `limit` select lines.
#[derive(Debug, Clone, Copy)]
pub struct ReadSpec {
    pub line: Option<u64>,
    pub limit: Option<u64>,
    pub max_bytes: u64,
}

/// Who owns what a write creates (the agent's uid/gid when the supervisor runs as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The root of one conversation, held open.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Whose filesystem rights every open and walk through this root runs with (the agent's,
    /// for the supervisor's own look at an agent's root or home; `None`: this process's own, as
    /// in the fs servant, which already is the agent).
    rights: Option<Rights>,
    /// Added to every walk: `RESOLVE_NO_SYMLINKS` once [`RootDir::no_symlinks`] was asked for.
    walk: ResolveFlags,
}

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// `openat2` beneath `dir`, retried on `EAGAIN` (a concurrent rename); `ENOSYS` is `Unsupported`.
fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    extra: ResolveFlags,
    shown: &str,
) -> Result<OwnedFd, BeneathError> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    // openat2 refuses (EINVAL) any flag beside O_PATH but DIRECTORY/NOFOLLOW/CLOEXEC.
    let flags = if flags.contains(OFlags::PATH) {
        flags | OFlags::CLOEXEC
    } else {
        flags | OFlags::CLOEXEC | OFlags::NOCTTY
    };
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir, rel, flags, mode, resolve_flags() | extra) {
            Ok(fd) => return Ok(fd),
            Err(Errno::AGAIN) | Err(Errno::INTR) if tries < EAGAIN_RETRIES => tries += 1,
            Err(e) => return Err(map_errno(e, shown)),
        }
    }
}

fn map_errno(e: Errno, shown: &str) -> BeneathError {
    let shown = shown.to_string();
    match e {
        Errno::NOSYS => BeneathError::Unsupported,
        // RESOLVE_BENEATH: the walk would have left the root.
        Errno::XDEV => BeneathError::Outside(shown),
        // O_NOFOLLOW / RESOLVE_NO_SYMLINKS / RESOLVE_NO_MAGICLINKS.
        Errno::LOOP => BeneathError::Symlink(shown),
        Errno::NOENT => BeneathError::NotFound(shown),
        // A FIFO opened for writing with no reader (O_NONBLOCK), a device without a driver.
        Errno::NXIO | Errno::NODEV => BeneathError::NotRegular(shown),
        Errno::ISDIR => BeneathError::NotRegular(shown),
        other => BeneathError::Io {
            path: shown,
            source: std::io::Error::from_raw_os_error(other.raw_os_error()),
        },
    }
}

fn io_err(shown: &str, e: impl Into<std::io::Error>) -> BeneathError {
    BeneathError::Io {
        path: shown.to_string(),
        source: e.into(),
    }
}

impl RootDir {
    /// Opens `root` (absolute; a final symlink is refused) and proves `openat2` works here, with
    /// this process's own rights.
    pub fn open(root: &Path) -> Result<Self, BeneathError> {
        Self::open_as(root, None)
    }

    /// [`RootDir::open`] with `rights`: the open, and every later open, walk and removal through
    /// this root, run with those filesystem rights and no capability ([`crate::rights`]), so the
    /// modes the agent set stop warden exactly as they stop the agent.
    pub fn open_as(root: &Path, rights: Option<Rights>) -> Result<Self, BeneathError> {
        with_rights(rights, || Self::open_here(root, rights))?
    }

    /// Runs `f` with this root's rights.
    fn as_owner<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, BeneathError> + Send,
    ) -> Result<T, BeneathError> {
        with_rights(self.rights, f)?
    }

    fn open_here(root: &Path, rights: Option<Rights>) -> Result<Self, BeneathError> {
        if !root.is_absolute() {
            return Err(BeneathError::RelativeRoot(root.to_path_buf()));
        }
        let fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| BeneathError::Root {
            path: root.to_path_buf(),
            source: e.into(),
        })?;
        let dir = RootDir {
            fd,
            path: root.to_path_buf(),
            rights,
            walk: ResolveFlags::empty(),
        };
        // The probe: an old kernel answers ENOSYS here, once, instead of at the first write.
        open_beneath(
            dir.fd.as_fd(),
            Path::new("."),
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            ResolveFlags::empty(),
            ".",
        )?;
        Ok(dir)
    }

    /// Every later walk refuses a symbolic link anywhere in the path (`RESOLVE_NO_SYMLINKS`), not
    /// only the last component of a write: for a caller handed a path that was resolved already
    /// (the location a policy judged), so that no component is resolved differently at the open
    /// (a link planted since is a refusal, [`BeneathError::Symlink`]).
    pub fn no_symlinks(mut self) -> Self {
        self.walk = ResolveFlags::NO_SYMLINKS;
        self
    }

    /// The owner uid of the directory this root holds open (its fd, never its name again).
    pub fn owner(&self) -> Result<u32, BeneathError> {
        rustix::fs::fstat(&self.fd)
            .map(|st| st.st_uid)
            .map_err(|e| io_err(&self.path.display().to_string(), e))
    }

    /// The root as it was named when opened (for messages and for matching agent paths).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The part of an agent-supplied path below the root. Relative paths are taken from the root.
    /// An absolute path must name the root by its spelling, or resolve to it (an agent may report
    /// `/private/var/…` for `/var/…`); what remains is walked by the kernel, so a `..` or symlink
    /// in it is judged at open time, not here.
    pub fn relative(&self, path: &Path) -> Result<PathBuf, BeneathError> {
        let shown = path.display().to_string();
        if path.as_os_str().is_empty() {
            return Err(BeneathError::NoFileName(shown));
        }
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(BeneathError::Outside(shown));
        }
        if !path.is_absolute() {
            return Ok(path.to_path_buf());
        }
        if let Ok(rest) = path.strip_prefix(&self.path) {
            return Ok(rest.to_path_buf());
        }
        // Another spelling of the root: resolve both. The result is only used to cut the prefix;
        // the kernel walks the remainder again beneath the fd.
        let real_root =
            resolve(&self.path, "/", &RealFs).map_err(|_| BeneathError::Outside(shown.clone()))?;
        let real = resolve(path, "/", &RealFs).map_err(|_| BeneathError::Outside(shown.clone()))?;
        real.strip_prefix(&real_root)
            .map(Path::to_path_buf)
            .map_err(|_| BeneathError::Outside(shown))
    }

    /// Reads a text file beneath the root, at most `spec.max_bytes` of it. FIFOs, devices and
    /// directories are refused without blocking.
    pub fn read_text(&self, path: &Path, spec: ReadSpec) -> Result<String, BeneathError> {
        self.as_owner(|| self.read_text_here(path, spec))
    }

    fn read_text_here(&self, path: &Path, spec: ReadSpec) -> Result<String, BeneathError> {
        let shown = path.display().to_string();
        let rel = self.relative(path)?;
        let fd = open_beneath(
            self.fd.as_fd(),
            &rel,
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
            self.walk,
            &shown,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&shown, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(BeneathError::NotRegular(shown));
        }
        let file = std::fs::File::from(fd);
        let too_large = || BeneathError::TooLarge {
            path: shown.clone(),
            limit: spec.max_bytes,
        };
        if spec.line.is_none() && spec.limit.is_none() {
            if st.st_size as u64 > spec.max_bytes {
                return Err(too_large());
            }
            // The size may grow between fstat and read: read one byte more than allowed.
            let mut buf = Vec::new();
            file.take(spec.max_bytes.saturating_add(1))
                .read_to_end(&mut buf)
                .map_err(|e| io_err(&shown, e))?;
            if buf.len() as u64 > spec.max_bytes {
                return Err(too_large());
            }
            return String::from_utf8(buf).map_err(|_| BeneathError::NotText(shown.clone()));
        }
        // Line selection streams the file: skipped lines are not kept, and no single line (kept
        // or skipped) may exceed the bound, so a 2 GiB file with no newline costs one bound's read.
        let skip = spec.line.unwrap_or(1).saturating_sub(1) as usize;
        let take = spec.limit.map(|l| l as usize).unwrap_or(usize::MAX);
        let mut reader = BufReader::new(file);
        let mut out: Vec<u8> = Vec::new();
        let mut line: Vec<u8> = Vec::new();
        let mut index = 0usize;
        while index < skip.saturating_add(take) {
            line.clear();
            let n = (&mut reader)
                .take(spec.max_bytes.saturating_add(1))
                .read_until(b'\n', &mut line)
                .map_err(|e| io_err(&shown, e))?;
            if n == 0 {
                break;
            }
            if n as u64 > spec.max_bytes {
                return Err(too_large());
            }
            if index >= skip {
                if (out.len() + line.len()) as u64 > spec.max_bytes {
                    return Err(too_large());
                }
                out.extend_from_slice(&line);
            }
            index += 1;
        }
        String::from_utf8(out).map_err(|_| BeneathError::NotText(shown))
    }

    /// Writes `content` to a file beneath the root, creating missing parent directories beneath
    /// the same fd. The last component is never followed; a FIFO, device or directory there is
    /// refused, and so is a file with other hard links (its content lives elsewhere too).
    /// What is created gets `owner` when given.
    pub fn write_text(
        &self,
        path: &Path,
        content: &[u8],
        owner: Option<Owner>,
    ) -> Result<(), BeneathError> {
        self.as_owner(|| self.write_text_here(path, content, owner))
    }

    fn write_text_here(
        &self,
        path: &Path,
        content: &[u8],
        owner: Option<Owner>,
    ) -> Result<(), BeneathError> {
        let shown = path.display().to_string();
        let rel = self.relative(path)?;
        let (parent, name) =
            split_last(&rel).ok_or_else(|| BeneathError::NoFileName(shown.clone()))?;
        let dir = self.dir_creating(&parent, owner, &shown)?;
        let name = Path::new(name);
        let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW;
        // Exclusive create first, so only a file made here is chowned to the agent.
        let (fd, created) = match open_beneath(
            dir.as_fd(),
            name,
            flags | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o644),
            ResolveFlags::NO_SYMLINKS,
            &shown,
        ) {
            Ok(fd) => (fd, true),
            Err(BeneathError::Io { source, .. })
                if source.raw_os_error() == Some(Errno::EXIST.raw_os_error()) =>
            {
                let fd = open_beneath(
                    dir.as_fd(),
                    name,
                    flags,
                    Mode::empty(),
                    ResolveFlags::NO_SYMLINKS,
                    &shown,
                )?;
                (fd, false)
            }
            Err(e) => return Err(e),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&shown, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(BeneathError::NotRegular(shown));
        }
        if st.st_nlink > 1 {
            return Err(BeneathError::HardLinked(shown));
        }
        if created && let Some(o) = owner {
            chown(&fd, o, &shown)?;
        }
        // Truncated only now: the checks above ran on the very file that is written.
        rustix::fs::ftruncate(&fd, 0).map_err(|e| io_err(&shown, e))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(content).map_err(|e| io_err(&shown, e))?;
        Ok(())
    }

    /// A directory beneath the root, as an fd (for a working directory: `fchdir` it, never
    /// `chdir` to the name).
    pub fn open_dir(&self, path: &Path) -> Result<OwnedFd, BeneathError> {
        self.as_owner(|| self.open_dir_here(path))
    }

    fn open_dir_here(&self, path: &Path) -> Result<OwnedFd, BeneathError> {
        let shown = path.display().to_string();
        let rel = self.relative(path)?;
        open_beneath(
            self.fd.as_fd(),
            &rel,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
            self.walk,
            &shown,
        )
    }

    /// The directory `rel` beneath the root, creating what is missing, one component at a time;
    /// each step is re-walked from the root fd, so a component swapped for a symlink between two
    /// steps is judged again.
    fn dir_creating(
        &self,
        rel: &Path,
        owner: Option<Owner>,
        shown: &str,
    ) -> Result<OwnedFd, BeneathError> {
        let open = |p: &Path| {
            open_beneath(
                self.fd.as_fd(),
                p,
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
                self.walk,
                shown,
            )
        };
        match open(rel) {
            Err(BeneathError::NotFound(_)) => {}
            other => return other,
        }
        let mut prefix = PathBuf::new();
        for comp in rel.components() {
            let parent = open(&prefix)?;
            prefix.push(comp.as_os_str());
            // `..` and `.` are walked by the kernel, beneath the root; only names are made.
            let Component::Normal(name) = comp else {
                continue;
            };
            match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    if let Some(o) = owner {
                        // Opened beneath again: `name` may have been swapped since mkdirat.
                        let made = open_beneath(
                            parent.as_fd(),
                            Path::new(name),
                            OFlags::RDONLY | OFlags::DIRECTORY,
                            Mode::empty(),
                            ResolveFlags::NO_SYMLINKS,
                            shown,
                        )?;
                        chown(&made, o, shown)?;
                    }
                }
                Err(Errno::EXIST) => {}
                Err(e) => return Err(map_errno(e, shown)),
            }
        }
        open(rel)
    }
}

fn chown(fd: &OwnedFd, o: Owner, shown: &str) -> Result<(), BeneathError> {
    let (uid, gid) = (
        rustix::fs::Uid::from_raw(o.uid),
        rustix::fs::Gid::from_raw(o.gid),
    );
    rustix::fs::fchown(fd, Some(uid), Some(gid)).map_err(|e| io_err(shown, e))
}

/// `(parent, last)` of a relative path whose last component is a name (not `..`, `.` or empty).
fn split_last(rel: &Path) -> Option<(PathBuf, &OsStr)> {
    match rel.components().next_back()? {
        Component::Normal(name) => {
            Some((rel.parent().unwrap_or(Path::new("")).to_path_buf(), name))
        }
        _ => None,
    }
}

#[cfg(test)]
mod remove_tests;
