//! Roots: the directory a conversation's agent works in.
//!
//! Owned sandboxes are made by this crate with `mkdtemp` (the call fails unless the directory is
//! new) under `<state dir>/sandboxes`, never under a temp tree; the conversation id survives only
//! as a sanitized label at the front of the name, and the owner's store maps conversation →
//! directory (with device and inode, so a swapped directory is noticed) and to the principal that
//! owns it, so a restart does not turn an owned root into anybody's. Operator workspaces are
//! validated: an existing directory, not `/`, not a home directory or anything above one, not an
//! agent configuration home or anything inside one — by spelling and by (device, inode).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_containment::rights::Rights;
use warden_containment::{AgentHomes, RealFs, RootCheck, is_inside};
use warden_store::{Store, Tree};

use crate::SandboxError;

const REGISTRY_TREE: &str = "sandbox-roots";
const LABEL_MAX: usize = 32;

pub use warden_containment::{Boundary, Profile};

/// The label a conversation id leaves on its sandbox's name: ASCII letters, digits, `-` and `_`
/// only (everything else becomes `_`), no leading `.`/`-`, at most 32 characters, never empty.
/// It is decoration for whoever reads a directory listing; it never decides where a
/// directory lands.
pub fn sanitize_label(conversation_id: &str) -> String {
    let mut out: String = conversation_id
        .chars()
        .take(LABEL_MAX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    while out.starts_with('-') {
        out.replace_range(0..1, "_");
    }
    if out.chars().all(|c| c == '_') {
        out = "conv".to_string();
    }
    out
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RootRecord {
    dir: PathBuf,
    dev: u64,
    ino: u64,
    /// Birth time (ns since the epoch) where the filesystem records one: an inode number can be
    /// reused by a directory recreated under the same name, a birth time cannot.
    #[serde(default)]
    btime_ns: Option<u128>,
    allow_execute: bool,
    profile: Profile,
    /// The principal (the gateway's authenticated caller) the root belongs to. `None`: recorded
    /// before owners were, which nobody may reopen (see [`OwnedRoots::owner`]).
    #[serde(default)]
    principal: Option<String>,
    /// The agent identity it was made for (uid, gid): whose rights its removal runs with.
    /// `None`: made for the supervisor's own uid, or recorded before owners were (then the
    /// directory's owner is taken).
    #[serde(default)]
    owner: Option<(u32, u32)>,
}

/// Who a registered root belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootOwner {
    /// The principal that made it (through a conversation it opened).
    Principal(String),
    /// A root recorded before owners were: it belongs to no caller any more.
    Unrecorded,
}

impl RootOwner {
    /// Whether `principal` may reopen the root.
    pub fn is(&self, principal: &str) -> bool {
        matches!(self, RootOwner::Principal(p) if p == principal)
    }
}

/// Directories that are temp trees: owned sandboxes never go there, because agents (Codex in
/// particular) keep `/tmp` writable without asking, so two conversations could meet there.
const TEMP_TREES: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// The temp tree `dir` is inside (resolved as far as it exists), if any: a state directory
/// there is refused. Also what the test harness asks before it puts deployments under a
/// checkout (a clone in `/tmp` must not make every test fail).
pub fn temp_tree_of(dir: &Path) -> Option<&'static str> {
    TEMP_TREES
        .iter()
        .copied()
        .find(|t| is_inside(t, dir, &RealFs).unwrap_or(true))
}

/// The owned-sandbox allocator and its registry.
#[derive(Clone)]
pub struct OwnedRoots {
    dir: PathBuf,
    store: Store,
    registry: Tree,
}

impl std::fmt::Debug for OwnedRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRoots")
            .field("dir", &self.dir)
            .finish()
    }
}

