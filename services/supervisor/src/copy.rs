//! A conversation's root made as a copy of a directory the caller named (`copy_from`,
//! `warden send -C DIR`): the directory's regular files read through directory fds
//! (`RootDir::snapshot` and `RootDir::content`: no link followed, `.git` left out) and written
//! beneath the new root with the agent's rights. Must never write the source, follow a link in
//! it, copy a repository's own files (`.git`: its config and hooks), or copy past its bounds.

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
    let snap = root
        .snapshot(caps.max_entries)
        .ok_or_else(|| CopyError::TooManyEntries {
            path: src.into(),
            max: caps.max_entries,
        })?;
    let mut total: u64 = 0;
    let mut files = 0;
    for p in snap.paths() {
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
}
