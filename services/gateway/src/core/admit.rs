//! Admit and send: SendMessage / SendStreamingMessage checked, its agent and context claimed, the
//! task recorded and on disk before the caller is answered, then its turn handed to
//! [`drive`](super::drive). A message on an existing task goes to [`answers`](super::answers).
//!
//! Owns: what a new task must be to start (message, agent, context, text size) and the context
//! claim (also for the MCP front, [`Core::claim_context`]). Must never: start a turn before the
//! task is durable, or let a second principal into a context.

use std::sync::Arc;

use warden_proto::v1::{OpenConversationRequest, Profile, RunTurnRequest};

use super::live::{LiveTask, Subscription, lock};
use super::read::apply_history_length;
use super::shared::{Core, store_err};
use crate::a2a::{Message, Role, SendMessageRequest, Task, TaskState, TaskStatus};
use crate::auth::Identity;
use crate::error::A2aError;
use crate::mapping::{META_KEY, TurnMapper};
use crate::store::{ContextRecord, TaskRecord};
use crate::time::{format_micros, now_micros};

/// Longest accepted `contextId` (it becomes a store key and a supervisor label).
pub const MAX_CONTEXT_ID: usize = 256;

/// What an answer to a task's question did: delivered here (the task is followed here), or by
/// the replica following it (the task as stored right after).
pub(super) enum Answered {
    Here(Arc<LiveTask>),
    Elsewhere(Box<Task>),
}

/// What `send` produced.
pub enum SendOutcome {
    /// Streaming: the snapshot and its events.
    Stream(Box<Subscription>),
    /// Blocking or returnImmediately: the task as the caller should see it.
    Task(Box<Task>),
    /// Blocking, and the agent answered with only a hinted direct reply (`warden.a2a =
    /// "message"`, see [`TurnMapper::direct_message`]): the task's final status message. The task
    /// is still stored, so GetTask/ListTasks keep the record.
    Message(Box<Message>),
}

