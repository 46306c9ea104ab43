//! The gateway's durable task store: one seam, [`TaskBackend`], with two backends — sled
//! ([`SledStore`], here: one gateway on one host, the default) and PostgreSQL (`store_pg.rs`:
//! gateway replicas sharing one database).
//!
//! The seam is async because PostgreSQL is: a sync facade over an async client would block a
//! runtime worker per call (issue 30 showed what a few blocked workers do to the gateway). The
//! sled backend answers its async calls at once (sled's writes are in memory until
//! [`TaskBackend::flush`], the one durability point, which waits on a blocking thread).
//!
//! The sled layout:
//! Layout, chosen so that every change is one small write rather than a rewrite of the task:
//! - tree `tasks`:     `<task id>` → [`TaskRecord`] (the task without history and artifacts)
//! - tree `history`:   `<task id>/<seq:010>` → one [`Message`], or a JSON array of the messages
//!   numbered from `seq` on (a segment: a live task's status messages are written in batches,
//!   see `core::writer::Writes::write_pending`)
//! - tree `artifacts`: `<task id>/<artifact index:04>/<chunk:010>` → one [`ArtifactChunk`]
//! - tree `contexts`:  `<context id>` → [`ContextRecord`] (who owns the conversation)
//! - tree `push`:      `<task id>/<config id>` → [`PushRecord`] (a task's webhook configs)
//!
//! Appended artifact chunks are stored as they stream and merged on read, so a long answer costs
//! one write per coalesced update, not one rewrite of everything so far.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use warden_store::StoreError;

use crate::a2a::{Artifact, Message, Part, PartContent, Task};

/// Errors of the task store.
#[derive(Debug, thiserror::Error)]
pub enum TaskStoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored record {key} is not valid: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot encode record: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the store's background work stopped: {0}")]
    Background(String),
    #[error("task database: {0}")]
    Pg(#[from] warden_pgstate::PgError),
}

/// What the sweep knows of one context's remaining tasks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContextUsage {
    pub count: usize,
    /// A task of the context is not terminal.
    pub busy: bool,
    pub last_status_micros: i64,
}

/// What pruning did: tasks deleted, and per context what remains.
#[derive(Debug, Default, Clone)]
pub struct Pruned {
    pub deleted: usize,
    pub contexts: HashMap<String, ContextUsage>,
}

/// The task store's one seam. Every backend keeps the same promises (held by the contract
/// tests at the end of this file, run against both): a head never runs ahead of what was
/// written before it, everything written before [`TaskBackend::flush`] returns Ok survives a
/// crash, a task is visible only with its head, and a context has one principal for ever (until
/// the sweep forgets it).
#[tonic::async_trait]
pub trait TaskBackend: Send + Sync + std::fmt::Debug {
    /// Writes the task head. `record.task` should carry no history/artifacts (they are ignored).
    async fn put_head(&self, record: &TaskRecord) -> Result<(), TaskStoreError>;
    async fn head(&self, task_id: &str) -> Result<Option<TaskRecord>, TaskStoreError>;
    /// Every task head of `principal` (ListTasks filters and orders them).
    async fn heads_of(&self, principal: &str) -> Result<Vec<TaskRecord>, TaskStoreError>;
    /// Stores the messages numbered `first_seq`, `first_seq + 1`, … of a task.
    async fn put_history_segment(
        &self,
        task_id: &str,
        first_seq: u64,
        msgs: &[Message],
    ) -> Result<(), TaskStoreError>;
    async fn history(&self, task_id: &str) -> Result<Vec<Message>, TaskStoreError>;
    /// Stores artifact chunks `(artifact index, chunk number, chunk)` atomically.
    async fn put_artifact_chunks(
        &self,
        task_id: &str,
        chunks: &[(u32, u64, ArtifactChunk)],
    ) -> Result<(), TaskStoreError>;
    /// The task's artifacts with appended chunks merged, in the order they were first produced.
    async fn artifacts(&self, task_id: &str) -> Result<Vec<Artifact>, TaskStoreError>;

    /// The whole task (head, history, artifacts) and its owner.
    async fn load(&self, task_id: &str) -> Result<Option<(Task, TaskRecord)>, TaskStoreError> {
        let Some(record) = self.head(task_id).await? else {
            return Ok(None);
        };
        let mut task = record.task.clone();
        task.history = self.history(task_id).await?;
        task.artifacts = self.artifacts(task_id).await?;
        Ok(Some((task, record)))
    }

