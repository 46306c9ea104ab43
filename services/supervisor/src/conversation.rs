//! One conversation: its agent process, its FIFO of turns and the worker that runs them one at
//! a time, idle stop and restart, close.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use warden_acp::{AcpError, AcpEvent, CancelOutcome, PromptEnd, SessionEvent};
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

use crate::agent::{AgentProc, StartError};
use crate::config::AgentConfig;
use crate::core::ConvCore;
use crate::fault;
use crate::mode::{self, ModeJudgement};
use crate::records::{Health, Incident, label, now_ms};
use crate::shared::Shared;
use crate::translate;
use crate::turn::{EndRequest, ToolSeen, TurnCtx};

/// What a finished turn's id is remembered as (bounded).
const FINISHED_MEMORY: usize = 512;

/// How long an ended turn can still be attached to (`AttachTurn`), and how many are kept: long
/// enough for a gateway replica to notice that the one following it stopped (its lease).
pub const ATTACH_GRACE: std::time::Duration = std::time::Duration::from_secs(60);
const ENDED_MEMORY: usize = 16;

pub struct ConvState {
    pub status: pb::ConversationState,
    pub active: Option<Arc<TurnCtx>>,
    pub queue: VecDeque<Arc<TurnCtx>>,
    pub finished: VecDeque<String>,
    /// Turns that ended, when, for [`ATTACH_GRACE`] (their events for `AttachTurn`).
    pub ended: VecDeque<(Instant, Arc<TurnCtx>)>,
    /// Cancels that arrived before their turn.
    pub pending_cancel: HashSet<String>,
    pub last_activity: Instant,
    pub closing: bool,
}

pub struct Conversation {
    pub core: Arc<ConvCore>,
    pub agent_cfg: AgentConfig,
    pub shared: Arc<Shared>,
    pub state: Mutex<ConvState>,
    wake: Notify,
    pub closed: CancellationToken,
    /// The supervisor is stopping: a cancelled turn does not wait the cancel grace for the
    /// agent's answer before the kill (the kill's own SIGTERM grace is the one wait), so a stop
    /// takes one kill grace.
    stopping: CancellationToken,
    proc_: tokio::sync::Mutex<Option<AgentProc>>,
    /// Session id to load when the agent is restarted.
    last_session: Mutex<String>,
    /// The config options set for the caller's model/effort at the first start, set again
    /// after a restart whose `session/load` answer lists no options.
    chosen_options: Mutex<Vec<crate::options::Choice>>,
    /// The mode the agent announced on its own before its first turn while the session options
    /// were set (`apply_options`): judged by the first turn like one announced between turns.
    early_mode: Mutex<Option<String>>,
    /// What the last kill of the agent tree did (forced, processes), for CloseConversation when
    /// the cancelled turn already killed it.
    last_kill: Mutex<(bool, u32)>,
    /// This conversation's agent home: kept across idle restarts (the adapter's session state
    /// lives there), removed at close (or when the conversation is dropped).
    home: Mutex<Option<warden_sandbox::AgentHome>>,
    /// Set when this conversation continues a context whose earlier conversation ended (closed
    /// by its owner or after being idle): its first turn says that the context was reset.
    pub ended_before: std::sync::atomic::AtomicBool,
    /// The uid this conversation gave back while its agent was stopped (for the log).
    parked_from: Mutex<Option<warden_sandbox::AgentIdentity>>,
    /// The root as this conversation's first turn found it: what each turn's diff is against.
    baseline: Mutex<Option<Arc<crate::patch::Baseline>>>,
}

/// How a turn ended.
struct Stop {
    reason: String,
    fault: Option<(pb::FaultClass, String)>,
}

impl Stop {
    fn reason(r: &str) -> Self {
        Stop {
            reason: r.into(),
            fault: None,
        }
    }
    fn fault(class: pb::FaultClass, msg: impl Into<String>) -> Self {
        Stop {
            reason: "fault".into(),
            fault: Some((class, msg.into())),
        }
    }
}

/// Whether a conversation of `verb` with this agent is put into planning (`plan_config_option`,
/// for `advise` and `review`).
pub fn plans_for(cfg: &AgentConfig, verb: &str) -> bool {
    matches!(verb, "advise" | "review") && !cfg.plan_config_option.is_empty()
}

impl Conversation {
    /// Starts the agent (spawn, initialize, session/new, supervised mode) and the worker; with
    /// `warm`, the agent a warm start (`pool.rs`) already made that way, in this conversation's
    /// root and home, is adopted instead.
    ///
    /// With every live agent busy the conversation opens without one, as if idle-stopped: its
    /// first turn starts the agent, waiting for one in the live-agent queue and telling its
    /// caller so on the turn's stream (an open has no stream to say it on, and waiting here
    /// would hold the caller with nothing to see).
    pub async fn open(
        core: Arc<ConvCore>,
        agent_cfg: AgentConfig,
        shared: Arc<Shared>,
        home: warden_sandbox::AgentHome,
        warm: Option<(AgentProc, crate::agent::SessionStarted)>,
    ) -> Result<Arc<Conversation>, StartError> {
        let conv = Arc::new(Conversation {
            core,
            agent_cfg,
            shared,
            state: Mutex::new(ConvState {
                status: pb::ConversationState::Ready,
                active: None,
                queue: VecDeque::new(),
                finished: VecDeque::new(),
                ended: VecDeque::new(),
                pending_cancel: HashSet::new(),
                last_activity: Instant::now(),
                closing: false,
            }),
            wake: Notify::new(),
            closed: CancellationToken::new(),
            stopping: CancellationToken::new(),
            proc_: tokio::sync::Mutex::new(None),
            last_session: Mutex::new(String::new()),
            chosen_options: Mutex::new(Vec::new()),
            early_mode: Mutex::new(None),
            last_kill: Mutex::new((false, 0)),
            home: Mutex::new(Some(home)),
            ended_before: std::sync::atomic::AtomicBool::new(false),
            baseline: Mutex::new(None),
            parked_from: Mutex::new(None),
        });
        let p = match warm {
            Some((mut p, mut session)) => {
                if let Err(e) = conv.apply_options(&mut p, &mut session).await {
                    return Err(p.fail(&conv.shared, e).await);
                }
                conv.adopt_session(session);
                p
            }
            None => match conv.start_agent(false, None).await {
                Ok((p, _)) => p,
                Err(e @ (StartError::Capacity(_) | StartError::NoRoom(_))) => {
                    tracing::info!(context_id = %conv.core.info.context_id, reason = %e, "no live agent (or agent uid) free: opened without one; its first turn waits for one");
                    conv.st().status = pb::ConversationState::IdleStopped;
                    // No agent runs: its uid serves others meanwhile.
                    conv.give_back_uid().await;
                    let worker = conv.clone();
                    let fair = conv.shared.fair.clone();
                    tokio::spawn(fair.fair(&conv.core.info.principal, async move {
                        worker.worker().await
                    }));
                    return Ok(conv);
                }
                Err(e) => return Err(e),
            },
        };
        *conv.proc_.lock().await = Some(p);
        // Still busy (as while it started) until the caller says whether a turn follows
        // (`idle_if_unused`): a RunTurn's open is followed by its turn at once, and a start
        // waiting for an agent must not take this one in between.
        let worker = conv.clone();
        let fair = conv.shared.fair.clone();
        tokio::spawn(fair.fair(
            &conv.core.info.principal,
            async move { worker.worker().await },
        ));
        Ok(conv)
    }

