//! Starting a conversation's agent: the process started (or restarted after an idle stop), its
//! session adopted, and the options the agent's config asks for (mode, model, plan) applied.
//!
//! Owns: the steps from no agent to a session ready for a turn. Must never: run a turn, or keep
//! a half-started agent (a failed start kills what it started).

use super::*;

impl Conversation {
    /// Spawns the agent and makes a session: `session/load` of the last one when `resume` and
    /// the agent supports it, else `session/new` (the bool is true when context was reset).
    /// For `turn` the live-agent slot is waited for in the queue (see `live`); for an open it is
    /// taken only when free.
    pub(super) async fn start_agent(
        &self,
        resume: bool,
        turn: Option<&TurnCtx>,
    ) -> Result<(AgentProc, bool), StartError> {
        let wait = match turn {
            Some(turn) => crate::agent::SlotWait::Turn {
                turn,
                principal: &self.core.info.principal,
            },
            None => crate::agent::SlotWait::Open,
        };
        // The live slot before the start slot: a start waiting for an agent must not hold one
        // of the few start slots the agents it waits for may need.
        let slot = crate::agent::live_slot(&self.shared, &self.core.info.context_id, wait).await?;
        // One of `limits.max_starting_agents` slots from spawn to the end of the handshake: a
        // crowd of starts (hundreds of new contexts at once) must not eat each other's
        // handshake deadlines. Served round robin across principals, at most
        // `max_starting_agents_per_principal` of one: a caller's burst of new contexts waits
        // behind itself, not in front of another caller's start (issue 36). A turn that ends
        // (cancelled) while it waits leaves the queue.
        let never = tokio_util::sync::CancellationToken::new();
        let gave_up = turn.map_or(&never, |t| &t.end);
        let Some(_starting) = self
            .shared
            .starts
            .admit(&self.core.info.principal, gave_up, |_| {})
            .await
        else {
            return Err(StartError::NoRoom(
                "the turn ended while it waited for a start slot".into(),
            ));
        };
        // A conversation that gave its uid back takes one again (and its root and home with it)
        // only now, holding both slots: a uid is held only while an agent may run.
        self.take_uid().await?;
        let home = self.home_path();
        let target = crate::agent::Target {
            spawn_id: &self.core.info.context_id,
            agent: &self.core.info.agent,
            principal: Some(&self.core.info.principal),
            boundary: self.core.info.sandbox_boundary(),
            home: home.as_deref(),
        };
        let handler = crate::bridge::Binding::bound(self.core.clone());
        let p =
            AgentProc::start(&self.shared, slot, target, handler, &self.agent_cfg, None).await?;
        let last = self
            .last_session
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let (mut p, mut session) = p
            .open_session(
                &self.shared,
                &self.agent_cfg,
                &self.core.info.root,
                resume,
                &last,
                None,
            )
            .await?;
        if let Err(e) = self.apply_options(&mut p, &mut session).await {
            return Err(p.fail(&self.shared, e).await);
        }
        let reset = session.reset;
        self.adopt_session(session);
        Ok((p, reset))
    }

    /// What the conversation asks of a fresh session beyond the supervised mode — planning for
    /// its verb, the caller's model and effort — set on `p`'s `session`: the one way for a cold
    /// start (after `AgentProc::open_session`) and for a warm agent at the take. An error
    /// (`StartError::OptionNotOffered` for a model or effort the agent does not offer) leaves
    /// killing the agent to the caller. A change to an unsupervised mode the agent announced on
    /// its own before (while it waited in the pool, say) is kept for the first turn to judge, not
    /// drained with the echoes of these changes.
    pub(super) async fn apply_options(
        &self,
        p: &mut AgentProc,
        session: &mut crate::agent::SessionStarted,
    ) -> Result<(), StartError> {
        if self.plan_option().is_none()
            && self.core.info.model.is_empty()
            && self.core.info.effort.is_empty()
        {
            return Ok(());
        }
        while let Ok(ev) = p.events.try_recv() {
            if let AcpEvent::Update(n) = &ev
                && n.session_id == session.session_id
                && let SessionEvent::CurrentModeUpdate { current_mode_id } = &n.event
                && !self.agent_cfg.is_supervised_mode(current_mode_id)
                && let Ok(mut m) = self.early_mode.lock()
            {
                *m = Some(current_mode_id.clone());
            }
        }
        let hs = self.shared.settings().limits().handshake();
        if let Some((id, value)) = self.plan_option() {
            let (id, value) = (id.to_string(), value.to_string());
            // Planning is a way of working, not a permission: an agent that refuses it still
            // runs the verb, supervised as ever. As a mode (`mode=plan`, through session/set_mode,
            // which adapters without config options also have) it must be a supervised one.
            let as_mode = id == "mode";
            let answer = if as_mode && !self.agent_cfg.is_supervised_mode(&value) {
                tracing::warn!(context_id = %self.core.info.context_id, mode = %value, "plan_config_option names a mode that is not supervised; not set");
                None
            } else if as_mode {
                Some(
                    tokio::time::timeout(hs, p.client.set_mode(&session.session_id, &value))
                        .await
                        .map(|r| r.map(|_| ())),
                )
            } else {
                Some(
                    tokio::time::timeout(
                        hs,
                        p.client.set_config_option(&session.session_id, &id, &value),
                    )
                    .await
                    .map(|r| r.map(|_| ())),
                )
            };
            match answer {
                None => {}
                Some(Ok(Ok(()))) => {
                    tracing::info!(context_id = %self.core.info.context_id, option = %id, value = %value, "planning for the verb");
                    if as_mode {
                        session.mode = value;
                    }
                }
                Some(Ok(Err(e))) => {
                    tracing::warn!(context_id = %self.core.info.context_id, option = %id, error = %e, "the agent refused its plan option")
                }
                Some(Err(_)) => {
                    return Err(StartError::Handshake("session/set_config_option".into()));
                }
            }
            while p.events.try_recv().is_ok() {}
        }
        let offered = session.config_options.take();
        self.apply_session_options(p, &session.session_id, offered)
            .await
    }

