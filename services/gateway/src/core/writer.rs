//! A live task's state under its lock ([`LiveInner`]) and what of it reaches the disk: each event
//! taken into the task and its write buffers ([`Writes::persist`]), the buffers written as one
//! batch when due ([`Writes::write_pending`]), and the task's writer, which applies its writes in
//! the order they were made ([`write_loop`]).
//!
//! Owns: the batching and the order of a live task's writes. Must never: await under the task's
//! lock, or announce anything (`live.rs` does, once the writes it needs are durable).

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::a2a::{Message, PartContent, StreamResponse, Task};
use crate::mapping::TurnMapper;
use crate::store::{ArtifactChunk, TaskRecord, TaskStore};
use crate::time::now_micros;

/// Buffered artifact chunks and status messages are written once this many have gathered…
const PENDING_MAX: usize = 256;
/// …or once the oldest is this old, or the stream has been quiet this long.
pub(super) const PENDING_AGE: Duration = Duration::from_millis(50);
/// Whether applying `events` waits for the disk (a terminal or interrupted status is flushed
/// before anyone is told).
pub(super) fn waits_for_disk(events: &[StreamResponse]) -> bool {
    events.iter().any(|e| {
        matches!(e, StreamResponse::StatusUpdate(s)
            if s.status.state.is_terminal() || s.status.state.is_interrupted())
    })
}

/// A live task's state under its lock: the task as it is, and what of it is not yet written.
pub(super) struct LiveInner {
    pub(super) task: Task,
    pub(super) record: TaskRecord,
    pub(super) mapper: TurnMapper,
    /// Messages in the task's history, written or not.
    pub(super) history_seq: u64,
    /// artifact id → (index in `task.artifacts`, next chunk number)
    pub(super) artifact_chunks: HashMap<String, (u32, u64)>,
    /// Artifact chunks not yet written, and since when: streamed text is written in batches so
    /// the store stays off the per-event path (see [`Writes::write_pending`]).
    pub(super) pending: Vec<(u32, u64, ArtifactChunk)>,
    /// How many of the last messages of `task.history` are not yet written, and whether the
    /// status changed since the head was last written (`record.task.status` is brought up to
    /// date then): a permission is three status messages, and one store write each was about
    /// a third of the gateway's CPU per permission.
    pub(super) pending_history: usize,
    pub(super) head_dirty: bool,
    pub(super) pending_since: Option<std::time::Instant>,
    pub(super) answering: bool,
}

impl LiveInner {
    /// A task just submitted: its user message is history entry 0.
    pub(super) fn new(task: Task, record: TaskRecord, mapper: TurnMapper) -> Self {
        Self {
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
        }
    }

    /// A message joins the task's history (written with the next batch).
    pub(super) fn push_history(&mut self, m: Message) {
        self.pending_history += 1;
        self.history_seq += 1;
        self.task.history.push(m);
        self.pending_since
            .get_or_insert_with(std::time::Instant::now);
    }

    /// Whether something is buffered and not yet written.
    pub(super) fn has_unwritten(&self) -> bool {
        !self.pending.is_empty() || self.pending_history > 0 || self.head_dirty
    }
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
/// writes leave the lock through this queue, in order, and [`Writes::sync`] waits for them.
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

/// A live task's queue to its writer: writes leave the task's lock through it, in order.
pub(super) struct Writes(mpsc::UnboundedSender<Write>);

impl Writes {
    /// The queue of the task `task_id`, and its writer started.
    pub(super) fn spawn(store: TaskStore, task_id: String) -> Self {
        let (writes, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(store, task_id, rx));
        Self(writes)
    }

    /// Waits until every write made so far is durable. Holds no lock.
    pub(super) async fn sync(&self) -> Result<(), String> {
        let (done, rx) = oneshot::channel();
        if self.0.send(Write::Sync(done)).is_err() {
            return Err("the task's writer stopped".into());
        }
        rx.await
            .map_err(|_| "the task's writer stopped".to_string())?
    }

    pub(super) fn write_if_due(&self, inner: &mut LiveInner) {
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
    pub(super) fn write_pending(&self, inner: &mut LiveInner) {
        inner.pending_since = None;
        // Queued in this order; the writer applies them in it (a failure is logged there and
        // reported by the next `sync`).
        if !inner.pending.is_empty() {
            let chunks = std::mem::take(&mut inner.pending);
            let _ = self.0.send(Write::Chunks(chunks));
        }
        if inner.pending_history > 0 {
            let n = std::mem::take(&mut inner.pending_history);
            let msgs = &inner.task.history[inner.task.history.len().saturating_sub(n)..];
            let first = inner.history_seq - msgs.len() as u64;
            let _ = self.0.send(Write::History(first, msgs.to_vec()));
        }
        if inner.head_dirty {
            inner.head_dirty = false;
            inner.record.task.status = inner.task.status.clone();
            let _ = self.0.send(Write::Head(Box::new(inner.record.clone())));
        }
    }

    /// Takes one event into the task and the store's buffers; a terminal or interrupted status
    /// queues them at once (the caller waits for them with [`Writes::sync`]).
    pub(super) fn persist(&self, inner: &mut LiveInner, ev: &StreamResponse) {
        match ev {
            StreamResponse::StatusUpdate(s) => {
                inner.task.status = s.status.clone();
                inner.record.status_micros = now_micros();
                if let Some(m) = &s.status.message {
                    inner.push_history(m.clone());
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
