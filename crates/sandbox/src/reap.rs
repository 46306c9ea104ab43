//! Start-up recovery: whatever a crashed supervisor left behind — the process trees its leases
//! record and `conv-*` cgroups without a lease — is killed, then the leases are forgotten.
//!
//! Must never: signal a pid whose start time no longer matches its lease, or a stored pgid as a
//! group (identity is proven by `ProcessTree::from_lease` and its kill).

use std::path::PathBuf;
use std::time::Duration;

use warden_store::Store;

use crate::SandboxError;
use crate::cgroup::{CgroupBase, ConvCgroup};
use crate::kill::{KillOptions, ProcessTree};
use crate::lease::Leases;
use crate::procfs::ProcessIdentity;

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