    /// Records the agent's session as this conversation's.
    pub(super) fn adopt_session(&self, session: crate::agent::SessionStarted) {
        {
            let mut l = self.core.live();
            l.session_id = session.session_id.clone();
            l.agent_mode = session.mode.clone();
            l.current_mode = session.mode;
        }
        if let Ok(mut s) = self.last_session.lock() {
            *s = session.session_id;
        }
    }

    /// Sets the caller's model and effort (`OpenConversationRequest.model`/`.effort`) through
    /// the session config options the agent offered (`options.rs` picks option and value), before
    /// the first prompt. A request the agent cannot honour refuses the start
    /// (`StartError::OptionNotOffered`); an answer that moves the session out of a supervised
    /// mode is a mode fault like any other.
    async fn apply_session_options(
        &self,
        p: &mut AgentProc,
        session_id: &str,
        offered: Option<serde_json::Value>,
    ) -> Result<(), StartError> {
        use crate::options::{Wanted, choose};
        let info = &self.core.info;
        let wanted: Vec<(Wanted, &str)> =
            [(Wanted::Model, &info.model), (Wanted::Effort, &info.effort)]
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(w, v)| (w, v.as_str()))
                .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let remembered = self
            .chosen_options
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        let choices = match offered {
            Some(list) => {
                let mut out = Vec::new();
                for (w, v) in &wanted {
                    out.push(
                        choose(&list, *w, v)
                            .map_err(|e| StartError::OptionNotOffered(e.to_string()))?,
                    );
                }
                out
            }
            // A restored session that does not list its options: set what the first start chose.
            None if remembered.len() == wanted.len() => remembered
                .into_iter()
                .map(|c| crate::options::Choice {
                    current: false,
                    ..c
                })
                .collect(),
            None => {
                return Err(StartError::OptionNotOffered(format!(
                    "the agent offers no {} choice (its session lists no config options)",
                    wanted[0].0.as_str()
                )));
            }
        };
        let hs = self.shared.settings().limits().handshake();
        for c in choices.iter().filter(|c| !c.current) {
            let after = match tokio::time::timeout(
                hs,
                p.client
                    .set_config_option(session_id, &c.config_id, &c.value),
            )
            .await
            {
                Ok(Ok(after)) => after,
                Ok(Err(e)) => {
                    return Err(StartError::OptionNotOffered(format!(
                        "the agent refused {} = {:?}: {e}",
                        c.config_id, c.value
                    )));
                }
                Err(_) => {
                    return Err(StartError::Handshake("session/set_config_option".into()));
                }
            };
            if let Some(mode) = crate::translate::mode_from_config_options(&after)
                && !self.agent_cfg.is_supervised_mode(&mode)
            {
                return Err(StartError::Mode(format!(
                    "setting {} = {:?} moved the session to the mode {mode:?}",
                    c.config_id, c.value
                )));
            }
            tracing::info!(context_id = %info.context_id, session_id, option = %c.config_id, value = %c.value, "session option set for the caller");
        }
        // Option updates caused by our own changes are not the agent's doing.
        while p.events.try_recv().is_ok() {}
        if let Ok(mut r) = self.chosen_options.lock() {
            *r = choices;
        }
        Ok(())
    }

    /// The `(config id, value)` that puts the agent into planning, when the conversation's verb
    /// asks for it (`advise`, `review`) and the agent has one.
    fn plan_option(&self) -> Option<(&str, &str)> {
        if !plans_for(&self.agent_cfg, &self.core.info.verb) {
            return None;
        }
        self.agent_cfg
            .plan_config_option
            .split_once('=')
            .filter(|(id, value)| !id.is_empty() && !value.is_empty())
    }
}