impl OwnedRoots {
    /// Uses `<state_dir>/sandboxes` (created 0700 if missing). `state_dir` must be an existing
    /// absolute directory outside the temp trees; neither it nor `sandboxes` may be a symlink.
    pub fn open(state_dir: &Path, store: &Store) -> Result<Self, SandboxError> {
        if !state_dir.is_absolute() {
            return Err(SandboxError::InvalidInput(format!(
                "state directory {} is not absolute",
                state_dir.display()
            )));
        }
        let meta = std::fs::symlink_metadata(state_dir)
            .map_err(|e| SandboxError::io("inspect state directory", state_dir, e))?;
        if !meta.is_dir() {
            return Err(SandboxError::InvalidInput(format!(
                "state directory {} is not a directory (or is a symlink)",
                state_dir.display()
            )));
        }
        let state = std::fs::canonicalize(state_dir)
            .map_err(|e| SandboxError::io("resolve state directory", state_dir, e))?;
        if let Some(t) = temp_tree_of(&state) {
            return Err(SandboxError::InvalidInput(format!(
                "state directory {} is inside {t}; sandboxes never live in a temp tree",
                state.display()
            )));
        }
        let dir = state.join("sandboxes");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create sandboxes directory", &dir, e)),
        }
        let meta = std::fs::symlink_metadata(&dir)
            .map_err(|e| SandboxError::io("inspect sandboxes directory", &dir, e))?;
        if !meta.is_dir() {
            return Err(SandboxError::InvalidInput(format!(
                "{} is not a real directory",
                dir.display()
            )));
        }
        Ok(Self {
            dir,
            store: store.clone(),
            registry: store.tree(REGISTRY_TREE)?,
        })
    }

    /// Where owned sandboxes are created.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates a new sandbox for `conversation_id` and registers it as `principal`'s. Fails if
    /// the conversation already has one (use [`OwnedRoots::get`]). `owner`: the identity the
    /// agent runs as; the directory is chowned to it (the group stays the supervisor's, for the
    /// policy's search).
    pub fn create(
        &self,
        conversation_id: &str,
        principal: &str,
        allow_execute: bool,
        profile: Profile,
        owner: Option<crate::AgentIdentity>,
    ) -> Result<Boundary, SandboxError> {
        if self.registry.get(conversation_id.as_bytes())?.is_some() {
            return Err(SandboxError::InvalidInput(
                "conversation already has a sandbox".into(),
            ));
        }
        let template = self
            .dir
            .join(format!("{}-XXXXXX", sanitize_label(conversation_id)));
        let dir = mkdtemp(&template)?;
        // mkdtemp makes 0700. Group search (not listing) lets the policy daemon, a member of the
        // supervisor's group in deploy/, resolve paths inside the root; without it every edit
        // with locations would be judged unresolvable (denied).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o710))
            .map_err(|e| SandboxError::io("set sandbox mode", &dir, e))?;
        // The agent runs as its own uid and must write its root; the supervisor (root) and the
        // policy (group search) keep their access.
        if let Some(o) = owner {
            std::os::unix::fs::chown(&dir, Some(o.uid), None)
                .map_err(|e| SandboxError::io("chown sandbox to the agent", &dir, e))?;
        }
        let meta = std::fs::symlink_metadata(&dir)
            .map_err(|e| SandboxError::io("inspect new sandbox", &dir, e))?;
        let rec = RootRecord {
            dir: dir.clone(),
            dev: meta.dev(),
            ino: meta.ino(),
            btime_ns: birth_ns(&meta),
            allow_execute,
            profile,
            principal: Some(principal.to_string()),
            owner: owner.map(|o| (o.uid, o.gid)),
        };
        let bytes = serde_json::to_vec(&rec).map_err(|e| SandboxError::Lease(e.to_string()))?;
        self.registry.put(conversation_id.as_bytes(), bytes)?;
        self.store.flush()?;
        tracing::info!(context_id = %conversation_id, dir = %dir.display(), "created owned sandbox");
        Ok(Boundary {
            root: dir,
            owned: true,
            allow_execute,
            profile,
        })
    }

    /// The registered sandbox of `conversation_id`, after checking that the directory is still
    /// the one that was created (same device and inode, not a symlink).
    pub fn get(&self, conversation_id: &str) -> Result<Option<Boundary>, SandboxError> {
        let Some(bytes) = self.registry.get(conversation_id.as_bytes())? else {
            return Ok(None);
        };
        let rec: RootRecord =
            serde_json::from_slice(&bytes).map_err(|e| SandboxError::Lease(e.to_string()))?;
        self.verify(&rec)?;
        Ok(Some(Boundary {
            root: rec.dir,
            owned: true,
            allow_execute: rec.allow_execute,
            profile: rec.profile,
        }))
    }

    /// Who the sandbox registered for `conversation_id` belongs to (None: there is none). Read
    /// from the record alone: an owner survives restarts with its root.
    pub fn owner(&self, conversation_id: &str) -> Result<Option<RootOwner>, SandboxError> {
        let Some(bytes) = self.registry.get(conversation_id.as_bytes())? else {
            return Ok(None);
        };
        let rec: RootRecord =
            serde_json::from_slice(&bytes).map_err(|e| SandboxError::Lease(e.to_string()))?;
        Ok(Some(match rec.principal {
            Some(p) => RootOwner::Principal(p),
            None => RootOwner::Unrecorded,
        }))
    }

    fn verify(&self, rec: &RootRecord) -> Result<(), SandboxError> {
        let bad = || {
            SandboxError::InvalidInput(format!(
                "registered sandbox {} is no longer the directory that was created",
                rec.dir.display()
            ))
        };
        if rec.dir.parent() != Some(self.dir.as_path()) {
            return Err(bad());
        }
        let meta = std::fs::symlink_metadata(&rec.dir).map_err(|_| bad())?;
        if !meta.is_dir()
            || meta.dev() != rec.dev
            || meta.ino() != rec.ino
            || birth_ns(&meta) != rec.btime_ns
        {
            return Err(bad());
        }
        Ok(())
    }

    /// Hands the sandbox registered for `from` (a warm agent's, see the supervisor's pool) to
    /// `to`, owned by `principal` from then on, in one atomic write of the registry, flushed
    /// like [`OwnedRoots::create`]: the directory does not move (an agent bound to it keeps its
    /// path), only the record that names its conversation and owner. Refused when `to` already
    /// has a sandbox or `from` has none, or when the directory is no longer the one that was
    /// created.
    pub fn rename(&self, from: &str, to: &str, principal: &str) -> Result<Boundary, SandboxError> {
        if self.registry.get(to.as_bytes())?.is_some() {
            return Err(SandboxError::InvalidInput(
                "conversation already has a sandbox".into(),
            ));
        }
        let Some(bytes) = self.registry.get(from.as_bytes())? else {
            return Err(SandboxError::InvalidInput(format!(
                "no sandbox is registered for {from:?}"
            )));
        };
        let mut rec: RootRecord =
            serde_json::from_slice(&bytes).map_err(|e| SandboxError::Lease(e.to_string()))?;
        self.verify(&rec)?;
        rec.principal = Some(principal.to_string());
        let bytes = serde_json::to_vec(&rec).map_err(|e| SandboxError::Lease(e.to_string()))?;
        let mut batch = warden_store::Batch::default();
        batch.delete(from.as_bytes());
        batch.put(to.as_bytes(), &bytes);
        self.registry.apply(batch)?;
        self.store.flush()?;
        tracing::info!(from = %from, context_id = %to, dir = %rec.dir.display(), "sandbox handed to its conversation");
        Ok(Boundary {
            root: rec.dir,
            owned: true,
            allow_execute: rec.allow_execute,
            profile: rec.profile,
        })
    }

    /// The ids with a registered sandbox that start with `prefix` (a namespace callers cannot
    /// use, such as the supervisor's warm agents').
    pub fn ids_with_prefix(&self, prefix: &str) -> Result<Vec<String>, SandboxError> {
        Ok(self
            .registry
            .scan_prefix(prefix.as_bytes())?
            .into_iter()
            .filter_map(|(k, _)| String::from_utf8(k).ok())
            .collect())
    }

    /// Deletes the conversation's sandbox directory and its registry entry. What is in it is
    /// removed with the rights of the agent that owns it (see [`remove_as_owner`]); the emptied
    /// directory with the supervisor's own, from its directory of sandboxes.
    pub fn remove(&self, conversation_id: &str) -> Result<(), SandboxError> {
        let Some(bytes) = self.registry.get(conversation_id.as_bytes())? else {
            return Ok(());
        };
        if let Ok(rec) = serde_json::from_slice::<RootRecord>(&bytes)
            && self.verify(&rec).is_ok()
        {
            remove_as_owner(&rec.dir, rec.owner, "remove sandbox")?;
        }
        self.registry.delete(conversation_id.as_bytes())?;
        self.store.flush()?;
        Ok(())
    }
}

