//! The MCP server proper (an rmcp `ServerHandler`): the tool inventory, the verbs over
//! supervisor turns, `bind_workspace` with elicitation ([`bind`]), `status`, background jobs
//! ([`jobs`]) and stateless runs resumed by a later call ([`runs`]).
//!
//! Conversations: one per (scope, profile, workspace, agent), where the scope is the MCP session
//! (2025-11-25) or, statelessly (2026-07-28), the principal. Each is claimed in the gateway's
//! context store for its principal exactly as an A2A context is, so the two fronts share one
//! ownership rule and the conversation TTL closes idle ones.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, Implementation,
    InputRequest, InputRequiredResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use warden_proto::v1::{
    CloseConversationRequest, ListWorkspacesRequest, OpenConversationRequest, RunTurnRequest,
    WorkspaceInfo,
};

use super::envelope::{Blocker, Envelope, Harness};
use super::sessions::SessionTable;
use super::tools::{self, Verb, VerbArgs};
use super::turn::{self, Answer, Ask, NotStarted, Progress, Question};
use super::workspace;
use crate::config::McpSection;
use crate::core::Core;

mod bind;
mod jobs;
mod runs;

use jobs::{Job, JobState};

/// Who is calling, as the HTTP edge authenticated it (put in the request's extensions).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The request's own identity: its groups decide which agents and workspaces it may use.
    pub identity: crate::auth::Identity,
    /// The inherited recursion depth (`Warden-Depth`, set by `warden mcp` from `WARDEN_DEPTH`).
    pub depth: u32,
}

/// A confirmed binding.
#[derive(Debug, Clone, Serialize)]
pub struct Binding {
    pub workspace: String,
    pub path: String,
    #[serde(skip)]
    pub identity: String,
    pub fingerprint: String,
    pub bound_at: String,
}

#[derive(Default)]
struct Scope {
    binding: Mutex<Option<Binding>>,
    /// (profile, workspace, agent) → context id.
    contexts: Mutex<HashMap<(i32, String, String), String>>,
}

/// A question of the agent as the stateless (2026-07-28) request loop hands it over: the
/// request answers input-required and the retry carries the answer.
type Asked = (Question, tokio::sync::oneshot::Sender<Option<Answer>>);

/// A stateless verb call whose turn runs on while the caller answers the agent's question
/// (MRTR): the turn, its next question, and the reply to the question asked.
struct PendingRun {
    principal: String,
    questions: tokio::sync::mpsc::Receiver<Asked>,
    done: tokio::sync::oneshot::Receiver<Envelope>,
    cancel: CancellationToken,
    reply: tokio::sync::oneshot::Sender<Option<Answer>>,
    plain: bool,
    at: Instant,
}

/// A stateless bind waiting for its elicitation answer (MRTR, 2026-07-28).
struct PendingBind {
    principal: String,
    scope: String,
    candidates: Vec<WorkspaceInfo>,
    at: Instant,
}

/// A stateless bind answer must come back within this.
const PENDING_BIND_TTL: Duration = Duration::from_secs(600);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state shared by every MCP session and request.
pub struct McpFront {
    pub core: Arc<Core>,
    pub cfg: McpSection,
    pub cancel_grace: Duration,
    scopes: Mutex<HashMap<String, Arc<Scope>>>,
    /// Open MCP sessions: the principal that opened each, the shares, idleness.
    pub sessions: Arc<SessionTable>,
    pending: Mutex<HashMap<String, PendingBind>>,
    runs: Mutex<HashMap<String, PendingRun>>,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
}

impl McpFront {
    pub fn new(core: Arc<Core>, cfg: McpSection, cancel_grace: Duration) -> Arc<Self> {
        let sessions = SessionTable::new(
            cfg.max_sessions,
            cfg.sessions_per_principal(),
            Duration::from_secs(cfg.session_idle_seconds),
        );
        Arc::new(Self {
            core,
            cfg,
            cancel_grace,
            scopes: Mutex::new(HashMap::new()),
            sessions,
            pending: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            jobs: Mutex::new(HashMap::new()),
        })
    }

