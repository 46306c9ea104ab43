//! The gateway's core: A2A tasks over supervisor turns.
//!
//! Each new message becomes a task and one `RunTurn` on the supervisor, driven by a background
//! tokio task that outlives any HTTP request (a client that disconnects never cancels its task).
//! Every update is applied under the task's lock in one place ([`LiveTask::apply`]): it changes
//! the in-memory task, writes the change to the store, and broadcasts it, so every subscriber sees
//! the same events in the same order after a consistent snapshot.
//!
//! A background sweep ([`Core::sweep`]) keeps the store bounded and ends conversations: terminal
//! tasks older than the retention, or beyond a principal's `max_tasks`, are deleted (oldest
//! first; a running task never), and a context idle for the conversation TTL after its last
//! task ended is closed at the supervisor. A task started while its context is being closed
//! waits for the close, then opens a new conversation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::{
    AnswerQuestionRequest, CancelTurnRequest, CloseConversationRequest, OpenConversationRequest,
    Profile, RunTurnRequest,
};

use crate::a2a::{
    ListTasksRequest, ListTasksResponse, Message, PartContent, Role, SendMessageRequest,
    StreamResponse, Task, TaskState, TaskStatus,
};
use crate::error::A2aError;
use crate::mapping::{META_KEY, TurnMapper};
use crate::push::Push;
use crate::store::{ArtifactChunk, ContextRecord, TaskRecord, TaskStore, TaskStoreError};
use crate::time::{format_micros, now_micros, parse_rfc3339};
use tokio::sync::{mpsc, oneshot};

/// How many events a subscriber may fall behind before its stream is closed with an error.
pub const SUBSCRIBER_BUFFER: usize = 4096;

/// Buffered artifact chunks and status messages are written once this many have gathered…
const PENDING_MAX: usize = 256;
/// …or once the oldest is this old, or the stream has been quiet this long.
const PENDING_AGE: Duration = Duration::from_millis(50);
/// How long an answer waits for the question it answers to be announced (it is written, and
/// waits for the disk before it is told: [`LiveTask::take_question`]).
const ANNOUNCE_WAIT: Duration = Duration::from_secs(10);

/// Whether applying `events` waits for the disk (a terminal or interrupted status is flushed
/// before anyone is told).
fn waits_for_disk(events: &[StreamResponse]) -> bool {
    events.iter().any(|e| {
        matches!(e, StreamResponse::StatusUpdate(s)
            if s.status.state.is_terminal() || s.status.state.is_interrupted())
    })
}

/// Longest accepted `contextId` (it becomes a store key and a supervisor label).
pub const MAX_CONTEXT_ID: usize = 256;

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

/// What one sweep did.
/// Idle conversations a sweep closes at the same time.
const CLOSE_CONCURRENCY: usize = 16;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub tasks_deleted: usize,
    pub conversations_closed: usize,
    pub contexts_forgotten: usize,
}

/// What an answer to a task's question did: delivered here (the task is followed here), or by
/// the replica following it (the task as stored right after).
enum Answered {
    Here(Arc<LiveTask>),
    Elsewhere(Box<Task>),
}

/// How long an answer held for another replica waits for it to be delivered.
const ANSWER_FORWARD_WAIT: Duration = Duration::from_secs(20);

/// How long a takeover waits for the supervisor to answer `AttachTurn`.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the sweep waits for the supervisor to close one conversation.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
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
/// A principal without an entry, or an entry without a list, may use every one.
#[derive(Debug, Clone, Default)]
pub struct AgentAccess {
    by_principal: HashMap<String, crate::config::AgentAccessEntry>,
}

impl AgentAccess {
    pub fn from_config(entries: &[crate::config::AgentAccessEntry]) -> Self {
        Self {
            by_principal: entries
                .iter()
                .map(|e| (e.principal.clone(), e.clone()))
                .collect(),
        }
    }

    pub fn allows(&self, principal: &str, agent: &str) -> bool {
        self.by_principal
            .get(principal)
            .and_then(|e| e.agents.as_ref())
            .is_none_or(|list| list.iter().any(|a| a == agent))
    }

    pub fn allows_workspace(&self, principal: &str, workspace: &str) -> bool {
        self.by_principal
            .get(principal)
            .and_then(|e| e.workspaces.as_ref())
            .is_none_or(|list| list.iter().any(|w| w == workspace))
    }

    /// Whether `principal` is limited to some agents.
    fn restricts_agents(&self, principal: &str) -> bool {
        self.by_principal
            .get(principal)
            .is_some_and(|e| e.agents.is_some())
    }
}

/// A stream's keep-alive interval until its core sets the configured one.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// One event as delivered to subscribers.
pub type SharedEvent = Arc<StreamResponse>;

/// What a subscriber gets: the snapshot, then the events that follow it.
pub struct Subscription {
    pub task: Task,
    /// `None` when the snapshot is already terminal (the stream ends with it).
    pub events: Option<broadcast::Receiver<SharedEvent>>,
    /// The caller's stream share, held until the stream is dropped.
    pub permit: Option<crate::shares::StreamPermit>,
    /// How often the stream says something while it has nothing to say.
    pub keepalive: Duration,
}

struct LiveInner {
    task: Task,
    record: TaskRecord,
    mapper: TurnMapper,
    /// Messages in the task's history, written or not.
    history_seq: u64,
    /// artifact id → (index in `task.artifacts`, next chunk number)
    artifact_chunks: HashMap<String, (u32, u64)>,
    /// Artifact chunks not yet written, and since when: streamed text is written in batches so
    /// the store stays off the per-event path (see [`LiveTask::write_pending`]).
    pending: Vec<(u32, u64, ArtifactChunk)>,
    /// How many of the last messages of `task.history` are not yet written, and whether the
    /// status changed since the head was last written (`record.task.status` is brought up to
    /// date then): a permission is three status messages, and one store write each was about
    /// a third of the gateway's CPU per permission.
    pending_history: usize,
    head_dirty: bool,
    pending_since: Option<std::time::Instant>,
    answering: bool,
}

/// One write of a live task, applied in order by its writer ([`write_loop`]).
enum Write {
    Chunks(Vec<(u32, u64, ArtifactChunk)>),
    History(u64, Vec<Message>),
    Head(Box<TaskRecord>),
    /// Answered once everything before it is written and durable.
    Sync(oneshot::Sender<Result<(), String>>),
}

