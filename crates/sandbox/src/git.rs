//! git repositories in a writable root, by allowlist: what the agent may change in a `.git` is
//! what a commit needs, and nothing it writes there can make a later `git` run on the host (as
//! the operator, often root) run a command of its choosing.
//!
//! git reads configuration and hooks not only from `.git/config` and `.git/hooks`: a `commondir`
//! file redirects both to another directory, `.git/modules/*` and `.git/worktrees/*` are git
//! directories of their own, `.git/info/attributes` selects filter drivers, `config.worktree`
//! adds configuration. A deny list of names cannot keep up, and a file that does not exist yet
//! (`commondir`) cannot be bound read-only without creating it, which would change what git does.
//!
//! So under bubblewrap every `.git` directory found in the root at spawn (nested repositories
//! included; `.git/modules/*` and `.git/worktrees/*` as git directories of their own) is shown to
//! the agent as a fresh tmpfs holding:
//! - `objects`, `refs`: the host's directories, bound read-write (a commit's objects and the
//!   branch it moves reach the host);
//! - `logs`: an empty directory of the agent's own. The host's git appends to reflogs without
//!   refusing symlinks (measured: a `logs/HEAD` link made root's `git commit` append its line to
//!   the file it named, and a branch name chosen by the agent can put `;cmd` in such a line), so
//!   the agent never writes into the host's `logs`; its reflog entries stay in the sandbox;
//! - `index`, `HEAD`, `packed-refs`, `COMMIT_EDITMSG` and the `*_HEAD` files: the agent's own
//!   copies, writable in the tmpfs. git replaces them by writing `NAME.lock` beside them and
//!   renaming it over them, which needs a writable `.git`, and a writable `.git` is exactly what
//!   lets the agent create `commondir`; so these changes stay in the sandbox (after an agent's
//!   commit the host's index still holds the tree it had: `git status` there shows the difference
//!   until `git reset`);
//! - everything else (`config`, `hooks`, `info`, `commondir`, `gitdir`, `description`, ...):
//!   the host's entry bound read-only;
//! - symbolic links: recreated as the same link (never bound: a bind would follow it).
//!
//! Whatever the agent creates in the tmpfs (a `commondir`, a `config.worktree`) exists only in
//! its sandbox and is gone with it; the host's `.git` never sees it. The tmpfs is also a mount
//! point, so the directory cannot be renamed away and replaced. A `.git` *file* (a linked
//! worktree's or a submodule's pointer) is bound read-only.
//!
//! What this does not cover, and who does: a `.git` the agent creates after spawn (or a `.git`
//! file or symlink it plants) is owned by the agent's uid, and git refuses a repository whose
//! `.git` is owned by another user unless `safe.directory` names it (the policy README); the
//! policy floor denies tool-call edits of git control names at any depth.
//!
//! Must never: follow a symlink while walking the root or a `.git` (all through
//! `beneath::RootDir`), bind a symlinked entry, or create anything in the host's `.git`.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use warden_containment::beneath::{EntryKind, RootDir};
use warden_containment::rights::Rights;

use crate::SandboxError;

/// Directories a commit writes into, bound read-write.
pub const GIT_WRITABLE_DIRS: &[&str] = &["objects", "refs"];

/// Directories git writes into that the agent gets empty, of its own (reflogs).
pub const GIT_OWN_DIRS: &[&str] = &["logs"];

/// Files git replaces by lock-and-rename that a commit (or checkout, merge) touches: the agent
/// gets its own writable copy.
pub const GIT_COPIED_FILES: &[&str] = &["index", "HEAD", "packed-refs", "COMMIT_EDITMSG"];

/// Directories holding further git directories (one per submodule or linked worktree).
pub const GIT_NESTED_DIRS: &[&str] = &["modules", "worktrees"];

/// How many levels of `modules/*/modules/*` are followed; deeper ones are bound read-only whole.
const MAX_NESTING: usize = 8;

/// Entries a root may hold and still be walked for `.git` at spawn; beyond, the spawn is
/// refused (a `.git` not found would be a `.git` left writable).
pub const GIT_WALK_MAX_ENTRIES: usize = 2_000_000;

/// One step of the sandbox's view of a `.git`, in the order bubblewrap must apply them.
#[derive(Debug)]
pub enum GitBind {
    /// `--tmpfs PATH`: the `.git` directory's fresh, agent-writable stand-in.
    Tmpfs(PathBuf),
    /// `--dir PATH` inside a tmpfs (`modules`, `worktrees`, and each git directory under them).
    Dir(PathBuf),
    /// `--bind PATH PATH`.
    Writable(PathBuf),
    /// `--ro-bind PATH PATH`.
    ReadOnly(PathBuf),
    /// `--symlink TARGET PATH`.
    Symlink { target: PathBuf, path: PathBuf },
    /// `--file FD PATH`: a writable copy of the host file open as `fd`.
    Copy { fd: OwnedFd, path: PathBuf },
}