    async fn context(&self, context_id: &str) -> Result<Option<ContextRecord>, TaskStoreError>;
    async fn put_context(
        &self,
        context_id: &str,
        rec: &ContextRecord,
    ) -> Result<(), TaskStoreError>;
    /// Claims a context for a new task, atomically across replicas: absent, `fresh` is stored;
    /// present and `fresh.principal`'s, it is marked in use again (`last_task_micros` from
    /// `fresh`, not closed); another principal's, it is left alone. Returns the record as it
    /// stands after the call (the caller refuses when its principal is not the caller's).
    async fn claim_context(
        &self,
        context_id: &str,
        fresh: &ContextRecord,
    ) -> Result<ContextRecord, TaskStoreError>;
    /// Every context record.
    async fn contexts(&self) -> Result<Vec<(String, ContextRecord)>, TaskStoreError>;
    /// Deletes a context record unless it changed since `seen` was read; whether it did.
    async fn forget_context(
        &self,
        context_id: &str,
        seen: &ContextRecord,
    ) -> Result<bool, TaskStoreError>;

    /// Deletes tasks: head, history, artifacts, push configs (the head first).
    async fn delete_tasks(&self, task_ids: &[&str]) -> Result<(), TaskStoreError>;

    /// Stores (creating or replacing) one push config of a task, durably.
    async fn put_push(&self, rec: &PushRecord) -> Result<(), TaskStoreError>;
    /// A task's push configs, in config id order.
    async fn push_configs(&self, task_id: &str) -> Result<Vec<PushRecord>, TaskStoreError>;
    async fn push_config(
        &self,
        task_id: &str,
        id: &str,
    ) -> Result<Option<PushRecord>, TaskStoreError>;
    /// Deletes one push config, durably; whether it existed.
    async fn delete_push(&self, task_id: &str, id: &str) -> Result<bool, TaskStoreError>;

    async fn task_count(&self) -> Result<usize, TaskStoreError>;

    /// Everything written before the call is durable when it returns Ok.
    async fn flush(&self) -> Result<(), TaskStoreError>;

    /// Deletes what the retention rules say must go, per principal across every replica's
    /// tasks: terminal tasks whose last status is older than `cutoff_micros`, then the oldest
    /// terminal ones beyond `max_tasks` (a running task is never deleted, but counts).
    async fn prune(&self, cutoff_micros: i64, max_tasks: usize) -> Result<Pruned, TaskStoreError>;

    /// Tasks left submitted, working or waiting for input by a follower that is gone: with
    /// sled, every such task at start (the one gateway restarted); with PostgreSQL, those whose
    /// follower's lease ran out. Each is marked FAILED with a message saying why; returns them.
    async fn recover(&self) -> Result<Vec<TaskRecord>, TaskStoreError>;

    /// Tasks another replica followed and stopped renewing (its lease ran out): candidates for
    /// a takeover ([`TaskBackend::claim_orphan`]). None with sled.
    async fn orphans(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        Ok(Vec::new())
    }

    /// Makes this replica the follower of an orphan, atomically: false when another replica
    /// claimed it first, it ended, or its lease was renewed meanwhile.
    async fn claim_orphan(&self, _task_id: &str) -> Result<bool, TaskStoreError> {
        Ok(false)
    }

    /// Forgets what a task's turn produced (history after the caller's message, artifacts),
    /// before a takeover writes it again from the turn's first event.
    async fn reset_progress(&self, _task_id: &str) -> Result<(), TaskStoreError> {
        Ok(())
    }

    /// Ends a task FAILED with a message saying `why` (unless it ended meanwhile); the record
    /// as ended, or `None`.
    async fn fail_task(
        &self,
        _rec: TaskRecord,
        _why: &str,
    ) -> Result<Option<TaskRecord>, TaskStoreError> {
        Ok(None)
    }

    /// Holds an answer (the caller's SendMessage, JSON) to `task_id`'s question for the
    /// replica following the task; its id, or `None` where no other replica exists (sled).
    async fn forward_answer(
        &self,
        _task_id: &str,
        _request: &[u8],
    ) -> Result<Option<String>, TaskStoreError> {
        Ok(None)
    }

    /// Answers held for tasks this replica follows: (answer id, task id, request JSON).
    async fn answers_to_deliver(&self) -> Result<Vec<(String, String, Vec<u8>)>, TaskStoreError> {
        Ok(Vec::new())
    }

