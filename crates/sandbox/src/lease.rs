//! Leases: a durable record of every process tree the supervisor started, written (and flushed)
//! before the agent's own code runs, so that a supervisor restarted after a crash can find and
//! kill what the previous one left behind.
//!
//! Ordering (the race this closes): the child is forked into a gate — a `/bin/sh` that blocks
//! reading an inherited pipe and only then `exec`s the real command (or bubblewrap). The parent
//! reads the leader's start time, writes and flushes the lease, and only then writes to the pipe.
//! If the supervisor dies anywhere before that write, the gate reads EOF and exits (and
//! `PR_SET_PDEATHSIG` kills it too), so no agent code ever runs without a lease on disk. A crash
//! after the write leaves a lease that `reap_leftovers` acts on.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warden_store::{Store, Tree};

use crate::SandboxError;
use crate::procfs::ProcessIdentity;

const LEASE_TREE: &str = "sandbox-leases";
const LEASE_PREFIX: &str = "lease/";

/// One spawned process tree, as recorded in the owner's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub conversation_id: String,
    /// Leader pid plus start time; the pid is never signalled unless both still match.
    pub leader: ProcessIdentity,
    pub pgid: i32,
    /// The conversation's cgroup, if it had one.
    pub cgroup: Option<PathBuf>,
    /// Value of the `WARDEN_TREE` marker every member inherits in its environment.
    pub marker: String,
    pub created_unix_ms: u64,
}

/// The lease table in the owner's store.
#[derive(Clone)]
pub struct Leases {
    store: Store,
    tree: Tree,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").finish_non_exhaustive()
    }
}

impl Leases {
    pub fn open(store: &Store) -> Result<Self, SandboxError> {
        Ok(Self {
            store: store.clone(),
            tree: store.tree(LEASE_TREE)?,
        })
    }

    fn key(marker: &str) -> String {
        format!("{LEASE_PREFIX}{marker}")
    }

    /// Writes the lease and flushes the store: it must be on disk before the agent runs.
    pub fn record(&self, lease: &Lease) -> Result<(), SandboxError> {
        let bytes = serde_json::to_vec(lease).map_err(|e| SandboxError::Lease(e.to_string()))?;
        self.tree.put(Self::key(&lease.marker), bytes)?;
        self.store.flush()?;
        Ok(())
    }

    /// Drops a lease once its tree is gone. Not flushed (sled writes it out within its flush
    /// interval): a removal lost in a crash leaves a lease whose processes no longer exist,
    /// which the next start proves by pid and start time and drops without signalling anyone;
    /// while a flush per tree, on a stop that kills hundreds at once, is hundreds of fsyncs.
    pub fn remove(&self, marker: &str) -> Result<(), SandboxError> {
        self.tree.delete(Self::key(marker))?;
        Ok(())
    }

    /// Rewrites the conversation a lease names (nothing else of it); a lease that is gone is
    /// left gone.
    pub fn relabel(&self, marker: &str, conversation_id: &str) -> Result<(), SandboxError> {
        let Some(bytes) = self.tree.get(Self::key(marker))? else {
            return Ok(());
        };
        let mut lease: Lease =
            serde_json::from_slice(&bytes).map_err(|e| SandboxError::Lease(e.to_string()))?;
        lease.conversation_id = conversation_id.to_string();
        let bytes = serde_json::to_vec(&lease).map_err(|e| SandboxError::Lease(e.to_string()))?;
        self.tree.put(Self::key(marker), bytes)?;
        Ok(())
    }

    /// Every lease on record. Undecodable entries are returned as errors by key so the caller
    /// can log and drop them; they are never acted on.
    pub fn list(&self) -> Result<Vec<Result<Lease, String>>, SandboxError> {
        Ok(self
            .tree
            .scan_prefix(LEASE_PREFIX)?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_slice::<Lease>(&v)
                    .map_err(|_| String::from_utf8_lossy(&k).into_owned())
            })
            .collect())
    }

    pub(crate) fn delete_raw_key(&self, key: &str) -> Result<(), SandboxError> {
        self.tree.delete(key)?;
        Ok(())
    }
}

pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
