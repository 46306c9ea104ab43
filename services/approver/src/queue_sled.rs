//! The queue in the approver's own sled store (the default: one approver on one host): trees
//! `approvals` (id → approval), `requests` (supervisor request id → id) and `history`
//! (answered time + id → id), each change flushed before it returns. One lock orders the
//! check and the write of a resolution, so the first one wins.

use std::sync::Mutex;

use prost::Message;
use warden_proto::v1 as pb;
use warden_store::{Batch, Store, Tree};

use crate::queue_store::{
    Held, QueueError, QueueStore, Resolution, ResolveError, now_ms, withdrawn,
};

pub struct SledQueue {
    store: Store,
    approvals: Tree,
    requests: Tree,
    history: Tree,
    /// Orders holds and resolutions (check, then write).
    lock: Mutex<()>,
    keep: usize,
}

fn history_key(a: &pb::Approval) -> Vec<u8> {
    let mut k = a.answered_unix_ms.to_be_bytes().to_vec();
    k.extend_from_slice(a.id.as_bytes());
    k
}

fn decode(key: &[u8], v: &[u8]) -> Result<pb::Approval, QueueError> {
    pb::Approval::decode(v).map_err(|source| QueueError::Decode {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

impl SledQueue {
    pub fn open(store: Store, keep: usize) -> Result<Self, QueueError> {
        Ok(SledQueue {
            approvals: store.tree("approvals")?,
            requests: store.tree("requests")?,
            history: store.tree("history")?,
            store,
            lock: Mutex::new(()),
            keep,
        })
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        // Guards no data of its own; a panic elsewhere leaves nothing half-changed.
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get_sync(&self, id: &str) -> Result<Option<pb::Approval>, QueueError> {
        match self.approvals.get(id.as_bytes())? {
            Some(v) => Ok(Some(decode(id.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    fn by_request_sync(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError> {
        if request_id.is_empty() {
            return Ok(None);
        }
        match self.requests.get(request_id.as_bytes())? {
            Some(id) => self.get_sync(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// Every request held, pending and decided (an import into another backend).
    pub fn all(&self) -> Result<Vec<pb::Approval>, QueueError> {
        self.approvals
            .scan_prefix([])?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// Pending requests, at opening (the caller waits on each).
    pub fn pending_now(&self) -> Result<Vec<pb::Approval>, QueueError> {
        self.pending_all()
    }

    fn pending_all(&self) -> Result<Vec<pb::Approval>, QueueError> {
        let mut out = Vec::new();
        for (k, v) in self.approvals.scan_prefix([])? {
            let a = decode(&k, &v)?;
            if a.state() == pb::ApprovalState::Pending {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Drops the oldest decided requests beyond `keep`.
    fn trim(&self) {
        let over = self.history.len().saturating_sub(self.keep);
        if over == 0 {
            return;
        }
        let Ok(oldest) = self.history.scan_prefix([]) else {
            return;
        };
        for (k, id) in oldest.into_iter().take(over) {
            if let Ok(Some(a)) = self.get_sync(&String::from_utf8_lossy(&id))
                && let Some(r) = a.request.as_ref()
            {
                let _ = self.requests.delete(r.request_id.as_bytes());
            }
            let _ = self.approvals.delete(&id);
            let _ = self.history.delete(&k);
        }
    }
}

#[tonic::async_trait]
impl QueueStore for SledQueue {
    async fn hold(&self, a: &pb::Approval) -> Result<Held, QueueError> {
        let request_id = a.request.as_ref().map(|r| r.request_id.as_str());
        let _g = self.guard();
        if let Some(r) = request_id.filter(|r| !r.is_empty())
            && let Some(existing) = self.by_request_sync(r)?
        {
            return Ok(Held::Exists(Box::new(existing)));
        }
        self.approvals.put(a.id.as_bytes(), a.encode_to_vec())?;
        if let Some(r) = request_id.filter(|r| !r.is_empty()) {
            self.requests.put(r.as_bytes(), a.id.as_bytes())?;
        }
        self.store.flush()?;
        Ok(Held::New)
    }

    async fn get(&self, id: &str) -> Result<Option<pb::Approval>, QueueError> {
        self.get_sync(id)
    }

    async fn by_request(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError> {
        self.by_request_sync(request_id)
    }

    async fn pending(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let mut out = self.pending_all()?;
        out.sort_by_key(|a| std::cmp::Reverse(a.created_unix_ms));
        out.truncate(limit);
        Ok(out)
    }

    async fn pending_count(&self) -> Result<usize, QueueError> {
        Ok(self.pending_all()?.len())
    }

    async fn history(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let mut out = Vec::new();
        for (_, id) in self.history.scan_rev(limit)? {
            if let Some(a) = self.get_sync(&String::from_utf8_lossy(&id))? {
                out.push(a);
            }
        }
        Ok(out)
    }

    async fn resolve(&self, id: &str, r: &Resolution) -> Result<pb::Approval, ResolveError> {
        let a = {
            let _g = self.guard();
            let Some(a) = self.get_sync(id)? else {
                return Err(ResolveError::NotFound(id.to_string()));
            };
            if a.state() != pb::ApprovalState::Pending {
                return Err(ResolveError::AlreadyDecided(Box::new(a)));
            }
            let a = r.apply(a, now_ms());
            let mut batch = Batch::default();
            batch.put(a.id.as_bytes(), a.encode_to_vec());
            self.approvals.apply(batch).map_err(QueueError::from)?;
            self.history
                .put(history_key(&a), a.id.as_bytes())
                .map_err(QueueError::from)?;
            self.store.flush().map_err(QueueError::from)?;
            a
        };
        self.trim();
        Ok(a)
    }

    async fn supersede(&self, id: &str, reason: &str) -> Result<Option<pb::Approval>, QueueError> {
        let _g = self.guard();
        let Some(a) = self.get_sync(id)? else {
            return Ok(None);
        };
        if a.state() != pb::ApprovalState::Approved {
            return Ok(None);
        }
        let a = withdrawn(a, reason, now_ms());
        self.approvals.put(a.id.as_bytes(), a.encode_to_vec())?;
        self.store.flush()?;
        Ok(Some(a))
    }

    fn backend(&self) -> &'static str {
        "sled"
    }
}
