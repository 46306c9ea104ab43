//! warden-policy's configuration: the shared `[daemon]` section, two listeners, request limits,
//! audit durability and the operator policy itself (`[policy]`, see `warden_rules::PolicyConfig`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use warden_daemon::config::{ConfigError, DaemonSection, ListenerConfig, LoadedConfig, Origin};
use warden_decide::DecideSection;
use warden_rules::{PolicyConfig, PolicyError};

/// The embedded default: warden's default policy (`approve-all`: the boundary floor alone
/// decides; escalations deny).
pub const EMBEDDED: &str = r#"
[daemon]
state_dir = "/var/lib/warden/policy"

# PolicyService.Decide: only the supervisor's uid/gid (empty = this daemon's own uid).
[listen]
socket = "policy.sock"

# AdminService (Status, AuditQuery, Reload): the operators' group.
[admin]
socket = "policy-admin.sock"

[decide]
max_raw_input_bytes = 262144
max_locations = 256
max_options = 32
return_escalations = false

[audit]
sync = true

[policy.global]
mode = "approve-all"
non_interactive = "deny"
"#;

/// The environment prefix for overrides (`WARDEN_POLICY__POLICY__GLOBAL__MODE=deny-all`).
pub const ENV_PREFIX: &str = "WARDEN_POLICY";

/// Audit durability.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// fsync the store after each record, before answering. Off trades the last ~0.5 s of
    /// records on a crash for latency.
    #[serde(default = "yes")]
    pub sync: bool,
}

fn yes() -> bool {
    true
}

impl Default for AuditSection {
    fn default() -> Self {
        Self { sync: true }
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonSection,
    pub listen: ListenerConfig,
    pub admin: ListenerConfig,
    #[serde(default)]
    pub decide: DecideSection,
    #[serde(default)]
    pub audit: AuditSection,
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Where the audit log lives: sled under `state_dir` (default) or PostgreSQL.
    #[serde(default)]
    pub store: warden_pgstate::StoreSection,
}

/// Where the configuration is read from, so a reload reads the same sources again.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub file: Option<PathBuf>,
    pub sets: Vec<String>,
}

impl Sources {
    /// Loads and validates everything (file → environment → `--set`).
    pub fn load(&self) -> Result<LoadedConfig<Config>, ConfigError> {
        let loaded: LoadedConfig<Config> =
            warden_daemon::config::load(self.file.as_deref(), EMBEDDED, ENV_PREFIX, &self.sets)?;
        validate(&loaded.value, &loaded.origin)?;
        Ok(loaded)
    }

    /// The file reloads read, for messages.
    pub fn describe(&self) -> String {
        match &self.file {
            Some(p) => p.display().to_string(),
            None => "the embedded default configuration".to_string(),
        }
    }
}

fn validate(c: &Config, origin: &Origin) -> Result<(), ConfigError> {
    c.daemon.validate(origin)?;
    ListenerConfig::validate_listen_and_admin(
        &c.listen,
        &c.admin,
        origin,
        "the admin API is for operators, Decide for the supervisor",
    )?;
    c.decide.validate(origin)?;
    c.store.validate(origin)?;
    c.policy.validate().map_err(|e| match e {
        PolicyError::EmptyMatcher { key, index } => ConfigError::invalid(
            origin,
            &format!("policy.{key}[{index}]"),
            "an empty matcher would match nothing a person meant",
        ),
        PolicyError::BadControlPath { index, why, .. } => ConfigError::invalid(
            origin,
            &format!("policy.floor.agent_control_paths[{index}]"),
            why,
        ),
        other => ConfigError::invalid(origin, "policy", other.to_string()),
    })
}

/// Convenience for tests and the bench: a configuration for sockets in `dir`.
pub fn for_dir(dir: &Path) -> Vec<String> {
    vec![
        format!("daemon.state_dir={:?}", dir.display().to_string()),
        "listen.socket=\"policy.sock\"".to_string(),
        "admin.socket=\"policy-admin.sock\"".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(sets: &[&str]) -> Result<Config, ConfigError> {
        Sources {
            file: None,
            sets: sets.iter().map(|s| s.to_string()).collect(),
        }
        .load()
        .map(|l| l.value)
    }

    #[test]
    fn agent_control_paths_are_read_and_a_bad_one_names_its_key() {
        let c = match load(&[
            r#"policy.floor.agent_control_paths=["deploy/secrets", "**/Makefile"]"#,
        ]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            c.policy.floor.agent_control_paths,
            vec!["deploy/secrets".to_string(), "**/Makefile".to_string()]
        );
        match load(&[r#"policy.floor.agent_control_paths=["ok", "/etc/shadow"]"#]) {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("policy.floor.agent_control_paths[1]"), "{e}");
                assert!(e.contains("relative to the root"), "{e}");
            }
            Ok(_) => panic!("an absolute agent-control path was accepted"),
        }
    }
}