impl GitBind {
    pub fn path(&self) -> &Path {
        match self {
            GitBind::Tmpfs(p) | GitBind::Dir(p) | GitBind::Writable(p) | GitBind::ReadOnly(p) => p,
            GitBind::Symlink { path, .. } | GitBind::Copy { path, .. } => path,
        }
    }
}

fn is_copied(name: &str) -> bool {
    GIT_COPIED_FILES.contains(&name) || (name.ends_with("_HEAD") && name.len() > "_HEAD".len())
}

fn walk_err(root: &Path, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::InvalidInput(format!(
        "cannot lay out the git directories of {} for the sandbox: {e}; refusing to start rather than leave one writable",
        root.display()
    ))
}

/// The sandbox's view of every `.git` in `root` (found at this moment), in bind order.
/// Walked with `rights` (the agent's): what the agent cannot reach is not laid out, and a
/// directory of its own it closed to itself refuses the start (see `RootDir::find_named`).
pub fn plan(root: &Path, rights: Option<Rights>) -> Result<Vec<GitBind>, SandboxError> {
    let dir = RootDir::open_as(root, rights).map_err(|e| walk_err(root, e))?;
    let found = dir
        .find_named(".git".as_ref(), GIT_WALK_MAX_ENTRIES)
        .map_err(|e| walk_err(root, e))?;
    let mut out = Vec::new();
    for (rel, kind) in found {
        match kind {
            EntryKind::Dir => {
                out.push(GitBind::Tmpfs(root.join(&rel)));
                git_dir(&dir, root, &rel, 0, &mut out)?;
            }
            EntryKind::File => out.push(GitBind::ReadOnly(root.join(&rel))),
            // A `.git` link: git checks the link's own owner (`lstat`) against its user, so one
            // the agent planted is refused by git itself; one the operator made is theirs. Never
            // bound (a bind would follow it).
            EntryKind::Symlink(_) | EntryKind::Other => {}
        }
    }
    Ok(out)
}

/// The entries of the git directory `rel` (already a tmpfs or a `--dir` in one).
fn git_dir(
    dir: &RootDir,
    root: &Path,
    rel: &Path,
    depth: usize,
    out: &mut Vec<GitBind>,
) -> Result<(), SandboxError> {
    let entries = dir.list(rel).map_err(|e| walk_err(root, e))?;
    for (name, kind) in entries {
        let path = root.join(rel).join(&name);
        let text = name.to_str().unwrap_or("");
        match kind {
            EntryKind::Symlink(target) => out.push(GitBind::Symlink { target, path }),
            EntryKind::Other => {}
            EntryKind::Dir if GIT_WRITABLE_DIRS.contains(&text) => {
                out.push(GitBind::Writable(path))
            }
            EntryKind::Dir if GIT_OWN_DIRS.contains(&text) => out.push(GitBind::Dir(path)),
            EntryKind::Dir if GIT_NESTED_DIRS.contains(&text) && depth < MAX_NESTING => {
                out.push(GitBind::Dir(path));
                nested(dir, root, &rel.join(&name), depth, out)?;
            }
            EntryKind::File if is_copied(text) => {
                let fd = dir
                    .open_file(&rel.join(&name))
                    .map_err(|e| walk_err(root, e))?;
                out.push(GitBind::Copy { fd, path });
            }
            EntryKind::Dir | EntryKind::File => out.push(GitBind::ReadOnly(path)),
        }
    }
    Ok(())
}

