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
use std::time::Duration;

use serde::{Deserialize, Serialize};
use warden_store::{Store, Tree};

use crate::SandboxError;
use crate::cgroup::{CgroupBase, ConvCgroup};
use crate::kill::{KillOptions, ProcessTree};
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

/// Leftover trees killed at once at start-up. Their kills share each reading of the process
/// table (`procfs::snapshot_after`), so a large number costs little more than one.
const REAP_CONCURRENCY: usize = 1024;

/// What `reap_leftovers` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Leases found on startup.
    pub leases: usize,
    /// Leases whose tree still had live members, which were killed.
    pub trees_killed: usize,
    /// Distinct processes observed in those trees.
    pub processes: usize,
    /// Leases whose leader pid now belongs to a different process; that process was left alone.
    pub identity_mismatches: usize,
    /// Leftover `conv-*` cgroups emptied and removed (with or without a lease).
    pub cgroups_removed: usize,
    /// Entries that could not be decoded (dropped, nothing signalled).
    pub undecodable: usize,
}

/// Startup recovery: kills whatever is left of every tree on record, then forgets the leases.
///
/// Identity is proven before anything is signalled: the leader only if its pid still has the
/// recorded start time; other members only if they are found now, in the recorded cgroup or
/// carrying the tree's environment marker, or descending from such a process. A stored pgid is
/// never signalled as a group. Leftover `conv-*` cgroups under `cgroups` with no lease (a crash
/// between creating the cgroup and recording the lease) are emptied and removed too.
pub async fn reap_leftovers(
    store: &Store,
    cgroups: Option<&CgroupBase>,
    grace: Duration,
) -> Result<ReapReport, SandboxError> {
    let leases = Leases::open(store)?;
    let mut report = ReapReport::default();
    let mut leased_cgroups: Vec<PathBuf> = Vec::new();
    let mut trees = Vec::new();
    for entry in leases.list()? {
        report.leases += 1;
        let lease = match entry {
            Ok(l) => l,
            Err(key) => {
                tracing::warn!(key = %key, "dropping undecodable sandbox lease");
                report.undecodable += 1;
                leases.delete_raw_key(&key)?;
                continue;
            }
        };
        if lease.leader.pid > 0
            && ProcessIdentity::of(lease.leader.pid).is_some_and(|now| now != lease.leader)
        {
            report.identity_mismatches += 1;
            tracing::info!(
                conversation_id = %lease.conversation_id,
                pid = lease.leader.pid,
                "lease leader pid now belongs to another process; not signalling it"
            );
        }
        let cgroup = lease
            .cgroup
            .as_deref()
            .and_then(|p| ConvCgroup::from_stored(p, cgroups));
        if let Some(cg) = &cgroup {
            leased_cgroups.push(cg.path().to_path_buf());
        }
        let tree = ProcessTree::from_lease(&lease, cgroup, Some(leases.clone()));
        trees.push((lease.conversation_id, tree));
    }
    // Every tree gets the one grace at the same time: 500 trees that ignore SIGTERM take one
    // grace, not 500 (the concurrent kills share their /proc readings).
    let mut pending = trees.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < REAP_CONCURRENCY {
            let Some((id, mut tree)) = pending.next() else {
                break;
            };
            running.spawn(async move {
                let r = tree.kill(KillOptions::with_grace(grace)).await;
                (id, r)
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (conversation_id, kr) = match done {
            Ok((id, r)) => (id, r?),
            Err(e) => {
                tracing::error!(error = %e, "a reaping task failed");
                continue;
            }
        };
        if kr.processes > 0 {
            report.trees_killed += 1;
            report.processes += kr.processes;
        }
        if kr.cgroup_removed {
            report.cgroups_removed += 1;
        }
        tracing::info!(
            conversation_id = %conversation_id,
            processes = kr.processes,
            forced = kr.forced,
            "reaped leftover process tree"
        );
    }
    if let Some(base) = cgroups {
        for dir in base.conversation_dirs() {
            if leased_cgroups.contains(&dir) {
                continue;
            }
            if let Some(cg) = ConvCgroup::from_stored(&dir, Some(base)) {
                cg.kill();
                if wait_empty(&cg).await && cg.remove(Duration::from_millis(200)).await.is_ok() {
                    report.cgroups_removed += 1;
                }
            }
        }
    }
    Ok(report)
}

async fn wait_empty(cg: &ConvCgroup) -> bool {
    for _ in 0..400 {
        if !cg.populated() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
