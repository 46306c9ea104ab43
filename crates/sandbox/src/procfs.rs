//! Minimal, allocation-light readers for `/proc`: process status lines, identities, environment
//! markers, and signalling a process only after proving it is the one we mean.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Instant;

/// A process as identified across time: its pid plus its start time (clock ticks since boot,
/// field 22 of `/proc/PID/stat`). A pid alone can be reused; the pair cannot, so every pid read
/// back from storage is compared on both before anything is signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProcessIdentity {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcessIdentity {
    /// The identity of the process currently holding `pid`, if any (zombies included).
    pub fn of(pid: i32) -> Option<Self> {
        read_stat(pid).map(|s| Self {
            pid,
            start_time: s.start_time,
        })
    }

    /// True when `pid` is still held by this very process (alive or zombie).
    pub fn still_exists(&self) -> bool {
        read_stat(self.pid).is_some_and(|s| s.start_time == self.start_time)
    }

    /// True when `pid` is still held by this very process and it is not a zombie.
    pub fn is_alive(&self) -> bool {
        read_stat(self.pid).is_some_and(|s| s.start_time == self.start_time && s.is_live())
    }
}

/// The fields of `/proc/PID/stat` the kill ladder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub pid: i32,
    pub state: u8,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub start_time: u64,
}

impl Stat {
    /// "Still alive" means anything but a zombie or a dead task: a zombie holds no resources and
    /// runs no code, it only waits for its parent to collect it.
    pub fn is_live(&self) -> bool {
        self.state != b'Z' && self.state != b'X' && self.state != b'x'
    }
}

/// Parses one `/proc/PID/stat` line. The command name sits in parentheses and may itself contain
/// spaces and `)`, so the fields are counted from the LAST `)`.
pub(crate) fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    if close < open {
        return None;
    }
    let pid: i32 = line[..open].trim().parse().ok()?;
    let mut rest = line.get(close + 1..)?.split_ascii_whitespace();
    // rest[0] is field 3 (state); field N is rest[N-3].
    let state = *rest.next()?.as_bytes().first()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    let session = rest.next()?.parse().ok()?;
    // Skip fields 7..=21 (15 fields) to reach field 22, starttime.
    let start_time = rest.nth(15)?.parse().ok()?;
    Some(Stat {
        pid,
        state,
        ppid,
        pgrp,
        session,
        start_time,
    })
}

pub(crate) fn read_stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Every process currently visible in `/proc`, keyed by pid.
pub(crate) fn all_stats() -> HashMap<i32, Stat> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(stat) = read_stat(pid) {
            out.insert(pid, stat);
        }
    }
    out
}

/// One reading of the whole process table, shared by every tree that is being killed at the
/// same time. Reading `/proc` costs one `stat` file per process; 500 trees killed at once, each
/// reading it on every poll, would be quadratic (500 trees x 1,500 processes x every poll, on
/// one runtime thread). Instead a kill asks for a reading taken *after* a given instant (its
/// last signal) and gets the newest one if it is recent enough, so one reading serves every
/// concurrent kill that is waiting at that moment.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Taken before the first file was read: the reading shows the table at or after this.
    pub taken: Instant,
    pub stats: HashMap<i32, Stat>,
    /// Marker value -> pids carrying it, built on first use (one `environ` read per process
    /// over its whole life, remembered by pid and start time in [`MARKS`]).
    markers: OnceLock<HashMap<Box<str>, Vec<i32>>>,
    /// Parent pid -> children, and process group -> members: a tree's membership is then
    /// found in time proportional to the tree, not to the whole table.
    children: OnceLock<HashMap<i32, Vec<i32>>>,
    groups: OnceLock<HashMap<i32, Vec<i32>>>,
}

static LATEST: Mutex<Option<Arc<Snapshot>>> = Mutex::new(None);

/// The tree markers found in each process's initial environment, by (pid, start time). A
/// marker seen once stays: a process that later overwrites its environment is still found.
static MARKS: LazyLock<Mutex<MarkCache>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// (pid, start time) -> the `WARDEN_TREE` values in that process's initial environment.
type MarkCache = HashMap<(i32, u64), Vec<Box<str>>>;

/// The newest shared reading of the process table, if it was taken strictly after `after`.
pub(crate) fn latest_after(after: Instant) -> Option<Arc<Snapshot>> {
    let latest = LATEST.lock().unwrap_or_else(|p| p.into_inner());
    latest.as_ref().filter(|s| s.taken > after).cloned()
}