/// `modules/` or `worktrees/`: each directory in it is a git directory; anything else is
/// bound read-only (a `modules/<a>/<b>` submodule name with a slash nests one level deeper, and
/// is handled as a git directory only if it holds a `HEAD`: otherwise a directory level).
fn nested(
    dir: &RootDir,
    root: &Path,
    rel: &Path,
    depth: usize,
    out: &mut Vec<GitBind>,
) -> Result<(), SandboxError> {
    let entries: Vec<(OsString, EntryKind)> = dir.list(rel).map_err(|e| walk_err(root, e))?;
    for (name, kind) in entries {
        let sub = rel.join(&name);
        let path = root.join(&sub);
        match kind {
            EntryKind::Symlink(target) => out.push(GitBind::Symlink { target, path }),
            EntryKind::Other => {}
            EntryKind::File => out.push(GitBind::ReadOnly(path)),
            EntryKind::Dir => {
                let is_git_dir = dir
                    .list(&sub)
                    .map_err(|e| walk_err(root, e))?
                    .iter()
                    .any(|(n, _)| n == "HEAD");
                if depth + 1 >= MAX_NESTING {
                    out.push(GitBind::ReadOnly(path));
                } else if is_git_dir {
                    out.push(GitBind::Dir(path));
                    git_dir(dir, root, &sub, depth + 1, out)?;
                } else {
                    out.push(GitBind::Dir(path));
                    nested(dir, root, &sub, depth + 1, out)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(binds: &[GitBind], root: &Path) -> Vec<String> {
        binds
            .iter()
            .map(|b| {
                let p = b.path().strip_prefix(root).unwrap().display().to_string();
                match b {
                    GitBind::Tmpfs(_) => format!("tmpfs {p}"),
                    GitBind::Dir(_) => format!("dir {p}"),
                    GitBind::Writable(_) => format!("rw {p}"),
                    GitBind::ReadOnly(_) => format!("ro {p}"),
                    GitBind::Symlink { target, .. } => {
                        format!("link {p} -> {}", target.display())
                    }
                    GitBind::Copy { .. } => format!("copy {p}"),
                }
            })
            .collect()
    }

    #[test]
    fn a_repository_is_laid_out_by_allowlist_with_nested_git_directories() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let mk = |p: &str| std::fs::create_dir_all(r.join(p)).unwrap();
        let file = |p: &str| std::fs::write(r.join(p), "x").unwrap();
        for d in [
            ".git/objects",
            ".git/refs/heads",
            ".git/logs",
            ".git/hooks",
            ".git/info",
            ".git/modules/lib/objects",
            ".git/modules/lib/hooks",
            ".git/worktrees/w",
            "sub/deep/.git/refs",
            "src",
        ] {
            mk(d);
        }
        for f in [
            ".git/HEAD",
            ".git/index",
            ".git/config",
            ".git/ORIG_HEAD",
            ".git/COMMIT_EDITMSG",
            ".git/description",
            ".git/modules/lib/HEAD",
            ".git/modules/lib/config",
            ".git/worktrees/w/HEAD",
            ".git/worktrees/w/commondir",
            ".git/worktrees/w/gitdir",
            "sub/deep/.git/HEAD",
            "sub/deep/.git/config",
            "lib/.git",
            "src/main.rs",
        ] {
            if let Some(parent) = Path::new(f).parent() {
                mk(&parent.display().to_string());
            }
            file(f);
        }
        std::os::unix::fs::symlink("../elsewhere", r.join("sub/deep/.git/objects")).unwrap();
        std::os::unix::fs::symlink("/tmp", r.join("src/.git")).unwrap();
        let got = shown(&plan(r, None).unwrap(), r);
        let want = [
            "tmpfs .git",
            "copy .git/COMMIT_EDITMSG",
            "copy .git/HEAD",
            "copy .git/ORIG_HEAD",
            "ro .git/config",
            "ro .git/description",
            "ro .git/hooks",
            "copy .git/index",
            "ro .git/info",
            "dir .git/logs",
            "dir .git/modules",
            "dir .git/modules/lib",
            "copy .git/modules/lib/HEAD",
            "ro .git/modules/lib/config",
            "ro .git/modules/lib/hooks",
            "rw .git/modules/lib/objects",
            "rw .git/objects",
            "rw .git/refs",
            "dir .git/worktrees",
            "dir .git/worktrees/w",
            "copy .git/worktrees/w/HEAD",
            "ro .git/worktrees/w/commondir",
            "ro .git/worktrees/w/gitdir",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "{w} missing from {got:#?}");
        }
        assert!(got.contains(&"ro lib/.git".to_string()), "{got:#?}");
        assert!(got.contains(&"tmpfs sub/deep/.git".to_string()), "{got:#?}");
        assert!(got.contains(&"ro sub/deep/.git/config".to_string()));
        assert!(got.contains(&"link sub/deep/.git/objects -> ../elsewhere".to_string()));
        assert!(
            !got.iter()
                .any(|g| g.starts_with("src/.git") || g.ends_with("src/.git")),
            "a .git symlink is never bound: {got:#?}"
        );
        // Every entry of a .git follows its tmpfs.
        let at = |s: &str| got.iter().position(|g| g == s).unwrap();
        assert!(at("tmpfs .git") < at("ro .git/config"));
        assert!(at("dir .git/modules/lib") < at("ro .git/modules/lib/config"));
        // Nothing was created in the host's .git.
        assert!(!r.join(".git/commondir").exists());
    }

    #[test]
    fn a_root_without_git_has_no_git_binds() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        assert!(plan(t.path(), None).unwrap().is_empty());
        assert!(!t.path().join(".git").exists(), "no repository is invented");
    }

    /// The walk's cost on a large tree (run by hand: `cargo test -p warden-sandbox --lib
    /// walk_cost -- --ignored --nocapture`; `WARDEN_WALK_ROOT` names the tree, default /usr).
    #[test]
    #[ignore]
    fn walk_cost() {
        let root = std::env::var_os("WARDEN_WALK_ROOT").map_or("/usr".into(), PathBuf::from);
        let dir = RootDir::open(&root).unwrap();
        let t = std::time::Instant::now();
        let found = dir.find_named(".git".as_ref(), GIT_WALK_MAX_ENTRIES);
        println!(
            "walked {} in {:?}: {:?} .git entries",
            root.display(),
            t.elapsed(),
            found.map(|f| f.len())
        );
    }
}