/// Applies a live task's writes in the order they were made. The task's state is changed
/// under a std mutex, where nothing can be awaited, and the store is async (PostgreSQL): the
/// writes leave the lock through this queue, in order, and [`LiveTask::sync`] waits for them.
async fn write_loop(store: TaskStore, task_id: String, mut rx: mpsc::UnboundedReceiver<Write>) {
    let mut failed: Option<String> = None;
    while let Some(w) = rx.recv().await {
        let r = match w {
            Write::Chunks(chunks) => store.put_artifact_chunks(&task_id, &chunks).await,
            Write::History(first, msgs) => store.put_history_segment(&task_id, first, &msgs).await,
            Write::Head(rec) => store.put_head(&rec).await,
            Write::Sync(done) => {
                let r = match failed.take() {
                    Some(e) => Err(e),
                    None => store.flush().await.map_err(|e| e.to_string()),
                };
                let _ = done.send(r);
                continue;
            }
        };
        if let Err(e) = r {
            tracing::error!(task_id = %task_id, error = %e, "cannot persist task update");
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

/// A task whose turn is still followed by this process.
pub struct LiveTask {
    inner: Mutex<LiveInner>,
    tx: broadcast::Sender<SharedEvent>,
    state: watch::Sender<TaskState>,
    writes: mpsc::UnboundedSender<Write>,
    /// Where status changes are also delivered to the task's webhooks.
    push: Option<Arc<Push>>,
}

fn lock(m: &Mutex<LiveInner>) -> MutexGuard<'_, LiveInner> {
    // A panic while holding the lock would be a bug in this module; the data stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn store_err(e: TaskStoreError) -> A2aError {
    tracing::error!(error = %e, "task store failure");
    A2aError::Internal(format!("task store failure: {e}"))
}

impl LiveTask {
    /// A task just submitted (its user message is history entry 0), followed from now on.
    fn new(
        task: Task,
        record: TaskRecord,
        mapper: TurnMapper,
        store: TaskStore,
        push: Option<Arc<Push>>,
    ) -> Self {
        let (tx, _) = broadcast::channel(SUBSCRIBER_BUFFER);
        let (state, _) = watch::channel(TaskState::Submitted);
        let (writes, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(store, task.id.clone(), rx));
        Self {
            inner: Mutex::new(LiveInner {
                task,
                record,
                mapper,
                history_seq: 1,
                artifact_chunks: HashMap::new(),
                pending: Vec::new(),
                pending_history: 0,
                head_dirty: false,
                pending_since: None,
                answering: false,
            }),
            tx,
            state,
            writes,
            push,
        }
    }

    /// Waits until every write made so far is durable. Holds no lock: call it between
    /// [`LiveTask::persist_unflushed`] and [`LiveTask::announce_all`].
    async fn sync(&self) -> Result<(), String> {
        let (done, rx) = oneshot::channel();
        if self.writes.send(Write::Sync(done)).is_err() {
            return Err("the task's writer stopped".into());
        }
        rx.await
            .map_err(|_| "the task's writer stopped".to_string())?
    }

    /// Applies events that may end or interrupt the task: written and durable before anyone
    /// is told (see [`waits_for_disk`]).
    async fn settle(&self, events: Vec<StreamResponse>) {
        if !waits_for_disk(&events) {
            self.apply(&mut lock(&self.inner), events);
            return;
        }
        self.persist_unflushed(&mut lock(&self.inner), &events);
        if let Err(e) = self.sync().await {
            tracing::error!(error = %e, "cannot persist task update");
        }
        self.announce_all(&mut lock(&self.inner), events);
    }

    /// Applies mapped events: updates the task, queues each change's write, broadcasts it.
    /// Events that end or interrupt the task go through [`LiveTask::settle`] instead, which
    /// waits for the disk before telling anyone.
    fn apply(&self, inner: &mut LiveInner, events: Vec<StreamResponse>) {
        for ev in events {
            self.persist(inner, &ev);
            self.announce(inner, ev);
        }
        self.write_if_due(inner);
    }

    /// [`LiveTask::apply`] in two halves for events that end or interrupt the task, so that the
    /// flush between them is awaited without holding a runtime worker: this half writes them
    /// (not flushed); the caller flushes, then calls [`LiveTask::announce_all`].
    fn persist_unflushed(&self, inner: &mut LiveInner, events: &[StreamResponse]) {
        for ev in events {
            self.persist(inner, ev);
        }
    }

    /// The second half: subscribers, webhooks and waiters are told, in order.
    fn announce_all(&self, inner: &mut LiveInner, events: Vec<StreamResponse>) {
        for ev in events {
            self.announce(inner, ev);
        }
        self.write_if_due(inner);
    }

    fn announce(&self, inner: &LiveInner, ev: StreamResponse) {
        let status = matches!(&ev, StreamResponse::StatusUpdate(_));
        if let StreamResponse::StatusUpdate(s) = &ev
            && self.state.send_replace(s.status.state) != s.status.state
        {
            crate::metrics::task_entered(s.status.state.as_str());
        }
        let ev = Arc::new(ev);
        // Queued in the order applied (the task is locked), so webhooks see changes in order.
        if status && let Some(push) = &self.push {
            push.task_event(&inner.task.id, &ev);
        }
        // No receiver is fine: nobody is watching the stream right now.
        let _ = self.tx.send(ev);
    }

    fn write_if_due(&self, inner: &mut LiveInner) {
        if inner.pending.len() + inner.pending_history >= PENDING_MAX
            || inner
                .pending_since
                .is_some_and(|t| t.elapsed() >= PENDING_AGE)
        {
            self.write_pending(inner);
        }
    }

    /// Writes what is buffered: artifact chunks as one batch, status messages as one history
    /// segment, then the head, in that order, so a stored state never runs ahead of its stored
    /// history and artifacts. Called when enough has gathered, when it is old enough, when the
    /// turn's stream goes quiet, and at once (then flushed) for a terminal or interrupted
    /// status. Until then the live task answers GetTask, ListTasks and subscriptions from
    /// memory; a crash loses at most [`PENDING_AGE`] of a task the restart marks FAILED anyway.
    fn write_pending(&self, inner: &mut LiveInner) {
        inner.pending_since = None;
        // Queued in this order; the writer applies them in it (a failure is logged there and
        // reported by the next `sync`).
        if !inner.pending.is_empty() {
            let chunks = std::mem::take(&mut inner.pending);
            let _ = self.writes.send(Write::Chunks(chunks));
        }
        if inner.pending_history > 0 {
            let n = std::mem::take(&mut inner.pending_history);
            let msgs = &inner.task.history[inner.task.history.len().saturating_sub(n)..];
            let first = inner.history_seq - msgs.len() as u64;
            let _ = self.writes.send(Write::History(first, msgs.to_vec()));
        }
        if inner.head_dirty {
            inner.head_dirty = false;
            inner.record.task.status = inner.task.status.clone();
            let _ = self
                .writes
                .send(Write::Head(Box::new(inner.record.clone())));
        }
    }

    /// A message joins the task's history (written with the next batch).
    fn push_history(inner: &mut LiveInner, m: Message) {
        inner.pending_history += 1;
        inner.history_seq += 1;
        inner.task.history.push(m);
        inner
            .pending_since
            .get_or_insert_with(std::time::Instant::now);
    }

    /// Whether something is buffered and not yet written.
    fn has_unwritten(inner: &LiveInner) -> bool {
        !inner.pending.is_empty() || inner.pending_history > 0 || inner.head_dirty
    }

    /// Takes one event into the task and the store's buffers; a terminal or interrupted status
    /// queues them at once (the caller waits for them with [`LiveTask::sync`]).
    fn persist(&self, inner: &mut LiveInner, ev: &StreamResponse) {
        match ev {
            StreamResponse::StatusUpdate(s) => {
                inner.task.status = s.status.clone();
                inner.record.status_micros = now_micros();
                if let Some(m) = &s.status.message {
                    Self::push_history(inner, m.clone());
                }
                inner.head_dirty = true;
                inner
                    .pending_since
                    .get_or_insert_with(std::time::Instant::now);
                // A caller may act on these at once (answer, resubscribe, read after the end):
                // on disk before anyone is told.
                if s.status.state.is_terminal() || s.status.state.is_interrupted() {
                    self.write_pending(inner);
                }
            }
            StreamResponse::ArtifactUpdate(a) => {
                let id = a.artifact.artifact_id.clone();
                let (index, chunk) = match inner.artifact_chunks.get(&id) {
                    Some(&(i, c)) if a.append => (i, c),
                    _ => {
                        let i = inner.task.artifacts.len() as u32;
                        inner.task.artifacts.push(crate::a2a::Artifact {
                            parts: Vec::new(),
                            ..a.artifact.clone()
                        });
                        (i, 0)
                    }
                };
                inner.artifact_chunks.insert(id, (index, chunk + 1));
                inner.pending.push((
                    index,
                    chunk,
                    ArtifactChunk {
                        artifact: a.artifact.clone(),
                        append: chunk > 0,
                    },
                ));
                inner
                    .pending_since
                    .get_or_insert_with(std::time::Instant::now);
                if let Some(art) = inner.task.artifacts.get_mut(index as usize) {
                    for p in &a.artifact.parts {
                        merge_part(&mut art.parts, p);
                    }
                }
            }
            StreamResponse::Task(_) | StreamResponse::Message(_) => {}
        }
    }

    /// A stream of this task: the snapshot, then what follows. A stream opened on a task that is
    /// already INPUT_REQUIRED stays open (it closes at the next terminal or interrupted status):
    /// SubscribeToTask exists to watch a non-terminal task, and one waiting for input is exactly
    /// the task a second client wants to see resume (spec 1.0.1 §3.1.6).
    fn subscribe(&self) -> Subscription {
        let inner = lock(&self.inner);
        let task = inner.task.clone();
        let events = if task.status.state.is_terminal() {
            None
        } else {
            Some(self.tx.subscribe())
        };
        Subscription {
            task,
            events,
            permit: None,
            keepalive: DEFAULT_KEEPALIVE,
        }
    }

    /// Waits until the task is terminal or interrupted.
    /// Takes the task's pending question for an answer (marks it being answered), or says the
    /// state the task is in instead.
    ///
    /// An INPUT_REQUIRED is written before it is announced (its flush is awaited in between,
    /// see [`LiveTask::persist_unflushed`]), and a caller that read it with GetTask may answer in
    /// that gap. The answer's WORKING was then announced first and the late INPUT_REQUIRED
    /// after it: a blocking SendMessage returned at once with the task still working, and
    /// webhooks and streams heard WORKING before INPUT_REQUIRED. So the answer waits for the
    /// announcement (bounded: a store that never answers must not hold the caller forever).
    async fn take_question(&self) -> Result<String, TaskState> {
        let written = lock(&self.inner).task.status.state;
        if written == TaskState::InputRequired {
            let mut rx = self.state.subscribe();
            let _ = tokio::time::timeout(
                ANNOUNCE_WAIT,
                rx.wait_for(|s| s.is_interrupted() || s.is_terminal()),
            )
            .await;
        }
        let mut inner = lock(&self.inner);
        let announced = *self.state.borrow();
        match inner.mapper.pending_question().map(str::to_string) {
            Some(q)
                if inner.task.status.state == TaskState::InputRequired
                    && announced == TaskState::InputRequired
                    && !inner.answering =>
            {
                inner.answering = true;
                Ok(q)
            }
            _ => Err(inner.task.status.state),
        }
    }

    async fn settled(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| s.is_terminal() || s.is_interrupted()).await;
    }

    async fn terminal(&self, within: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(within, rx.wait_for(|s| s.is_terminal()))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

fn merge_part(parts: &mut Vec<crate::a2a::Part>, part: &crate::a2a::Part) {
    if let (Some(last), PartContent::Text(more)) = (parts.last_mut(), &part.content)
        && let PartContent::Text(text) = &mut last.content
    {
        text.push_str(more);
        return;
    }
    parts.push(part.clone());
}

/// Trims a task's history to the `historyLength` the caller asked for.
pub fn apply_history_length(task: &mut Task, history_length: Option<i32>) -> Result<(), A2aError> {
    match history_length {
        None => {}
        Some(n) if n < 0 => {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        Some(n) => {
            let n = n as usize;
            if task.history.len() > n {
                task.history.drain(..task.history.len() - n);
            }
        }
    }
    Ok(())
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

/// The task core shared by every HTTP handler.
pub struct Core {
    store: TaskStore,
    supervisor: SupervisorServiceClient<Channel>,
    live: Mutex<HashMap<String, Arc<LiveTask>>>,
    settings: CoreSettings,
    /// Held for every read-modify-write of a context record, and by the sweep when it forgets
    /// one, so ownership is decided once: two principals cannot both create a context, and a
    /// context is never forgotten between a task's ownership check and its write.
    contexts_guard: tokio::sync::Mutex<()>,
    /// Contexts whose conversation the sweep is closing right now; a task starting in one waits
    /// on its gate before RunTurn, so the close never ends the new task's conversation.
    closing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    agents: std::sync::RwLock<AgentList>,
    /// One `ListAgents` at a time: callers naming unknown agents at once share one refresh.
    refreshing: tokio::sync::Mutex<()>,
    /// Push notifications, once the daemon has set them up ([`Core::set_push`]).
    push: std::sync::OnceLock<Arc<Push>>,
    /// Per-principal agent access ([`Core::set_access`]; unset: everyone may use every agent).
    /// Who may use which agent; replaced whole by a reload (SIGHUP), so a request reads one
    /// version.
    access: std::sync::RwLock<Option<Arc<AgentAccess>>>,
    /// Streams open per principal, over every front.
    streams: Arc<crate::shares::StreamShares>,
    /// `[cells]` mode ([`Core::set_cells`]): each context's turns go to its cell.
    cells: std::sync::OnceLock<Arc<crate::cells::Cells>>,
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
            closing: Mutex::new(HashMap::new()),
            agents: std::sync::RwLock::new(agents),
            refreshing: tokio::sync::Mutex::new(()),
            push: std::sync::OnceLock::new(),
            access: std::sync::RwLock::new(None),
            streams: crate::shares::StreamShares::new(settings.max_streams_per_principal),
            settings,
            cells: std::sync::OnceLock::new(),
        })
    }

    /// Turns go to cells placed per context instead of the one supervisor (once).
    pub fn set_cells(&self, cells: Arc<crate::cells::Cells>) {
        let _ = self.cells.set(cells);
    }

    /// Where `context_id`'s turns go: the one supervisor, or its cell (placed first for
    /// `place`, the principal whose turn it is, when it has none or its cell was lost). The
    /// fault says why there is nowhere.
    pub async fn route(
        &self,
        context_id: &str,
        place: Option<&str>,
    ) -> Result<crate::cells::Routed, warden_proto::v1::Fault> {
        use warden_proto::v1::{Fault, FaultClass};
        let Some(cells) = self.cells.get() else {
            return Ok(crate::cells::Routed::single(self.supervisor.clone()));
        };
        let unavailable = |message: String| Fault {
            class: "supervisor".into(),
            message,
            fault_class: FaultClass::SupervisorUnavailable as i32,
        };
        match cells.route(context_id, place).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) if place.is_some() => Err(unavailable(
                "no live cell takes new conversations now (every cell is lost or draining)".into(),
            )),
            Ok(None) => Err(Fault {
                class: "cell-lost".into(),
                message: format!("context {context_id} is on no live cell"),
                fault_class: FaultClass::CellLost as i32,
            }),
            Err(e) => Err(unavailable(format!(
                "cannot read the context's placement: {e}"
            ))),
        }
    }

    /// The client of `context_id`'s supervisor for a call on a placed context (cancel, answer,
    /// close): the one supervisor, or its cell.
    async fn supervisor_of(
        &self,
        context_id: &str,
    ) -> Result<SupervisorServiceClient<Channel>, tonic::Status> {
        self.route(context_id, None)
            .await
            .map(|r| r.client)
            .map_err(|f| match f.fault_class() {
                // Its cell is lost: nothing of the conversation is reachable any more.
                warden_proto::v1::FaultClass::CellLost => tonic::Status::not_found(f.message),
                _ => tonic::Status::unavailable(f.message),
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
    fn held(&self, mut sub: Subscription, permit: crate::shares::StreamPermit) -> Subscription {
        sub.permit = Some(permit);
        sub.keepalive = self.settings.stream_keepalive;
        sub
    }

    /// Sets who may use which agent (at start, and whole at each reload).
    pub fn set_access(&self, access: AgentAccess) {
        let next = Some(Arc::new(access));
        match self.access.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
    }

    fn access(&self) -> Option<Arc<AgentAccess>> {
        match self.access.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether `principal` may use `agent`.
    pub fn may_use(&self, principal: &str, agent: &str) -> bool {
        self.access().is_none_or(|a| a.allows(principal, agent))
    }

    /// Whether `principal` is limited to some agents.
    fn restricted(&self, principal: &str) -> bool {
        self.access().is_some_and(|a| a.restricts_agents(principal))
    }

    /// Whether `principal` may use the operator workspace `workspace` ("" = an owned sandbox,
    /// always).
    pub fn may_use_workspace(&self, principal: &str, workspace: &str) -> bool {
        workspace.is_empty()
            || self
                .access()
                .is_none_or(|a| a.allows_workspace(principal, workspace))
    }

    /// The agents `principal` may use now (for its extended card).
    pub fn agents_for(&self, principal: &str) -> AgentList {
        let mut list = self.agents();
        list.agents.retain(|a| self.may_use(principal, &a.name));
        list
    }

    /// The refusal of an agent: it names only the caller's own agents, and a restricted caller
    /// is told the same whether the agent exists or not.
    pub fn refuse_agent(&self, principal: &str, agent: &str) -> A2aError {
        let mine: Vec<String> = self
            .agents_for(principal)
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

    /// The agent a new conversation of `principal` runs: the one it asked for or the default,
    /// refused (naming only its own agents) unless it is configured and the principal may use
    /// it. Every front opens conversations through this (A2A in each binding, MCP verbs).
    pub async fn resolve_agent(
        &self,
        principal: &str,
        asked: Option<&str>,
    ) -> Result<String, A2aError> {
        let Some(a) = asked else {
            let default = self.agents().default;
            // The default too must be one of the caller's agents: for a restricted caller
            // "the supervisor's default" ("") is named, so it can be checked.
            if self.restricted(principal)
                && (default.is_empty() || !self.may_use(principal, &default))
            {
                return Err(self.refuse_agent(principal, &default));
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
        if list.contains(a) && self.may_use(principal, a) {
            return Ok(a.to_string());
        }
        if self.restricted(principal) {
            return Err(self.refuse_agent(principal, a));
        }
        let names: Vec<&str> = list.agents.iter().map(|k| k.name.as_str()).collect();
        Err(A2aError::InvalidParams(format!(
            "unknown agent {a:?}; configured agents: {}",
            names.join(", ")
        )))
    }

    /// Turns push notifications on (once; later calls are ignored).
    pub fn set_push(&self, push: Arc<Push>) {
        let _ = self.push.set(push);
    }

    /// The push service, when it is on.
    pub fn push(&self) -> Option<&Arc<Push>> {
        self.push.get().filter(|p| p.enabled())
    }

    fn push_or_unsupported(&self) -> Result<&Arc<Push>, A2aError> {
        self.push().ok_or(A2aError::PushNotificationNotSupported)
    }

    /// CreateTaskPushNotificationConfig: checks the webhook and stores it with the task.
    pub async fn create_push_config(
        &self,
        principal: &str,
        cfg: crate::a2a::TaskPushNotificationConfig,
    ) -> Result<crate::a2a::TaskPushNotificationConfig, A2aError> {
        let push = self.push_or_unsupported()?;
        if cfg.task_id.is_empty() {
            return Err(A2aError::InvalidParams("taskId is required".into()));
        }
        let task_id = cfg.task_id.clone();
        self.owned(principal, &task_id).await?;
        let cfg = push.check(principal, Some(&task_id), cfg).await?;
        push.put(principal, cfg.clone()).await?;
        Ok(cfg)
    }

    /// GetTaskPushNotificationConfig.
    pub async fn get_push_config(
        &self,
        principal: &str,
        task_id: &str,
        id: &str,
    ) -> Result<crate::a2a::TaskPushNotificationConfig, A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        push.get(task_id, id).await
    }

    /// ListTaskPushNotificationConfigs (one page: a task has at most `max_configs_per_task`).
    pub async fn list_push_configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<crate::a2a::ListTaskPushNotificationConfigsResponse, A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        Ok(crate::a2a::ListTaskPushNotificationConfigsResponse {
            configs: push.list(task_id).await?,
            next_page_token: String::new(),
        })
    }

    /// DeleteTaskPushNotificationConfig.
    pub async fn delete_push_config(
        &self,
        principal: &str,
        task_id: &str,
        id: &str,
    ) -> Result<(), A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        push.delete(task_id, id).await
    }

    /// Runs [`Core::sweep`] every sweep interval until `stop`.
    pub async fn sweep_forever(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.retention.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            match self.sweep(now_micros()).await {
                Ok(r) if r != SweepReport::default() => tracing::info!(
                    tasks_deleted = r.tasks_deleted,
                    conversations_closed = r.conversations_closed,
                    contexts_forgotten = r.contexts_forgotten,
                    "store swept"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the store sweep failed; retrying at the next interval")
                }
            }
        }
    }

    /// With a store shared by replicas: renews this replica's lease on every task it follows,
    /// and takes over the tasks whose follower's lease ran out (a replica that died), every
    /// third of a lease, until `stop`. Nothing to do for sled (one gateway; its restart
    /// recovers).
    pub async fn leases_forever(self: Arc<Self>, stop: CancellationToken) {
        if !self.store.shared() {
            return;
        }
        let mut tick = tokio::time::interval(crate::store_pg::LEASE / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let ids: Vec<String> = self
                .live
                .lock()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            match self.store.renew_leases(&ids).await {
                Ok(lost) => {
                    for id in lost {
                        // Another replica follows it now (this one could not renew its lease
                        // in time); its writes from here are ignored, and it is read from the
                        // store.
                        tracing::warn!(task_id = %id, "another gateway took over a task this one followed");
                        if let Ok(mut m) = self.live.lock() {
                            m.remove(&id);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, tasks = ids.len(), "cannot renew the leases of the tasks this gateway follows")
                }
            }
            match self.take_over_orphans().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(tasks = n, "taking over tasks whose gateway stopped"),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for tasks left by a stopped gateway")
                }
            }
        }
    }

    /// One sweep at time `now` (µs): prunes tasks, closes conversations idle past the TTL at the
    /// supervisor, and forgets contexts with no task left whose conversation is closed.
    pub async fn sweep(&self, now: i64) -> Result<SweepReport, TaskStoreError> {
        let retention = self.settings.retention;
        let cutoff = now.saturating_sub(micros(retention.task_retention));
        // Computed by the store over every replica's tasks (PostgreSQL: one query).
        let pruned = self.store.prune(cutoff, retention.max_tasks).await?;
        let remaining = pruned.contexts;
        let mut report = SweepReport {
            tasks_deleted: pruned.deleted,
            ..SweepReport::default()
        };
        let retention_micros = micros(retention.task_retention);
        let mut to_close = Vec::new();
        for (cid, rec) in self.store.contexts().await? {
            let tasks = remaining.get(&cid).copied().unwrap_or_default();
            if tasks.busy {
                continue;
            }
            let last = tasks
                .last_status_micros
                .max(rec.last_task_micros)
                .max(rec.created_micros);
            match rec.closed_micros {
                None => {
                    let ttl_passed = retention
                        .conversation_ttl
                        .is_some_and(|ttl| last.saturating_add(micros(ttl)) <= now);
                    // A context with nothing left to show is closed before it is forgotten,
                    // even with the TTL off.
                    let abandoned =
                        tasks.count == 0 && last.saturating_add(retention_micros) <= now;
                    if ttl_passed || abandoned {
                        to_close.push((cid, rec));
                    }
                }
                Some(_) if tasks.count == 0 && last.saturating_add(retention_micros) <= now => {
                    if self.forget_context(&cid, &rec).await? {
                        report.contexts_forgotten += 1;
                    }
                }
                Some(_) => {}
            }
        }
        // Closed a few at a time: one by one, a wave of contexts expiring together (each close
        // kills a tree and removes a root at the supervisor) falls behind the contexts opening.
        use futures::StreamExt;
        let mut closes = futures::stream::iter(to_close)
            .map(|(cid, rec)| async move { self.close_idle(&cid, &rec, now).await })
            .buffer_unordered(CLOSE_CONCURRENCY);
        while let Some(r) = closes.next().await {
            if r? {
                report.conversations_closed += 1;
            }
        }
        Ok(report)
    }

    /// True when a task of `context_id` is being followed by this process.
    fn context_busy(&self, context_id: &str) -> bool {
        let live: Vec<Arc<LiveTask>> = match self.live.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(_) => return true,
        };
        live.iter()
            .any(|l| lock(&l.inner).task.context_id == context_id)
    }

    /// Closes one idle context's conversation at the supervisor, unless a task started in it
    /// since `seen` was read. Returns whether it was closed (and marked so).
    async fn close_idle(
        &self,
        context_id: &str,
        seen: &ContextRecord,
        now: i64,
    ) -> Result<bool, TaskStoreError> {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let _held = gate.clone().lock_owned().await;
        match self.closing.lock() {
            Ok(mut m) => {
                if m.contains_key(context_id) {
                    return Ok(false);
                }
                m.insert(context_id.to_string(), gate);
            }
            Err(_) => return Ok(false),
        }
        // Registered first, checked second: a task that started before the registration is
        // live (or has moved the record on) now; one that starts after it waits on the gate.
        let unchanged = self
            .store
            .context(context_id)
            .await?
            .is_some_and(|r| r.last_task_micros == seen.last_task_micros);
        let mut closed = false;
        if unchanged && !self.context_busy(context_id) {
            // The supervisor closes and removes only what is this principal's.
            let req = CloseConversationRequest {
                context_id: context_id.to_string(),
                principal: seen.principal.clone(),
            };
            let close = async {
                self.supervisor_of(context_id)
                    .await?
                    .close_conversation(req)
                    .await
            };
            match tokio::time::timeout(CLOSE_TIMEOUT, close).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    tracing::info!(
                        context_id,
                        found = r.closed,
                        forced = r.forced,
                        processes = r.processes,
                        "closed an idle conversation"
                    );
                    closed = self.mark_closed(context_id, seen, now).await?;
                }
                // On a lost cell (or never placed): there is nothing to close any more.
                Ok(Err(status))
                    if self.cells.get().is_some() && status.code() == tonic::Code::NotFound =>
                {
                    tracing::info!(context_id, reason = %status.message(), "idle context on no live cell: forgotten without a close");
                    closed = self.mark_closed(context_id, seen, now).await?;
                }
                Ok(Err(status)) => {
                    tracing::warn!(context_id, error = %status, "the supervisor did not close an idle conversation; retrying at the next sweep");
                }
                Err(_) => {
                    tracing::warn!(
                        context_id,
                        "CloseConversation timed out; retrying at the next sweep"
                    );
                }
            }
        }
        if let Ok(mut m) = self.closing.lock() {
            m.remove(context_id);
        }
        Ok(closed)
    }

    /// Marks `context_id` closed at `now`, unless a task started in it since `seen` was read.
    async fn mark_closed(
        &self,
        context_id: &str,
        seen: &ContextRecord,
        now: i64,
    ) -> Result<bool, TaskStoreError> {
        let _g = self.contexts_guard.lock().await;
        match self.store.context(context_id).await? {
            Some(mut rec) if rec.last_task_micros == seen.last_task_micros => {
                rec.closed_micros = Some(now);
                self.store.put_context(context_id, &rec).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Deletes a closed context with no task left, unless it changed since `seen` was read. Its
    /// id may then be used again, by anyone, as a new context: nothing of the old one remains.
    async fn forget_context(
        &self,
        context_id: &str,
        seen: &ContextRecord,
    ) -> Result<bool, TaskStoreError> {
        let _g = self.contexts_guard.lock().await;
        if self.context_busy(context_id) {
            return Ok(false);
        }
        let forgotten = self.store.forget_context(context_id, seen).await?;
        if forgotten && let Some(cells) = self.cells.get().cloned() {
            let context_id = context_id.to_string();
            tokio::spawn(async move {
                if let Err(e) = cells.forget(&context_id).await {
                    tracing::warn!(context_id, error = %e, "cannot forget the context's placement");
                }
            });
        }
        Ok(forgotten)
    }

    /// The supervisor client for what any supervisor answers alike (agents, workspaces): the
    /// one supervisor, or any live cell. A context's turns go through [`Core::route`].
    pub fn supervisor(&self) -> SupervisorServiceClient<Channel> {
        self.cells
            .get()
            .and_then(|c| c.any())
            .map(|r| r.client)
            .unwrap_or_else(|| self.supervisor.clone())
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
        let gate = self
            .closing
            .lock()
            .ok()
            .and_then(|m| m.get(context_id).cloned());
        if let Some(gate) = gate {
            let _ = gate.lock().await;
        }
        Ok(())
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

    pub fn store(&self) -> &TaskStore {
        &self.store
    }

    /// How many tasks this process is following.
    pub fn live_count(&self) -> usize {
        self.live.lock().map(|m| m.len()).unwrap_or(0)
    }

    fn live(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live.lock().ok().and_then(|m| m.get(id).cloned())
    }

    /// Marks tasks a previous process left running as FAILED and asks the supervisor to cancel
    /// their turns (best effort: the supervisor may be down or the turn long over).
    pub async fn recover(self: &Arc<Self>) -> Result<usize, TaskStoreError> {
        if self.store.shared() {
            return self.take_over_orphans().await;
        }
        let changed = self.store.recover().await?;
        let n = changed.len();
        for rec in changed {
            tracing::warn!(task_id = %rec.task.id, context_id = %rec.task.context_id, "task was running when the gateway stopped; marked FAILED");
            let me = self.clone();
            tokio::spawn(async move {
                let Ok(mut client) = me.supervisor_of(&rec.task.context_id).await else {
                    return;
                };
                let req = CancelTurnRequest {
                    context_id: rec.task.context_id.clone(),
                    turn_id: rec.task.id.clone(),
                };
                if let Ok(Ok(r)) =
                    tokio::time::timeout(Duration::from_secs(5), client.cancel_turn(req)).await
                {
                    tracing::info!(task_id = %rec.task.id, outcome = %r.into_inner().outcome, "cancelled the orphaned turn");
                }
            });
        }
        Ok(n)
    }

    /// With replicas on one database: takes over every task whose follower stopped (its lease
    /// ran out) and that this replica claims first ([`Core::take_over`]). Returns how many.
    async fn take_over_orphans(self: &Arc<Self>) -> Result<usize, TaskStoreError> {
        let mut n = 0;
        for rec in self.store.orphans().await? {
            if !self.store.claim_orphan(&rec.task.id).await? {
                continue;
            }
            n += 1;
            let core = self.clone();
            let span = tracing::info_span!("task", task_id = %rec.task.id);
            tokio::spawn(tracing::Instrument::instrument(core.take_over(rec), span));
        }
        Ok(n)
    }

    /// Follows a task whose gateway stopped: its turn is attached to at the supervisor
    /// (`AttachTurn`, from its first event: the turn never depended on its RunTurn stream), and
    /// the task is written again from those events, as its own follower would have (what the
    /// stopped replica had written of them is replaced, so nothing is doubled). A turn the
    /// supervisor no longer has ends the task FAILED, saying why.
    async fn take_over(self: Arc<Self>, rec: TaskRecord) {
        let id = rec.task.id.clone();
        let context_id = rec.task.context_id.clone();
        let attach = warden_proto::v1::AttachTurnRequest {
            context_id: context_id.clone(),
            turn_id: id.clone(),
            principal: rec.principal.clone(),
            after_seq: 0,
        };
        // The context's own supervisor: in `[cells]` mode its cell (a lost cell's turn cannot
        // be followed any more, and ends FAILED below).
        let attached = async {
            let routed = self
                .route(&context_id, None)
                .await
                .map_err(|f| tonic::Status::unavailable(f.message))?;
            let r = routed.client.clone().attach_turn(attach).await?;
            Ok::<_, tonic::Status>(routed.events(r.into_inner()))
        };
        let stream = match tokio::time::timeout(ATTACH_TIMEOUT, attached).await {
            Ok(Ok(events)) => events,
            outcome => {
                let why = match outcome {
                    Ok(Err(status)) => format!(
                        "the gateway following it stopped, and its turn cannot be followed ({})",
                        status.message()
                    ),
                    _ => "the gateway following it stopped, and the supervisor did not answer"
                        .to_string(),
                };
                tracing::warn!(task_id = %id, reason = %why, "cannot take over a task");
                match self.store.fail_task(rec, &why).await {
                    Ok(_) => {}
                    Err(e) => tracing::error!(task_id = %id, error = %e, "cannot end a task"),
                }
                return;
            }
        };
        let task = match self.store.load(&id).await {
            Ok(Some((task, _))) => task,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(task_id = %id, error = %e, "cannot read a task to take over");
                return;
            }
        };
        if let Err(e) = self.store.reset_progress(&id).await {
            tracing::error!(task_id = %id, error = %e, "cannot take over a task");
            return;
        }
        let mut head = task;
        head.history.truncate(1);
        head.artifacts.clear();
        let live = Arc::new(LiveTask::new(
            head,
            rec,
            TurnMapper::new(&id, &context_id).with_coalesce_bytes(self.settings.coalesce_bytes),
            self.store.clone(),
            self.push().cloned(),
        ));
        if let Ok(mut m) = self.live.lock() {
            m.insert(id.clone(), live.clone());
        }
        tracing::info!(task_id = %id, context_id = %context_id, "took over a task whose gateway stopped");
        self.follow_turn(live, stream).await;
    }

    /// Loads a task the principal may see (TaskNotFound otherwise, whether or not it exists).
    async fn owned(&self, principal: &str, id: &str) -> Result<(Task, TaskRecord), A2aError> {
        if let Some(live) = self.live(id) {
            let inner = lock(&live.inner);
            if inner.record.principal == principal {
                let mut rec = inner.record.clone();
                rec.task.status = inner.task.status.clone();
                return Ok((inner.task.clone(), rec));
            }
            return Err(A2aError::TaskNotFound(id.to_string()));
        }
        match self.store.load(id).await.map_err(store_err)? {
            Some((task, rec)) if rec.principal == principal => Ok((task, rec)),
            _ => Err(A2aError::TaskNotFound(id.to_string())),
        }
    }

    /// GetTask.
    pub async fn get(
        &self,
        principal: &str,
        id: &str,
        history_length: Option<i32>,
    ) -> Result<Task, A2aError> {
        if history_length.is_some_and(|n| n < 0) {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        let (mut task, _) = self.owned(principal, id).await?;
        apply_history_length(&mut task, history_length)?;
        Ok(task)
    }

    /// ListTasks: the principal's tasks, newest status first.
    pub async fn list(
        &self,
        principal: &str,
        req: &ListTasksRequest,
    ) -> Result<ListTasksResponse, A2aError> {
        let page_size = match req.page_size {
            None => 50,
            Some(n) if (1..=100).contains(&n) => n as usize,
            Some(n) => {
                return Err(A2aError::InvalidParams(format!(
                    "pageSize must be between 1 and 100, not {n}"
                )));
            }
        };
        let offset = match req.page_token.as_deref() {
            None | Some("") => 0,
            Some(t) => t
                .parse::<usize>()
                .map_err(|_| A2aError::InvalidParams(format!("invalid pageToken {t:?}")))?,
        };
        let after = match req.status_timestamp_after.as_deref() {
            None | Some("") => None,
            Some(t) => Some(parse_rfc3339(t).ok_or_else(|| {
                A2aError::InvalidParams(format!(
                    "statusTimestampAfter {t:?} is not an ISO 8601 UTC timestamp"
                ))
            })?),
        };
        if let Some(n) = req.history_length
            && n < 0
        {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        // A live task's stored head may lag its last status by a batch: it is listed as the
        // live task stands.
        let mut heads: Vec<(TaskRecord, Option<Arc<LiveTask>>)> = self
            .store
            .heads_of(principal)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|r| match self.live(&r.task.id) {
                Some(live) => {
                    let inner = lock(&live.inner);
                    let mut rec = inner.record.clone();
                    rec.task.status = inner.task.status.clone();
                    drop(inner);
                    (rec, Some(live))
                }
                None => (r, None),
            })
            .filter(|(r, _)| r.principal == principal)
            .filter(|(r, _)| {
                req.context_id
                    .as_deref()
                    .is_none_or(|c| c.is_empty() || r.task.context_id == c)
            })
            .filter(|(r, _)| {
                req.status
                    .is_none_or(|s| s == TaskState::Unspecified || r.task.status.state == s)
            })
            .filter(|(r, _)| after.is_none_or(|a| r.status_micros >= a))
            .collect();
        heads.sort_by(|(a, _), (b, _)| {
            b.status_micros
                .cmp(&a.status_micros)
                .then_with(|| a.task.id.cmp(&b.task.id))
        });
        let total = heads.len();
        let include_artifacts = req.include_artifacts.unwrap_or(false);
        let mut tasks = Vec::new();
        for (rec, live) in heads.iter().skip(offset).take(page_size) {
            let mut task = match live {
                Some(live) => {
                    let inner = lock(&live.inner);
                    let mut task = inner.task.clone();
                    if !include_artifacts {
                        task.artifacts.clear();
                    }
                    task
                }
                None => {
                    let mut task = rec.task.clone();
                    task.history = self.store.history(&task.id).await.map_err(store_err)?;
                    if include_artifacts {
                        task.artifacts = self.store.artifacts(&task.id).await.map_err(store_err)?;
                    }
                    task
                }
            };
            apply_history_length(&mut task, req.history_length)?;
            tasks.push(task);
        }
        let next = offset + tasks.len();
        Ok(ListTasksResponse {
            next_page_token: if next < total {
                next.to_string()
            } else {
                String::new()
            },
            page_size: page_size as i32,
            total_size: total as i32,
            tasks,
        })
    }

    /// SubscribeToTask. A task followed by another replica (a shared store) is followed here
    /// through the store ([`follow`]).
    pub async fn subscribe(&self, principal: &str, id: &str) -> Result<Subscription, A2aError> {
        let (task, _) = self.owned(principal, id).await?;
        if task.status.state.is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {id} is in terminal state {}; it cannot be subscribed to",
                task.status.state.as_str()
            )));
        }
        let permit = self.streams.open(principal)?;
        let sub = match self.live(id) {
            Some(live) => live.subscribe(),
            None if self.store.shared() => follow(self.store.clone(), task),
            None => Subscription {
                task,
                events: None,
                permit: None,
                keepalive: DEFAULT_KEEPALIVE,
            },
        };
        Ok(self.held(sub, permit))
    }

    /// CancelTask of a task another replica follows: the supervisor is asked directly (the
    /// follower sees the turn end and writes CANCELED); when the stored task is not terminal
    /// within the grace, it is ended CANCELED here (the store keeps the first end a task
    /// reaches, so a late end from the follower cannot undo it).
    async fn cancel_remote(&self, task: Task, rec: TaskRecord) -> Result<Task, A2aError> {
        let req = CancelTurnRequest {
            context_id: task.context_id.clone(),
            turn_id: task.id.clone(),
        };
        let ask = async {
            self.supervisor_of(&task.context_id)
                .await?
                .cancel_turn(req)
                .await
        };
        match tokio::time::timeout(self.settings.cancel_grace, ask).await {
            Ok(Ok(r)) => {
                tracing::info!(task_id = %task.id, outcome = %r.get_ref().outcome, "cancel requested for a task another gateway follows")
            }
            Ok(Err(status)) => {
                tracing::warn!(task_id = %task.id, error = %status, "supervisor refused or failed CancelTurn")
            }
            Err(_) => tracing::warn!(task_id = %task.id, "CancelTurn timed out"),
        }
        let deadline = tokio::time::Instant::now() + self.settings.cancel_grace;
        loop {
            if let Some((t, _)) = self.store.load(&task.id).await.map_err(store_err)?
                && t.status.state.is_terminal()
            {
                return Ok(t);
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = now_micros();
        let mut rec = rec;
        rec.task.status = TaskStatus {
            state: TaskState::Canceled,
            message: None,
            timestamp: Some(format_micros(now)),
        };
        rec.status_micros = now;
        self.store.end_if_running(&rec).await.map_err(store_err)?;
        self.store.flush().await.map_err(store_err)?;
        match self.store.load(&task.id).await.map_err(store_err)? {
            Some((t, _)) => Ok(t),
            None => Err(A2aError::TaskNotFound(task.id)),
        }
    }

    /// CancelTask: asks the supervisor to cancel the turn and returns the task once it is
    /// CANCELED. If the supervisor does not end the turn within the grace, or cannot be reached,
    /// the gateway ends the task CANCELED itself, so a cancel never hangs.
    pub async fn cancel(&self, principal: &str, id: &str) -> Result<Task, A2aError> {
        let (task, rec) = self.owned(principal, id).await?;
        let not_cancelable = |t: &Task| {
            A2aError::TaskNotCancelable(format!(
                "task {} is already {}",
                t.id,
                t.status.state.as_str()
            ))
        };
        if task.status.state.is_terminal() {
            return Err(not_cancelable(&task));
        }
        let Some(live) = self.live(id) else {
            if self.store.shared() {
                return self.cancel_remote(task, rec).await;
            }
            return Err(not_cancelable(&task));
        };
        lock(&live.inner).mapper.request_cancel();
        let req = CancelTurnRequest {
            context_id: task.context_id.clone(),
            turn_id: task.id.clone(),
        };
        let ask = async {
            self.supervisor_of(&task.context_id)
                .await?
                .cancel_turn(req)
                .await
        };
        let reached = match tokio::time::timeout(self.settings.cancel_grace, ask).await {
            Ok(Ok(r)) => {
                tracing::info!(task_id = %id, outcome = %r.get_ref().outcome, "cancel requested");
                true
            }
            Ok(Err(status)) => {
                tracing::warn!(task_id = %id, error = %status, "supervisor refused or failed CancelTurn");
                false
            }
            Err(_) => false,
        };
        if !reached || !live.terminal(self.settings.cancel_grace).await {
            let events = lock(&live.inner).mapper.force_cancel(now_micros());
            live.settle(events).await;
        }
        let snapshot = lock(&live.inner).task.clone();
        Ok(snapshot)
    }

    async fn choose_agent(
        &self,
        principal: &str,
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
        self.resolve_agent(principal, Some(&a)).await.map(Some)
    }

    /// SendMessage / SendStreamingMessage.
    pub async fn send(
        self: &Arc<Self>,
        principal: &str,
        req: SendMessageRequest,
        streaming: bool,
    ) -> Result<SendOutcome, A2aError> {
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
        let agent_asked = self.choose_agent(principal, &req).await?;
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
                let (live, run) = self.start(principal, &req, agent_asked, push_cfg).await?;
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

    /// A message on an existing task: only an INPUT_REQUIRED task takes one (it is the answer).
    /// A task another replica follows gets it through the database: held there, delivered by
    /// its follower ([`Core::answers_forever`]), and its outcome waited for.
    async fn answer(
        &self,
        principal: &str,
        task_id: &str,
        req: &SendMessageRequest,
    ) -> Result<Answered, A2aError> {
        if self.live(task_id).is_some() || !self.store.shared() {
            return self
                .answer_here(principal, task_id, req)
                .await
                .map(Answered::Here);
        }
        let (task, _) = self.owned(principal, task_id).await?;
        if let Some(ctx) = req.message.context_id.as_deref().filter(|c| !c.is_empty())
            && ctx != task.context_id
        {
            return Err(A2aError::InvalidParams(format!(
                "message.contextId {ctx:?} does not match task {task_id}'s context"
            )));
        }
        if task.status.state != TaskState::InputRequired {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is {} and not waiting for input",
                task.status.state.as_str()
            )));
        }
        let request = serde_json::to_vec(req)
            .map_err(|e| A2aError::Internal(format!("cannot hold the answer: {e}")))?;
        let mut notes = self.store.changes();
        let Some(id) = self
            .store
            .forward_answer(task_id, &request)
            .await
            .map_err(store_err)?
        else {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is not waiting for input"
            )));
        };
        let deadline = tokio::time::Instant::now() + ANSWER_FORWARD_WAIT;
        loop {
            match self.store.answer_outcome(&id).await.map_err(store_err)? {
                Some(Ok(())) => break,
                Some(Err(refusal)) => return Err(A2aError::UnsupportedOperation(refusal)),
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(A2aError::Internal(format!(
                    "the gateway following task {task_id} did not deliver the answer within {ANSWER_FORWARD_WAIT:?}"
                )));
            }
            let _ = tokio::time::timeout(
                Duration::from_millis(100),
                note_about(&mut notes, crate::store_pg::ANSWER_NOTE),
            )
            .await;
        }
        let (task, _) = self.owned(principal, task_id).await?;
        Ok(Answered::Elsewhere(Box::new(task)))
    }

    /// The rest of a SendMessage whose answer another replica delivered: the task followed
    /// through the store, as SubscribeToTask does, or waited for until it settles.
    async fn answered_elsewhere(
        &self,
        task: Task,
        permit: Option<crate::shares::StreamPermit>,
        return_immediately: bool,
        history_length: Option<i32>,
    ) -> Result<SendOutcome, A2aError> {
        if let Some(permit) = permit {
            let sub = follow(self.store.clone(), task);
            return Ok(SendOutcome::Stream(Box::new(self.held(sub, permit))));
        }
        let mut task = task;
        if !return_immediately {
            let mut notes = self.store.changes();
            let answered_at = task.status.timestamp.clone();
            loop {
                let settled = task.status.state.is_terminal()
                    || (task.status.state.is_interrupted() && task.status.timestamp != answered_at);
                if settled {
                    break;
                }
                let _ = tokio::time::timeout(FOLLOW_POLL, note_about(&mut notes, &task.id)).await;
                if let Some((t, _)) = self.store.load(&task.id).await.map_err(store_err)? {
                    task = t;
                }
            }
        }
        apply_history_length(&mut task, history_length)?;
        Ok(SendOutcome::Task(Box::new(task)))
    }

    /// With a store shared by replicas: delivers the answers other replicas hold for the tasks
    /// this one follows (woken by their note, and every second), and records what each did.
    pub async fn answers_forever(self: Arc<Self>, stop: CancellationToken) {
        let mut notes = self.store.changes();
        if notes.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = note_about(&mut notes, crate::store_pg::ANSWER_NOTE) => {}
                _ = stop.cancelled() => return,
            }
            let held = match self.store.answers_to_deliver().await {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the answers held for this gateway's tasks");
                    continue;
                }
            };
            for (id, task_id, request) in held {
                // Only a task followed here (one being taken over is delivered next time).
                if self.live(&task_id).is_none() {
                    continue;
                }
                let outcome = match serde_json::from_slice::<SendMessageRequest>(&request) {
                    Err(e) => Err(format!("the held answer cannot be read: {e}")),
                    Ok(req) => {
                        let principal = match self.store.head(&task_id).await {
                            Ok(Some(h)) => h.principal,
                            _ => continue,
                        };
                        match self.answer_here(&principal, &task_id, &req).await {
                            Ok(live) => {
                                // Written before the answering replica reads the task again.
                                let _ = live.sync().await;
                                Ok(())
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    }
                };
                tracing::info!(task_id = %task_id, answer_id = %id, delivered = outcome.is_ok(), "delivered an answer held by another gateway");
                if let Err(e) = self.store.set_answer_outcome(&id, outcome).await {
                    tracing::warn!(task_id = %task_id, error = %e, "cannot record an answer's outcome");
                }
            }
        }
    }

    /// [`Core::answer`] on a task this replica follows.
    async fn answer_here(
        &self,
        principal: &str,
        task_id: &str,
        req: &SendMessageRequest,
    ) -> Result<Arc<LiveTask>, A2aError> {
        let (task, _) = self.owned(principal, task_id).await?;
        if let Some(ctx) = req.message.context_id.as_deref().filter(|c| !c.is_empty())
            && ctx != task.context_id
        {
            return Err(A2aError::InvalidParams(format!(
                "message.contextId {ctx:?} does not match task {task_id}'s context"
            )));
        }
        if task.status.state.is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is in terminal state {}; send a new message without taskId",
                task.status.state.as_str()
            )));
        }
        let live = self.live(task_id).ok_or_else(|| {
            A2aError::UnsupportedOperation(format!("task {task_id} is not waiting for input"))
        })?;
        let question_id = live.take_question().await.map_err(|state| {
            A2aError::UnsupportedOperation(format!(
                "task {task_id} is {} and not waiting for input; wait for it or cancel it",
                state.as_str()
            ))
        })?;
        let (action, content_json) = answer_content(&req.message);
        let result = async {
            self.supervisor_of(&task.context_id)
                .await?
                .answer_question(AnswerQuestionRequest {
                    context_id: task.context_id.clone(),
                    turn_id: task_id.to_string(),
                    question_id,
                    action,
                    content_json,
                    message_id: req.message.message_id.clone(),
                })
                .await
        }
        .await;
        let mut inner = lock(&live.inner);
        inner.answering = false;
        match result {
            Ok(r) if r.get_ref().delivered => {
                let mut m = req.message.clone();
                m.task_id = Some(task_id.to_string());
                m.context_id = Some(task.context_id.clone());
                LiveTask::push_history(&mut inner, m);
                let events = inner.mapper.question_answered(now_micros());
                live.apply(&mut inner, events);
                // The turn may stay quiet a long time now: the answer is stored at once.
                live.write_pending(&mut inner);
                drop(inner);
                Ok(live)
            }
            Ok(_) => Err(A2aError::UnsupportedOperation(format!(
                "the agent no longer waits for an answer on task {task_id}"
            ))),
            Err(status) => Err(A2aError::Internal(format!(
                "the supervisor could not deliver the answer: {}",
                status.message()
            ))),
        }
    }

    /// A new task: records it (not yet flushed: the caller waits for the disk, then starts its
    /// turn with the returned request).
    async fn start(
        self: &Arc<Self>,
        principal: &str,
        req: &SendMessageRequest,
        agent_asked: Option<String>,
        push_cfg: Option<crate::a2a::TaskPushNotificationConfig>,
    ) -> Result<(Arc<LiveTask>, RunTurnRequest), A2aError> {
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
                    if (agent.is_empty() && self.restricted(principal))
                        || !self.may_use(principal, &agent)
                    {
                        return Err(self.refuse_agent(principal, &agent));
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
            if !self.may_use(principal, &ctx.agent) {
                return Err(self.refuse_agent(principal, &ctx.agent));
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
                workspace: String::new(),
                profile: Profile::WorkspaceWrite as i32,
                principal: principal.to_string(),
                verb: "task".to_string(),
                // A2A has no model field: the agent's default.
                model: String::new(),
                effort: String::new(),
            }),
        };
        Ok((live, run))
    }

    /// Follows one turn to its end.
    async fn drive(self: Arc<Self>, live: Arc<LiveTask>, run: RunTurnRequest) {
        let task_id = run.task_id.clone();
        // The sweep may be closing this context's idle conversation; RunTurn after it has, so the
        // close cannot end this task's new conversation.
        let gate = self
            .closing
            .lock()
            .ok()
            .and_then(|m| m.get(&run.context_id).cloned());
        if let Some(gate) = gate {
            let _ = gate.lock().await;
        }
        let context_id = run.context_id.clone();
        let principal = run
            .open
            .as_ref()
            .map(|o| o.principal.clone())
            .unwrap_or_default();
        let mut run = tonic::Request::new(run);
        warden_daemon::otel::inject(run.metadata_mut());
        let started = match self.route(&context_id, Some(&principal)).await {
            Ok(routed) => match routed.client.clone().run_turn(run).await {
                Ok(resp) => Ok(routed.events(resp.into_inner())),
                Err(status) => {
                    tracing::warn!(task_id = %task_id, error = %status, "RunTurn failed");
                    Err(refused_fault(&routed, &status))
                }
            },
            Err(fault) => Err(fault),
        };
        match started {
            Err(fault) => {
                let events = lock(&live.inner).mapper.not_started(fault, now_micros());
                live.settle(events).await;
                self.finish(&live, &task_id).await;
            }
            Ok(stream) => self.follow_turn(live, stream).await,
        }
    }

    /// Follows a turn's event stream (its RunTurn, or an AttachTurn after a takeover) to the
    /// task's end.
    async fn follow_turn(&self, live: Arc<LiveTask>, mut stream: crate::cells::TurnEvents) {
        let task_id = lock(&live.inner).task.id.clone();
        let ended = async |live: &LiveTask, reason: String| {
            let events = lock(&live.inner).mapper.stream_ended(&reason, now_micros());
            live.settle(events).await;
        };
        {
            {
                loop {
                    // Take whatever is already there; only when the supervisor has nothing more
                    // ready is buffered text sent, which coalesces bursts without adding delay.
                    let next = match stream.next().now_or_never() {
                        Some(n) => n,
                        None => {
                            let pending = {
                                let mut inner = lock(&live.inner);
                                let events = inner.mapper.flush(now_micros());
                                if !events.is_empty() {
                                    live.apply(&mut inner, events);
                                }
                                LiveTask::has_unwritten(&inner)
                            };
                            if pending {
                                // Quiet for a while: store what streamed so far.
                                match tokio::time::timeout(PENDING_AGE, stream.next()).await {
                                    Ok(n) => n,
                                    Err(_) => {
                                        live.write_pending(&mut lock(&live.inner));
                                        stream.next().await
                                    }
                                }
                            } else {
                                stream.next().await
                            }
                        }
                    };
                    match next {
                        Some(Ok(ev)) => {
                            let settling = {
                                let mut inner = lock(&live.inner);
                                let events = inner.mapper.on_event(&ev, now_micros());
                                if waits_for_disk(&events) {
                                    live.persist_unflushed(&mut inner, &events);
                                    Some(events)
                                } else {
                                    live.apply(&mut inner, events);
                                    None
                                }
                            };
                            // The end of a task is on disk before anyone is told, and that
                            // wait holds no runtime worker (a wave's tasks end together).
                            if let Some(events) = settling {
                                if let Err(e) = live.sync().await {
                                    tracing::error!(task_id = %task_id, error = %e, "cannot persist task update");
                                }
                                live.announce_all(&mut lock(&live.inner), events);
                            }
                            if lock(&live.inner).mapper.is_finished() {
                                break;
                            }
                        }
                        Some(Err(status)) => {
                            tracing::warn!(task_id = %task_id, error = %status, "turn stream failed");
                            ended(
                                &live,
                                format!("the turn stream failed: {}", status.message()),
                            )
                            .await;
                            break;
                        }
                        None => {
                            ended(&live, "the turn stream ended without a stop".into()).await;
                            break;
                        }
                    }
                    if lock(&live.inner).mapper.is_finished() {
                        break;
                    }
                }
            }
        }
        self.finish(&live, &task_id).await;
    }

    /// The task is over here: everything written, then it is read from the store.
    async fn finish(&self, live: &LiveTask, task_id: &str) {
        let state = {
            let mut inner = lock(&live.inner);
            // Read from the store from now on: nothing may stay buffered.
            live.write_pending(&mut inner);
            inner.task.status.state
        };
        if let Err(e) = live.sync().await {
            tracing::error!(task_id = %task_id, error = %e, "cannot persist task update");
        }
        tracing::info!(task_id = %task_id, state = state.as_str(), "task finished");
        if let Ok(mut m) = self.live.lock() {
            m.remove(task_id);
        }
    }
}

