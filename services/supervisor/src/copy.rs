//! A conversation's root made as a copy of a directory the caller named (`copy_from`,
//! `warden send -C DIR`): the directory's regular files read through directory fds
//! (`RootDir::snapshot` and `RootDir::content`: no link followed, `.git` left out) and written
//! beneath the new root with the agent's rights. Where DIR is a git repository (its `.git` right
//! there) the files are those of a worktree of HEAD plus its uncommitted changes: tracked and
//! untracked-but-not-ignored (`git ls-files`, run with warden's own fixed settings: hooks,
//! fsmonitor, untracked cache, protocols off, no system or global config, no `GIT_*` of the
//! supervisor's; it reads DIR's config and ignore files but runs nothing they name), so build
//! output does not count against the caps.
//!
//! Must never write the source, follow a link in it, copy a repository's own files (`.git`: its
//! config and hooks), run anything DIR configures, or copy past its bounds.

use std::path::Path;

use warden_containment::beneath::{Content, RootDir};

use crate::config::CopiesSection;

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(
        "copies of a caller's directory are off on this supervisor ([copies] local_dirs; `warden up` turns it on for a local deployment; a deployed host offers operator workspaces)"
    )]
    Off,
    #[error("{0}: the directory to copy must be an absolute path")]
    Relative(String),
    #[error("{0}: no such directory")]
    Missing(String),
    #[error("{0}: a symbolic link; name the directory itself")]
    Symlink(String),
    #[error("{0}: not a directory")]
    NotADir(String),
    #[error(
        "{path}: owned by uid {owner}, not by the user warden runs as (uid {me}); only your own directories are copied"
    )]
    NotYours { path: String, owner: u32, me: u32 },
    #[error("{path}: more than {max} entries, or not readable as a whole ([copies] max_entries)")]
    TooManyEntries { path: String, max: usize },
    #[error("{path}: more than {max} bytes of files ([copies] max_bytes)")]
    TooLarge { path: String, max: u64 },
    #[error("{0}: cannot be read")]
    Unreadable(String),
    #[error("cannot write the copy: {0}")]
    Write(String),
}

/// Copies `src` into `dst` (a new, empty root opened with the agent's rights). Returns the
/// number of files copied. Symbolic links, FIFOs and devices in `src` are left out.
pub fn copy_into(src: &str, dst: &RootDir, caps: &CopiesSection) -> Result<usize, CopyError> {
    use std::os::unix::fs::MetadataExt;
    if !caps.local_dirs {
        return Err(CopyError::Off);
    }
    let path = Path::new(src);
    if !path.is_absolute() {
        return Err(CopyError::Relative(src.into()));
    }
    let meta = std::fs::symlink_metadata(path).map_err(|_| CopyError::Missing(src.into()))?;
    if meta.file_type().is_symlink() {
        return Err(CopyError::Symlink(src.into()));
    }
    if !meta.is_dir() {
        return Err(CopyError::NotADir(src.into()));
    }
    let me = nix::unistd::Uid::effective().as_raw();
    if meta.uid() != me {
        return Err(CopyError::NotYours {
            path: src.into(),
            owner: meta.uid(),
            me,
        });
    }
    // Opened with O_NOFOLLOW: a link swapped in since the look above is refused here.
    let root = RootDir::open(path).map_err(|e| match e {
        warden_containment::beneath::BeneathError::Symlink(_) => CopyError::Symlink(src.into()),
        _ => CopyError::Unreadable(src.into()),
    })?;
    // The owner again, of the directory held open: a directory renamed into `path` since the
    // look above (another user's) is refused here, not copied.
    match root.owner() {
        Ok(owner) if owner == me => {}
        Ok(owner) => {
            return Err(CopyError::NotYours {
                path: src.into(),
                owner,
                me,
            });
        }
        Err(_) => return Err(CopyError::Unreadable(src.into())),
    }
    let too_many = || CopyError::TooManyEntries {
        path: src.into(),
        max: caps.max_entries,
    };
    let listed: Vec<std::path::PathBuf> = match git_listed(path) {
        Some(paths) if paths.len() > caps.max_entries => return Err(too_many()),
        Some(paths) => paths,
        None => root
            .snapshot(caps.max_entries)
            .ok_or_else(too_many)?
            .paths()
            .map(Path::to_path_buf)
            .collect(),
    };
    let mut total: u64 = 0;
    let mut files = 0;
    for p in listed.iter().map(std::path::PathBuf::as_path) {
        if p.components().any(|c| {
            c.as_os_str()
                .as_encoded_bytes()
                .eq_ignore_ascii_case(b".git")
        }) {
            continue;
        }
        match root.content(p, caps.max_bytes) {
            Content::File { bytes, .. } => {
                total += bytes.len() as u64;
                if total > caps.max_bytes {
                    return Err(CopyError::TooLarge {
                        path: src.into(),
                        max: caps.max_bytes,
                    });
                }
                dst.write_text(p, &bytes, None)
                    .map_err(|e| CopyError::Write(e.to_string()))?;
                files += 1;
            }
            Content::TooLarge { .. } => {
                return Err(CopyError::TooLarge {
                    path: src.into(),
                    max: caps.max_bytes,
                });
            }
            Content::Unreadable => {
                return Err(CopyError::Unreadable(format!("{src}/{}", p.display())));
            }
            // Directories come with their files; links, FIFOs and devices are left out;
            // an entry gone since the walk is simply not there.
            Content::Dir | Content::Symlink(_) | Content::Other | Content::Absent => {}
        }
    }
    Ok(files)
}

