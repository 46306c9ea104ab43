//! The `/etc` an agent sees under bubblewrap: a short list of harmless host files (name
//! resolution, TLS roots, the dynamic loader, time zone), generated `passwd`/`group` holding only
//! the agent's own line (plus root and nobody, which tools expect to exist), and the adapters'
//! admin-level policy written by warden. Never `shadow`, `gshadow`, `sudoers*` or `ssh/`.

use std::path::{Path, PathBuf};

use crate::identity::{AGENT_NAME, AgentIdentity};

/// Host `/etc` entries bound read-only where present. Symlinks are resolved on the host and the
/// target is bound at the entry's name (`resolv.conf` → `../run/...` would otherwise dangle,
/// `/run` is not in the sandbox).
pub const ETC_ENTRIES: &[&str] = &[
    // Name resolution (glibc, musl, Node's c-ares through getaddrinfo).
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",
    // TLS trust roots (Debian/Ubuntu, Fedora/RHEL) for the model API.
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    // Debian's /usr/bin/* → /etc/alternatives/* → /usr/... links (node, editor, awk).
    "alternatives",
    // The dynamic loader's cache and search path.
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
];

/// Names that are never bound, whatever an entry above resolves to.
pub const ETC_FORBIDDEN: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "passwd",
    "passwd-",
    "group",
    "group-",
    "security",
    "machine-id",
];

/// Where warden writes Claude Code's managed settings inside the sandbox.
pub const CLAUDE_MANAGED_SETTINGS: &str = "/etc/claude-code/managed-settings.json";
/// Where warden writes Codex's admin requirements inside the sandbox.
pub const CODEX_REQUIREMENTS: &str = "/etc/codex/requirements.toml";

/// Claude Code's managed layer (outranks user, project and local settings):
/// no `bypassPermissions` mode, permission rules only from this file (so a model-written
/// `permissions.allow` in `~/.claude/settings.json` or `<root>/.claude/settings.local.json` is
/// ignored), hooks only from this file (and none here), every call starts in `default` (asks).
/// The key layout follows Anthropic's own strict example (`disableBypassPermissionsMode` inside
/// `permissions`); nothing else is added, so that a key a pinned version does not know cannot
/// put the whole managed file in doubt.
pub const CLAUDE_MANAGED_SETTINGS_JSON: &str = r#"{
  "permissions": {
    "defaultMode": "default",
    "disableBypassPermissionsMode": "disable"
  },
  "allowManagedPermissionRulesOnly": true,
  "allowManagedHooksOnly": true,
  "disableAllHooks": true
}
"#;

/// Codex's admin requirements: approval policies that ask (`untrusted`, `on-request`; never
/// `never`), sandbox modes without `danger-full-access`, and hooks only from the managed layer
/// (none: `$CODEX_HOME/hooks.json` and a `[hooks]` table of any other layer run nothing). A
/// conflicting user value falls back to an allowed one.
pub const CODEX_REQUIREMENTS_TOML: &str = r#"# Written by warden for this conversation; read-only inside the sandbox.
allowed_approval_policies = ["untrusted", "on-request"]
allowed_sandbox_modes = ["read-only", "workspace-write"]
allow_managed_hooks_only = true
"#;

/// Where warden writes Claude Code's managed MCP servers inside the sandbox.
pub const CLAUDE_MANAGED_MCP: &str = "/etc/claude-code/managed-mcp.json";

/// Claude Code's managed MCP servers: none. Present, the file takes exclusive control of MCP
/// servers (Claude Code's "managed MCP configuration"), so the servers of `~/.claude.json`
/// (a file Claude Code itself rewrites as it runs, so it cannot be read-only), of a plugin
/// and of the root's `.mcp.json` are never started. Written for the adapters that start with
/// it (`AdapterPolicy::claude_managed_mcp`).
pub const CLAUDE_MANAGED_MCP_JSON: &str = "{\n  \"mcpServers\": {}\n}\n";

/// Where warden writes Qwen Code's system settings: its highest layer, merged over the user's
/// and the (trusted) workspace's settings; `QWEN_CODE_SYSTEM_SETTINGS_PATH`, which moves it, is
/// in no agent's environment allowlist.
pub const QWEN_SYSTEM_SETTINGS: &str = "/etc/qwen-code/settings.json";

