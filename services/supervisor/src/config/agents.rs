//! The agent registry's types: `[agents]` (the default and every entry), an agent's
//! configuration, its network, and the built-in entries (`scripted`, `claude`, `codex`, `gemini`,
//! `qwen`, `opencode`) a file may override key by key.
//!
//! Owns: what an agent entry may say and the built-ins' values. Must never: start an agent, or
//! read a file.

use super::*;

// No deny_unknown_fields here: serde does not support it together with `flatten`; every other
// key is an agent entry, itself strict.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentsSection {
    /// The agent used when a request names none.
    #[serde(default = "default_agent")]
    pub default: String,
    /// Entries by name. An entry named like a built-in overrides it key by key (setting
    /// `agents.scripted.terminal = true` keeps the rest of the built-in `scripted`).
    #[serde(flatten)]
    pub entries: BTreeMap<String, toml::Table>,
}

impl Default for AgentsSection {
    fn default() -> Self {
        AgentsSection {
            default: default_agent(),
            entries: BTreeMap::new(),
        }
    }
}

fn default_agent() -> String {
    "scripted".into()
}

/// Network access of an agent's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    None,
    Host,
    /// Own network namespace; the only way out is the supervisor's egress proxy, to the
    /// destinations `egress_allow` (and the agent's `*_BASE_URL` variables) name.
    Proxy,
}

impl Network {
    /// The sandbox's spelling.
    pub fn sandbox(self) -> warden_sandbox::Network {
        match self {
            Network::None => warden_sandbox::Network::None,
            Network::Host => warden_sandbox::Network::Host,
            Network::Proxy => warden_sandbox::Network::Proxy,
        }
    }
}

/// One registry entry.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// For people: the agent card's skill description at the gateway ("" = a generic one).
    #[serde(default)]
    pub description: String,
    /// The program. Empty for `scripted` = `warden-scripted-agent` next to this executable,
    /// and for an `adapter` entry.
    #[serde(default)]
    pub command: String,
    /// An installed npm adapter, `"<package>@<version>"`, run with Node.js from under
    /// `[adapters] dir` when `command` is empty (its `node_modules` bound read-only). Never
    /// fetched at spawn.
    #[serde(default)]
    pub adapter: String,
    /// Codex's managed configuration (TOML, `/etc/codex/managed_config.toml` in the sandbox;
    /// it outranks the agent's own `~/.codex/config.toml`). "" = none written. With
    /// `OPENAI_BASE_URL` in the agent's environment a model provider for it is added.
    #[serde(default)]
    pub codex_config: String,
    /// Codex's requirements (TOML, `/etc/codex/requirements.toml`); "" = warden's default.
    #[serde(default)]
    pub codex_requirements: String,
    /// OpenCode's managed configuration (JSON, `/etc/opencode/opencode.json` in the sandbox,
    /// merged after the global and project configuration). "" = none written. With
    /// `OPENAI_BASE_URL` (and `OPENAI_MODEL`) in the agent's environment an OpenAI-compatible
    /// provider for it is added and chosen.
    #[serde(default)]
    pub opencode_config: String,
    /// `"<config id>=<value>"` set after `session/new` when the conversation's verb asks for
    /// planning (`advise`, `review`), e.g. Codex 2.6's `collaboration_mode=plan`; "" = none.
    /// It changes how the agent works, never what it may do without asking.
    #[serde(default)]
    pub plan_config_option: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variable names added to the allowlist for this agent (operator-only).
    #[serde(default)]
    pub env: Vec<String>,
    /// Fixed environment values set for this agent (operator-only; e.g. IS_SANDBOX=1).
    #[serde(default)]
    pub set_env: BTreeMap<String, String>,
    #[serde(default)]
    pub network: Network,
    /// With `network = "proxy"`: the `host:port` destinations the agent may reach
    /// (`*.domain:port` = its subdomains, public addresses only). The value of every
    /// `*_BASE_URL` variable in the agent's environment is allowed too. Loopback and private
    /// addresses only when named exactly here (or by a base URL).
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// The mode forced after `session/new` ("" = the agent has no modes; nothing is forced).
    #[serde(default)]
    pub supervised_mode: String,
    /// Further mode ids that still ask for every call (e.g. Claude `plan`). Every other mode
    /// the agent reports is elevated.
    #[serde(default)]
    pub supervised_modes: Vec<String>,
    /// Advertise ACP terminals to this agent: commands then run contained like the agent,
    /// each only after an ALLOW of an execute tool call.
    #[serde(default)]
    pub terminal: bool,
    /// Advertise `fs/read_text_file` and `fs/write_text_file` (the default): the agent's reads
    /// and writes in its root then go through warden, each decided. `false` for an adapter that
    /// cannot use them: it then reads and writes itself, inside its sandbox, after the
    /// permission request of each edit (as Codex does). Gemini CLI 0.61 cannot create a file
    /// through them (it takes the "not found" of its read-before-write for a failure).
    #[serde(default = "yes")]
    pub fs: bool,
    /// Decide deadline override for this agent (e.g. long when an approver decides).
    #[serde(default)]
    pub decide_deadline_ms: Option<u64>,
    /// Process limits of the agent's tree.
    #[serde(default)]
    pub max_processes: Option<u64>,
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
    /// State the turn's soft time budget as a second text block of the prompt (for model-driven
    /// agents). It is always in the prompt's `_meta.warden.budgetSeconds`.
    #[serde(default = "yes")]
    pub budget_in_prompt: bool,
    /// Operators opt an agent in; the built-in real adapters are listed but not started unless
    /// a request names them.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The template of the agent's home (operator-only). Each conversation gets a fresh copy
    /// under `<state>/homes/` (owned by the agent, removed with the conversation), bound
    /// read-write under bubblewrap and set as `HOME`; the template itself is never bound, so
    /// nothing one conversation writes there reaches another. Unset: an empty fresh home.
    #[serde(default)]
    pub home: Option<PathBuf>,
    /// Further host paths the agent may read under bubblewrap (operator-only), e.g. a Node.js
    /// installation outside /usr or a scenario file. Never writable.
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Warm agents kept ready for new conversations (`pool.rs`): spawned contained, initialized
    /// and given their session in a fresh owned root ahead of time, so that opening a
    /// conversation in a fresh owned sandbox with the `workspace-write` profile takes one
    /// instead of starting an agent. They are live agents (`limits.max_live_agents`) and the
    /// first stopped when a conversation needs room. 0 (the default; the built-in `scripted`: 1)
    /// = none.
    #[serde(default)]
    pub pool_size: usize,
}