/// A refused RunTurn's fault; on a cell whose TLS handshake refused a certificate (either
/// way), `cell-refused`; on a cell that could not be reached otherwise, `cell-lost`.
pub fn refused_fault(
    routed: &crate::cells::Routed,
    status: &tonic::Status,
) -> warden_proto::v1::Fault {
    if let Some(f) = routed.refused_certificate(status) {
        return f;
    }
    let f = fault_of_refused_turn(status);
    match &routed.cell {
        Some(cell) if f.fault_class() == warden_proto::v1::FaultClass::SupervisorUnavailable => {
            crate::cells::cell_lost(format!(
                "cell {cell} could not be reached: {}",
                status.message()
            ))
        }
        _ => f,
    }
}

/// How often a follower reads its task again without a note (a note lost, or none sent).
const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// A subscription to a task another replica follows: the stored task now, then the changes
/// the follower writes, read again on each of the store's notes about the task (PostgreSQL's
/// NOTIFY, sent by the write's own statement) and every [`FOLLOW_POLL`] at the latest.
fn follow(store: TaskStore, task: Task) -> Subscription {
    let (tx, rx) = broadcast::channel(SUBSCRIBER_BUFFER);
    let changes = store.changes();
    tokio::spawn(follow_loop(store, changes, task.clone(), tx));
    Subscription {
        task,
        events: Some(rx),
        permit: None,
        keepalive: DEFAULT_KEEPALIVE,
    }
}

