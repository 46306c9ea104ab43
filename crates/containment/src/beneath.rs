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

/// What a root held at one moment: every entry below it (by path relative to the root) with
/// its identity, size, change and modification times. `.git` at the top is left out (git's
/// own bookkeeping is not the work; its control files are read-only to agents anyway).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    entries: std::collections::BTreeMap<PathBuf, EntryStamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EntryStamp {
    ino: u64,
    size: i64,
    mode: u32,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

/// Directory levels a snapshot descends at most.
pub const SNAPSHOT_MAX_DEPTH: usize = 32;

impl Snapshot {
    /// The paths added, removed or changed between `self` (before) and `after`, sorted.
    pub fn changed(&self, after: &Snapshot) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for (p, a) in &after.entries {
            let dir = FileType::from_raw_mode(a.mode) == FileType::Directory;
            match self.entries.get(p) {
                None => out.push(p.clone()),
                // A directory's times change whenever an entry in it does; its entries say what.
                Some(b) if b != a && !(dir && b.ino == a.ino && b.mode == a.mode) => {
                    out.push(p.clone())
                }
                Some(_) => {}
            }
        }
        for p in self.entries.keys() {
            if !after.entries.contains_key(p) {
                out.push(p.clone());
            }
        }
        out.sort();
        out
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The paths recorded (relative to the root; `.` is the root itself in a whole snapshot).
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.entries.keys().map(PathBuf::as_path)
    }

    /// Keeps only the entries whose path `keep` accepts (to compare part of a tree).
    pub fn retain(&mut self, mut keep: impl FnMut(&Path) -> bool) {
        self.entries.retain(|p, _| keep(p));
    }

    /// The mode (type and permission bits) recorded for `path`.
    pub fn mode_of(&self, path: &Path) -> Option<u32> {
        self.entries.get(path).map(|e| e.mode)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl RootDir {
    /// Every entry beneath the root, walked through directory fds only: each directory is opened
    /// relative to its parent's fd by one name with `O_NOFOLLOW`, entries are `fstatat`ed without
    /// following links, so a symlink is recorded and never entered. None when the root holds more
    /// than `max_entries` entries (a partial picture would report changes that are not there) or
    /// cannot be read.
    pub fn snapshot(&self, max_entries: usize) -> Option<Snapshot> {
        with_rights(self.rights, || self.snapshot_here(max_entries))
            .ok()
            .flatten()
    }

    fn snapshot_here(&self, max_entries: usize) -> Option<Snapshot> {
        let mut snap = Snapshot::default();
        let mut budget = max_entries;
        walk(
            self.fd.as_fd(),
            Path::new(""),
            0,
            true,
            &mut snap,
            &mut budget,
        )
        .ok()?;
        Some(snap)
    }

    /// Like [`RootDir::snapshot`], but of everything: `.git` at the top is walked too, and the
    /// root directory's own stamp is recorded (as `.`), so a change of its mode or an entry
    /// added anywhere is seen. For a root or home that must still be exactly as it was made
    /// (a warm agent's, before it is handed to a conversation).
    pub fn snapshot_whole(&self, max_entries: usize) -> Option<Snapshot> {
        with_rights(self.rights, || self.snapshot_whole_here(max_entries))
            .ok()
            .flatten()
    }

    fn snapshot_whole_here(&self, max_entries: usize) -> Option<Snapshot> {
        let mut snap = Snapshot::default();
        let mut budget = max_entries;
        let st = rustix::fs::fstat(self.fd.as_fd()).ok()?;
        snap.entries.insert(PathBuf::from("."), stamp(&st));
        walk(
            self.fd.as_fd(),
            Path::new(""),
            0,
            false,
            &mut snap,
            &mut budget,
        )
        .ok()?;
        Some(snap)
    }
}

// The nanosecond fields are signed on some targets, unsigned on others.
#[allow(clippy::unnecessary_cast)]
fn stamp(st: &rustix::fs::Stat) -> EntryStamp {
    EntryStamp {
        ino: st.st_ino,
        size: st.st_size,
        mode: st.st_mode,
        mtime: (st.st_mtime, st.st_mtime_nsec as u64),
        ctime: (st.st_ctime, st.st_ctime_nsec as u64),
    }
}

fn walk(
    dir: BorrowedFd<'_>,
    rel: &Path,
    depth: usize,
    skip_git: bool,
    snap: &mut Snapshot,
    budget: &mut usize,
) -> Result<(), ()> {
    let entries = rustix::fs::Dir::read_from(dir).map_err(|_| ())?;
    for entry in entries {
        let entry = entry.map_err(|_| ())?;
        let name = entry.file_name();
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." || (skip_git && depth == 0 && bytes == b".git") {
            continue;
        }
        if *budget == 0 {
            return Err(());
        }
        *budget -= 1;
        let st = match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the listing: it is simply not there.
            Err(Errno::NOENT) => continue,
            Err(_) => return Err(()),
        };
        let path = rel.join(OsStr::from_bytes(bytes));
        snap.entries.insert(path.clone(), stamp(&st));
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory && depth < SNAPSHOT_MAX_DEPTH
        {
            match rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => walk(sub.as_fd(), &path, depth + 1, skip_git, snap, budget)?,
                // Replaced by something else since the stat: recorded as it was.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                // Closed to the rights of this walk (the agent's): what is inside is out of
                // the agent's reach too; a change of the directory itself (its mode, to open it)
                // is its own entry's stamp.
                Err(Errno::ACCESS) => {}
                Err(_) => return Err(()),
            }
        }
    }
    Ok(())
}

