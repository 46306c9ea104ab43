//! The daemon-wide context every conversation shares: the settings, the policy client, the
//! records, the sandbox's allocators (owned roots, workspaces, agent homes) and the spawner.
//!
//! Must never: hold per-conversation state, or know about conversations at all (it sits below
//! them in the crate's layers).

use crate::config::Settings;
use crate::live::LiveAgents;
use crate::policy::PolicyClient;
use crate::records::Records;

/// What every conversation shares.
pub struct Shared {
    /// The settings in force: replaced whole by a reload ([`Shared::reload_settings`]), so
    /// whoever read them holds one version; read them with [`Shared::settings`].
    pub settings: std::sync::RwLock<std::sync::Arc<Settings>>,
    /// SIGHUP and the admin `Reload` (the daemon's, `warden_daemon::reload`).
    pub reloads: warden_daemon::reload::Reloads,
    pub policy: PolicyClient,
    pub records: Records,
    pub roots: warden_sandbox::OwnedRoots,
    pub workspaces: warden_sandbox::WorkspacePolicy,
    pub spawner: warden_sandbox::Spawner,
    pub depth: warden_sandbox::DepthGuard,
    /// Per-conversation agent homes (fresh copies of each agent's template).
    pub homes: warden_sandbox::AgentHomes,
    /// The live-agent slots (limits.max_live_agents).
    pub live: LiveAgents,
    /// The turn slots (limits.max_active_turns).
    pub admission: crate::admission::Admission,
    /// The agent-start slots (limits.max_starting_agents, at most
    /// limits.max_starting_agents_per_principal of one principal), waited for in the fair order.
    pub starts: crate::admission::Admission,
    /// True once a predecessor's leftover trees are reaped (start-up reaps in the background;
    /// agent starts wait for it).
    pub reaped: tokio::sync::watch::Receiver<bool>,
    /// One CPU group per principal with agents running, of equal weight (`sandbox.cpu_share`;
    /// none where the host has no writable `cpu` hierarchy of its own).
    pub cpu: Option<std::sync::Arc<warden_sandbox::CpuShares>>,
    /// Each principal's share of this daemon's poll time (`warden-fairshare`): opening a
    /// conversation (its agent's start) runs as its principal's work, so one principal's burst
    /// of new contexts is polled no more than another's one. (The conversation's long-lived
    /// worker is not wrapped: see the gateway's turn driver in `core/admit.rs`.)
    pub fair: std::sync::Arc<warden_fairshare::Scheduler>,
}

impl Shared {
    /// A place in `principal`'s CPU group for a process about to be spawned; `None` (and a
    /// warning) when there are no groups or this one cannot be made: the process then shares
    /// the CPU as any process does, and is contained all the same.
    pub fn cpu_group(&self, principal: &str) -> Option<std::sync::Arc<warden_sandbox::CpuGroup>> {
        let shares = self.cpu.as_ref()?;
        match shares.join(principal) {
            Ok(g) => Some(std::sync::Arc::new(g)),
            Err(e) => {
                tracing::warn!(error = %e, "no CPU group for this principal's process");
                None
            }
        }
    }

    /// The settings in force now. A conversation, an agent start or a turn reads them when it
    /// begins; what it began with stays its own.
    pub fn settings(&self) -> std::sync::Arc<Settings> {
        match self.settings.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Puts `next` in force (already checked whole: `config::reloadable`).
    pub fn reload_settings(&self, next: Settings) {
        let next = std::sync::Arc::new(next);
        match self.settings.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
    }
}