/// Waits for a note about `id` ("" says anything may have changed).
async fn note_about(changes: &mut Option<broadcast::Receiver<String>>, id: &str) {
    let Some(rx) = changes else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(t) if t == id || t.is_empty() => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => {
                *changes = None;
                return std::future::pending().await;
            }
        }
    }
}

async fn follow_loop(
    store: TaskStore,
    mut changes: Option<broadcast::Receiver<String>>,
    mut seen: Task,
    tx: broadcast::Sender<SharedEvent>,
) {
    let mut tick = tokio::time::interval(FOLLOW_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The first tick is at once: what changed before the note listener was there is read.
        tokio::select! {
            _ = tick.tick() => {}
            _ = note_about(&mut changes, &seen.id) => {}
        }
        if tx.receiver_count() == 0 {
            return;
        }
        let now = match store.load(&seen.id).await {
            Ok(Some((t, _))) => t,
            Ok(None) => {
                // Deleted (retention) under the subscriber: nothing more will come.
                return;
            }
            Err(e) => {
                tracing::warn!(task_id = %seen.id, error = %e, "cannot read a followed task; retrying");
                continue;
            }
        };
        for ev in task_changes(&seen, &now) {
            let _ = tx.send(Arc::new(ev));
        }
        seen = now;
        if seen.status.state.is_terminal() {
            return;
        }
    }
}

