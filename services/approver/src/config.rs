//! warden-approver's configuration: the shared `[daemon]` section, the Decide listener (the
//! supervisor), the admin listener (operators), the upstream policy, the approval deadlines and the
//! web page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use warden_daemon::config::{ConfigError, DaemonSection, ListenerConfig, LoadedConfig, Origin};
use warden_decide::DecideSection;

/// The embedded default: chained to a warden-policy next to it, five minutes for a person.
pub const EMBEDDED: &str = r#"
[daemon]
state_dir = "/var/lib/warden/approver"

# PolicyService.Decide: only the supervisor's uid/gid (empty = this daemon's own uid).
[listen]
socket = "approver.sock"

# ApprovalService (list, show, answer, watch, history) and AdminService.Status: operators.
[admin]
socket = "approver-admin.sock"

[upstream]
socket = "/run/warden/policy.sock"
deadline_ms = 2000

[approval]
deadline_ms = 300000
max_pending = 1024
max_pending_per_principal = 128
max_pending_per_conversation = 32
history = 1000

[web]
bind = ""
token_file = "operator-tokens"
session_ttl_secs = 43200
hosts = []
login_failures_per_minute = 10
"#;

/// The environment prefix for overrides (`WARDEN_APPROVER__APPROVAL__DEADLINE_MS=60000`).
pub const ENV_PREFIX: &str = "WARDEN_APPROVER";

/// The policy asked first. Its ALLOW and DENY pass through; only its ESCALATE waits for a person.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// warden-policy's Decide socket (configured with `decide.return_escalations = true`).
    /// Empty: no upstream; the approver applies the boundary floor itself and every mutating
    /// call the floor does not refuse waits for a person.
    #[serde(default)]
    pub socket: PathBuf,
    /// How long the upstream may take (cut to the caller's own deadline when that is sooner).
    #[serde(default = "default_upstream_deadline")]
    pub deadline_ms: u64,
}

fn default_upstream_deadline() -> u64 {
    2000
}

/// One agent's approval settings.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentApproval {
    pub deadline_ms: u64,
}

/// How long people have, and how much is kept.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSection {
    /// A request nobody answers within this is denied (`approval.no-response`). The caller's own
    /// deadline (`decide_deadline_ms` of the supervisor) ends it sooner when it is shorter.
    pub deadline_ms: u64,
    /// Per agent name (`[approval.agents.claude] deadline_ms = 600000`).
    #[serde(default)]
    pub agents: BTreeMap<String, AgentApproval>,
    /// Most requests held at once; beyond it a new escalation is denied (`approval.queue-full`).
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Most requests one principal (the gateway's authenticated caller) may hold at once;
    /// beyond it that principal's next escalation is denied (`approval.principal-share-full`)
    /// while everyone else's are still held: one caller cannot fill the queue for the others.
    #[serde(default = "default_max_pending_per_principal")]
    pub max_pending_per_principal: usize,
    /// Most requests one conversation (a principal's context) may hold at once
    /// (`approval.conversation-share-full`): one runaway agent cannot take its principal's
    /// whole share.
    #[serde(default = "default_max_pending_per_conversation")]
    pub max_pending_per_conversation: usize,
    /// Decided requests kept for `history` (older ones are dropped).
    #[serde(default = "default_history")]
    pub history: usize,
}

fn default_max_pending() -> usize {
    1024
}
fn default_max_pending_per_principal() -> usize {
    128
}
fn default_max_pending_per_conversation() -> usize {
    32
}
fn default_history() -> usize {
    1000
}

impl ApprovalSection {
    /// The deadline for requests of `agent`.
    pub fn deadline_for(&self, agent: &str) -> u64 {
        self.agents
            .get(agent)
            .map(|a| a.deadline_ms)
            .unwrap_or(self.deadline_ms)
    }
}

/// The operators' web page.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WebSection {
    /// `127.0.0.1:7421`; empty = no web page. TLS is left to a reverse proxy.
    #[serde(default)]
    pub bind: String,
    /// Operator tokens, one `principal token` pair per line (relative to the state directory).
    #[serde(default = "default_token_file")]
    pub token_file: PathBuf,
    /// A login lasts this long.
    #[serde(default = "default_session_ttl")]
    pub session_ttl_secs: u64,
    /// Other `host:port` names the page is reached by (a reverse proxy's public name). The bound
    /// address, and `localhost:PORT` for a loopback bind, are always accepted; a request naming
    /// any other Host is refused (DNS rebinding), and a session answers only under the Host it
    /// was issued for.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Failed logins accepted per minute, all clients together; past it a login is refused with
    /// 429 until the minute has passed (the admin socket stays open to operators).
    #[serde(default = "default_login_failures")]
    pub login_failures_per_minute: u64,
}

