//! Path containment: the one implementation, shared by `warden-rules` (is this edit inside the
//! root?) and `warden-sandbox` (is this workspace acceptable?), of "where does this path really
//! lead, and is that inside this root?"; the one root validator ([`RootCheck`]: not `/`, not a
//! home or above, not an agent configuration home) used for operator workspaces and for every
//! boundary the policy judges; and the one way to open an agent's files ([`beneath`]).
//!
//! Owns: resolving a path the way the kernel would walk it — symlinks followed as far as the path
//! exists, `..` applied to the *resolved* parent (not to the text), the non-existent rest
//! re-attached lexically — and comparing the result with a root by path components.
//!
//! Must never: compare paths as strings (`/root-evil` is not inside `/root`; `/root/..notes` is),
//! apply `..` before symlinks are resolved (`link/..` is the parent of the link's *target*), loop
//! forever on a symlink cycle, or touch the filesystem other than through an [`FsView`] (so the
//! rules stay unit-testable with [`MemFs`]). It only reads metadata and link targets; it never
//! opens, creates or follows anything else. Two named exceptions: `AgentHomes::from_host` reads
//! `/etc/passwd` and the environment once at a daemon's start (the list is then passed in), and
//! [`beneath`] opens files — beneath a root fd, for the supervisor's own look at a root and for
//! the fs servant (`warden-fs-servant`), which carries out an agent's `fs/*` with its rights.
//!
//! What the resolver does not protect against: a symlink planted after the check (time of check
//! vs. time of use). That is why warden never *acts* on an agent path through it: every open of an
//! agent's file goes through [`beneath::RootDir`] (`openat2` beneath a directory fd of the root),
//! the only primitive for that in the whole tree. The resolver answers questions ("would this edit
//! stay inside?"); `beneath` does the opening, and [`rights`] makes the supervisor's own opening,
//! walking and removing run with the agent's filesystem rights (never with more than the agent).
#![forbid(unsafe_code)]

mod anchored;
pub mod beneath;
mod boundary;
pub mod rights;

pub use anchored::Anchored;
pub use boundary::{Boundary, Profile};

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

mod root_check;
pub use root_check::{AgentHomes, FileId, RootCheck, RootRefusal, RootView};

/// How many symlinks one resolution may follow before it is called a loop. Linux uses 40 for
/// the same purpose (`MAXSYMLINKS`), so any path the kernel accepts is accepted here.
pub const MAX_SYMLINK_FOLLOWS: usize = 40;

/// What a path names, as far as the resolver needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Nothing exists there (or a component before it is not a directory).
    Missing,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// A regular file, device, socket or fifo.
    Other,
}

/// The filesystem as the resolver sees it: `lstat`-like kind queries and `readlink`.
///
/// Paths passed in are always absolute and free of `.`/`..` and symlinks in every component but
/// possibly the last, so an implementation may look them up verbatim.
pub trait FsView {
    /// The kind of `path` without following a final symlink. "Does not exist" is
    /// `Ok(EntryKind::Missing)`, not an error; an error means the answer is unknown (e.g.
    /// permission denied) and containment fails closed.
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind>;
    /// The target of the symlink at `path`, exactly as stored.
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;
}

impl<T: FsView + ?Sized> FsView for &T {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        (**self).entry_kind(path)
    }
    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        (**self).read_link(path)
    }
}

/// The real filesystem of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl FsView for RealFs {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                let ft = meta.file_type();
                Ok(if ft.is_symlink() {
                    EntryKind::Symlink
                } else if ft.is_dir() {
                    EntryKind::Directory
                } else {
                    EntryKind::Other
                })
            }
            // ENOENT, or ENOTDIR when an earlier component is a file: either way nothing is
            // there, and the rest of the path is re-attached lexically.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(EntryKind::Missing)
            }
            Err(e) => Err(e),
        }
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(path)
    }
}

