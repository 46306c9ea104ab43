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
//! Must never: outlive the decision it was made for (it is created, used and dropped inside
//! one synchronous call), or remember a failed lookup (errors are asked again, and still fail
//! closed).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use warden_containment::{EntryKind, FileId, FsView, RootView};

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

impl<F: FsView> FsView for DecisionFs<F> {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        if let Some(k) = self.kinds.borrow().get(path) {
            return Ok(*k);
        }
        let k = self.inner.entry_kind(path)?;
        self.kinds.borrow_mut().insert(path.to_path_buf(), k);
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

impl<F: RootView> RootView for DecisionFs<F> {
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
