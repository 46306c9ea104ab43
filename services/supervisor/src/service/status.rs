//! The supervisor's status: conversations, agents, pools and the decision deadline, for
//! `AdminService.Status` and `warden status`.
//!
//! Owns: the status details. Must never: block on a conversation's turn.

use super::*;

impl Supervisor {
    /// The Decide deadlines this supervisor uses now (`warden doctor` compares them with the
    /// approver's): `decide_deadline_ms.own` (the setting), `decide_deadline_ms.described` (what
    /// the policy service asks for; `none` when it did not say), `decide_deadline_ms.effective`,
    /// and `decide_deadline_ms.effective.<agent>` for each configured agent.
    pub(super) async fn deadline_details(&self) -> HashMap<String, String> {
        let settings = self.shared.settings();
        let s = &*settings;
        let policy = &self.shared.policy;
        let mut out = HashMap::new();
        let own = std::time::Duration::from_millis(s.file.policy.decide_deadline_ms);
        let d = policy.effective_deadline(own, "").await;
        out.insert("decide_deadline_ms.own".into(), ms(d.own));
        out.insert(
            "decide_deadline_ms.described".into(),
            d.described.map(ms).unwrap_or_else(|| "none".into()),
        );
        out.insert("decide_deadline_ms.effective".into(), ms(d.effective));
        if let Some(desc) = policy.description().await {
            out.insert(
                "policy_implementation".into(),
                if desc.implementation.is_empty() {
                    "unnamed".into()
                } else {
                    desc.implementation
                },
            );
        }
        for (name, cfg) in &s.agents {
            let d = policy
                .effective_deadline(s.decide_deadline(cfg), name)
                .await;
            out.insert(
                format!("decide_deadline_ms.effective.{name}"),
                ms(d.effective),
            );
        }
        out
    }

    pub(super) fn status(&self, count: usize) -> pb::StatusResponse {
        let mut details = HashMap::new();
        details.insert("conversations".to_string(), count.to_string());
        // `warden doctor`: which installed adapter each entry runs, or how to install it.
        for (name, cfg) in &self.shared.settings().agents {
            if let Some(found) = self.shared.settings().adapter(cfg) {
                let v = match found {
                    Ok(a) => format!("{} at {}", cfg.adapter, a.entry.display()),
                    Err(e) => format!("MISSING {e}"),
                };
                details.insert(format!("adapter.{name}"), v);
            }
        }
        details.insert(
            "live_agents".to_string(),
            self.shared.live.live().to_string(),
        );
        details.insert(
            "max_live_agents".to_string(),
            self.shared.live.cap().to_string(),
        );
        // Warm agents (counted among live_agents too) and each pool's figures.
        details.insert(
            "pooled_agents".to_string(),
            self.shared.live.pooled().to_string(),
        );
        details.extend(self.pool.figures());
        // Turns holding their slot and waiting for a live agent (all busy), and how many
        // principals they are of.
        let (agent_waiters, agent_waiting_principals) = self.shared.live.waiting();
        details.insert("turns_waiting_agent".to_string(), agent_waiters.to_string());
        details.insert(
            "principals_waiting_agent".to_string(),
            agent_waiting_principals.to_string(),
        );
        let limits = self.shared.settings().limits().clone();
        details.insert(
            "capacity_wait_ms".to_string(),
            limits.capacity_wait_ms.to_string(),
        );
        details.insert(
            "max_agent_waiters".to_string(),
            limits.max_agent_waiters.to_string(),
        );
        let (running, waiting, cap) = self.shared.admission.figures();
        details.insert("turns_running".to_string(), running.to_string());
        details.insert("turns_waiting_admission".to_string(), waiting.to_string());
        details.insert(
            "principals_waiting_admission".to_string(),
            self.shared.admission.principals_waiting().to_string(),
        );
        details.insert("max_active_turns".to_string(), cap.to_string());
        details.insert(
            "max_active_turns_per_principal".to_string(),
            self.shared.admission.share().to_string(),
        );
        let (starting, starts_waiting, starts_cap) = self.shared.starts.figures();
        details.insert("agents_starting".to_string(), starting.to_string());
        details.insert("starts_waiting".to_string(), starts_waiting.to_string());
        details.insert("max_starting_agents".to_string(), starts_cap.to_string());
        details.insert(
            "max_starting_agents_per_principal".to_string(),
            self.shared.starts.share().to_string(),
        );
        details.insert(
            "max_open_conversations_per_principal".to_string(),
            self.shared
                .settings()
                .max_open_conversations_per_principal()
                .to_string(),
        );
        details.insert(
            "policy_failures".to_string(),
            self.shared.policy.failures().to_string(),
        );
        let ((h50, h99), (d50, d99), total) = self.shared.policy.figures();
        details.insert("permissions".to_string(), total.to_string());
        details.insert("permission_handler_p50_us".to_string(), h50.to_string());
        details.insert("permission_handler_p99_us".to_string(), h99.to_string());
        details.insert("decide_p50_us".to_string(), d50.to_string());
        details.insert("decide_p99_us".to_string(), d99.to_string());
        details.insert(
            "bubblewrap".to_string(),
            self.shared.spawner.bwrap().is_some().to_string(),
        );
        details.insert(
            "cgroup".to_string(),
            self.shared.spawner.cgroups().is_some().to_string(),
        );
        // Where the principals' CPU groups are ("off" without them): `sandbox.cpu_share`.
        details.insert(
            "cpu_share".to_string(),
            self.shared
                .cpu
                .as_ref()
                .map_or_else(|| "off".to_string(), |c| c.root().display().to_string()),
        );
        details.insert(
            "cpu_share_groups".to_string(),
            self.shared
                .cpu
                .as_ref()
                .map_or(0, |c| c.groups())
                .to_string(),
        );
        // The uid agents run as: switched, or the supervisor's own ("self").
        details.insert(
            "agent_uid".to_string(),
            match self.shared.spawner.agent_identity() {
                Some(i) => i.uid.to_string(),
                None if !self
                    .shared
                    .settings()
                    .file
                    .sandbox
                    .agent_uid_range
                    .is_empty() =>
                {
                    "per-conversation".to_string()
                }
                None => "self".to_string(),
            },
        );
        warden_daemon::status::response(
            "warden-supervisor",
            self.started,
            self.listeners.lock().map(|l| l.clone()).unwrap_or_default(),
            details,
        )
    }
}

fn ms(d: std::time::Duration) -> String {
    d.as_millis().to_string()
}
