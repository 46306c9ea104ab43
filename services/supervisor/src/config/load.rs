//! Loading and reloading: the file and `--set` overrides read over the embedded default, the
//! agents merged with the built-ins, every value checked; on reload, what may change while
//! running and what needs a restart.
//!
//! Owns: turning a file into checked [`Settings`]. Must never: act on a setting.

use super::*;

/// Loads and validates.
/// What a reload (SIGHUP, `warden reload`) puts in force, out of `next` (a configuration
/// that loaded and validated whole): the agents (their programs, models, environment, pool
/// sizes; a new conversation or agent start gets them, a running one keeps what it started
/// with, and a warm agent of an agent's old settings is discarded at its take), the operator
/// workspaces, the adapters, the egress rules of agents started from now on, and the limits
/// read as they are used (timeouts, graces, per-turn quotas, sizes). Kept from `running`,
/// because the daemon built its structures from them at start: `[daemon]`, the listeners,
/// `[policy]`, `[sandbox]`, `[runtime]`, `[cell]`, and the capacity limits (`max_live_agents`,
/// `max_active_turns`, `max_active_turns_per_principal`, `max_agent_waiters`,
/// `max_starting_agents`, `max_starting_agents_per_principal`, `max_conversations`,
/// `transcript_bytes`). Returns the settings to
/// put in force and the names of the kept ones whose value `next` changed (they need a
/// restart).
pub fn reloadable(running: &Settings, next: Settings) -> (Settings, Vec<&'static str>) {
    let mut out = next;
    let mut kept = Vec::new();
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    macro_rules! keep {
        ($($field:ident).+, $name:expr) => {
            if differs(&running.$($field).+, &out.$($field).+) {
                kept.push($name);
            }
            out.$($field).+ = running.$($field).+.clone();
        };
    }
    keep!(file.daemon, "daemon");
    keep!(file.listen, "listen");
    keep!(file.listen_remote, "listen_remote");
    keep!(file.policy, "policy");
    keep!(file.sandbox, "sandbox");
    keep!(file.runtime, "runtime");
    keep!(file.cell, "cell");
    keep!(file.limits.max_live_agents, "limits.max_live_agents");
    keep!(file.limits.max_active_turns, "limits.max_active_turns");
    keep!(
        file.limits.max_active_turns_per_principal,
        "limits.max_active_turns_per_principal"
    );
    keep!(file.limits.max_agent_waiters, "limits.max_agent_waiters");
    keep!(
        file.limits.max_starting_agents,
        "limits.max_starting_agents"
    );
    keep!(
        file.limits.max_starting_agents_per_principal,
        "limits.max_starting_agents_per_principal"
    );
    keep!(file.limits.max_conversations, "limits.max_conversations");
    keep!(file.limits.transcript_bytes, "limits.transcript_bytes");
    (out, kept)
}

