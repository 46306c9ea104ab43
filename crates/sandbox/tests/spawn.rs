//! Spawning real agents (shell scripts) through `Spawner`, and killing them.

mod common;

use std::collections::HashSet;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use common::{Fixture, processes_with_markers, run};
use tokio::io::{AsyncBufReadExt, BufReader};
use warden_sandbox::{
    DepthGuard, EnvPolicy, KillOptions, Limits, ProcessIdentity, Profile, SandboxError,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_exits_leaving_setsid_orphans_and_all_are_killed() {
    let fx = Fixture::new("orphans");
    // With the host's cgroup (if any), and once more with process groups + markers only.
    for use_cgroup in [true, false] {
        let spawner = if use_cgroup {
            fx.spawner(false)
        } else {
            warden_sandbox::Spawner::new(&fx.store, None, None).expect("spawner")
        };
        let root = fx.owned_root(&format!("orphans-{use_cgroup}"), Profile::WorkspaceWrite);
        let script = "f=/tmp/warden-stubborn.$$; (trap '' TERM; : > $f; exec sleep 100) & echo $!; \
             while [ ! -e $f ]; do sleep 0.01; done; rm -f $f; \
                      export g=/tmp/warden-setsid.$$; setsid sh -c 'trap \"\" TERM; echo $$; : > $g; exec sleep 100' & while [ ! -e $g ]; do sleep 0.01; done; rm -f $g; \
                      sleep 0.2; echo ready; exit 0";
        let mut agent = spawner
            .spawn(fx.spec("orphans", root, script))
            .expect("spawn");
        assert_eq!(
            agent.containment.cgroup.is_some(),
            use_cgroup && fx.cgroups.is_some()
        );
        let mut lines = BufReader::new(agent.stdout).lines();
        let mut ids = Vec::new();
        while let Some(l) = lines.next_line().await.expect("read") {
            if l == "ready" {
                break;
            }
            ids.push(ProcessIdentity::of(l.trim().parse().expect("pid")).expect("alive"));
        }
        assert_eq!(ids.len(), 2);
        for _ in 0..200 {
            if agent.tree.leader_exited() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(agent.tree.leader_exited());
        assert!(ids.iter().all(|i| i.is_alive()));
        let report = agent
            .tree
            .kill(KillOptions::with_grace(Duration::from_millis(200)))
            .await
            .expect("kill");
        println!("cgroup={use_cgroup}: {report:?}");
        assert!(report.forced);
        assert_eq!(report.remaining, 0);
        for id in &ids {
            assert!(
                !id.is_alive(),
                "orphan {} survived (cgroup={use_cgroup})",
                id.pid
            );
        }
        assert!(
            spawner.leases().list().expect("leases").is_empty(),
            "lease dropped after a complete kill"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_spawn_kill_cycles_leave_nothing_behind() {
    let fx = Fixture::new("cycles");
    let spawner = fx.spawner(true);
    println!(
        "cycles with bwrap={} cgroup={}",
        spawner.bwrap().is_some(),
        spawner.cgroups().is_some()
    );
    let root = fx.owned_root("cycles", Profile::WorkspaceWrite);
    let mut markers = HashSet::new();
    let mut forced = 0;
    let start = Instant::now();
    for i in 0..200 {
        let script = "sleep 100 & sleep 100 & echo ready; wait";
        let mut agent = spawner
            .spawn(fx.spec(&format!("cycle-{i}"), root.clone(), script))
            .expect("spawn");
        markers.insert(agent.tree.marker().expect("marker").to_string());
        let mut lines = BufReader::new(agent.stdout).lines();
        let _ = lines.next_line().await;
        let report = agent
            .tree
            .kill(KillOptions::with_grace(Duration::from_millis(500)))
            .await
            .expect("kill");
        assert_eq!(report.remaining, 0, "cycle {i}: {report:?}");
        forced += usize::from(report.forced);
        if let Some(cg) = &agent.containment.cgroup {
            assert!(
                report.cgroup_removed && !cg.exists(),
                "cycle {i}: cgroup left"
            );
        }
    }
    println!("200 cycles in {:?}, {forced} forced", start.elapsed());
    assert_eq!(processes_with_markers(&markers), Vec::<i32>::new());
    if let Some(base) = spawner.cgroups() {
        assert_eq!(base.conversation_dirs(), Vec::<std::path::PathBuf>::new());
    }
    assert!(spawner.leases().list().expect("leases").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_at_the_limit_is_refused_before_any_process_starts() {
    let fx = Fixture::new("depth");
    let spawner = fx.spawner(false);
    let root = fx.owned_root("depth", Profile::WorkspaceWrite);
    let probe = root.root.join("ran");
    for marker in ["1", "7", "garbage", ""] {
        let mut spec = fx.spec("depth", root.clone(), &format!("touch {}", probe.display()));
        spec.depth = DepthGuard::from_marker(Some(marker.as_ref()), 1);
        let err = spawner.spawn(spec).expect_err("must refuse");
        assert!(matches!(err, SandboxError::DepthExceeded { .. }), "{err}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!probe.exists(), "the program must never have run");
    if let Some(base) = spawner.cgroups() {
        assert!(base.conversation_dirs().is_empty(), "no cgroup made either");
    }
    assert!(spawner.leases().list().expect("leases").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_starts_at_the_configured_nice_value() {
    let fx = Fixture::new("nice");
    for with_bwrap in [false, true] {
        if with_bwrap && fx.bwrap.is_none() {
            println!("SKIP: bubblewrap missing or not working; nice test without it only");
            continue;
        }
        let spawner = fx.spawner(with_bwrap).with_nice(10);
        let root = fx.owned_root(&format!("nice-{with_bwrap}"), Profile::WorkspaceWrite);
        let mut spec = fx.spec("nice", root, "");
        // Field 19 of /proc/self/stat is the nice value (counted after the command name).
        spec.program = "/bin/sh".into();
        spec.args = vec![
            "-c".into(),
            "cut -d')' -f2 /proc/self/stat | cut -d' ' -f18".into(),
        ];
        let (code, out, err) = run(&spawner, spec).await;
        assert_eq!(code, Some(0), "stderr: {err}");
        assert_eq!(out.trim(), "10", "bwrap={with_bwrap}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_sees_only_allowlisted_environment_and_the_markers() {
    let fx = Fixture::new("env");
    for with_bwrap in [false, true] {
        if with_bwrap && fx.bwrap.is_none() {
            println!("SKIP: bubblewrap missing or not working; env test without it only");
            continue;
        }
        let spawner = fx.spawner(with_bwrap);
        let root = fx.owned_root(&format!("env-{with_bwrap}"), Profile::WorkspaceWrite);
        let policy = EnvPolicy::new(["ANTHROPIC_API_KEY"], ["HTTPS_PROXY"]).expect("policy");
        let env = policy.build_from(
            [
                ("PATH", "/usr/bin:/bin"),
                ("ANTHROPIC_API_KEY", "sk-test"),
                ("OPENAI_API_KEY", "leak-1"),
                ("AWS_SECRET_ACCESS_KEY", "leak-2"),
                ("WARDEN_DEPTH", "0"),
                ("LD_PRELOAD", "/evil.so"),
            ]
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        let mut spec = fx.spec("env", root, "");
        spec.program = "env".into();
        spec.args = vec![];
        spec.env = env;
        let (code, out, err) = run(&spawner, spec).await;
        assert_eq!(code, Some(0), "stderr: {err}");
        let keys: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
        assert!(
            out.lines().any(|l| l == "ANTHROPIC_API_KEY=sk-test"),
            "{out}"
        );
        assert!(out.lines().any(|l| l == "WARDEN_DEPTH=1"), "{out}");
        assert!(keys.contains(&"WARDEN_TREE"));
        for absent in [
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "LD_PRELOAD",
            "HTTPS_PROXY",
        ] {
            assert!(
                !keys.contains(&absent),
                "{absent} leaked (bwrap={with_bwrap}): {out}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_inside_its_cgroup_with_limits_where_controllers_exist() {
    let fx = Fixture::new("cg");
    let Some(base) = fx.cgroups.clone() else {
        println!("SKIP: no writable cgroup v2 hierarchy on this host");
        return;
    };
    let spawner = fx.spawner(false);
    let root = fx.owned_root("cg", Profile::WorkspaceWrite);
    let mut spec = fx.spec("cg", root, "cat /proc/self/cgroup");
    spec.limits = Limits {
        memory_max: Some(256 << 20),
        pids_max: Some(64),
        cpu_max: Some((50_000, 100_000)),
    };
    let mut agent = spawner.spawn(spec).expect("spawn");
    let outcome = agent.containment.limits.clone();
    let cg = agent.containment.cgroup.clone().expect("cgroup");
    assert!(cg.starts_with(base.path()));
    let controllers = base.controllers();
    for (c, file) in [
        ("memory", "memory.max"),
        ("pids", "pids.max"),
        ("cpu", "cpu.max"),
    ] {
        if controllers.iter().any(|x| x == c) {
            assert!(outcome.applied.contains(&file.to_string()));
        } else {
            println!("SKIP-PART: cgroup v2 controller {c} missing here; {file} not applied");
            assert!(outcome.unavailable.contains(&file.to_string()));
        }
    }
    let mut out = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut agent.stdout, &mut out)
        .await
        .expect("read");
    let rel = cg
        .strip_prefix(
            warden_sandbox::host_features()
                .cgroup2_mount
                .expect("mount"),
        )
        .expect("under mount");
    assert!(
        out.lines().any(|l| l == format!("0::/{}", rel.display())),
        "child not in its cgroup: {out}"
    );
    let report = agent.tree.kill(KillOptions::default()).await.expect("kill");
    assert!(report.cgroup_removed);
}

/// The working directory is opened beneath the root and entered by its fd: inside it works
/// (also through a symlink that stays inside), a symlink to a host directory or `..` is refused
/// before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_working_directory_is_entered_beneath_the_root_only() {
    let fx = Fixture::new("cwd");
    let spawner = warden_sandbox::Spawner::new(&fx.store, None, None).expect("spawner");
    let b = fx.owned_root("cwd", Profile::WorkspaceWrite);
    let root = b.root.clone();
    std::fs::create_dir_all(root.join("sub/dir")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("inner")).unwrap();
    let outside = fx.state_dir().join("outside-cwd");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    for (cwd, expect) in [("sub/dir", "sub/dir"), ("inner/dir", "sub/dir")] {
        let mut spec = fx.spec("cwd", b.clone(), "pwd -P");
        spec.cwd = Some(cwd.into());
        let (code, out, err) = run(&spawner, spec).await;
        assert_eq!(code, Some(0), "{cwd}: {err}");
        assert_eq!(
            std::path::Path::new(out.trim()),
            std::fs::canonicalize(root.join(expect)).unwrap(),
            "{cwd}"
        );
    }
    for cwd in ["out", "..", "sub/../.."] {
        let mut spec = fx.spec("cwd", b.clone(), "pwd -P");
        spec.cwd = Some(cwd.into());
        match spawner.spawn(spec) {
            Err(SandboxError::InvalidInput(m)) => assert!(m.contains("working directory"), "{m}"),
            Err(e) => panic!("{cwd}: unexpected error {e}"),
            Ok(_) => panic!("{cwd}: a working directory outside the root was entered"),
        }
    }
}
