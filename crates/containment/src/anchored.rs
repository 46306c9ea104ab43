//! A view that already knows one directory — a conversation's resolved root — and its ancestors,
//! so resolving a path under it asks the filesystem only about the components below it.
//!
//! [`resolve`](crate::resolve) walks every path from `/`: for an edit inside a root nine
//! directories deep that is nine `lstat`s of directories the daemon checked when the root was
//! accepted, before the one that matters. [`Anchored`] answers "directory" for the anchor and for
//! each of its ancestors and passes every other question to the view it wraps, so the walk
//! itself — symlinks followed, `..` applied to the resolved parent — is unchanged, and so is its
//! answer whenever the anchor really is a directory whose path holds no symlink.
//!
//! Must never: be built on a path that was not resolved (the answer would then differ from the
//! filesystem's), or on a path whose ancestors the contained agent can change. A conversation
//! root qualifies: it is resolved when the conversation opens (the supervisor) or when its
//! boundary is checked (the policy), and its ancestors belong to the supervisor or the operator,
//! never to the agent, whose writes land beneath the root. Entries below the anchor — the
//! agent's own — are always asked of the wrapped view.

use std::io;
use std::path::{Path, PathBuf};

use std::collections::VecDeque;
use std::ffi::OsString;

use crate::{ContainmentError, EntryKind, FileId, FsView, RootView, push_back_components};

/// `inner`, with `anchor` and its ancestors known to be directories.
#[derive(Debug, Clone)]
pub struct Anchored<F> {
    inner: F,
    anchor: PathBuf,
    /// The anchor as the resolver queues it (`/` first), to recognise a path beneath it.
    anchor_components: Vec<OsString>,
}

impl<F> Anchored<F> {
    /// The caller vouches that `anchor` is an absolute, resolved path of a directory whose
    /// ancestors the agent cannot change (see the module's "must never").
    pub fn trusting(inner: F, anchor: impl Into<PathBuf>) -> Self {
        let anchor = anchor.into();
        let mut queued = VecDeque::new();
        push_back_components(&mut queued, &anchor);
        Anchored {
            inner,
            anchor,
            anchor_components: queued.into(),
        }
    }

    pub fn anchor(&self) -> &Path {
        &self.anchor
    }

    /// Where `path` really leads, as [`resolve`](crate::resolve) through this view would say,
    /// without walking the anchor's own components when `path` (made absolute against `base`)
    /// is spelled beneath it: the walk starts at the anchor with what follows it (`..` included,
    /// which climbs from the anchor's real parent, since the anchor holds no symlink).
    pub fn resolve(
        &self,
        path: impl AsRef<Path>,
        base: impl AsRef<Path>,
    ) -> Result<PathBuf, ContainmentError>
    where
        F: FsView,
    {
        let path = path.as_ref();
        let mut pending = crate::components_to_walk(path, base.as_ref())?;
        let n = self.anchor_components.len();
        let beneath = self.anchor.is_absolute()
            && pending.len() >= n
            && pending
                .iter()
                .zip(&self.anchor_components)
                .all(|(a, b)| a == b);
        if !beneath {
            return crate::walk(PathBuf::from("/"), pending, path, self);
        }
        pending.drain(..n);
        crate::walk(self.anchor.clone(), pending, path, self)
    }

    /// Whether `path` (absolute, as the resolver passes it) is the anchor or one of its
    /// ancestors. By whole components: `/srv/ro` is not an ancestor of `/srv/root`.
    fn known(&self, path: &Path) -> bool {
        self.anchor.is_absolute() && self.anchor.starts_with(path)
    }
}

impl<F: FsView> FsView for Anchored<F> {
    fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
        if self.known(path) {
            return Ok(EntryKind::Directory);
        }
        self.inner.entry_kind(path)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        self.inner.read_link(path)
    }
}

impl<F: RootView> RootView for Anchored<F> {
    fn identity(&self, path: &Path) -> io::Result<Option<FileId>> {
        self.inner.identity(path)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::{MemFs, resolve};

    /// Counts what is asked of the wrapped view.
    struct Counting<'a> {
        fs: &'a MemFs,
        asked: RefCell<Vec<PathBuf>>,
    }