/// Qwen Code's system settings (keys from the settings schema of `@qwen-code/qwen-code` 0.24):
/// the `default` approval mode (edits and commands ask; its own default is `auto`, where a model
/// classifier approves), nothing auto-accepted, folder trust on (the root's own settings, `.env`
/// and MCP servers count only in a trusted folder, and `~/.qwen/trustedFolders.json` is a
/// read-only `{}`), hooks off, no usage statistics, telemetry or update checks.
pub const QWEN_SYSTEM_SETTINGS_JSON: &str = r#"{
  "tools": { "approvalMode": "default", "autoAccept": false },
  "security": { "folderTrust": { "enabled": true } },
  "disableAllHooks": true,
  "general": { "enableAutoUpdate": false },
  "privacy": { "usageStatisticsEnabled": false },
  "telemetry": { "enabled": false }
}
"#;

/// Where warden writes OpenCode's managed configuration: its managed config directory on Linux
/// (`/etc/opencode`), merged after every other layer (remote, global, `OPENCODE_CONFIG`,
/// project, `.opencode` directories, `OPENCODE_CONFIG_CONTENT`, the console's), so its keys win
/// (`Config.loadInstanceState` of `opencode-ai` 1.18; "Precedence order" in OpenCode's config
/// documentation, `docs/config`: managed config files, admin-controlled, come last).
pub const OPENCODE_MANAGED_CONFIG: &str = "/etc/opencode/opencode.json";

/// OpenCode's managed configuration (keys from OpenCode's config schema, `opencode-ai` 1.18).
/// Every edit, command, fetch, search, path outside the project and repeated call asks, and
/// no subagent starts (`task` denied: OpenCode's ACP front relays the permission requests of
/// the sessions it opened and drops a subagent's, which then waits for ever, its command never
/// decided and the turn hung; issue 35) (`permission`; a string replaces whatever pattern map a lower layer has, where a map
/// would be merged key by key and a lower layer's `"git *": "allow"` would survive); no
/// formatters (they run commands after an edit without asking) and no language servers
/// (downloaded and started unasked); no snapshots (a git repository of OpenCode's in the
/// agent's data directory, which it runs `git` in after each step, outside any tool call: a
/// `core.fsmonitor` a command planted in its config would run there unasked); no automatic
/// updates and no session sharing. A model
/// provider for `OPENAI_BASE_URL` is added per agent (`warden_supervisor::adapters`). What a
/// merge cannot take away (plugins and MCP servers of lower layers are added to, never
/// replaced) is kept out by the environment warden sets (`OPENCODE_PURE`,
/// `OPENCODE_DISABLE_PROJECT_CONFIG`, ...) and the read-only configuration directories.
pub const OPENCODE_CONFIG_JSON: &str = r#"{
  "$schema": "https://opencode.ai/config.json",
  "permission": {
    "edit": "ask",
    "bash": "ask",
    "webfetch": "ask",
    "websearch": "ask",
    "codesearch": "ask",
    "task": "deny",
    "external_directory": "ask",
    "doom_loop": "ask"
  },
  "formatter": false,
  "lsp": false,
  "snapshot": false,
  "autoupdate": false,
  "share": "disabled"
}
"#;

/// Where warden writes Codex's managed configuration (it outranks `~/.codex/config.toml`).
pub const CODEX_MANAGED_CONFIG: &str = "/etc/codex/managed_config.toml";

/// The adapters' admin-level files of one agent's sandbox that differ between agents (two Codex
/// versions need different settings: 0.149 and later refuse `approval_policy = "untrusted"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterPolicy {
    /// `/etc/codex/managed_config.toml`; `None` = not written.
    pub codex_config: Option<String>,
    /// `/etc/codex/requirements.toml`; `None` = [`CODEX_REQUIREMENTS_TOML`].
    pub codex_requirements: Option<String>,
    /// `/etc/opencode/opencode.json`; `None` = not written.
    pub opencode_config: Option<String>,
    /// `/etc/claude-code/managed-mcp.json` ([`CLAUDE_MANAGED_MCP_JSON`]); `None` = not written:
    /// an adapter that hands Claude Code its own MCP server at `session/new` (claude-code-acp
    /// 0.16, Claude Code 2.1.44: "You cannot dynamically configure MCP servers when an
    /// enterprise MCP config is present") cannot start with it.
    pub claude_managed_mcp: Option<String>,
}