    /// The principal that opened session `sid`, if it is known.
    pub fn session_owner(&self, sid: &str) -> Option<String> {
        self.sessions.owner(sid)
    }

    /// A session ended (DELETE, idle, or its rmcp worker stopped): its share comes back, its
    /// binding goes, and its conversations are closed at the supervisor unless a background
    /// job still runs in one. Ending a session twice does nothing the second time.
    pub fn session_closed(self: &Arc<Self>, sid: &str) {
        let Some(principal) = self.sessions.remove(sid) else {
            return;
        };
        let scope = {
            let mut scopes = lock(&self.scopes);
            let scope = scopes.remove(&format!("s:{sid}"));
            if scopes.capacity() > 2 * scopes.len() + 64 {
                scopes.shrink_to_fit();
            }
            scope
        };
        let Some(scope) = scope else {
            return;
        };
        let contexts: Vec<String> = lock(&scope.contexts).values().cloned().collect();
        let busy: Vec<String> = lock(&self.jobs)
            .values()
            .filter(|j| lock(&j.inner).state == JobState::Running)
            .filter_map(|j| lock(&j.context_id).clone())
            .collect();
        let core = self.core.clone();
        tokio::spawn(async move {
            for context_id in contexts.into_iter().filter(|c| !busy.contains(c)) {
                let r = match core.route(&context_id, None).await {
                    Ok(routed) => routed
                        .client
                        .clone()
                        .close_conversation(CloseConversationRequest {
                            context_id: context_id.clone(),
                            principal: principal.clone(),
                        })
                        .await
                        .map(|_| ()),
                    Err(f) => Err(tonic::Status::unavailable(f.message)),
                };
                tracing::info!(context_id = %context_id, ok = r.is_ok(), "MCP session ended; conversation closed");
            }
        });
    }

