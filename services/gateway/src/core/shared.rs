//! The handle every step of a task works through: [`Core`] (the store, the supervisor client,
//! the tasks followed here, the context guards, the agents, push, cells, stream shares), its
//! settings, and the small reads of it every module shares.
//!
//! Owns: what the core holds. Must never: carry a step of a task's life itself (each step is a
//! module of `core/`, in the order a task goes through them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;

use super::live::{LiveTask, Subscription};
use crate::error::A2aError;
use crate::push::Push;
use crate::store::{TaskStore, TaskStoreError};

/// Settings of the task core.
#[derive(Debug, Clone)]
pub struct CoreSettings {
    /// Configured agent names; the first is not special, `default_agent` is.
    pub agents: Vec<String>,
    pub default_agent: String,
    pub turn_timeout_seconds: u32,
    pub cancel_grace: Duration,
    pub coalesce_bytes: usize,
    pub retention: Retention,
    /// Streams one principal holds open at once (`http.max_streams_per_principal`).
    pub max_streams_per_principal: usize,
    /// How often a silent stream hears something (`http.stream_keepalive_ms`).
    pub stream_keepalive: Duration,
}

/// What the store keeps and when conversations end (`[store]`).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Terminal tasks older than this (since their last status) are deleted.
    pub task_retention: Duration,
    /// Stored tasks per principal; beyond it the oldest terminal ones are deleted.
    pub max_tasks: usize,
    /// A context idle this long after its last task ended is closed at the supervisor.
    pub conversation_ttl: Option<Duration>,
    pub sweep_interval: Duration,
}

impl Retention {
    pub fn from_config(s: &crate::config::StoreSection) -> Self {
        Self {
            task_retention: Duration::from_secs(s.task_retention_seconds),
            max_tasks: s.max_tasks,
            conversation_ttl: (s.conversation_ttl_seconds > 0)
                .then(|| Duration::from_secs(s.conversation_ttl_seconds)),
            sweep_interval: Duration::from_millis(s.sweep_interval_ms),
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self::from_config(&crate::config::StoreSection::default())
    }
}

/// One agent a caller may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownAgent {
    pub name: String,
    pub description: String,
    /// False when the supervisor says it cannot start (adapter or program missing): the card
    /// leaves it off.
    pub available: bool,
}

/// The agents callers may name: the configured list until the supervisor has answered
/// `ListAgents`, then the supervisor's (its registry is the one source of names).
#[derive(Debug, Clone, Default)]
pub struct AgentList {
    pub agents: Vec<KnownAgent>,
    /// Used when a message names no agent ("" = the supervisor's own default).
    pub default: String,
    /// Changes whenever the list does (0 = the configured list), so the card is rebuilt then.
    pub generation: u64,
    /// The uids the supervisor runs agents as (inclusive ranges) and its own uid, from
    /// `ListAgents`: a caller connecting as one of them is inside a warden-run agent.
    pub agent_uids: Vec<(u32, u32)>,
    pub supervisor_uid: Option<u32>,
    /// The supervisor's task text limit (`ListAgents`; None until it answered): a longer text
    /// is refused before anything of the request is stored.
    pub task_text_bytes: Option<usize>,
}

impl AgentList {
    pub fn contains(&self, name: &str) -> bool {
        self.agents.iter().any(|a| a.name == name)
    }

    /// Whether a connection owned by `uid` comes from inside a warden-run agent: one of the
    /// agent uids, or the supervisor's (its egress proxy connects for agents). This gateway's own
    /// uid never counts: where agents cannot be switched to a uid of their own (an unprivileged
    /// `warden up`), they are told apart by their sandbox, not here.
    pub fn is_agent_uid(&self, uid: u32, own_uid: u32) -> bool {
        uid != own_uid
            && (self.supervisor_uid == Some(uid)
                || self
                    .agent_uids
                    .iter()
                    .any(|(a, b)| (*a..=*b).contains(&uid)))
    }
}

/// Which agents and workspaces each principal may use (`[[agents.access]]`): the one rule every
/// front asks, through [`Core::may_use`], [`Core::may_use_workspace`] and [`Core::resolve_agent`].
/// A principal's own entry decides for it; without one, the entries of its groups do (it may
/// use what any of them allows); with neither, or an entry without a list, every one.
#[derive(Debug, Clone, Default)]
pub struct AgentAccess {
    by_principal: HashMap<String, crate::config::AgentAccessEntry>,
    by_group: HashMap<String, crate::config::AgentAccessEntry>,
}