/// Codex's managed configuration for Codex 0.137-0.148 (codex-acp 0.16): its own sandbox off
/// (warden's bubblewrap contains it; Codex's cannot start inside it), and `untrusted`: every
/// command Codex does not itself know to be read-only, and every edit, is asked.
pub const CODEX_CONFIG_UNTRUSTED: &str = r#"# Written by warden: warden's sandbox contains Codex, and Codex asks for every command and edit.
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
"#;

/// Requirements that go with [`CODEX_CONFIG_UNTRUSTED`]: no other approval policy.
pub const CODEX_REQUIREMENTS_UNTRUSTED: &str = r#"# Written by warden; read-only inside the sandbox.
allowed_approval_policies = ["untrusted"]
allowed_sandbox_modes = ["danger-full-access"]
"#;

/// Codex's managed configuration for Codex 0.149 and later (codex-acp 2.x), which has no
/// `untrusted` any more: `on-request` in Codex's own read-only sandbox. That sandbox cannot start
/// inside warden's (Codex 0.166: "filesystem-restricted execution requires bubblewrap"), so a
/// command that does not ask to leave it fails before it runs, and one that asks
/// (`require_escalated`) reaches warden-policy as a permission request; every edit is asked.
/// The requirements ([`CODEX_REQUIREMENTS_TOML`]) keep `danger-full-access` (where nothing
/// would be asked) out of reach.
///
/// `[features] plugins = false`: Codex 0.166 syncs its curated plugins as it starts
/// (`github.com/openai/plugins.git`, `api.github.com`, `chatgpt.com/backend-api/plugins/…`),
/// four connections the egress proxy refuses and shows the caller in every conversation, and
/// that make a warm agent unusable (`tests/tests/real_codex.rs`).
pub const CODEX_CONFIG_ON_REQUEST: &str = r#"# Written by warden: nothing runs or changes without a permission request.
approval_policy = "on-request"
sandbox_mode = "read-only"

# No plugin sync from the network as Codex starts.
[features]
plugins = false
"#;

/// One mount of the sandbox's `/etc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcBind {
    /// Bind the host path `src` read-only at `dest`.
    Host { src: PathBuf, dest: PathBuf },
    /// Write `content` to a read-only file at `dest`.
    Data { dest: PathBuf, content: Vec<u8> },
}

impl EtcBind {
    pub fn dest(&self) -> &Path {
        match self {
            EtcBind::Host { dest, .. } | EtcBind::Data { dest, .. } => dest,
        }
    }
}

