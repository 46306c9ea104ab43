//! Whether a directory may be a conversation's root at all: the one validator, shared by the
//! supervisor (an operator workspace is refused before a conversation opens in it) and the policy
//! floor (a boundary that fails it is denied, rule `floor.boundary.invalid`).
//!
//! A root must be an absolute path naming an existing directory; it must not be `/`, a home
//! directory or a directory above one, nor be, contain or lie inside an agent configuration home
//! (`~/.claude`, `~/.codex`, `$CLAUDE_CONFIG_DIR`, `$CODEX_HOME`). Each comparison is made by
//! resolved spelling (through [`resolve`]) and, where the view knows it, by (device, inode), so a
//! symlink or a bind mount of a home is seen for what it is.
//!
//! The homes are read from the host once ([`AgentHomes::from_host`]: `$HOME`, `/root`, every home
//! in `/etc/passwd`), and resolved once ([`RootCheck::new`]); each check afterwards only looks at
//! the candidate root. That function is the only place in this crate that reads a file other than
//! through a view: it runs once at daemon start, never per decision.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{EntryKind, FsView, MemFs, RealFs, resolve};

/// A directory's identity: (device, inode).
pub type FileId = (u64, u64);

/// An [`FsView`] that can also tell a directory's identity, for the checks that must see
/// through bind mounts.
pub trait RootView: FsView {
    /// (device, inode) of `path` (already resolved, so a final symlink is followed if any is
    /// left). `Ok(None)` when nothing is there or the view has no notion of identity.
    fn identity(&self, path: &Path) -> io::Result<Option<FileId>>;
}

impl<T: RootView + ?Sized> RootView for &T {
    fn identity(&self, path: &Path) -> io::Result<Option<FileId>> {
        (**self).identity(path)
    }
}

impl RootView for RealFs {
    fn identity(&self, path: &Path) -> io::Result<Option<FileId>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some((m.dev(), m.ino()))),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

impl RootView for MemFs {
    /// A `MemFs` has no bind mounts: every directory has exactly one resolved spelling, so the
    /// spelling comparisons are the whole check.
    fn identity(&self, _path: &Path) -> io::Result<Option<FileId>> {
        Ok(None)
    }
}

/// Why a directory may not be a root. The text is what an operator or caller reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootRefusal {
    #[error("not an absolute path")]
    NotAbsolute,
    #[error("cannot resolve: {0}")]
    Unresolvable(String),
    #[error("does not exist")]
    Missing,
    #[error("not a directory")]
    NotADirectory,
    #[error("the filesystem root")]
    FilesystemRoot,
    #[error("is the home directory {0} or a directory above it")]
    Home(PathBuf),
    #[error("is, contains or lies inside the agent configuration home {0}")]
    ConfigHome(PathBuf),
}

/// The homes and agent configuration homes a root may not be, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentHomes {
    pub homes: Vec<PathBuf>,
    pub config_homes: Vec<PathBuf>,
}

impl AgentHomes {
    pub fn new(homes: Vec<PathBuf>, config_homes: Vec<PathBuf>) -> Self {
        Self {
            homes,
            config_homes,
        }
    }

    /// This host's homes: `$HOME`, `/root`, and every home directory in `/etc/passwd`; config
    /// homes: `~/.claude` and `~/.codex` under each, `$CLAUDE_CONFIG_DIR`, `$CODEX_HOME`.
    /// Read once at daemon start (the supervisor and the policy both call this).
    pub fn from_host() -> Self {
        let passwd = std::fs::read_to_string("/etc/passwd").ok();
        let home = std::env::var_os("HOME");
        let extra: Vec<PathBuf> = ["CLAUDE_CONFIG_DIR", "CODEX_HOME"]
            .iter()
            .filter_map(std::env::var_os)
            .map(PathBuf::from)
            .collect();
        Self::from_sources(home.as_deref(), passwd.as_deref(), &extra)
    }