    impl FsView for Counting<'_> {
        fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
            self.asked.borrow_mut().push(path.to_path_buf());
            self.fs.entry_kind(path)
        }
        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            self.fs.read_link(path)
        }
    }

    const ROOT: &str = "/var/lib/warden/roots/ctx/root";

    fn host() -> MemFs {
        MemFs::new()
            .dir(ROOT)
            .dir("/var/lib/warden/roots/ctx/rootkit")
            .dir("/var/lib/warden/roots/other")
            .dir("/etc")
            .file("/etc/shadow")
            .file(format!("{ROOT}/notes.txt"))
            .dir(format!("{ROOT}/src"))
            .dir(format!("{ROOT}/..notes"))
            .symlink(format!("{ROOT}/out"), "/etc")
            .symlink(format!("{ROOT}/up"), "..")
            .symlink(format!("{ROOT}/abs-in"), format!("{ROOT}/src"))
            .symlink(format!("{ROOT}/src/loop"), "loop")
    }

    #[test]
    fn below_the_anchor_only_the_agents_entries_are_asked() {
        let fs = host();
        let counting = Counting {
            fs: &fs,
            asked: RefCell::new(Vec::new()),
        };
        let view = Anchored::trusting(&counting, ROOT);
        let got = resolve(format!("{ROOT}/notes.txt"), ROOT, &view).ok();
        assert_eq!(got, Some(PathBuf::from(format!("{ROOT}/notes.txt"))));
        assert_eq!(
            *counting.asked.borrow(),
            vec![PathBuf::from(format!("{ROOT}/notes.txt"))]
        );
        counting.asked.borrow_mut().clear();
        let got = view.resolve("src/../notes.txt", ROOT).ok();
        assert_eq!(got, Some(PathBuf::from(format!("{ROOT}/notes.txt"))));
        assert_eq!(
            *counting.asked.borrow(),
            vec![
                PathBuf::from(format!("{ROOT}/src")),
                PathBuf::from(format!("{ROOT}/notes.txt"))
            ]
        );
    }

    #[test]
    fn every_hostile_spelling_resolves_as_without_the_anchor() {
        let fs = host();
        let view = Anchored::trusting(&fs, ROOT);
        for p in [
            "notes.txt",
            "../rootkit/x",
            "..notes/x",
            "out/shadow",
            "up/other",
            "up/root/notes.txt",
            "abs-in/new.rs",
            "src/../../root/src",
            "/var/lib/warden/roots/ctx/rootkit",
            "/var/lib/warden/roots/ctx/root/../../other",
            "/etc/shadow",
            "new/dir/file",
            "src/loop",
        ] {
            let plain = resolve(p, ROOT, &fs).map_err(|e| e.to_string());
            let anchored = resolve(p, ROOT, &view).map_err(|e| e.to_string());
            assert_eq!(anchored, plain, "{p}");
            let walked = view.resolve(p, ROOT).map_err(|e| e.to_string());
            assert_eq!(walked, plain, "{p} (from the anchor)");
            // From a base below the root and from one outside it.
            for base in [format!("{ROOT}/src"), "/var/lib/warden/roots".to_string()] {
                let plain = resolve(p, &base, &fs).map_err(|e| e.to_string());
                let walked = view.resolve(p, &base).map_err(|e| e.to_string());
                assert_eq!(walked, plain, "{p} from {base}");
            }
        }
    }

    #[test]
    fn a_sibling_that_shares_a_prefix_is_not_an_ancestor() {
        let fs = MemFs::new().dir("/srv/root").file("/srv/ro");
        let view = Anchored::trusting(&fs, "/srv/root");
        assert_eq!(
            view.entry_kind(Path::new("/srv/ro")).ok(),
            Some(EntryKind::Other)
        );
        assert_eq!(
            view.entry_kind(Path::new("/srv")).ok(),
            Some(EntryKind::Directory)
        );
        assert_eq!(
            view.entry_kind(Path::new("/")).ok(),
            Some(EntryKind::Directory)
        );
        assert_eq!(
            view.entry_kind(Path::new("/srv/root/x")).ok(),
            Some(EntryKind::Missing)
        );
    }
}