    /// Records what delivering an answer did (`Ok`, or the refusal's text).
    async fn set_answer_outcome(
        &self,
        _id: &str,
        _outcome: Result<(), String>,
    ) -> Result<(), TaskStoreError> {
        Ok(())
    }

    /// What delivering answer `id` did, once its follower tried.
    async fn answer_outcome(
        &self,
        _id: &str,
    ) -> Result<Option<Result<(), String>>, TaskStoreError> {
        Ok(None)
    }

    /// Renews the lease of every task this replica follows (`live`); returns those another
    /// replica took over meanwhile (whose writes from here are ignored from then on: a
    /// follower writes a task only while it owns it). A no-op for sled.
    async fn renew_leases(&self, _live: &[String]) -> Result<Vec<String>, TaskStoreError> {
        Ok(Vec::new())
    }

    /// Ends a task (the terminal head `rec`) unless it ended already, whoever follows it: a
    /// cancel that another replica's follower did not end in time. Whether it did.
    async fn end_if_running(&self, rec: &TaskRecord) -> Result<bool, TaskStoreError>;

    /// Whether other gateway replicas share this store (a task that is not live here may be
    /// live on another one).
    fn shared(&self) -> bool {
        false
    }

    /// Ids of tasks whose stored state changed on any replica (PostgreSQL's NOTIFY); `None`
    /// for a store nobody else writes.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// `sled` or `postgres`, and where.
    fn describe(&self) -> String;

    /// Bytes on disk, where the backend knows them.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }
}

/// The store every part of the gateway shares.
pub type TaskStore = std::sync::Arc<dyn TaskBackend>;

/// The message a task left running by a follower that is gone is failed with.
pub fn orphaned_message(rec: &TaskRecord, why: &str) -> Message {
    Message::agent_text(
        &rec.task.id,
        &rec.task.context_id,
        format!(
            "{why} while the task was {}; its turn could not be followed",
            rec.task.status.state.as_str()
        ),
        None,
    )
}

/// The stored head of a task: everything but its history and artifacts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task with `history` and `artifacts` left empty.
    pub task: Task,
    /// The principal that created the task; nobody else may see it.
    pub principal: String,
    /// The configured agent that runs it.
    pub agent: String,
    pub created_micros: i64,
    /// When the current status was set (for ListTasks ordering and filtering).
    pub status_micros: i64,
}

/// Who owns a conversation (A2A context), and where its lifecycle stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextRecord {
    pub principal: String,
    pub agent: String,
    pub created_micros: i64,
    /// When the context's latest task was submitted (records written before this field read as
    /// 0: their tasks' own timestamps decide).
    #[serde(default)]
    pub last_task_micros: i64,
    /// Set when the gateway closed the context's conversation at the supervisor; cleared by the
    /// next task, which opens a new one.
    #[serde(default)]
    pub closed_micros: Option<i64>,
}

/// One stored push notification config and who created it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushRecord {
    pub principal: String,
    pub config: crate::a2a::TaskPushNotificationConfig,
    pub created_micros: i64,
}

/// One stored artifact update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactChunk {
    pub artifact: Artifact,
    pub append: bool,
}

/// A history segment is closed once it is this long (sled keeps values up to about 32 KiB in
/// its log; a longer one becomes a file of its own).
pub const SEGMENT_BYTES: usize = 16 * 1024;

/// Appends `part` to `parts`, joining consecutive text parts so a streamed answer reads as one.
fn push_merged(parts: &mut Vec<Part>, part: Part) {
    if let (Some(last), PartContent::Text(more)) = (parts.last_mut(), &part.content)
        && let PartContent::Text(text) = &mut last.content
        && last.metadata.is_none()
        && part.metadata.is_none()
    {
        text.push_str(more);
        return;
    }
    parts.push(part);
}

/// Merges one task's artifact chunks, in (artifact index, chunk) order, into its artifacts:
/// appended chunks join the artifact, a non-append update replaces its content.
pub fn merge_artifact_chunks(chunks: Vec<(u32, ArtifactChunk)>) -> Vec<Artifact> {
    let mut out: Vec<Artifact> = Vec::new();
    let mut current: Option<u32> = None;
    for (index, chunk) in chunks {
        let same = current == Some(index);
        if same && chunk.append {
            if let Some(last) = out.last_mut() {
                for part in chunk.artifact.parts {
                    push_merged(&mut last.parts, part);
                }
            }
        } else if same {
            if let Some(last) = out.last_mut() {
                *last = chunk.artifact;
            }
        } else {
            out.push(chunk.artifact);
            current = Some(index);
        }
    }
    out
}
