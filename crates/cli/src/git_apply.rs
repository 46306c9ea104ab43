//! `warden tasks apply`'s git: a task's diff applied to a directory's files by `git apply` (and
//! `--3way` where the directory's repository has the blobs), with a repository of warden's own.
//!
//! git runs with `GIT_DIR` a fresh, empty repository made here (its config warden's alone,
//! no template), `GIT_WORK_TREE` the directory, every inherited `GIT_*` variable removed, no
//! system or global config, and `-c` settings that turn off hooks, fsmonitor, pagers, network
//! protocols and lazy fetches. The directory's own `.git/config` is never read, so nothing it or
//! an agent could name runs: no hook, no fsmonitor command, no filter or merge driver (a
//! `.gitattributes` may name one; no config here defines it), no `include.path`. The
//! directory's objects are only read, through `objects/info/alternates`, for the three-way
//! merge.
//!
//! Must never: run git with the directory's `.git` as its repository; write into that `.git`;
//! leave its scratch repository behind.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The settings every git run here has, whatever the directory's or the user's config says.
pub const FIXED: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.bare=false",
    "core.attributesFile=/dev/null",
    "core.sshCommand=false",
    "protocol.allow=never",
    "advice.detachedHead=false",
];

#[derive(Debug, thiserror::Error)]
pub enum GitApplyError {
    #[error("cannot run git: {0}")]
    Run(#[source] std::io::Error),
    #[error("cannot prepare warden's scratch repository in {path}: {source}")]
    Scratch {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("git {what} failed: {why}")]
    Git { what: String, why: String },
}

/// A scratch repository of warden's own, for one apply in `work_tree`; removed when dropped.
pub struct Scratch {
    root: PathBuf,
    git_dir: PathBuf,
    index: PathBuf,
    work_tree: PathBuf,
    /// Whether the directory's repository objects are readable (alternates): `--3way` can work.
    pub has_objects: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The objects directory of the repository `dir` is in: the nearest `.git` directory at or
/// above it (a `.git` file, a linked worktree's, gives none: apply still works, without
/// `--3way`). Found by looking at the file system, never by asking git in `dir`.
pub fn objects_of(dir: &Path) -> Option<PathBuf> {
    let mut at = Some(dir);
    while let Some(d) = at {
        let dot = d.join(".git");
        match std::fs::symlink_metadata(&dot) {
            Ok(m) if m.is_dir() => {
                let objects = dot.join("objects");
                return std::fs::symlink_metadata(&objects)
                    .ok()
                    .filter(|m| m.is_dir())
                    .map(|_| objects);
            }
            Ok(_) => return None,
            Err(_) => at = d.parent(),
        }
    }
    None
}

/// git with warden's settings only, in `cwd`.
pub fn fixed_git(cwd: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(cwd);
    // Nothing of the caller's git environment (GIT_DIR, GIT_CONFIG_PARAMETERS,
    // GIT_EXTERNAL_DIFF, GIT_ALTERNATE_OBJECT_DIRECTORIES, ...) reaches it.
    for (k, _) in std::env::vars_os() {
        if k.as_encoded_bytes().starts_with(b"GIT_") {
            c.env_remove(k);
        }
    }
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_OPTIONAL_LOCKS", "0");
    for s in FIXED {
        c.args(["-c", s]);
    }
    c
}

impl Scratch {
    /// Makes the scratch repository under `parent` (private to the user) for `work_tree`.
    pub fn new(parent: &Path, work_tree: &Path) -> Result<Self, GitApplyError> {
        use std::os::unix::fs::DirBuilderExt;
        let root = parent.join(format!("apply-{}", uuid::Uuid::new_v4()));
        let err = |source| GitApplyError::Scratch {
            path: root.display().to_string(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(err)?;
        let git_dir = root.join("git");
        let mut s = Scratch {
            index: root.join("index"),
            git_dir: git_dir.clone(),
            work_tree: work_tree.to_path_buf(),
            root,
            has_objects: false,
        };
        let mut init = fixed_git(&s.root);
        init.args(["init", "-q", "--bare", "--template="])
            .arg(&git_dir);
        run(init, "init")?;
        if let Some(objects) = objects_of(work_tree) {
            let info = git_dir.join("objects").join("info");
            std::fs::create_dir_all(&info).map_err(|e| GitApplyError::Scratch {
                path: info.display().to_string(),
                source: e,
            })?;
            let mut line = objects.into_os_string();
            line.push("\n");
            std::fs::write(info.join("alternates"), line.as_encoded_bytes()).map_err(|e| {
                GitApplyError::Scratch {
                    path: info.display().to_string(),
                    source: e,
                }
            })?;
            s.has_objects = true;
        }
        Ok(s)
    }

    /// git on the work tree with the scratch repository and index.
    pub fn git(&self) -> Command {
        let mut c = fixed_git(&self.work_tree);
        c.env("GIT_DIR", &self.git_dir)
            .env("GIT_WORK_TREE", &self.work_tree)
            .env("GIT_INDEX_FILE", &self.index);
        c
    }

    /// The scratch index given the work tree's current `paths` (those that exist), so
    /// `--3way` (which implies `--index`) finds them as they are.
    pub fn index_paths(&self, paths: &[String]) -> Result<(), GitApplyError> {
        let present: Vec<OsString> = paths
            .iter()
            .filter(|p| std::fs::symlink_metadata(self.work_tree.join(p)).is_ok())
            .map(OsString::from)
            .collect();
        if present.is_empty() {
            return Ok(());
        }
        let mut c = self.git();
        c.args(["update-index", "--add", "--"]).args(&present);
        run(c, "update-index").map(|_| ())
    }

    /// `git apply [--3way] [--check] PATCH`.
    pub fn apply(
        &self,
        patch: &Path,
        three_way: bool,
        check: bool,
    ) -> Result<Output, GitApplyError> {
        let mut c = self.git();
        c.arg("apply");
        if three_way {
            c.arg("--3way");
        }
        if check {
            c.arg("--check");
        }
        c.arg(patch).output().map_err(GitApplyError::Run)
    }
}

fn run(mut c: Command, what: &str) -> Result<Output, GitApplyError> {
    let out = c.output().map_err(GitApplyError::Run)?;
    if !out.status.success() {
        return Err(GitApplyError::Git {
            what: what.into(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, args: &[&str]) {
        let out = fixed_git(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The directory's own config defines a clean/smudge filter, a merge driver and an
    /// fsmonitor, and its attributes name them: applying runs none of them.
    #[test]
    fn nothing_the_directorys_config_names_runs() {
        let t = std::env::temp_dir().join(format!("warden-git-apply-{}", uuid::Uuid::new_v4()));
        let repo = t.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        sh(&repo, &["init", "-q"]);
        std::fs::write(repo.join("f"), "a\n").unwrap();
        sh(&repo, &["add", "f"]);
        sh(&repo, &["commit", "-qm", "base"]);
        let marker = t.join("ran");
        // A script, not an inline command: `;` starts a comment in git's config.
        let cmd = t.join("evil.sh").display().to_string();
        std::fs::write(
            &cmd,
            format!("#!/bin/sh\ntouch {}\ncat\n", marker.display()),
        )
        .unwrap();
        std::fs::set_permissions(&cmd, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
        config.push_str(&format!(
            "[filter \"evil\"]\n\tclean = {cmd}\n\tsmudge = {cmd}\n\trequired = true\n[merge \"evil\"]\n\tdriver = {cmd}\n[core]\n\tfsmonitor = {cmd}\n\thooksPath = /nonexistent\n[include]\n\tpath = {}\n",
            t.join("inc").display()
        ));
        std::fs::write(repo.join(".git/config"), config).unwrap();
        std::fs::write(t.join("inc"), format!("[core]\n\tfsmonitor = {cmd}\n")).unwrap();
        std::fs::write(repo.join(".gitattributes"), "* filter=evil merge=evil\n").unwrap();
        let patch = t.join("p.diff");
        std::fs::write(
            &patch,
            "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1,2 @@\n a\n+b\ndiff --git a/new b/new\nnew file mode 100644\n--- /dev/null\n+++ b/new\n@@ -0,0 +1 @@\n+n\n",
        )
        .unwrap();
        let s = Scratch::new(&t, &repo).unwrap();
        assert!(s.has_objects);
        s.index_paths(&["f".into(), "new".into()]).unwrap();
        for three_way in [false, true] {
            let out = s.apply(&patch, three_way, true).unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = s.apply(&patch, false, false).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read_to_string(repo.join("f")).unwrap(), "a\nb\n");
        assert_eq!(std::fs::read_to_string(repo.join("new")).unwrap(), "n\n");
        assert!(!marker.exists(), "something the repository named ran");
        let root = s.root.clone();
        drop(s);
        assert!(!root.exists(), "the scratch repository was left behind");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn the_objects_are_found_by_looking_never_by_asking_git() {
        let t = std::env::temp_dir().join(format!("warden-git-objects-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(t.join("r/.git/objects")).unwrap();
        std::fs::create_dir_all(t.join("r/sub")).unwrap();
        std::fs::create_dir_all(t.join("w")).unwrap();
        std::fs::write(t.join("w/.git"), "gitdir: /elsewhere\n").unwrap();
        assert_eq!(objects_of(&t.join("r/sub")), Some(t.join("r/.git/objects")));
        assert_eq!(objects_of(&t.join("w")), None);
        let _ = std::fs::remove_dir_all(&t);
    }
}