/// The events that take a subscriber from `old` to `new`: each artifact that grew (the new
/// parts appended) or changed (replaced), then the status when it changed.
fn task_changes(old: &Task, new: &Task) -> Vec<StreamResponse> {
    use crate::a2a::{TaskArtifactUpdateEvent, TaskStatusUpdateEvent};
    let mut out = Vec::new();
    for (i, art) in new.artifacts.iter().enumerate() {
        let before = old.artifacts.get(i);
        if before == Some(art) {
            continue;
        }
        let (artifact, append) = match before.and_then(|b| appended(b, art)) {
            Some(parts) => (
                crate::a2a::Artifact {
                    parts,
                    ..art.clone()
                },
                true,
            ),
            None => (art.clone(), false),
        };
        out.push(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: new.id.clone(),
            context_id: new.context_id.clone(),
            artifact,
            append,
            last_chunk: false,
            metadata: None,
        }));
    }
    if new.status != old.status {
        out.push(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: new.id.clone(),
            context_id: new.context_id.clone(),
            status: new.status.clone(),
            metadata: None,
        }));
    }
    out
}

/// The parts that, appended to `old`'s, make `new`'s (text joined as the store joins it);
/// `None` when `new` is not `old` grown.
fn appended(
    old: &crate::a2a::Artifact,
    new: &crate::a2a::Artifact,
) -> Option<Vec<crate::a2a::Part>> {
    if old.artifact_id != new.artifact_id || new.parts.len() < old.parts.len() {
        return None;
    }
    let mut extra = Vec::new();
    for (i, p) in new.parts.iter().enumerate() {
        match old.parts.get(i) {
            Some(o) if o == p => {}
            // The last old part is a text the new one continues.
            Some(o) if i + 1 == old.parts.len() => match (&o.content, &p.content) {
                (PartContent::Text(a), PartContent::Text(b))
                    if b.starts_with(a.as_str()) && o.metadata == p.metadata =>
                {
                    extra.push(crate::a2a::Part::text(&b[a.len()..]));
                }
                _ => return None,
            },
            Some(_) => return None,
            None => extra.push(p.clone()),
        }
    }
    Some(extra)
}