    pub fn st(&self) -> std::sync::MutexGuard<'_, ConvState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns the agent and makes a session: `session/load` of the last one when `resume` and
    /// the agent supports it, else `session/new` (the bool is true when context was reset).
    /// For `turn` the live-agent slot is waited for in the queue (see `live`); for an open it is
    /// taken only when free.
    async fn start_agent(
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
    async fn apply_options(
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
    fn adopt_session(&self, session: crate::agent::SessionStarted) {
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

    /// Marks the agent idle (it may be stopped to make room) unless a turn is queued or
    /// running: called after an open, once the caller's turn (if any) is queued. The worker
    /// takes over from there (waiting for a slot, busy, idle again).
    pub fn idle_if_unused(&self) {
        let st = self.st();
        if st.active.is_none() && st.queue.is_empty() {
            self.shared.live.set_busy(&self.core.info.context_id, false);
        }
    }

    /// Queues a turn; returns its 1-based queue position (0 = it will start now).
    pub fn enqueue(&self, turn: Arc<TurnCtx>) -> Result<usize, tonic::Status> {
        let mut st = self.st();
        if st.closing
            || matches!(
                st.status,
                pb::ConversationState::Closed | pb::ConversationState::Failed
            )
        {
            return Err(tonic::Status::failed_precondition(format!(
                "conversation {:?} is {}",
                self.core.info.context_id,
                st.status.as_str_name()
            )));
        }
        let id = turn.id();
        let dup = st.active.as_ref().is_some_and(|a| a.id() == id)
            || st.queue.iter().any(|q| q.id() == id)
            || st.finished.iter().any(|f| f == id);
        if dup {
            return Err(tonic::Status::already_exists(format!(
                "turn {id:?} already exists in this conversation"
            )));
        }
        let max = self.shared.settings().limits().max_queued_turns;
        if st.queue.len() >= max {
            return Err(tonic::Status::resource_exhausted(format!(
                "{} turns are queued in this conversation; the limit is {max}",
                st.queue.len()
            )));
        }
        if st.pending_cancel.remove(id) {
            turn.request_end(EndRequest::Cancel);
        }
        let busy = st.active.is_some() || !st.queue.is_empty();
        st.queue.push_back(turn);
        let pos = if busy { st.queue.len() } else { 0 };
        drop(st);
        self.wake.notify_one();
        Ok(pos)
    }

    /// CancelTurn: "queued", "active", "pending" or "finished".
    pub fn cancel_turn(&self, turn_id: &str) -> &'static str {
        let mut st = self.st();
        if let Some(i) = st.queue.iter().position(|t| t.id() == turn_id) {
            let t = st.queue.remove(i);
            drop(st);
            if let Some(t) = t {
                // Never started: ends cancelled without touching the agent.
                t.request_end(EndRequest::Cancel);
                self.finish_unstarted(&t);
                self.remember_finished(&t);
            }
            return "queued";
        }
        if let Some(a) = st.active.clone()
            && a.id() == turn_id
        {
            drop(st);
            a.request_end(EndRequest::Cancel);
            return "active";
        }
        if st.finished.iter().any(|f| f == turn_id) {
            return "finished";
        }
        if st.pending_cancel.len() < FINISHED_MEMORY {
            st.pending_cancel.insert(turn_id.to_string());
        }
        "pending"
    }

    /// Ends a turn that never started (removed from the queue, or the conversation closed):
    /// its stream gets a `cancelled` stop and the health file a line, like any finished turn.
    fn finish_unstarted(&self, t: &TurnCtx) {
        let health = Health {
            at_unix_ms: now_ms(),
            agent: self.core.info.agent.clone(),
            verb: self.core.info.verb.clone(),
            profile: self.core.info.profile.as_str().into(),
            duration_ms: 0,
            stop_reason: "cancelled".into(),
            fault: None,
            refusals: 0,
            permissions: 0,
            input_tokens: 0,
            output_tokens: 0,
            total_tokens: 0,
        };
        if let Err(e) = self.shared.records.health(&health) {
            tracing::warn!(error = %e, "health record refused");
        }
        crate::metrics::turn_ended("cancelled", None);
        t.emit(Event::Stop(pb::TurnStop {
            stop_reason: "cancelled".into(),
            refusals: vec![],
            fault: None,
            transcript_path: String::new(),
            duration_millis: 0,
            files_changed: vec![],
            files_changed_unknown: true,
            ..Default::default()
        }));
    }

    /// Kills the terminals and the fs servant (the agent is being stopped; a later `fs/*`
    /// request starts a new servant).
    async fn kill_terminals(&self) {
        self.core
            .terminals
            .kill_all(self.shared.settings().limits().kill_grace())
            .await;
        self.core.servant.stop().await;
    }

    fn remember_finished(&self, turn: &Arc<TurnCtx>) {
        let mut st = self.st();
        st.finished.push_back(turn.id().to_string());
        while st.finished.len() > FINISHED_MEMORY {
            st.finished.pop_front();
        }
        st.ended.push_back((Instant::now(), turn.clone()));
        while st.ended.len() > ENDED_MEMORY
            || st
                .ended
                .front()
                .is_some_and(|(at, _)| at.elapsed() > ATTACH_GRACE)
        {
            st.ended.pop_front();
        }
    }

    /// The turn `turn_id` of this conversation to attach to: queued, running, or ended within
    /// [`ATTACH_GRACE`].
    pub fn turn_to_attach(&self, turn_id: &str) -> Option<Arc<TurnCtx>> {
        let st = self.st();
        if let Some(a) = st.active.as_ref().filter(|a| a.id() == turn_id) {
            return Some(a.clone());
        }
        if let Some(q) = st.queue.iter().find(|q| q.id() == turn_id) {
            return Some(q.clone());
        }
        st.ended
            .iter()
            .find(|(at, t)| t.id() == turn_id && at.elapsed() <= ATTACH_GRACE)
            .map(|(_, t)| t.clone())
    }

    /// Answers a question of the active turn.
    pub fn answer_question(
        &self,
        turn_id: &str,
        qid: &str,
        resp: warden_acp::ElicitationResponse,
    ) -> bool {
        let Some(active) = self.st().active.clone() else {
            return false;
        };
        if active.id() != turn_id {
            return false;
        }
        let tx = active.lock().questions.remove(qid);
        match tx {
            Some(tx) => tx.send(resp).is_ok(),
            None => false,
        }
    }

    pub fn info(&self) -> pb::ConversationInfo {
        let st = self.st();
        let live = self.core.live();
        let running = st.status == pb::ConversationState::Ready;
        pb::ConversationInfo {
            context_id: self.core.info.context_id.clone(),
            agent: self.core.info.agent.clone(),
            root: self.core.info.root.to_string_lossy().into_owned(),
            owned: self.core.info.owned,
            profile: self.core.info.profile.wire(),
            session_id: if running {
                live.session_id.clone()
            } else {
                String::new()
            },
            state: st.status as i32,
            principal: self.core.info.principal.clone(),
            active_turn_id: st
                .active
                .as_ref()
                .map(|a| a.id().to_string())
                .unwrap_or_default(),
            queued_turn_ids: st.queue.iter().map(|t| t.id().to_string()).collect(),
            current_mode: live.current_mode.clone(),
            model: self.core.info.model.clone(),
            effort: self.core.info.effort.clone(),
        }
    }

    /// Close: every queued turn ends cancelled, the active one is cancelled, the tree killed.
    /// With `stopping` (the supervisor stops) the active turn's cancel is sent but not waited
    /// for. Returns (forced, processes).
    pub async fn close(&self, stopping: bool) -> (bool, u32) {
        if stopping {
            self.stopping.cancel();
        }
        let (queued, active) = {
            let mut st = self.st();
            st.closing = true;
            (std::mem::take(&mut st.queue), st.active.clone())
        };
        for t in queued {
            t.request_end(EndRequest::Cancel);
            self.finish_unstarted(&t);
        }
        let active_was_running = active.is_some();
        if let Some(a) = active {
            a.request_end(EndRequest::Cancel);
        }
        self.closed.cancel();
        self.wake.notify_one();
        // The worker stops the agent once the active turn has ended; wait for it, bounded.
        let mut p = self.proc_.lock().await;
        self.kill_terminals().await;
        let report = match p.take() {
            Some(mut proc_) => proc_.kill(&self.shared).await,
            // The cancelled active turn killed it already.
            None if active_was_running => self.last_kill.lock().map(|k| *k).unwrap_or_default(),
            None => (false, 0),
        };
        self.st().status = pb::ConversationState::Closed;
        if stopping && self.core.info.owned {
            // The root outlives this supervisor, the uid's holding does not: handed to the
            // supervisor now, so the uid's holder after a restart finds nothing of it (the
            // context's next open hands it to its new uid).
            self.give_back_uid().await;
        }
        // Nothing of this conversation's home may reach a later one.
        let home = self.home.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = home {
            // Off the runtime thread: a stop removes hundreds of homes at once.
            let removed = tokio::task::spawn_blocking(move || h.remove()).await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(context_id = %self.core.info.context_id, error = %e, "cannot remove the agent home");
            }
        }
        // Its processes are gone: its uid (with a range) may serve another conversation.
        self.shared
            .spawner
            .release_identity(&self.core.info.context_id);
        report
    }

    async fn worker(self: Arc<Self>) {
        loop {
            let next = {
                let mut st = self.st();
                if st.closing {
                    None
                } else {
                    let t = st.queue.pop_front();
                    if let Some(t) = &t {
                        st.active = Some(t.clone());
                    }
                    t
                }
            };
            let Some(turn) = next else {
                if self.closed.is_cancelled() {
                    return;
                }
                // Only a running agent has an idle clock.
                let (since, running) = {
                    let st = self.st();
                    (st.last_activity, st.status == pb::ConversationState::Ready)
                };
                let idle = self.shared.settings().limits().idle().filter(|_| running);
                // At the live-agent limit, another conversation's start may ask this idle agent
                // to make room.
                let evict = self
                    .shared
                    .live
                    .evict_token(&self.core.info.context_id)
                    .filter(|_| running);
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = self.closed.cancelled() => return,
                    _ = sleep_until_idle(idle, since) => self.idle_stop().await,
                    _ = async {
                        match &evict {
                            Some(t) => t.cancelled().await,
                            None => std::future::pending().await,
                        }
                    } => self.idle_stop().await,
                }
                continue;
            };
            // Idle while its turn waits for a turn slot: a start that holds a turn slot may ask
            // it to make room (`live`); busy, never stopped, once the turn is admitted.
            self.shared.live.set_waiting(&self.core.info.context_id);
            self.run_turn(turn.clone()).await;
            {
                let mut st = self.st();
                st.active = None;
                st.last_activity = Instant::now();
                if st.queue.is_empty() {
                    self.shared.live.set_busy(&self.core.info.context_id, false);
                }
            }
            self.remember_finished(&turn);
        }
    }

