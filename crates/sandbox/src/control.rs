//! Agent-control paths: the files through which an agent (or a shell it runs) could change its
//! own rules or hooks. Under bubblewrap each is bound read-only, so a shell cannot do what the
//! tool call may not (the policy's floor denies the tool call).
//!
//! The root and the agent home are writable by the agent, so an earlier run may have planted a
//! symlink at one of these names, pointing at a file the agent could otherwise not reach. Every
//! entry is inspected and created relative to a directory fd, never following a symlink
//! (`fstatat(AT_SYMLINK_NOFOLLOW)`, `mkdirat`, `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`), and a
//! symlink at any of them refuses the spawn: replacing it would delete something of the agent's,
//! binding it would bind whatever it points to.
//!
//! A read-only bind of a file does not stop a rename of the directory holding it (the mount
//! moves along, and a fresh directory with a fresh file takes the old name), so the directories
//! holding bound entries (`~/.claude`, `~/.codex`, `~/.gemini`, `~/.qwen`, `~/.config`, `~/.cache`) are
//! bound onto themselves read-write first: a mount point cannot be renamed or removed (EBUSY).
//!
//! git directories in the root are laid out by allowlist in git.rs, not here.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, fchownat};

use crate::SandboxError;
use crate::identity::AgentIdentity;

/// One bind over the root or home, in the order bubblewrap must apply them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlBind {
    pub path: PathBuf,
    /// `true`: bound onto itself read-write, only to pin it (a directory holding read-only
    /// entries); `false`: bound read-only.
    pub pin_only: bool,
}

impl ControlBind {
    fn ro(path: PathBuf) -> Self {
        ControlBind {
            path,
            pin_only: false,
        }
    }
    fn pin(path: PathBuf) -> Self {
        ControlBind {
            path,
            pin_only: true,
        }
    }
}

/// What an absent control path is created as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    Dir,
    /// A directory holding this entry (name, kind), created in it where absent: OpenCode
    /// writes a `.gitignore` into each of its configuration directories as it starts, unless
    /// one is there, and makes `bin` in its cache, and dies when it cannot
    /// (`Config.ensureGitignore`, `opencode-ai` 1.18).
    DirWith(&'static str, &'static ControlKind),
    /// A file with this content (`{}` for JSON: an empty file is not valid JSON, and an adapter
    /// that fails to parse it may fall back to defaults or refuse to start).
    File(&'static str),
}

/// Control paths in a conversation's root, bound read-only. Directories are bound whole: the
/// agent has no business writing project settings, rules or MCP servers.
pub const ROOT_CONTROL: &[(&str, ControlKind)] = &[
    (".claude", ControlKind::Dir),
    (".codex", ControlKind::Dir),
    (".gemini", ControlKind::Dir),
    (".qwen", ControlKind::Dir),
    (".opencode", ControlKind::Dir),
    (".mcp.json", ControlKind::File("{}\n")),
    // OpenCode's project configuration (its permissions, MCP servers and plugins).
    ("opencode.json", ControlKind::File("{}\n")),
    ("opencode.jsonc", ControlKind::File("{}\n")),
];