    /// [`AgentHomes::from_host`] without the reading: `home` is `$HOME`, `passwd` the text of
    /// `/etc/passwd`, `config_dirs` the configured agent configuration directories.
    pub fn from_sources(
        home: Option<&OsStr>,
        passwd: Option<&str>,
        config_dirs: &[PathBuf],
    ) -> Self {
        let mut homes: Vec<PathBuf> = vec![PathBuf::from("/root")];
        if let Some(h) = home.filter(|h| !h.is_empty()) {
            homes.push(PathBuf::from(h));
        }
        for line in passwd.unwrap_or_default().lines() {
            if let Some(h) = line.split(':').nth(5).filter(|h| h.starts_with('/')) {
                homes.push(PathBuf::from(h));
            }
        }
        homes.sort();
        homes.dedup();
        let mut config: Vec<PathBuf> = homes
            .iter()
            .flat_map(|h| [h.join(".claude"), h.join(".codex")])
            .collect();
        config.extend(
            config_dirs
                .iter()
                .filter(|c| !c.as_os_str().is_empty())
                .cloned(),
        );
        Self::new(homes, config)
    }
}

/// One home, resolved once.
#[derive(Debug, Clone)]
struct Known {
    written: PathBuf,
    resolved: PathBuf,
    id: Option<FileId>,
    /// Identities of the directory and every existing ancestor.
    ancestor_ids: Vec<FileId>,
}

/// The validator, with its homes resolved. `RootCheck::default()` knows no homes and still
/// refuses relative, missing, non-directory roots and `/`.
#[derive(Debug, Clone, Default)]
pub struct RootCheck {
    homes: Vec<Known>,
    config_homes: Vec<Known>,
    fs_root_id: Option<FileId>,
    /// Roots accepted a moment ago ([`RootCheck::remembering`]); shared by clones.
    memo: Option<Arc<RootMemo>>,
}

/// Accepted roots and when they were checked. Only acceptances are kept (a refusal is checked
/// again every time, so it stays as fresh as the filesystem), for `ttl`, at most
/// [`ROOT_MEMO_MAX`] of them.
#[derive(Debug)]
struct RootMemo {
    ttl: Duration,
    accepted: Mutex<HashMap<PathBuf, (Instant, PathBuf)>>,
}

/// The most roots a memo holds; past it, it starts again empty (a daemon judges a few
/// conversations' roots at a time, not thousands).
pub const ROOT_MEMO_MAX: usize = 4096;

impl RootCheck {
    /// Resolves `homes` through `fs` once. A home the view cannot see into (a 0700 `/root` seen
    /// by a system user) keeps the part of its spelling that cannot be resolved as written: the
    /// candidate root is always resolved in full, so comparing with that is still exact unless
    /// a symlink hides inside the unreadable part, which only its owner could have planted.
    pub fn new(homes: &AgentHomes, fs: &(impl RootView + ?Sized)) -> Self {
        let know = |written: &PathBuf| {
            let resolved = best_effort_resolve(written, fs);
            Known {
                id: fs.identity(&resolved).ok().flatten(),
                ancestor_ids: ancestor_ids(&resolved, fs),
                written: written.clone(),
                resolved,
            }
        };
        Self {
            homes: homes.homes.iter().map(know).collect(),
            config_homes: homes.config_homes.iter().map(know).collect(),
            fs_root_id: fs.identity(Path::new("/")).ok().flatten(),
            memo: None,
        }
    }

    /// This check, answering a root it accepted less than `ttl` ago from that answer instead
    /// of looking at the filesystem again. For the policy, which judges the same root for every
    /// permission of a conversation: the check is a dozen lookups of directories that belong to
    /// the supervisor or the operator, never to the agent, and about a fifth of its CPU per
    /// decision. What a root's ancestors became in the last `ttl` is not seen until then.
    pub fn remembering(mut self, ttl: Duration) -> Self {
        self.memo = Some(Arc::new(RootMemo {
            ttl,
            accepted: Mutex::new(HashMap::new()),
        }));
        self
    }

