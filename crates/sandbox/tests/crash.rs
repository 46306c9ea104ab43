//! Crash recovery: a supervisor process is SIGKILLed with a live agent tree; a new one on the
//! same state directory finds the lease and kills the leftovers, and leaves alone a process
//! whose pid merely matches a lease.
//!
//! The "crashing supervisor" is this test binary re-executed in helper mode.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use warden_sandbox::{
    CgroupBase, DepthGuard, EnvPolicy, Lease, Leases, ProcessIdentity, Profile, SpawnSpec, Spawner,
    reap_leftovers,
};
use warden_store::Store;

const HELPER_ENV: &str = "WARDEN_SANDBOX_CRASH_HELPER";

/// Helper mode: spawn a tree that resists SIGTERM and escapes with setsid, print its pids, then
/// hang until killed.
#[test]
#[ignore = "helper process for crash_recovery_reaps_leftovers, not a test by itself"]
fn crash_helper() {
    let Some(state) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let state = std::path::PathBuf::from(state);
    let cg_name = std::env::var("WARDEN_SANDBOX_CRASH_CGROUP").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let store = Store::open(&state.join("db")).expect("store");
        let cgroups = if cg_name.is_empty() {
            None
        } else {
            CgroupBase::detect(&cg_name).expect("cgroups")
        };
        let spawner = Spawner::new(&store, cgroups, None).expect("spawner");
        let root = warden_sandbox::OwnedRoots::open(&state, &store)
            .expect("roots")
            .create("crash", "p", true, Profile::WorkspaceWrite, None)
            .expect("root");
        let env = EnvPolicy::new([""; 0], [""; 0])
            .expect("policy")
            .from_process_env();
        let mut spec = SpawnSpec::new(
            "crash",
            "/bin/sh",
            root,
            env,
            DepthGuard::from_marker(None, 1),
        );
        spec.args = vec![
            "-c".into(),
            "f=/tmp/warden-stubborn.$$; (trap '' TERM; : > $f; exec sleep 100) & echo $!; \
             while [ ! -e $f ]; do sleep 0.01; done; rm -f $f; \
             export g=/tmp/warden-setsid.$$; setsid sh -c 'trap \"\" TERM; echo $$; : > $g; exec sleep 100' & while [ ! -e $g ]; do sleep 0.01; done; rm -f $g; \
             sleep 0.1; echo ready; wait"
                .into(),
        ];
        let agent = spawner.spawn(spec).expect("spawn");
        println!("leader {}", agent.tree.leader().pid);
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(agent.stdout));
        while let Ok(Some(l)) = lines.next_line().await {
            println!("{l}");
            if l == "ready" {
                break;
            }
        }
        // Hang with the tree alive until the test SIGKILLs this process.
        std::mem::forget(agent.tree);
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovery_reaps_leftovers_and_spares_recycled_pids() {
    warden_sandbox::set_child_subreaper().expect("subreaper");
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state");
    let state_dir = std::fs::canonicalize(state.path()).expect("canonical");
    let cg_name = format!("warden-test-{}-crash", std::process::id());
    let base = CgroupBase::detect(&cg_name).expect("cgroups");
    if base.is_none() {
        println!("SKIP-PART: no writable cgroup v2; recovery relies on markers and descent only");
    }

    let mut helper = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--ignored",
            "--exact",
            "crash_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, &state_dir)
        .env(
            "WARDEN_SANDBOX_CRASH_CGROUP",
            if base.is_some() { cg_name.as_str() } else { "" },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("helper");
    let mut out = BufReader::new(helper.stdout.take().expect("stdout"));
    let mut ids = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).expect("read") == 0 {
            panic!("helper ended early");
        }
        let l = line.trim();
        if l == "ready" {
            break;
        }
        // libtest prints "test crash_helper ... " in front of the helper's first line.
        if let Some((_, p)) = l.split_once("leader ") {
            ids.push(ProcessIdentity::of(p.parse().expect("pid")).expect("leader"));
        } else if let Ok(pid) = l.parse::<i32>() {
            ids.push(ProcessIdentity::of(pid).expect("member"));
        }
    }
    assert_eq!(ids.len(), 3, "leader + two stubborn members");

    // The supervisor crashes.
    helper.kill().expect("SIGKILL helper");
    helper.wait().expect("reap helper");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let survivors: Vec<_> = ids.iter().filter(|i| i.is_alive()).collect();
    assert!(
        !survivors.is_empty(),
        "something must be left over to recover"
    );

    // An unrelated process, and a lease that names its pid with another start time (the pid
    // was recycled since the lease was written).
    let mut unrelated = Command::new("/bin/sleep")
        .arg("100")
        .spawn()
        .expect("sleep");
    let unrelated_id = ProcessIdentity::of(unrelated.id() as i32).expect("unrelated");
    let store = Store::open(&state_dir.join("db")).expect("reopen store after crash");
    Leases::open(&store)
        .expect("leases")
        .record(&Lease {
            conversation_id: "recycled".into(),
            leader: ProcessIdentity {
                pid: unrelated_id.pid,
                start_time: unrelated_id.start_time.saturating_sub(1),
            },
            pgid: unrelated_id.pid,
            cgroup: None,
            marker: "0123456789abcdef0123456789abcdef".into(),
            created_unix_ms: 0,
        })
        .expect("record");

    let report = reap_leftovers(&store, base.as_ref(), Duration::from_millis(200))
        .await
        .expect("reap");
    println!("reap: {report:?}");
    assert_eq!(report.leases, 2);
    assert_eq!(report.identity_mismatches, 1);
    assert!(report.trees_killed >= 1);
    for id in &ids {
        assert!(!id.is_alive(), "leftover {} survived recovery", id.pid);
    }
    assert!(unrelated_id.is_alive(), "the unrelated process was touched");
    assert!(
        Leases::open(&store)
            .expect("leases")
            .list()
            .expect("list")
            .is_empty()
    );
    if let Some(b) = &base {
        assert!(
            b.conversation_dirs().is_empty(),
            "leftover cgroup not removed"
        );
        b.remove_if_empty();
    }
    let _ = unrelated.kill();
    let _ = unrelated.wait();
}