    /// Stops an idle agent: the tree is killed, root and record stay.
    async fn idle_stop(&self) {
        let mut p = self.proc_.lock().await;
        if let Some(mut proc_) = p.take() {
            tracing::info!(context_id = %self.core.info.context_id, "stopping the idle agent (idle timeout, or to make room)");
            self.kill_terminals().await;
            proc_.kill(&self.shared).await;
            {
                let mut st = self.st();
                if st.status == pb::ConversationState::Ready {
                    st.status = pb::ConversationState::IdleStopped;
                }
            }
            // Its processes are gone: its uid (with a range) serves others until its next turn.
            self.give_back_uid().await;
        }
    }

    fn home_path(&self) -> Option<std::path::PathBuf> {
        self.home
            .lock()
            .ok()
            .and_then(|h| h.as_ref().map(|h| h.path().to_path_buf()))
    }

    /// Closes the root's fd of a conversation whose agent is not running (reopened at its next
    /// start). With `sandbox.agent_uid_range`, also gives back the uid of a conversation whose agent is not
    /// running (idle-stopped, or opened without one), so idle conversations hold no uid another
    /// caller waits for (issue 36, finding 3). Called with the agent stopped (its tree killed,
    /// its terminals and fs servant stopped). Before the uid is free for another conversation:
    /// no process may still run with it (checked in `/proc`, whatever the tree's kill said), and
    /// the owned root and the home are handed to the supervisor itself (`chown_tree`, walked as
    /// this uid, which nothing else holds yet; the root keeps its group, the policy's search),
    /// so the uid's next holder finds nothing of this conversation it could reach: the top
    /// directories are no longer its, and every entry below them neither. The root's fd is
    /// closed (the supervisor's look at it is taken again with the next uid). Anything that
    /// fails keeps the uid (and says why): never a uid given back with something still its.
    pub async fn give_back_uid(&self) {
        if !uid_range(&self.shared) {
            // No uid to give back; the root's fd is not needed until the agent runs again.
            self.core.set_files(Err(
                "closed while the conversation's agent is stopped".into()
            ));
            return;
        }
        let ctx = self.core.info.context_id.clone();
        let Some(held) = self.shared.spawner.agent_identity_for(&ctx) else {
            return;
        };
        let root = self.core.info.owned.then(|| self.core.info.root.clone());
        let home = self.home_path();
        let parked = tokio::task::spawn_blocking(move || -> Result<(), String> {
            if uid_in_use(held.uid) {
                return Err(format!("a process still runs as uid {}", held.uid));
            }
            let owner = parked_owner();
            for dir in root.iter().chain(home.iter()) {
                warden_sandbox::chown_tree(dir, owner)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match parked {
            Ok(()) => {
                self.core
                    .set_files(Err("the conversation holds no agent uid now".into()));
                if let Ok(mut p) = self.parked_from.lock() {
                    *p = Some(held);
                }
                self.shared.spawner.release_identity(&ctx);
                tracing::info!(context_id = %ctx, uid = held.uid, "agent stopped: its uid given back, root and home the supervisor's until its next start");
            }
            Err(e) => {
                tracing::warn!(context_id = %ctx, uid = held.uid, error = %e, "agent stopped, its uid kept: it cannot be given back safely");
            }
        }
    }

    /// Opens the root again for the supervisor's look (closed while the agent was stopped). With
    /// a uid range: takes a uid of `sandbox.agent_uid_range` again for a conversation that gave its own back
    /// ([`Conversation::give_back_uid`]), and hands its root and home to it: the lowest free
    /// one, likely another than before. None free: fault `capacity` naming the range, nothing
    /// started (the live-agent limit, at most the range's size, serves the turns waiting for an
    /// agent round robin across principals; this is the rare race past it).
    async fn take_uid(&self) -> Result<(), StartError> {
        if !uid_range(&self.shared) {
            if self.core.files().is_none() {
                let rights = self
                    .shared
                    .spawner
                    .agent_identity_for(&self.core.info.context_id)
                    .map(Into::into);
                let files =
                    warden_containment::beneath::RootDir::open_as(&self.core.info.root, rights)
                        .map(Arc::new)
                        .map_err(|e| e.to_string());
                self.core.set_files(files);
            }
            return Ok(());
        }
        let ctx = self.core.info.context_id.clone();
        if self.shared.spawner.agent_identity_for(&ctx).is_some() {
            return Ok(());
        }
        let ident = match self.shared.spawner.assign_identity(&ctx) {
            Ok(Some(i)) => i,
            Ok(None) => return Ok(()),
            Err(e) => {
                return Err(StartError::NoRoom(format!(
                    "capacity: no agent uid is free ({e}); every one is held by a conversation \
                     whose agent runs. Try again when one stops (limits.idle_timeout_secs)"
                )));
            }
        };
        let root = self.core.info.owned.then(|| self.core.info.root.clone());
        let home = self.home_path();
        let handed = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let own_group = parked_owner().gid;
            if let Some(root) = &root {
                warden_sandbox::chown_tree(root, ident)
                    .map_err(|e| format!("{}: {e}", root.display()))?;
                // The root's group stays the supervisor's (the policy's search), as made.
                std::os::unix::fs::lchown(root, None, Some(own_group))
                    .map_err(|e| format!("{}: {e}", root.display()))?;
            }
            if let Some(home) = &home {
                warden_sandbox::chown_tree(home, ident)
                    .map_err(|e| format!("{}: {e}", home.display()))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        if let Err(e) = handed {
            self.shared.spawner.release_identity(&ctx);
            return Err(StartError::Spawn(format!(
                "cannot give the sandbox to the agent's uid {}: {e}",
                ident.uid
            )));
        }
        let files =
            warden_containment::beneath::RootDir::open_as(&self.core.info.root, Some(ident.into()))
                .map(Arc::new)
                .map_err(|e| e.to_string());
        self.core.set_files(files);
        let before = self.parked_from.lock().ok().and_then(|mut p| p.take());
        tracing::info!(context_id = %ctx, uid = ident.uid, before = ?before.map(|b| b.uid), "agent uid taken again for the conversation's start");
        Ok(())
    }

    async fn run_turn(&self, turn: Arc<TurnCtx>) {
        let started = Instant::now();
        let limits = self.shared.settings().limits().clone();
        let timeout_secs = if turn.input.timeout_secs == 0 {
            limits.turn_timeout_secs
        } else {
            turn.input.timeout_secs
        };
        match self
            .shared
            .records
            .transcript(&self.core.info.context_id, turn.id())
        {
            Ok(t) => turn.lock().transcript = Some(t),
            Err(e) => tracing::warn!(error = %e, "cannot open transcript"),
        }
        // A turn slot first (admission across all conversations), in order, telling the caller
        // its place while it waits; a cancel while waiting ends the turn without running it.
        let permit = if turn.cancel.is_cancelled() {
            None
        } else {
            self.admit(&turn).await
        };
        let stop = match &permit {
            Some(_) if !turn.cancel.is_cancelled() => self.drive(&turn, timeout_secs).await,
            _ => Stop::reason("cancelled"),
        };
        self.finish(&turn, stop, started, timeout_secs);
        drop(permit);
    }

    /// Waits for the turn's slot (`admission`), telling the caller its place. Meanwhile this
    /// conversation's agent is idle and may be asked to make room for a turn that holds a slot
    /// and waits for an agent: it is stopped then (restarted once this turn is admitted), so
    /// the two limits never wait on each other. None when the turn was cancelled first.
    async fn admit(&self, turn: &Arc<TurnCtx>) -> Option<crate::admission::Permit> {
        let ctx = &self.core.info.context_id;
        let admit = self
            .shared
            .admission
            .admit(&self.core.info.principal, &turn.end, |position| {
                turn.emit(Event::Queued(pb::TurnQueued {
                    position: u32::try_from(position).unwrap_or(u32::MAX),
                    admission: true,
                    agent: false,
                }))
            });
        tokio::pin!(admit);
        let evict = self.shared.live.evict_token(ctx);
        let mut stopped = false;
        let permit = loop {
            tokio::select! {
                p = &mut admit => break p,
                _ = async {
                    match &evict {
                        Some(t) => t.cancelled().await,
                        None => std::future::pending().await,
                    }
                }, if !stopped => {
                    stopped = true;
                    self.idle_stop().await;
                }
            }
        };
        if permit.is_some() {
            if !stopped && evict.as_ref().is_some_and(|t| t.is_cancelled()) {
                // Asked to make room just as the slot came: the start that asked counts on it.
                self.idle_stop().await;
            }
            // A busy agent is never stopped to make room.
            self.shared.live.set_busy(ctx, true);
        }
        permit
    }

    async fn drive(&self, turn: &Arc<TurnCtx>, timeout_secs: u64) -> Stop {
        let mut guard = self.proc_.lock().await;
        let mut context_reset = false;
        if guard.is_none() {
            // Idle-stopped (or killed by an earlier turn, or opened while every agent was
            // busy): start it, never silently losing context (session/load of the last
            // session, when there was one).
            let resume = self.last_session.lock().is_ok_and(|s| !s.is_empty());
            match self.start_agent(resume, Some(turn)).await {
                Ok((p, reset)) => {
                    *guard = Some(p);
                    self.st().status = pb::ConversationState::Ready;
                    context_reset = reset;
                }
                Err(_) if turn.end.is_cancelled() => {
                    self.give_back_uid().await;
                    return match turn.end_reason() {
                        Some(EndRequest::Decision {
                            fault: Some((c, m)),
                        }) => Stop::fault(c, m),
                        _ => Stop::reason("cancelled"),
                    };
                }
                Err(e) => {
                    // A failed start holds nothing until the next turn tries again.
                    self.give_back_uid().await;
                    return Stop::fault(e.class(), e.to_string());
                }
            }
        }
        let Some(p) = guard.as_mut() else {
            return Stop::fault(pb::FaultClass::Internal, "agent missing");
        };
        let session_id = self.core.live().session_id.clone();
        // Updates that arrived between turns are not this turn's output; a mode change among
        // them is still checked (an agent may elevate itself while idle).
        let mut idle_mode = self.early_mode.lock().ok().and_then(|mut m| m.take());
        while let Ok(ev) = p.events.try_recv() {
            if let AcpEvent::Update(n) = &ev
                && n.session_id == session_id
                && let SessionEvent::CurrentModeUpdate { current_mode_id } = &n.event
            {
                idle_mode = Some(current_mode_id.clone());
            }
        }
        turn.emit(Event::Started(pb::TurnStarted {
            session_id: session_id.clone(),
            root: self.core.info.root.to_string_lossy().into_owned(),
        }));
        if self
            .ended_before
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            turn.emit(Event::ContextReset(pb::ContextReset {
                reason: "this context's earlier conversation ended (closed by its owner, or after being idle); this turn starts a new agent session without the earlier context".into(),
            }));
        } else if context_reset {
            turn.emit(Event::ContextReset(pb::ContextReset {
                reason: "the agent was restarted and could not load its previous session; this turn starts a new session without the earlier context".into(),
            }));
        }
        self.core.live().turn = Some(turn.clone());
        let early = match idle_mode {
            Some(m) => self.on_mode(p, turn, &session_id, m).await,
            None => None,
        };
        let before = self.root_snapshot().await;
        self.take_baseline(before.as_ref()).await;
        let stop = match early {
            Some(out) => out,
            None => self.drive_inner(p, turn, &session_id, timeout_secs).await,
        };
        self.core.live().turn = None;
        turn.cancel.cancel();
        turn.cancel_questions();
        if stop.kill {
            // What the agent said on stderr before it died goes into the (bounded) transcript,
            // never into the incident record.
            if let (Some((class, _)), Some(p)) = (&stop.stop.fault, guard.as_ref())
                && matches!(class, pb::FaultClass::Crash | pb::FaultClass::Protocol)
            {
                let tail = p.stderr.lock().map(|r| r.text()).unwrap_or_default();
                turn.record("agent_stderr_tail", json!({ "text": tail }));
            }
            self.kill_terminals().await;
            let mut proc_ = guard.take();
            if let Some(pr) = proc_.as_mut() {
                let r = pr.kill(&self.shared).await;
                if let Ok(mut k) = self.last_kill.lock() {
                    *k = r;
                }
            }
            let mut st = self.st();
            if stop.fail_conversation {
                st.status = pb::ConversationState::Failed;
            } else if st.status == pb::ConversationState::Ready {
                st.status = pb::ConversationState::IdleStopped;
            }
        }
        // After the kill, if there was one: nothing of the tree writes any more.
        let after = self.root_snapshot().await;
        let changed_any = match (&before, &after) {
            (Some(b), Some(a)) => !b.changed(a).is_empty(),
            _ => true,
        };
        if changed_any && let Some(a) = &after {
            turn.lock().patch = self.patch_now(a.clone()).await;
        }
        turn.lock().files_changed = match (before, after) {
            (Some(b), Some(a)) => {
                let mut changed: Vec<String> = b
                    .changed(&a)
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect();
                let over = changed.len() > FILES_CHANGED_MAX;
                changed.truncate(FILES_CHANGED_MAX);
                (changed, over)
            }
            _ => (Vec::new(), true),
        };
        if stop.kill {
            // The agent is gone until the next turn: so is its uid (after the walk above).
            self.give_back_uid().await;
        }
        stop.stop
    }

    /// At the conversation's first turn (the first whose root could be walked): the root's
    /// content, the baseline of every later turn's diff.
    async fn take_baseline(&self, snap: Option<&warden_containment::beneath::Snapshot>) {
        let Some(snap) = snap else { return };
        if self.baseline.lock().map(|b| b.is_some()).unwrap_or(true) {
            return;
        }
        let core = self.core.clone();
        let snap = snap.clone();
        let taken = tokio::task::spawn_blocking(move || {
            core.files().map(|r| crate::patch::Baseline::take(&r, snap))
        })
        .await
        .ok()
        .flatten();
        if let (Some(b), Ok(mut slot)) = (taken, self.baseline.lock()) {
            *slot = Some(Arc::new(b));
        }
    }

    /// The conversation's change so far: the baseline against the root as `now` shows it.
    async fn patch_now(
        &self,
        now: warden_containment::beneath::Snapshot,
    ) -> Option<crate::patch::Patch> {
        let base = self.baseline.lock().ok()?.clone()?;
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || base.patch(&*core.files()?, &now))
            .await
            .ok()
            .flatten()
    }

    /// The root as it is now (off the runtime threads), or None when it cannot be walked.
    async fn root_snapshot(&self) -> Option<warden_containment::beneath::Snapshot> {
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || {
            core.files().and_then(|r| r.snapshot(ROOT_SNAPSHOT_ENTRIES))
        })
        .await
        .ok()
        .flatten()
    }

    async fn drive_inner(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        timeout_secs: u64,
    ) -> DriveOut {
        let meta = json!({"warden": {
            "messageId": turn.input.message_id,
            "taskId": turn.input.task_id,
            "turnId": turn.input.id,
            "budgetSeconds": timeout_secs,
        }});
        let budget_note = format!(
            "[warden] Time budget for this turn: {timeout_secs} s. Work within it; the turn is stopped at {} s.",
            timeout_secs * 12 / 10
        );
        let mut blocks = vec![json!({"type": "text", "text": turn.input.text})];
        if !turn.input.instructions.is_empty() {
            blocks.push(json!({"type": "text", "text": turn.input.instructions}));
        }
        if self.agent_cfg.budget_in_prompt {
            blocks.push(json!({"type": "text", "text": budget_note}));
        }
        // The transcript is workspace data (seed 004): it may hold the task text; incident
        // records never do.
        turn.record(
            "prompt",
            json!({"text": turn.input.text, "instructions": turn.input.instructions,
                   "message_id": turn.input.message_id,
                   "task_id": turn.input.task_id, "budget_secs": timeout_secs}),
        );
        let client = p.client.clone();
        let sid = session_id.to_string();
        let prompt = client.prompt_blocks(&sid, blocks, meta);
        tokio::pin!(prompt);
        let hard = tokio::time::sleep(Duration::from_millis(timeout_secs.saturating_mul(1200)));
        tokio::pin!(hard);
        let grace = self.shared.settings().limits().cancel_grace();
        let mut cancel_task: Option<
            tokio::task::JoinHandle<Result<warden_acp::CancelReport, AcpError>>,
        > = None;
        let mut events_open = true;
        loop {
            tokio::select! {
                biased;
                ev = p.events.recv(), if events_open => match ev {
                    Some(ev) => {
                        if let Some(out) = self.on_event(p, turn, session_id, ev).await {
                            return out;
                        }
                    }
                    None => events_open = false,
                },
                res = &mut prompt => {
                    // Everything the agent sent before its answer is already queued: drain it.
                    while let Ok(ev) = p.events.try_recv() {
                        if let Some(out) = self.on_event(p, turn, session_id, ev).await {
                            return out;
                        }
                    }
                    let cancelled = turn.end_reason();
                    return match (res, cancelled) {
                        (_, Some(end)) => self.ended(end),
                        (Ok(r), None) => DriveOut::keep(Stop::reason(r.stop_reason.as_str())),
                        (Err(AcpError::Fault(f)), None) => DriveOut::kill(Stop::fault(translate::fault_class(&f), format!("the agent connection failed: {f}"))),
                        (Err(e), None) => DriveOut::keep(Stop::fault(pb::FaultClass::Protocol, format!("session/prompt failed: {e}"))),
                    };
                }
                _ = turn.end.cancelled(), if cancel_task.is_none() => {
                    match turn.end_reason() {
                        Some(EndRequest::OutputLimit) => {
                            return DriveOut::kill(Stop::fault(pb::FaultClass::OutputLimit, format!(
                                "retained output passed {} bytes", self.shared.settings().limits().output_bytes)));
                        }
                        Some(EndRequest::ModeEscalation(m)) => {
                            let mut o = DriveOut::kill(Stop::fault(pb::FaultClass::ModeEscalation, m));
                            o.fail_conversation = true;
                            return o;
                        }
                        // A flood is not cancelled politely: the agent is stopped at once.
                        Some(EndRequest::RequestLimit(m)) => {
                            return DriveOut::kill(Stop::fault(pb::FaultClass::RequestLimit, m));
                        }
                        _ => {}
                    }
                    // Cancel: our pending permission handlers answer `cancelled` (they watch
                    // turn.cancel), then session/cancel, then wait for the prompt response.
                    turn.cancel.cancel();
                    turn.cancel_questions();
                    let c = client.clone();
                    let s = sid.clone();
                    cancel_task = Some(tokio::spawn(async move { c.cancel_with_deadline(&s, grace).await }));
                    if self.stopping.is_cancelled() {
                        return self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel));
                    }
                }
                _ = self.stopping.cancelled(), if cancel_task.is_some() => {
                    // A stop arrived while the cancel grace ran: the kill goes now.
                    return self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel));
                }
                r = async {
                    match cancel_task.as_mut() {
                        Some(h) => h.await,
                        None => std::future::pending().await,
                    }
                }, if cancel_task.is_some() => {
                    let expired = matches!(r, Ok(Ok(ref rep)) if rep.outcome == CancelOutcome::DeadlineExpired)
                        || matches!(r, Ok(Ok(ref rep)) if matches!(rep.outcome, CancelOutcome::PromptEnded(PromptEnd::Fault(_))))
                        || matches!(r, Ok(Err(_)) | Err(_));
                    if expired {
                        let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                        tracing::info!(context_id = %self.core.info.context_id, turn_id = %turn.id(), "agent did not end the turn within the cancel grace: killing it");
                        return self.ended(end);
                    }
                    // Otherwise the prompt response is (about to be) there; keep looping for it.
                    // Guard against a cancel task that finished while the prompt never answers.
                    if tokio::time::timeout(grace, &mut prompt).await.is_err() {
                        let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                        return self.ended(end);
                    }
                    while let Ok(ev) = p.events.try_recv() {
                        let _ = self.on_event(p, turn, session_id, ev).await;
                    }
                    let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                    return self.ended(end);
                }
                _ = &mut hard => {
                    return DriveOut::kill(Stop::fault(pb::FaultClass::Timeout, format!(
                        "no end of turn within the hard cutoff of {} s (1.2 x {timeout_secs} s)", timeout_secs * 12 / 10)));
                }
            }
        }
    }

    fn ended(&self, end: EndRequest) -> DriveOut {
        let stop = match end {
            EndRequest::Cancel => Stop::reason("cancelled"),
            EndRequest::Decision {
                fault: Some((c, m)),
            } => Stop::fault(c, m),
            EndRequest::Decision { fault: None } => Stop::reason("cancelled"),
            EndRequest::OutputLimit => {
                return DriveOut::kill(Stop::fault(
                    pb::FaultClass::OutputLimit,
                    format!(
                        "retained output passed {} bytes",
                        self.shared.settings().limits().output_bytes
                    ),
                ));
            }
            EndRequest::ModeEscalation(m) => {
                let mut o = DriveOut::kill(Stop::fault(pb::FaultClass::ModeEscalation, m));
                o.fail_conversation = true;
                return o;
            }
            EndRequest::RequestLimit(m) => {
                return DriveOut::kill(Stop::fault(pb::FaultClass::RequestLimit, m));
            }
        };
        // The design's cancel sequence ends with a kill: whatever the agent started for the
        // cancelled turn (tools, setsid'ed helpers) must not outlive it. The next turn restarts
        // the agent (session/load when supported).
        DriveOut {
            stop,
            kill: true,
            fail_conversation: false,
        }
    }

    /// Forwards one agent event to the turn. `Some` ends the turn.
    async fn on_event(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        ev: AcpEvent,
    ) -> Option<DriveOut> {
        let n = match ev {
            AcpEvent::Update(n) => n,
            AcpEvent::ProtocolError(e) => {
                turn.record("protocol_error", json!({"error": e}));
                return None;
            }
            AcpEvent::Fault(f) => {
                if turn.end_reason().is_some() {
                    return Some(self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel)));
                }
                return Some(DriveOut::kill(Stop::fault(
                    translate::fault_class(&f),
                    format!("the agent connection failed: {f}"),
                )));
            }
        };
        if n.session_id != session_id {
            return None;
        }
        match n.event {
            SessionEvent::AgentMessageChunk(c) | SessionEvent::AgentThoughtChunk(c)
                if c.content.as_text().is_none() => {}
            SessionEvent::AgentMessageChunk(c) => {
                let text = c.content.as_text().unwrap_or_default().to_string();
                // The chunk's `_meta` travels as JSON text for the gateway (artifact and A2A
                // hints); it is agent output, so it counts against the output limit too.
                let meta_json = translate::chunk_meta_json(&c);
                turn.add_output(text.len() + meta_json.len());
                turn.record("message", json!({"text": text}));
                turn.emit(Event::MessageChunk(pb::TextChunk { text, meta_json }));
            }
            SessionEvent::AgentThoughtChunk(c) => {
                let text = c.content.as_text().unwrap_or_default().to_string();
                let meta_json = translate::chunk_meta_json(&c);
                turn.add_output(text.len() + meta_json.len());
                turn.record("thought", json!({"text": text}));
                turn.emit(Event::ThoughtChunk(pb::TextChunk { text, meta_json }));
            }
            SessionEvent::ToolCall(tc) => {
                let ev = translate::tool_call(tc);
                turn.add_output(ev.content_text.len() + ev.raw_input_json.len());
                turn.lock().tools.insert(
                    ev.tool_call_id.clone(),
                    ToolSeen {
                        kind: ev.kind.clone(),
                        title: ev.title.clone(),
                        locations: ev.locations.clone(),
                        raw_input_json: ev.raw_input_json.clone(),
                    },
                );
                turn.record(
                    "tool_call",
                    json!({"id": ev.tool_call_id, "kind": ev.kind, "title": ev.title}),
                );
                turn.emit(Event::ToolCall(ev));
            }
            SessionEvent::ToolCallUpdate(u) => {
                let ev = translate::tool_call_update(u);
                turn.add_output(ev.content_text.len() + ev.raw_input_json.len());
                {
                    // What the update sent replaces what was seen; what it left out stays.
                    let mut st = turn.lock();
                    let seen = st.tools.entry(ev.tool_call_id.clone()).or_default();
                    if !ev.kind.is_empty() {
                        seen.kind = ev.kind.clone();
                    }
                    if !ev.title.is_empty() {
                        seen.title = ev.title.clone();
                    }
                    if !ev.locations.is_empty() {
                        seen.locations = ev.locations.clone();
                    }
                    if !ev.raw_input_json.is_empty() {
                        seen.raw_input_json = ev.raw_input_json.clone();
                    }
                }
                turn.record(
                    "tool_call_update",
                    json!({"id": ev.tool_call_id, "status": (!ev.status.is_empty()).then_some(&ev.status)}),
                );
                turn.emit(Event::ToolCall(ev));
            }
            SessionEvent::Plan(entries) => {
                turn.emit(Event::Plan(translate::plan(entries)));
            }
            SessionEvent::UsageUpdate(u) => {
                let usage = {
                    let mut st = turn.lock();
                    st.usage.context_used = u.used;
                    st.usage.context_size = u.size;
                    st.usage
                };
                turn.emit(Event::Usage(usage));
            }
            SessionEvent::CurrentModeUpdate { current_mode_id } => {
                return self.on_mode(p, turn, session_id, current_mode_id).await;
            }
            // Adapters also publish the mode as a config option; a change seen only there is
            // still a mode change.
            SessionEvent::ConfigOptionUpdate(options) => {
                if let Some(mode) = translate::mode_from_config_options(&options) {
                    return self.on_mode(p, turn, session_id, mode).await;
                }
            }
            _ => {}
        }
        None
    }

    /// A mode change reported by the agent. An elevated mode that no ALLOW decision led to is
    /// a fault: the supervised mode is set back, or the conversation ends.
    async fn on_mode(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        mode: String,
    ) -> Option<DriveOut> {
        let judged = {
            let mut l = self.core.live();
            let switches = turn.lock().allowed_switches.clone();
            let j = mode::judge(
                &l.agent_mode,
                &mode,
                |m| self.agent_cfg.is_supervised_mode(m),
                &switches,
            );
            if j != ModeJudgement::Unchanged {
                l.agent_mode = mode.clone();
                l.current_mode = mode.clone();
            }
            j
        };
        if judged == ModeJudgement::Unchanged {
            return None;
        }
        let supervised = judged == ModeJudgement::Supervised;
        turn.record("mode", json!({"mode": mode, "supervised": supervised}));
        turn.emit(Event::ModeChange(pb::ModeChange {
            mode_id: mode.clone(),
            supervised,
            by_supervisor: false,
        }));
        match judged {
            ModeJudgement::Unchanged | ModeJudgement::Supervised => return None,
            ModeJudgement::Allowed(i) => {
                turn.lock().allowed_switches.remove(i);
                return None;
            }
            ModeJudgement::Escalation => {}
        }
        let want = self.agent_cfg.supervised_mode.clone();
        let msg = format!(
            "the agent switched itself to the elevated mode {mode:?} without an allowing decision"
        );
        tracing::warn!(context_id = %self.core.info.context_id, mode = %mode, "mode escalation");
        self.incident(
            pb::FaultClass::ModeEscalation,
            &msg,
            turn,
            turn.input.timeout_secs,
        );
        turn.emit(Event::Fault(fault::fault(
            pb::FaultClass::ModeEscalation,
            msg.clone(),
        )));
        let hs = self.shared.settings().limits().handshake();
        let restored = !want.is_empty()
            && matches!(
                tokio::time::timeout(hs, p.client.set_mode(session_id, &want)).await,
                Ok(Ok(()))
            );
        if restored {
            {
                // The agent is in `want` now, whether or not it echoes it: a second escalation
                // to the same mode must be seen as a change again.
                let mut l = self.core.live();
                l.current_mode = want.clone();
                l.agent_mode = want.clone();
            }
            turn.emit(Event::ModeChange(pb::ModeChange {
                mode_id: want,
                supervised: true,
                by_supervisor: true,
            }));
            return None;
        }
        let mut o = DriveOut::kill(Stop::fault(
            pb::FaultClass::ModeEscalation,
            format!("{msg}; the supervised mode could not be restored, the conversation is ended"),
        ));
        o.fail_conversation = true;
        Some(o)
    }

    fn incident(
        &self,
        class: pb::FaultClass,
        reason: &str,
        turn: &TurnCtx,
        budget_secs: u64,
    ) -> String {
        let transcript = turn
            .lock()
            .transcript
            .as_ref()
            .map(|t| t.path().to_string_lossy().into_owned())
            .unwrap_or_default();
        let inc = Incident {
            class: fault::name(class).into(),
            reason: reason.into(),
            stderr_tail: String::new(),
            agent: self.core.info.agent.clone(),
            verb: self.core.info.verb.clone(),
            profile: self.core.info.profile.as_str().into(),
            budget_secs,
            transcript_path: transcript,
            context_label: label(&self.core.info.context_id),
            turn_label: label(turn.id()),
            at_unix_ms: now_ms(),
        };
        match self.shared.records.incident(&inc) {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write incident record");
                String::new()
            }
        }
    }

    fn finish(&self, turn: &Arc<TurnCtx>, stop: Stop, started: Instant, timeout_secs: u64) {
        let duration = started.elapsed();
        if let Some((class, msg)) = &stop.fault {
            // No agent free within the wait is not the agent's fault: no incident (as at open).
            if *class != pb::FaultClass::Capacity {
                self.incident(*class, msg, turn, timeout_secs);
            }
            turn.emit(Event::Fault(fault::fault(*class, msg.clone())));
        }
        let (
            refusals,
            permissions,
            usage,
            transcript_path,
            (files_changed, files_changed_unknown),
            patch,
        ) = {
            let mut st = turn.lock();
            let path = st
                .transcript
                .as_mut()
                .map(|t| {
                    t.record(
                        "stop",
                        &json!({"reason": stop.reason, "fault": stop.fault.as_ref().map(|f| fault::name(f.0))}),
                    );
                    t.finish();
                    t.path().to_string_lossy().into_owned()
                })
                .unwrap_or_default();
            (
                std::mem::take(&mut st.refusals),
                st.permissions,
                st.usage,
                path,
                std::mem::take(&mut st.files_changed),
                st.patch.take().unwrap_or_default(),
            )
        };
        let health = Health {
            at_unix_ms: now_ms(),
            agent: self.core.info.agent.clone(),
            verb: self.core.info.verb.clone(),
            profile: self.core.info.profile.as_str().into(),
            duration_ms: duration.as_millis() as u64,
            stop_reason: stop.reason.clone(),
            fault: stop.fault.as_ref().map(|f| fault::name(f.0).to_string()),
            refusals: refusals.len(),
            permissions,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
        };
        if let Err(e) = self.shared.records.health(&health) {
            tracing::warn!(error = %e, "health record refused");
        }
        tracing::info!(
            context_id = %self.core.info.context_id,
            turn_id = %turn.id(),
            task_id = %turn.input.task_id,
            stop_reason = %stop.reason,
            refusals = refusals.len(),
            duration_ms = duration.as_millis() as u64,
            "turn finished"
        );
        crate::metrics::turn_ended(
            &stop.reason,
            stop.fault.as_ref().map(|f| crate::fault::name(f.0)),
        );
        crate::metrics::turn_took(duration);
        turn.emit(Event::Stop(pb::TurnStop {
            stop_reason: stop.reason,
            refusals,
            fault: stop
                .fault
                .map(|(class, message)| fault::fault(class, message)),
            transcript_path,
            duration_millis: duration.as_millis() as u64,
            files_changed,
            files_changed_unknown,
            diff: patch.text,
            diff_files: patch.files,
            diff_cut: patch.cut,
        }));
    }
}

