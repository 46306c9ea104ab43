//! The termination ladder for a whole process tree.
//!
//! Membership of a tree is recomputed from `/proc` on every poll, as the union of: the leader
//! (pid + start time), every member seen before (pid + start time), the leader's process group
//! while the un-reaped leader pins that pgid, the conversation's cgroup, any live process whose
//! environment carries the tree's `WARDEN_TREE=<id>` marker (this finds descendants that called
//! `setsid` and were re-parented to PID 1 or to this subreaper), and every descendant of those by
//! parent pid. A stored pid is never signalled on its own say-so: each signal goes through a
//! pidfd after the start time has been re-checked.

use std::collections::{HashMap, HashSet};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, ChildStdin};

use crate::SandboxError;
use crate::cgroup::ConvCgroup;
use crate::lease::{Lease, Leases};
use crate::procfs::{self, ProcessIdentity, Stat};

/// Default time between SIGTERM and the forced kill.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

/// How long the ladder keeps re-killing after the forced step before it gives up and reports
/// survivors (an uninterruptible process can outlive SIGKILL for a while).
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

const MAX_POLL: Duration = Duration::from_millis(10);

/// Up to this many kills at once, each walks its tree at once through the kernel's children
/// lists before the first shared reading.
const WALK_WHEN_AT_MOST: usize = 8;

/// Counts the kills under way in this process.
struct KillsUnderWay {
    concurrent: usize,
}

static KILLS_UNDER_WAY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl KillsUnderWay {
    fn enter() -> Self {
        let before = KILLS_UNDER_WAY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            concurrent: before + 1,
        }
    }
}