    fn scope(&self, key: &str) -> Arc<Scope> {
        lock(&self.scopes)
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    async fn workspaces(&self) -> Result<Vec<WorkspaceInfo>, String> {
        self.core
            .supervisor()
            .list_workspaces(ListWorkspacesRequest {})
            .await
            .map(|r| r.into_inner().workspaces)
            .map_err(|s| format!("cannot list the operator's workspaces: {}", s.message()))
    }

    /// The binding, re-checked against what the supervisor resolves now: a workspace that
    /// moved, vanished or now names another directory voids it.
    async fn current_binding(&self, scope: &Scope) -> Result<Option<Binding>, String> {
        let Some(b) = lock(&scope.binding).clone() else {
            return Ok(None);
        };
        let now = self.workspaces().await?;
        let same = now
            .iter()
            .any(|w| w.name == b.workspace && w.path == b.path && w.identity == b.identity);
        if !same {
            *lock(&scope.binding) = None;
            return Err(format!(
                "the bound workspace {:?} ({}) changed or is no longer allowed; the binding was cleared: bind again",
                b.workspace, b.path
            ));
        }
        Ok(Some(b))
    }

    fn context_for(&self, scope: &Scope, profile: i32, workspace: &str, agent: &str) -> String {
        lock(&scope.contexts)
            .entry((profile, workspace.to_string(), agent.to_string()))
            .or_insert_with(|| format!("mcp-{}", uuid::Uuid::new_v4()))
            .clone()
    }

    /// The agent a verb runs, by the gateway's one access rule (the same as A2A's): a refusal
    /// names only the caller's own agents.
    async fn resolve_agent(
        &self,
        caller: &crate::auth::Identity,
        asked: Option<&str>,
    ) -> Result<String, String> {
        self.core
            .resolve_agent(caller, asked)
            .await
            .map_err(|e| e.to_string())
    }

    /// One verb call, from its parsed arguments to its envelope.
    #[allow(clippy::too_many_arguments)]
    async fn run_verb(
        &self,
        verb: Verb,
        args: VerbArgs,
        caller: &Caller,
        scope: &Scope,
        run_id: String,
        ask: &Ask,
        progress: &Progress,
        cancel: CancellationToken,
        on_context: &(dyn Fn(&str) + Send + Sync),
    ) -> Envelope {
        let started = Instant::now();
        let mut h = Harness {
            run_id: run_id.clone(),
            verb: verb.name().into(),
            agent: args.agent.clone().unwrap_or_default(),
            depth: caller.depth,
            duration_ms: 0,
            attempts: 0,
        };
        let refused = |mut h: Harness, rule: &str, why: String| {
            h.duration_ms = started.elapsed().as_millis() as u64;
            tracing::info!(run_id = %h.run_id, verb = %h.verb, rule, reason = %why, "MCP call refused");
            Envelope::refused(h, Blocker::refused(rule, why))
        };
        if caller.depth >= 1 {
            return refused(
                h,
                "mcp.recursion",
                format!(
                    "called from inside a warden-run agent (depth {}): a call at depth 1 or more is refused before any agent starts",
                    caller.depth
                ),
            );
        }
        let agent = match self
            .resolve_agent(&caller.identity, args.agent.as_deref())
            .await
        {
            Ok(a) => a,
            Err(e) => return refused(h, "mcp.agent.unknown", e),
        };
        h.agent = agent.clone();
        let binding = match self.current_binding(scope).await {
            Ok(b) => b,
            Err(e) => return refused(h, "mcp.binding.void", e),
        };
        let workspace = binding
            .as_ref()
            .map(|b| b.workspace.clone())
            .unwrap_or_default();
        if !self.core.may_use_workspace(&caller.identity, &workspace) {
            *lock(&scope.binding) = None;
            return refused(
                h,
                "mcp.binding.void",
                "the bound workspace is not available to you; the binding was cleared".into(),
            );
        }
        let profile = verb.profile() as i32;
        let context_id = self.context_for(scope, profile, &workspace, &agent);
        if let Err(e) = self
            .core
            .claim_context(&caller.identity.principal, &context_id, &agent)
            .await
        {
            return refused(h, "mcp.context", e.to_string());
        }
        on_context(&context_id);
        let instructions = instructions(verb);
        let timeout_seconds = args
            .timeout_seconds
            .unwrap_or(self.cfg.default_timeout_seconds);
        let attempts = if verb.retried_on_timeout() { 2 } else { 1 };
        // Keep the context fresh for the sweep while a long turn runs.
        let toucher = {
            let core = self.core.clone();
            let (p, c, a) = (
                caller.identity.principal.clone(),
                context_id.clone(),
                agent.clone(),
            );
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let _ = core.claim_context(&p, &c, &a).await;
                }
            })
        };
        let mut last = None;
        for attempt in 1..=attempts {
            h.attempts = attempt;
            let req = RunTurnRequest {
                context_id: context_id.clone(),
                turn_id: format!("{run_id}-{attempt}"),
                text: args.task.clone(),
                instructions: instructions.clone(),
                message_id: run_id.clone(),
                task_id: format!("{run_id}-{attempt}"),
                timeout_seconds,
                open: Some(OpenConversationRequest {
                    context_id: context_id.clone(),
                    agent: agent.clone(),
                    workspace: workspace.clone(),
                    profile,
                    principal: caller.identity.principal.clone(),
                    verb: verb.name().into(),
                    model: args.model.clone().unwrap_or_default(),
                    effort: args.effort.clone().unwrap_or_default(),
                    // MCP works in an operator workspace or its own sandbox, never on a copy.
                    copy_from: String::new(),
                }),
                // This request's identity, for the policy's subject of the turn's permissions.
                groups: caller.identity.groups.clone(),
                issuer: caller.identity.issuer.clone().unwrap_or_default(),
            };
            tracing::info!(run_id = %run_id, context_id = %context_id, verb = verb.name(), attempt, principal = %caller.identity.principal, "MCP turn");
            match turn::run(
                &self.core,
                req,
                ask,
                progress,
                cancel.clone(),
                self.cancel_grace,
            )
            .await
            {
                Ok(o) => {
                    let retry = o.timed_out() && attempt < attempts && !cancel.is_cancelled();
                    last = Some(o);
                    if retry {
                        progress("the attempt timed out; retrying once (read verb)".into());
                        continue;
                    }
                    break;
                }
                Err(NotStarted::Refused(rule, why)) => {
                    toucher.abort();
                    return refused(h, rule, why);
                }
                Err(NotStarted::Fault(f)) => {
                    last = Some(super::envelope::Observed {
                        faults: vec![f],
                        stop_reason: "fault".into(),
                        ..Default::default()
                    });
                    break;
                }
            }
        }
        toucher.abort();
        h.duration_ms = started.elapsed().as_millis() as u64;
        let o = last.unwrap_or_default();
        let e = Envelope::from_observed(h, &o);
        tracing::info!(run_id = %run_id, status = ?e.status, attempts = e.attempts, blockers = e.blockers.len(), "MCP call finished");
        e
    }
}

