//! The audit log: one prost-encoded `AuditRecord` per decision in the `audit` tree.
//!
//! Keys: `r/<seq u64 BE>` → record, `d/<decision id>` → seq. `r` sorts after `d`, so the newest
//! records are the tree's last keys.
//!
//! A decision has one record, except one whose answer was DENY `audit.unavailable` after its
//! record was written (the journal's sync came after the caller's deadline): the service then
//! appends its correction, a record of the same decision id saying what was answered. The
//! index points at the newest record of a decision id, and readers skip any other (`newest`),
//! so the decision reads as what was enforced; journal replay and the start-up repair keep the
//! index on the newest.
//!
//! The two keys are two plain inserts, record first, both under the append lock, not one sled
//! batch: sled 0.34 seals and writes its current log buffer twice for every batch (to pin the
//! batch's recovery point), a disk write plus a wake-up of its whole I/O thread pool per
//! decision even with `audit.sync = false`, measured as about two thirds of the daemon's CPU per
//! decision. Without the batch the pair is not atomic, but the order makes the only possible
//! tear harmless and repairable: sled recovers a prefix of its log, appends are serialised, so
//! after a crash at most the newest records can lack their `d/` entry (never an index entry
//! without its record), and [`AuditLog::open`] restores those before the log is used. Such a
//! record was never answered: the answer waits for both inserts (and, with `audit.sync`, for
//! the flush covering them).
//!
//! Durability ([`AuditLog::append_durable`], `audit.sync = true`) is the journal of
//! [`crate::journal`] plus a group commit: every durable record is also appended to the journal
//! under the append lock; one waiter at a time `fdatasync`s the journal, covering every entry
//! written so far, so concurrent decisions share one sync instead of queueing for one each.
//! [`AuditLog::append`] (`audit.sync = false`) writes sled only; sled writes it out within its
//! 0.5 s flush interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message;
use warden_proto::v1 as pb;
use warden_store::{Store, StoreError, Tree};

use crate::journal::{JournalError, JournalFile};
use crate::retention::{Pruned, Retention};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit store: {0}")]
    Store(#[from] StoreError),
    #[error("audit flush task failed: {0}")]
    FlushTask(String),
    #[error("audit journal sync or checkpoint failed: {0}")]
    Sync(#[source] std::io::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("audit database: {0}")]
    Pg(#[from] warden_pgstate::PgError),
    #[error("audit database: {0}")]
    Unavailable(String),
    #[error("audit record {key} is corrupt: {source}")]
    Decode {
        key: String,
        #[source]
        source: prost::DecodeError,
    },
}

pub struct AuditLog {
    store: Store,
    tree: Tree,
    /// Next sequence number and the journal; the lock also orders appends.
    inner: Mutex<Inner>,
    /// Every durable record with a smaller sequence number is on disk.
    durable: AtomicU64,
    /// Held by the one caller currently syncing the journal.
    flushing: tokio::sync::Mutex<()>,
    /// The oldest sequence number the log may still hold (retention removes below it).
    first: AtomicU64,
    /// [`CHECKPOINT_BYTES`]; smaller in tests.
    checkpoint_bytes: u64,
}

struct Inner {
    next: u64,
    /// The two journal files; `active` takes new entries.
    journal: [JournalFile; 2],
    active: usize,
    /// The other file is empty (its last checkpoint succeeded), so it may become active.
    other_clear: bool,
}

/// A journal file this long (about 10,000 records) is checkpointed: sled is flushed and the
/// file emptied, so the journal stays small and replay at start-up quick.
const CHECKPOINT_BYTES: u64 = 4 << 20;

/// Each journal file is preallocated to this: a checkpoint's worth plus room for the entries
/// written while the sync that triggers the checkpoint runs.
fn journal_size(checkpoint_bytes: u64) -> u64 {
    checkpoint_bytes + checkpoint_bytes / 4
}

/// The journal files live in the store's directory (the daemon's private state).
fn journal_paths(store: &Store) -> [std::path::PathBuf; 2] {
    [0, 1].map(|i| store.path().join(format!("audit-journal-{i}")))
}

const REC: &[u8] = b"r/";
const IDX: &[u8] = b"d/";
/// Retention's watermark: every record below this sequence number was removed (so the journal's
/// copy of one is not restored at open). Sorts between `d/` and `r/`.
const FIRST: &[u8] = b"m/first";

/// How many of the newest records [`AuditLog::open`] checks for a missing index entry. Appends
/// are serialised, so a crash can tear only the newest one; the margin costs a few reads at
/// start-up.
const REPAIR_WINDOW: usize = 64;

fn rec_key(seq: u64) -> Vec<u8> {
    let mut k = REC.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn idx_key(decision_id: &str) -> Vec<u8> {
    let mut k = IDX.to_vec();
    k.extend_from_slice(decision_id.as_bytes());
    k
}

/// Runs blocking file work (a checkpoint) off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, AuditError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(AuditError::Sync),
        Err(e) => Err(AuditError::FlushTask(e.to_string())),
    }
}

/// The sequence number an index entry holds.
fn seq_value(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(v).ok()?))
}