    /// Checks a candidate root and returns it resolved.
    pub fn check(
        &self,
        root: &Path,
        fs: &(impl RootView + ?Sized),
    ) -> Result<PathBuf, RootRefusal> {
        let Some(memo) = &self.memo else {
            return self.check_now(root, fs);
        };
        let now = Instant::now();
        {
            let accepted = memo.accepted.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, resolved)) = accepted.get(root)
                && now.duration_since(*at) < memo.ttl
            {
                return Ok(resolved.clone());
            }
        }
        let checked = self.check_now(root, fs);
        if let Ok(resolved) = &checked {
            let mut accepted = memo.accepted.lock().unwrap_or_else(|p| p.into_inner());
            if accepted.len() >= ROOT_MEMO_MAX {
                accepted.clear();
            }
            accepted.insert(root.to_path_buf(), (now, resolved.clone()));
        }
        checked
    }

    fn check_now(
        &self,
        root: &Path,
        fs: &(impl RootView + ?Sized),
    ) -> Result<PathBuf, RootRefusal> {
        if !root.is_absolute() {
            return Err(RootRefusal::NotAbsolute);
        }
        let resolved =
            resolve(root, "/", fs).map_err(|e| RootRefusal::Unresolvable(e.to_string()))?;
        match fs.entry_kind(&resolved) {
            Ok(EntryKind::Directory) => {}
            Ok(EntryKind::Missing) => return Err(RootRefusal::Missing),
            // Resolution leaves no symlink as the last existing component, so a symlink here
            // would be a view that changed under us: not a directory we can vouch for.
            Ok(EntryKind::Other | EntryKind::Symlink) => return Err(RootRefusal::NotADirectory),
            Err(e) => return Err(RootRefusal::Unresolvable(e.to_string())),
        }
        let id = fs
            .identity(&resolved)
            .map_err(|e| RootRefusal::Unresolvable(e.to_string()))?;
        if resolved == Path::new("/") || (id.is_some() && id == self.fs_root_id) {
            return Err(RootRefusal::FilesystemRoot);
        }
        for home in &self.homes {
            // The root is the home or above it: by spelling, or by the identity of the home or
            // any of its ancestors (a bind mount or second spelling of the same directory).
            let above = home.resolved.starts_with(&resolved)
                || id.is_some_and(|id| home.ancestor_ids.contains(&id));
            if above {
                return Err(RootRefusal::Home(home.written.clone()));
            }
        }
        let mut root_ancestor_ids: Option<Vec<FileId>> = None;
        for conf in &self.config_homes {
            let above = conf.resolved.starts_with(&resolved)
                || id.is_some_and(|id| conf.ancestor_ids.contains(&id));
            let inside = resolved.starts_with(&conf.resolved)
                || conf.id.is_some_and(|cid| {
                    root_ancestor_ids
                        .get_or_insert_with(|| ancestor_ids(&resolved, fs))
                        .contains(&cid)
                });
            if above || inside {
                return Err(RootRefusal::ConfigHome(conf.written.clone()));
            }
        }
        Ok(resolved)
    }
}

/// (device, inode) of `p` and of every existing ancestor of it that the view can see.
fn ancestor_ids(p: &Path, fs: &(impl RootView + ?Sized)) -> Vec<FileId> {
    p.ancestors()
        .filter_map(|a| fs.identity(a).ok().flatten())
        .collect()
}