impl Core {
    /// SendMessage / SendStreamingMessage.
    /// `caller` is the request's own identity: its groups decide which agents it may use.
    pub async fn send(
        self: &Arc<Self>,
        caller: &Identity,
        req: SendMessageRequest,
        streaming: bool,
    ) -> Result<SendOutcome, A2aError> {
        let principal = caller.principal.as_str();
        let msg = &req.message;
        // A stream is counted against its caller's share before anything of it is stored.
        let permit = if streaming {
            Some(self.streams.open(principal)?)
        } else {
            None
        };
        if msg.message_id.trim().is_empty() {
            return Err(A2aError::InvalidParams(
                "message.messageId is required".into(),
            ));
        }
        if msg.role == Role::Agent {
            return Err(A2aError::InvalidParams(
                "message.role must be ROLE_USER".into(),
            ));
        }
        if msg.parts.is_empty() {
            return Err(A2aError::InvalidParams(
                "message.parts must not be empty".into(),
            ));
        }
        // A webhook sent with the message is checked before anything starts.
        let push_cfg = match req
            .configuration
            .as_ref()
            .and_then(|c| c.task_push_notification_config.clone())
        {
            None => None,
            Some(cfg) => {
                let push = self.push_or_unsupported()?;
                let existing = msg.task_id.as_deref().filter(|t| !t.is_empty());
                if let Some(t) = existing {
                    self.owned(principal, t).await?;
                }
                Some(push.check(principal, existing, cfg).await?)
            }
        };
        let history_length = req.configuration.as_ref().and_then(|c| c.history_length);
        let return_immediately = req
            .configuration
            .as_ref()
            .is_some_and(|c| c.return_immediately);
        if let Some(n) = history_length
            && n < 0
        {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        let agent_asked = self.choose_agent(caller, &req).await?;
        if self.agents().task_text_bytes.is_none()
            && let Err(e) = self.refresh_agents().await
        {
            tracing::warn!(error = %e, "cannot list the supervisor's agents");
        }

        let live = match msg.task_id.as_deref().filter(|t| !t.is_empty()) {
            Some(task_id) => {
                if let (Some(cfg), Some(push)) = (push_cfg, self.push()) {
                    push.put(principal, cfg).await?;
                }
                match self.answer(principal, task_id, &req).await? {
                    Answered::Here(live) => live,
                    Answered::Elsewhere(task) => {
                        return self
                            .answered_elsewhere(*task, permit, return_immediately, history_length)
                            .await;
                    }
                }
            }
            None => {
                let (live, run) = self.start(caller, &req, agent_asked, push_cfg).await?;
                // On disk before the caller is answered and the turn starts. Waited for without
                // holding a runtime worker: a wave of tasks starting at once each waited for the
                // disk on a worker, and with every worker waiting the gateway answered nothing,
                // kept no SSE stream alive and accepted no connection (issue 30).
                if let Err(e) = self.store.flush().await {
                    if let Ok(mut m) = self.live.lock() {
                        m.remove(&run.task_id);
                    }
                    return Err(store_err(e));
                }
                let core = self.clone();
                let driven = live.clone();
                // The task's span, in the trace of the request that started it.
                let span = tracing::info_span!("task", task_id = %run.task_id);
                // Not under the principal's poll-time share (`warden-fairshare`): accounted, this
                // long-lived driver made the gateway's own tests twice as slow (measured; the
                // cause is not found yet), so only the request futures are shared.
                tokio::spawn(tracing::Instrument::instrument(
                    async move {
                        core.drive(driven, run).await;
                    },
                    span,
                ));
                live
            }
        };

        if let Some(permit) = permit {
            return Ok(SendOutcome::Stream(Box::new(
                self.held(live.subscribe(), permit),
            )));
        }
        if !return_immediately {
            live.settled().await;
        }
        let (mut task, direct) = {
            let inner = lock(&live.inner);
            (inner.task.clone(), inner.mapper.direct_message())
        };
        if direct
            && task.status.state == TaskState::Completed
            && let Some(m) = task.status.message.take()
        {
            return Ok(SendOutcome::Message(Box::new(m)));
        }
        apply_history_length(&mut task, history_length)?;
        Ok(SendOutcome::Task(Box::new(task)))
    }

    pub(super) async fn choose_agent(
        &self,
        caller: &Identity,
        req: &SendMessageRequest,
    ) -> Result<Option<String>, A2aError> {
        let from = |m: &Option<crate::a2a::Metadata>| -> Option<String> {
            let m = m.as_ref()?;
            m.get(META_KEY)
                .and_then(|w| w.get("agent"))
                .or_else(|| m.get("agent"))
                .or_else(|| m.get("skill"))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let asked = from(&req.message.metadata).or_else(|| from(&req.metadata));
        let Some(a) = asked else { return Ok(None) };
        self.resolve_agent(caller, Some(&a)).await.map(Some)
    }

    /// A new task: records it (not yet flushed: the caller waits for the disk, then starts its
    /// turn with the returned request).
    pub(super) async fn start(
        self: &Arc<Self>,
        caller: &Identity,
        req: &SendMessageRequest,
        agent_asked: Option<String>,
        push_cfg: Option<crate::a2a::TaskPushNotificationConfig>,
    ) -> Result<(Arc<LiveTask>, RunTurnRequest), A2aError> {
        let principal = caller.principal.as_str();
        let msg = &req.message;
        // A text the supervisor would refuse is refused here, before a byte of it is stored:
        // a rejected request must not cost disk for the retention period.
        let text = msg.prompt_text();
        if let Some(limit) = self.agents().task_text_bytes
            && text.len() > limit
        {
            return Err(A2aError::InvalidParams(format!(
                "prompt-too-large: task text is {} bytes, the limit is {limit}",
                text.len()
            )));
        }
        let asked = Asked::of(req)?;
        if !self.may_use_workspace(caller, &asked.workspace) {
            return Err(A2aError::InvalidParams(format!(
                "workspace {:?} is not available to you (the gateway's [[agents.access]] rules)",
                asked.workspace
            )));
        }
        let context_id = match msg.context_id.as_deref().filter(|c| !c.is_empty()) {
            Some(c) if c.len() > MAX_CONTEXT_ID || c.chars().any(char::is_control) => {
                return Err(A2aError::InvalidParams(format!(
                    "contextId must be at most {MAX_CONTEXT_ID} characters without control characters"
                )));
            }
            Some(c) => c.to_string(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let now = now_micros();
        let agent = {
            let _g = self.contexts_guard.lock().await;
            // The agent a new context would run: checked before it is claimed.
            let existing = self.store.context(&context_id).await.map_err(store_err)?;
            let fresh_agent = match &existing {
                Some(ctx) => ctx.agent.clone(),
                None => {
                    let agent = agent_asked.clone().unwrap_or_else(|| self.agents().default);
                    // The default too must be one of the caller's agents: for a restricted
                    // caller "the supervisor's default" ("") is named, so it can be checked.
                    if (agent.is_empty() && self.restricted(caller))
                        || !self.may_use(caller, &agent)
                    {
                        return Err(self.refuse_agent(caller, &agent));
                    }
                    agent
                }
            };
            // Claimed atomically (replicas share the store): the first principal owns it.
            let ctx = self
                .store
                .claim_context(
                    &context_id,
                    &ContextRecord {
                        principal: principal.to_string(),
                        agent: fresh_agent,
                        created_micros: now,
                        last_task_micros: now,
                        closed_micros: None,
                    },
                )
                .await
                .map_err(store_err)?;
            if ctx.principal != principal {
                // Another principal's conversation does not exist for this caller.
                return Err(A2aError::TaskNotFound(format!("context {context_id}")));
            }
            if !self.may_use(caller, &ctx.agent) {
                return Err(self.refuse_agent(caller, &ctx.agent));
            }
            if let Some(a) = &agent_asked
                && *a != ctx.agent
            {
                return Err(A2aError::InvalidParams(format!(
                    "context {context_id} runs agent {:?}; start a new context for {a:?}",
                    ctx.agent
                )));
            }
            ctx.agent
        };
        let task_id = uuid::Uuid::new_v4().to_string();
        let mut user = msg.clone();
        user.task_id = Some(task_id.clone());
        user.context_id = Some(context_id.clone());
        let status = TaskStatus {
            state: TaskState::Submitted,
            message: None,
            timestamp: Some(format_micros(now)),
        };
        let head = Task {
            id: task_id.clone(),
            context_id: context_id.clone(),
            status,
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        };
        let record = TaskRecord {
            task: head.clone(),
            principal: principal.to_string(),
            agent: agent.clone(),
            created_micros: now,
            status_micros: now,
        };
        self.store.put_head(&record).await.map_err(store_err)?;
        self.store
            .put_history_segment(&task_id, 0, std::slice::from_ref(&user))
            .await
            .map_err(store_err)?;
        let mut task = head;
        task.history.push(user.clone());
        let live = Arc::new(LiveTask::new(
            task,
            record,
            TurnMapper::new(&task_id, &context_id)
                .with_coalesce_bytes(self.settings.coalesce_bytes),
            self.store.clone(),
            self.push().cloned(),
        ));
        // The task's webhook is stored before its turn starts, so it sees every change.
        if let (Some(mut cfg), Some(push)) = (push_cfg, self.push()) {
            cfg.task_id = task_id.clone();
            push.put(principal, cfg).await?;
        }
        if let Ok(mut m) = self.live.lock() {
            m.insert(task_id.clone(), live.clone());
        }
        tracing::info!(task_id = %task_id, context_id = %context_id, principal, agent = %agent, message_id = %msg.message_id, "task submitted");
        let run = RunTurnRequest {
            context_id: context_id.clone(),
            turn_id: task_id.clone(),
            text,
            message_id: msg.message_id.clone(),
            task_id: task_id.clone(),
            timeout_seconds: self.settings.turn_timeout_seconds,
            instructions: String::new(),
            open: Some(OpenConversationRequest {
                context_id,
                agent,
                workspace: asked.workspace,
                profile: asked.profile as i32,
                principal: principal.to_string(),
                verb: asked.verb.to_string(),
                model: asked.model,
                effort: asked.effort,
                copy_from: asked.copy_from,
            }),
            // This request's identity, for the policy's subject of the turn's permissions.
            groups: caller.groups.clone(),
            issuer: caller.issuer.clone().unwrap_or_default(),
        };
        Ok((live, run))
    }

    /// Claims `context_id` for `principal` for a turn that is not an A2A task (the MCP front):
    /// recorded as an A2A context is, so no other principal can reach its conversation through
    /// either front, the sweep closes it after the conversation TTL, and a close the sweep has
    /// under way is waited for. TaskNotFound (as for A2A) when another principal owns it.
    pub async fn claim_context(
        &self,
        principal: &str,
        context_id: &str,
        agent: &str,
    ) -> Result<(), A2aError> {
        let now = now_micros();
        {
            let _g = self.contexts_guard.lock().await;
            let fresh = ContextRecord {
                principal: principal.to_string(),
                agent: agent.to_string(),
                created_micros: now,
                last_task_micros: now,
                closed_micros: None,
            };
            let rec = self
                .store
                .claim_context(context_id, &fresh)
                .await
                .map_err(store_err)?;
            if rec.principal != principal {
                return Err(A2aError::TaskNotFound(format!("context {context_id}")));
            }
        }
        self.closing.wait(context_id).await;
        Ok(())
    }
}

/// What the caller asked of its conversation in `metadata.warden` (of the message, else of the
/// request), as `warden send` sends it. Only shapes are checked here; the supervisor alone
/// decides whether it copies a directory and whether the agent offers a model or effort.
///
/// - `copyFrom`: the directory the new root is a copy of (absolute, bounded, no control
///   characters; `[copies]` at the supervisor: a local deployment's own user's directories);
/// - `workspace`: an operator workspace (`[[workspaces]]` at the supervisor) the agent works in
///   directly, as MCP's `bind_workspace` does, when `[[agents.access]]` lets the caller use it;
///   not with `copyFrom`;
/// - `model`, `effort`: applied through the agent's ACP session config options, refused by the
///   supervisor (`option-not-offered`, naming what is) when the agent offers no such value;
/// - `mode`: `edit` (default, profile workspace-write), `read-only` (profile read-only: the
///   policy floor denies every edit, delete, move, execute and fetch), `plan` (read-only, verb
///   `advise`: the agent's planning option where it has one).
struct Asked {
    copy_from: String,
    workspace: String,
    model: String,
    effort: String,
    profile: Profile,
    verb: &'static str,
}

/// The modes `metadata.warden.mode` may name.
pub const MODES: &[&str] = &["read-only", "edit", "plan"];
/// The longest model or effort name (the supervisor's own bound).
const MAX_OPTION: usize = 128;

impl Asked {
    fn of(req: &SendMessageRequest) -> Result<Self, A2aError> {
        let get = |key: &str| -> Option<serde_json::Value> {
            let of =
                |m: &Option<crate::a2a::Metadata>| m.as_ref()?.get(META_KEY)?.get(key).cloned();
            of(&req.message.metadata).or_else(|| of(&req.metadata))
        };
        let copy_from = match get("copyFrom") {
            None => String::new(),
            Some(v) => match v.as_str() {
                Some(p)
                    if p.starts_with('/')
                        && p.len() <= 4096
                        && !p.chars().any(char::is_control) =>
                {
                    p.to_string()
                }
                _ => {
                    return Err(A2aError::InvalidParams(
                        "metadata.warden.copyFrom must be an absolute path of at most 4096 bytes"
                            .into(),
                    ));
                }
            },
        };
        let option = |key: &str| -> Result<String, A2aError> {
            match get(key) {
                None => Ok(String::new()),
                Some(v) => match v.as_str() {
                    Some(s)
                        if !s.is_empty()
                            && s.len() <= MAX_OPTION
                            && !s.chars().any(char::is_control) =>
                    {
                        Ok(s.to_string())
                    }
                    _ => Err(A2aError::InvalidParams(format!(
                        "metadata.warden.{key} must be a non-empty string of at most {MAX_OPTION} bytes without control characters"
                    ))),
                },
            }
        };
        let workspace = match get("workspace") {
            None => String::new(),
            Some(v) => match v.as_str() {
                Some(w)
                    if !w.is_empty()
                        && w.len() <= MAX_OPTION
                        && w.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
                {
                    w.to_string()
                }
                _ => {
                    return Err(A2aError::InvalidParams(format!(
                        "metadata.warden.workspace must be a workspace's name (letters, digits, '-', '_', '.'; at most {MAX_OPTION} bytes)"
                    )));
                }
            },
        };
        if !workspace.is_empty() && !copy_from.is_empty() {
            return Err(A2aError::InvalidParams(
                "metadata.warden names both a workspace and a directory to copy (copyFrom); name one"
                    .into(),
            ));
        }
        let (profile, verb) = match get("mode") {
            None => (Profile::WorkspaceWrite, "task"),
            Some(v) => match v.as_str() {
                Some("edit") => (Profile::WorkspaceWrite, "task"),
                Some("read-only") => (Profile::ReadOnly, "task"),
                Some("plan") => (Profile::ReadOnly, "advise"),
                _ => {
                    return Err(A2aError::InvalidParams(format!(
                        "metadata.warden.mode {v} is not a mode; one of: {}",
                        MODES.join(", ")
                    )));
                }
            },
        };
        Ok(Asked {
            copy_from,
            workspace,
            model: option("model")?,
            effort: option("effort")?,
            profile,
            verb,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{CoreSettings, Retention};
    use crate::store::TaskStore;
    use crate::store_sled::SledStore;
    use std::time::Duration;

    /// Issue 30's wave stall, without the daemons: every stream, the accept loop and the SSE
    /// keep-alives run on the runtime's workers, and a task's start waited for the disk
    /// (`flush`) on one. As many starts waiting on a slow disk as there are workers stopped the
    /// whole gateway — no answer, no keep-alive, for any stream — until the disk came back.
    /// Here the store's flushes wait on a gate while four tasks start on a two-worker runtime;
    /// a task that only needs the runtime must still run, and every start finishes once the
    /// disk answers.
    #[test]
    fn tasks_waiting_on_the_disk_do_not_stop_the_runtime() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sled = SledStore::open(dir.path()).unwrap();
        let gate = sled.flush_gate.clone();
        let store: TaskStore = Arc::new(sled);
        let closed = gate.write().unwrap();
        let core = {
            let _rt = rt.enter();
            // Nobody listens there: a turn that gets as far as RunTurn fails, which is fine.
            let channel =
                warden_daemon::client::unix_channel(&dir.path().join("no-supervisor.sock"));
            Core::new(
                store,
                channel,
                CoreSettings {
                    agents: vec!["scripted".into()],
                    default_agent: "scripted".into(),
                    turn_timeout_seconds: 0,
                    cancel_grace: Duration::from_secs(1),
                    coalesce_bytes: crate::mapping::DEFAULT_COALESCE_BYTES,
                    retention: Retention::default(),
                    max_streams_per_principal: 1024,
                    stream_keepalive: Duration::from_secs(15),
                },
            )
        };
        // Known limits, so no send asks the (absent) supervisor first.
        core.agents.write().unwrap().task_text_bytes = Some(16384);
        let message = |i: usize| SendMessageRequest {
            tenant: None,
            message: Message {
                message_id: format!("m{i}"),
                context_id: Some(format!("ctx-{i}")),
                task_id: None,
                role: Role::User,
                parts: vec![crate::a2a::Part::text("hello")],
                metadata: None,
                extensions: vec![],
                reference_task_ids: vec![],
            },
            configuration: None,
            metadata: None,
        };
        let mut sends = Vec::new();
        for i in 0..4 {
            let core = core.clone();
            let req = message(i);
            sends.push(rt.spawn(async move {
                core.send(&Identity::plain("alice"), req, true)
                    .await
                    .is_ok()
            }));
        }
        // Give the starts time to reach the disk and wait there.
        std::thread::sleep(Duration::from_millis(300));
        let ran = Arc::new(AtomicBool::new(false));
        {
            let ran = ran.clone();
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ran.store(true, Ordering::SeqCst);
            });
        }
        let t0 = std::time::Instant::now();
        while !ran.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let alive = ran.load(Ordering::SeqCst);
        // The disk comes back: every start finishes.
        drop(closed);
        for s in sends {
            assert!(rt.block_on(s).unwrap(), "a send failed");
        }
        assert!(
            alive,
            "while the store's flushes waited, a task needing only the runtime did not run within 3 s"
        );
        rt.shutdown_timeout(Duration::from_secs(5));
    }

    /// `metadata.warden.mode|model|effort|copyFrom`, as `warden send` sends them: each mode
    /// mapped to its profile and verb, anything else refused as invalid params naming why.
    #[test]
    fn the_callers_mode_model_and_effort_are_checked_and_mapped() {
        let req = |meta: serde_json::Value| -> SendMessageRequest {
            serde_json::from_value(
                serde_json::json!({"message": {"messageId": "m", "role": "ROLE_USER",
                "parts": [{"text": "x"}], "metadata": {"warden": meta}}}),
            )
            .unwrap()
        };
        let a = Asked::of(&req(serde_json::json!({}))).unwrap();
        assert_eq!((a.profile, a.verb), (Profile::WorkspaceWrite, "task"));
        for (mode, profile, verb) in [
            ("edit", Profile::WorkspaceWrite, "task"),
            ("read-only", Profile::ReadOnly, "task"),
            ("plan", Profile::ReadOnly, "advise"),
        ] {
            let a = Asked::of(&req(serde_json::json!({"mode": mode}))).unwrap();
            assert_eq!((a.profile, a.verb), (profile, verb), "{mode}");
        }
        let a = Asked::of(&req(
            serde_json::json!({"model": "m1", "effort": "high", "copyFrom": "/src"}),
        ))
        .unwrap();
        assert_eq!(
            (a.model.as_str(), a.effort.as_str(), a.copy_from.as_str()),
            ("m1", "high", "/src")
        );
        let a = Asked::of(&req(serde_json::json!({"workspace": "shared-1.x"}))).unwrap();
        assert_eq!(
            (a.workspace.as_str(), a.copy_from.as_str()),
            ("shared-1.x", "")
        );
        for bad in [
            serde_json::json!({"mode": "yolo"}),
            serde_json::json!({"mode": 1}),
            serde_json::json!({"model": ""}),
            serde_json::json!({"model": "m".repeat(129)}),
            serde_json::json!({"effort": "a\u{1b}b"}),
            serde_json::json!({"copyFrom": "relative"}),
            serde_json::json!({"workspace": "../etc"}),
            serde_json::json!({"workspace": ""}),
            serde_json::json!({"workspace": "shared", "copyFrom": "/src"}),
        ] {
            assert!(
                matches!(
                    Asked::of(&req(bad.clone())),
                    Err(A2aError::InvalidParams(_))
                ),
                "{bad}"
            );
        }
    }
}