fn seq_of(rec_key: &[u8]) -> Option<u64> {
    let b = rec_key.strip_prefix(REC)?;
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(b).ok()?))
}

impl AuditLog {
    pub fn open(store: Store) -> Result<Self, AuditError> {
        let tree = store.tree("audit")?;
        // Records whose answer waited for the journal, but which sled had not yet written out
        // when the daemon stopped.
        let [p0, p1] = journal_paths(&store);
        let mut journal = [JournalFile::open(&p0)?, JournalFile::open(&p1)?];
        let mut replayed = 0usize;
        let pruned_below = tree
            .get(FIRST)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        for j in &journal {
            for (seq, bytes) in j.entries()? {
                // Removed by retention since it was journaled: stays removed.
                if seq < pruned_below {
                    continue;
                }
                let Ok(r) = pb::AuditRecord::decode(bytes.as_slice()) else {
                    continue;
                };
                let key = rec_key(seq);
                if tree.get(&key)?.as_deref() != Some(bytes.as_slice()) {
                    tree.put(&key, &bytes)?;
                    replayed += 1;
                }
                // The newest record of a decision id is the one the index names (a correction
                // may be in the other file, replayed before or after this one).
                let idx = idx_key(&r.decision_id);
                if tree.get(&idx)?.as_deref().and_then(seq_value) < Some(seq) {
                    tree.put(&idx, seq.to_be_bytes())?;
                }
            }
        }
        // Only once sled holds them on disk may the journal forget them.
        store.flush()?;
        for j in &mut journal {
            j.reset(journal_size(CHECKPOINT_BYTES), true)?;
        }
        if replayed > 0 {
            tracing::warn!(
                replayed,
                "audit log: restored records from the journal that the store had not written out"
            );
        }
        let newest = tree.scan_rev(REPAIR_WINDOW)?;
        let next = newest
            .first()
            .and_then(|(k, _)| seq_of(k))
            .map(|s| s + 1)
            .unwrap_or(0)
            // Numbering never goes back below what retention removed (its journal entries are
            // skipped by that number).
            .max(pruned_below);
        let mut repaired = 0usize;
        for (k, v) in newest.iter().take_while(|(k, _)| k.starts_with(REC)) {
            let (Some(seq), Ok(r)) = (seq_of(k), pb::AuditRecord::decode(v.as_slice())) else {
                // Not ours to fix; `newest` and `by_decision_id` report a corrupt record.
                continue;
            };
            let idx = idx_key(&r.decision_id);
            // Missing, or naming an older record of the same decision id: a newer record (a
            // correction) always wins.
            if tree.get(&idx)?.as_deref().and_then(seq_value) < Some(seq) {
                tree.put(&idx, seq.to_be_bytes())?;
                repaired += 1;
            }
        }
        if repaired > 0 {
            store.flush()?;
            tracing::warn!(
                repaired,
                "audit log: restored the index entries of records written just before a crash"
            );
        }
        let first = tree
            .scan_prefix_first(REC, 1)?
            .first()
            .and_then(|(k, _)| seq_of(k))
            .unwrap_or(next)
            .max(pruned_below.min(next));
        Ok(Self {
            first: AtomicU64::new(first),
            store,
            tree,
            inner: Mutex::new(Inner {
                next,
                journal,
                active: 0,
                other_clear: true,
            }),
            durable: AtomicU64::new(next),
            flushing: tokio::sync::Mutex::new(()),
            checkpoint_bytes: CHECKPOINT_BYTES,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The guarded state is updated in one step after each write; a panic elsewhere while
        // holding it cannot leave it half-changed.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `record` (visible to readers at once) and returns its sequence number. Nothing
    /// waits for the disk: sled writes it out within its flush interval (`audit.sync = false`).
    pub fn append(&self, record: &pb::AuditRecord) -> Result<u64, AuditError> {
        self.append_inner(record, false)
    }

    /// Appends `record` and returns its sequence number once it is on disk: journaled and
    /// covered by an `fdatasync` of the journal (group commit, see the module docs).
    pub async fn append_durable(&self, record: &pb::AuditRecord) -> Result<u64, AuditError> {
        let seq = self.append_inner(record, true)?;
        self.wait_durable(seq).await?;
        Ok(seq)
    }

    fn append_inner(&self, record: &pb::AuditRecord, journal: bool) -> Result<u64, AuditError> {
        // What the log keeps is the bounded record (`audit_bounds`), in sled and the journal.
        let record = crate::audit_bounds::bounded(record);
        let bytes = record.encode_to_vec();
        let idx = idx_key(&record.decision_id);
        let mut g = self.lock();
        let seq = g.next;
        // Record first, then its index entry (see the module docs for why this order, and not a
        // batch). A failure in between leaves a record `open` will index, and numbering moves
        // on so the record is never overwritten.
        self.tree.put(rec_key(seq), &bytes)?;
        g.next = seq + 1;
        self.tree.put(idx, seq.to_be_bytes())?;
        if journal {
            let active = g.active;
            g.journal[active].write(seq, &bytes)?;
        }
        Ok(seq)
    }

    /// Returns once journaled record `seq` is on disk.
    async fn wait_durable(&self, seq: u64) -> Result<(), AuditError> {
        loop {
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            let _turn = self.flushing.lock().await;
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            // Every entry written before this point is covered by the sync below.
            let (upto, file, checkpoint) = {
                let g = self.lock();
                let j = &g.journal[g.active];
                (g.next, Arc::clone(&j.file), j.len >= self.checkpoint_bytes)
            };
            // On this worker thread, not in `spawn_blocking`: the hand-off to a blocking thread
            // and back costs two cross-thread wake-ups, measured at about 45 µs of CPU and 30-100
            // µs of latency per decision, more than half of what the `fdatasync` itself costs.
            // The sync is short (the file is preallocated, so there is no metadata to commit);
            // only the group-commit leader blocks, its waiters are parked, and the other
            // workers keep serving. The rare checkpoint (a sled flush) still goes to the
            // blocking pool.
            file.sync_data().map_err(AuditError::Sync)?;
            self.durable.fetch_max(upto, Ordering::AcqRel);
            if checkpoint {
                self.checkpoint().await?;
            }
        }
    }

    /// Switches the journal to its other (empty) file, then flushes sled, which puts every
    /// record of the old file on disk in the store, and empties the old file. Runs while
    /// holding `flushing`, so no other sync or checkpoint runs at the same time. If emptying
    /// failed last time, this retries it instead of switching.
    async fn checkpoint(&self) -> Result<(), AuditError> {
        let (old, upto, file, mut spare) = {
            let mut g = self.lock();
            let (old, upto) = if g.other_clear {
                let old = g.active;
                g.active = 1 - old;
                g.other_clear = false;
                (old, Some(g.next))
            } else {
                (1 - g.active, None)
            };
            let j = &g.journal[old];
            // Reset outside the lock: only this task (holding `flushing`) touches the inactive
            // file, appends go to the other one meanwhile.
            (old, upto, Arc::clone(&j.file), j.share())
        };
        let store = self.store.clone();
        let size = journal_size(self.checkpoint_bytes);
        blocking(move || {
            // Entries written between the last sync and the switch are in the old file too.
            file.sync_data()?;
            store.flush().map_err(std::io::Error::other)?;
            spare.reset(size, false).map_err(std::io::Error::other)?;
            Ok(spare)
        })
        .await
        .map(|s| {
            let mut g = self.lock();
            g.journal[old] = s;
            g.other_clear = true;
        })?;
        if let Some(upto) = upto {
            self.durable.fetch_max(upto, Ordering::AcqRel);
        }
        Ok(())
    }

    /// How many records the log holds (retention removes the oldest).
    pub fn len(&self) -> u64 {
        let next = self.lock().next;
        next.saturating_sub(self.first.load(Ordering::Acquire))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn decode(key: &[u8], v: &[u8]) -> Result<pb::AuditRecord, AuditError> {
        pb::AuditRecord::decode(v).map_err(|source| AuditError::Decode {
            key: String::from_utf8_lossy(key).into_owned(),
            source,
        })
    }

    /// The record of one decision.
    pub fn by_decision_id(&self, id: &str) -> Result<Option<pb::AuditRecord>, AuditError> {
        let Some(seq) = self.tree.get(idx_key(id))? else {
            return Ok(None);
        };
        let Ok(seq) = <[u8; 8]>::try_from(seq.as_slice()) else {
            return Ok(None);
        };
        let key = rec_key(u64::from_be_bytes(seq));
        match self.tree.get(&key)? {
            Some(v) => Ok(Some(Self::decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` records passing `keep`, newest first.
    pub fn newest(
        &self,
        limit: usize,
        keep: impl Fn(&pb::AuditRecord) -> bool,
    ) -> Result<Vec<pb::AuditRecord>, AuditError> {
        Ok(self
            .newest_cursored(limit, keep)?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    /// The cursor of the newest record (0: none yet). A record's cursor is its sequence
    /// number plus one, so that 0 is before every record.
    pub fn head(&self) -> Result<u64, AuditError> {
        Ok(self
            .tree
            .scan_rev(1)?
            .first()
            .and_then(|(k, _)| seq_of(k))
            .map_or(0, |s| s + 1))
    }

    /// Up to `limit` records after `cursor`, oldest first, each with its cursor. Appends are
    /// serialised and each is visible once its insert returns, so a reader never sees a record
    /// before an older one.
    pub fn after(
        &self,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        self.tree
            .scan_prefix_from(REC, rec_key(cursor), limit)?
            .iter()
            .filter_map(|(k, v)| Some((seq_of(k)? + 1, (k, v))))
            .map(|(c, (k, v))| Ok((c, Self::decode(k, v)?)))
            .collect()
    }

    /// [`AuditLog::newest`] with each record's cursor.
    pub fn newest_cursored(
        &self,
        limit: usize,
        keep: impl Fn(&pb::AuditRecord) -> bool,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        let mut out = Vec::new();
        // Fetch in growing windows so an unfiltered tail reads only what it returns.
        let mut window = limit.max(16);
        loop {
            let entries = self.tree.scan_rev(window)?;
            out.clear();
            let mut reached_index = false;
            for (k, v) in &entries {
                if !k.starts_with(REC) {
                    reached_index = true;
                    break;
                }
                let r = Self::decode(k, v)?;
                // A record replaced by a later one of the same decision (its correction) is
                // not what was enforced.
                let current = self.tree.get(idx_key(&r.decision_id))?;
                if current.as_deref().and_then(seq_value) > seq_of(k) {
                    continue;
                }
                if keep(&r) {
                    out.push((seq_of(k).map_or(0, |s| s + 1), r));
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            if reached_index || entries.len() < window {
                return Ok(out);
            }
            window = window.saturating_mul(4);
        }
    }
}

/// Retention (`crate::retention`): the oldest records removed, kept apart from the append path.
impl AuditLog {
    /// One retention pass: from the oldest record on, removes each that is beyond the count
    /// bound or older than the age bound, stopping at the first that is neither (records are
    /// numbered in the order they were decided) or after `retention.pass` records. A record and
    /// its index entry go in one batch. Appends go on meanwhile at the other end of the log.
    pub fn prune(&self, retention: &Retention) -> Result<Pruned, AuditError> {
        let mut pruned = Pruned::default();
        let mut over = match retention.max_records {
            0 => 0,
            max => self.len().saturating_sub(max),
        };
        let oldest = self.tree.scan_prefix_first(REC, retention.pass)?;
        let mut batch = warden_store::Batch::default();
        let mut last = None;
        for (k, v) in &oldest {
            let Some(seq) = seq_of(k) else { continue };
            let record = pb::AuditRecord::decode(v.as_slice()).ok();
            if over > 0 {
                over -= 1;
                pruned.by_count += 1;
            } else if retention.cutoff_unix_ms > 0
                && record
                    .as_ref()
                    .is_some_and(|r| r.decided_at_unix_ms < retention.cutoff_unix_ms)
            {
                pruned.by_age += 1;
            } else {
                break;
            }
            batch.delete(k);
            if let Some(r) = &record {
                batch.delete(idx_key(&r.decision_id));
            }
            last = Some(seq);
        }
        if let Some(seq) = last {
            batch.put(FIRST, (seq + 1).to_be_bytes());
            self.tree.apply(batch)?;
            self.first.fetch_max(seq + 1, Ordering::AcqRel);
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens the store in `dir`, waiting out sled's file lock: after a handle with unflushed
    /// writes is dropped, sled's I/O pool can hold the file for a moment after the drop
    /// returns (a process restart, the daemon's case, never sees this).
    fn reopen(dir: &std::path::Path) -> Result<Store, StoreError> {
        let t0 = std::time::Instant::now();
        loop {
            match Store::open(dir) {
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && t0.elapsed() < std::time::Duration::from_secs(5) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    fn rec(id: &str, ctx: &str) -> pb::AuditRecord {
        pb::AuditRecord {
            decision_id: id.to_string(),
            subject: Some(pb::Subject {
                context_id: ctx.to_string(),
                ..Default::default()
            }),
            reason: "r".into(),
            ..Default::default()
        }
    }

    /// A crash between a record and its index entry (the two inserts of `append`) leaves a record
    /// `show ID` could not find; opening the log must index it again, and numbering must go on
    /// after it.
    #[test]
    fn a_record_torn_from_its_index_is_indexed_again_on_open()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let store = reopen(dir.path())?;
            let log = AuditLog::open(store.clone())?;
            log.append(&rec("whole", "c1"))?;
            // What a crash after the first insert of the next append leaves behind.
            let torn = rec("torn", "c1");
            store.tree("audit")?.put(rec_key(1), torn.encode_to_vec())?;
            assert!(log.by_decision_id("torn")?.is_none());
            store.flush()?;
        }
        let log = AuditLog::open(reopen(dir.path())?)?;
        assert_eq!(
            log.by_decision_id("torn")?.map(|r| r.decision_id),
            Some("torn".to_string())
        );
        assert_eq!(
            log.by_decision_id("whole")?.map(|r| r.decision_id),
            Some("whole".to_string())
        );
        assert_eq!(log.append(&rec("next", "c1"))?, 2);
        let ids: Vec<String> = log
            .newest(10, |_| true)?
            .into_iter()
            .map(|r| r.decision_id)
            .collect();
        assert_eq!(ids, ["next", "torn", "whole"]);
        Ok(())
    }

    /// A correction (a later record of the same decision id) is what the decision reads as,
    /// by id and in the tail, and stays so after a reopen that replays the journal holding both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_correction_replaces_its_decision_for_every_reader()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut allow = rec("d1", "c1");
        allow.verdict = pb::Verdict::Allow as i32;
        let mut deny = allow.clone();
        deny.verdict = pb::Verdict::Deny as i32;
        deny.rule = "audit.unavailable".into();
        let verdicts = |log: &AuditLog| -> Result<Vec<(String, i32)>, AuditError> {
            Ok(log
                .newest(10, |_| true)?
                .into_iter()
                .map(|r| (r.decision_id, r.verdict))
                .collect())
        };
        {
            let log = AuditLog::open(reopen(dir.path())?)?;
            log.append_durable(&rec("d0", "c1")).await?;
            log.append_durable(&allow).await?;
            log.append_durable(&rec("d2", "c1")).await?;
            log.append_durable(&deny).await?;
            assert_eq!(log.by_decision_id("d1")?, Some(deny.clone()));
            assert_eq!(
                verdicts(&log)?,
                [
                    ("d1".into(), deny.verdict),
                    ("d2".into(), 0),
                    ("d0".into(), 0)
                ]
            );
        }
        // Both records are still in the journal (no checkpoint yet): replay keeps the newest.
        let log = AuditLog::open(reopen(dir.path())?)?;
        assert_eq!(log.by_decision_id("d1")?, Some(deny.clone()));
        assert_eq!(verdicts(&log)?.len(), 3);
        assert!(
            verdicts(&log)?
                .iter()
                .all(|(_, v)| *v != pb::Verdict::Allow as i32)
        );
        Ok(())
    }

    /// What a crash leaves when sled had not written out records whose answers waited for the
    /// journal: the records exist only in the journal. Opening the log restores them (and
    /// their index entries), empties the journal, and numbers new records after them.
    #[test]
    fn records_only_in_the_journal_are_restored_on_open() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        {
            let log = AuditLog::open(reopen(dir.path())?)?;
            log.append(&rec("in-sled", "c1"))?;
        }
        // Entries as `append_durable` writes them, in both files, one torn at the end.
        let mut j0 = JournalFile::open(&dir.path().join("audit-journal-0"))?;
        j0.write(5, &rec("journal-a", "c2").encode_to_vec())?;
        let mut j1 = JournalFile::open(&dir.path().join("audit-journal-1"))?;
        j1.write(6, &rec("journal-b", "c2").encode_to_vec())?;
        let torn = rec("torn", "c2").encode_to_vec();
        j1.write(7, &torn)?;
        // The crash cut the last entry short.
        j1.file.set_len(j1.len - 3)?;

        let log = AuditLog::open(reopen(dir.path())?)?;
        for id in ["in-sled", "journal-a", "journal-b"] {
            assert_eq!(
                log.by_decision_id(id)?.map(|r| r.decision_id),
                Some(id.to_string()),
                "{id}"
            );
        }
        assert!(log.by_decision_id("torn")?.is_none());
        for i in 0..2 {
            let path = dir.path().join(format!("audit-journal-{i}"));
            assert!(JournalFile::open(&path)?.entries()?.is_empty());
        }
        assert_eq!(log.append(&rec("next", "c1"))?, 7);
        let ids: Vec<String> = log
            .newest(10, |_| true)?
            .into_iter()
            .map(|r| r.decision_id)
            .collect();
        assert_eq!(ids, ["next", "journal-b", "journal-a", "in-sled"]);
        Ok(())
    }

    /// Past the checkpoint size the journal switches files and empties the old one after sled
    /// has the records on disk; nothing is lost across many switches and a reopen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_is_checkpointed_and_stays_small() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        {
            let mut log = AuditLog::open(reopen(dir.path())?)?;
            log.checkpoint_bytes = 1024;
            let log = std::sync::Arc::new(log);
            let mut tasks = Vec::new();
            for t in 0..4 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..50 {
                        log.append_durable(&rec(&format!("d-{t}-{i}"), "c")).await?;
                    }
                    Ok::<_, AuditError>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            // Each file holds at most one checkpoint's worth (about 20 of these records) plus
            // the entries written during one sync; without checkpoints one would hold 200.
            for i in 0..2 {
                let path = dir.path().join(format!("audit-journal-{i}"));
                let n = JournalFile::open(&path)?.entries()?.len();
                assert!(n < 40, "journal {i} holds {n} entries");
            }
        }
        let log = AuditLog::open(reopen(dir.path())?)?;
        assert_eq!(log.len(), 200);
        for t in 0..4 {
            for i in 0..50 {
                assert!(log.by_decision_id(&format!("d-{t}-{i}"))?.is_some());
            }
        }
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_are_durable_ordered_and_survive_reopen()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let log = std::sync::Arc::new(AuditLog::open(reopen(dir.path())?)?);
            let mut tasks = Vec::new();
            for t in 0..8 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..20 {
                        log.append_durable(&rec(&format!("d-{t}-{i}"), &format!("c{t}")))
                            .await?;
                    }
                    Ok::<_, AuditError>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            assert_eq!(log.len(), 160);
        }
        // Reopened: numbering continues after the last record instead of overwriting it.
        let log = AuditLog::open(reopen(dir.path())?)?;
        assert_eq!(log.len(), 160);
        let seq = log.append(&rec("after", "c9"))?;
        assert_eq!(seq, 160);
        let newest = log.newest(3, |_| true)?;
        assert_eq!(newest[0].decision_id, "after");
        assert_eq!(newest.len(), 3);
        assert!(log.by_decision_id("d-3-7")?.is_some());
        assert!(log.by_decision_id("nope")?.is_none());
        // A filter that matches old records reads past the first window.
        let c0 = log.newest(50, |r| {
            r.subject.as_ref().is_some_and(|s| s.context_id == "c0")
        })?;
        assert_eq!(c0.len(), 20);
        Ok(())
    }
}
