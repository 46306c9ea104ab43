//! What a root held at one moment ([`Snapshot`], [`RootDir::snapshot`]): every entry walked
//! through directory fds, links never followed, within a depth and an entry budget. Must never
//! follow a link or open an entry by name from outside the root.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::RootDir;
use crate::rights::with_rights;

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
