//! Shared setup for the real-process tests: a state directory outside /tmp, a store, the host's
//! cgroup base (unique per test) and bubblewrap if it works.
#![allow(dead_code)]

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use warden_sandbox::{
    Boundary, CgroupBase, DepthGuard, EnvPolicy, KillOptions, OwnedRoots, Profile, SpawnSpec,
    Spawner,
};
use warden_store::Store;

pub struct Fixture {
    pub state: tempfile::TempDir,
    pub store: Store,
    pub cgroups: Option<CgroupBase>,
    pub bwrap: Option<PathBuf>,
}

impl Fixture {
    /// `name` makes the cgroup base unique, so parallel tests never see each other's cgroups.
    pub fn new(name: &str) -> Self {
        warden_sandbox::set_child_subreaper().expect("subreaper");
        let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir");
        let store = Store::open(&state.path().join("db")).expect("store");
        let base = format!("warden-test-{}-{name}", std::process::id());
        let cgroups = CgroupBase::detect(&base).expect("cgroup detection");
        if cgroups.is_none() {
            println!("SKIP-PART: no writable cgroup v2 hierarchy; testing process groups only");
        }
        let bwrap = warden_sandbox::find_bwrap().filter(|b| warden_sandbox::bwrap_works(b));
        Self {
            state,
            store,
            cgroups,
            bwrap,
        }
    }

    pub fn spawner(&self, with_bwrap: bool) -> Spawner {
        let bwrap = if with_bwrap { self.bwrap.clone() } else { None };
        Spawner::new(&self.store, self.cgroups.clone(), bwrap).expect("spawner")
    }

    pub fn state_dir(&self) -> PathBuf {
        std::fs::canonicalize(self.state.path()).expect("canonical state")
    }

    pub fn owned_root(&self, conv: &str, profile: Profile) -> Boundary {
        OwnedRoots::open(&self.state_dir(), &self.store)
            .expect("owned roots")
            .create(conv, "p", true, profile, None)
            .expect("create root")
    }

    pub fn spec(&self, conv: &str, boundary: Boundary, script: &str) -> SpawnSpec {
        let env = EnvPolicy::new([""; 0], [""; 0])
            .expect("policy")
            .build_from([(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))]);
        let mut spec = SpawnSpec::new(
            conv,
            "/bin/sh",
            boundary,
            env,
            DepthGuard::from_marker(None, 1),
        );
        spec.args = vec!["-c".into(), script.into()];
        spec
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(cg) = &self.cgroups {
            cg.remove_if_empty();
        }
    }
}

/// Runs `spec` to completion: returns (exit code, stdout, stderr).
pub async fn run(spawner: &Spawner, spec: SpawnSpec) -> (Option<i32>, String, String) {
    let mut agent = spawner.spawn(spec).expect("spawn");
    agent.tree.take_stdin();
    let mut out = String::new();
    let mut err = String::new();
    let read = async {
        let _ = agent.stdout.read_to_string(&mut out).await;
        let _ = agent.stderr.read_to_string(&mut err).await;
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("agent finished");
    // Output EOF comes just before the exit; let the agent finish rather than TERM it.
    agent.tree.wait_leader_exited(Duration::from_secs(10)).await;
    let report = agent
        .tree
        .kill(KillOptions::with_grace(Duration::from_secs(1)))
        .await
        .expect("kill");
    assert_eq!(report.remaining, 0);
    (report.leader_status.and_then(|s| s.code()), out, err)
}

/// Live processes whose environment carries one of `markers`.
pub fn processes_with_markers(markers: &HashSet<String>) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let hit = env.split(|b| *b == 0).any(|kv| {
            kv.strip_prefix(b"WARDEN_TREE=")
                .is_some_and(|v| markers.contains(&*String::from_utf8_lossy(v)))
        });
        if hit && warden_sandbox::ProcessIdentity::of(pid).is_some_and(|i| i.is_alive()) {
            found.push(pid);
        }
    }
    found
}

pub fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}