/// What warden asks of every agent for this verb, sent as the turn's instructions (a second text
/// block after the task, outside the task's size limit).
pub fn instructions(verb: Verb) -> String {
    let mut p = String::from("[warden] ");
    p.push_str(match verb {
        Verb::Advise => "Verb: advise. Read-only: give advice; do not edit, delete, move, run or fetch anything.",
        Verb::Review => "Verb: review. Read-only: review and report findings; do not edit, delete, move, run or fetch anything.",
        Verb::Implement => "Verb: implement. Make the change in the workspace. Leave every change unstaged and uncommitted and run no git write (no commit, no push): the caller reviews the diff.",
    });
    p.push_str("\n[warden] End your answer with one JSON object with exactly these fields: {\"status\": \"complete\"|\"partial\"|\"blocked\", \"verdict\": string, \"findings\": [string], \"files_touched\": [string], \"remaining\": [string], \"blockers\": [string]}.");
    p
}

fn caller_of(ctx: &RequestContext<RoleServer>) -> Result<(Caller, String), McpError> {
    let parts = ctx
        .extensions
        .get::<http::request::Parts>()
        .ok_or_else(|| McpError::internal_error("no HTTP request context", None))?;
    let caller = parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
        McpError::internal_error("unauthenticated request reached the handler", None)
    })?;
    let scope = match parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        Some(sid) if !stateless(ctx) => format!("s:{sid}"),
        _ => format!("p:{}", caller.identity.principal),
    };
    Ok((caller, scope))
}

fn stateless(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v.as_str() >= "2026-07-28")
}

fn can_elicit(ctx: &RequestContext<RoleServer>) -> bool {
    if stateless(ctx) {
        return ctx
            .meta
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some());
    }
    ctx.peer
        .supported_elicitation_modes()
        .contains(&rmcp::service::ElicitationMode::Form)
}

fn envelope_result(e: &Envelope) -> CallToolResult {
    let v = e.to_value();
    let mut r = CallToolResult::structured(v.clone());
    r.content = vec![ContentBlock::text(v.to_string())];
    r.is_error = Some(e.status.is_error());
    r
}

fn json_result(v: Value, is_error: bool) -> CallToolResult {
    let mut r = CallToolResult::structured(v.clone());
    r.content = vec![ContentBlock::text(v.to_string())];
    r.is_error = Some(is_error);
    r
}

fn schema(v: Value) -> Option<ElicitationSchema> {
    serde_json::from_value(v).ok()
}

/// Progress as notifications on the request's stream, in order, when the caller asked for them.
/// The handle finishes once the last line is sent (after the sender is dropped): the result is
/// sent after it, so no notification is lost behind a stateless stream that closes.
fn progress_sender(
    ctx: &RequestContext<RoleServer>,
) -> (Arc<Progress>, Option<tokio::task::JoinHandle<()>>) {
    let Some(token) = ctx.meta.get_progress_token() else {
        return (Arc::new(|_| {}), None);
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let peer = ctx.peer.clone();
    let task = tokio::spawn(async move {
        let mut n = 0u64;
        while let Some(line) = rx.recv().await {
            n += 1;
            let p = ProgressNotificationParam::new(token.clone(), n as f64).with_message(line);
            if peer.notify_progress(p).await.is_err() {
                break;
            }
        }
    });
    (
        Arc::new(move |line| {
            let _ = tx.send(line);
        }),
        Some(task),
    )
}

/// The elicitation form for an agent's question, and whether it is warden's plain one-string
/// form (the agent sent no usable schema: its answer is then sent as a JSON string).
fn question_form(q: &Question) -> Option<(ElicitRequestParams, bool)> {
    let given: Option<ElicitationSchema> = serde_json::from_str::<Value>(&q.schema_json)
        .ok()
        .and_then(schema);
    let plain = given.is_none();
    let requested_schema = match given {
        Some(s) => s,
        None => schema(
            json!({"type": "object", "properties": {"answer": {"type": "string", "title": "Your answer"}}, "required": ["answer"]}),
        )?,
    };
    Some((
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: format!("The supervised agent asks: {}", q.message),
            requested_schema,
        },
        plain,
    ))
}

