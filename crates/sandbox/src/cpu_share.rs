//! Each principal's agents share one CPU weight (issue 36): a principal running eight agents
//! gets, under contention, the CPU of a principal running one — not eight times it.
//!
//! The kernel shares CPU between cgroups by weight. [`CpuShares`] keeps one cgroup per
//! principal with an active agent, all of equal weight, under `<own cgroup>/<name>-cpu` of the
//! hierarchy that has the `cpu` controller; a spawned agent (and everything it forks) enters its
//! principal's group between fork and exec, through a `cgroup.procs` file opened beforehand
//! ([`CpuGroup`]). A group is removed when its last holder is dropped and it is empty.
//!
//! Where the `cpu` controller is: on a cgroup v1 or hybrid host, its own v1 hierarchy (used here,
//! beside the conversation's v2 cgroup, which keeps its kill and limits); on a pure v2 host it
//! would be the conversation cgroups' own parent, which this module does not reshape yet, so
//! there [`CpuShares::detect`] finds nothing and agents share CPU per process, as before (the
//! supervisor logs it and `warden doctor` says so).
//!
//! Must never: name a directory after a principal's text (a principal is a hash here), follow a
//! symlink, or fail a spawn because a share could not be kept (the caller decides).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::SandboxError;

/// The weight every principal's group gets (v1 `cpu.shares`' default).
const WEIGHT: &str = "1024";

/// The per-principal CPU groups of one supervisor.
#[derive(Debug)]
pub struct CpuShares {
    root: PathBuf,
    /// Holders per group directory name.
    held: Mutex<HashMap<String, usize>>,
}

/// A principal's place in its CPU group, held while its agent lives.
#[derive(Debug)]
pub struct CpuGroup {
    shares: Arc<CpuShares>,
    dir: String,
    procs: File,
}

impl CpuGroup {
    /// The `cgroup.procs` file the child writes `0` to, between fork and exec.
    pub(crate) fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// The group's directory.
    pub fn path(&self) -> PathBuf {
        self.shares.root.join(&self.dir)
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        let left = match held.get_mut(&self.dir) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left == 0 {
            held.remove(&self.dir);
            // Fails while a process of the tree is still exiting: the next `join` of any
            // principal sweeps such leftovers.
            let _ = std::fs::remove_dir(self.shares.root.join(&self.dir));
        }
    }
}

/// The v1 hierarchy that carries the `cpu` controller, and this process's cgroup in it.
fn v1_cpu_mount() -> Option<(PathBuf, PathBuf)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next()?);
        let point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup" && opts.split(',').any(|o| o == "cpu")).then(|| PathBuf::from(point))
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "cpu")
            .then(|| PathBuf::from(path.trim_start_matches('/')))
    })?;
    Some((mount, rel))
}

impl CpuShares {
    /// The shares under `<own cpu cgroup>/<name>-cpu`, when this host has a writable v1 `cpu`
    /// hierarchy; `None` otherwise.
    pub fn detect(name: &str) -> Option<Arc<Self>> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return None;
        }
        let (mount, rel) = v1_cpu_mount()?;
        Self::at(&mount.join(rel).join(format!("{name}-cpu"))).ok()
    }

    /// Uses `root` (created if needed; never a symlink) as the parent of the principals'
    /// groups. Leftover groups of an earlier run are removed when empty.
    pub fn at(root: &Path) -> Result<Arc<Self>, SandboxError> {
        match std::fs::create_dir(root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create cpu cgroup", root, e)),
        }
        let meta = std::fs::symlink_metadata(root)
            .map_err(|e| SandboxError::io("inspect cpu cgroup", root, e))?;
        if !meta.is_dir() || !root.join("cpu.shares").exists() {
            return Err(SandboxError::InvalidInput(format!(
                "{} is not a cgroup directory with the cpu controller",
                root.display()
            )));
        }
        let s = Arc::new(Self {
            root: root.to_path_buf(),
            held: Mutex::new(HashMap::new()),
        });
        s.sweep();
        Ok(s)
    }

    /// The directory under which the principals' groups are.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A place in `principal`'s group (made if needed).
    pub fn join(self: &Arc<Self>, principal: &str) -> Result<CpuGroup, SandboxError> {
        let dir = group_name(principal);
        let path = self.root.join(&dir);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match std::fs::create_dir(&path) {
            Ok(()) => {
                let w = path.join("cpu.shares");
                std::fs::write(&w, WEIGHT)
                    .map_err(|e| SandboxError::io("write cpu.shares", &w, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create cpu group", &path, e)),
        }
        let p = path.join("cgroup.procs");
        let procs = OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| SandboxError::io("open cgroup.procs", &p, e))?;
        *held.entry(dir.clone()).or_insert(0) += 1;
        drop(held);
        self.sweep();
        Ok(CpuGroup {
            shares: self.clone(),
            dir,
            procs,
        })
    }

    /// Removes the groups nobody holds that are empty by now.
    fn sweep(&self) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with("p-")
                && !held.contains_key(name)
                && e.file_type().is_ok_and(|t| t.is_dir())
            {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }

    /// Groups held now (for the daemon's status and tests).
    pub fn groups(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for CpuShares {
    fn drop(&mut self) {
        // Every group is dropped by now (each holds this); the empty root goes with them.
        self.sweep();
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// `p-` and 16 hex digits of a hash of the principal: a fixed, plain name whatever the
/// principal's text (an `ISSUER#sub` holds slashes).
fn group_name(principal: &str) -> String {
    // FNV-1a, 64 bits: collisions only merge two principals' shares, never cross a boundary.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in principal.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("p-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_plain_whatever_the_principal() {
        for p in ["alice", "https://idp.example/#../../x", "", "a/b", "\n"] {
            let n = group_name(p);
            assert_eq!(n.len(), 18, "{n}");
            assert!(n[2..].chars().all(|c| c.is_ascii_hexdigit()), "{n}");
        }
        assert_ne!(group_name("alice"), group_name("bob"));
    }

    #[test]
    fn a_group_lives_while_held_and_goes_when_empty() {
        let Some((mount, rel)) = v1_cpu_mount() else {
            eprintln!("no v1 cpu hierarchy here: nothing to test");
            return;
        };
        let root = mount
            .join(rel)
            .join(format!("warden-test-{}-cpu", std::process::id()));
        let Ok(shares) = CpuShares::at(&root) else {
            eprintln!("the v1 cpu hierarchy is not writable here: nothing to test");
            return;
        };
        let a = shares.join("alice").expect("alice's group");
        let a2 = shares.join("alice").expect("alice's group again");
        let b = shares.join("bob").expect("bob's group");
        assert_eq!(shares.groups(), 2);
        assert_eq!(a.path(), a2.path());
        assert_ne!(a.path(), b.path());
        assert_eq!(
            std::fs::read_to_string(b.path().join("cpu.shares"))
                .unwrap_or_default()
                .trim(),
            WEIGHT
        );
        let pa = a.path();
        drop(a);
        assert!(pa.exists(), "still held once");
        drop(a2);
        assert!(!pa.exists(), "gone with its last holder");
        drop(b);
        assert_eq!(shares.groups(), 0);
        drop(shares);
        assert!(!root.exists(), "the root goes with the last handle");
    }
}
