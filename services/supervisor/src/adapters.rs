//! Installed ACP adapters (`adapter = "<npm package>@<version>"` entries, the built-in `claude`
//! and `codex`): where one is found under `[adapters] dir`, the program and arguments that run
//! it, the directories bound read-only for it; and the Codex managed configuration written into
//! an agent's sandbox. Pure lookups on the file system: never installs or fetches anything.

use std::path::{Path, PathBuf};

use crate::config::AgentConfig;

/// An adapter found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The Node.js interpreter that runs it; for a native `bin` (an ELF executable, e.g.
    /// `opencode-ai`'s, whose `bin` is the platform's binary), the entry itself.
    pub node: PathBuf,
    /// The entry is a native executable, run directly (not through `node`).
    pub native: bool,
    /// Its entry point (the package's `bin`).
    pub entry: PathBuf,
    /// The `node_modules` holding it and its dependencies (bound read-only).
    pub modules: PathBuf,
}

/// `"@scope/name@1.2.3"` → (`"@scope/name"`, `"1.2.3"`).
pub fn split_spec(spec: &str) -> Option<(&str, &str)> {
    let at = spec.rfind('@').filter(|&i| i > 0)?;
    let (name, version) = (&spec[..at], &spec[at + 1..]);
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "@/._-+".contains(c))
            && !s.contains("..")
    };
    (ok(name) && ok(version) && !version.contains('/')).then_some((name, version))
}

/// The directory one adapter is installed in: `<dir>/<name without scope>-<version>` (what
/// `npm install --prefix <that> <spec>` makes).
pub fn install_dir(dir: &Path, spec: &str) -> Option<PathBuf> {
    let (name, version) = split_spec(spec)?;
    let short = name.rsplit('/').next()?;
    Some(dir.join(format!("{short}-{version}")))
}

/// The command that installs `spec` where [`resolve`] looks for it.
pub fn install_hint(dir: &Path, spec: &str) -> String {
    match install_dir(dir, spec) {
        Some(d) => format!(
            "npm install --prefix {} --no-audit --no-fund {spec}",
            d.display()
        ),
        None => format!("{spec:?} is not an npm package spec (name@version)"),
    }
}