/// The agent's questions as form elicitation to the caller (2025-11-25 sessions).
fn asker(ctx: &RequestContext<RoleServer>) -> Arc<Ask> {
    if stateless(ctx) || !can_elicit(ctx) {
        return Arc::new(|_| futures::future::ready(None).boxed());
    }
    let peer = ctx.peer.clone();
    Arc::new(move |q: Question| {
        let peer = peer.clone();
        async move {
            let (params, plain) = question_form(&q)?;
            let r = peer.create_elicitation(params).await.ok()?;
            Some(answer_of(&r, plain))
        }
        .boxed()
    })
}

fn answer_of(r: &ElicitResult, plain: bool) -> Answer {
    match r.action {
        ElicitationAction::Accept => {
            let content = match (&r.content, plain) {
                (Some(c), true) => c
                    .get("answer")
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| c.to_string()),
                (Some(c), false) => c.to_string(),
                (None, _) => "{}".into(),
            };
            ("accept".into(), content)
        }
        ElicitationAction::Decline => ("decline".into(), String::new()),
        _ => ("cancel".into(), String::new()),
    }
}

impl McpFront {
    fn status(
        &self,
        caller: &Caller,
        scope_key: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let scope = self.scope(scope_key);
        let b = lock(&scope.binding).clone();
        json_result(
            json!({
                "server": "warden-gateway",
                "version": env!("CARGO_PKG_VERSION"),
                "principal": caller.identity.principal,
                "protocol": ctx.protocol_version().map(|v| v.as_str().to_string()),
                "era": if stateless(ctx) { "stateless" } else { "session" },
                "binding": b.as_ref().map(|b| serde_json::to_value(b).unwrap_or(Value::Null)),
                "workspace": b.as_ref().map(|b| b.path.clone()),
                "workspace_fingerprint": b.as_ref().map(|b| b.fingerprint.clone()),
                "tools": tools::INVENTORY,
                "depth": caller.depth,
                "agents": self.core.agents_for(&caller.identity).agents.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
                "limits": {"task_max_bytes": self.cfg.task_max_bytes, "max_timeout_seconds": self.cfg.max_timeout_seconds,
                           "default_timeout_seconds": self.cfg.default_timeout_seconds},
            }),
            false,
        )
    }

    // ------------------------------------------------------------------ stateless questions

    // ------------------------------------------------------------------ background jobs
}