/// The adapters' configuration files in the agent home, bound read-only; the directories that
/// hold them stay the agent's (Claude keeps sessions and caches in `~/.claude`).
pub const HOME_CONTROL: &[(&str, &str, ControlKind)] = &[
    (".claude", "settings.json", ControlKind::File("{}\n")),
    (".claude", "settings.local.json", ControlKind::File("{}\n")),
    (".codex", "config.toml", ControlKind::File("")),
    (".codex", "rules", ControlKind::Dir),
    (
        ".gemini",
        "settings.json",
        ControlKind::File(GEMINI_SETTINGS_JSON),
    ),
    (".gemini", "trustedFolders.json", ControlKind::File("{}\n")),
    (".gemini", "policies", ControlKind::Dir),
    (".gemini", "extensions", ControlKind::Dir),
    // Qwen Code: its user settings (warden's layer is its system settings file, which outranks
    // them: `warden_sandbox::QWEN_SYSTEM_SETTINGS_JSON`), the `.env` it reads before anything
    // else (it may move `QWEN_HOME`, the trusted-folders file and the MCP approvals), trusted
    // folders, extensions.
    (".qwen", "settings.json", ControlKind::File("{}\n")),
    (".qwen", ".env", ControlKind::File("")),
    (".qwen", "trustedFolders.json", ControlKind::File("{}\n")),
    (".qwen", "extensions", ControlKind::Dir),
    // Its subagents (each may name its own approval mode and tools).
    (".qwen", "agents", ControlKind::Dir),
    // Gemini CLI's home `.env` (read for a trusted folder) and its subagents.
    (".gemini", ".env", ControlKind::File("")),
    (".gemini", "agents", ControlKind::Dir),
    // Codex's `$CODEX_HOME/.env` (loaded into its own environment before anything else, so
    // every process it starts inherits it) and its agent roles (each a configuration layer).
    (".codex", ".env", ControlKind::File("")),
    (".codex", "agents", ControlKind::Dir),
    // Claude Code's subagents (each may name a permission mode), skills (`allowed-tools`
    // pre-approves tools while one runs) and commands (the same).
    (".claude", "agents", ControlKind::Dir),
    (".claude", "skills", ControlKind::Dir),
    (".claude", "commands", ControlKind::Dir),
    // git's global configuration (`core.fsmonitor`, `core.hooksPath`, aliases, `core.pager`
    // run programs): read by the `git` an adapter runs on its own, unasked.
    (".config", "git", ControlKind::Dir),
    // Where Node.js and Bun look for a module a file under `~/.config` imports and its own
    // `node_modules` lacks (OpenCode's configuration directory is there).
    (".config", "node_modules", ControlKind::Dir),
    // OpenCode: its whole global configuration directory (settings, agents, commands, plugins
    // it runs in-process); warden's layer is its managed `/etc/opencode/opencode.json`.
    (
        ".config",
        "opencode",
        ControlKind::DirWith(".gitignore", &ControlKind::File(OPENCODE_GITIGNORE)),
    ),
    // OpenCode's cache, where it looks for the `rg` its search tools run (unasked, and outside
    // the shell its commands are held in) when there is none on `PATH`.
    (
        ".cache",
        "opencode",
        ControlKind::DirWith("bin", &ControlKind::Dir),
    ),
];

/// Control entries directly in the agent home, bound read-only (the home itself is the
/// sandbox's mount point and these are mount points in it, so they cannot be renamed or
/// removed: EBUSY). What each is and who reads it is the table in the supervisor's README
/// ("What an agent reads at start").
pub const HOME_ENTRIES: &[(&str, ControlKind)] = &[
    // OpenCode reads `~/.opencode` like a project's `.opencode/` (configuration, agents,
    // commands, plugins), and installs its plugin SDK into it from the network at start when
    // it may write there.
    (
        ".opencode",
        ControlKind::DirWith(".gitignore", &ControlKind::File(OPENCODE_GITIGNORE)),
    ),
    // The home's `.env`: Qwen Code loads every key of it into its own environment where unset
    // (`QWEN_CODE_SYSTEM_SETTINGS_PATH` moves its highest settings layer), Gemini CLI its
    // authentication keys.
    (".env", ControlKind::File("")),
    // git's global configuration (see `.config/git` above).
    (".gitconfig", ControlKind::File("")),
    // The shell's start files: Codex runs a login shell as a session starts (to snapshot its
    // environment), Claude Code's commands run in one; a line planted here would run there
    // unasked, or inside a command that was decided as something else.
    (".profile", ControlKind::File("")),
    (".bash_profile", ControlKind::File("")),
    (".bash_login", ControlKind::File("")),
    (".bashrc", ControlKind::File("")),
    (".bash_logout", ControlKind::File("")),
    // Node.js's global module folders and the home's own `node_modules`: where a module an
    // adapter imports unsuccessfully from its package is looked for last.
    (".node_modules", ControlKind::Dir),
    (".node_libraries", ControlKind::Dir),
    ("node_modules", ControlKind::Dir),
];

/// What OpenCode itself writes into a configuration directory's `.gitignore`.
pub const OPENCODE_GITIGNORE: &str =
    "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore\n";