/// The sandbox's `/etc` for an agent running as `who` with home `home`, from the host's `etc`
/// directory (`/etc` in production; a test passes its own).
pub fn etc_plan(
    etc: &Path,
    who: AgentIdentity,
    home: Option<&Path>,
    adapters: &AdapterPolicy,
) -> Vec<EtcBind> {
    let mut out = Vec::new();
    let etc_real = std::fs::canonicalize(etc).unwrap_or_else(|_| etc.to_path_buf());
    for name in ETC_ENTRIES {
        let entry = etc.join(name);
        if std::fs::symlink_metadata(&entry).is_err() {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&entry) else {
            continue; // a dangling link: nothing to bind
        };
        if forbidden(&real, &etc_real) {
            tracing::warn!(entry = %entry.display(), target = %real.display(), "an /etc entry resolves to a forbidden file; not bound");
            continue;
        }
        out.push(EtcBind::Host {
            src: real,
            dest: Path::new("/etc").join(name),
        });
    }
    let home = home
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let mut passwd = String::from("root:x:0:0:root:/root:/usr/sbin/nologin\n");
    if who.uid != 0 {
        passwd.push_str(&format!(
            "{AGENT_NAME}:x:{}:{}:warden agent:{home}:/bin/sh\n",
            who.uid, who.gid
        ));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    let mut group = String::from("root:x:0:\n");
    if who.gid != 0 && who.gid != 65534 {
        group.push_str(&format!("{AGENT_NAME}:x:{}:\n", who.gid));
    }
    group.push_str("nogroup:x:65534:\n");
    for (dest, content) in [
        ("/etc/passwd", passwd.into_bytes()),
        ("/etc/group", group.into_bytes()),
        (
            CLAUDE_MANAGED_SETTINGS,
            CLAUDE_MANAGED_SETTINGS_JSON.as_bytes().to_vec(),
        ),
        (
            QWEN_SYSTEM_SETTINGS,
            QWEN_SYSTEM_SETTINGS_JSON.as_bytes().to_vec(),
        ),
        (
            CODEX_REQUIREMENTS,
            adapters
                .codex_requirements
                .as_deref()
                .unwrap_or(CODEX_REQUIREMENTS_TOML)
                .as_bytes()
                .to_vec(),
        ),
    ] {
        out.push(EtcBind::Data {
            dest: PathBuf::from(dest),
            content,
        });
    }
    if let Some(config) = &adapters.codex_config {
        out.push(EtcBind::Data {
            dest: PathBuf::from(CODEX_MANAGED_CONFIG),
            content: config.as_bytes().to_vec(),
        });
    }
    if let Some(mcp) = &adapters.claude_managed_mcp {
        out.push(EtcBind::Data {
            dest: PathBuf::from(CLAUDE_MANAGED_MCP),
            content: mcp.as_bytes().to_vec(),
        });
    }
    if let Some(config) = &adapters.opencode_config {
        out.push(EtcBind::Data {
            dest: PathBuf::from(OPENCODE_MANAGED_CONFIG),
            content: config.as_bytes().to_vec(),
        });
    }
    out
}

/// True when `real` (a resolved path) is a forbidden file: its name, or the first component
/// below the host's `/etc`, is on [`ETC_FORBIDDEN`].
fn forbidden(real: &Path, etc_real: &Path) -> bool {
    let named = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| ETC_FORBIDDEN.contains(&n))
    };
    if named(real) {
        return true;
    }
    for e in [etc_real, Path::new("/etc")] {
        if let Ok(rest) = real.strip_prefix(e)
            && let Some(first) = rest.components().next()
            && ETC_FORBIDDEN.contains(&first.as_os_str().to_str().unwrap_or(""))
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> AgentIdentity {
        AgentIdentity {
            uid: 61000,
            gid: 61000,
        }
    }

    fn dests(plan: &[EtcBind]) -> Vec<String> {
        plan.iter()
            .map(|b| b.dest().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn only_listed_entries_and_generated_files_are_in_the_sandbox_etc() {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        std::fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        std::fs::create_dir_all(etc.join("ssh")).unwrap();
        std::fs::create_dir_all(etc.join("sudoers.d")).unwrap();
        for f in [
            "hosts", "shadow", "gshadow", "sudoers", "passwd", "group", "fstab",
        ] {
            std::fs::write(etc.join(f), f).unwrap();
        }
        std::fs::write(etc.join("ssh/ssh_host_ed25519_key"), "key").unwrap();
        // resolv.conf → ../run/...: the target is bound at /etc/resolv.conf.
        std::fs::create_dir_all(t.path().join("run/resolve")).unwrap();
        std::fs::write(
            t.path().join("run/resolve/stub.conf"),
            "nameserver 127.0.0.53",
        )
        .unwrap();
        std::os::unix::fs::symlink("../run/resolve/stub.conf", etc.join("resolv.conf")).unwrap();
        // A listed name that points at a forbidden file is not bound.
        std::os::unix::fs::symlink("shadow", etc.join("localtime")).unwrap();
        // A dangling link is skipped.
        std::os::unix::fs::symlink("/nonexistent/x", etc.join("timezone")).unwrap();

        let plan = etc_plan(
            &etc,
            who(),
            Some(Path::new("/srv/home-1")),
            &AdapterPolicy::default(),
        );
        let d = dests(&plan);
        for must in [
            "/etc/hosts",
            "/etc/ssl",
            "/etc/resolv.conf",
            "/etc/passwd",
            "/etc/group",
            CLAUDE_MANAGED_SETTINGS,
            CODEX_REQUIREMENTS,
            QWEN_SYSTEM_SETTINGS,
        ] {
            assert!(d.iter().any(|x| x == must), "{must} missing: {d:?}");
        }
        for never in [
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/sudoers",
            "/etc/sudoers.d",
            "/etc/ssh",
            "/etc/fstab",
            "/etc/localtime",
            "/etc/timezone",
            CODEX_MANAGED_CONFIG,
        ] {
            assert!(!d.iter().any(|x| x == never), "{never} bound: {d:?}");
        }
        let resolv = plan
            .iter()
            .find(|b| b.dest() == Path::new("/etc/resolv.conf"))
            .unwrap();
        let EtcBind::Host { src, .. } = resolv else {
            panic!("resolv.conf is a host bind")
        };
        assert!(src.ends_with("run/resolve/stub.conf"), "{src:?}");
        // The generated passwd has the agent, root and nobody, and nothing of the host's.
        let passwd = plan
            .iter()
            .find_map(|b| match b {
                EtcBind::Data { dest, content } if dest == Path::new("/etc/passwd") => {
                    Some(String::from_utf8_lossy(content).into_owned())
                }
                _ => None,
            })
            .unwrap();
        assert!(passwd.contains("warden-agent:x:61000:61000:warden agent:/srv/home-1:/bin/sh"));
        assert_eq!(passwd.lines().count(), 3, "{passwd}");
        assert!(!passwd.contains("passwd"));
    }

    #[test]
    fn an_agents_codex_files_replace_the_defaults() {
        let t = tempfile::tempdir().unwrap();
        let policy = AdapterPolicy {
            codex_config: Some("approval_policy = \"on-request\"\n".into()),
            codex_requirements: Some("allowed_approval_policies = [\"on-request\"]\n".into()),
            opencode_config: None,
            claude_managed_mcp: Some(CLAUDE_MANAGED_MCP_JSON.into()),
        };
        let plan = etc_plan(t.path(), who(), None, &policy);
        let data = |dest: &str| {
            plan.iter()
                .find_map(|b| match b {
                    EtcBind::Data { dest: d, content } if d == Path::new(dest) => {
                        Some(String::from_utf8_lossy(content).into_owned())
                    }
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{dest} missing"))
        };
        assert_eq!(data(CLAUDE_MANAGED_MCP), CLAUDE_MANAGED_MCP_JSON);
        assert_eq!(
            data(CODEX_MANAGED_CONFIG),
            "approval_policy = \"on-request\"\n"
        );
        assert_eq!(
            data(CODEX_REQUIREMENTS),
            "allowed_approval_policies = [\"on-request\"]\n"
        );
        assert_eq!(
            plan.iter()
                .filter(|b| b.dest() == Path::new(CODEX_REQUIREMENTS))
                .count(),
            1
        );
    }

    #[test]
    fn the_managed_policies_say_what_the_readme_says() {
        let v: serde_json::Value = serde_json::from_str(CLAUDE_MANAGED_SETTINGS_JSON).unwrap();
        assert_eq!(v["permissions"]["disableBypassPermissionsMode"], "disable");
        assert_eq!(v["permissions"]["defaultMode"], "default");
        assert_eq!(v["allowManagedPermissionRulesOnly"], true);
        assert_eq!(v["allowManagedHooksOnly"], true);
        assert!(!CODEX_REQUIREMENTS_TOML.contains("danger-full-access"));
        assert!(!CODEX_REQUIREMENTS_TOML.contains("\"never\""));
        assert!(
            CODEX_REQUIREMENTS_TOML
                .lines()
                .any(|l| l == "allow_managed_hooks_only = true")
        );
        let m: serde_json::Value = serde_json::from_str(CLAUDE_MANAGED_MCP_JSON).unwrap();
        assert_eq!(m["mcpServers"], serde_json::json!({}));
        let q: serde_json::Value = serde_json::from_str(QWEN_SYSTEM_SETTINGS_JSON).unwrap();
        assert_eq!(q["tools"]["approvalMode"], "default");
        assert_eq!(q["tools"]["autoAccept"], false);
        assert_eq!(q["security"]["folderTrust"]["enabled"], true);
        assert_eq!(q["disableAllHooks"], true);
        assert_eq!(q["privacy"]["usageStatisticsEnabled"], false);
        assert_eq!(q["general"]["enableAutoUpdate"], false);
    }
}