/// What an entry is, seen without following it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    /// A symbolic link and what it says (never followed here).
    Symlink(PathBuf),
    /// A FIFO, socket or device.
    Other,
}

/// Directory levels [`RootDir::find_named`] descends at most; deeper is refused, not skipped
/// (a `.git` below it would be missed).
pub const FIND_MAX_DEPTH: usize = 64;

fn kind_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Option<EntryKind>, Errno> {
    let st = match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => EntryKind::Dir,
        FileType::RegularFile => EntryKind::File,
        FileType::Symlink => match rustix::fs::readlinkat(dir, name, Vec::new()) {
            Ok(t) => EntryKind::Symlink(PathBuf::from(OsStr::from_bytes(t.as_bytes()))),
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e),
        },
        _ => EntryKind::Other,
    }))
}

impl RootDir {
    /// Every entry named `name` beneath the root (paths relative to it), walked like
    /// [`RootDir::snapshot`] through directory fds only, symlinks recorded and never entered,
    /// and an entry named `name` never entered either. Refused (an error, never a partial list)
    /// when the root holds more than `max_entries` entries or is deeper than [`FIND_MAX_DEPTH`]:
    /// a caller that must see every such entry cannot act on part of them.
    pub fn find_named(
        &self,
        name: &OsStr,
        max_entries: usize,
    ) -> Result<Vec<(PathBuf, EntryKind)>, BeneathError> {
        self.as_owner(|| self.find_named_here(name, max_entries))
    }