fn default_login_failures() -> u64 {
    10
}

fn default_token_file() -> PathBuf {
    PathBuf::from("operator-tokens")
}
fn default_session_ttl() -> u64 {
    12 * 3600
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonSection,
    pub listen: ListenerConfig,
    pub admin: ListenerConfig,
    pub upstream: UpstreamSection,
    pub approval: ApprovalSection,
    /// Request limits of the approver's own floor check (used without an upstream).
    #[serde(default)]
    pub decide: DecideSection,
    pub web: WebSection,
    /// Where the queue lives: sled under `state_dir` (default) or PostgreSQL, shared by
    /// replicas.
    #[serde(default)]
    pub store: warden_pgstate::StoreSection,
}

impl Config {
    /// The upstream socket, relative paths resolved against the state directory; `None` when unset.
    pub fn upstream_socket(&self) -> Option<PathBuf> {
        let p = &self.upstream.socket;
        if p.as_os_str().is_empty() {
            None
        } else if p.is_absolute() {
            Some(p.clone())
        } else {
            Some(self.daemon.state_dir.join(p))
        }
    }

    /// How long a Decide call of `agent` may take here: the upstream's budget (with an upstream)
    /// plus the time a person has. What `PolicyService.Describe` tells the supervisor, which then
    /// waits at least this long, so its `decide_deadline_ms` need not be edited.
    pub fn decide_deadline_ms(&self, agent: Option<&str>) -> u64 {
        let person = match agent {
            Some(a) => self.approval.deadline_for(a),
            None => self.approval.deadline_ms,
        };
        let upstream = if self.upstream_socket().is_some() {
            self.upstream.deadline_ms
        } else {
            0
        };
        person.saturating_add(upstream)
    }

    /// `PolicyService.Describe`'s answer.
    pub fn description(&self) -> warden_proto::v1::PolicyDescription {
        let mut d = warden_proto::v1::PolicyDescription {
            decide_deadline_ms: self.decide_deadline_ms(None),
            agent_decide_deadline_ms: self
                .approval
                .agents
                .keys()
                .map(|a| (a.clone(), self.decide_deadline_ms(Some(a))))
                .collect(),
            implementation: "warden-approver".into(),
            ..Default::default()
        };
        // The request limits it holds a request to (the caller refuses one over them itself).
        self.decide.limits().describe(&mut d);
        d
    }

    /// The token file, relative paths resolved against the state directory.
    pub fn token_file(&self) -> PathBuf {
        if self.web.token_file.is_absolute() {
            self.web.token_file.clone()
        } else {
            self.daemon.state_dir.join(&self.web.token_file)
        }
    }
}

/// Loads and validates (file → environment → `--set`).
pub fn load(file: Option<&Path>, sets: &[String]) -> Result<LoadedConfig<Config>, ConfigError> {
    let loaded: LoadedConfig<Config> =
        warden_daemon::config::load(file, EMBEDDED, ENV_PREFIX, sets)?;
    validate(&loaded.value, &loaded.origin)?;
    Ok(loaded)
}