/// The first Node.js on the usual paths, or `configured` when set.
pub fn find_node(configured: &Path) -> Option<PathBuf> {
    if !configured.as_os_str().is_empty() {
        return configured.is_file().then(|| configured.to_path_buf());
    }
    ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Finds `spec` under `dir`, or says what is missing and how to install it.
pub fn resolve(dir: &Path, node: &Path, spec: &str) -> Result<Resolved, String> {
    let (name, _) = split_spec(spec)
        .ok_or_else(|| format!("adapter {spec:?} is not an npm package spec (name@version)"))?;
    let base = install_dir(dir, spec).ok_or_else(|| format!("adapter {spec:?}"))?;
    let modules = base.join("node_modules");
    let package = modules.join(name);
    let manifest = package.join("package.json");
    let text = std::fs::read_to_string(&manifest).map_err(|e| {
        format!(
            "adapter {spec} is not installed ({}: {e}); install it with: {}",
            manifest.display(),
            install_hint(dir, spec)
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not JSON: {e}", manifest.display()))?;
    let bin = match v.get("bin") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Object(m)) => {
            m.values().find_map(|x| x.as_str().map(str::to_string))
        }
        _ => None,
    }
    .ok_or_else(|| format!("{} names no bin", manifest.display()))?;
    let entry = package.join(bin);
    if !entry.is_file() {
        return Err(format!(
            "adapter {spec}: its entry point {} is missing; reinstall it with: {}",
            entry.display(),
            install_hint(dir, spec)
        ));
    }
    if is_elf(&entry) {
        return Ok(Resolved {
            node: entry.clone(),
            native: true,
            entry,
            modules,
        });
    }
    let node = find_node(node).ok_or_else(|| {
        "Node.js was not found (/usr/bin/node, /usr/local/bin/node, or set adapters.node)"
            .to_string()
    })?;
    Ok(Resolved {
        node,
        native: false,
        entry,
        modules,
    })
}

/// Whether `path` starts with the ELF magic (a package whose `bin` is a native executable).
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

pub use warden_sandbox::{
    CODEX_CONFIG_ON_REQUEST, CODEX_CONFIG_UNTRUSTED, CODEX_REQUIREMENTS_UNTRUSTED,
};

/// This agent's Codex files for its sandbox's `/etc`. With `OPENAI_BASE_URL` in the agent's
/// environment the managed configuration also names it as the model provider (Codex reads no
/// such variable), over HTTPS or HTTP without WebSockets.
pub fn codex_policy(
    cfg: &AgentConfig,
    base_url: Option<&str>,
) -> Result<warden_sandbox::AdapterPolicy, String> {
    let mut policy = warden_sandbox::AdapterPolicy::default();
    if !cfg.codex_requirements.is_empty() {
        policy.codex_requirements = Some(cfg.codex_requirements.clone());
    }
    if cfg.codex_config.is_empty() {
        return Ok(policy);
    }
    let mut table: toml::Table = cfg
        .codex_config
        .parse()
        .map_err(|e: toml::de::Error| format!("codex_config is not TOML: {e}"))?;
    if let Some(url) = base_url.filter(|u| !u.is_empty())
        && !table.contains_key("model_provider")
    {
        let mut provider = toml::Table::new();
        provider.insert("name".into(), "OpenAI (OPENAI_BASE_URL)".into());
        provider.insert("base_url".into(), url.into());
        provider.insert("env_key".into(), "OPENAI_API_KEY".into());
        provider.insert("wire_api".into(), "responses".into());
        provider.insert("supports_websockets".into(), false.into());
        let mut providers = toml::Table::new();
        providers.insert("warden-openai".into(), provider.into());
        table.insert("model_provider".into(), "warden-openai".into());
        table.insert("model_providers".into(), providers.into());
    }
    let text = toml::to_string(&table).map_err(|e| format!("codex_config: {e}"))?;
    policy.codex_config = Some(format!("# Written by warden for this agent.\n{text}"));
    Ok(policy)
}

/// The environment of an agent whose OpenCode configuration warden manages (`opencode_config`
/// set), over its `set_env`: what OpenCode's merge of configuration layers cannot take away.
/// - `OPENCODE_DISABLE_PROJECT_CONFIG`: the root's `opencode.json(c)` and `.opencode/` are not
///   read (as Gemini CLI and Qwen Code ignore an untrusted root's settings): their MCP servers,
///   plugins, agents and commands would be added to, never replaced by, warden's layer;
/// - `OPENCODE_PURE`: no external plugins (code run in OpenCode's own process, and an npm
///   install at start); `OPENCODE_DISABLE_DEFAULT_PLUGINS`: none of its default ones either;
/// - `OPENCODE_AUTH_CONTENT`: `~/.local/share/opencode/auth.json` is not read (its `wellknown`
///   entries fetch remote configuration, its keys pick other providers);
/// - `OPENCODE_DB=:memory:`: its database lives in its memory, not in
///   `~/.local/share/opencode/opencode.db`, a file its own commands may write: that database
///   holds the "always" approvals OpenCode remembers per project (its `permission` table) and
///   each session's own permission rules, so a command that wrote rows there made the next
///   start of the conversation run commands unasked (issue 35, reproduced by
///   `real_opencode.rs`). What this costs: an idle-stopped conversation's next start cannot
///   load its earlier session (the caller is told: a context reset);
/// - no `~/.claude` rules or skills read for Claude Code's sake, no external skills;
/// - no model list fetched, no update check, no language-server download, no sharing: each a
///   connection the egress proxy would refuse.
pub const OPENCODE_ENV: &[(&str, &str)] = &[
    ("OPENCODE_DISABLE_PROJECT_CONFIG", "1"),
    ("OPENCODE_PURE", "1"),
    ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1"),
    ("OPENCODE_AUTH_CONTENT", "{}"),
    ("OPENCODE_DB", ":memory:"),
    ("OPENCODE_DISABLE_CLAUDE_CODE", "1"),
    ("OPENCODE_DISABLE_EXTERNAL_SKILLS", "1"),
    ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
    ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
    ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1"),
    ("OPENCODE_DISABLE_SHARE", "1"),
];

/// Whether `cfg` runs OpenCode, whose ACP front calls OpenCode's own HTTP server on loopback
/// (`127.0.0.1:4096`) through the proxy variables, so its sandbox's loopback must not be
/// proxied (`warden_sandbox::EgressSpec::loopback_direct`; loopback there is the sandbox's own).
pub fn talks_to_itself_over_loopback(cfg: &AgentConfig) -> bool {
    split_spec(&cfg.adapter).is_some_and(|(name, _)| name == "opencode-ai")
}

/// The port OpenCode's server listens on in its sandbox (`opencode acp --port`, the built-in's
/// arguments): the one port its commands may not connect to.
pub const OPENCODE_SERVER_PORT: u16 = 4096;

/// The environment that makes OpenCode run its commands in `warden-agent-shell` (at `shell`,
/// bound read-only): its commands may not reach OpenCode's own server, which answers
/// permission requests for whoever asks (a command allowed once could otherwise answer the next
/// ones "always" before warden decides), nor trace OpenCode.
pub fn agent_shell_env(shell: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("SHELL".into(), shell.to_string_lossy().into_owned()),
        (
            "WARDEN_AGENT_SHELL_CLOSED_PORT".into(),
            OPENCODE_SERVER_PORT.to_string(),
        ),
        ("WARDEN_AGENT_SHELL_PROGRAM".into(), "/bin/bash".into()),
    ]
}

/// Where Qwen Code's and Gemini CLI's highest settings layers live in the sandbox: warden's
/// `/etc` (written read-only by `warden_sandbox::etc_plan`; the sandbox's `/` is remounted
/// read-only, so what is absent there stays absent).
pub const QWEN_SYSTEM_DEFAULTS: &str = "/etc/qwen-code/system-defaults.json";
pub const GEMINI_SYSTEM_SETTINGS: &str = "/etc/gemini-cli/settings.json";
pub const GEMINI_SYSTEM_DEFAULTS: &str = "/etc/gemini-cli/system-defaults.json";

/// The environment variables an adapter takes the places of its configuration from, set to
/// warden's own read-only files (or to a fixed answer), over `set_env`. Qwen Code and Gemini
/// CLI load `.env` files into their own environment before they read any setting, each key
/// only where the environment leaves it unset (or, for Qwen Code, empty): a value set here
/// is never replaced by one a file planted, whatever file. `home` is the agent's home as the
/// agent sees it (the conversation's).
/// - Qwen Code 0.24 (`getSystemSettingsPath`, `HOME_ENV_BOOTSTRAP_KEYS`): its system settings
///   (warden's) and system defaults (absent), its home directory (`QWEN_HOME`, holding the
///   read-only user settings, `.env` and trusted folders), its runtime directory, its
///   trusted-folders and MCP-approvals files. A `.env` in the home may set any of these
///   unless set (only a project's is filtered);
/// - Gemini CLI 0.61 (`getSystemSettingsPath`, `checkPathTrust`, `homedir`): its system
///   settings and defaults (absent: Gemini reads them only when uid 0 owns them, which
///   nothing in the sandbox is), its home, its trusted-folders file, and
///   `GEMINI_CLI_TRUST_WORKSPACE=false`: no folder is trusted, whatever a file says, so
///   workspace settings, a trusted `.env` and MCP servers of the root never count.
///
/// Codex ignores `CODEX_*` keys in its `.env` (and that file is read-only, empty); Claude
/// Code and OpenCode load no `.env` at all (an `strace` of each shows none opened): their
/// env-named paths come only from the operator (`env`, `set_env`).
pub fn config_env(cfg: &AgentConfig, home: Option<&Path>) -> Vec<(String, String)> {
    let Some((name, _)) = split_spec(&cfg.adapter) else {
        return Vec::new();
    };
    let Some(home) = home else {
        return Vec::new();
    };
    let at = |rel: &str| home.join(rel).to_string_lossy().into_owned();
    let pairs: Vec<(&str, String)> = match name {
        "@qwen-code/qwen-code" => vec![
            ("QWEN_HOME", at(".qwen")),
            ("QWEN_RUNTIME_DIR", at(".qwen")),
            (
                "QWEN_CODE_SYSTEM_SETTINGS_PATH",
                warden_sandbox::QWEN_SYSTEM_SETTINGS.into(),
            ),
            (
                "QWEN_CODE_SYSTEM_DEFAULTS_PATH",
                QWEN_SYSTEM_DEFAULTS.into(),
            ),
            (
                "QWEN_CODE_TRUSTED_FOLDERS_PATH",
                at(".qwen/trustedFolders.json"),
            ),
            (
                "QWEN_CODE_MCP_APPROVALS_PATH",
                at(".qwen/mcpApprovals.json"),
            ),
        ],
        "@google/gemini-cli" => vec![
            ("GEMINI_CLI_HOME", home.to_string_lossy().into_owned()),
            (
                "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
                GEMINI_SYSTEM_SETTINGS.into(),
            ),
            (
                "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
                GEMINI_SYSTEM_DEFAULTS.into(),
            ),
            (
                "GEMINI_CLI_TRUSTED_FOLDERS_PATH",
                at(".gemini/trustedFolders.json"),
            ),
            ("GEMINI_CLI_TRUST_WORKSPACE", "false".into()),
        ],
        _ => Vec::new(),
    };
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Claude Code's managed MCP servers (`/etc/claude-code/managed-mcp.json`, none) for the
/// built-in's adapter, `@agentclientprotocol/claude-agent-acp`: `~/.claude.json`, which
/// Claude Code rewrites as it runs and so cannot be read-only, names MCP servers (commands
/// run as it starts); the managed file takes exclusive control of them. Not for other
/// adapters: claude-code-acp 0.16 hands Claude Code its own MCP server at `session/new`, which
/// Claude Code refuses when that file exists (the agent cannot start).
pub fn claude_managed_mcp(cfg: &AgentConfig) -> Option<String> {
    split_spec(&cfg.adapter)
        .is_some_and(|(name, _)| name == "@agentclientprotocol/claude-agent-acp")
        .then(|| warden_sandbox::CLAUDE_MANAGED_MCP_JSON.to_string())
}

/// [`OPENCODE_ENV`] for `cfg` (empty unless warden manages its OpenCode configuration).
pub fn forced_env(cfg: &AgentConfig) -> &'static [(&'static str, &'static str)] {
    if cfg.opencode_config.is_empty() {
        &[]
    } else {
        OPENCODE_ENV
    }
}

/// This agent's OpenCode managed configuration (`/etc/opencode/opencode.json`), or `None`. With
/// `OPENAI_BASE_URL` in the agent's environment (and no provider of the operator's) an
/// OpenAI-compatible provider `warden` for it is added, its key read from `OPENAI_API_KEY` by
/// OpenCode itself (`{env:…}`: no secret in the file), `OPENAI_MODEL` of it chosen for the
/// conversation and for titles (`small_model`; else OpenCode picks a small model of another
/// provider whose key it sees, e.g. OpenAI's own API for `OPENAI_API_KEY`), and it is the only
/// provider enabled.
pub fn opencode_config(
    cfg: &AgentConfig,
    base_url: Option<&str>,
    model: Option<&str>,
) -> Result<Option<String>, String> {
    if cfg.opencode_config.is_empty() {
        return Ok(None);
    }
    let mut v: serde_json::Value = serde_json::from_str(&cfg.opencode_config)
        .map_err(|e| format!("opencode_config is not JSON: {e}"))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| "opencode_config is not a JSON object".to_string())?;
    if let Some(url) = base_url.filter(|u| !u.is_empty())
        && !obj.contains_key("provider")
    {
        let model = model.filter(|m| !m.is_empty()).unwrap_or("default");
        obj.insert(
            "provider".into(),
            serde_json::json!({"warden": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "OpenAI-compatible (OPENAI_BASE_URL)",
                "options": {"baseURL": url, "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {model: {"name": model}},
            }}),
        );
        for key in ["model", "small_model"] {
            if !obj.contains_key(key) {
                obj.insert(key.into(), format!("warden/{model}").into());
            }
        }
        if !obj.contains_key("enabled_providers") {
            obj.insert("enabled_providers".into(), serde_json::json!(["warden"]));
        }
    }
    serde_json::to_string_pretty(&v)
        .map(Some)
        .map_err(|e| format!("opencode_config: {e}"))
}