/// Entries of a root the supervisor walks before and after a turn to see what changed; a larger
/// root reports `files_changed_unknown`.
pub const ROOT_SNAPSHOT_ENTRIES: usize = 50_000;
/// Changed paths reported per turn at most.
pub const FILES_CHANGED_MAX: usize = 256;

/// What the drive loop decided.
struct DriveOut {
    stop: Stop,
    kill: bool,
    fail_conversation: bool,
}

impl DriveOut {
    fn keep(stop: Stop) -> Self {
        DriveOut {
            stop,
            kill: false,
            fail_conversation: false,
        }
    }
    fn kill(stop: Stop) -> Self {
        DriveOut {
            stop,
            kill: true,
            fail_conversation: false,
        }
    }
}

async fn sleep_until_idle(idle: Option<Duration>, since: Instant) {
    match idle {
        Some(d) => tokio::time::sleep_until((since + d).into()).await,
        None => std::future::pending().await,
    }
}

/// Whether agents run as one uid per conversation, from `sandbox.agent_uid_range`.
pub fn uid_range(shared: &Shared) -> bool {
    shared.spawner.agent_identity().is_none() && !shared.spawner.agent_uid_ranges().is_empty()
}

/// Who a conversation's root and home belong to while it holds no uid: the supervisor itself
/// (its effective uid and gid; the root's group is the supervisor's anyway).
fn parked_owner() -> warden_sandbox::AgentIdentity {
    warden_sandbox::AgentIdentity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

/// Whether any process on the host runs with `uid` as its real, effective, saved or filesystem
/// uid (`/proc/<pid>/status`). A process whose status cannot be read (gone meanwhile) is not
/// counted; one that cannot be parsed is (never a uid given back on a guess).
fn uid_in_use(uid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) else {
            return true;
        };
        let ids: Vec<Option<u32>> = line
            .trim_start_matches("Uid:")
            .split_whitespace()
            .map(|n| n.parse().ok())
            .collect();
        if ids.is_empty() || ids.iter().any(|i| i.is_none_or(|i| i == uid)) {
            return true;
        }
    }
    false
}
