//! The egress proxy of a `network = "proxy"` agent: started with the agent, and reporting each
//! connection to the conversation the agent is bound to (its record, its running turn, the log).
//! Must never report to a conversation the agent is not bound to.

use std::sync::Arc;

use super::*;

/// The loopback port inside the namespace the proxy variables name (another when a mirrored
/// destination uses it).
pub(super) const PROXY_PORT: u16 = 3128;

/// Egress refusals shown to the caller per turn (every one is recorded and logged).
pub(super) const MAX_EGRESS_EVENTS: u32 = 32;

/// Where an agent's egress connections are reported: the daemon log, the egress record of the
/// conversation the agent's handler is bound to, and its running turn (its transcript; a refusal
/// as an event, and enough refusals of one destination end it). Unbound (a warm agent not taken
/// yet) there is no conversation: the proxy refuses every connection, counted by the binding as
/// an early request, so the pool never hands that agent out.
pub(super) struct EgressReport {
    binding: Arc<Binding>,
    records: crate::records::Records,
    end_after: u32,
}

impl EgressReport {
    fn core(&self) -> Option<&Arc<ConvCore>> {
        self.binding.conversation("egress connection")
    }
}

impl crate::egress::Report for EgressReport {
    fn context_id(&self) -> Option<String> {
        self.core().map(|c| c.info.context_id.clone())
    }

    fn task_id(&self) -> String {
        self.core()
            .and_then(|c| c.turn())
            .map(|t| t.input.task_id.clone())
            .unwrap_or_default()
    }

    fn connection(&self, rec: &crate::records::EgressRecord) {
        if rec.allowed {
            tracing::info!(
                context_id = %rec.context_id, task_id = %rec.task_id, agent = %rec.agent,
                host = %rec.host, port = rec.port, address = %rec.address,
                bytes_up = rec.bytes_up, bytes_down = rec.bytes_down, duration_ms = rec.duration_ms,
                setting = %rec.setting, "egress connection"
            );
        } else {
            tracing::warn!(
                context_id = %rec.context_id, task_id = %rec.task_id, agent = %rec.agent,
                host = %rec.host, port = rec.port, address = %rec.address, status = rec.status,
                reason = %rec.reason, setting = %rec.setting, "egress refused"
            );
        }
        if let Err(e) = self.records.egress(&rec.context_id, rec) {
            tracing::warn!(context_id = %rec.context_id, error = %e, "cannot record an egress connection");
        }
        let Some(turn) = self.core().and_then(|c| c.turn()) else {
            return;
        };
        turn.record(
            "egress",
            serde_json::to_value(rec).unwrap_or(serde_json::Value::Null),
        );
        if rec.allowed {
            return;
        }
        let message = crate::egress::refusal_message(rec);
        let (shown, n) = {
            let mut st = turn.lock();
            st.egress_events += 1;
            let shown = st.egress_events;
            // Refusals by the rules count; a destination that could not be reached (5xx) does
            // not end the turn.
            let n = if rec.host.is_empty() || rec.status >= 500 {
                0
            } else {
                let n = st
                    .egress_refused
                    .entry(format!("{}:{}", rec.host, rec.port))
                    .or_insert(0);
                *n += 1;
                *n
            };
            (shown, n)
        };
        // A flood of refusals is recorded and logged in full but shown to the caller only so
        // often.
        if shown <= MAX_EGRESS_EVENTS {
            turn.emit(warden_proto::v1::turn_event::Event::EgressRefused(
                warden_proto::v1::EgressRefused {
                    host: rec.host.clone(),
                    port: rec.port.into(),
                    address: rec.address.clone(),
                    message: message.clone(),
                    setting: rec.setting.clone(),
                },
            ));
        }
        if self.end_after > 0 && n == self.end_after {
            turn.request_end(crate::turn::EndRequest::Decision {
                fault: Some((
                    warden_proto::v1::FaultClass::EgressRefused,
                    format!("{message} ({n} times in this turn; limits.egress_refusals_end_turn)"),
                )),
            });
        }
    }
}

/// Starts the egress proxy of a `network = "proxy"` agent, reporting to the conversation
/// `binding` is (or will be) bound to: what the sandbox needs to reach it.
pub(super) fn start_egress(
    shared: &Shared,
    target: &Target<'_>,
    binding: &Arc<Binding>,
    cfg: &AgentConfig,
    env: &warden_sandbox::ChildEnv,
) -> Result<(crate::egress::EgressProxy, warden_sandbox::EgressSpec), StartError> {
    if shared.spawner.bwrap().is_none() {
        return Err(StartError::Spawn(format!(
            "agent {:?} has network = \"proxy\", which needs bubblewrap's network namespaces, and bubblewrap is {} (warden doctor says more); refusing rather than giving the agent the host's network",
            target.agent,
            if shared.settings().file.sandbox.bubblewrap {
                "missing or not working on this host"
            } else {
                "off ([sandbox] bubblewrap = false)"
            }
        )));
    }
    let relay = crate::config::shipped_binary("warden-egress-relay").map_err(StartError::Spawn)?;
    let allow = shared.settings().egress_allowlist(target.agent, cfg, env);
    let mirrors: Vec<std::net::SocketAddr> = allow
        .loopback_exact()
        .into_iter()
        .filter(|a| a.is_ipv4())
        .collect();
    let mut port = PROXY_PORT;
    while mirrors.iter().any(|m| m.port() == port) {
        port += 1;
    }
    let peer_uid = shared
        .spawner
        .agent_identity_for(target.spawn_id)
        .map(|i| i.uid)
        .unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    let report = Arc::new(EgressReport {
        binding: binding.clone(),
        records: shared.records.clone(),
        end_after: shared.settings().limits().egress_refusals_end_turn,
    });
    let proxy = crate::egress::EgressProxy::start(
        &shared.settings().state_dir().join("egress"),
        crate::egress::ProxyConfig {
            label: target.spawn_id.to_string(),
            agent: target.agent.to_string(),
            allow,
            peer_uid,
            max_connections: shared.settings().limits().egress_connections,
            warden: shared.settings().warden_listeners(),
        },
        report,
    )
    .map_err(StartError::Spawn)?;
    let spec = warden_sandbox::EgressSpec {
        relay,
        socket_dir: proxy.dir().to_path_buf(),
        port,
        mirrors,
        loopback_direct: crate::adapters::talks_to_itself_over_loopback(cfg),
    };
    Ok((proxy, spec))
}
