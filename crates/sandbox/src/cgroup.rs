//! cgroup v2 per conversation: detection of a writable hierarchy, creation of `<base>/conv-…`,
//! limits where the controllers exist, `cgroup.kill`, and removal.
//!
//! Works on pure v2 hosts (`/sys/fs/cgroup`) and on hybrid hosts where cgroup2 is mounted at
//! `/sys/fs/cgroup/unified` with few or no controllers; limits are applied only when the
//! controller is listed in the conversation cgroup's `cgroup.controllers`, and the spawn result
//! says which ones were not.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::SandboxError;

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Resource limits for one conversation's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `memory.max` in bytes.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max` as (quota µs, period µs).
    pub cpu_max: Option<(u64, u64)>,
}

/// Where the supervisor's conversation cgroups live: a directory on a cgroup2 filesystem that
/// this process can create children in.
#[derive(Debug, Clone)]
pub struct CgroupBase {
    path: PathBuf,
}

/// True when `path` is on a cgroup2 filesystem.
pub(crate) fn is_cgroup2(path: &Path) -> bool {
    // `f_type` is i64 here but narrower on other architectures: the cast is for them.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// The cgroup2 mount point, from `/proc/self/mountinfo`.
pub(crate) fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in info.lines() {
        // "... mountpoint opts ... - fstype source superopts"
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next() == Some("cgroup2") {
            let mount = left.split_whitespace().nth(4)?;
            return Some(PathBuf::from(mount));
        }
    }
    None
}

/// This process's own cgroup v2 path (the `0::` line of `/proc/self/cgroup`).
pub(crate) fn own_cgroup() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| PathBuf::from(p.trim()))
}

fn read_words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

