//! Finding and listing entries beneath a root ([`RootDir::find_named`], [`RootDir::list`],
//! [`RootDir::open_file`]), each seen without following it. Must never follow a link or walk
//! beyond [`FIND_MAX_DEPTH`].

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{BeneathError, RootDir, io_err, open_beneath};

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