pub fn load(file: Option<&Path>, sets: &[String]) -> Result<Settings, ConfigError> {
    let loaded = warden_daemon::config::load::<SupervisorConfig>(
        file,
        EMBEDDED_DEFAULT,
        "WARDEN_SUPERVISOR",
        sets,
    )?;
    let origin = loaded.origin;
    let cfg = loaded.value;
    cfg.daemon.validate(&origin)?;
    cfg.listen.validate(&origin, "listen")?;
    if let Some(remote) = &cfg.listen_remote {
        if remote.tcp.is_none() || remote.tls.is_none() {
            return Err(ConfigError::invalid(
                &origin,
                "listen_remote",
                "the remote listener is `tcp` with `tls` (mutual TLS); same-host callers use `listen`",
            ));
        }
        remote.validate(&origin, "listen_remote")?;
    }
    if let Some(cell) = &cfg.cell {
        cell.validate(&origin, cfg.listen_remote.is_some())?;
    }
    if cfg.policy.socket.as_os_str().is_empty() {
        return Err(ConfigError::invalid(
            &origin,
            "policy.socket",
            "must not be empty",
        ));
    }
    for (i, p) in cfg.policy.failover_sockets.iter().enumerate() {
        if p.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                &origin,
                &format!("policy.failover_sockets[{i}]"),
                "must not be empty",
            ));
        }
    }
    if cfg.policy.failover_sockets.len() > 16 {
        return Err(ConfigError::invalid(
            &origin,
            "policy.failover_sockets",
            "at most 16 replicas",
        ));
    }
    if cfg.policy.decide_deadline_ms == 0 {
        return Err(ConfigError::invalid(
            &origin,
            "policy.decide_deadline_ms",
            "must be > 0",
        ));
    }
    if !(0..=19).contains(&cfg.sandbox.agent_nice) {
        return Err(ConfigError::invalid(
            &origin,
            "sandbox.agent_nice",
            "must be 0..=19 (an agent may be given less CPU than the daemons, never more)",
        ));
    }
    let l = &cfg.limits;
    for (key, v) in [
        ("limits.task_text_bytes", l.task_text_bytes as u64),
        ("limits.turn_timeout_secs", l.turn_timeout_secs),
        ("limits.output_bytes", l.output_bytes as u64),
        ("limits.transcript_bytes", l.transcript_bytes as u64),
        ("limits.handshake_deadline_ms", l.handshake_deadline_ms),
        ("limits.egress_connections", l.egress_connections as u64),
        (
            "limits.agent_requests_in_flight",
            l.agent_requests_in_flight as u64,
        ),
        ("limits.agent_queue_bytes", l.agent_queue_bytes as u64),
        ("limits.agent_requests_bytes", l.agent_requests_bytes as u64),
        ("limits.max_terminals", l.max_terminals as u64),
        (
            "limits.max_open_conversations_per_principal",
            l.max_open_conversations_per_principal.unwrap_or(1) as u64,
        ),
        (
            "limits.terminal_output_bytes",
            l.terminal_output_bytes as u64,
        ),
    ] {
        if v == 0 {
            return Err(ConfigError::invalid(&origin, key, "must be > 0"));
        }
    }
    for l in &cfg.egress.warden_listeners {
        if l.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                &origin,
                "egress.warden_listeners",
                format!("{l:?} is not an address like 127.0.0.1:8080"),
            ));
        }
    }
    let mut agents = builtin_agents();
    for (name, table) in &cfg.agents.entries {
        let key = format!("agents.{name}");
        let mut merged = match agents.get(name) {
            Some(builtin) => match toml::Value::try_from(builtin) {
                Ok(toml::Value::Table(t)) => t,
                _ => toml::Table::new(),
            },
            None => toml::Table::new(),
        };
        for (k, v) in table {
            merged.insert(k.clone(), v.clone());
        }
        let a: AgentConfig =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    ConfigError::invalid(&origin, &key, e.to_string().trim().replace('\n', " "))
                })?;
        let a = &a;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}"),
                "agent names are letters, digits, '-' and '_'",
            ));
        }
        if a.command.is_empty() && a.adapter.is_empty() && name != "scripted" {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.command"),
                "must name the program to run",
            ));
        }
        agents.insert(name.clone(), a.clone());
    }
    if !agents.contains_key(&cfg.agents.default) {
        return Err(ConfigError::invalid(
            &origin,
            "agents.default",
            format!("no agent named {:?}", cfg.agents.default),
        ));
    }
    for (name, a) in &agents {
        for (i, e) in a.egress_allow.iter().enumerate() {
            if let Err(err) = warden_egress::AllowEntry::parse(e) {
                return Err(ConfigError::invalid(
                    &origin,
                    &format!("agents.{name}.egress_allow[{i}]"),
                    err.to_string(),
                ));
            }
        }
        if a.home.as_ref().is_some_and(|h| !h.is_absolute()) {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.home"),
                "must be an absolute path (the template of the agent's home)",
            ));
        }
    }
    for (name, a) in &agents {
        if a.pool_size > MAX_POOL_SIZE {
            return Err(ConfigError::invalid(
                &origin,
                &format!("agents.{name}.pool_size"),
                format!("must be at most {MAX_POOL_SIZE}"),
            ));
        }
    }
    let pooled: usize = agents
        .values()
        .filter(|a| a.enabled)
        .map(|a| a.pool_size)
        .sum();
    if cfg.limits.max_live_agents > 0 && pooled > cfg.limits.max_live_agents {
        return Err(ConfigError::invalid(
            &origin,
            "limits.max_live_agents",
            format!(
                "is {} but the agents' pool_size add up to {pooled}: warm agents are live agents",
                cfg.limits.max_live_agents
            ),
        ));
    }
    for (name, w) in &cfg.workspaces {
        if !w.path.is_absolute() {
            return Err(ConfigError::invalid(
                &origin,
                &format!("workspaces.{name}.path"),
                "must be an absolute path",
            ));
        }
    }
    Ok(Settings {
        file: cfg,
        agents,
        origin,
    })
}
