//! The sled backend of the gateway's task store ([`SledStore`]): one gateway on one host, the
//! default. The layout of its trees is in `store.rs`, beside the seam it implements. Must never:
//! wait for the disk on a runtime thread (flushes run on a thread of their own).

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use warden_store::{Store, Tree};

use crate::a2a::{Artifact, Message, Task, TaskState, TaskStatus};
use crate::store::*;

/// The gateway's tasks, their history and artifacts, in sled.
#[derive(Clone)]
pub struct SledStore {
    store: Store,
    tasks: Tree,
    history: Tree,
    artifacts: Tree,
    contexts: Tree,
    push: Tree,
    /// Every durability point of the gateway goes through one flush at a time (see [`Flushes`]).
    flushes: std::sync::Arc<Flushes>,
    /// Held for every read-modify-write of a context record, so its ownership is decided once.
    contexts_guard: std::sync::Arc<std::sync::Mutex<()>>,
    /// Tests hold this (write) to make every flush of this store wait, as a disk that takes its
    /// time with an fsync does.
    #[cfg(test)]
    pub(crate) flush_gate: std::sync::Arc<std::sync::RwLock<()>>,
}

/// Group commit: callers that need their writes on disk wait for one flush that began after
/// they asked, and at most one flush of the database runs at a time, however many tasks start
/// or end at once.
///
/// Why (issue 30's wave stall): each sled flush seals the current log buffer, and each sealed
/// buffer is written by a job on sled's IO thread pool that ends by taking sled's segment
/// accountant lock. sled 0.34.7 (the last 0.34 release) also queues a file truncation on that
/// pool when the segment at the end of the log is freed (the sweep's deletes free segments),
/// and the next new segment waits for that truncation *while holding the accountant lock*
/// (`SegmentAccountant::bump_tip`). With seven or more buffer writes queued ahead of it — a
/// wave of tasks each flushing on its own — every pool thread waits for the lock, the
/// truncation never runs, and no flush ever returns (fixed upstream after 0.34.7, sled PR
/// 1269, "a specific truncation thread"). One flush at a time keeps the gateway's buffer writes
/// far below the pool's seven threads, so a queued truncation always finds one.
struct Flushes {
    state: std::sync::Mutex<FlushState>,
    /// Woken when a flush ends (callers waiting on a thread)…
    done: std::sync::Condvar,
    /// …and callers waiting on the runtime ([`SledStore::flush_async`]).
    ended: tokio::sync::watch::Sender<u64>,
    /// The store's own flush thread (started at the first async flush): a flush led from the
    /// runtime runs there, never on tokio's blocking pool, which callers' work can fill (issue
    /// 36: 512 threads each waiting on a webhook's DNS held every flush, and every answer
    /// waiting on one, for tens of seconds). It ends when the store is dropped.
    thread: std::sync::Mutex<Option<std::sync::mpsc::Sender<FlushJob>>>,
}

/// One lead flush for the flush thread.
type FlushJob = Box<dyn FnOnce() + Send>;

impl Default for Flushes {
    fn default() -> Self {
        Self {
            state: Default::default(),
            done: Default::default(),
            ended: tokio::sync::watch::Sender::new(0),
            thread: Default::default(),
        }
    }
}

impl Flushes {
    /// Runs `job` on the flush thread (started if need be); the job back when no thread can
    /// be had (the caller runs it elsewhere).
    fn on_thread(&self, job: FlushJob) -> Result<(), FlushJob> {
        let mut t = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        let job = match t.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                Err(back) => back.0,
            },
            None => job,
        };
        let (tx, rx) = std::sync::mpsc::channel::<FlushJob>();
        let started = std::thread::Builder::new()
            .name("store-flush".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    // A panic in one flush is its caller's error (the state is put back by
                    // `lead_flush`); the thread serves the next.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the store's flush thread");
            return Err(job);
        }
        let sent = tx.send(job).map_err(|back| back.0);
        *t = Some(tx);
        sent
    }
}

#[derive(Default)]
struct FlushState {
    /// Requests so far (each caller takes the next number).
    asked: u64,
    /// Every request up to this number is on disk.
    covered: u64,
    /// A flush is running (its caller leads; the others wait for it).
    running: bool,
    /// Underlying database flushes made (for tests and figures).
    made: u64,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.store.path())
            .finish()
    }
}

fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], bytes: &[u8]) -> Result<T, TaskStoreError> {
    serde_json::from_slice(bytes).map_err(|source| TaskStoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, TaskStoreError> {
    serde_json::to_vec(value).map_err(TaskStoreError::Encode)
}

/// A value of the `history` tree: one message, or a segment of consecutive ones.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredHistory {
    Segment(Vec<Message>),
    One(Box<Message>),
}

impl SledStore {
    /// Opens (creating) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, TaskStoreError> {
        Self::open_with(dir, warden_store::StoreOptions::default())
    }

    /// Opens (creating) the store in `dir` with `options` (the page cache's capacity).
    pub fn open_with(
        dir: &Path,
        options: warden_store::StoreOptions,
    ) -> Result<Self, TaskStoreError> {
        let store = Store::open_with(dir, options)?;
        Ok(Self {
            tasks: store.tree("tasks")?,
            history: store.tree("history")?,
            artifacts: store.tree("artifacts")?,
            contexts: store.tree("contexts")?,
            push: store.tree("push")?,
            store,
            flushes: Default::default(),
            contexts_guard: Default::default(),
            #[cfg(test)]
            flush_gate: Default::default(),
        })
    }

    /// Writes the task head. `record.task` should carry no history/artifacts (they are ignored).
    pub fn put_head(&self, record: &TaskRecord) -> Result<(), TaskStoreError> {
        let mut head = record.clone();
        head.task.history.clear();
        head.task.artifacts.clear();
        self.tasks.put(record.task.id.as_bytes(), encode(&head)?)?;
        Ok(())
    }

    pub fn head(&self, task_id: &str) -> Result<Option<TaskRecord>, TaskStoreError> {
        match self.tasks.get(task_id.as_bytes())? {
            Some(bytes) => Ok(Some(decode(task_id.as_bytes(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every task head, in key order.
    pub fn heads(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        self.tasks
            .scan_prefix([])?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// Stores history message number `seq` (0-based) of a task.
    pub fn put_history(
        &self,
        task_id: &str,
        seq: u64,
        msg: &Message,
    ) -> Result<(), TaskStoreError> {
        self.history
            .put(format!("{task_id}/{seq:010}"), encode(msg)?)?;
        Ok(())
    }

    /// Stores the messages numbered `first_seq`, `first_seq + 1`, … of a task as segments
    /// (JSON arrays) of at most about [`SEGMENT_BYTES`] each: one write per batch instead of
    /// one per message, and small enough for sled to keep inline (a larger value becomes a file
    /// of its own, one per write). A lone message is stored as itself.
    pub fn put_history_segment(
        &self,
        task_id: &str,
        first_seq: u64,
        msgs: &[Message],
    ) -> Result<(), TaskStoreError> {
        if let [one] = msgs {
            return self.put_history(task_id, first_seq, one);
        }
        let mut seq = first_seq;
        let mut start = seq;
        let mut segment: Vec<u8> = Vec::new();
        for m in msgs {
            segment.push(if segment.is_empty() { b'[' } else { b',' });
            serde_json::to_writer(&mut segment, m).map_err(TaskStoreError::Encode)?;
            seq += 1;
            if segment.len() >= SEGMENT_BYTES {
                segment.push(b']');
                self.history.put(
                    format!("{task_id}/{start:010}"),
                    std::mem::take(&mut segment),
                )?;
                start = seq;
            }
        }
        if !segment.is_empty() {
            segment.push(b']');
            self.history
                .put(format!("{task_id}/{start:010}"), segment)?;
        }
        Ok(())
    }

    pub fn history(&self, task_id: &str) -> Result<Vec<Message>, TaskStoreError> {
        let mut out = Vec::new();
        for (k, v) in self.history.scan_prefix(format!("{task_id}/"))?.iter() {
            match decode::<StoredHistory>(k, v)? {
                StoredHistory::One(m) => out.push(*m),
                StoredHistory::Segment(ms) => out.extend(ms),
            }
        }
        Ok(out)
    }

    /// Stores chunk `chunk` of the task's artifact number `index`.
    pub fn put_artifact_chunk(
        &self,
        task_id: &str,
        index: u32,
        chunk: u64,
        value: &ArtifactChunk,
    ) -> Result<(), TaskStoreError> {
        self.artifacts
            .put(format!("{task_id}/{index:04}/{chunk:010}"), encode(value)?)?;
        Ok(())
    }

    /// Stores several artifact chunks `(artifact index, chunk number, chunk)` atomically.
    pub fn put_artifact_chunks(
        &self,
        task_id: &str,
        chunks: &[(u32, u64, ArtifactChunk)],
    ) -> Result<(), TaskStoreError> {
        let mut batch = warden_store::Batch::default();
        for (index, chunk, value) in chunks {
            batch.put(format!("{task_id}/{index:04}/{chunk:010}"), encode(value)?);
        }
        self.artifacts.apply(batch)?;
        Ok(())
    }

    /// The task's artifacts with appended chunks merged, in the order they were first produced
    /// ([`merge_artifact_chunks`], as the PostgreSQL backend merges them).
    pub fn artifacts(&self, task_id: &str) -> Result<Vec<Artifact>, TaskStoreError> {
        let prefix = format!("{task_id}/");
        let mut chunks = Vec::new();
        for (key, value) in self.artifacts.scan_prefix(&prefix)? {
            let chunk: ArtifactChunk = decode(&key, &value)?;
            // Key: <task>/<index:04>/<chunk>; the index segment groups one artifact's chunks.
            let index = key
                .get(prefix.len()..)
                .and_then(|rest| rest.split(|b| *b == b'/').next())
                .and_then(|i| std::str::from_utf8(i).ok())
                .and_then(|i| i.parse::<u32>().ok());
            match index {
                Some(index) => chunks.push((index, chunk)),
                None => tracing::warn!(
                    task_id,
                    key = %String::from_utf8_lossy(&key),
                    "an artifact chunk under a key without an index is left out"
                ),
            }
        }
        Ok(merge_artifact_chunks(chunks))
    }

    /// The whole task (head, history, artifacts) and its owner.
    pub fn load(&self, task_id: &str) -> Result<Option<(Task, TaskRecord)>, TaskStoreError> {
        let Some(record) = self.head(task_id)? else {
            return Ok(None);
        };
        let mut task = record.task.clone();
        task.history = self.history(task_id)?;
        task.artifacts = self.artifacts(task_id)?;
        Ok(Some((task, record)))
    }

    pub fn context(&self, context_id: &str) -> Result<Option<ContextRecord>, TaskStoreError> {
        match self.contexts.get(context_id.as_bytes())? {
            Some(bytes) => Ok(Some(decode(context_id.as_bytes(), &bytes)?)),
            None => Ok(None),
        }
    }

    pub fn put_context(&self, context_id: &str, rec: &ContextRecord) -> Result<(), TaskStoreError> {
        self.contexts.put(context_id.as_bytes(), encode(rec)?)?;
        Ok(())
    }

    /// Every context record, in key order.
    pub fn contexts(&self) -> Result<Vec<(String, ContextRecord)>, TaskStoreError> {
        self.contexts
            .scan_prefix([])?
            .iter()
            .map(|(k, v)| Ok((String::from_utf8_lossy(k).into_owned(), decode(k, v)?)))
            .collect()
    }

    pub fn delete_context(&self, context_id: &str) -> Result<(), TaskStoreError> {
        self.contexts.delete(context_id.as_bytes())?;
        Ok(())
    }

    /// Deletes a task: its head, history and artifacts. The head goes first, so a task whose
    /// deletion is interrupted is already invisible (nothing reads history without a head).
    pub fn delete_task(&self, task_id: &str) -> Result<(), TaskStoreError> {
        self.delete_tasks(&[task_id])
    }

    /// Deletes tasks as [`SledStore::delete_task`] does, their heads first, in one batch per
    /// tree rather than three per task: a sweep deleting a wave's hundred tasks made three
    /// hundred sled batches, each sealing log buffers written by sled's IO pool (see `Flushes`).
    pub fn delete_tasks(&self, task_ids: &[&str]) -> Result<(), TaskStoreError> {
        if task_ids.is_empty() {
            return Ok(());
        }
        let mut heads = warden_store::Batch::default();
        for id in task_ids {
            heads.delete(id.as_bytes());
        }
        self.tasks.apply(heads)?;
        let prefixes: Vec<String> = task_ids.iter().map(|id| format!("{id}/")).collect();
        self.history.delete_prefixes(&prefixes)?;
        self.artifacts.delete_prefixes(&prefixes)?;
        self.push.delete_prefixes(&prefixes)?;
        Ok(())
    }

    /// Stores (creating or replacing) one push config of a task and flushes: a caller that was
    /// told its config exists can rely on it across a restart.
    pub fn put_push(&self, rec: &PushRecord) -> Result<(), TaskStoreError> {
        self.push.put(
            format!("{}/{}", rec.config.task_id, rec.config.id),
            encode(rec)?,
        )?;
        self.flush()
    }

    /// A task's push configs, in config id order.
    pub fn push_configs(&self, task_id: &str) -> Result<Vec<PushRecord>, TaskStoreError> {
        self.push
            .scan_prefix(format!("{task_id}/"))?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// One push config of a task.
    pub fn push_config(
        &self,
        task_id: &str,
        id: &str,
    ) -> Result<Option<PushRecord>, TaskStoreError> {
        let key = format!("{task_id}/{id}");
        match self.push.get(key.as_bytes())? {
            Some(bytes) => Ok(Some(decode(key.as_bytes(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Deletes one push config; whether it existed.
    pub fn delete_push(&self, task_id: &str, id: &str) -> Result<bool, TaskStoreError> {
        let key = format!("{task_id}/{id}");
        let existed = self.push.get(key.as_bytes())?.is_some();
        self.push.delete(key.as_bytes())?;
        self.flush()?;
        Ok(existed)
    }

    /// How many task heads are stored.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// The database's size on disk in bytes.
    pub fn size_on_disk(&self) -> Result<u64, TaskStoreError> {
        Ok(self.store.size_on_disk()?)
    }

    /// Flushes everything to disk (called at terminal and interrupted states).
    ///
    /// Everything this caller wrote before calling is on disk when it returns Ok: it waits for a
    /// flush that began after it asked, made by whichever caller leads (see [`Flushes`]).
    pub fn flush(&self) -> Result<(), TaskStoreError> {
        let f = &self.flushes;
        let lock = || f.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = lock();
        st.asked += 1;
        let mine = st.asked;
        loop {
            if st.covered >= mine {
                return Ok(());
            }
            if !st.running {
                // Lead: one flush for every request made so far.
                st.running = true;
                let upto = st.asked;
                drop(st);
                // A failed flush is the leader's error; the others try again themselves.
                return self.lead_flush(upto);
            }
            st = f.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`SledStore::flush`] for async callers: waiting holds no runtime worker, and the one
    /// flush that leads runs on a blocking thread.
    pub async fn flush_async(&self) -> Result<(), TaskStoreError> {
        let f = &self.flushes;
        let lock = || f.state.lock().unwrap_or_else(|p| p.into_inner());
        let mine = {
            let mut st = lock();
            st.asked += 1;
            st.asked
        };
        loop {
            // Subscribed before looking, so a flush that ends in between is not missed.
            let mut ended = f.ended.subscribe();
            let lead = {
                let mut st = lock();
                if st.covered >= mine {
                    return Ok(());
                }
                if st.running {
                    None
                } else {
                    st.running = true;
                    Some(st.asked)
                }
            };
            let Some(upto) = lead else {
                let _ = ended.changed().await;
                continue;
            };
            // The whole lead runs on the store's flush thread, so a caller that goes away (its
            // request dropped) cannot leave a flush marked running for ever, and no work of
            // callers on the blocking pool can hold it up.
            let store = self.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let job: FlushJob = Box::new(move || {
                let _ = tx.send(store.lead_flush(upto));
            });
            if let Err(job) = f.on_thread(job) {
                // No thread to be had: the blocking pool, as before.
                let _ = tokio::task::spawn_blocking(job).await;
            }
            return match rx.await {
                Ok(r) => r,
                Err(_) => Err(TaskStoreError::Background(
                    "the flush ended without an answer".into(),
                )),
            };
        }
    }

    /// Flushes for every request up to `upto` (the caller has set `running`), then lets the
    /// waiters look again. The state is put back however the flush ends (even a panic).
    fn lead_flush(&self, upto: u64) -> Result<(), TaskStoreError> {
        struct Leading<'a> {
            flushes: &'a Flushes,
            covered: Option<u64>,
        }
        impl Drop for Leading<'_> {
            fn drop(&mut self) {
                let f = self.flushes;
                {
                    let mut st = f.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.running = false;
                    st.made += 1;
                    if let Some(upto) = self.covered {
                        st.covered = st.covered.max(upto);
                    }
                }
                f.done.notify_all();
                f.ended.send_modify(|n| *n += 1);
            }
        }
        let mut leading = Leading {
            flushes: &self.flushes,
            covered: None,
        };
        let result = self.flush_now();
        if result.is_ok() {
            leading.covered = Some(upto);
        }
        drop(leading);
        result
    }

    fn flush_now(&self) -> Result<(), TaskStoreError> {
        #[cfg(test)]
        let _gate = self.flush_gate.read();
        self.store.flush()?;
        Ok(())
    }

    /// Database flushes made so far (each served every caller waiting then).
    pub fn flushes_made(&self) -> u64 {
        self.flushes
            .state
            .lock()
            .map(|s| s.made)
            .unwrap_or_else(|p| p.into_inner().made)
    }

    /// Startup recovery: every task a previous gateway process left submitted, working or waiting
    /// for input can no longer be followed, so it is marked FAILED "gateway restarted" instead of
    /// staying WORKING forever. Returns the records that were changed (the caller asks the
    /// supervisor to cancel their turns).
    pub fn recover(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        let mut changed = Vec::new();
        for mut rec in self.heads()? {
            if rec.task.status.state.is_terminal() {
                continue;
            }
            let now = crate::time::now_micros();
            let msg = orphaned_message(&rec, "gateway restarted");
            // Numbered after every stored message (a segment holds several).
            let seq = self.history(&rec.task.id)?.len() as u64;
            self.put_history(&rec.task.id, seq, &msg)?;
            rec.task.status = TaskStatus {
                state: TaskState::Failed,
                message: Some(msg),
                timestamp: Some(crate::time::format_micros(now)),
            };
            rec.status_micros = now;
            self.put_head(&rec)?;
            changed.push(rec);
        }
        self.flush()?;
        Ok(changed)
    }
}

/// Tasks a prune deletes per sled batch.
const PRUNE_BATCH: usize = 256;

/// The retention rules over `heads` (see [`TaskBackend::prune`]), in memory: sled has no query.
pub fn doomed_by_retention(
    heads: Vec<TaskRecord>,
    cutoff_micros: i64,
    max_tasks: usize,
) -> (Vec<String>, HashMap<String, ContextUsage>) {
    let mut by_principal: HashMap<String, Vec<TaskRecord>> = HashMap::new();
    for h in heads {
        by_principal.entry(h.principal.clone()).or_default().push(h);
    }
    let mut doomed: Vec<String> = Vec::new();
    let mut contexts: HashMap<String, ContextUsage> = HashMap::new();
    for (_, mut tasks) in by_principal {
        // Oldest status first: the order in which terminal tasks are given up.
        tasks.sort_by(|a, b| {
            a.status_micros
                .cmp(&b.status_micros)
                .then_with(|| a.task.id.cmp(&b.task.id))
        });
        let mut remaining = tasks.len();
        for t in tasks {
            let terminal = t.task.status.state.is_terminal();
            let expired = t.status_micros < cutoff_micros;
            if terminal && (expired || remaining > max_tasks) {
                doomed.push(t.task.id);
                remaining -= 1;
                continue;
            }
            let c = contexts.entry(t.task.context_id.clone()).or_default();
            c.count += 1;
            c.busy |= !terminal;
            c.last_status_micros = c.last_status_micros.max(t.status_micros);
        }
    }
    (doomed, contexts)
}

#[tonic::async_trait]
impl TaskBackend for SledStore {
    async fn put_head(&self, record: &TaskRecord) -> Result<(), TaskStoreError> {
        SledStore::put_head(self, record)
    }
    async fn head(&self, task_id: &str) -> Result<Option<TaskRecord>, TaskStoreError> {
        SledStore::head(self, task_id)
    }
    async fn heads_of(&self, principal: &str) -> Result<Vec<TaskRecord>, TaskStoreError> {
        let mut heads = self.heads()?;
        heads.retain(|h| h.principal == principal);
        Ok(heads)
    }
    async fn put_history_segment(
        &self,
        task_id: &str,
        first_seq: u64,
        msgs: &[Message],
    ) -> Result<(), TaskStoreError> {
        SledStore::put_history_segment(self, task_id, first_seq, msgs)
    }
    async fn history(&self, task_id: &str) -> Result<Vec<Message>, TaskStoreError> {
        SledStore::history(self, task_id)
    }
    async fn put_artifact_chunks(
        &self,
        task_id: &str,
        chunks: &[(u32, u64, ArtifactChunk)],
    ) -> Result<(), TaskStoreError> {
        SledStore::put_artifact_chunks(self, task_id, chunks)
    }
    async fn artifacts(&self, task_id: &str) -> Result<Vec<Artifact>, TaskStoreError> {
        SledStore::artifacts(self, task_id)
    }
    async fn context(&self, context_id: &str) -> Result<Option<ContextRecord>, TaskStoreError> {
        SledStore::context(self, context_id)
    }
    async fn put_context(
        &self,
        context_id: &str,
        rec: &ContextRecord,
    ) -> Result<(), TaskStoreError> {
        SledStore::put_context(self, context_id, rec)
    }
    async fn claim_context(
        &self,
        context_id: &str,
        fresh: &ContextRecord,
    ) -> Result<ContextRecord, TaskStoreError> {
        let _g = self
            .contexts_guard
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let rec = match SledStore::context(self, context_id)? {
            Some(other) if other.principal != fresh.principal => return Ok(other),
            Some(mut mine) => {
                mine.last_task_micros = fresh.last_task_micros;
                mine.closed_micros = None;
                mine
            }
            None => fresh.clone(),
        };
        SledStore::put_context(self, context_id, &rec)?;
        Ok(rec)
    }
    async fn contexts(&self) -> Result<Vec<(String, ContextRecord)>, TaskStoreError> {
        SledStore::contexts(self)
    }
    async fn forget_context(
        &self,
        context_id: &str,
        seen: &ContextRecord,
    ) -> Result<bool, TaskStoreError> {
        let _g = self
            .contexts_guard
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if SledStore::context(self, context_id)?.as_ref() != Some(seen) {
            return Ok(false);
        }
        self.delete_context(context_id)?;
        Ok(true)
    }
    async fn delete_tasks(&self, task_ids: &[&str]) -> Result<(), TaskStoreError> {
        SledStore::delete_tasks(self, task_ids)
    }
    async fn put_push(&self, rec: &PushRecord) -> Result<(), TaskStoreError> {
        self.push.put(
            format!("{}/{}", rec.config.task_id, rec.config.id),
            encode(rec)?,
        )?;
        self.flush_async().await
    }
    async fn push_configs(&self, task_id: &str) -> Result<Vec<PushRecord>, TaskStoreError> {
        SledStore::push_configs(self, task_id)
    }
    async fn push_config(
        &self,
        task_id: &str,
        id: &str,
    ) -> Result<Option<PushRecord>, TaskStoreError> {
        SledStore::push_config(self, task_id, id)
    }
    async fn delete_push(&self, task_id: &str, id: &str) -> Result<bool, TaskStoreError> {
        let key = format!("{task_id}/{id}");
        let existed = self.push.get(key.as_bytes())?.is_some();
        self.push.delete(key.as_bytes())?;
        self.flush_async().await?;
        Ok(existed)
    }
    async fn task_count(&self) -> Result<usize, TaskStoreError> {
        Ok(SledStore::task_count(self))
    }
    async fn flush(&self) -> Result<(), TaskStoreError> {
        self.flush_async().await
    }
    async fn prune(&self, cutoff_micros: i64, max_tasks: usize) -> Result<Pruned, TaskStoreError> {
        // Pure store work: off the async threads.
        let store = self.clone();
        let (doomed, contexts) = tokio::task::spawn_blocking(move || {
            let heads = store.heads()?;
            let (doomed, contexts) = doomed_by_retention(heads, cutoff_micros, max_tasks);
            // A few batches for the whole sweep, not three per task (see `delete_tasks`).
            for ids in doomed.chunks(PRUNE_BATCH) {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                store.delete_tasks(&ids)?;
            }
            Ok::<_, TaskStoreError>((doomed, contexts))
        })
        .await
        .map_err(|e| TaskStoreError::Background(e.to_string()))??;
        if !doomed.is_empty() {
            self.flush_async().await?;
        }
        Ok(Pruned {
            deleted: doomed.len(),
            contexts,
        })
    }
    async fn end_if_running(&self, rec: &TaskRecord) -> Result<bool, TaskStoreError> {
        let _g = self
            .contexts_guard
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match SledStore::head(self, &rec.task.id)? {
            Some(h) if !h.task.status.state.is_terminal() => {
                SledStore::put_head(self, rec)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn recover(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || SledStore::recover(&store))
            .await
            .map_err(|e| TaskStoreError::Background(e.to_string()))?
    }
    fn describe(&self) -> String {
        format!("sled at {}", self.store.path().display())
    }
    fn size_on_disk(&self) -> Option<u64> {
        self.store.size_on_disk().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::{Part, Role};

    fn record(id: &str, state: TaskState) -> TaskRecord {
        TaskRecord {
            task: Task {
                id: id.into(),
                context_id: "ctx".into(),
                status: TaskStatus {
                    state,
                    message: None,
                    timestamp: None,
                },
                artifacts: vec![],
                history: vec![],
                metadata: None,
            },
            principal: "alice".into(),
            agent: "scripted".into(),
            created_micros: 1,
            status_micros: 1,
        }
    }

    fn chunk(id: &str, text: &str, append: bool) -> ArtifactChunk {
        ArtifactChunk {
            artifact: Artifact {
                artifact_id: id.into(),
                name: Some("answer".into()),
                description: None,
                parts: vec![Part::text(text)],
                metadata: None,
                extensions: vec![],
            },
            append,
        }
    }

    #[test]
    fn tasks_history_and_appended_artifacts_survive_reopen()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let s = SledStore::open(dir.path())?;
            s.put_head(&record("t1", TaskState::Completed))?;
            let user = Message {
                message_id: "m1".into(),
                context_id: Some("ctx".into()),
                task_id: Some("t1".into()),
                role: Role::User,
                parts: vec![Part::text("hi")],
                metadata: None,
                extensions: vec![],
                reference_task_ids: vec![],
            };
            s.put_history("t1", 0, &user)?;
            s.put_artifact_chunk("t1", 0, 0, &chunk("a", "Hel", false))?;
            s.put_artifact_chunk("t1", 0, 1, &chunk("a", "lo", true))?;
            s.put_artifact_chunk("t1", 1, 0, &chunk("b", "note", false))?;
            s.flush()?;
        }
        let s = SledStore::open(dir.path())?;
        let (task, rec) = s.load("t1")?.ok_or("missing")?;
        assert_eq!(rec.principal, "alice");
        assert_eq!(task.history.len(), 1);
        assert_eq!(task.artifacts.len(), 2);
        assert_eq!(task.artifacts[0].parts, vec![Part::text("Hello")]);
        assert_eq!(task.artifacts[1].parts, vec![Part::text("note")]);
        assert!(s.load("t2")?.is_none());
        Ok(())
    }

    #[test]
    fn history_segments_and_single_messages_read_back_in_order_and_recovery_numbers_after_them()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let msg = |id: &str| Message::agent_text("t1", "ctx", id, None);
        {
            let s = SledStore::open(dir.path())?;
            s.put_head(&record("t1", TaskState::Working))?;
            s.put_history("t1", 0, &msg("m0"))?;
            s.put_history_segment("t1", 1, &[msg("m1"), msg("m2"), msg("m3")])?;
            s.put_history_segment("t1", 4, &[msg("m4")])?;
            s.put_history_segment("t1", 5, &[])?;
            s.put_history_segment("t1", 5, &[msg("m5"), msg("m6")])?;
            // Longer than a segment: split, numbered on.
            let long: Vec<Message> = (7..400).map(|i| msg(&format!("m{i}"))).collect();
            s.put_history_segment("t1", 7, &long)?;
            s.flush()?;
        }
        let s = SledStore::open(dir.path())?;
        let text = |m: &Message| serde_json::to_string(&m.parts).unwrap_or_default();
        let got: Vec<String> = s.history("t1")?.iter().map(text).collect();
        let want: Vec<String> = (0..400).map(|i| text(&msg(&format!("m{i}")))).collect();
        assert_eq!(got, want);
        assert!(
            s.history.scan_prefix("t1/")?.len() > 6,
            "the long batch is split"
        );
        // The restart's note is message number 400, after the last segment's messages.
        assert_eq!(s.recover()?.len(), 1);
        let history = s.history("t1")?;
        assert_eq!(history.len(), 401);
        assert!(text(&history[400]).contains("gateway restarted"));
        Ok(())
    }

    #[test]
    fn recovery_fails_every_running_task_and_leaves_finished_ones()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        s.put_head(&record("done", TaskState::Completed))?;
        s.put_head(&record("run", TaskState::Working))?;
        s.put_head(&record("queued", TaskState::Submitted))?;
        s.put_head(&record("ask", TaskState::InputRequired))?;
        let changed = s.recover()?;
        let mut ids: Vec<_> = changed.iter().map(|r| r.task.id.clone()).collect();
        ids.sort();
        assert_eq!(ids, vec!["ask", "queued", "run"]);
        for id in ["run", "queued", "ask"] {
            let (task, _) = s.load(id)?.ok_or("missing")?;
            assert_eq!(task.status.state, TaskState::Failed);
            let text = serde_json::to_string(&task.status.message)?;
            assert!(text.contains("gateway restarted"), "{text}");
            assert_eq!(task.history.len(), 1);
        }
        assert_eq!(
            s.load("done")?.ok_or("missing")?.0.status.state,
            TaskState::Completed
        );
        assert!(s.recover()?.is_empty(), "recovery is idempotent");
        Ok(())
    }

    #[test]
    fn tasks_deleted_together_leave_nothing_behind_and_spare_their_neighbours()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        let ids: Vec<String> = (0..120).map(|i| format!("t{i}")).collect();
        for id in &ids {
            s.put_head(&record(id, TaskState::Completed))?;
            s.put_history(id, 0, &Message::agent_text(id, "ctx", "hi", None))?;
            s.put_artifact_chunk(id, 0, 0, &chunk("a", "x", false))?;
        }
        // Every even task goes at once; "t1" goes, "t10".."t19" stay (prefixes).
        let doomed: Vec<&str> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 0 || *i == 1)
            .map(|(_, id)| id.as_str())
            .collect();
        s.delete_tasks(&doomed)?;
        for id in &doomed {
            assert!(s.load(id)?.is_none(), "{id}");
            assert!(s.history(id)?.is_empty(), "{id}");
            assert!(s.artifacts(id)?.is_empty(), "{id}");
        }
        for id in ["t11", "t13", "t19", "t119"] {
            let (t, _) = s.load(id)?.ok_or("a neighbour went too")?;
            assert_eq!((t.history.len(), t.artifacts.len()), (1, 1), "{id}");
        }
        assert_eq!(s.task_count(), 120 - doomed.len());
        s.delete_tasks(&[])?;
        Ok(())
    }

    #[test]
    fn a_deleted_task_leaves_nothing_behind_and_spares_its_neighbours()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        // "t1" is a prefix of "t10": deleting t1 must not touch t10's history.
        for id in ["t1", "t10"] {
            s.put_head(&record(id, TaskState::Completed))?;
            s.put_history(id, 0, &Message::agent_text(id, "ctx", "hi", None))?;
            s.put_artifact_chunk(id, 0, 0, &chunk("a", "x", false))?;
        }
        s.delete_task("t1")?;
        assert!(s.load("t1")?.is_none());
        assert!(s.history("t1")?.is_empty());
        assert!(s.artifacts("t1")?.is_empty());
        let (t10, _) = s.load("t10")?.ok_or("t10 missing")?;
        assert_eq!((t10.history.len(), t10.artifacts.len()), (1, 1));
        assert_eq!(s.task_count(), 1);
        Ok(())
    }

    #[test]
    fn a_corrupt_record_is_an_error_not_a_panic() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        s.tasks.put("bad", "{not json")?;
        assert!(matches!(s.head("bad"), Err(TaskStoreError::Corrupt { .. })));
        Ok(())
    }

    /// Sixteen tasks needing the disk at once get two database flushes, not sixteen: the first
    /// caller's, and one for everyone who asked while it ran. (Each flush is a log buffer written
    /// by sled's IO pool; sixteen at once were what left a truncation queued behind writes that
    /// wait for a lock its waiter holds — see `Flushes`.)
    #[test]
    fn tasks_flushing_at_once_share_flushes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        let closed = s.flush_gate.write().map_err(|_| "gate")?;
        let mut threads = Vec::new();
        for i in 0..16 {
            let s = s.clone();
            threads.push(std::thread::spawn(move || {
                s.put_head(&record(&format!("t{i}"), TaskState::Completed))?;
                s.flush()
            }));
        }
        // Every caller has asked (the first leads and waits at the gate) before the disk answers.
        let t0 = std::time::Instant::now();
        while s.flushes.state.lock().map(|st| st.asked).unwrap_or(0) < 16 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "the callers did not ask"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(closed);
        for t in threads {
            t.join().map_err(|_| "a caller panicked")??;
        }
        assert_eq!(
            s.flushes_made(),
            2,
            "one flush, then one for the fifteen that waited"
        );
        // And what they wrote is there.
        assert_eq!(s.heads()?.len(), 16);
        // A caller alone still gets its own flush.
        s.flush()?;
        assert_eq!(s.flushes_made(), 3);
        Ok(())
    }

    /// A caller that goes away while its flush leads (its request dropped) leaves no flush
    /// marked running: later callers still get theirs.
    #[test]
    fn a_leader_that_goes_away_does_not_hold_up_later_flushes()
    -> Result<(), Box<dyn std::error::Error>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        let closed = s.flush_gate.write().map_err(|_| "gate")?;
        let leader = {
            let s = s.clone();
            rt.spawn(async move { s.flush_async().await })
        };
        let t0 = std::time::Instant::now();
        while !s.flushes.state.lock().map(|st| st.running).unwrap_or(false) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "no leader"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        leader.abort();
        drop(closed);
        let later = {
            let s = s.clone();
            rt.spawn(async move { s.flush_async().await })
        };
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), later).await
        })
        .map_err(|_| "a later flush waited for the caller that went away")???;
        assert_eq!(s.flushes_made(), 2);
        Ok(())
    }

    /// Issue 36: callers' blocking work can fill tokio's blocking pool (there, a webhook's
    /// getaddrinfo per request); a flush must not wait for a thread of it.
    #[test]
    fn a_flush_does_not_wait_behind_a_full_blocking_pool() -> Result<(), Box<dyn std::error::Error>>
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(2)
            .enable_all()
            .build()?;
        let dir = tempfile::tempdir()?;
        let s = SledStore::open(dir.path())?;
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Arc::new(std::sync::Mutex::new(held));
        for _ in 0..4 {
            let held = held.clone();
            rt.spawn_blocking(move || {
                let _ = held
                    .lock()
                    .map(|h| h.recv_timeout(std::time::Duration::from_secs(30)));
            });
        }
        s.put_push(&PushRecord {
            principal: "alice".into(),
            config: crate::a2a::TaskPushNotificationConfig {
                task_id: "t".into(),
                id: "c".into(),
                url: "https://example.com/".into(),
                ..Default::default()
            },
            created_micros: 0,
        })?;
        let flushed = {
            let s = s.clone();
            rt.spawn(async move { s.flush_async().await })
        };
        let r = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), flushed).await
        });
        drop(release);
        r.map_err(|_| "the flush waited for the full blocking pool")???;
        Ok(())
    }

    /// The gateway's store traffic of issue 30's waves, without the daemons: waves of tasks
    /// at once, each doing what a task's start and end do (context, head, history, flush;
    /// artifact batches; the terminal head and flush), a sweep pruning to 200 tasks between
    /// waves, on an 8 MiB page cache. Fails when a wave does not finish within 20 s, printing
    /// every thread's stack (gdb). `WARDEN_STORE_STRESS_UNGROUPED=1` makes each task flush the
    /// database itself, as before the group commit. By hand: `WARDEN_STORE_STRESS_SECS=120
    /// cargo test -p warden-gateway --lib store_traffic -- --ignored --nocapture`.
    #[test]
    #[ignore = "a long stress run, by hand"]
    fn store_traffic_of_the_waves_keeps_moving() -> Result<(), Box<dyn std::error::Error>> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::time::{Duration, Instant};
        let num = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let secs = num("WARDEN_STORE_STRESS_SECS", 60);
        let per_wave = num("WARDEN_STORE_STRESS_TASKS", 100) as usize;
        let ungrouped = num("WARDEN_STORE_STRESS_UNGROUPED", 0) == 1;
        let dir = tempfile::tempdir()?;
        let store = SledStore::open_with(
            dir.path(),
            warden_store::StoreOptions {
                cache_capacity_bytes: 8 * 1024 * 1024,
            },
        )?;
        let flush = move |s: &SledStore| if ungrouped { s.flush_now() } else { s.flush() };
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut wave = 0u64;
        while start.elapsed() < Duration::from_secs(secs) {
            let before = done.load(Ordering::Relaxed);
            let mut threads = Vec::new();
            for i in 0..per_wave {
                let (store, done) = (store.clone(), done.clone());
                threads.push(std::thread::spawn(move || -> Result<(), TaskStoreError> {
                    let id = format!("w{wave}-t{i}");
                    let ctx = format!("ctx-{i}");
                    store.put_context(
                        &ctx,
                        &ContextRecord {
                            principal: "alice".into(),
                            agent: "scripted".into(),
                            created_micros: 1,
                            last_task_micros: wave as i64,
                            closed_micros: None,
                        },
                    )?;
                    let mut rec = record(&id, TaskState::Submitted);
                    rec.task.context_id = ctx.clone();
                    rec.status_micros = (wave * 1000 + i as u64) as i64;
                    store.put_head(&rec)?;
                    let user = Message {
                        message_id: format!("m-{id}"),
                        context_id: Some(ctx.clone()),
                        task_id: Some(id.clone()),
                        role: Role::User,
                        parts: vec![Part::text("hello from a wave")],
                        metadata: None,
                        extensions: vec![],
                        reference_task_ids: vec![],
                    };
                    store.put_history(&id, 0, &user)?;
                    flush(&store)?;
                    for c in 0..3u64 {
                        store.put_artifact_chunks(
                            &id,
                            &[(0, c, chunk("a", "some streamed text ", c > 0))],
                        )?;
                    }
                    store.put_history_segment(&id, 1, &[user.clone(), user])?;
                    rec.task.status.state = TaskState::Completed;
                    store.put_head(&rec)?;
                    flush(&store)?;
                    done.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }));
            }
            let t0 = Instant::now();
            while done.load(Ordering::Relaxed) < before + per_wave as u64 {
                if t0.elapsed() > Duration::from_secs(20) {
                    let gdb = std::process::Command::new("gdb")
                        .args(["-p", &std::process::id().to_string(), "-batch", "-nx"])
                        .args(["-ex", "thread apply all bt 30"])
                        .output();
                    if let Ok(o) = gdb {
                        println!("{}", String::from_utf8_lossy(&o.stdout));
                    }
                    panic!(
                        "wave {wave}: {} of {per_wave} tasks finished in 20 s: the store is stuck",
                        done.load(Ordering::Relaxed) - before
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            for t in threads {
                t.join().map_err(|_| "a store thread panicked")??;
            }
            // The sweep: the oldest terminal tasks beyond 200 go.
            let mut heads = store.heads()?;
            heads.sort_by_key(|h| h.status_micros);
            let over = heads.len().saturating_sub(200);
            for h in heads.iter().take(over) {
                store.delete_task(&h.task.id)?;
            }
            flush(&store)?;
            wave += 1;
        }
        println!(
            "{wave} waves, {} tasks through the store in {:?} ({}), {} database flushes",
            done.load(Ordering::Relaxed),
            start.elapsed(),
            if ungrouped {
                "each task flushing itself"
            } else {
                "group commit"
            },
            store.flushes_made()
        );
        Ok(())
    }
}
