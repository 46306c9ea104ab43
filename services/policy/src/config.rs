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
max_title_bytes = 65536
max_json_depth = 64
return_escalations = false

[audit]
sync = true
# Retention: records older than this many days are removed (0 = kept forever) ...
retain_days = 90
# ... and the oldest beyond the newest this many (0 = no bound). Every record is at most about
# 33 KiB of text (services/policy/README.md, "Audit records"); a usual one is under 1 KiB.
max_records = 1000000
# How often retention runs.
prune_interval_ms = 60000

[policy.global]
mode = "approve-all"
non_interactive = "deny"
"#;

/// The environment prefix for overrides (`WARDEN_POLICY__POLICY__GLOBAL__MODE=deny-all`).
pub const ENV_PREFIX: &str = "WARDEN_POLICY";

/// Audit durability and retention.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// fsync the store after each record, before answering. Off trades the last ~0.5 s of
    /// records on a crash for latency.
    #[serde(default = "yes")]
    pub sync: bool,
    /// Records decided more than this many days ago are removed (0 = kept forever).
    #[serde(default = "default_retain_days")]
    pub retain_days: u64,
    /// At most this many records are kept, the oldest removed first (0 = no bound).
    #[serde(default = "default_max_records")]
    pub max_records: u64,
    /// How often retention runs, in milliseconds.
    #[serde(default = "default_prune_interval_ms")]
    pub prune_interval_ms: u64,
}

fn yes() -> bool {
    true
}
fn default_retain_days() -> u64 {
    90
}
fn default_max_records() -> u64 {
    1_000_000
}
fn default_prune_interval_ms() -> u64 {
    60_000
}

impl Default for AuditSection {
    fn default() -> Self {
        Self {
            sync: true,
            retain_days: default_retain_days(),
            max_records: default_max_records(),
            prune_interval_ms: default_prune_interval_ms(),
        }
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
    if c.audit.prune_interval_ms < 100 {
        return Err(ConfigError::invalid(
            origin,
            "audit.prune_interval_ms",
            "must be at least 100 (retention would keep the store busy)",
        ));
    }
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
