//! Supervisor end to end, the long-running-service issue's finding 2 and stop/start at any
//! count: after a crash that leaves many process trees ignoring SIGTERM, a restarted supervisor
//! is healthy at once (leftovers are reaped in the background, all in one kill grace, and new
//! agents wait for that), and a graceful stop releases every lease.
//!
//! Without bubblewrap, so that trees outlive a crashed supervisor (under bubblewrap
//! `--die-with-parent` takes them down with it).

mod supervisor_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

/// A turn that leaves a SIGTERM-ignoring child and a setsid'ed grandchild behind and hangs.
fn spawn_and_hang() -> String {
    scenario(json!({"on_cancel": "never", "steps": [
        {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
        {"type": "hang"}]}))
}

async fn wait_pids(file: &std::path::Path, n: usize) -> Vec<i32> {
    for _ in 0..400 {
        let p = pids_in(file);
        if p.len() >= n {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("helpers did not start: {:?}", pids_in(file));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_over_many_leftover_trees_is_healthy_at_once_and_reaps_them_in_one_grace() {
    const TREES: usize = 24;
    let mut d = deploy(&[
        ("supervisor", "sandbox.bubblewrap=false"),
        ("supervisor", "limits.kill_grace_ms=1000"),
        // All 24 turns run at once (admission would queue most of them on a small host).
        ("supervisor", "limits.max_active_turns=64"),
    ])
    .await;
    let mut c = client(&d);
    let mut streams = Vec::new();
    let mut pids = Vec::new();
    for i in 0..TREES {
        let ctx = format!("left-{i}");
        streams.push(start(&mut c, turn(&ctx, "t1", &spawn_and_hang())).await);
        let root = PathBuf::from(
            c.open_conversation(open(&ctx, pb::Profile::WorkspaceWrite))
                .await
                .unwrap()
                .into_inner()
                .root,
        );
        pids.extend(wait_pids(&root.join("pids"), 2).await);
    }
    let sup = d.take("supervisor").unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.pid()),
        nix::sys::signal::Signal::SIGKILL,
    );
    sup.crash().await;
    drop(streams);
    let survivors: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        survivors.len() >= TREES,
        "the crash should leave the TERM-ignoring helpers: {survivors:?}"
    );

    let t0 = Instant::now();
    d.start("supervisor").await;
    let healthy = t0.elapsed();
    // Every tree ignores SIGTERM: one at a time that is TREES x the grace; at once, one grace.
    assert!(
        all_gone(&survivors, Duration::from_millis(1000 + 3000)).await,
        "leftovers survive one kill grace after the restart: {:?}",
        survivors.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    let reaped = t0.elapsed();
    eprintln!(
        "{} leftover processes in {TREES} trees: healthy after {healthy:?}, all reaped after {reaped:?}",
        survivors.len()
    );
    assert!(
        healthy < Duration::from_secs(3),
        "healthy only after {healthy:?}: reaping held up the listeners"
    );
    // New work after the restart runs (its agent waited for the reaper).
    let mut c = client(&d);
    let evs = run(&mut c, turn("after", "t1", "write after.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_releases_every_lease_and_keeps_the_roots() {
    let mut d = deploy(&[]).await;
    let mut c = client(&d);
    let mut roots = Vec::new();
    for i in 0..3 {
        let info = c
            .open_conversation(open(&format!("lease-{i}"), pb::Profile::WorkspaceWrite))
            .await
            .unwrap()
            .into_inner();
        roots.push(PathBuf::from(info.root));
    }
    let store_dir = state(&d).join("store");
    let sup = d.take("supervisor").unwrap();
    assert!(sup.terminate().await.success());
    let store = warden_store::Store::open(&store_dir).unwrap();
    let leases = warden_sandbox::Leases::open(&store)
        .unwrap()
        .list()
        .unwrap();
    assert!(
        leases.is_empty(),
        "leases left by a graceful stop: {leases:?}"
    );
    // A stop is not the end of a conversation: the context's files wait for its next task.
    for r in &roots {
        assert!(r.is_dir(), "a graceful stop removed {}", r.display());
    }
}

/// Zombie children of the supervisor (it is the subreaper: bubblewrap's namespace init, after a
/// probe or an agent's exit, is re-parented to it and nobody else waits for it).
fn zombie_children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let mut rest = stat.rsplit(')').next().unwrap_or("").split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|x| x.parse::<i32>().ok()));
        if state == Some("Z") && ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// The long-running-service issue's finding 6: a `[bwrap] <defunct>` lived as long as the
/// supervisor. Orphaned zombies are collected while it runs.
#[tokio::test(flavor = "multi_thread")]
async fn no_zombie_outlives_a_moment_under_the_supervisor() {
    let mut d = deploy(&[]).await;
    let pid = d.daemon("supervisor").and_then(|s| s.child.id()).unwrap() as i32;
    let mut c = client(&d);
    for i in 0..3 {
        let evs = run(&mut c, turn(&format!("z-{i}"), "t1", "write a.txt")).await;
        assert_eq!(stop(&evs).stop_reason, "end_turn");
        c.close_conversation(pb::CloseConversationRequest {
            context_id: format!("z-{i}"),
        })
        .await
        .unwrap();
    }
    let t0 = Instant::now();
    let mut left = zombie_children(pid);
    while !left.is_empty() && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = zombie_children(pid);
    }
    assert!(
        left.is_empty(),
        "zombie children of the supervisor: {left:?}"
    );
}
