//! Handing a root or a home to another uid ([`chown_beneath`]) through fds only. Must never
//! follow a link, act on a name it did not check through the same fd, or touch what is not the
//! previous owner's, on another filesystem, or linked from elsewhere.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::{BeneathError, io_err, map_errno};

/// Directory levels [`chown_beneath`] descends at most (one fd held per level).
pub const CHOWN_MAX_DEPTH: usize = 512;

/// Gives `path` (a directory, a final link refused) and everything beneath it that belongs to
/// `from` to `to` = (uid, gid). Runs with the calling thread's rights: the caller takes the
/// earlier owner's filesystem ids and `CAP_CHOWN` alone (so nothing that uid could not pass is
/// passed). Each entry is opened by one name beneath its parent's fd with `O_NOFOLLOW` (a link is
/// opened as itself, `O_PATH`), checked through that fd (owner `from`, this filesystem, a single
/// link unless a directory) and changed through the same fd: a name swapped meanwhile for a link
/// or for another file changes that link or nothing, never what it points to. Directories are
/// handed over after their contents (the earlier uid could no longer search them), the top last.
/// Entries that vanish meanwhile are skipped; returns how many entries changed owner.
pub fn chown_beneath(path: &Path, from: u32, to: (u32, u32)) -> Result<usize, BeneathError> {
    let shown = path.display().to_string();
    if to.0 == u32::MAX || to.1 == u32::MAX {
        // -1 means "unchanged" to chown(2), not an owner.
        return Err(io_err(
            &shown,
            std::io::Error::other("no owner to hand over to (-1)"),
        ));
    }
    let (uid, gid) = (
        rustix::fs::Uid::from_raw(to.0),
        rustix::fs::Gid::from_raw(to.1),
    );
    let top = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| map_errno(e, &shown))?;
    let st = rustix::fs::fstat(&top).map_err(|e| io_err(&shown, e))?;
    let dev = st.st_dev;
    let mut changed = 0usize;
    struct Level {
        fd: OwnedFd,
        names: Vec<OsString>,
        /// Whether this directory itself is handed over once its contents are.
        own: bool,
    }
    let names_of = |fd: &OwnedFd| -> Result<Vec<OsString>, BeneathError> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(fd).map_err(|e| io_err(&shown, e))? {
            let entry = entry.map_err(|e| io_err(&shown, e))?;
            let b = entry.file_name().to_bytes();
            if b != b"." && b != b".." {
                out.push(OsStr::from_bytes(b).to_os_string());
            }
        }
        Ok(out)
    };
    let ours = |st: &Stat| st.st_dev == dev && st.st_uid == from;
    let names = names_of(&top)?;
    let mut stack = vec![Level {
        fd: top,
        names,
        own: ours(&st),
    }];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.names.pop() else {
            let Some(done) = stack.pop() else { break };
            if done.own {
                rustix::fs::fchown(&done.fd, Some(uid), Some(gid))
                    .map_err(|e| io_err(&shown, e))?;
                changed += 1;
            }
            continue;
        };
        // The entry itself, whatever it is (a link is opened as the link).
        let fd = match rustix::fs::openat(
            &level.fd,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io_err(&shown, e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&shown, e))?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if !ours(&st) || (!is_dir && st.st_nlink > 1) {
            continue;
        }
        if !is_dir {
            rustix::fs::chownat(
                &fd,
                "",
                Some(uid),
                Some(gid),
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| io_err(&shown, e))?;
            changed += 1;
            continue;
        }
        if stack.len() > CHOWN_MAX_DEPTH {
            return Err(io_err(
                &shown,
                std::io::Error::other(format!(
                    "deeper than {CHOWN_MAX_DEPTH} directory levels: not handed over"
                )),
            ));
        }
        // Listed through the directory just checked (`.` of that fd, never its name again),
        // given back `u+rwx` first when its owner closed it to itself (as `remove_tree` does).
        let dir = super::remove::enter(fd, &shown)?;
        let names = names_of(&dir)?;
        stack.push(Level {
            fd: dir,
            names,
            own: true,
        });
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const FROM: u32 = 200_321;
    const TO: (u32, u32) = (200_654, 200_654);

    fn uid(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().uid()
    }

    fn own_tree(p: &Path, u: u32) {
        std::os::unix::fs::lchown(p, Some(u), Some(u)).unwrap();
        if std::fs::symlink_metadata(p).unwrap().is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                own_tree(&e.unwrap().path(), u);
            }
        }
    }

    /// A temporary directory with the paths of a root and of a tree outside it; None (saying
    /// so) when this test cannot chown.
    fn fixture() -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: chown needs root");
            return None;
        }
        let t = tempfile::tempdir().unwrap();
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        Some((t, root, outside))
    }

    #[test]
    fn only_the_previous_owners_entries_and_never_through_a_link() {
        let Some((t, root, outside)) = fixture() else {
            return;
        };
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("a/b/f"), "f").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/out")).unwrap();
        std::fs::write(root.join("foreign"), "x").unwrap();
        own_tree(&root, FROM);
        own_tree(&outside, FROM);
        std::os::unix::fs::lchown(root.join("foreign"), Some(4321), None).unwrap();
        let n = chown_beneath(&root, FROM, TO).unwrap();
        for p in ["", "a", "a/b", "a/b/f", "a/out"] {
            assert_eq!(uid(&root.join(p)), TO.0, "{p}");
        }
        assert_eq!(n, 5);
        assert_eq!(uid(&root.join("foreign")), 4321);
        assert_eq!(uid(&outside), FROM, "not through the link");
        assert_eq!(uid(&outside.join("secret")), FROM, "not through the link");
        // A final link is refused.
        std::os::unix::fs::symlink(&outside, t.path().join("alias")).unwrap();
        assert!(chown_beneath(&t.path().join("alias"), FROM, TO).is_err());
        assert_eq!(uid(&outside), FROM);
    }

    /// A racing agent flips `root/x` between a directory of its own and a link to a directory
    /// outside that the earlier uid also owns (another of its trees) while the tree is handed
    /// over, over and over: nothing outside ever changes owner.
    #[test]
    fn a_name_flipped_between_a_directory_and_a_link_never_hands_over_what_is_outside() {
        let Some((_t, root, outside)) = fixture() else {
            return;
        };
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(outside.join("deep")).unwrap();
        for i in 0..20 {
            std::fs::write(outside.join(format!("f{i}")), "o").unwrap();
            std::fs::write(outside.join(format!("deep/f{i}")), "o").unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (root, outside, stop) = (root.clone(), outside.clone(), stop.clone());
            std::thread::spawn(move || {
                // `x` is always there: a directory of the agent's, then (exchanged with `y`
                // atomically) a link to `outside`, and back.
                let _ = std::fs::create_dir_all(root.join("x/deep"));
                for i in 0..5 {
                    let _ = std::fs::write(root.join(format!("x/f{i}")), "i");
                    let _ = std::fs::write(root.join(format!("x/deep/f{i}")), "i");
                }
                let _ = std::os::unix::fs::symlink(&outside, root.join("y"));
                let dir = rustix::fs::open(
                    &root,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .unwrap();
                let mut flips = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = rustix::fs::renameat_with(
                        &dir,
                        "x",
                        &dir,
                        "y",
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                    flips += 1;
                }
                flips
            })
        };
        let mut rounds = 0;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::time::Instant::now() < until {
            own_tree(&outside, FROM);
            // The agent's tree is the earlier uid's again (a link is owned as itself).
            for e in walk(&root) {
                let _ = std::os::unix::fs::lchown(&e, Some(FROM), Some(FROM));
            }
            // Errors are fine (an entry may vanish mid-way); a change outside is not.
            let _ = chown_beneath(&root, FROM, TO);
            let mut moved = Vec::new();
            for e in walk(&outside) {
                if uid(&e) != FROM {
                    moved.push(e);
                }
            }
            assert!(moved.is_empty(), "handed over outside the tree: {moved:?}");
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let flips = flipper.join().unwrap();
        assert!(rounds > 10 && flips > 10, "{rounds} rounds, {flips} flips");
    }

    fn walk(p: &Path) -> Vec<std::path::PathBuf> {
        let mut out = vec![p.to_path_buf()];
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                // The flipper may have swapped the directory listed for the link meanwhile.
                let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                    continue;
                };
                if m.is_dir() {
                    out.extend(walk(&e.path()));
                } else {
                    out.push(e.path());
                }
            }
        }
        out
    }
}
