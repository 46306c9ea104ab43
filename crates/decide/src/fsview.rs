//! The filesystem view one decision sees: the real filesystem, each path looked up once.
//!
//! `warden_containment::is_inside` resolves the root, then resolves every location starting
//! from the resolved root, so each component of the root is `lstat`ed once for the root and
//! again for every location. For a conversation root nine directories deep (the supervisor's
//! sandboxes) that was 19 `statx` calls for one edit with one location, about a fifth of the
//! daemon's CPU per decision. [`DecisionFs`] answers a path it has already looked up during
//! the same decision with the answer it got the first time, which also means one decision sees
//! one consistent view of each path instead of two answers a few microseconds apart.
//!
//! The root check then asks each resolved ancestor's identity (`stat`, following): ten more
//! lookups of directories the resolution has just `lstat`ed. A `stat` of a path whose last
//! component is not a symlink names the same object as its `lstat`, so [`Lstat::lstat_entry`]
//! keeps the (device, inode) of that one `lstat` and the identity is answered from it: twenty
//! `statx` per decision became eleven. A symlink's identity is still asked of the filesystem.
//!
//! Must never: outlive the decision it was made for (it is created, used and dropped inside
//! one synchronous call), or remember a failed lookup (errors are asked again, and still fail
//! closed).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use warden_containment::{EntryKind, FileId, FsView, RealFs, RootView};

/// A view that can tell an entry's kind and, for anything but a symlink, its identity from one
/// `lstat`.
pub trait Lstat: FsView {
    /// The kind of `path` (as [`FsView::entry_kind`]) and, when it is not a symlink, what
    /// [`RootView::identity`] would say of it (`None` = not known from this lookup).
    fn lstat_entry(&self, path: &Path) -> io::Result<(EntryKind, Option<Option<FileId>>)> {
        Ok((self.entry_kind(path)?, None))
    }
}

impl<T: Lstat + ?Sized> Lstat for &T {
    fn lstat_entry(&self, path: &Path) -> io::Result<(EntryKind, Option<Option<FileId>>)> {
        (**self).lstat_entry(path)
    }
}

impl Lstat for RealFs {
    fn lstat_entry(&self, path: &Path) -> io::Result<(EntryKind, Option<Option<FileId>>)> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                let ft = meta.file_type();
                if ft.is_symlink() {
                    // `stat` follows it: its identity is another object's.
                    return Ok((EntryKind::Symlink, None));
                }
                let kind = if ft.is_dir() {
                    EntryKind::Directory
                } else {
                    EntryKind::Other
                };
                Ok((kind, Some(Some((meta.dev(), meta.ino())))))
            }
            // As `RealFs::entry_kind` and `RealFs::identity`: nothing there.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok((EntryKind::Missing, Some(None)))
            }
            Err(e) => Err(e),
        }
    }
}

/// A per-decision memo over another [`FsView`] (the real filesystem in the service).
pub struct DecisionFs<F> {
    inner: F,
    kinds: RefCell<HashMap<PathBuf, EntryKind>>,
    links: RefCell<HashMap<PathBuf, PathBuf>>,
    ids: RefCell<HashMap<PathBuf, Option<FileId>>>,
}

impl<F: FsView> DecisionFs<F> {
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            kinds: RefCell::new(HashMap::new()),
            links: RefCell::new(HashMap::new()),
            ids: RefCell::new(HashMap::new()),
        }
    }
}

impl<F: Lstat> FsView for DecisionFs<F> {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        if let Some(k) = self.kinds.borrow().get(path) {
            return Ok(*k);
        }
        let (k, id) = self.inner.lstat_entry(path)?;
        self.kinds.borrow_mut().insert(path.to_path_buf(), k);
        if let Some(id) = id {
            self.ids
                .borrow_mut()
                .entry(path.to_path_buf())
                .or_insert(id);
        }
        Ok(k)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        if let Some(t) = self.links.borrow().get(path) {
            return Ok(t.clone());
        }
        let t = self.inner.read_link(path)?;
        self.links
            .borrow_mut()
            .insert(path.to_path_buf(), t.clone());
        Ok(t)
    }
}