fn yes() -> bool {
    true
}

impl AgentConfig {
    fn builtin(command: &str, args: &[&str], mode: &str, modes: &[&str], env: &[&str]) -> Self {
        AgentConfig {
            description: String::new(),
            command: command.into(),
            adapter: String::new(),
            codex_config: String::new(),
            codex_requirements: String::new(),
            opencode_config: String::new(),
            plan_config_option: String::new(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
            set_env: BTreeMap::new(),
            network: Network::None,
            egress_allow: Vec::new(),
            supervised_mode: mode.into(),
            supervised_modes: modes.iter().map(|s| s.to_string()).collect(),
            terminal: false,
            fs: true,
            decide_deadline_ms: None,
            max_processes: None,
            memory_max_bytes: None,
            budget_in_prompt: true,
            enabled: true,
            home: None,
            read_only_paths: Vec::new(),
            pool_size: 0,
        }
    }

    /// Whether `mode` keeps supervision for this agent.
    pub fn is_supervised_mode(&self, mode: &str) -> bool {
        mode.is_empty()
            || mode == self.supervised_mode
            || self.supervised_modes.iter().any(|m| m == mode)
    }
}

/// The adapter the built-in `claude` runs (installed under `[adapters] dir`).
pub const CLAUDE_ADAPTER: &str = "@agentclientprotocol/claude-agent-acp@0.101.0";
/// The adapter the built-in `codex` runs (installed under `[adapters] dir`).
pub const CODEX_ADAPTER: &str = "@agentclientprotocol/codex-acp@2.6.0";
/// The agent the built-in `gemini` runs (Gemini CLI, itself the ACP agent with
/// `--experimental-acp`; installed under `[adapters] dir`).
pub const GEMINI_ADAPTER: &str = "@google/gemini-cli@0.61.0";
/// The agent the built-in `qwen` runs (Qwen Code, itself the ACP agent with `--acp`).
pub const QWEN_ADAPTER: &str = "@qwen-code/qwen-code@0.24.4";
/// The agent the built-in `opencode` runs (OpenCode, a native executable, itself the ACP agent
/// with `acp`).
pub const OPENCODE_ADAPTER: &str = "opencode-ai@1.18.33";

/// The built-in registry: `scripted` (default, no network), `claude` and `codex` (installed
/// adapters; they reach their model API through the egress proxy, `network = "proxy"`, and
/// nothing else unless the operator adds it).
pub fn builtin_agents() -> BTreeMap<String, AgentConfig> {
    let mut m = BTreeMap::new();
    // The scripted agent reads its budget from `_meta` (its prompt text may be a scenario).
    let mut scripted = AgentConfig::builtin(
        "",
        &[],
        "default",
        &["plan"],
        &[
            "WARDEN_SCENARIO",
            "WARDEN_SCRIPTED_VOCABULARY",
            "WARDEN_SCRIPTED_REPORT",
        ],
    );
    scripted.budget_in_prompt = false;
    // One warm scripted agent: the demo and the tests answer at once.
    scripted.pool_size = 1;
    scripted.description = "warden's scripted demo agent".into();
    m.insert("scripted".into(), scripted);
    let mut claude = AgentConfig::builtin(
        "",
        &[],
        "default",
        &["plan"],
        &[
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "CLAUDE_CONFIG_DIR",
        ],
    );
    claude.adapter = CLAUDE_ADAPTER.into();
    claude.network = Network::Proxy;
    claude.egress_allow = vec!["api.anthropic.com:443".into()];
    // Claude Code's own switch for everything it sends besides the model's requests (telemetry,
    // error reports, update checks): under the egress proxy each would be a refusal shown to the
    // caller, and repeated ones end the turn (limits.egress_refusals_end_turn).
    claude.set_env.insert(
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
        "1".into(),
    );
    claude.description = "Claude Code through its ACP adapter, supervised by warden".into();
    m.insert("claude".into(), claude);
    let mut codex = AgentConfig::builtin(
        "",
        &[],
        "read-only",
        &[],
        &["OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_HOME"],
    );
    codex.adapter = CODEX_ADAPTER.into();
    codex.codex_config = warden_sandbox::CODEX_CONFIG_ON_REQUEST.into();
    codex.plan_config_option = "collaboration_mode=plan".into();
    codex.network = Network::Proxy;
    codex.egress_allow = vec!["api.openai.com:443".into()];
    codex.description = "Codex through its ACP adapter, supervised by warden".into();
    m.insert("codex".into(), codex);
    // Gemini CLI: `default` asks for every edit and command; `plan` is read-only. `autoEdit`
    // and `yolo` are elevated. Its user settings are warden's (`warden_sandbox::
    // GEMINI_SETTINGS_JSON`, read-only in the home).
    let mut gemini = AgentConfig::builtin(
        "",
        &["--experimental-acp"],
        "default",
        &["plan"],
        &["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL"],
    );
    gemini.adapter = GEMINI_ADAPTER.into();
    gemini.plan_config_option = "mode=plan".into();
    gemini.fs = false;
    gemini.network = Network::Proxy;
    gemini.egress_allow = vec!["generativelanguage.googleapis.com:443".into()];
    // Its launcher otherwise starts Gemini CLI a second time as its child (to raise Node's
    // heap limit) and ignores SIGTERM itself.
    gemini
        .set_env
        .insert("GEMINI_CLI_NO_RELAUNCH".into(), "1".into());
    gemini.description = "Gemini CLI over ACP, supervised by warden".into();
    m.insert("gemini".into(), gemini);
    // Qwen Code: `default` asks for every edit and command; `plan` is read-only. Its own
    // default, `auto` (a model classifier approves), and `auto-edit`, `yolo` are elevated. Its
    // model is any OpenAI-compatible endpoint: `OPENAI_BASE_URL` names it, and the egress proxy
    // allows that and nothing else.
    let mut qwen = AgentConfig::builtin(
        "",
        &["--acp"],
        "default",
        &["plan"],
        &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"],
    );
    qwen.adapter = QWEN_ADAPTER.into();
    qwen.plan_config_option = "mode=plan".into();
    qwen.network = Network::Proxy;
    // Its launcher otherwise starts Qwen Code again as its child (with --expose-gc). Where its
    // settings live (`QWEN_HOME`, its system settings, trusted folders, ...) is set by the
    // supervisor over `set_env` (`adapters::config_env`): Qwen Code takes each from a `.env` in
    // the home unless it is set.
    qwen.set_env
        .insert("QWEN_CODE_NO_RELAUNCH".into(), "1".into());
    qwen.description = "Qwen Code over ACP, supervised by warden".into();
    m.insert("qwen".into(), qwen);
    // OpenCode: `build` asks for every edit, command, fetch and subagent under warden's managed
    // configuration (`warden_sandbox::OPENCODE_CONFIG_JSON`), `plan` too (it denies edits
    // itself); its modes are its primary agents, published as the `mode` config option. Its
    // model is any OpenAI-compatible endpoint (`OPENAI_BASE_URL`, `OPENAI_MODEL`): warden adds
    // it as the only provider, and the egress proxy allows it and nothing else. Its fixed
    // environment is `adapters::OPENCODE_ENV`, set over `set_env`.
    let mut opencode = AgentConfig::builtin(
        "",
        &["acp", "--port", "4096"],
        "build",
        &["plan"],
        &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"],
    );
    opencode.adapter = OPENCODE_ADAPTER.into();
    opencode.opencode_config = warden_sandbox::OPENCODE_CONFIG_JSON.into();
    opencode.plan_config_option = "mode=plan".into();
    opencode.network = Network::Proxy;
    opencode.description = "OpenCode over ACP, supervised by warden".into();
    m.insert("opencode".into(), opencode);
    m
}
