//! `[mcp]`: the MCP front's settings (every key has a default; the section may be absent).

use serde::Deserialize;
use warden_daemon::config::{ConfigError, Origin};

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
        Ok(())
    }
}