/// `p` resolved as far as the view lets it be: the longest ancestor that resolves, with the rest
/// re-attached as written (`.` dropped, `..` applied lexically, since nothing past an unreadable
/// directory can be inspected).
fn best_effort_resolve(p: &Path, fs: &(impl FsView + ?Sized)) -> PathBuf {
    let comps: Vec<Component<'_>> = p.components().collect();
    for keep in (0..=comps.len()).rev() {
        let head: PathBuf = comps[..keep].iter().collect();
        if head.as_os_str().is_empty() {
            continue;
        }
        if let Ok(mut out) = resolve(&head, "/", fs) {
            for c in &comps[keep..] {
                match c {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::Normal(n) => out.push(n),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
            return out;
        }
    }
    p.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn homes() -> AgentHomes {
        AgentHomes::new(
            vec!["/home/alice".into(), "/root".into()],
            vec![
                "/home/alice/.claude".into(),
                "/home/alice/.codex".into(),
                "/srv/codex-home".into(),
            ],
        )
    }

    fn fs() -> MemFs {
        MemFs::new()
            .dir("/home/alice/project/src")
            .dir("/home/alice/.claude/projects")
            .dir("/home/alice/.codex")
            .dir("/srv/codex-home/rules")
            .dir("/srv/work")
            .file("/srv/file")
            .dir("/root")
            .symlink("/srv/to-home", "/home/alice")
            .symlink("/srv/to-claude", "/home/alice/.claude")
            .symlink("/srv/to-project", "/home/alice/project")
            .symlink("/srv/loop", "/srv/loop")
    }

    #[test]
    fn refuses_what_cannot_be_a_root_and_says_why() {
        let fs = fs();
        let c = RootCheck::new(&homes(), &fs);
        let cases: &[(&str, RootRefusal)] = &[
            ("relative/path", RootRefusal::NotAbsolute),
            ("", RootRefusal::NotAbsolute),
            ("/", RootRefusal::FilesystemRoot),
            ("/..", RootRefusal::FilesystemRoot),
            (
                "/home/alice/project/../..",
                RootRefusal::Home("/home/alice".into()),
            ),
            ("/home/alice", RootRefusal::Home("/home/alice".into())),
            ("/home", RootRefusal::Home("/home/alice".into())),
            ("/srv/to-home", RootRefusal::Home("/home/alice".into())),
            ("/root", RootRefusal::Home("/root".into())),
            (
                "/home/alice/.claude",
                RootRefusal::ConfigHome("/home/alice/.claude".into()),
            ),
            (
                "/srv/to-claude/projects",
                RootRefusal::ConfigHome("/home/alice/.claude".into()),
            ),
            (
                "/srv/codex-home/rules",
                RootRefusal::ConfigHome("/srv/codex-home".into()),
            ),
            ("/srv", RootRefusal::ConfigHome("/srv/codex-home".into())),
            ("/srv/file", RootRefusal::NotADirectory),
            ("/srv/nope", RootRefusal::Missing),
        ];
        for (root, want) in cases {
            assert_eq!(c.check(Path::new(root), &fs).as_ref(), Err(want), "{root}");
        }
        assert!(matches!(
            c.check(Path::new("/srv/loop"), &fs),
            Err(RootRefusal::Unresolvable(_))
        ));
        assert_eq!(
            c.check(Path::new("/srv/to-project"), &fs),
            Ok(PathBuf::from("/home/alice/project"))
        );
        assert_eq!(
            c.check(Path::new("/srv/work/"), &fs),
            Ok(PathBuf::from("/srv/work"))
        );
        // Without homes, only the shape of the root is checked.
        let bare = RootCheck::default();
        assert!(bare.check(Path::new("/home/alice"), &fs).is_ok());
        assert_eq!(
            bare.check(Path::new("/"), &fs),
            Err(RootRefusal::FilesystemRoot)
        );
    }

    #[test]
    fn names_that_only_share_a_prefix_are_not_above_a_home() {
        let fs = MemFs::new()
            .dir("/home/alice-evil")
            .dir("/home/alice/.claude-notes")
            .dir("/srv/codex-home-old");
        let c = RootCheck::new(&homes(), &fs);
        for ok in [
            "/home/alice-evil",
            "/home/alice/.claude-notes",
            "/srv/codex-home-old",
        ] {
            assert!(c.check(Path::new(ok), &fs).is_ok(), "{ok} refused");
        }
    }

    #[test]
    fn homes_come_from_home_passwd_and_the_configured_agent_dirs() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      bob:x:1000:1000::/home/bob:/bin/sh\n\
                      broken line\n\
                      svc:x:999:999::relative:/bin/false\n";
        let h = AgentHomes::from_sources(
            Some(OsStr::new("/home/carol")),
            Some(passwd),
            &[PathBuf::from("/opt/codex"), PathBuf::new()],
        );
        assert_eq!(
            h.homes,
            vec![
                PathBuf::from("/home/bob"),
                PathBuf::from("/home/carol"),
                PathBuf::from("/root")
            ]
        );
        for c in ["/home/bob/.claude", "/root/.codex", "/opt/codex"] {
            assert!(h.config_homes.contains(&PathBuf::from(c)), "{c} missing");
        }
        assert!(!h.config_homes.iter().any(|c| c.as_os_str().is_empty()));
        // No $HOME and no passwd still forbids /root.
        assert_eq!(
            AgentHomes::from_sources(None, None, &[]).homes,
            vec![PathBuf::from("/root")]
        );
    }

    /// A view that refuses to look inside one directory, as a 0700 `/root` does to a system user.
    struct Unreadable(MemFs, PathBuf);
    impl FsView for Unreadable {
        fn entry_kind(&self, path: &Path) -> io::Result<EntryKind> {
            if path.starts_with(&self.1) && path != self.1 {
                return Err(io::Error::from(io::ErrorKind::PermissionDenied));
            }
            self.0.entry_kind(path)
        }
        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            self.0.read_link(path)
        }
    }
    impl RootView for Unreadable {
        fn identity(&self, _: &Path) -> io::Result<Option<FileId>> {
            Ok(None)
        }
    }

    #[test]
    fn a_home_the_checker_cannot_see_into_does_not_refuse_every_root() {
        let fs = Unreadable(fs(), PathBuf::from("/root"));
        let h = AgentHomes::new(vec!["/root".into()], vec!["/root/.claude".into()]);
        let c = RootCheck::new(&h, &fs);
        assert!(c.check(Path::new("/srv/work"), &fs).is_ok());
        assert_eq!(
            c.check(Path::new("/root"), &fs),
            Err(RootRefusal::Home("/root".into()))
        );
        // The candidate root itself must resolve in full.
        assert!(matches!(
            c.check(Path::new("/root/.claude/x"), &fs),
            Err(RootRefusal::Unresolvable(_))
        ));
    }

    #[test]
    fn the_real_filesystem_sees_bind_mount_identities() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let home = base.join("home/alice");
        std::fs::create_dir_all(home.join("project"))?;
        std::fs::create_dir_all(base.join("srv"))?;
        std::os::unix::fs::symlink(&home, base.join("srv/to-home"))?;
        let c = RootCheck::new(&AgentHomes::new(vec![home.clone()], vec![]), &RealFs);
        assert!(c.check(&base.join("srv/to-home"), &RealFs).is_err());
        assert!(c.check(&base, &RealFs).is_err());
        assert_eq!(
            c.check(&home.join("project"), &RealFs)?,
            home.join("project")
        );
        assert_eq!(
            c.check(Path::new("/"), &RealFs),
            Err(RootRefusal::FilesystemRoot)
        );
        Ok(())
    }

    #[test]
    fn a_remembered_root_is_answered_for_its_ttl_then_checked_again_and_refusals_are_never_kept()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let home = base.join("home/alice");
        std::fs::create_dir_all(&home)?;
        let root = base.join("roots/ctx");
        std::fs::create_dir_all(&root)?;
        let homes = AgentHomes::new(vec![home.clone()], vec![]);
        let ttl = Duration::from_millis(300);
        let c = RootCheck::new(&homes, &RealFs).remembering(ttl);
        assert_eq!(c.check(&root, &RealFs)?, root);
        // Swapped for a link to the home (only the supervisor or the operator could): the
        // remembered answer stands for the rest of the ttl, a clone shares it…
        std::fs::remove_dir(&root)?;
        std::os::unix::fs::symlink(&home, &root)?;
        assert_eq!(c.clone().check(&root, &RealFs)?, root);
        // …and then the root is looked at again and refused.
        std::thread::sleep(ttl + Duration::from_millis(50));
        assert_eq!(
            c.check(&root, &RealFs),
            Err(RootRefusal::Home(home.clone()))
        );
        // A refusal is not remembered: fixed, the root is accepted at once.
        std::fs::remove_file(&root)?;
        std::fs::create_dir(&root)?;
        assert_eq!(c.check(&root, &RealFs)?, root);
        // Without `remembering`, every check looks.
        let plain = RootCheck::new(&homes, &RealFs);
        assert_eq!(plain.check(&root, &RealFs)?, root);
        std::fs::remove_dir(&root)?;
        assert_eq!(plain.check(&root, &RealFs), Err(RootRefusal::Missing));
        Ok(())
    }
}