/// Removes `dir` (a root or an agent home the supervisor made in a directory of its own) with
/// the rights of the agent that owns it: the directory's owner, when that is not this process
/// (with the recorded gid when the record names that uid, else the directory's own gid; the
/// groups list is empty either way). Links are removed as links, never followed, and what the
/// agent could not delete stays, with an error saying so
/// (`warden_containment::beneath::remove_tree`).
pub(crate) fn remove_as_owner(
    dir: &Path,
    recorded: Option<(u32, u32)>,
    what: &'static str,
) -> Result<(), SandboxError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SandboxError::io(what, dir, e)),
    };
    let rights = (meta.uid() != nix::unistd::geteuid().as_raw()).then(|| {
        let gid = match recorded {
            Some((uid, gid)) if uid == meta.uid() => gid,
            _ => meta.gid(),
        };
        Rights {
            uid: meta.uid(),
            gid,
        }
    });
    warden_containment::beneath::remove_tree(dir, rights).map_err(|e| {
        SandboxError::InvalidInput(format!(
            "{what} {}{}: {e}",
            dir.display(),
            match rights {
                Some(r) => format!(" (as its agent, uid {})", r.uid),
                None => String::new(),
            }
        ))
    })
}

fn birth_ns(meta: &std::fs::Metadata) -> Option<u128> {
    meta.created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
}