impl Drop for KillsUnderWay {
    fn drop(&mut self) {
        KILLS_UNDER_WAY.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Parameters of one kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillOptions {
    pub grace: Duration,
    pub kill_timeout: Duration,
}

impl Default for KillOptions {
    fn default() -> Self {
        Self {
            grace: DEFAULT_GRACE,
            kill_timeout: DEFAULT_KILL_TIMEOUT,
        }
    }
}

impl KillOptions {
    pub fn with_grace(grace: Duration) -> Self {
        Self {
            grace,
            ..Self::default()
        }
    }
}

/// What one kill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillReport {
    /// True when the grace ran out and SIGKILL / `cgroup.kill` was needed.
    pub forced: bool,
    /// From the first SIGTERM until the tree was empty (or the kill timeout ran out).
    pub elapsed: Duration,
    /// Distinct live processes observed in the tree during the kill.
    pub processes: usize,
    /// Live members still present at the end (0 unless something resisted SIGKILL).
    pub remaining: usize,
    /// True when `cgroup.kill` was written.
    pub used_cgroup_kill: bool,
    /// True when the conversation's cgroup existed and was removed.
    pub cgroup_removed: bool,
    /// The leader's exit status, when this handle owned the leader.
    pub leader_status: Option<ExitStatus>,
}

/// Makes this process the child subreaper (`PR_SET_CHILD_SUBREAPER`): orphaned descendants are
/// re-parented here instead of to PID 1, so they stay visible to the `/proc` walk and their
/// zombies are collected by the kill ladder instead of lingering under a slow init.
pub fn set_child_subreaper() -> Result<(), SandboxError> {
    rustix::process::set_child_subreaper(rustix::process::Pid::from_raw(std::process::id() as i32))
        .map_err(|e| SandboxError::Os {
            what: "prctl(PR_SET_CHILD_SUBREAPER)",
            source: e.into(),
        })
}

/// Reaps zombie children of this (subreaper) process that no tree owns: orphans re-parented
/// here whose own parent exited without waiting for them (bubblewrap's namespace init after a
/// probe or an agent's exit is one). Without this they stay `<defunct>` as long as the daemon
/// lives. `owned` are the pids whose exit status somebody else collects (the leaders of live
/// trees, waited for by tokio): they are never touched. Returns how many were reaped.
pub fn reap_orphan_zombies(owned: &std::collections::HashSet<i32>) -> usize {
    let me = std::process::id() as i32;
    let mut reaped = 0;
    // A reading a kill took in the last moment will do: a zombie missed now is there next time.
    let recent = Instant::now()
        .checked_sub(Duration::from_millis(500))
        .unwrap_or_else(Instant::now);
    for s in procfs::snapshot_after(recent).stats.values() {
        if s.state == b'Z' && s.ppid == me && !owned.contains(&s.pid) {
            let done = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(s.pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
            if matches!(done, Ok(st) if st != nix::sys::wait::WaitStatus::StillAlive) {
                reaped += 1;
            }
        }
    }
    reaped
}

/// A handle on one spawned process tree.
#[derive(Debug)]
pub struct ProcessTree {
    conversation_id: String,
    leader: ProcessIdentity,
    /// The tokio child for the leader, when this process spawned it. Never waited on before the
    /// kill ends: the un-reaped leader keeps its pid, and so the process group id, from reuse.
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pgid: i32,
    cgroup: Option<ConvCgroup>,
    marker: Option<String>,
    bwrap: bool,
    leases: Option<Leases>,
    known: HashMap<i32, u64>,
    finished: bool,
    /// The principal's CPU group, held while the tree lives.
    cpu_group: Option<std::sync::Arc<crate::CpuGroup>>,
}

impl ProcessTree {
    /// Wraps a child that was spawned in its own process group (`process_group(0)`) by the
    /// caller. Its stdin, if piped and not taken, is held and closed by the kill.
    pub fn from_child(mut child: Child) -> Result<Self, SandboxError> {
        let pid = child
            .id()
            .ok_or_else(|| SandboxError::InvalidInput("child already reaped".into()))?
            as i32;
        let stat = procfs::read_stat(pid).ok_or_else(|| {
            SandboxError::InvalidInput(format!("child {pid} not visible in /proc"))
        })?;
        let stdin = child.stdin.take();
        Ok(Self {
            conversation_id: String::new(),
            leader: ProcessIdentity {
                pid,
                start_time: stat.start_time,
            },
            child: Some(child),
            stdin,
            pgid: stat.pgrp,
            cgroup: None,
            marker: None,
            bwrap: false,
            leases: None,
            known: HashMap::new(),
            finished: false,
            cpu_group: None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_spawn(
        conversation_id: String,
        mut child: Child,
        leader: ProcessIdentity,
        cgroup: Option<ConvCgroup>,
        marker: String,
        bwrap: bool,
        leases: Leases,
    ) -> Self {
        let stdin = child.stdin.take();
        Self {
            conversation_id,
            leader,
            child: Some(child),
            stdin,
            pgid: leader.pid,
            cgroup,
            marker: Some(marker),
            bwrap,
            leases: Some(leases),
            known: HashMap::new(),
            finished: false,
            cpu_group: None,
        }
    }

    /// Keeps `group` (the principal's CPU group its processes are in) while the tree lives.
    pub(crate) fn hold_cpu_group(&mut self, group: Option<std::sync::Arc<crate::CpuGroup>>) {
        self.cpu_group = group;
    }

    /// A tree known only from a lease (startup recovery). Its recorded pgid is never signalled
    /// as a group, since nothing pins it any more.
    pub(crate) fn from_lease(
        lease: &Lease,
        cgroup: Option<ConvCgroup>,
        leases: Option<Leases>,
    ) -> Self {
        Self {
            conversation_id: lease.conversation_id.clone(),
            leader: lease.leader,
            child: None,
            stdin: None,
            pgid: lease.pgid,
            cgroup,
            marker: Some(lease.marker.clone()),
            bwrap: false,
            leases,
            known: HashMap::new(),
            finished: false,
            cpu_group: None,
        }
    }

    /// Names another conversation as this tree's owner, in memory and in its lease (a warm
    /// agent handed to its conversation). The lease is rewritten, not flushed: the name is
    /// for whoever reads it, and crash recovery acts on the leader, cgroup and marker, which
    /// do not change.
    pub fn relabel(&mut self, conversation_id: &str) -> Result<(), SandboxError> {
        self.conversation_id = conversation_id.to_string();
        if let (Some(leases), Some(marker)) = (&self.leases, &self.marker) {
            leases.relabel(marker, conversation_id)?;
        }
        Ok(())
    }

    pub fn conversation_id(&self) -> &str {
        &self.conversation_id
    }

    pub fn leader(&self) -> ProcessIdentity {
        self.leader
    }

    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    pub fn cgroup_path(&self) -> Option<&std::path::Path> {
        self.cgroup.as_ref().map(|c| c.path())
    }

    /// The `WARDEN_TREE` marker value of this tree, if it was spawned by this crate.
    pub fn marker(&self) -> Option<&str> {
        self.marker.as_deref()
    }

    /// True when the tree runs under bubblewrap.
    pub fn sandboxed(&self) -> bool {
        self.bwrap
    }

    /// The agent's stdin, while this handle still holds it.
    pub fn stdin(&mut self) -> Option<&mut ChildStdin> {
        self.stdin.as_mut()
    }

    /// Takes the agent's stdin. The caller must then drop it before or when killing, since the
    /// ladder can only close a stdin it still holds.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// True once the leader has exited (it may still be an un-reaped zombie).
    pub fn leader_exited(&self) -> bool {
        !self.leader.is_alive()
    }

    /// Waits (polling, without reaping) until the leader has exited or `timeout` passes;
    /// returns whether it exited. The exit status comes from [`ProcessTree::kill`] afterwards.
    pub async fn wait_leader_exited(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut poll = Duration::from_millis(1);
        loop {
            if self.leader_exited() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
            poll = (poll * 2).min(MAX_POLL);
        }
    }

    /// The tree's live (non-zombie) members right now; also remembers them, so members that
    /// later leave the group are still known. Call it periodically to widen coverage.
    pub fn live_members(&mut self) -> Vec<ProcessIdentity> {
        self.scan()
            .iter()
            .filter(|s| s.is_live())
            .map(|s| ProcessIdentity {
                pid: s.pid,
                start_time: s.start_time,
            })
            .collect()
    }

    fn group_pinned(&self) -> bool {
        // Only while this process holds the leader un-reaped is the pgid guaranteed ours.
        self.child.is_some() && self.pgid == self.leader.pid && self.pgid > 1
    }

    /// A reading of the process table taken after `after`, shared with concurrent kills: the
    /// newest one when it is recent enough, else a new one read off the runtime thread by one
    /// kill while the others wait for it.
    async fn snapshot(&self, after: Instant) -> Arc<procfs::Snapshot> {
        static REFRESH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        if let Some(s) = procfs::latest_after(after) {
            return s;
        }
        let _one_reader = REFRESH.lock().await;
        if let Some(s) = procfs::latest_after(after) {
            return s;
        }
        let needs_markers = self.marker.is_some() && !self.bwrap && self.cgroup.is_none();
        let read = move || {
            let s = procfs::refresh();
            if needs_markers {
                let _ = s.marked("");
            }
            s
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(s) => s,
            // No blocking pool (a runtime shutting down): read in place.
            Err(_) => read(),
        }
    }

    /// The leader's and every known member's trees, walked through the kernel's children lists
    /// (never this process or its ancestors); remembered as known.
    fn walk_now(&mut self) -> Vec<Stat> {
        let me = std::process::id() as i32;
        let mut starts: Vec<(i32, u64)> = vec![(self.leader.pid, self.leader.start_time)];
        starts.extend(self.known.iter().map(|(p, s)| (*p, *s)));
        let mut out: HashMap<i32, Stat> = HashMap::new();
        for (pid, start) in starts {
            if out.contains_key(&pid) {
                continue;
            }
            let tree = procfs::tree_of(pid);
            // The root of the walk must still be the process we mean.
            if tree
                .first()
                .is_some_and(|s| s.pid == pid && s.start_time == start)
            {
                out.extend(tree.into_iter().filter(|s| s.pid != me).map(|s| (s.pid, s)));
            }
        }
        for s in out.values() {
            self.known.insert(s.pid, s.start_time);
        }
        out.into_values().collect()
    }

    fn scan(&mut self) -> Vec<Stat> {
        let snap = procfs::snapshot_after(Instant::now());
        self.scan_in(&snap)
    }

    fn scan_in(&mut self, snap: &procfs::Snapshot) -> Vec<Stat> {
        let stats = &snap.stats;
        let me = std::process::id() as i32;
        let mut set: HashSet<i32> = HashSet::new();
        if stats
            .get(&self.leader.pid)
            .is_some_and(|s| s.start_time == self.leader.start_time)
        {
            set.insert(self.leader.pid);
        }
        for (pid, st) in &self.known {
            if stats.get(pid).is_some_and(|s| s.start_time == *st) {
                set.insert(*pid);
            }
        }
        if self.group_pinned() {
            set.extend(snap.group(self.pgid).iter().copied());
        }
        if let Some(cg) = &self.cgroup {
            set.extend(cg.procs().into_iter().filter(|p| stats.contains_key(p)));
        }
        // A process that called setsid and was re-parented out of the tree: under bubblewrap it
        // stays in the tree's pid namespace (its init is a descendant of the leader), in a
        // cgroup it stays in the cgroup; otherwise only its environment marker finds it.
        if let Some(marker) = &self.marker
            && !self.bwrap
            && self.cgroup.is_none()
        {
            set.extend(snap.marked(marker).iter().copied());
        }
        // Descendants by parent pid (a walk down from every member found so far).
        let mut todo: Vec<i32> = set.iter().copied().collect();
        while let Some(p) = todo.pop() {
            for c in snap.children_of(p) {
                if set.insert(*c) {
                    todo.push(*c);
                }
            }
        }
        // Never this process or anything above it.
        let mut cur = Some(me);
        while let Some(p) = cur {
            set.remove(&p);
            cur = stats
                .get(&p)
                .map(|s| s.ppid)
                .filter(|pp| *pp > 0 && *pp != p);
        }
        let members: Vec<Stat> = set.iter().filter_map(|p| stats.get(p).copied()).collect();
        for s in &members {
            self.known.insert(s.pid, s.start_time);
        }
        members
    }

    /// SIGTERM (then SIGCONT: a stopped process cannot act on SIGTERM until it is continued) to
    /// the live members not signalled yet; true when any was.
    fn term(&self, members: &[Stat], termed: &mut HashSet<(i32, u64)>) -> bool {
        let new: Vec<Stat> = members
            .iter()
            .filter(|s| s.is_live() && termed.insert((s.pid, s.start_time)))
            .copied()
            .collect();
        if new.is_empty() {
            return false;
        }
        self.signal_members(&new, libc::SIGTERM, true);
        if !self.bwrap {
            self.killpg(libc::SIGCONT);
        }
        self.signal_members(&new, libc::SIGCONT, true);
        true
    }

    fn signal_members(&self, members: &[Stat], signal: i32, spare_bwrap: bool) {
        for s in members.iter().filter(|s| s.is_live()) {
            if spare_bwrap && self.is_bwrap_process(s) {
                continue;
            }
            procfs::signal_identity(
                ProcessIdentity {
                    pid: s.pid,
                    start_time: s.start_time,
                },
                signal,
            );
        }
    }

    /// The outer bwrap (our leader) and its pid-namespace init. bwrap does not forward SIGTERM,
    /// and killing it tears the namespace down with SIGKILL, so the graceful step skips both
    /// and signals the agent inside directly.
    fn is_bwrap_process(&self, s: &Stat) -> bool {
        self.bwrap
            && (s.pid == self.leader.pid
                || (s.ppid == self.leader.pid && procfs::comm(s.pid).as_deref() == Some("bwrap")))
    }

    fn killpg(&self, signal: i32) {
        if self.group_pinned() {
            // The group's leader is held un-reaped, so its pgid cannot have been reused.
            if let Ok(sig) = nix::sys::signal::Signal::try_from(signal) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.pgid), sig);
            }
        }
    }

    /// Collects zombies that were re-parented to this (subreaper) process. The leader is left to
    /// tokio when tokio owns it: reaping it here would steal tokio's exit status.
    fn reap_zombies(&self, members: &[Stat]) {
        let me = std::process::id() as i32;
        for s in members {
            if s.state == b'Z' && s.ppid == me && (self.child.is_none() || s.pid != self.leader.pid)
            {
                // A specific zombie child of ours, non-blocking.
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(s.pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
        }
    }

    fn cgroup_populated(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|c| c.populated())
    }

    /// Runs the ladder: SIGTERM (group, plus every member including the agent inside bwrap),
    /// close stdin, wait up to the grace for the tree to empty, then `cgroup.kill` and SIGKILL
    /// to the group and every member, wait until empty, remove the cgroup, reap the leader and
    /// drop the lease. Runs fully even when the leader has already exited.
    pub async fn kill(&mut self, opts: KillOptions) -> Result<KillReport, SandboxError> {
        let start = Instant::now();
        let mut seen: HashSet<(i32, u64)> = HashSet::new();
        let mut note = |members: &[Stat]| {
            for s in members.iter().filter(|s| s.is_live()) {
                seen.insert((s.pid, s.start_time));
            }
        };

        // Every reading is taken after the kill began (never an older one: a descendant that
        // an old reading missed could be re-parented away before the next), shared with the
        // kills that began before it; the tree is only declared empty by a reading taken after
        // the last signal.
        // First, at once: the leader's tree as the kernel lists it (a walk of the tree only),
        // signalled before any shared reading arrives (a cooperative agent exits on its closed
        // stdin or on SIGTERM before one would).
        let mut termed: HashSet<(i32, u64)> = HashSet::new();
        // Only while few kills run at once: hundreds together (a stop, leftovers at start) are
        // served faster by the shared readings than by hundreds of walks on one thread.
        let _counted = KillsUnderWay::enter();
        let now_members = if _counted.concurrent <= WALK_WHEN_AT_MOST {
            self.walk_now()
        } else {
            Vec::new()
        };
        note(&now_members);
        if !self.bwrap {
            self.killpg(libc::SIGTERM);
        }
        self.term(&now_members, &mut termed);
        let first = self.snapshot(start).await;
        let mut last_read = first.taken;
        let members = self.scan_in(&first);
        note(&members);
        self.term(&members, &mut termed);
        self.stdin = None;
        let mut signalled = Instant::now();

        let deadline = start + opts.grace;
        let mut poll = Duration::from_millis(1);
        let mut forced = false;
        loop {
            let snap = self.snapshot(last_read.max(signalled)).await;
            last_read = snap.taken;
            let m = self.scan_in(&snap);
            note(&m);
            self.reap_zombies(&m);
            // Members that appeared since the first signal (forked, or found by a later
            // reading) get the same SIGTERM.
            if self.term(&m, &mut termed) {
                signalled = Instant::now();
            }
            let live = m.iter().filter(|s| s.is_live()).count();
            if live == 0 && !self.cgroup_populated() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                forced = true;
                break;
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
            poll = (poll * 2).min(MAX_POLL);
        }

        let mut used_cgroup_kill = false;
        let mut remaining = 0;
        if forced {
            if let Some(cg) = &self.cgroup {
                used_cgroup_kill = cg.kill();
            }
            self.killpg(libc::SIGKILL);
            signalled = Instant::now();
            let kill_deadline = signalled + opts.kill_timeout;
            loop {
                let snap = self.snapshot(last_read.max(signalled)).await;
                last_read = snap.taken;
                let m = self.scan_in(&snap);
                note(&m);
                self.signal_members(&m, libc::SIGKILL, false);
                signalled = Instant::now();
                self.reap_zombies(&m);
                let live = m.iter().filter(|s| s.is_live()).count();
                if live == 0 && !self.cgroup_populated() {
                    break;
                }
                if Instant::now() >= kill_deadline {
                    remaining = live;
                    tracing::warn!(
                        conversation_id = %self.conversation_id,
                        remaining,
                        "process tree survived SIGKILL past the kill timeout"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let elapsed = start.elapsed();

        let leader_status = match self.child.as_mut() {
            Some(child) if remaining == 0 => {
                tokio::time::timeout(Duration::from_secs(1), child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            _ => None,
        };
        // One last pass for zombies of members that exited while we waited on the leader, when
        // a newer reading is at hand (no new one is taken for it: the periodic orphan reaper
        // collects what this misses, and a stop of hundreds must not wait for readings).
        if let Some(snap) = procfs::latest_after(last_read) {
            let m = self.scan_in(&snap);
            self.reap_zombies(&m);
        }

        let mut cgroup_removed = false;
        if let Some(cg) = &self.cgroup
            && remaining == 0
        {
            match cg.remove(Duration::from_millis(200)).await {
                Ok(()) => cgroup_removed = true,
                Err(e) => tracing::warn!(
                    conversation_id = %self.conversation_id,
                    error = %e,
                    "could not remove conversation cgroup"
                ),
            }
        }
        if remaining == 0
            && let (Some(leases), Some(marker)) = (&self.leases, &self.marker)
        {
            leases.remove(marker)?;
        }
        self.finished = remaining == 0;
        Ok(KillReport {
            forced,
            elapsed,
            processes: seen.len(),
            remaining,
            used_cgroup_kill,
            cgroup_removed,
            leader_status,
        })
    }
}

impl Drop for ProcessTree {
    /// A handle dropped without `kill` still must not leave agents running: SIGKILL everything
    /// it can find, without waiting. The lease stays, so the next startup finishes the job.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
        self.killpg(libc::SIGKILL);
        let m = self.scan();
        self.signal_members(&m, libc::SIGKILL, false);
    }
}