impl AgentAccess {
    pub fn from_config(entries: &[crate::config::AgentAccessEntry]) -> Self {
        let mut me = Self::default();
        for e in entries {
            match &e.group {
                Some(g) => me.by_group.insert(g.clone(), e.clone()),
                None => me.by_principal.insert(e.principal.clone(), e.clone()),
            };
        }
        me
    }

    /// The entries that decide for `principal` (member of `groups`).
    fn entries(&self, principal: &str, groups: &[String]) -> Vec<&crate::config::AgentAccessEntry> {
        match self.by_principal.get(principal) {
            Some(e) => vec![e],
            None => groups.iter().filter_map(|g| self.by_group.get(g)).collect(),
        }
    }

    pub fn allows(&self, principal: &str, groups: &[String], agent: &str) -> bool {
        let es = self.entries(principal, groups);
        es.is_empty()
            || es.iter().any(|e| {
                e.agents
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|a| a == agent))
            })
    }

    pub fn allows_workspace(&self, principal: &str, groups: &[String], workspace: &str) -> bool {
        let es = self.entries(principal, groups);
        es.is_empty()
            || es.iter().any(|e| {
                e.workspaces
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|w| w == workspace))
            })
    }

    /// Whether `principal` is limited to some agents.
    pub(super) fn restricts_agents(&self, principal: &str, groups: &[String]) -> bool {
        let es = self.entries(principal, groups);
        !es.is_empty() && es.iter().all(|e| e.agents.is_some())
    }
}

pub(super) fn store_err(e: TaskStoreError) -> A2aError {
    tracing::error!(error = %e, "task store failure");
    A2aError::Internal(format!("task store failure: {e}"))
}

/// The task core shared by every HTTP handler.
pub struct Core {
    pub(super) store: TaskStore,
    pub(super) supervisor: SupervisorServiceClient<Channel>,
    pub(super) live: Mutex<HashMap<String, Arc<LiveTask>>>,
    pub(super) settings: CoreSettings,
    /// Held for every read-modify-write of a context record, and by the sweep when it forgets
    /// one, so ownership is decided once: two principals cannot both create a context, and a
    /// context is never forgotten between a task's ownership check and its write.
    pub(super) contexts_guard: tokio::sync::Mutex<()>,
    /// Contexts whose conversation the sweep is closing right now; a task starting in one waits
    /// on its gate before RunTurn, so the close never ends the new task's conversation.
    pub(super) closing: Closing,
    pub(super) agents: std::sync::RwLock<AgentList>,
    /// One `ListAgents` at a time: callers naming unknown agents at once share one refresh.
    pub(super) refreshing: tokio::sync::Mutex<()>,
    /// Push notifications, once the daemon has set them up ([`Core::set_push`]).
    pub(super) push: std::sync::OnceLock<Arc<Push>>,
    /// Per-principal agent access ([`Core::set_access`]; unset: everyone may use every agent).
    /// Who may use which agent; replaced whole by a reload (SIGHUP), so a request reads one
    /// version.
    pub(super) access: std::sync::RwLock<Option<Arc<AgentAccess>>>,
    /// Streams open per principal, over every front.
    pub(super) streams: Arc<crate::shares::StreamShares>,
    /// `[cells]` mode ([`Core::set_cells`]): each context's turns go to its cell.
    pub(super) cells: std::sync::OnceLock<Arc<crate::cells::Cells>>,
}

impl Core {
    pub fn new(store: TaskStore, channel: Channel, settings: CoreSettings) -> Arc<Self> {
        let agents = AgentList {
            agents: settings
                .agents
                .iter()
                .map(|n| KnownAgent {
                    name: n.clone(),
                    description: String::new(),
                    available: true,
                })
                .collect(),
            default: settings.default_agent.clone(),
            generation: 0,
            agent_uids: Vec::new(),
            supervisor_uid: None,
            task_text_bytes: None,
        };
        Arc::new(Self {
            store,
            supervisor: SupervisorServiceClient::new(channel),
            live: Mutex::new(HashMap::new()),
            contexts_guard: tokio::sync::Mutex::new(()),
            closing: Closing::default(),
            agents: std::sync::RwLock::new(agents),
            refreshing: tokio::sync::Mutex::new(()),
            push: std::sync::OnceLock::new(),
            access: std::sync::RwLock::new(None),
            streams: crate::shares::StreamShares::new(settings.max_streams_per_principal),
            settings,
            cells: std::sync::OnceLock::new(),
        })
    }

