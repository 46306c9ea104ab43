//! Per-conversation agent homes: `<state>/homes/<label>-<random>`, made fresh for each
//! conversation from the operator's template for that agent (contents copied, symlinks copied as
//! links and never followed), owned by the agent, removed with the conversation. Nothing one
//! conversation writes into its home (settings, hooks, rules, credentials it was shown) reaches
//! another. Conversations do not outlive the supervisor, so every home left in the directory at
//! start-up belongs to a crashed run and is removed.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};

use crate::SandboxError;
use crate::identity::AgentIdentity;
use crate::roots::sanitize_label;

/// The directory of per-conversation homes.
#[derive(Debug, Clone)]
pub struct AgentHomes {
    dir: PathBuf,
}

/// One conversation's home; removed by [`AgentHome::remove`] or, failing that, on drop.
#[derive(Debug)]
pub struct AgentHome {
    path: Option<PathBuf>,
    /// The agent it was made for: whose rights its removal runs with.
    owner: Option<(u32, u32)>,
}

impl AgentHomes {
    /// Uses `<state_dir>/homes` (created if missing, never a symlink) and removes every home a
    /// previous run left. `switching`: agents run as their own uid(s), which then need search
    /// on this directory.
    pub fn open(state_dir: &Path, switching: bool) -> Result<Self, SandboxError> {
        let me = Self::open_keeping_leftovers(state_dir, switching)?;
        me.remove_leftovers()?;
        Ok(me)
    }

    /// [`AgentHomes::open`] without removing what a previous run left: for a caller that must
    /// first give the agent uids their way to the homes (search on the state directory, which
    /// the unit's `StateDirectoryMode=` resets at each start), since each leftover is removed
    /// with its agent's rights; then [`AgentHomes::remove_leftovers`].
    pub fn open_keeping_leftovers(state_dir: &Path, switching: bool) -> Result<Self, SandboxError> {
        let dir = state_dir.join("homes");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create homes directory", &dir, e)),
        }
        let meta = std::fs::symlink_metadata(&dir)
            .map_err(|e| SandboxError::io("inspect homes directory", &dir, e))?;
        if !meta.is_dir() {
            return Err(SandboxError::InvalidInput(format!(
                "{} is not a real directory",
                dir.display()
            )));
        }
        // The agent must be able to reach its home by path (bubblewrap, running as the agent,
        // resolves bind sources on the host): search, never listing.
        let mode = if switching { 0o711 } else { 0o700 };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| SandboxError::io("set homes directory mode", &dir, e))?;
        Ok(Self { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes every home a previous run left (each with the rights of the agent that owns it).
    pub fn remove_leftovers(&self) -> Result<(), SandboxError> {
        Self::remove_homes(self.leftovers()?);
        Ok(())
    }

    /// What is in the homes directory now: at start-up, what a previous run left. Listed before
    /// the daemon serves, so [`AgentHomes::remove_homes`] can run in the background without
    /// ever meeting a home made since (each new home has a name of its own).
    pub fn leftovers(&self) -> Result<Vec<std::path::PathBuf>, SandboxError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| SandboxError::io("list homes", &self.dir, e))?;
        Ok(entries.flatten().map(|e| e.path()).collect())
    }

    /// Removes `leftovers` (from [`AgentHomes::leftovers`]): a home as the agent that owns it
    /// (the directory's owner), links as links; anything else there is the supervisor's own.
    /// Blocking: hundreds of homes take a while, so a daemon runs this off its start-up path.
    pub fn remove_homes(leftovers: Vec<std::path::PathBuf>) {
        let mut n = 0;
        for p in leftovers {
            let r = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => crate::roots::remove_as_owner(&p, None, "remove agent home"),
                _ => std::fs::remove_file(&p).map_err(|e| SandboxError::io("remove", &p, e)),
            };
            match r {
                Ok(()) => n += 1,
                Err(err) => {
                    tracing::warn!(home = %p.display(), error = %err, "cannot remove a leftover agent home")
                }
            }
        }
        if n > 0 {
            tracing::info!(homes = n, "removed agent homes left by a previous run");
        }
    }

    /// A fresh home for `conversation_id`: a copy of `template` when given (which must be a
    /// real directory), else empty; owned by `owner` (the conversation's agent identity; `None`:
    /// the supervisor's own uid), mode 0700.
    pub fn create(
        &self,
        conversation_id: &str,
        template: Option<&Path>,
        owner: Option<AgentIdentity>,
    ) -> Result<AgentHome, SandboxError> {
        let name = format!(
            "{}-{}",
            sanitize_label(conversation_id),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let path = self.dir.join(name);
        // `create` (not `create_dir_all`) fails when the name exists: the home is always new.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| SandboxError::io("create agent home", &path, e))?;
        let home = AgentHome {
            path: Some(path.clone()),
            owner: owner.map(|o| (o.uid, o.gid)),
        };
        if let Some(t) = template {
            let meta = std::fs::symlink_metadata(t)
                .map_err(|e| SandboxError::io("inspect home template", t, e))?;
            if !meta.is_dir() {
                return Err(SandboxError::InvalidInput(format!(
                    "agent home template {} is not a directory (or is a symlink)",
                    t.display()
                )));
            }
            copy_tree(t, &path, owner)?;
        }
        if let Some(o) = owner {
            chown(&path, o)?;
        }
        tracing::info!(context_id = %conversation_id, home = %path.display(), "created agent home");
        Ok(home)
    }
}