impl CgroupBase {
    /// Finds the cgroup2 hierarchy, and creates (or reuses) `<own cgroup>/<name>` as the base
    /// for conversation cgroups. Returns `Ok(None)` when there is no cgroup2 mount or it is not
    /// writable here; the caller then falls back to process groups.
    pub fn detect(name: &str) -> Result<Option<Self>, SandboxError> {
        if !is_plain_name(name) {
            return Err(SandboxError::InvalidInput(format!(
                "cgroup base name {name:?} must be one plain path component"
            )));
        }
        let Some(mount) = cgroup2_mount() else {
            return Ok(None);
        };
        let own = own_cgroup().unwrap_or_else(|| PathBuf::from("/"));
        let rel = own.strip_prefix("/").unwrap_or(&own);
        let path = mount.join(rel).join(name);
        match Self::at(&path) {
            Ok(b) => Ok(Some(b)),
            Err(SandboxError::Io { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Uses `path` as the base, creating it if needed. It must be on a cgroup2 filesystem and
    /// must not be a symlink.
    pub fn at(path: &Path) -> Result<Self, SandboxError> {
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.file_type().is_symlink()
        {
            return Err(SandboxError::InvalidInput(format!(
                "cgroup base {} is a symlink",
                path.display()
            )));
        }
        if let Err(e) = std::fs::create_dir(path)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            return Err(SandboxError::io("create cgroup base", path, e));
        }
        if !is_cgroup2(path) {
            return Err(SandboxError::InvalidInput(format!(
                "{} is not on a cgroup2 filesystem",
                path.display()
            )));
        }
        // Hand every controller the base has to its children, so conversation cgroups can carry
        // limits. Best effort: the base holds no processes, so this only fails when the parent
        // has not delegated the controller, and then `Limits` reports it as unavailable.
        for c in read_words(&path.join("cgroup.controllers")) {
            let _ = std::fs::write(path.join("cgroup.subtree_control"), format!("+{c}"));
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Controllers a conversation cgroup under this base gets.
    pub fn controllers(&self) -> Vec<String> {
        read_words(&self.path.join("cgroup.subtree_control"))
    }

    /// Creates a fresh `conv-<label>-<random>` cgroup. Fails rather than reuse an existing one.
    pub fn create_conversation(&self, label: &str) -> Result<ConvCgroup, SandboxError> {
        let name = format!("conv-{}-{}", label, uuid::Uuid::new_v4().simple());
        let path = self.path.join(name);
        std::fs::create_dir(&path).map_err(|e| SandboxError::io("create cgroup", &path, e))?;
        Ok(ConvCgroup { path })
    }

    /// `conv-*` directories under this base (leftovers after a crash, or live ones).
    pub fn conversation_dirs(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        dir.flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| e.file_name().to_string_lossy().starts_with("conv-"))
            .map(|e| e.path())
            .collect()
    }

    /// Removes the base directory if it is empty (tests and shutdown).
    pub fn remove_if_empty(&self) -> bool {
        std::fs::remove_dir(&self.path).is_ok()
    }
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && name != "."
        && name != ".."
}

/// How long a removal waits between attempts while the cgroup empties.
const REMOVE_RETRY: Duration = Duration::from_millis(5);

/// One conversation's cgroup.
#[derive(Debug, Clone)]
pub struct ConvCgroup {
    path: PathBuf,
}

/// What happened to each requested limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitsOutcome {
    /// Interface files written (e.g. `memory.max`).
    pub applied: Vec<String>,
    /// Requested limits whose controller this cgroup does not have.
    pub unavailable: Vec<String>,
}

impl ConvCgroup {
    /// Accepts a cgroup path read back from storage only if it is a `conv-*` directory on a
    /// cgroup2 filesystem, with no `..`, and (when given) directly under `base`.
    pub(crate) fn from_stored(path: &Path, base: Option<&CgroupBase>) -> Option<Self> {
        if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir)) {
            return None;
        }
        let name = path.file_name()?.to_str()?;
        if !name.starts_with("conv-") || !is_plain_name(name) {
            return None;
        }
        if let Some(b) = base
            && path.parent() != Some(b.path())
        {
            return None;
        }
        let meta = std::fs::symlink_metadata(path).ok()?;
        if !meta.is_dir() || !is_cgroup2(path) {
            return None;
        }
        Some(Self {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `cgroup.procs` for writing (close-on-exec), so the child can move itself in with a
    /// single `write` between fork and exec.
    pub(crate) fn open_procs(&self) -> Result<std::fs::File, SandboxError> {
        let p = self.path.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| SandboxError::io("open cgroup.procs", &p, e))
    }

    pub fn apply_limits(&self, limits: &Limits) -> Result<LimitsOutcome, SandboxError> {
        let have = read_words(&self.path.join("cgroup.controllers"));
        let mut out = LimitsOutcome::default();
        let mut set = |controller: &str, file: &str, value: String| -> Result<(), SandboxError> {
            if have.iter().any(|c| c == controller) {
                let p = self.path.join(file);
                std::fs::write(&p, value).map_err(|e| SandboxError::io("write limit", &p, e))?;
                out.applied.push(file.to_string());
            } else {
                out.unavailable.push(file.to_string());
            }
            Ok(())
        };
        if let Some(m) = limits.memory_max {
            set("memory", "memory.max", m.to_string())?;
        }
        if let Some(p) = limits.pids_max {
            set("pids", "pids.max", p.to_string())?;
        }
        if let Some((q, period)) = limits.cpu_max {
            set("cpu", "cpu.max", format!("{q} {period}"))?;
        }
        Ok(out)
    }

    pub fn procs(&self) -> Vec<i32> {
        crate::procfs::cgroup_procs(&self.path)
    }

    /// True while any live task is in the cgroup (`cgroup.events`: `populated 1`).
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
            .unwrap_or(false)
    }

    /// SIGKILLs every task in the cgroup at once (`cgroup.kill`, kernel ≥ 5.14). On older
    /// kernels, kills each listed pid; those pids are current members, not stored ones.
    pub fn kill(&self) -> bool {
        let p = self.path.join("cgroup.kill");
        match OpenOptions::new().write(true).open(&p) {
            Ok(mut f) => f.write_all(b"1").is_ok(),
            Err(_) => {
                for pid in self.procs() {
                    if let Some(id) = crate::procfs::ProcessIdentity::of(pid) {
                        crate::procfs::signal_identity(id, libc::SIGKILL);
                    }
                }
                false
            }
        }
    }

    /// Removes the cgroup, waiting up to `wait` for it to empty.
    ///
    /// Async: the wait must not hold the runtime thread (hundreds of trees are killed at once on
    /// a supervisor stop, each waiting for its cgroup to drain).
    /// [`ConvCgroup::remove`] for a synchronous caller (a failed spawn's clean-up).
    pub fn remove_blocking(&self, wait: Duration) -> Result<(), SandboxError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(done) = self.remove_step(deadline) {
                return done;
            }
            std::thread::sleep(REMOVE_RETRY);
        }
    }

    /// One attempt at removing the directory: `Some` when that settles it (removed, gone, or
    /// still busy at `deadline`), `None` to try again (a cgroup empties a moment after its last
    /// task exits).
    fn remove_step(&self, deadline: Instant) -> Option<Result<(), SandboxError>> {
        match std::fs::remove_dir(&self.path) {
            Ok(()) => Some(Ok(())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Ok(())),
            Err(e) if Instant::now() >= deadline => {
                Some(Err(SandboxError::io("remove cgroup", &self.path, e)))
            }
            Err(_) => None,
        }
    }

    pub async fn remove(&self, wait: Duration) -> Result<(), SandboxError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(done) = self.remove_step(deadline) {
                return done;
            }
            tokio::time::sleep(REMOVE_RETRY).await;
        }
    }
}
