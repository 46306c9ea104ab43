//! A task followed by this process, in memory: every update is applied under the task's lock in
//! one place ([`LiveTask::apply`]): it changes the in-memory task, queues the change's write,
//! and broadcasts it, so every subscriber sees the same events in the same order after a
//! consistent snapshot; a terminal or interrupted status is on disk before anyone is told.
//! How a change is buffered and written is `writer.rs`'s.
//!
//! Owns: the order of a task's announcements, and its subscribers. Must never: await
//! under the task's lock, or announce an end that is not durable.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::writer::waits_for_disk;
use super::writer::{LiveInner, Writes};
use crate::a2a::{StreamResponse, Task, TaskState};
use crate::mapping::TurnMapper;
use crate::push::Push;
use crate::store::{TaskRecord, TaskStore};

/// How many events a subscriber may fall behind before its stream is closed with an error.
pub const SUBSCRIBER_BUFFER: usize = 4096;

/// How long an answer waits for the question it answers to be announced (it is written, and
/// waits for the disk before it is told: [`LiveTask::take_question`]).
const ANNOUNCE_WAIT: Duration = Duration::from_secs(10);

/// A stream's keep-alive interval until its core sets the configured one.
pub(super) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

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

/// A task whose turn is still followed by this process.
pub struct LiveTask {
    pub(super) inner: Mutex<LiveInner>,
    tx: broadcast::Sender<SharedEvent>,
    state: watch::Sender<TaskState>,
    pub(super) writes: Writes,
    /// Where status changes are also delivered to the task's webhooks.
    push: Option<Arc<Push>>,
}

pub(super) fn lock(m: &Mutex<LiveInner>) -> MutexGuard<'_, LiveInner> {
    // A panic while holding the lock would be a bug in this module; the data stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LiveTask {
    /// A task just submitted (its user message is history entry 0), followed from now on.
    pub(super) fn new(
        task: Task,
        record: TaskRecord,
        mapper: TurnMapper,
        store: TaskStore,
        push: Option<Arc<Push>>,
    ) -> Self {
        let (tx, _) = broadcast::channel(SUBSCRIBER_BUFFER);
        let (state, _) = watch::channel(TaskState::Submitted);
        let writes = Writes::spawn(store, task.id.clone());
        Self {
            inner: Mutex::new(LiveInner::new(task, record, mapper)),
            tx,
            state,
            writes,
            push,
        }
    }

    /// Waits until every write made so far is durable. Holds no lock: call it between
    /// [`LiveTask::persist_unflushed`] and [`LiveTask::announce_all`].
    pub(super) async fn sync(&self) -> Result<(), String> {
        self.writes.sync().await
    }

    /// Applies events that may end or interrupt the task: written and durable before anyone
    /// is told (see [`waits_for_disk`]).
    pub(super) async fn settle(&self, events: Vec<StreamResponse>) {
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
    pub(super) fn apply(&self, inner: &mut LiveInner, events: Vec<StreamResponse>) {
        for ev in events {
            self.writes.persist(inner, &ev);
            self.announce(inner, ev);
        }
        self.writes.write_if_due(inner);
    }

    /// [`LiveTask::apply`] in two halves for events that end or interrupt the task, so that the
    /// flush between them is awaited without holding a runtime worker: this half writes them
    /// (not flushed); the caller flushes, then calls [`LiveTask::announce_all`].
    pub(super) fn persist_unflushed(&self, inner: &mut LiveInner, events: &[StreamResponse]) {
        for ev in events {
            self.writes.persist(inner, ev);
        }
    }

    /// The second half: subscribers, webhooks and waiters are told, in order.
    pub(super) fn announce_all(&self, inner: &mut LiveInner, events: Vec<StreamResponse>) {
        for ev in events {
            self.announce(inner, ev);
        }
        self.writes.write_if_due(inner);
    }

    pub(super) fn announce(&self, inner: &LiveInner, ev: StreamResponse) {
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

    /// A stream of this task: the snapshot, then what follows. A stream opened on a task that is
    /// already INPUT_REQUIRED stays open (it closes at the next terminal or interrupted status):
    /// SubscribeToTask exists to watch a non-terminal task, and one waiting for input is exactly
    /// the task a second client wants to see resume (spec 1.0.1 §3.1.6).
    pub(super) fn subscribe(&self) -> Subscription {
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
    pub(super) async fn take_question(&self) -> Result<String, TaskState> {
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

    pub(super) async fn settled(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| s.is_terminal() || s.is_interrupted()).await;
    }

    pub(super) async fn terminal(&self, within: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(within, rx.wait_for(|s| s.is_terminal()))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::TaskStatus;
    use warden_proto::v1::{TextChunk, TurnEvent, TurnStarted, TurnStop, turn_event::Event};

    use crate::store_sled::SledStore;

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
}