/// The files of a worktree of DIR's HEAD plus its uncommitted changes (tracked, and untracked
/// but not ignored), when DIR is the top of a git repository and git can say; `None` otherwise
/// (the whole directory is copied then). Only names come from git: every file is still read
/// through `RootDir::content`, beneath DIR, with no link followed.
fn git_listed(dir: &Path) -> Option<Vec<std::path::PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let dot_git = std::fs::symlink_metadata(dir.join(".git")).ok()?;
    let mut c = std::process::Command::new("git");
    c.current_dir(dir);
    for (k, _) in std::env::vars_os() {
        if k.as_encoded_bytes().starts_with(b"GIT_") {
            c.env_remove(k);
        }
    }
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap_or(dir));
    if dot_git.is_dir() {
        // DIR is the work tree whatever its config's core.worktree says.
        c.env("GIT_DIR", dir.join(".git")).env("GIT_WORK_TREE", dir);
    }
    for setting in GIT_FIXED {
        c.args(["-c", setting]);
    }
    c.args([
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
        "--deduplicate",
    ])
    .stdin(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let out = c.output().ok().filter(|o| o.status.success())?;
    Some(
        out.stdout
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(n)))
            // Only plain relative names (git gives no other; a `..` is refused all the same).
            .filter(|p| {
                p.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
            })
            .collect(),
    )
}