impl AgentHome {
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// Deletes the home and everything in it, with its agent's rights (links removed as links).
    pub fn remove(mut self) -> Result<(), SandboxError> {
        match self.path.take() {
            Some(p) => crate::roots::remove_as_owner(&p, self.owner, "remove agent home"),
            None => Ok(()),
        }
    }
}

impl Drop for AgentHome {
    fn drop(&mut self) {
        if let Some(p) = self.path.take()
            && let Err(e) = crate::roots::remove_as_owner(&p, self.owner, "remove agent home")
        {
            tracing::warn!(error = %e, "cannot remove an agent home");
        }
    }
}

fn chown(p: &Path, o: AgentIdentity) -> Result<(), SandboxError> {
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        p,
        Some(Uid::from_raw(o.uid)),
        Some(Gid::from_raw(o.gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| SandboxError::io("chown", p, std::io::Error::from(e)))
}

/// Copies the contents of `from` into the existing directory `to`: directories and regular
/// files (permission bits without set-id), symlinks as links (never followed); sockets, FIFOs
/// and devices are skipped.
fn copy_tree(from: &Path, to: &Path, owner: Option<AgentIdentity>) -> Result<(), SandboxError> {
    let entries =
        std::fs::read_dir(from).map_err(|e| SandboxError::io("read template", from, e))?;
    for e in entries {
        let e = e.map_err(|e| SandboxError::io("read template", from, e))?;
        let src = e.path();
        let dst = to.join(e.file_name());
        let meta = std::fs::symlink_metadata(&src)
            .map_err(|e| SandboxError::io("inspect template entry", &src, e))?;
        let ft = meta.file_type();
        let mode = meta.mode() & 0o777;
        if ft.is_symlink() {
            let target =
                std::fs::read_link(&src).map_err(|e| SandboxError::io("read link", &src, e))?;
            std::os::unix::fs::symlink(&target, &dst)
                .map_err(|e| SandboxError::io("copy link", &dst, e))?;
        } else if ft.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dst)
                .map_err(|e| SandboxError::io("copy directory", &dst, e))?;
            copy_tree(&src, &dst, owner)?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode | 0o700))
                .map_err(|e| SandboxError::io("set mode", &dst, e))?;
        } else if ft.is_file() {
            copy_file(&src, &dst, mode)?;
        } else {
            continue;
        }
        if let Some(o) = owner {
            chown(&dst, o)?;
        }
    }
    Ok(())
}

fn copy_file(src: &Path, dst: &Path, mode: u32) -> Result<(), SandboxError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
        .map_err(|e| SandboxError::io("read template file", src, e))?;
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dst)
        .map_err(|e| SandboxError::io("copy template file", dst, e))?;
    std::io::copy(&mut r, &mut w).map_err(|e| SandboxError::io("copy template file", dst, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_fresh_copies_removed_with_their_conversation_and_after_a_crash() {
        let state = tempfile::tempdir().unwrap();
        let tpl = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(tpl.path().join(".claude")).unwrap();
        std::fs::write(tpl.path().join(".claude/settings.json"), "{\"a\":1}").unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), tpl.path().join("link")).unwrap();

        let homes = AgentHomes::open(state.path(), false).unwrap();
        let a = homes.create("ctx-a", Some(tpl.path()), None).unwrap();
        let b = homes.create("ctx-b", Some(tpl.path()), None).unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(
            std::fs::read_to_string(a.path().join(".claude/settings.json")).unwrap(),
            "{\"a\":1}"
        );
        // The link is copied as a link, not as the directory it points to.
        assert!(
            std::fs::symlink_metadata(a.path().join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::write(a.path().join("mine"), "a").unwrap();
        assert!(!b.path().join("mine").exists());
        let a_path = a.path().to_path_buf();
        a.remove().unwrap();
        assert!(!a_path.exists());
        assert!(
            outside.path().join("secret").exists(),
            "links are not followed on removal"
        );
        // A crash leaves b behind: the next open removes it.
        let b_path = b.path().to_path_buf();
        std::mem::forget(b);
        assert!(b_path.exists());
        let _again = AgentHomes::open(state.path(), false).unwrap();
        assert!(!b_path.exists());
        assert!(
            tpl.path().join(".claude/settings.json").exists(),
            "template untouched"
        );
    }
}
