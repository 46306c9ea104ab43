//! The audit log: one prost-encoded `AuditRecord` per decision in the `audit` tree.
//!
//! Keys: `r/<seq u64 BE>` → record, `d/<decision id>` → seq. `r` sorts after `d`, so the newest
//! records are the tree's last keys.
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
//! Durability is a group commit: a caller that must not answer before its record is on disk
//! waits in [`AuditLog::wait_durable`]; one waiter at a time fsyncs, covering every record
//! applied so far, so concurrent decisions share one fsync instead of queueing for one each.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use warden_proto::v1 as pb;
use warden_store::{Store, StoreError, Tree};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit store: {0}")]
    Store(#[from] StoreError),
    #[error("audit flush task failed: {0}")]
    FlushTask(String),
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
    /// Next sequence number; the lock also orders appends.
    next: Mutex<u64>,
    /// Every record with a smaller sequence number is on disk.
    durable: AtomicU64,
    /// Held by the one caller currently fsyncing.
    flushing: tokio::sync::Mutex<()>,
}

const REC: &[u8] = b"r/";
const IDX: &[u8] = b"d/";

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

fn seq_of(rec_key: &[u8]) -> Option<u64> {
    let b = rec_key.strip_prefix(REC)?;
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(b).ok()?))
}

impl AuditLog {
    pub fn open(store: Store) -> Result<Self, AuditError> {
        let tree = store.tree("audit")?;
        let newest = tree.scan_rev(REPAIR_WINDOW)?;
        let next = newest
            .first()
            .and_then(|(k, _)| seq_of(k))
            .map(|s| s + 1)
            .unwrap_or(0);
        let mut repaired = 0usize;
        for (k, v) in newest.iter().take_while(|(k, _)| k.starts_with(REC)) {
            let (Some(seq), Ok(r)) = (seq_of(k), pb::AuditRecord::decode(v.as_slice())) else {
                // Not ours to fix; `newest` and `by_decision_id` report a corrupt record.
                continue;
            };
            let idx = idx_key(&r.decision_id);
            if tree.get(&idx)?.as_deref() != Some(&seq.to_be_bytes()[..]) {
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
        Ok(Self {
            store,
            tree,
            next: Mutex::new(next),
            durable: AtomicU64::new(next),
            flushing: tokio::sync::Mutex::new(()),
        })
    }

    /// Appends `record` (visible to readers at once) and returns its sequence number. It is
    /// durable once [`AuditLog::wait_durable`] for that number returns.
    pub fn append(&self, record: &pb::AuditRecord) -> Result<u64, AuditError> {
        let bytes = record.encode_to_vec();
        let idx = idx_key(&record.decision_id);
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let seq = *next;
        // Record first, then its index entry (see the module docs for why this order, and not a
        // batch). A failure in between leaves a record `open` will index, and numbering moves
        // on so the record is never overwritten.
        self.tree.put(rec_key(seq), &bytes)?;
        *next = seq + 1;
        self.tree.put(idx, seq.to_be_bytes())?;
        Ok(seq)
    }

    /// Returns once record `seq` is on disk (group commit, see the module docs).
    pub async fn wait_durable(&self, seq: u64) -> Result<(), AuditError> {
        loop {
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            let _turn = self.flushing.lock().await;
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            // Everything applied before this point is covered by the flush below.
            let upto = *self.next.lock().unwrap_or_else(|p| p.into_inner());
            let store = self.store.clone();
            match tokio::task::spawn_blocking(move || store.flush()).await {
                Ok(r) => r?,
                Err(e) => return Err(AuditError::FlushTask(e.to_string())),
            }
            self.durable.fetch_max(upto, Ordering::AcqRel);
        }
    }

    pub fn len(&self) -> u64 {
        *self.next.lock().unwrap_or_else(|p| p.into_inner())
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
                if keep(&r) {
                    out.push(r);
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let store = Store::open(dir.path())?;
            let log = AuditLog::open(store.clone())?;
            log.append(&rec("whole", "c1"))?;
            // What a crash after the first insert of the next append leaves behind.
            let torn = rec("torn", "c1");
            store.tree("audit")?.put(rec_key(1), torn.encode_to_vec())?;
            assert!(log.by_decision_id("torn")?.is_none());
            store.flush()?;
        }
        let log = AuditLog::open(Store::open(dir.path())?)?;
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_are_durable_ordered_and_survive_reopen()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        {
            let log = std::sync::Arc::new(AuditLog::open(Store::open(dir.path())?)?);
            let mut tasks = Vec::new();
            for t in 0..8 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..20 {
                        let seq = log.append(&rec(&format!("d-{t}-{i}"), &format!("c{t}")))?;
                        log.wait_durable(seq).await?;
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
        let log = AuditLog::open(Store::open(dir.path())?)?;
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