impl<F: RootView + Lstat> RootView for DecisionFs<F> {
    fn identity(&self, path: &Path) -> io::Result<Option<FileId>> {
        if let Some(id) = self.ids.borrow().get(path) {
            return Ok(*id);
        }
        let id = self.inner.identity(path)?;
        self.ids.borrow_mut().insert(path.to_path_buf(), id);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use warden_containment::{RealFs, is_inside};

    /// Counts the lookups that reach the real filesystem.
    struct Counting {
        kinds: Cell<usize>,
        links: Cell<usize>,
        fail: Option<PathBuf>,
    }

    impl FsView for Counting {
        fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
            self.kinds.set(self.kinds.get() + 1);
            if self.fail.as_deref() == Some(path) {
                return Err(io::Error::from(io::ErrorKind::PermissionDenied));
            }
            RealFs.entry_kind(path)
        }
        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            self.links.set(self.links.get() + 1);
            RealFs.read_link(path)
        }
    }

    impl Lstat for Counting {}

    /// The real filesystem through [`RealFs`]'s one-`lstat` path, counting what reaches it.
    #[derive(Default)]
    struct CountingLstat {
        lstats: Cell<usize>,
        identities: Cell<usize>,
    }

    impl FsView for CountingLstat {
        fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
            Ok(self.lstat_entry(path)?.0)
        }
        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            RealFs.read_link(path)
        }
    }

    impl Lstat for CountingLstat {
        fn lstat_entry(&self, path: &Path) -> io::Result<(EntryKind, Option<Option<FileId>>)> {
            self.lstats.set(self.lstats.get() + 1);
            RealFs.lstat_entry(path)
        }
    }

    impl RootView for CountingLstat {
        fn identity(&self, path: &Path) -> io::Result<Option<FileId>> {
            self.identities.set(self.identities.get() + 1);
            RealFs.identity(path)
        }
    }

    #[test]
    fn the_root_check_answers_as_on_the_real_filesystem_from_one_lstat_per_directory()
    -> Result<(), Box<dyn std::error::Error>> {
        use warden_containment::{AgentHomes, RootCheck};
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let root = base.join("a/b/c/root");
        std::fs::create_dir_all(&root)?;
        std::fs::write(base.join("file"), "x")?;
        std::os::unix::fs::symlink(&root, base.join("alias"))?;
        std::os::unix::fs::symlink("/", base.join("slash"))?;
        let homes = AgentHomes::new(vec![base.join("a/b")], Vec::new());
        let check = RootCheck::new(&homes, &RealFs);
        for case in [
            root.clone(),
            base.join("alias"),
            base.join("a/b"),
            base.join("a"),
            base.join("slash"),
            base.join("file"),
            base.join("missing/x"),
        ] {
            let real = check.check(&case, &RealFs);
            let inner = CountingLstat::default();
            let memo = DecisionFs::new(&inner);
            assert_eq!(check.check(&case, &memo), real, "{}", case.display());
            // Every ancestor was lstat'ed by the resolution: only `/` (never lstat'ed, the
            // walk starts there) is asked for its identity.
            assert!(
                inner.identities.get() <= 1,
                "{}: {} identity lookups after {} lstats",
                case.display(),
                inner.identities.get(),
                inner.lstats.get()
            );
        }
        Ok(())
    }

    #[test]
    fn a_symlinks_identity_is_still_its_targets() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        std::fs::create_dir_all(base.join("target"))?;
        let link = base.join("link");
        std::os::unix::fs::symlink(base.join("target"), &link)?;
        let memo = DecisionFs::new(RealFs);
        assert_eq!(memo.entry_kind(&link)?, EntryKind::Symlink);
        let followed = RealFs.identity(&link)?;
        assert!(followed.is_some());
        assert_eq!(memo.identity(&link)?, followed);
        assert_eq!(memo.identity(&base.join("target"))?, followed);
        // A missing entry: nothing there, by either lookup.
        let gone = base.join("gone");
        assert_eq!(memo.entry_kind(&gone)?, EntryKind::Missing);
        assert_eq!(memo.identity(&gone)?, None);
        Ok(())
    }

    fn counting(fail: Option<PathBuf>) -> Counting {
        Counting {
            kinds: Cell::new(0),
            links: Cell::new(0),
            fail,
        }
    }

    #[test]
    fn answers_as_the_real_filesystem_does_looking_each_path_up_once()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let root = base.join("a/b/c/root");
        std::fs::create_dir_all(root.join("src"))?;
        std::fs::create_dir_all(base.join("a/b/c/root-evil"))?;
        std::os::unix::fs::symlink("/etc", root.join("out"))?;
        std::os::unix::fs::symlink("src", root.join("in"))?;
        std::os::unix::fs::symlink(&root, base.join("alias"))?;
        let cases = [
            "src/lib.rs",
            "new/deep/file",
            "../root-evil/x",
            "..notes",
            "out/passwd",
            "in/x",
            "/etc/passwd",
            "src/../../root/src",
        ];
        for roots in [root.clone(), base.join("alias")] {
            for case in cases {
                let real = is_inside(&roots, case, &RealFs)?;
                let memo = DecisionFs::new(counting(None));
                assert_eq!(is_inside(&roots, case, &memo)?, real, "{case}");
                // Without the memo the root's components are looked up twice for a relative
                // location (an absolute one does not start from the root).
                let plain = counting(None);
                is_inside(&roots, case, &plain)?;
                let fewer = if case.starts_with('/') {
                    memo.inner.kinds.get() <= plain.kinds.get()
                } else {
                    memo.inner.kinds.get() < plain.kinds.get()
                };
                assert!(
                    fewer,
                    "{case}: {} lookups with the memo, {} without",
                    memo.inner.kinds.get(),
                    plain.kinds.get()
                );
                assert!(memo.inner.links.get() <= plain.links.get());
            }
        }
        Ok(())
    }

    #[test]
    fn a_failed_lookup_is_not_remembered_and_still_fails_closed()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = std::fs::canonicalize(dir.path())?.join("root");
        std::fs::create_dir_all(root.join("src"))?;
        let memo = DecisionFs::new(counting(Some(root.join("src"))));
        assert!(is_inside(&root, "src/x", &memo).is_err());
        assert!(memo.entry_kind(&root.join("src")).is_err());
        assert!(memo.entry_kind(&root.join("src")).is_err());
        assert!(!memo.kinds.borrow().contains_key(&root.join("src")));
        Ok(())
    }
}