/// Takes a new reading (with its indexes) and makes it the shared one. Blocking: a file per
/// process.
pub(crate) fn refresh() -> Arc<Snapshot> {
    let snap = Arc::new(Snapshot {
        taken: Instant::now(),
        stats: all_stats(),
        markers: OnceLock::new(),
        children: OnceLock::new(),
        groups: OnceLock::new(),
    });
    snap.index();
    *LATEST.lock().unwrap_or_else(|p| p.into_inner()) = Some(snap.clone());
    snap
}

/// A reading taken strictly after `after`: the shared one when it is, otherwise a new one.
pub(crate) fn snapshot_after(after: Instant) -> Arc<Snapshot> {
    latest_after(after).unwrap_or_else(refresh)
}

impl Snapshot {
    /// The pids whose parent is `ppid`.
    pub fn children_of(&self, ppid: i32) -> &[i32] {
        self.children
            .get_or_init(|| index_by(&self.stats, |s| s.ppid))
            .get(&ppid)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The pids in process group `pgrp`.
    pub fn group(&self, pgrp: i32) -> &[i32] {
        self.groups
            .get_or_init(|| index_by(&self.stats, |s| s.pgrp))
            .get(&pgrp)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Builds the parent and group indexes (by whoever took the reading, off the runtime
    /// thread). The marker index is built on first use only: it reads the environment of each
    /// process once in its life (remembered in [`MARKS`]), which only trees without a cgroup
    /// and without bubblewrap need (elsewhere an escaped process is still in the cgroup or in
    /// the tree's pid namespace).
    fn index(&self) {
        let _ = self.children_of(0);
        let _ = self.group(0);
    }
    /// The live pids whose initial environment carries `WARDEN_TREE=<marker>`.
    pub fn marked(&self, marker: &str) -> &[i32] {
        self.markers
            .get_or_init(|| self.index_markers())
            .get(marker)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    fn index_markers(&self) -> HashMap<Box<str>, Vec<i32>> {
        let key = format!("{}=", crate::env::TREE_MARKER_ENV);
        let mut marks = MARKS.lock().unwrap_or_else(|p| p.into_inner());
        // Forget processes that are gone, so the memory follows the table.
        marks.retain(|(pid, start), _| self.stats.get(pid).is_some_and(|s| s.start_time == *start));
        let mut out: HashMap<Box<str>, Vec<i32>> = HashMap::new();
        for s in self.stats.values().filter(|s| s.is_live()) {
            let values = marks
                .entry((s.pid, s.start_time))
                .or_insert_with(|| environ_values(s.pid, key.as_bytes()));
            for v in values.iter() {
                out.entry(v.clone()).or_default().push(s.pid);
            }
        }
        out
    }
}

fn index_by(stats: &HashMap<i32, Stat>, key: impl Fn(&Stat) -> i32) -> HashMap<i32, Vec<i32>> {
    let mut out: HashMap<i32, Vec<i32>> = HashMap::new();
    for s in stats.values() {
        out.entry(key(s)).or_default().push(s.pid);
    }
    out
}

/// The values of every `KEY=value` entry of the process's initial environment whose prefix is
/// `key_eq` (`KEY=`).
/// An agent's process writes its own initial environment (up to what `execve` takes, many
/// megabytes): the supervisor reads no more than this of it. The marker warden set is the
/// spawn's; a process that pushes it past this bound with a larger environment of its own
/// exec'd itself out of the marker search, which it could do by unsetting it too (the
/// marker is the fallback for a host without cgroups or bubblewrap, see kill.rs).
const ENVIRON_READ_MAX: u64 = 256 * 1024;

fn environ_values(pid: i32, key_eq: &[u8]) -> Vec<Box<str>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(format!("/proc/{pid}/environ"))
        .and_then(|f| f.take(ENVIRON_READ_MAX).read_to_end(&mut bytes));
    if read.is_err() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .filter_map(|e| e.strip_prefix(key_eq))
        .filter_map(|v| std::str::from_utf8(v).ok())
        .map(Box::from)
        .collect()
}

/// `pid` and its descendants as the kernel lists them right now (`/proc/PID/task/TID/children`
/// of every thread, breadth first): a walk in time proportional to the tree, not the host.
/// Where the kernel lacks that file (no `CONFIG_PROC_CHILDREN`) it finds `pid` alone, and the
/// full readings find the rest.
pub(crate) fn tree_of(pid: i32) -> Vec<Stat> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if !seen.insert(p) || seen.len() > 100_000 {
            continue;
        }
        let Some(st) = read_stat(p) else { continue };
        out.push(st);
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_ascii_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// The short command name (`comm`) of a process.
pub(crate) fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Sends `signal` to `id` only if `id.pid` still belongs to the same process. With a pidfd the
/// check and the send refer to one process object, so a pid recycled in between cannot be hit.
/// Returns true when the signal was delivered.
pub(crate) fn signal_identity(id: ProcessIdentity, signal: i32) -> bool {
    if id.pid <= 0 {
        return false;
    }
    let Some(pid) = rustix::process::Pid::from_raw(id.pid) else {
        return false;
    };
    // Signal 0 only asks whether the process is there: the pinned, re-checked pidfd answers it.
    let sig = match signal {
        0 => None,
        n => match rustix::process::Signal::from_named_raw(n) {
            Some(s) => Some(s),
            None => return false,
        },
    };
    let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOSYS) => {
            // Kernels older than 5.3: check then kill; the window is a few microseconds.
            if !id.still_exists() {
                return false;
            }
            return nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(id.pid),
                nix::sys::signal::Signal::try_from(signal).ok(),
            )
            .is_ok();
        }
        Err(_) => return false,
    };
    // The fd now pins the process; re-check that it is the one we mean.
    id.still_exists() && sig.is_none_or(|sig| rustix::process::pidfd_send_signal(&fd, sig).is_ok())
}