/// The settings of the one git warden runs on a caller's directory, over its own config.
const GIT_FIXED: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "protocol.allow=never",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> CopiesSection {
        CopiesSection {
            local_dirs: true,
            ..Default::default()
        }
    }

    #[test]
    fn files_are_copied_links_and_git_left_out() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host\n").unwrap();
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::create_dir_all(s.join("src")).unwrap();
        std::fs::create_dir_all(s.join(".git/hooks")).unwrap();
        std::fs::write(s.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(s.join("src/a.rs"), "fn main() {}\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), s.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), s.join("dirlink")).unwrap();
        let dst = tempfile::tempdir().unwrap();
        let d = RootDir::open(dst.path()).unwrap();
        let src_str = s.to_str().unwrap();
        assert_eq!(copy_into(src_str, &d, &on()).unwrap(), 1);
        assert_eq!(
            std::fs::read_to_string(dst.path().join("src/a.rs")).unwrap(),
            "fn main() {}\n"
        );
        assert!(!dst.path().join(".git").exists());
        assert!(!dst.path().join("link").exists());
        assert!(!dst.path().join("dirlink").exists());
    }

    #[test]
    fn bad_sources_are_refused_by_name() {
        let dst = tempfile::tempdir().unwrap();
        let d = RootDir::open(dst.path()).unwrap();
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::write(s.join("f"), "x").unwrap();
        std::os::unix::fs::symlink(s, s.join("l")).unwrap();
        let name = |p: &Path| p.to_str().unwrap().to_string();
        assert!(matches!(
            copy_into(&name(s), &d, &CopiesSection::default()),
            Err(CopyError::Off)
        ));
        assert!(matches!(
            copy_into("rel", &d, &on()),
            Err(CopyError::Relative(_))
        ));
        assert!(matches!(
            copy_into(&name(&s.join("none")), &d, &on()),
            Err(CopyError::Missing(_))
        ));
        assert!(matches!(
            copy_into(&name(&s.join("f")), &d, &on()),
            Err(CopyError::NotADir(_))
        ));
        assert!(matches!(
            copy_into(&name(&s.join("l")), &d, &on()),
            Err(CopyError::Symlink(_))
        ));
        let small = CopiesSection {
            max_bytes: 0,
            ..on()
        };
        assert!(matches!(
            copy_into(&name(s), &d, &small),
            Err(CopyError::TooLarge { .. })
        ));
        let few = CopiesSection {
            max_entries: 1,
            ..on()
        };
        assert!(matches!(
            copy_into(&name(s), &d, &few),
            Err(CopyError::TooManyEntries { .. })
        ));
    }

    /// DIR a repository: what a worktree of HEAD plus the uncommitted changes holds (tracked
    /// files, changed or not; untracked ones not ignored), never the ignored build output; and
    /// nothing DIR's config names runs (its fsmonitor, a filter on every file).
    #[test]
    fn a_repository_is_copied_as_its_worktree_and_its_config_runs_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let s = t.path().join("repo");
        std::fs::create_dir_all(s.join("src")).unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "core.hooksPath=/dev/null",
                ])
                .args(args)
                .current_dir(&s)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        git(&["init", "-q"]);
        std::fs::write(s.join(".gitignore"), "target/\n*.log\n").unwrap();
        std::fs::write(s.join("src/a.rs"), "fn a() {}\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "base"]);
        std::fs::write(s.join("src/a.rs"), "fn a() { changed }\n").unwrap();
        std::fs::write(s.join("notes.txt"), "untracked\n").unwrap();
        std::fs::create_dir_all(s.join("target/debug")).unwrap();
        std::fs::write(s.join("target/debug/big"), vec![b'x'; 4096]).unwrap();
        std::fs::write(s.join("build.log"), "log\n").unwrap();
        let marker = t.path().join("ran");
        let script = t.path().join("evil.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\ntouch {}\ncat\n", marker.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut config = std::fs::read_to_string(s.join(".git/config")).unwrap();
        config.push_str(&format!(
            "[core]\n\tfsmonitor = {0}\n\tworktree = /nonexistent\n[filter \"evil\"]\n\tclean = {0}\n\tsmudge = {0}\n",
            script.display()
        ));
        std::fs::write(s.join(".git/config"), config).unwrap();
        std::fs::write(s.join(".gitattributes"), "* filter=evil\n").unwrap();
        let dst = tempfile::tempdir().unwrap();
        let d = RootDir::open(dst.path()).unwrap();
        let caps = CopiesSection {
            max_bytes: 1024,
            ..on()
        };
        // 4 files: .gitignore, .gitattributes, src/a.rs, notes.txt; the 4 KiB of build output
        // would pass max_bytes.
        assert_eq!(copy_into(s.to_str().unwrap(), &d, &caps).unwrap(), 4);
        let got = |p: &str| std::fs::read_to_string(dst.path().join(p)).ok();
        assert_eq!(got("src/a.rs").as_deref(), Some("fn a() { changed }\n"));
        assert_eq!(got("notes.txt").as_deref(), Some("untracked\n"));
        assert!(got(".gitignore").is_some());
        assert!(!dst.path().join("target").exists());
        assert!(!dst.path().join("build.log").exists());
        assert!(!dst.path().join(".git").exists());
        assert!(!marker.exists(), "something DIR's config names ran");
    }
}
