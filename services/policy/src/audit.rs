//! The audit log: one prost-encoded `AuditRecord` per decision in the `audit` tree.
//!
//! Keys: `r/<seq u64 BE>` → record, `d/<decision id>` → seq, written in one atomic batch so a
//! record is never findable by id without existing (or vice versa). `r` sorts after `d`, so the
//! newest records are the tree's last keys.

use std::sync::Mutex;

use prost::Message;
use warden_proto::v1 as pb;
use warden_store::{Batch, Store, StoreError, Tree};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit store: {0}")]
    Store(#[from] StoreError),
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
        })
    }

    /// Appends `record`; with `sync`, fsyncs before returning.
    pub fn append(&self, record: &pb::AuditRecord, sync: bool) -> Result<(), AuditError> {
        let bytes = record.encode_to_vec();
        {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let seq = *next;
            let mut b = Batch::default();
            b.put(rec_key(seq), &bytes);
            let mut idx = IDX.to_vec();
            idx.extend_from_slice(record.decision_id.as_bytes());
            b.put(idx, seq.to_be_bytes());
            self.tree.apply(b)?;
            *next = seq + 1;
        }
        if sync {
            self.store.flush()?;
        }
        Ok(())
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