/// Lists the pids in a cgroup v2 directory (`cgroup.procs`).
pub(crate) fn cgroup_procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_is_read_only_up_to_its_bound() {
        // A process with 1 MiB of its own environment before the marker: the read stops at
        // the bound, so the marker past it is not found (and nothing unbounded is held).
        // (One string may be at most 128 KiB: eight of 100 KiB. The environment is laid out
        // sorted by name, so the filler's names place it before or after the marker.)
        let big = "x".repeat(100 * 1024);
        let spawn = |filler_prefix: char, marker: &str| {
            let mut c = std::process::Command::new("/bin/sleep");
            c.arg("5").env_clear().env("WARDEN_TREE", marker);
            for i in 0..8 {
                c.env(format!("{filler_prefix}{i}"), &big);
            }
            let child = c.spawn().expect("sleep");
            // Until it has exec'd (before, /proc shows the forked test's environment) and the
            // kernel has laid out its new environment: `comm` changes before `env_start` is set,
            // and in between /proc/PID/environ reads empty.
            let path = format!("/proc/{}/environ", child.id());
            for _ in 0..2500 {
                if comm(child.id() as i32).as_deref() == Some("sleep")
                    && std::fs::read(&path).is_ok_and(|e| !e.is_empty())
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            child
        };
        let mut far = spawn('A', "far");
        let mut near = spawn('Z', "near");
        let got_far = environ_values(far.id() as i32, b"WARDEN_TREE=");
        let got_near = environ_values(near.id() as i32, b"WARDEN_TREE=");
        let _ = far.kill();
        let _ = near.kill();
        let _ = far.wait();
        let _ = near.wait();
        assert!(got_far.is_empty(), "{got_far:?}");
        assert_eq!(got_near, vec![Box::from("near")]);
    }

    #[test]
    fn stat_parsing_survives_hostile_command_names() {
        // A comm of "evil) Z 1 2 (x" would mislead a parser that splits at the first ')'.
        // Fields 7..=21 are fifteen filler values, field 22 is 999.
        let line = "4242 (evil) Z 1 2 (x) S 7 8 9 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 999 23\n";
        let s = parse_stat(line).expect("parses");
        assert_eq!(s.pid, 4242);
        assert_eq!(s.state, b'S');
        assert_eq!(s.ppid, 7);
        assert_eq!(s.pgrp, 8);
        assert_eq!(s.session, 9);
        assert_eq!(s.start_time, 999);
    }

    #[test]
    fn own_identity_is_readable_and_live() {
        let me = ProcessIdentity::of(std::process::id() as i32).expect("self in /proc");
        assert!(me.is_alive());
        let wrong = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!wrong.still_exists());
        assert!(!signal_identity(wrong, 0));
        assert!(signal_identity(me, 0));
    }

    #[test]
    fn garbage_stat_lines_are_rejected() {
        for bad in ["", "12", "x (a) S", "12 (a) S 1 2 3", ")( 1 2"] {
            assert!(parse_stat(bad).is_none(), "{bad:?}");
        }
    }
}
