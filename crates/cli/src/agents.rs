//! `warden agents` (the agents a task may name, from the running supervisor's registry, and
//! whether each can start) and `warden reload` (warden-policy reads its rules again).
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

/// `warden reload`: the policy's admin `Reload`.
pub async fn reload(policy_admin: &Path) -> Result<pb::ReloadResponse, AgentsError> {
    let ch = warden_daemon::client::connect_unix(policy_admin).await?;
    Ok(AdminServiceClient::new(ch)
        .reload(pb::ReloadRequest {})
        .await?
        .into_inner())
}
