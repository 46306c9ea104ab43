//! The audit log: one prost-encoded `AuditRecord` per decision in the `audit` tree.
//!
//! Keys: `r/<seq u64 BE>` → record, `d/<decision id>` → seq, written in one atomic batch so a
//! record is never findable by id without existing (or vice versa). `r` sorts after `d`, so the
//! newest records are the tree's last keys.
//!
//! Durability is a group commit: a caller that must not answer before its record is on disk
//! waits in [`AuditLog::wait_durable`]; one waiter at a time fsyncs, covering every record
//! applied so far, so concurrent decisions share one fsync instead of queueing for one each.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use warden_proto::v1 as pb;
use warden_store::{Batch, Store, StoreError, Tree};

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

fn rec_key(seq: u64) -> Vec<u8> {
    let mut k = REC.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

impl AuditLog {
    pub fn open(store: Store) -> Result<Self, AuditError> {
        let tree = store.tree("audit")?;
        let next = tree
            .scan_rev(1)?
            .first()
            .and_then(|(k, _)| k.strip_prefix(REC).map(<[u8]>::to_vec))
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(|b| u64::from_be_bytes(b) + 1)
            .unwrap_or(0);
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
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let seq = *next;
        let mut b = Batch::default();
        b.put(rec_key(seq), &bytes);
        let mut idx = IDX.to_vec();
        idx.extend_from_slice(record.decision_id.as_bytes());
        b.put(idx, seq.to_be_bytes());
        self.tree.apply(b)?;
        *next = seq + 1;
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
        let mut idx = IDX.to_vec();
        idx.extend_from_slice(id.as_bytes());
        let Some(seq) = self.tree.get(&idx)? else {
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