/// The rmcp handler: one per MCP session (or per stateless request), all sharing [`McpFront`].
#[derive(Clone)]
pub struct Handler {
    pub front: Arc<McpFront>,
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("warden", env!("CARGO_PKG_VERSION"))
                    .with_title("warden: supervised coding agents"),
            )
            .with_instructions(
                "Hand work to a coding agent that warden supervises: advise and review are read-only, implement may change the workspace. Every action the agent takes is judged by warden's policy, never by you. Call bind_workspace first to work in an operator workspace (the human confirms it); unbound calls run in a fresh sandbox.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::list(
            self.front.cfg.task_max_bytes,
            self.front.cfg.max_timeout_seconds,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (caller, scope_key) = caller_of(&ctx)?;
        let front = &self.front;
        let args = request.arguments.clone().unwrap_or_default();
        let cfg = &front.cfg;
        let verb = match request.name.as_ref() {
            tools::ADVISE => Some(Verb::Advise),
            tools::REVIEW => Some(Verb::Review),
            tools::IMPLEMENT => Some(Verb::Implement),
            _ => None,
        };
        if let Some(verb) = verb {
            if let Some(state) = &request.request_state {
                let r = front
                    .resume_run(
                        state,
                        request.input_responses.as_ref(),
                        &caller.identity.principal,
                        ctx.ct.clone(),
                    )
                    .await;
                return Ok(r);
            }
            let run_id = uuid::Uuid::new_v4().to_string();
            let parsed = match tools::verb_args(&args, cfg.task_max_bytes, cfg.max_timeout_seconds)
            {
                Ok(a) => a,
                Err((rule, why)) => {
                    let h = Harness {
                        run_id,
                        verb: verb.name().into(),
                        depth: caller.depth,
                        ..Default::default()
                    };
                    tracing::info!(verb = verb.name(), rule, reason = %why, "MCP call refused");
                    return Ok(
                        envelope_result(&Envelope::refused(h, Blocker::refused(rule, why))).into(),
                    );
                }
            };
            if stateless(&ctx) && can_elicit(&ctx) {
                return Ok(front
                    .start_stateless_run(
                        verb,
                        parsed,
                        caller,
                        scope_key,
                        run_id,
                        progress_sender(&ctx),
                        ctx.ct.clone(),
                    )
                    .await);
            }
            let scope = front.scope(&scope_key);
            let ask = asker(&ctx);
            let (progress, sent) = progress_sender(&ctx);
            let e = front
                .run_verb(
                    verb,
                    parsed,
                    &caller,
                    &scope,
                    run_id,
                    &*ask,
                    &*progress,
                    ctx.ct.clone(),
                    &|_| {},
                )
                .await;
            drop(progress);
            if let Some(sent) = sent {
                let _ = tokio::time::timeout(Duration::from_secs(2), sent).await;
            }
            return Ok(envelope_result(&e).into());
        }
        Ok(match request.name.as_ref() {
            tools::IMPLEMENT_BACKGROUND => {
                match tools::verb_args(&args, cfg.task_max_bytes, cfg.max_timeout_seconds) {
                    Ok(a) if caller.depth == 0 => front.start_job(a, caller, scope_key).into(),
                    Ok(_) => {
                        let h = Harness {
                            verb: "implement".into(),
                            depth: caller.depth,
                            ..Default::default()
                        };
                        let e = Envelope::refused(
                            h,
                            Blocker::refused(
                                "mcp.recursion",
                                format!(
                                    "called from inside a warden-run agent (depth {}): refused before any agent starts",
                                    caller.depth
                                ),
                            ),
                        );
                        json_result(json!({"job_id": "", "state": "finished", "progress": [], "result": e.to_value()}), true).into()
                    }
                    Err((rule, why)) => {
                        let h = Harness {
                            verb: "implement".into(),
                            depth: caller.depth,
                            ..Default::default()
                        };
                        let e = Envelope::refused(h, Blocker::refused(rule, why));
                        json_result(json!({"job_id": "", "state": "finished", "progress": [], "result": e.to_value()}), true).into()
                    }
                }
            }
            tools::JOB_STATUS | tools::JOB_RESULT => {
                match front.job(&caller.identity.principal, &args) {
                    Ok(j) => json_result(McpFront::job_view(&j), false).into(),
                    Err(r) => r.into(),
                }
            }
            tools::JOB_CANCEL => match front.job(&caller.identity.principal, &args) {
                Ok(j) => front.cancel_job(j).await.into(),
                Err(r) => r.into(),
            },
            tools::BIND_WORKSPACE => {
                front
                    .bind_workspace(&request, &args, &caller, &scope_key, &ctx)
                    .await
            }
            tools::STATUS => {
                if let Err((_, why)) = tools::check_names(&args, &[]) {
                    json_result(json!({"error": why}), true).into()
                } else {
                    front.status(&caller, &scope_key, &ctx).into()
                }
            }
            other => {
                return Err(McpError::invalid_params(
                    format!(
                        "unknown tool {other:?}; tools: {}",
                        tools::INVENTORY.join(", ")
                    ),
                    None,
                ));
            }
        })
    }
}
