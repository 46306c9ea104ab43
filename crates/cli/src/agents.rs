//! `warden agents` (the agents a task may name, from the running supervisor's registry, and
//! whether each can start) and `warden reload` (each running daemon's admin `Reload`, what
//! SIGHUP and `systemctl reload` run: it reads its configuration again and applies what can
//! change while it runs, or changes nothing and says why).
//!
//! Must never: start an agent or change the supervisor's configuration; it only asks.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;

#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error("{0} (is warden running? `warden up`)")]
    Connect(#[from] warden_daemon::client::ConnectError),
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    #[error("no answer within {0} s")]
    Timeout(u64),
}

/// The supervisor's agents: the default one, and each enabled agent.
#[derive(Debug, Clone)]
pub struct Agents {
    pub default: String,
    pub agents: Vec<pb::AgentInfo>,
}

const WAIT: Duration = Duration::from_secs(5);

/// Asks the supervisor (`ListAgents`) on its socket.
pub async fn list(supervisor_socket: &Path) -> Result<Agents, AgentsError> {
    let ch = warden_daemon::client::connect_unix(supervisor_socket).await?;
    let r = tokio::time::timeout(
        WAIT,
        SupervisorServiceClient::new(ch).list_agents(pb::ListAgentsRequest {}),
    )
    .await
    .map_err(|_| AgentsError::Timeout(WAIT.as_secs()))??
    .into_inner();
    let mut agents = r.agents;
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Agents {
        default: r.default_agent,
        agents,
    })
}

/// One line per agent: name, default mark, ready or why it cannot start, what it runs.
pub fn lines(a: &Agents) -> Vec<String> {
    let mut out: Vec<String> = a
        .agents
        .iter()
        .flat_map(|g| {
            let l = format!(
                "{:<16} {:<9} {:<14} {}",
                g.name,
                if g.name == a.default { "default" } else { "" },
                if g.unavailable.is_empty() {
                    "ready"
                } else {
                    "CANNOT START"
                },
                g.runs
            );
            // Why not, on a line of its own under it.
            let why = (!g.unavailable.is_empty()).then(|| format!("    {}", g.unavailable));
            std::iter::once(l).chain(why)
        })
        .collect();
    if out.is_empty() {
        out.push("no agent is enabled".into());
    }
    if a.agents.iter().any(|g| !g.unavailable.is_empty()) {
        out.push(
            "an agent that cannot start is left off the agent card; a task naming it fails".into(),
        );
    }
    out
}

pub fn json(a: &Agents) -> Value {
    json!({
        "default": a.default,
        "agents": a.agents.iter().map(|g| json!({
            "name": g.name,
            "description": g.description,
            "default": g.name == a.default,
            "canStart": g.unavailable.is_empty(),
            "unavailable": g.unavailable,
            "runs": g.runs,
        })).collect::<Vec<_>>(),
    })
}

/// One daemon's admin `Reload` on `socket`.
pub async fn reload(socket: &Path) -> Result<pb::ReloadResponse, AgentsError> {
    let ch = warden_daemon::client::connect_unix(socket).await?;
    Ok(tokio::time::timeout(
        WAIT,
        AdminServiceClient::new(ch).reload(pb::ReloadRequest {}),
    )
    .await
    .map_err(|_| AgentsError::Timeout(WAIT.as_secs()))??
    .into_inner())
}

/// `warden reload`: every daemon of the deployment whose admin socket is there, in start order
/// (daemon name, its answer or why it could not be asked). A daemon not running is left out.
pub async fn reload_all(
    l: &crate::layout::Layout,
) -> Vec<(&'static str, Result<pb::ReloadResponse, AgentsError>)> {
    let mut out = Vec::new();
    for (name, socket) in [
        ("policy", l.policy_admin_socket()),
        ("approver", l.approver_admin_socket()),
        ("supervisor", l.socket_of("supervisor")),
        ("gateway", l.socket_of("gateway")),
    ] {
        if !socket.exists() {
            continue;
        }
        out.push((name, reload(&socket).await));
    }
    out
}
