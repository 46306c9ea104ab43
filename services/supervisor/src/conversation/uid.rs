//! A conversation's own uid (`sandbox.agent_uid_range`): taken before its agent starts, given
//! back when it closes or stops idle, its root and home handed to the uid and back.
//!
//! Owns: lending a uid and the ownership of the conversation's files that goes with it. Must
//! never: give back a uid a process still runs as (`uid_in_use`), or guess.

use super::*;

impl Conversation {
    pub(super) fn home_path(&self) -> Option<std::path::PathBuf> {
        self.home
            .lock()
            .ok()
            .and_then(|h| h.as_ref().map(|h| h.path().to_path_buf()))
    }

    /// Closes the root's fd of a conversation whose agent is not running (reopened at its next
    /// start). With `sandbox.agent_uid_range`, also gives back the uid of a conversation whose agent is not
    /// running (idle-stopped, or opened without one), so idle conversations hold no uid another
    /// caller waits for (issue 36, finding 3). Called with the agent stopped (its tree killed,
    /// its terminals and fs servant stopped). Before the uid is free for another conversation:
    /// no process may still run with it (checked in `/proc`, whatever the tree's kill said), and
    /// the owned root and the home are handed to the supervisor itself (`chown_tree`, walked as
    /// this uid, which nothing else holds yet; the root keeps its group, the policy's search),
    /// so the uid's next holder finds nothing of this conversation it could reach: the top
    /// directories are no longer its, and every entry below them neither. The root's fd is
    /// closed (the supervisor's look at it is taken again with the next uid). Anything that
    /// fails keeps the uid (and says why): never a uid given back with something still its.
    pub async fn give_back_uid(&self) {
        if !uid_range(&self.shared) {
            // No uid to give back; the root's fd is not needed until the agent runs again.
            self.core.set_files(Err(
                "closed while the conversation's agent is stopped".into()
            ));
            return;
        }
        let ctx = self.core.info.context_id.clone();
        let Some(held) = self.shared.spawner.agent_identity_for(&ctx) else {
            return;
        };
        let root = self.core.info.owned.then(|| self.core.info.root.clone());
        let home = self.home_path();
        let parked = tokio::task::spawn_blocking(move || -> Result<(), String> {
            if uid_in_use(held.uid) {
                return Err(format!("a process still runs as uid {}", held.uid));
            }
            let owner = parked_owner();
            for dir in root.iter().chain(home.iter()) {
                warden_sandbox::chown_tree(dir, owner)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match parked {
            Ok(()) => {
                self.core
                    .set_files(Err("the conversation holds no agent uid now".into()));
                if let Ok(mut p) = self.parked_from.lock() {
                    *p = Some(held);
                }
                self.shared.spawner.release_identity(&ctx);
                tracing::info!(context_id = %ctx, uid = held.uid, "agent stopped: its uid given back, root and home the supervisor's until its next start");
            }
            Err(e) => {
                tracing::warn!(context_id = %ctx, uid = held.uid, error = %e, "agent stopped, its uid kept: it cannot be given back safely");
            }
        }
    }

    /// Opens the root again for the supervisor's look (closed while the agent was stopped). With
    /// a uid range: takes a uid of `sandbox.agent_uid_range` again for a conversation that gave its own back
    /// ([`Conversation::give_back_uid`]), and hands its root and home to it: the lowest free
    /// one, likely another than before. None free: fault `capacity` naming the range, nothing
    /// started (the live-agent limit, at most the range's size, serves the turns waiting for an
    /// agent round robin across principals; this is the rare race past it).
    pub(super) async fn take_uid(&self) -> Result<(), StartError> {
        if !uid_range(&self.shared) {
            if self.core.files().is_none() {
                let rights = self
                    .shared
                    .spawner
                    .agent_identity_for(&self.core.info.context_id)
                    .map(Into::into);
                let files =
                    warden_containment::beneath::RootDir::open_as(&self.core.info.root, rights)
                        .map(Arc::new)
                        .map_err(|e| e.to_string());
                self.core.set_files(files);
            }
            return Ok(());
        }
        let ctx = self.core.info.context_id.clone();
        if self.shared.spawner.agent_identity_for(&ctx).is_some() {
            return Ok(());
        }
        let ident = match self.shared.spawner.assign_identity(&ctx) {
            Ok(Some(i)) => i,
            Ok(None) => return Ok(()),
            Err(e) => {
                return Err(StartError::NoRoom(format!(
                    "capacity: no agent uid is free ({e}); every one is held by a conversation \
                     whose agent runs. Try again when one stops (limits.idle_timeout_secs)"
                )));
            }
        };
        let root = self.core.info.owned.then(|| self.core.info.root.clone());
        let home = self.home_path();
        let handed = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let own_group = parked_owner().gid;
            if let Some(root) = &root {
                warden_sandbox::chown_tree(root, ident)
                    .map_err(|e| format!("{}: {e}", root.display()))?;
                // The root's group stays the supervisor's (the policy's search), as made.
                std::os::unix::fs::lchown(root, None, Some(own_group))
                    .map_err(|e| format!("{}: {e}", root.display()))?;
            }
            if let Some(home) = &home {
                warden_sandbox::chown_tree(home, ident)
                    .map_err(|e| format!("{}: {e}", home.display()))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        if let Err(e) = handed {
            self.shared.spawner.release_identity(&ctx);
            return Err(StartError::Spawn(format!(
                "cannot give the sandbox to the agent's uid {}: {e}",
                ident.uid
            )));
        }
        let files =
            warden_containment::beneath::RootDir::open_as(&self.core.info.root, Some(ident.into()))
                .map(Arc::new)
                .map_err(|e| e.to_string());
        self.core.set_files(files);
        let before = self.parked_from.lock().ok().and_then(|mut p| p.take());
        tracing::info!(context_id = %ctx, uid = ident.uid, before = ?before.map(|b| b.uid), "agent uid taken again for the conversation's start");
        Ok(())
    }
}

/// Whether agents run as one uid per conversation, from `sandbox.agent_uid_range`.
pub fn uid_range(shared: &Shared) -> bool {
    shared.spawner.agent_identity().is_none() && !shared.spawner.agent_uid_ranges().is_empty()
}

/// Who a conversation's root and home belong to while it holds no uid: the supervisor itself
/// (its effective uid and gid; the root's group is the supervisor's anyway).
fn parked_owner() -> warden_sandbox::AgentIdentity {
    warden_sandbox::AgentIdentity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

/// Whether any process on the host runs with `uid` as its real, effective, saved or filesystem
/// uid (`/proc/<pid>/status`). A process whose status cannot be read (gone meanwhile) is not
/// counted; one that cannot be parsed is (never a uid given back on a guess).
fn uid_in_use(uid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) else {
            return true;
        };
        let ids: Vec<Option<u32>> = line
            .trim_start_matches("Uid:")
            .split_whitespace()
            .map(|n| n.parse().ok())
            .collect();
        if ids.is_empty() || ids.iter().any(|i| i.is_none_or(|i| i == uid)) {
            return true;
        }
    }
    false
}