/// Gemini CLI's user settings (`~/.gemini/settings.json`), written by warden when the home
/// template has none and bound read-only: warden's layer for Gemini. Why here and not in its
/// system settings file (`/etc/gemini-cli/settings.json`, above the workspace's): Gemini CLI
/// reads that file only when it and every directory above it are owned by uid 0 and not
/// writable by group or others, and inside the sandbox's user namespace nothing is owned by
/// uid 0 (the host's root shows as the overflow uid), so it would be skipped. The workspace
/// layer, which outranks the user's, is read only for a trusted folder: folder trust is on here
/// and `~/.gemini/trustedFolders.json` is a read-only `{}`, so the root is never trusted and
/// `<root>/.gemini/settings.json` is ignored (Gemini's "safe mode": no workspace settings, no
/// MCP servers, no tool auto-acceptance; `docs/cli/trusted-folders.md` of the package).
///
/// Keys from `docs/reference/configuration.md` of `@google/gemini-cli` 0.61: the `default`
/// approval mode (edits and commands ask), no YOLO mode even by a flag, no "always allow"
/// options and no permanent approvals (which write allow rules to `~/.gemini/policies/`, also
/// read-only), hooks off, no extensions from git, no checkpointing (a git repository of its
/// own in the home), and no usage statistics, telemetry or update checks (each a connection
/// the egress proxy would refuse).
pub const GEMINI_SETTINGS_JSON: &str = r#"{
  "general": {
    "defaultApprovalMode": "default",
    "enableAutoUpdate": false,
    "enableAutoUpdateNotification": false,
    "checkpointing": { "enabled": false }
  },
  "security": {
    "folderTrust": { "enabled": true },
    "disableYoloMode": true,
    "disableAlwaysAllow": true,
    "enablePermanentToolApproval": false,
    "autoAddToPolicyByDefault": false,
    "blockGitExtensions": true
  },
  "hooksConfig": { "enabled": false },
  "privacy": { "usageStatisticsEnabled": false },
  "telemetry": { "enabled": false }
}
"#;

fn refuse_symlink(path: &Path) -> SandboxError {
    SandboxError::InvalidInput(format!(
        "{} is a symbolic link: an agent-control path must be a real file or directory; \
         refusing to start (remove the link)",
        path.display()
    ))
}

fn os(what: &'static str, path: &Path, e: Errno) -> SandboxError {
    SandboxError::io(what, path, std::io::Error::from(e))
}

fn open_dir(path: &Path) -> Result<OwnedFd, SandboxError> {
    nix::fcntl::open(
        path,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(|e| os("open directory", path, e))
}

/// What is at `name` below `dir` without following a symlink.
enum Found {
    Absent,
    Symlink,
    Dir,
    Other,
}

fn look(dir: &OwnedFd, name: &str, shown: &Path) -> Result<Found, SandboxError> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => {
            let t = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            Ok(if t == SFlag::S_IFLNK {
                Found::Symlink
            } else if t == SFlag::S_IFDIR {
                Found::Dir
            } else {
                Found::Other
            })
        }
        Err(Errno::ENOENT) => Ok(Found::Absent),
        Err(e) => Err(os("inspect", shown, e)),
    }
}

/// Makes sure `name` exists below `dir` as a real entry (creating it as `kind` when absent,
/// owned by the caller, mode 0755/0644) and returns its path for a read-only bind. None: it is
/// absent and the caller may not create it (`EACCES`, `EROFS`). The caller runs with the
/// agent's rights (spawn.rs), so then the agent cannot create it either — an operator workspace
/// the agent may not write — and there is nothing to bind.
fn ensure(
    dir: &OwnedFd,
    base: &Path,
    name: &str,
    kind: ControlKind,
) -> Result<Option<PathBuf>, SandboxError> {
    let path = base.join(name);
    match look(dir, name, &path)? {
        Found::Symlink => return Err(refuse_symlink(&path)),
        Found::Dir => return fill(dir, &path, name, kind).map(|()| Some(path)),
        Found::Other => return Ok(Some(path)),
        Found::Absent => {}
    }
    match kind {
        ControlKind::Dir | ControlKind::DirWith(..) => {
            match mkdirat(dir, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(Errno::EACCES | Errno::EROFS) => return Ok(None),
                Err(e) => return Err(os("create", &path, e)),
            }
        }
        ControlKind::File(content) => {
            match openat(
                dir,
                name,
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_WRONLY
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            ) {
                Ok(fd) => std::fs::File::from(fd)
                    .write_all(content.as_bytes())
                    .map_err(|e| SandboxError::io("write", &path, e))?,
                Err(Errno::EEXIST) => {}
                Err(Errno::EACCES | Errno::EROFS) => return Ok(None),
                Err(e) => return Err(os("create", &path, e)),
            }
        }
    }
    // Lost a race with the agent (EEXIST above): whatever is there now must not be a link.
    match look(dir, name, &path)? {
        Found::Symlink => Err(refuse_symlink(&path)),
        Found::Absent => Err(SandboxError::InvalidInput(format!(
            "{} vanished while it was being created",
            path.display()
        ))),
        Found::Dir => fill(dir, &path, name, kind).map(|()| Some(path)),
        Found::Other => Ok(Some(path)),
    }
}

