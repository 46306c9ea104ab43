//! `[mcp]`: the MCP front's section, its defaults and its checks.
//!
//! Owns: what `[mcp]` may say. Must never: import anything of the gateway.

use super::*;

/// `[mcp]` of the gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpSection {
    /// Serve `/mcp` at all.
    pub enabled: bool,
    /// Browser origins (`scheme://host[:port]`) allowed besides the public URL's and, on a
    /// loopback bind, `http(s)://localhost|127.0.0.1|[::1]` on any port. A request carrying any
    /// other `Origin` is refused 403 (DNS rebinding).
    pub allowed_origins: Vec<String>,
    /// Longest accepted `task` argument in bytes (UTF-8); longer is refused before anything starts.
    pub task_max_bytes: usize,
    /// The soft budget of a verb call that names no `timeout_seconds`.
    pub default_timeout_seconds: u32,
    /// The largest `timeout_seconds` a caller may ask for.
    pub max_timeout_seconds: u32,
    /// Finished background jobs are kept (for `job_result`) this long.
    pub job_retention_seconds: u64,
    /// Background jobs per principal at once (running or kept).
    pub max_jobs: usize,
    /// 2025-11-25 sessions open at once on this gateway, of every principal (each costs tens of
    /// KiB of memory). An `initialize` past it is refused 429 with a JSON-RPC error.
    pub max_sessions: usize,
    /// Sessions one principal holds open at once; default `max_sessions` / 4, so three
    /// principals at their share still leave a quarter for everyone else. An `initialize` past
    /// it is refused 429 with a JSON-RPC error naming this key; other principals are served.
    pub max_sessions_per_principal: Option<usize>,
    /// A session with no request in flight (an open GET stream counts) and none for this long
    /// is ended as a DELETE ends it: its binding goes, its conversations are closed, its share
    /// comes back, and the memory it held is returned to the system.
    pub session_idle_seconds: u64,
}

impl Default for McpSection {
    fn default() -> Self {
        Self {
            enabled: true,
            allowed_origins: Vec::new(),
            task_max_bytes: 16 * 1024,
            default_timeout_seconds: 600,
            max_timeout_seconds: 3600,
            job_retention_seconds: 3600,
            max_jobs: 16,
            max_sessions: 2048,
            max_sessions_per_principal: None,
            session_idle_seconds: 300,
        }
    }
}

impl McpSection {
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        for o in &self.allowed_origins {
            if !(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with('/') {
                return Err(ConfigError::invalid(
                    origin,
                    "mcp.allowed_origins",
                    format!("{o:?} is not an origin like https://app.example:443"),
                ));
            }
        }
        if self.task_max_bytes == 0 || self.task_max_bytes > 1024 * 1024 {
            return Err(ConfigError::invalid(
                origin,
                "mcp.task_max_bytes",
                "must be between 1 and 1048576",
            ));
        }
        if self.max_timeout_seconds == 0
            || self.default_timeout_seconds == 0
            || self.default_timeout_seconds > self.max_timeout_seconds
        {
            return Err(ConfigError::invalid(
                origin,
                "mcp.default_timeout_seconds",
                "must be at least 1 and at most mcp.max_timeout_seconds",
            ));
        }
        if self.max_jobs == 0 {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_jobs",
                "must be at least 1",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_sessions) {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_sessions",
                "must be between 1 and 1000000",
            ));
        }
        if self
            .max_sessions_per_principal
            .is_some_and(|n| n == 0 || n > self.max_sessions)
        {
            return Err(ConfigError::invalid(
                origin,
                "mcp.max_sessions_per_principal",
                "must be at least 1 and at most mcp.max_sessions",
            ));
        }
        if !(1..=86_400).contains(&self.session_idle_seconds) {
            return Err(ConfigError::invalid(
                origin,
                "mcp.session_idle_seconds",
                "must be between 1 and 86400",
            ));
        }
        Ok(())
    }

    /// Sessions one principal may hold open: the configured share, else a quarter of the whole.
    pub fn sessions_per_principal(&self) -> usize {
        self.max_sessions_per_principal
            .unwrap_or(self.max_sessions / 4)
            .clamp(1, self.max_sessions)
    }
}