fn validate(c: &Config, origin: &Origin) -> Result<(), ConfigError> {
    c.daemon.validate(origin)?;
    ListenerConfig::validate_listen_and_admin(
        &c.listen,
        &c.admin,
        origin,
        "people answer on the admin socket, the supervisor asks on listen",
    )?;
    // The approver's own floor check uses warden-policy's limits: a zero there denies all.
    c.decide.validate(origin)?;
    c.store.validate(origin)?;
    // Zero values deny: a zero deadline would deny everything at once, which is never meant.
    let mut positive: Vec<(String, u64)> = vec![
        ("approval.deadline_ms".into(), c.approval.deadline_ms),
        ("upstream.deadline_ms".into(), c.upstream.deadline_ms),
        ("approval.max_pending".into(), c.approval.max_pending as u64),
        (
            "approval.max_pending_per_principal".into(),
            c.approval.max_pending_per_principal as u64,
        ),
        (
            "approval.max_pending_per_conversation".into(),
            c.approval.max_pending_per_conversation as u64,
        ),
        ("approval.history".into(), c.approval.history as u64),
        ("web.session_ttl_secs".into(), c.web.session_ttl_secs),
        (
            "web.login_failures_per_minute".into(),
            c.web.login_failures_per_minute,
        ),
    ];
    for (name, a) in &c.approval.agents {
        positive.push((format!("approval.agents.{name}.deadline_ms"), a.deadline_ms));
    }
    for (key, v) in positive {
        if v == 0 {
            return Err(ConfigError::invalid(origin, &key, "must be at least 1"));
        }
    }
    // The supervisor adopts the deadline this service describes, but never beyond the contract's
    // cap: a longer one would be cut there and people would be told a time they do not have.
    let cap = warden_proto::limits::MAX_DECIDE_DEADLINE_MS;
    let mut agents: Vec<Option<&str>> = vec![None];
    agents.extend(c.approval.agents.keys().map(|a| Some(a.as_str())));
    for agent in agents {
        let total = c.decide_deadline_ms(agent);
        if total > cap {
            let key = match agent {
                Some(a) => format!("approval.agents.{a}.deadline_ms"),
                None => "approval.deadline_ms".to_string(),
            };
            return Err(ConfigError::invalid(
                origin,
                &key,
                format!(
                    "with upstream.deadline_ms that is {total} ms, more than the {cap} ms \
                     (one hour) a supervisor waits for any decision (warden_proto::limits::\
                     MAX_DECIDE_DEADLINE_MS): people would be shown a time they do not have"
                ),
            ));
        }
    }
    if !c.web.bind.is_empty() && c.web.bind.parse::<std::net::SocketAddr>().is_err() {
        return Err(ConfigError::invalid(
            origin,
            "web.bind",
            format!("{:?} is not an address like 127.0.0.1:7421", c.web.bind),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_sets(sets: &[&str]) -> Result<Config, ConfigError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        load(None, &sets).map(|l| l.value)
    }

    #[test]
    fn per_agent_deadlines_and_zero_values_name_their_key() {
        let c = match load_sets(&["approval.agents.claude.deadline_ms=600000"]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.approval.deadline_for("claude"), 600_000);
        assert_eq!(c.approval.deadline_for("codex"), 300_000);
        for (set, key) in [
            ("approval.deadline_ms=0", "approval.deadline_ms"),
            (
                "approval.agents.codex.deadline_ms=0",
                "approval.agents.codex.deadline_ms",
            ),
            ("web.bind=\"localhost\"", "web.bind"),
            // Shared with warden-policy's check: a zero limit would deny everything.
            ("decide.max_options=0", "decide.max_options"),
            ("approval.deadlin_ms=5", "approval"),
        ] {
            match load_sets(&[set]) {
                Ok(_) => panic!("{set} was accepted"),
                Err(e) => assert!(e.to_string().contains(key), "{set}: {e}"),
            }
        }
        // Beyond the contract's cap (one hour, upstream budget included) the approver refuses to
        // start: the supervisor would cut the wait there.
        for (sets, key) in [
            (
                &["approval.deadline_ms=3600000"][..],
                "approval.deadline_ms",
            ),
            (
                &[
                    "approval.agents.claude.deadline_ms=3599000",
                    "upstream.deadline_ms=1001",
                ][..],
                "approval.agents.claude.deadline_ms",
            ),
        ] {
            match load_sets(sets) {
                Ok(_) => panic!("{sets:?} was accepted"),
                Err(e) => {
                    assert!(e.to_string().contains(key), "{sets:?}: {e}");
                    assert!(e.to_string().contains("3600000"), "{sets:?}: {e}");
                }
            }
        }
        let edge = match load_sets(&["approval.deadline_ms=3598000"]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(edge.decide_deadline_ms(None), 3_600_000);
        assert_eq!(edge.description().decide_deadline_ms, 3_600_000);
        let none = match load_sets(&["upstream.socket=\"\""]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(none.upstream_socket(), None);
        // Without an upstream nothing is asked first: the description is the person's time.
        assert_eq!(none.decide_deadline_ms(None), 300_000);
        let per_agent = match load_sets(&["approval.agents.claude.deadline_ms=600000"]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let d = per_agent.description();
        assert_eq!(d.decide_deadline_ms, 302_000);
        assert_eq!(d.agent_decide_deadline_ms.get("claude"), Some(&602_000));
    }
}