/// Creates the entry a `DirWith` directory holds, where absent (opened without following a
/// link: the directory may be the agent's).
fn fill(dir: &OwnedFd, path: &Path, name: &str, kind: ControlKind) -> Result<(), SandboxError> {
    let ControlKind::DirWith(entry, entry_kind) = kind else {
        return Ok(());
    };
    let inner = openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(|e| os("open", path, e))?;
    ensure(&inner, path, entry, *entry_kind).map(|_| ())
}

/// The root's control paths, created where absent, in bind order.
pub fn prepare_root(root: &Path) -> Result<Vec<ControlBind>, SandboxError> {
    let dir = open_dir(root)?;
    let mut out = Vec::new();
    for (name, kind) in ROOT_CONTROL {
        if let Some(p) = ensure(&dir, root, name, *kind)? {
            out.push(ControlBind::ro(p));
        }
    }
    Ok(out)
}

/// The home's adapter configuration files, created where absent. Their parent directories are
/// created for (and owned by) the agent; the files themselves stay the supervisor's, so even
/// without bubblewrap the agent cannot rewrite them in place.
pub fn prepare_home(
    home: &Path,
    owner: Option<AgentIdentity>,
) -> Result<Vec<ControlBind>, SandboxError> {
    let dir = open_dir(home)?;
    let mut out: Vec<ControlBind> = Vec::new();
    for (parent, name, kind) in HOME_CONTROL {
        let ppath = home.join(parent);
        match look(&dir, parent, &ppath)? {
            Found::Symlink => return Err(refuse_symlink(&ppath)),
            Found::Other => {
                return Err(SandboxError::InvalidInput(format!(
                    "{} is not a directory",
                    ppath.display()
                )));
            }
            Found::Dir => {}
            Found::Absent => {
                match mkdirat(&dir, *parent, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(os("create", &ppath, e)),
                }
                if let Some(o) = owner {
                    fchownat(
                        &dir,
                        *parent,
                        Some(Uid::from_raw(o.uid)),
                        Some(Gid::from_raw(o.gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| os("chown", &ppath, e))?;
                }
            }
        }
        let pdir = openat(
            &dir,
            *parent,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(|e| os("open", &ppath, e))?;
        if !out.iter().any(|b| b.path == ppath) {
            out.push(ControlBind::pin(ppath.clone()));
        }
        if let Some(p) = ensure(&pdir, &ppath, name, *kind)? {
            out.push(ControlBind::ro(p));
        }
    }
    for (name, kind) in HOME_ENTRIES {
        if let Some(p) = ensure(&dir, home, name, *kind)? {
            out.push(ControlBind::ro(p));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_the_agents_rights_nothing_is_made_where_the_agent_may_not_write() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: the agent's rights need root to take");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        // An operator workspace the agent may read but not write: it cannot create `.claude`
        // there, so neither does the supervisor on its behalf, and there is nothing to bind.
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let agent = warden_containment::rights::Rights {
            uid: 61_322,
            gid: 61_322,
        };
        let binds = warden_containment::rights::with_rights(Some(agent), || prepare_root(t.path()))
            .unwrap()
            .unwrap();
        assert!(binds.is_empty(), "{binds:?}");
        assert!(!t.path().join(".claude").exists());
        // One it may write: made, and the agent's.
        nix::unistd::chown(t.path(), Some(Uid::from_raw(agent.uid)), None).unwrap();
        let binds = warden_containment::rights::with_rights(Some(agent), || prepare_root(t.path()))
            .unwrap()
            .unwrap();
        assert_eq!(binds.len(), ROOT_CONTROL.len());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(t.path().join(".claude")).unwrap().uid(),
            agent.uid
        );
    }

    #[test]
    fn absent_control_paths_are_created_and_present_ones_kept() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir(root.join(".claude")).unwrap();
        std::fs::write(root.join(".claude/settings.json"), "{\"x\":1}").unwrap();
        let binds = prepare_root(root).unwrap();
        assert_eq!(binds.len(), ROOT_CONTROL.len());
        assert!(binds.iter().all(|b| !b.pin_only));
        assert!(root.join(".codex").is_dir() && root.join(".gemini").is_dir());
        assert_eq!(
            std::fs::read_to_string(root.join(".mcp.json")).unwrap(),
            "{}\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
            "{\"x\":1}"
        );
        assert!(!root.join(".git").exists(), "no repository is invented");
    }

    #[test]
    fn a_planted_symlink_refuses_the_spawn_and_is_not_followed() {
        for planted in [".claude", ".mcp.json"] {
            let t = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink(outside.path(), t.path().join(planted)).unwrap();
            let e = prepare_root(t.path()).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{planted}: {e}");
            assert_eq!(
                std::fs::read_dir(outside.path()).unwrap().count(),
                0,
                "{planted}: nothing created through the link"
            );
        }
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join(".claude")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("s.json"),
            t.path().join(".claude/settings.json"),
        )
        .unwrap();
        assert!(prepare_home(t.path(), None).is_err());
        assert!(!outside.path().join("s.json").exists());
    }

    #[test]
    fn home_config_files_are_created_in_agent_owned_directories() {
        let t = tempfile::tempdir().unwrap();
        let binds = prepare_home(t.path(), None).unwrap();
        // Six pinned directories, then the read-only entries inside them.
        assert_eq!(binds.iter().filter(|b| b.pin_only).count(), 6);
        assert_eq!(
            binds.iter().filter(|b| !b.pin_only).count(),
            HOME_CONTROL.len() + HOME_ENTRIES.len()
        );
        let pin = binds
            .iter()
            .position(|b| b.path == t.path().join(".claude"))
            .unwrap();
        let file = binds
            .iter()
            .position(|b| b.path == t.path().join(".claude/settings.json"))
            .unwrap();
        assert!(binds[pin].pin_only && pin < file);
        assert_eq!(
            std::fs::read_to_string(t.path().join(".claude/settings.json")).unwrap(),
            "{}\n"
        );
        assert!(t.path().join(".codex/rules").is_dir());
        assert!(t.path().join(".codex/config.toml").is_file());
        // Gemini CLI's user layer is warden's: its settings, no trusted folder, no policies.
        let g: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(t.path().join(".gemini/settings.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(g["security"]["folderTrust"]["enabled"], true);
        assert_eq!(g["security"]["disableYoloMode"], true);
        assert_eq!(g["security"]["disableAlwaysAllow"], true);
        assert_eq!(g["hooksConfig"]["enabled"], false);
        assert_eq!(g["privacy"]["usageStatisticsEnabled"], false);
        assert_eq!(g["general"]["enableAutoUpdate"], false);
        assert_eq!(
            std::fs::read_to_string(t.path().join(".gemini/trustedFolders.json")).unwrap(),
            "{}\n"
        );
        assert!(t.path().join(".gemini/policies").is_dir());
        // A template's own settings are kept (the operator's), never replaced.
        let t2 = tempfile::tempdir().unwrap();
        std::fs::create_dir(t2.path().join(".gemini")).unwrap();
        std::fs::write(t2.path().join(".gemini/settings.json"), "{\"mine\":1}").unwrap();
        prepare_home(t2.path(), None).unwrap();
        assert_eq!(
            std::fs::read_to_string(t2.path().join(".gemini/settings.json")).unwrap(),
            "{\"mine\":1}"
        );
    }

    #[test]
    fn opencodes_configuration_directories_hold_a_gitignore_and_are_bound_whole() {
        // Absent: made, with the `.gitignore` OpenCode would otherwise write as it starts.
        let t = tempfile::tempdir().unwrap();
        let binds = prepare_home(t.path(), None).unwrap();
        for dir in [".config/opencode", ".opencode"] {
            let d = t.path().join(dir);
            assert!(binds.iter().any(|b| b.path == d && !b.pin_only), "{dir}");
            assert_eq!(
                std::fs::read_to_string(d.join(".gitignore")).unwrap(),
                OPENCODE_GITIGNORE
            );
        }
        assert!(
            binds
                .iter()
                .any(|b| b.path == t.path().join(".config") && b.pin_only)
        );
        // A template's directory without one gets one; its own files, and its own
        // `.gitignore`, are kept.
        let t2 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t2.path().join(".config/opencode")).unwrap();
        std::fs::write(t2.path().join(".config/opencode/opencode.json"), "{}").unwrap();
        std::fs::create_dir(t2.path().join(".opencode")).unwrap();
        std::fs::write(t2.path().join(".opencode/.gitignore"), "mine\n").unwrap();
        prepare_home(t2.path(), None).unwrap();
        assert!(t2.path().join(".config/opencode/.gitignore").is_file());
        assert_eq!(
            std::fs::read_to_string(t2.path().join(".config/opencode/opencode.json")).unwrap(),
            "{}"
        );
        assert_eq!(
            std::fs::read_to_string(t2.path().join(".opencode/.gitignore")).unwrap(),
            "mine\n"
        );
        // A link planted as the `.gitignore` is refused, never written through.
        let t3 = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(t3.path().join(".opencode")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("x"),
            t3.path().join(".opencode/.gitignore"),
        )
        .unwrap();
        let e = prepare_home(t3.path(), None).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!outside.path().join("x").exists());
    }
}