fn mkdtemp(template: &Path) -> Result<PathBuf, SandboxError> {
    // Creates the directory with mode 0700 under a fresh name, failing if it exists.
    nix::unistd::mkdtemp(template)
        .map_err(|e| SandboxError::io("mkdtemp", template, std::io::Error::from(e)))
}

/// The homes and agent configuration homes a workspace may not be. The rule itself is
/// `warden_containment::RootCheck`, the same one the policy floor applies to every boundary
/// (`floor.boundary.invalid`), so a workspace the supervisor accepts is one the policy trusts.
#[derive(Debug, Clone, Default)]
pub struct WorkspacePolicy {
    homes: AgentHomes,
}

impl WorkspacePolicy {
    /// Homes: `$HOME`, `/root`, and every home directory in `/etc/passwd`. Config homes:
    /// `~/.claude` and `~/.codex` under each of those, `$CLAUDE_CONFIG_DIR`, `$CODEX_HOME`
    /// (see `AgentHomes::from_host`).
    pub fn from_host() -> Self {
        Self {
            homes: AgentHomes::from_host(),
        }
    }

    pub fn new(homes: Vec<PathBuf>, config_homes: Vec<PathBuf>) -> Self {
        Self {
            homes: AgentHomes::new(homes, config_homes),
        }
    }

    /// The homes this policy refuses, for a daemon that hands the same list on.
    pub fn homes(&self) -> &AgentHomes {
        &self.homes
    }

    /// Validates an operator workspace and returns its boundary (`owned = false`).
    pub fn validate(
        &self,
        path: &Path,
        allow_execute: bool,
        profile: Profile,
    ) -> Result<Boundary, SandboxError> {
        // Homes are resolved at each validation: workspaces are validated when a conversation
        // opens, rarely enough that a home created since start is still seen by spelling.
        let root = RootCheck::new(&self.homes, &RealFs)
            .check(path, &RealFs)
            .map_err(|r| SandboxError::WorkspaceRefused {
                path: path.to_path_buf(),
                reason: r.to_string(),
            })?;
        Ok(Boundary {
            root,
            owned: false,
            allow_execute,
            profile,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_plain_and_bounded() {
        assert_eq!(sanitize_label(".."), "conv");
        assert_eq!(sanitize_label("../../etc"), "______etc");
        assert_eq!(sanitize_label("a/b"), "a_b");
        assert_eq!(sanitize_label("-rf"), "_rf");
        assert_eq!(sanitize_label(""), "conv");
        assert_eq!(sanitize_label("\0\n\x1b"), "conv");
        assert_eq!(sanitize_label(&"x".repeat(5000)).len(), LABEL_MAX);
        assert_eq!(sanitize_label("ctx-42_ok"), "ctx-42_ok");
        assert_eq!(sanitize_label("é"), "conv");
    }
}