impl crate::config::Settings {
    /// The installed adapter an entry without a command runs (`None`: it names none). Here, not
    /// in `config.rs`, so the configuration does not import the adapters' resolution.
    pub fn adapter(&self, agent: &AgentConfig) -> Option<Result<Resolved, String>> {
        if !agent.command.is_empty() || agent.adapter.is_empty() {
            return None;
        }
        let a = &self.file.adapters;
        Some(resolve(&a.dir, &a.node, &agent.adapter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_at_the_last_at_and_refuse_paths() {
        assert_eq!(
            split_spec("@agentclientprotocol/codex-acp@2.6.0"),
            Some(("@agentclientprotocol/codex-acp", "2.6.0"))
        );
        assert_eq!(split_spec("left-pad@1.0.0"), Some(("left-pad", "1.0.0")));
        for bad in [
            "@scope/name",
            "name@",
            "@1.0",
            "../x@1",
            "x@../../1",
            "x@1/2",
            "x y@1",
        ] {
            assert_eq!(split_spec(bad), None, "{bad}");
        }
        assert_eq!(
            install_dir(Path::new("/a"), "@zed-industries/codex-acp@0.16.0").unwrap(),
            PathBuf::from("/a/codex-acp-0.16.0")
        );
    }

    #[test]
    fn an_installed_adapter_resolves_to_node_its_bin_and_its_modules() {
        let t = tempfile::tempdir().unwrap();
        let pkg = t
            .path()
            .join("codex-acp-2.6.0/node_modules/@agentclientprotocol/codex-acp");
        std::fs::create_dir_all(pkg.join("dist")).unwrap();
        std::fs::write(
            pkg.join("package.json"),
            r#"{"name": "@agentclientprotocol/codex-acp", "bin": {"codex-acp": "dist/index.js"}}"#,
        )
        .unwrap();
        let spec = "@agentclientprotocol/codex-acp@2.6.0";
        let node = t.path().join("node");
        std::fs::write(&node, "").unwrap();
        // The package without its entry point: says so, with the install command.
        let e = resolve(t.path(), &node, spec).unwrap_err();
        assert!(
            e.contains("dist/index.js") && e.contains("npm install --prefix"),
            "{e}"
        );
        std::fs::write(pkg.join("dist/index.js"), "").unwrap();
        let r = resolve(t.path(), &node, spec).unwrap();
        assert_eq!(r.entry, pkg.join("dist/index.js"));
        assert_eq!(r.modules, t.path().join("codex-acp-2.6.0/node_modules"));
        assert_eq!(r.node, node);
        // Not installed at all: the install command names the directory looked in.
        let e = resolve(
            t.path(),
            &node,
            "@agentclientprotocol/claude-agent-acp@0.101.0",
        )
        .unwrap_err();
        assert!(e.contains("not installed"), "{e}");
        assert!(
            e.contains(&format!(
                "npm install --prefix {}/claude-agent-acp-0.101.0",
                t.path().display()
            )),
            "{e}"
        );
        assert!(!r.native);
        // A native bin runs itself, with or without Node.js.
        std::fs::write(pkg.join("dist/index.js"), b"\x7fELF\x02\x01\x01").unwrap();
        let r = resolve(t.path(), &t.path().join("no-node"), spec).unwrap();
        assert!(r.native && r.node == r.entry, "{r:?}");
        std::fs::write(pkg.join("dist/index.js"), "").unwrap();
        // A configured node that does not exist is not replaced by another.
        let e = resolve(t.path(), &t.path().join("no-node"), spec).unwrap_err();
        assert!(e.contains("Node.js"), "{e}");
    }

    #[test]
    fn the_base_url_of_the_environment_becomes_opencodes_provider() {
        let cfg = crate::config::builtin_agents().remove("opencode").unwrap();
        let text = opencode_config(&cfg, Some("http://127.0.0.1:9/v1"), Some("m1"))
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["permission"]["bash"], "ask");
        assert_eq!(v["permission"]["edit"], "ask");
        assert_eq!(v["autoupdate"], false);
        let p = &v["provider"]["warden"];
        assert_eq!(p["options"]["baseURL"], "http://127.0.0.1:9/v1");
        assert_eq!(p["options"]["apiKey"], "{env:OPENAI_API_KEY}");
        assert_eq!(v["model"], "warden/m1");
        assert_eq!(v["small_model"], "warden/m1");
        assert_eq!(v["enabled_providers"], serde_json::json!(["warden"]));
        assert_eq!(v["formatter"], false);
        assert_eq!(v["snapshot"], false);
        // Without a base URL nothing is added; without a configuration nothing is written.
        let text = opencode_config(&cfg, None, None).unwrap().unwrap();
        assert!(!text.contains("provider"));
        let mut none = cfg.clone();
        none.opencode_config = String::new();
        assert_eq!(
            opencode_config(&none, Some("http://x/v1"), None).unwrap(),
            None
        );
        let mut bad = cfg;
        bad.opencode_config = "[1]".into();
        assert!(opencode_config(&bad, None, None).is_err());
    }

    #[test]
    fn opencodes_server_listens_on_the_port_its_shell_may_not_reach() {
        let cfg = crate::config::builtin_agents().remove("opencode").unwrap();
        assert!(talks_to_itself_over_loopback(&cfg));
        let port = OPENCODE_SERVER_PORT.to_string();
        assert!(
            cfg.args
                .windows(2)
                .any(|w| w[0] == "--port" && w[1] == port),
            "{:?}",
            cfg.args
        );
        let env = agent_shell_env(std::path::Path::new("/x/warden-agent-shell"));
        assert!(env.contains(&("SHELL".into(), "/x/warden-agent-shell".into())));
        assert!(env.contains(&("WARDEN_AGENT_SHELL_CLOSED_PORT".into(), port)));
        let qwen = crate::config::builtin_agents().remove("qwen").unwrap();
        assert!(!talks_to_itself_over_loopback(&qwen));
    }

    /// Issue 35: what Qwen Code and Gemini CLI would take from a planted `.env` is set by warden
    /// to its own files; other adapters, and an agent without a home, get nothing.
    #[test]
    fn the_settings_paths_of_qwen_and_gemini_are_wardens() {
        let home = Path::new("/srv/homes/c-1");
        let get = |agent: &str, k: &str| {
            let cfg = crate::config::builtin_agents().remove(agent).unwrap();
            config_env(&cfg, Some(home))
                .into_iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v)
        };
        assert_eq!(
            get("qwen", "QWEN_CODE_SYSTEM_SETTINGS_PATH").as_deref(),
            Some(warden_sandbox::QWEN_SYSTEM_SETTINGS)
        );
        assert_eq!(
            get("qwen", "QWEN_HOME").as_deref(),
            Some("/srv/homes/c-1/.qwen")
        );
        assert_eq!(
            get("qwen", "QWEN_CODE_TRUSTED_FOLDERS_PATH").as_deref(),
            Some("/srv/homes/c-1/.qwen/trustedFolders.json")
        );
        assert_eq!(
            get("gemini", "GEMINI_CLI_TRUST_WORKSPACE").as_deref(),
            Some("false")
        );
        assert_eq!(
            get("gemini", "GEMINI_CLI_SYSTEM_SETTINGS_PATH").as_deref(),
            Some(GEMINI_SYSTEM_SETTINGS)
        );
        for agent in ["claude", "codex", "opencode", "scripted"] {
            let cfg = crate::config::builtin_agents().remove(agent).unwrap();
            assert!(config_env(&cfg, Some(home)).is_empty(), "{agent}");
        }
        let qwen = crate::config::builtin_agents().remove("qwen").unwrap();
        assert!(config_env(&qwen, None).is_empty());
        // Claude Code's managed MCP servers: for the built-in's adapter only.
        let claude = crate::config::builtin_agents().remove("claude").unwrap();
        assert_eq!(
            claude_managed_mcp(&claude).as_deref(),
            Some(warden_sandbox::CLAUDE_MANAGED_MCP_JSON)
        );
        let mut older = claude;
        older.adapter = "@zed-industries/claude-code-acp@0.16.2".into();
        assert_eq!(claude_managed_mcp(&older), None);
        assert_eq!(claude_managed_mcp(&qwen), None);
    }

    fn codex_cfg(config: &str) -> AgentConfig {
        let mut a = crate::config::builtin_agents().remove("codex").unwrap();
        a.codex_config = config.into();
        a
    }

    #[test]
    fn the_base_url_of_the_environment_becomes_codexs_provider() {
        let p = codex_policy(
            &codex_cfg(CODEX_CONFIG_UNTRUSTED),
            Some("http://127.0.0.1:9/v1"),
        )
        .unwrap();
        let text = p.codex_config.unwrap();
        let t: toml::Table = text.parse().unwrap();
        assert_eq!(t["approval_policy"].as_str(), Some("untrusted"));
        assert_eq!(t["model_provider"].as_str(), Some("warden-openai"));
        let prov = &t["model_providers"]["warden-openai"];
        assert_eq!(prov["base_url"].as_str(), Some("http://127.0.0.1:9/v1"));
        assert_eq!(prov["env_key"].as_str(), Some("OPENAI_API_KEY"));
        assert_eq!(prov["supports_websockets"].as_bool(), Some(false));
        // Without a base URL nothing is added; an operator's own provider is kept.
        let p = codex_policy(&codex_cfg(CODEX_CONFIG_UNTRUSTED), None).unwrap();
        assert!(!p.codex_config.unwrap().contains("model_provider"));
        let own = format!("{CODEX_CONFIG_UNTRUSTED}model_provider = \"mine\"\n");
        let p = codex_policy(&codex_cfg(&own), Some("http://x/v1")).unwrap();
        assert!(!p.codex_config.unwrap().contains("warden-openai"));
        // Not TOML: an error naming the key, never a half-written file.
        assert!(
            codex_policy(&codex_cfg("approval_policy = "), None)
                .unwrap_err()
                .contains("codex_config")
        );
    }
}
