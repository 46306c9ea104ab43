//! One conversation: its agent process, its FIFO of turns and the worker that runs them one at
//! a time, idle stop and restart, close. Starting its agent is [`start`]'s, its own uid
//! [`uid`]'s, one turn from admission to its end [`drive`]'s.

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

mod drive;
mod start;
mod uid;

pub use drive::{FILES_CHANGED_MAX, ROOT_SNAPSHOT_ENTRIES};
pub use uid::uid_range;

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
                    tokio::spawn(async move { worker.worker().await });
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
        tokio::spawn(async move { worker.worker().await });
        Ok(conv)
    }

    pub fn st(&self) -> std::sync::MutexGuard<'_, ConvState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
}

async fn sleep_until_idle(idle: Option<Duration>, since: Instant) {
    match idle {
        Some(d) => tokio::time::sleep_until((since + d).into()).await,
        None => std::future::pending().await,
    }
}
