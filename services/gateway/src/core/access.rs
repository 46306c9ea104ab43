//! Who may use which agent and workspace (`[[agents.access]]`), and the agents callers may name
//! (the supervisor's `ListAgents`): every front asks here before a conversation opens.
//!
//! Owns: the agent list and its refresh, the access rule and the refusal's wording. Must never:
//! tell a restricted caller whether an agent it may not use exists.

use std::sync::Arc;

use super::shared::{AgentAccess, AgentList, Core, KnownAgent};
use crate::auth::Identity;
use crate::error::A2aError;

impl Core {
    /// Sets who may use which agent (at start, and whole at each reload).
    pub fn set_access(&self, access: AgentAccess) {
        let next = Some(Arc::new(access));
        match self.access.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
    }

    pub(super) fn access(&self) -> Option<Arc<AgentAccess>> {
        match self.access.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether `caller` may use `agent`. Its groups are the ones its own request carried (a
    /// static token's configured groups, a JWT's claim, a certificate's mapping), never another
    /// request's of the same principal.
    pub fn may_use(&self, caller: &Identity, agent: &str) -> bool {
        self.access()
            .is_none_or(|a| a.allows(&caller.principal, &caller.groups, agent))
    }

    /// Whether `caller` is limited to some agents.
    pub(super) fn restricted(&self, caller: &Identity) -> bool {
        self.access()
            .is_some_and(|a| a.restricts_agents(&caller.principal, &caller.groups))
    }

    /// Whether `caller` may use the operator workspace `workspace` ("" = an owned sandbox,
    /// always).
    pub fn may_use_workspace(&self, caller: &Identity, workspace: &str) -> bool {
        workspace.is_empty()
            || self
                .access()
                .is_none_or(|a| a.allows_workspace(&caller.principal, &caller.groups, workspace))
    }

    /// The agents `caller` may use now (for its extended card).
    pub fn agents_for(&self, caller: &Identity) -> AgentList {
        let mut list = self.agents();
        list.agents.retain(|a| self.may_use(caller, &a.name));
        list
    }

    /// The refusal of an agent: it names only the caller's own agents, and a restricted caller
    /// is told the same whether the agent exists or not.
    pub fn refuse_agent(&self, caller: &Identity, agent: &str) -> A2aError {
        let mine: Vec<String> = self
            .agents_for(caller)
            .agents
            .into_iter()
            .map(|a| a.name)
            .collect();
        A2aError::InvalidParams(format!(
            "agent {agent:?} is not available to you; yours: {}",
            if mine.is_empty() {
                "none".to_string()
            } else {
                mine.join(", ")
            }
        ))
    }

    /// The agent a new conversation of `caller` runs: the one it asked for or the default,
    /// refused (naming only its own agents) unless it is configured and the principal may use
    /// it. Every front opens conversations through this (A2A in each binding, MCP verbs).
    pub async fn resolve_agent(
        &self,
        caller: &Identity,
        asked: Option<&str>,
    ) -> Result<String, A2aError> {
        let Some(a) = asked else {
            let default = self.agents().default;
            // The default too must be one of the caller's agents: for a restricted caller
            // "the supervisor's default" ("") is named, so it can be checked.
            if self.restricted(caller) && (default.is_empty() || !self.may_use(caller, &default)) {
                return Err(self.refuse_agent(caller, &default));
            }
            return Ok(default);
        };
        if !self
            .agents()
            .agents
            .iter()
            .any(|g| g.name == a && g.available)
        {
            // The supervisor may have been configured with it (or its adapter installed, which
            // puts it back on the card) since the list was fetched.
            if let Err(e) = self.refresh_agents().await {
                tracing::warn!(error = %e, "cannot list the supervisor's agents");
            }
        }
        let list = self.agents();
        if list.contains(a) && self.may_use(caller, a) {
            return Ok(a.to_string());
        }
        if self.restricted(caller) {
            return Err(self.refuse_agent(caller, a));
        }
        let names: Vec<&str> = list.agents.iter().map(|k| k.name.as_str()).collect();
        Err(A2aError::InvalidParams(format!(
            "unknown agent {a:?}; configured agents: {}",
            names.join(", ")
        )))
    }

    /// The agents callers may name now.
    pub fn agents(&self) -> AgentList {
        self.agents
            .read()
            .map(|a| a.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Asks the supervisor which agents it has (`ListAgents`) and takes its list. The
    /// gateway's own `agents.default`, when set, still chooses the default.
    pub async fn refresh_agents(&self) -> Result<(), tonic::Status> {
        let _one = self.refreshing.lock().await;
        let resp = self
            .supervisor()
            .list_agents(warden_proto::v1::ListAgentsRequest {})
            .await?
            .into_inner();
        let agents: Vec<KnownAgent> = resp
            .agents
            .into_iter()
            .map(|a| KnownAgent {
                name: a.name,
                description: a.description,
                available: a.unavailable.is_empty(),
            })
            .collect();
        let default = if self.settings.default_agent.is_empty() {
            resp.default_agent
        } else {
            self.settings.default_agent.clone()
        };
        let mut list = self.agents.write().unwrap_or_else(|p| p.into_inner());
        list.agent_uids = resp.agent_uids.iter().map(|r| (r.first, r.last)).collect();
        list.supervisor_uid = Some(resp.supervisor_uid);
        list.task_text_bytes = (resp.task_text_bytes > 0).then_some(resp.task_text_bytes as usize);
        if list.generation == 0 || list.agents != agents || list.default != default {
            if !agents.iter().any(|a| a.name == default) {
                tracing::warn!(default = %default, "the default agent is not one the supervisor lists");
            }
            tracing::info!(agents = agents.len(), default = %default, "agent list from the supervisor");
            list.agents = agents;
            list.default = default;
            list.generation += 1;
        }
        Ok(())
    }
}