/// What a RunTurn refused before its stream began means for the task. A refusal for a fault
/// carries the typed fault as the status's binary details (startup, prompt-too-large); any other
/// invalid argument is a refusal of the request (REJECTED); anything else is the supervisor being
/// unavailable. The message text is shown, never parsed.
pub fn fault_of_refused_turn(status: &tonic::Status) -> warden_proto::v1::Fault {
    use prost::Message;
    use warden_proto::v1::{Fault, FaultClass};
    if let Ok(f) = Fault::decode(status.details())
        && f.fault_class() != FaultClass::Unspecified
    {
        return f;
    }
    let msg = status.message();
    let (class, name, message) = if status.code() == tonic::Code::InvalidArgument {
        (FaultClass::Rejected, "rejected", msg.to_string())
    } else {
        (
            FaultClass::SupervisorUnavailable,
            "supervisor",
            format!("the supervisor could not run the turn: {msg}"),
        )
    };
    Fault {
        class: name.to_string(),
        message,
        fault_class: class as i32,
    }
}

/// The ACP elicitation answer for a caller's message: a data part is the answer object; text is
/// sent as a JSON string. `metadata.warden.action` may say `decline` or `cancel`.
fn answer_content(m: &Message) -> (String, String) {
    let action = m
        .metadata
        .as_ref()
        .and_then(|md| md.get(META_KEY))
        .and_then(|w| w.get("action"))
        .and_then(|a| a.as_str())
        .filter(|a| matches!(*a, "accept" | "decline" | "cancel"))
        .unwrap_or("accept")
        .to_string();
    let data = m.parts.iter().find_map(|p| match &p.content {
        PartContent::Data(v) => Some(v.to_string()),
        _ => None,
    });
    let content = data.unwrap_or_else(|| {
        serde_json::to_string(&m.prompt_text()).unwrap_or_else(|_| "\"\"".into())
    });
    (action, content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::v1::{TextChunk, TurnEvent, TurnStarted, TurnStop, turn_event::Event};

    #[test]
    fn a_refused_turn_is_read_from_its_typed_details_not_its_text() {
        use prost::Message;
        use warden_proto::v1::{Fault, FaultClass};
        // The message says nothing a parser could use; the details say startup.
        let detail = Fault {
            class: "startup".into(),
            message: "bwrap: no permission".into(),
            fault_class: FaultClass::Startup as i32,
        };
        let s = tonic::Status::with_details(
            tonic::Code::Unavailable,
            "something went wrong",
            detail.encode_to_vec().into(),
        );
        let f = fault_of_refused_turn(&s);
        assert_eq!(f.fault_class(), FaultClass::Startup);
        assert_eq!(f.message, "bwrap: no permission");
        // A message that merely looks like a startup fault, without details, is not one.
        let s = tonic::Status::unavailable("startup fault: forged");
        assert_eq!(
            fault_of_refused_turn(&s).fault_class(),
            FaultClass::SupervisorUnavailable
        );
        let s = tonic::Status::invalid_argument("task text is empty");
        assert_eq!(
            fault_of_refused_turn(&s).fault_class(),
            FaultClass::Rejected
        );
    }

    use crate::store::SledStore;

    /// A runtime for the live task's writer (tests drive it with `block_on`).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    fn live(store: &Arc<SledStore>) -> LiveTask {
        let task = Task {
            id: "t1".into(),
            context_id: "c1".into(),
            status: TaskStatus {
                state: TaskState::Submitted,
                message: None,
                timestamp: None,
            },
            artifacts: vec![],
            history: vec![],
            metadata: None,
        };
        LiveTask::new(
            task.clone(),
            TaskRecord {
                task,
                principal: "alice".into(),
                agent: "scripted".into(),
                created_micros: 0,
                status_micros: 0,
            },
            TurnMapper::new("t1", "c1"),
            store.clone() as TaskStore,
            None,
        )
    }

    fn feed(l: &LiveTask, e: Event, flush: bool) {
        let mut inner = lock(&l.inner);
        let mut events = inner.mapper.on_event(
            &TurnEvent {
                turn_id: "t1".into(),
                seq: 0,
                event: Some(e),
            },
            1,
        );
        if flush {
            events.extend(inner.mapper.flush(2));
        }
        l.apply(&mut inner, events);
    }

    fn drain(sub: &mut Subscription) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(rx) = &mut sub.events {
            while let Ok(ev) = rx.try_recv() {
                out.push(serde_json::to_string(&*ev).unwrap());
            }
        }
        out
    }

    #[test]
    fn subscribers_see_a_consistent_snapshot_then_the_same_events_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let rt = runtime();
        let _rt = rt.enter();
        let l = live(&store);
        let mut first = l.subscribe();
        feed(&l, Event::Started(TurnStarted::default()), false);
        feed(
            &l,
            Event::MessageChunk(TextChunk {
                text: "Hel".into(),
                ..Default::default()
            }),
            true,
        );
        let mut second = l.subscribe();
        // The late subscriber's snapshot already holds what it missed.
        assert_eq!(second.task.status.state, TaskState::Working);
        assert_eq!(
            second.task.artifacts[0].parts,
            vec![crate::a2a::Part::text("Hel")]
        );
        feed(
            &l,
            Event::MessageChunk(TextChunk {
                text: "lo".into(),
                ..Default::default()
            }),
            true,
        );
        feed(
            &l,
            Event::Stop(TurnStop {
                stop_reason: "end_turn".into(),
                ..Default::default()
            }),
            false,
        );
        let a = drain(&mut first);
        let b = drain(&mut second);
        assert_eq!(a.len(), 5, "{a:#?}");
        assert_eq!(
            &a[2..],
            &b[..],
            "the late subscriber sees exactly the events after its snapshot"
        );
        // Storage agrees with memory: one merged answer, the final state, and it is flushed.
        rt.block_on(l.sync()).unwrap();
        let (stored, _) = store.load("t1").unwrap().unwrap();
        assert_eq!(stored.status.state, TaskState::Completed);
        assert_eq!(
            stored.artifacts[0].parts,
            vec![crate::a2a::Part::text("Hello")]
        );
        assert_eq!(stored, lock(&l.inner).task);
        // A terminal task gives a snapshot and no event stream.
        assert!(l.subscribe().events.is_none());
    }

    /// A task's end is written under the task's lock but waited for outside it: writing it
    /// does not wait for the disk (held shut here), nobody is told before the disk answered,
    /// and then every subscriber hears the end, once, in order.
    #[test]
    fn the_end_of_a_task_is_told_only_after_it_is_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let rt = runtime();
        let _rt = rt.enter();
        let l = Arc::new(live(&store));
        let mut sub = l.subscribe();
        feed(&l, Event::Started(TurnStarted::default()), false);
        assert_eq!(drain(&mut sub).len(), 1, "WORKING is told at once");
        let closed = store.flush_gate.write().unwrap();
        let events = {
            let mut inner = lock(&l.inner);
            let events = inner.mapper.on_event(
                &TurnEvent {
                    turn_id: "t1".into(),
                    seq: 0,
                    event: Some(Event::Stop(TurnStop {
                        stop_reason: "end_turn".into(),
                        ..Default::default()
                    })),
                },
                3,
            );
            assert!(waits_for_disk(&events));
            // Returns with the disk shut: no flush under the lock.
            l.persist_unflushed(&mut inner, &events);
            events
        };
        assert!(
            drain(&mut sub).is_empty(),
            "nobody is told before the flush"
        );
        assert_eq!(*l.state.borrow(), TaskState::Working);
        let syncing = rt.spawn({
            let l = l.clone();
            async move { l.sync().await }
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!syncing.is_finished(), "the disk is shut: not durable yet");
        drop(closed);
        rt.block_on(syncing).unwrap().unwrap();
        l.announce_all(&mut lock(&l.inner), events);
        let told = drain(&mut sub);
        assert_eq!(told.len(), 1, "{told:#?}");
        assert!(told[0].contains("TASK_STATE_COMPLETED"), "{told:#?}");
        assert_eq!(*l.state.borrow(), TaskState::Completed);
        let (stored, _) = store.load("t1").unwrap().unwrap();
        assert_eq!(stored.status.state, TaskState::Completed);
    }

    /// An answer that arrives between a question's write and its announcement (the caller read
    /// INPUT_REQUIRED with GetTask while the flush was awaited) waits for the announcement, so
    /// everyone hears INPUT_REQUIRED and then the answer's WORKING, and a blocking answer waits
    /// for the turn instead of returning at once (seen in CI: the task came back WORKING).
    #[test]
    fn an_answer_waits_for_its_question_to_be_announced() {
        use warden_proto::v1::Question;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let _rt = rt.enter();
        let l = Arc::new(live(&store));
        let mut sub = l.subscribe();
        feed(&l, Event::Started(TurnStarted::default()), false);
        let events = {
            let mut inner = lock(&l.inner);
            let events = inner.mapper.on_event(
                &TurnEvent {
                    turn_id: "t1".into(),
                    seq: 0,
                    event: Some(Event::Question(Question {
                        question_id: "q1".into(),
                        message: "Which colour?".into(),
                        requested_schema_json: String::new(),
                    })),
                },
                3,
            );
            assert!(waits_for_disk(&events));
            l.persist_unflushed(&mut inner, &events);
            events
        };
        assert_eq!(lock(&l.inner).task.status.state, TaskState::InputRequired);
        rt.block_on(async {
            let answering = tokio::spawn({
                let l = l.clone();
                async move { l.take_question().await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                !answering.is_finished(),
                "the answer waits for the announcement"
            );
            l.announce_all(&mut lock(&l.inner), events);
            assert_eq!(answering.await.unwrap(), Ok("q1".to_string()));
            // A second answer to the same question is refused while the first is delivered.
            assert_eq!(l.take_question().await, Err(TaskState::InputRequired));
        });
        let told = drain(&mut sub);
        assert!(told[1].contains("TASK_STATE_INPUT_REQUIRED"), "{told:#?}");
        let resumed = lock(&l.inner).mapper.question_answered(4);
        l.apply(&mut lock(&l.inner), resumed);
        assert_eq!(*l.state.borrow(), TaskState::Working);
        let told = drain(&mut sub);
        assert!(told[0].contains("TASK_STATE_WORKING"), "{told:#?}");
    }

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
            sends.push(rt.spawn(async move { core.send("alice", req, true).await.is_ok() }));
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
}