    /// The per-principal stream shares (the MCP front takes its permits here too).
    pub fn streams(&self) -> &Arc<crate::shares::StreamShares> {
        &self.streams
    }

    /// How often a silent stream hears something.
    pub fn stream_keepalive(&self) -> Duration {
        self.settings.stream_keepalive
    }

    /// `sub` holding `permit` and the configured keep-alive.
    pub(super) fn held(
        &self,
        mut sub: Subscription,
        permit: crate::shares::StreamPermit,
    ) -> Subscription {
        sub.permit = Some(permit);
        sub.keepalive = self.settings.stream_keepalive;
        sub
    }

    pub fn store(&self) -> &TaskStore {
        &self.store
    }

    /// How many tasks this process is following.
    pub fn live_count(&self) -> usize {
        self.live.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub(super) fn live(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock().ok().and_then(|m| m.get(id).cloned())
    }
}

/// Contexts whose conversation the sweep is closing right now, each with a gate the close holds:
/// a task starting in one waits on its gate ([`Closing::wait`]) before RunTurn, so the close
/// never ends the new task's conversation.
#[derive(Default)]
pub(super) struct Closing(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Closing {
    /// Waits until no close of `context_id` is under way.
    pub(super) async fn wait(&self, context_id: &str) {
        let gate = self.0.lock().ok().and_then(|m| m.get(context_id).cloned());
        if let Some(gate) = gate {
            let _ = gate.lock().await;
        }
    }

    /// Registers a close of `context_id`, its gate held until the returned guard drops (on
    /// every path out of the close, an error included: a close that forgot to end would keep
    /// every later sweep away from the context); `None` when a close of it is under way.
    pub(super) async fn begin<'a>(&'a self, context_id: &str) -> Option<ClosingGuard<'a>> {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let held = gate.clone().lock_owned().await;
        let mut m = self.0.lock().ok()?;
        if m.contains_key(context_id) {
            return None;
        }
        m.insert(context_id.to_string(), gate);
        Some(ClosingGuard {
            closing: self,
            context_id: context_id.to_string(),
            _held: held,
        })
    }
}

/// A close under way: dropping it ends the close (the context leaves the map, then its gate is
/// released to the tasks waiting on it).
pub(super) struct ClosingGuard<'a> {
    closing: &'a Closing,
    context_id: String,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for ClosingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.closing.0.lock() {
            m.remove(&self.context_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AgentAccess;
    use crate::config::AgentAccessEntry;

    fn entry(principal: &str, group: Option<&str>, agents: Option<&[&str]>) -> AgentAccessEntry {
        AgentAccessEntry {
            principal: principal.into(),
            group: group.map(str::to_string),
            agents: agents.map(|l| l.iter().map(|s| s.to_string()).collect()),
            workspaces: None,
        }
    }

    #[test]
    fn a_principal_entry_decides_else_its_groups_together_else_everything() {
        let a = AgentAccess::from_config(&[
            entry("", Some("interns"), Some(&["claude"])),
            entry("", Some("reviewers"), Some(&["codex"])),
            entry("", Some("admins"), None),
            entry("alice", None, Some(&["gemini"])),
        ]);
        let g = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Own entry wins over any group.
        assert!(a.allows("alice", &g(&["admins"]), "gemini"));
        assert!(!a.allows("alice", &g(&["admins"]), "claude"));
        // One group: its list.
        assert!(a.allows("bob", &g(&["interns"]), "claude"));
        assert!(!a.allows("bob", &g(&["interns"]), "codex"));
        assert!(a.restricts_agents("bob", &g(&["interns"])));
        // Several groups: any of them.
        assert!(a.allows("carol", &g(&["interns", "reviewers"]), "codex"));
        assert!(!a.allows("carol", &g(&["interns", "reviewers"]), "gemini"));
        // A group without a list, or no entry at all: every agent.
        assert!(a.allows("dave", &g(&["interns", "admins"]), "gemini"));
        assert!(!a.restricts_agents("dave", &g(&["interns", "admins"])));
        assert!(a.allows("erin", &g(&["unlisted"]), "anything"));
        assert!(!a.restricts_agents("erin", &[]));
    }
}