    fn find_named_here(
        &self,
        name: &OsStr,
        max_entries: usize,
    ) -> Result<Vec<(PathBuf, EntryKind)>, BeneathError> {
        fn go(
            dir: BorrowedFd<'_>,
            rel: &Path,
            depth: usize,
            name: &OsStr,
            out: &mut Vec<(PathBuf, EntryKind)>,
            budget: &mut usize,
        ) -> Result<(), BeneathError> {
            let shown = || rel.display().to_string();
            let entries = rustix::fs::Dir::read_from(dir).map_err(|e| io_err(&shown(), e))?;
            for entry in entries {
                let entry = entry.map_err(|e| io_err(&shown(), e))?;
                let bytes = entry.file_name().to_bytes();
                if bytes == b"." || bytes == b".." {
                    continue;
                }
                if *budget == 0 {
                    return Err(io_err(
                        &shown(),
                        std::io::Error::other("the root holds too many entries to be walked"),
                    ));
                }
                *budget -= 1;
                let this = OsStr::from_bytes(bytes);
                let path = rel.join(this);
                let Some(kind) = kind_at(dir, this).map_err(|e| io_err(&shown(), e))? else {
                    continue;
                };
                if this == name {
                    out.push((path, kind));
                    continue;
                }
                if kind != EntryKind::Dir {
                    continue;
                }
                if depth >= FIND_MAX_DEPTH {
                    return Err(io_err(
                        &path.display().to_string(),
                        std::io::Error::other("the root is nested too deeply to be walked"),
                    ));
                }
                match rustix::fs::openat(
                    dir,
                    this,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(sub) => go(sub.as_fd(), &path, depth + 1, name, out, budget)?,
                    // Gone or replaced since the stat: not a directory to walk any more.
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                    // Closed to the rights of this walk (the agent's, see `RootDir::open_as`).
                    Err(Errno::ACCESS) => closed(dir, this, &path, name, out)?,
                    Err(e) => return Err(io_err(&path.display().to_string(), e)),
                }
            }
            Ok(())
        }
        /// A directory the walk may not list. Its own owner's (the agent's) is refused: the
        /// agent can open it again at any moment, and what is inside cannot be seen now. Another
        /// owner's is out of the agent's reach but for what it names without listing: with
        /// search permission, `name` directly inside is looked up and kept.
        fn closed(
            dir: BorrowedFd<'_>,
            this: &OsStr,
            path: &Path,
            name: &OsStr,
            out: &mut Vec<(PathBuf, EntryKind)>,
        ) -> Result<(), BeneathError> {
            let shown = || path.display().to_string();
            let st = rustix::fs::statat(dir, this, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_err(&shown(), e))?;
            if st.st_uid == crate::rights::current_fs_ids().0 {
                return Err(io_err(
                    &shown(),
                    std::io::Error::other(
                        "a directory its owner closed to itself cannot be walked (its owner may open it again)",
                    ),
                ));
            }
            let Ok(sub) = rustix::fs::openat(
                dir,
                this,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                return Ok(());
            };
            // Absent, or no search permission either: nothing there the agent can reach.
            if let Ok(Some(kind)) = kind_at(sub.as_fd(), name) {
                out.push((path.join(name), kind));
            }
            Ok(())
        }
        let mut out = Vec::new();
        let mut budget = max_entries;
        go(
            self.fd.as_fd(),
            Path::new(""),
            0,
            name,
            &mut out,
            &mut budget,
        )?;
        Ok(out)
    }

    /// The entries of the directory `rel` beneath the root (itself opened beneath, a final
    /// symlink refused), each seen without following it.
    pub fn list(&self, rel: &Path) -> Result<Vec<(std::ffi::OsString, EntryKind)>, BeneathError> {
        self.as_owner(|| self.list_here(rel))
    }