/// An in-memory filesystem for tests of anything that takes an [`FsView`] (the rules' path
/// checks, the sandbox's workspace checks). `/` always exists as a directory.
#[derive(Debug, Clone, Default)]
pub struct MemFs {
    entries: HashMap<PathBuf, MemEntry>,
}

#[derive(Debug, Clone)]
enum MemEntry {
    Dir,
    File,
    Link(PathBuf),
}

impl MemFs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a directory and all its missing ancestors.
    pub fn dir(mut self, path: impl AsRef<Path>) -> Self {
        self.add_ancestors(path.as_ref());
        self.entries
            .insert(path.as_ref().to_path_buf(), MemEntry::Dir);
        self
    }

    /// Adds a regular file (and its missing ancestor directories).
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        self.add_ancestors(path.as_ref());
        self.entries
            .insert(path.as_ref().to_path_buf(), MemEntry::File);
        self
    }

    /// Adds a symlink at `path` whose stored target is `target` (absolute or relative).
    pub fn symlink(mut self, path: impl AsRef<Path>, target: impl AsRef<Path>) -> Self {
        self.add_ancestors(path.as_ref());
        self.entries.insert(
            path.as_ref().to_path_buf(),
            MemEntry::Link(target.as_ref().to_path_buf()),
        );
        self
    }

    fn add_ancestors(&mut self, path: &Path) {
        for anc in path.ancestors().skip(1) {
            if anc.as_os_str().is_empty() {
                continue;
            }
            self.entries
                .entry(anc.to_path_buf())
                .or_insert(MemEntry::Dir);
        }
    }
}

impl FsView for MemFs {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        if path == Path::new("/") {
            return Ok(EntryKind::Directory);
        }
        Ok(match self.entries.get(path) {
            None => EntryKind::Missing,
            Some(MemEntry::Dir) => EntryKind::Directory,
            Some(MemEntry::File) => EntryKind::Other,
            Some(MemEntry::Link(_)) => EntryKind::Symlink,
        })
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        match self.entries.get(path) {
            Some(MemEntry::Link(t)) => Ok(t.clone()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a symlink", path.display()),
            )),
        }
    }
}

/// Why a path could not be resolved. Every variant means "not provably inside": callers deny.
#[derive(Debug, thiserror::Error)]
pub enum ContainmentError {
    #[error("empty path")]
    EmptyPath,
    #[error("path contains a NUL byte")]
    NulByte,
    #[error("base directory {0} is not absolute")]
    RelativeBase(PathBuf),
    #[error("root {0} is not absolute")]
    RelativeRoot(PathBuf),
    #[error("too many symlinks (more than {MAX_SYMLINK_FOLLOWS}) resolving {0}: a loop?")]
    SymlinkLoop(PathBuf),
    #[error("symlink {0} has an empty target")]
    EmptyLinkTarget(PathBuf),
    #[error("cannot inspect {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn has_nul(p: &Path) -> bool {
    p.as_os_str().as_bytes().contains(&0)
}

/// Where `path` really leads. A relative `path` is taken relative to `base` (which must be
/// absolute). Symlinks are followed as far as the path exists; `..` is applied to the resolved
/// parent; components past the first missing one are re-attached lexically (a later `..` can
/// still climb back into existing territory, and from there symlinks are followed again).
///
/// The result is absolute and contains no `.`, `..` or symlink among its existing components.
pub fn resolve(
    path: impl AsRef<Path>,
    base: impl AsRef<Path>,
    fs: &(impl FsView + ?Sized),
) -> Result<PathBuf, ContainmentError> {
    let path = path.as_ref();
    let pending = components_to_walk(path, base.as_ref())?;
    walk(PathBuf::from("/"), pending, path, fs)
}

