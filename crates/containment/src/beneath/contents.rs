//! What one entry beneath a root holds ([`Content`], [`RootDir::content`]): the bytes of a
//! regular file (up to a bound), the text of a symlink (never followed), or only its kind. For
//! the supervisor's diff of a root: warden reads the agent's files itself, never through a tool
//! the agent can configure. Must never follow a link, block on a FIFO or device, or read past
//! the caller's bound.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{BeneathError, RootDir, open_beneath};

/// What one entry held when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Not there (removed, or never was).
    Absent,
    /// A regular file's bytes, and whether its owner may execute it.
    File {
        bytes: Vec<u8>,
        executable: bool,
    },
    /// A regular file larger than the bound: its size only.
    TooLarge {
        size: u64,
        executable: bool,
    },
    /// A symbolic link's target, as text; never followed.
    Symlink(PathBuf),
    Dir,
    /// A FIFO, socket or device: named, never opened.
    Other,
    /// Could not be read with the walk's rights (a mode the agent set, a race).
    Unreadable,
}

impl RootDir {
    /// What `rel` (a path relative to the root, as a [`super::Snapshot`] lists it) holds now.
    /// Every directory on the way is opened beneath the root with no symlink followed
    /// (`RESOLVE_NO_SYMLINKS`); the entry itself is examined without following it, and a regular
    /// file is read through the fd that was checked to be one, at most `max_bytes` of it.
    pub fn content(&self, rel: &Path, max_bytes: u64) -> Content {
        self.as_owner(|| Ok(self.content_here(rel, max_bytes)))
            .unwrap_or(Content::Unreadable)
    }

    fn content_here(&self, rel: &Path, max_bytes: u64) -> Content {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Content::Unreadable;
        };
        let shown = rel.display().to_string();
        let dir = match open_beneath(
            self.fd.as_fd(),
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
            &shown,
        ) {
            Ok(d) => d,
            Err(BeneathError::NotFound(_)) => return Content::Absent,
            // A directory on the way was replaced by something else (a link, a file).
            Err(_) => return Content::Unreadable,
        };
        let st = match rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT | Errno::NOTDIR) => return Content::Absent,
            Err(_) => return Content::Unreadable,
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => Content::Dir,
            FileType::Symlink => match rustix::fs::readlinkat(&dir, name, Vec::new()) {
                Ok(t) => Content::Symlink(PathBuf::from(OsStr::from_bytes(t.as_bytes()))),
                Err(Errno::NOENT) => Content::Absent,
                Err(_) => Content::Unreadable,
            },
            FileType::RegularFile => read_file(&dir, name, max_bytes),
            _ => Content::Other,
        }
    }
}

fn read_file(dir: &impl AsFd, name: &OsStr, max_bytes: u64) -> Content {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Content::Absent,
        Err(_) => return Content::Unreadable,
    };
    // The entry may have been swapped since the stat: what is read is what this fd is.
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return Content::Unreadable;
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Content::Other;
    }
    let executable = st.st_mode & 0o100 != 0;
    let size = st.st_size.max(0) as u64;
    if size > max_bytes {
        return Content::TooLarge { size, executable };
    }
    let mut bytes = Vec::with_capacity(size as usize);
    let file = std::fs::File::from(fd);
    if file.take(max_bytes + 1).read_to_end(&mut bytes).is_err() {
        return Content::Unreadable;
    }
    if bytes.len() as u64 > max_bytes {
        // Grew while read.
        return Content::TooLarge {
            size: bytes.len() as u64,
            executable,
        };
    }
    Content::File { bytes, executable }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_a_link_is_named_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host secret\n").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/a.txt"), "hello\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        let r = RootDir::open(root.path()).unwrap();
        assert_eq!(
            r.content(Path::new("d/a.txt"), 100),
            Content::File {
                bytes: b"hello\n".to_vec(),
                executable: false
            }
        );
        assert_eq!(
            r.content(Path::new("link"), 100),
            Content::Symlink(outside.path().join("secret"))
        );
        // Through a link to a directory outside: never read.
        assert_eq!(r.content(Path::new("out/secret"), 100), Content::Unreadable);
        assert_eq!(r.content(Path::new("d"), 100), Content::Dir);
        assert_eq!(r.content(Path::new("gone"), 100), Content::Absent);
        assert_eq!(
            r.content(Path::new("d/a.txt"), 3),
            Content::TooLarge {
                size: 6,
                executable: false
            }
        );
    }
}