    fn list_here(&self, rel: &Path) -> Result<Vec<(std::ffi::OsString, EntryKind)>, BeneathError> {
        let shown = rel.display().to_string();
        let dir = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::empty(),
            &shown,
        )?;
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir.as_fd()).map_err(|e| io_err(&shown, e))? {
            let entry = entry.map_err(|e| io_err(&shown, e))?;
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let name = OsStr::from_bytes(bytes);
            if let Some(kind) = kind_at(dir.as_fd(), name).map_err(|e| io_err(&shown, e))? {
                out.push((name.to_os_string(), kind));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The regular file `rel` beneath the root opened for reading (no component may leave the
    /// root, the last is never followed, a FIFO or device is refused without blocking).
    pub fn open_file(&self, rel: &Path) -> Result<OwnedFd, BeneathError> {
        self.as_owner(|| self.open_file_here(rel))
    }

    fn open_file_here(&self, rel: &Path) -> Result<OwnedFd, BeneathError> {
        let shown = rel.display().to_string();
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::empty(),
            &shown,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&shown, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(BeneathError::NotRegular(shown));
        }
        Ok(fd)
    }
}

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
fn enter(path_fd: OwnedFd, shown: &str) -> Result<OwnedFd, BeneathError> {
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

#[cfg(test)]
mod remove_tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    const AGENT: Rights = Rights {
        uid: 61_321,
        gid: 61_321,
    };

    fn as_root() -> bool {
        if rustix::process::geteuid().is_root() {
            return true;
        }
        println!("SKIP: an agent's tree needs root to make");
        false
    }

    fn agent_owns(p: &Path) {
        std::os::unix::fs::lchown(p, Some(AGENT.uid), Some(AGENT.gid)).unwrap();
    }

    /// A root as an agent leaves it: nested files, a directory it closed to itself, links to a
    /// host file and a host directory it cannot delete from, a FIFO.
    fn agents_tree(base: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let outside = base.join("host");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sandboxes = base.join("sandboxes");
        std::fs::create_dir(&sandboxes).unwrap();
        std::fs::set_permissions(&sandboxes, std::fs::Permissions::from_mode(0o711)).unwrap();
        let root = sandboxes.join("conv-1");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o710)).unwrap();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/f"), "x").unwrap();
        std::fs::write(root.join("top"), "x").unwrap();
        symlink(outside.join("keep"), root.join("a/to-file")).unwrap();
        symlink(&outside, root.join("to-dir")).unwrap();
        symlink(&outside, root.join("a/b/c/to-dir")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for e in [
            "",
            "a",
            "a/b",
            "a/b/c",
            "a/b/c/f",
            "top",
            "a/to-file",
            "to-dir",
            "a/b/c/to-dir",
            "fifo",
        ] {
            agent_owns(&root.join(e));
        }
        // Closed to itself, as `chmod 000` leaves it: its owner may open it again.
        std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
        (root, outside, sandboxes)
    }

    #[test]
    fn a_root_is_removed_as_its_agent_and_no_planted_link_is_followed() {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, outside, _) = agents_tree(t.path());
        remove_tree(&root, Some(AGENT)).unwrap();
        assert!(!root.exists(), "the root and all in it are gone");
        // What the links named is the host's, which the agent could not delete: it stays.
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host"
        );
        assert_eq!(std::fs::metadata(&outside).unwrap().mode() & 0o7777, 0o755);
        // Absent: nothing to do.
        remove_tree(&root, Some(AGENT)).unwrap();
    }

    #[test]
    fn what_the_agent_cannot_delete_in_its_root_survives_the_removal() {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, _, _) = agents_tree(t.path());
        // A directory of the host's in the root (an operator put it there, or a mount): the
        // agent cannot empty it, and neither does warden on its behalf.
        let hosts = root.join("hosts");
        std::fs::create_dir(&hosts).unwrap();
        std::fs::write(hosts.join("precious"), "p").unwrap();
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = remove_tree(&root, Some(AGENT)).unwrap_err();
        assert!(err.to_string().contains("Permission denied"), "{err}");
        assert_eq!(
            std::fs::read_to_string(hosts.join("precious")).unwrap(),
            "p"
        );
        // With the supervisor's own (root's) rights the same call would have removed it: the
        // rights are what stopped it.
        remove_tree(&root, None).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_root_the_agent_closed_to_itself_is_still_removed() {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, _, _) = agents_tree(t.path());
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o000)).unwrap();
        remove_tree(&root, Some(AGENT)).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_link_swapped_in_while_the_root_is_removed_never_reaches_the_agents_other_files() {
        if !as_root() {
            return;
        }
        // Another conversation's root of the same agent uid: the agent's rights could delete
        // everything in it, so only never following a link keeps it. A racer swaps a full
        // directory `d` of the root being removed with a link `l` to it (RENAME_EXCHANGE:
        // atomic), as fast as it can, for the whole removal.
        for round in 0..30 {
            let t = tempfile::tempdir().unwrap();
            std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let (root, _, sandboxes) = agents_tree(t.path());
            let other = sandboxes.join("conv-2");
            std::fs::create_dir_all(other.join("sub")).unwrap();
            std::fs::write(other.join("precious"), "p").unwrap();
            std::fs::write(other.join("sub/precious"), "p").unwrap();
            for e in ["", "sub", "precious", "sub/precious"] {
                agent_owns(&other.join(e));
            }
            std::fs::create_dir(root.join("d")).unwrap();
            for i in 0..50 {
                std::fs::write(root.join(format!("d/f{i}")), "x").unwrap();
            }
            agent_owns(&root.join("d"));
            symlink(&other, root.join("l")).unwrap();
            let stop = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if rustix::fs::renameat_with(
                            rustix::fs::CWD,
                            root.join("d").as_path(),
                            rustix::fs::CWD,
                            root.join("l").as_path(),
                            rustix::fs::RenameFlags::EXCHANGE,
                        )
                        .is_err()
                        {
                            break;
                        }
                    }
                });
                // A refusal (an entry that changed under the walk) is allowed; a reach into
                // conv-2 is not.
                let _ = remove_tree(&root, Some(AGENT));
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            assert_eq!(
                std::fs::read_to_string(other.join("precious"))
                    .ok()
                    .as_deref(),
                Some("p"),
                "round {round}: the other root's file went"
            );
            assert_eq!(
                std::fs::read_to_string(other.join("sub/precious"))
                    .ok()
                    .as_deref(),
                Some("p"),
                "round {round}: the other root's nested file went"
            );
            // Once nothing races it, the rest of the root goes.
            remove_tree(&root, Some(AGENT)).unwrap();
            assert!(!root.exists());
            assert!(other.join("precious").exists());
        }
    }

    #[test]
    fn the_git_walk_with_the_agents_rights_finds_what_the_agent_can_reach_and_refuses_what_it_hid()
    {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, _, _) = agents_tree(t.path());
        std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let host_dir = |rel: &str, mode: u32| {
            std::fs::create_dir_all(root.join(rel).join(".git")).unwrap();
            std::fs::set_permissions(root.join(rel), std::fs::Permissions::from_mode(mode))
                .unwrap();
        };
        // The operator's: searchable, not listable (the agent reaches `.git` by its name);
        // closed (the agent reaches nothing in it); and a plain one.
        host_dir("search-only", 0o711);
        host_dir("closed", 0o700);
        host_dir("open", 0o755);
        let agents = RootDir::open_as(&root, Some(AGENT)).unwrap();
        let mut found: Vec<String> = agents
            .find_named(OsStr::new(".git"), 10_000)
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        found.sort();
        assert_eq!(found, ["open/.git", "search-only/.git"]);
        // A directory of the agent's own it closed to itself: it can open it again whenever it
        // likes, so a walk that cannot see inside refuses rather than miss a `.git`.
        std::fs::create_dir_all(root.join("mine/.git")).unwrap();
        agent_owns(&root.join("mine"));
        std::fs::set_permissions(root.join("mine"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let err = agents.find_named(OsStr::new(".git"), 10_000).unwrap_err();
        assert!(err.to_string().contains("closed to itself"), "{err}");
    }

    #[test]
    fn walks_with_the_agents_rights_see_what_the_agent_sees() {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, _, _) = agents_tree(t.path());
        let hidden = root.join("private");
        std::fs::create_dir(&hidden).unwrap();
        std::fs::write(hidden.join("secret"), "s").unwrap();
        std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Root (this process) sees everything; the agent's rights cannot list `private`.
        let mine = RootDir::open(&root).unwrap();
        assert!(mine.list(Path::new("private")).is_ok());
        let agents = RootDir::open_as(&root, Some(AGENT)).unwrap();
        assert!(agents.list(Path::new("top")).is_err());
        let err = agents.list(Path::new("private")).unwrap_err();
        assert!(err.to_string().contains("Permission denied"), "{err}");
        assert!(
            agents
                .read_text(
                    Path::new("private/secret"),
                    ReadSpec {
                        line: None,
                        limit: None,
                        max_bytes: 10
                    }
                )
                .is_err()
        );
        assert!(agents.list(Path::new("")).is_ok(), "its own root is listed");
    }
}