/// What [`resolve`] walks from `/`: `path`'s components, after `base`'s when `path` is
/// relative; the input checks every resolution makes.
fn components_to_walk(path: &Path, base: &Path) -> Result<VecDeque<OsString>, ContainmentError> {
    if path.as_os_str().is_empty() {
        return Err(ContainmentError::EmptyPath);
    }
    if has_nul(path) || has_nul(base) {
        return Err(ContainmentError::NulByte);
    }
    let mut pending: VecDeque<OsString> = VecDeque::new();
    if !path.is_absolute() {
        if !base.is_absolute() {
            return Err(ContainmentError::RelativeBase(base.to_path_buf()));
        }
        push_back_components(&mut pending, base);
    }
    push_back_components(&mut pending, path);
    Ok(pending)
}

/// The walk of [`resolve`]: `pending` components applied to `resolved`, which holds no
/// symlink, `.` or `..` (`/`, or a directory known to be resolved, see [`Anchored`]).
fn walk(
    mut resolved: PathBuf,
    mut pending: VecDeque<OsString>,
    path: &Path,
    fs: &(impl FsView + ?Sized),
) -> Result<PathBuf, ContainmentError> {
    let mut follows = 0usize;
    while let Some(comp) = pending.pop_front() {
        let bytes = comp.as_bytes();
        if bytes == b"/" {
            resolved = PathBuf::from("/");
            continue;
        }
        if bytes == b"." {
            continue;
        }
        if bytes == b".." {
            // `resolved` holds no symlinks, so its textual parent is its physical parent.
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&comp);
        let kind = fs
            .entry_kind(&candidate)
            .map_err(|source| ContainmentError::Io {
                path: candidate.clone(),
                source,
            })?;
        if kind == EntryKind::Symlink {
            follows += 1;
            if follows > MAX_SYMLINK_FOLLOWS {
                return Err(ContainmentError::SymlinkLoop(path.to_path_buf()));
            }
            let target = fs
                .read_link(&candidate)
                .map_err(|source| ContainmentError::Io {
                    path: candidate.clone(),
                    source,
                })?;
            if target.as_os_str().is_empty() {
                return Err(ContainmentError::EmptyLinkTarget(candidate));
            }
            if has_nul(&target) {
                return Err(ContainmentError::NulByte);
            }
            // The target's components are walked next, before the rest of the original path;
            // an absolute target restarts from `/`, a relative one from the link's directory
            // (which `resolved` still is).
            let mut expanded: VecDeque<OsString> = VecDeque::new();
            push_back_components(&mut expanded, &target);
            while let Some(c) = expanded.pop_back() {
                pending.push_front(c);
            }
        } else {
            resolved = candidate;
        }
    }
    Ok(resolved)
}

fn push_back_components(queue: &mut VecDeque<OsString>, p: &Path) {
    for c in p.components() {
        match c {
            Component::RootDir => queue.push_back(OsString::from("/")),
            Component::CurDir => {}
            Component::ParentDir => queue.push_back(OsString::from("..")),
            Component::Normal(n) => queue.push_back(n.to_os_string()),
            // No prefixes on Unix.
            Component::Prefix(_) => {}
        }
    }
}

/// Whether `path` (relative paths are taken relative to `root`) resolves inside `root` or to
/// `root` itself. `root` is resolved too, so `/var/x` and `/private/var/x` compare equal when
/// `/var` is a symlink. Comparison is by whole path components.
pub fn is_inside(
    root: impl AsRef<Path>,
    path: impl AsRef<Path>,
    fs: &(impl FsView + ?Sized),
) -> Result<bool, ContainmentError> {
    let root = root.as_ref();
    if root.as_os_str().is_empty() {
        return Err(ContainmentError::EmptyPath);
    }
    if !root.is_absolute() {
        return Err(ContainmentError::RelativeRoot(root.to_path_buf()));
    }
    let real_root = resolve(root, "/", fs)?;
    let real_path = resolve(path, &real_root, fs)?;
    Ok(real_path.starts_with(&real_root))
}

#[cfg(test)]
mod tests;
