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

use supervisor_support::*;
use warden_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_over_many_leftover_trees_is_healthy_at_once_and_reaps_them_in_one_grace() {
    const TREES: usize = 24;
    let mut d = deploy(&[
        ("supervisor", "sandbox.bubblewrap=false"),
        ("supervisor", "limits.kill_grace_ms=1000"),
        // All 24 turns run at once (admission would queue most of them on a small host).
        ("supervisor", "limits.max_active_turns=64"),
        ("supervisor", "limits.max_active_turns_per_principal=64"),
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
            ..Default::default()
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

/// Starts `n` hanging turns, each leaving a SIGTERM-ignoring child and a `setsid` grandchild,
/// `at_once` at a time; returns the streams (to keep the turns open) and every helper pid.
async fn many_hanging_trees(
    d: &warden_e2e::Deployment,
    n: usize,
    at_once: usize,
) -> (Vec<tonic::Streaming<pb::TurnEvent>>, Vec<i32>) {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut c = client(d);
        let sem = sem.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.ok();
            let ctx = format!("many-{i}");
            let s = start(&mut c, turn(&ctx, "t1", &spawn_and_hang())).await;
            let root = PathBuf::from(
                c.open_conversation(open(&ctx, pb::Profile::WorkspaceWrite))
                    .await
                    .unwrap()
                    .into_inner()
                    .root,
            );
            (s, wait_pids(&root.join("pids"), 2).await)
        });
    }
    let (mut streams, mut pids) = (Vec::new(), Vec::new());
    while let Some(r) = set.join_next().await {
        let (s, p) = r.expect("a tree starter panicked");
        streams.push(s);
        pids.extend(p);
    }
    (streams, pids)
}

/// SIGKILLs what a failed test would leave behind (the helpers ignore SIGTERM and, without
/// bubblewrap, outlive the deployment for their 10 minutes).
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

const MANY: usize = 500;

/// The two 500-tree tests run one after the other (1,000 trees at once would measure the
/// host, not the supervisor).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const GRACE_MS: u64 = 1000;

/// The figures are one kill grace + 1 s to stop or reap, and 1 s to healthy (measured
/// on this 2-core machine: 1.35–1.56 s and 0.15–0.5 s). The tests allow two more seconds for a
/// loaded host (other tests and builds share the cores: 3.4 s was seen so); one tree after
/// another would take 500 graces, the quadratic walk this guards against more than 10 s.
const SLACK_MS: u64 = 2000;

fn many_settings() -> Vec<(&'static str, &'static str)> {
    let mut v = many_settings_bwrap();
    v.push(("supervisor", "sandbox.bubblewrap=false"));
    v
}

/// As [`many_settings`], under bubblewrap when the host has it.
fn many_settings_bwrap() -> Vec<(&'static str, &'static str)> {
    vec![
        ("supervisor", "limits.kill_grace_ms=1000"),
        ("supervisor", "limits.max_active_turns=600"),
        // One principal's 500 hanging turns (its default share is three quarters).
        ("supervisor", "limits.max_active_turns_per_principal=600"),
        ("supervisor", "limits.max_live_agents=600"),
        ("supervisor", "limits.max_conversations=600"),
        // ... and its 500 open conversations (its default share is 384).
        (
            "supervisor",
            "limits.max_open_conversations_per_principal=600",
        ),
    ]
}

/// The figure: 500 leftover trees at start (a crash left them, all ignoring SIGTERM):
/// healthy within 1 s, every one gone within one kill grace (+ 1 s), new work runs.
#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_leftover_trees_healthy_within_a_second_and_reaped_in_one_grace() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut d = deploy(&many_settings()).await;
    let (streams, pids) = many_hanging_trees(&d, MANY, 32).await;
    let _cleanup = KillOnDrop(pids.clone());
    let sup = d.take("supervisor").unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.pid()),
        nix::sys::signal::Signal::SIGKILL,
    );
    sup.crash().await;
    drop(streams);
    let survivors: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(survivors.len() >= MANY, "{} survivors", survivors.len());
    // Each tree's agent home is left too; the restart removes them after it answers health.
    let leftover_homes: Vec<PathBuf> = std::fs::read_dir(state(&d).join("homes"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        leftover_homes.len() >= MANY,
        "{} homes",
        leftover_homes.len()
    );

    let t0 = Instant::now();
    d.start("supervisor").await;
    let healthy = t0.elapsed();
    let gone = all_gone(
        &survivors,
        Duration::from_millis(GRACE_MS + 1000 + SLACK_MS),
    )
    .await;
    let reaped = t0.elapsed();
    eprintln!(
        "{} leftover processes in {MANY} trees: healthy after {healthy:?}, reaped after {reaped:?}",
        survivors.len()
    );
    assert!(
        gone,
        "{} leftovers survive one kill grace + 1 s",
        survivors.iter().filter(|p| alive(**p)).count()
    );
    assert!(
        healthy < Duration::from_millis(1000 + SLACK_MS),
        "healthy only after {healthy:?}"
    );
    let t1 = Instant::now();
    let left = |h: &[PathBuf]| h.iter().filter(|p| p.symlink_metadata().is_ok()).count();
    while left(&leftover_homes) > 0 && t1.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left(&leftover_homes), 0, "leftover agent homes not removed");
    let mut c = client(&d);
    let evs = run(&mut c, turn("after-many", "t1", "write after.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
}

/// A graceful stop with 500 live trees that ignore SIGTERM: the supervisor exits within one
/// kill grace + 1 s and no process of any tree is left.
#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_live_trees_stop_within_one_grace() {
    stop_many(&many_settings()).await;
}

/// The same under bubblewrap (its namespace init and the agent inside each tree).
#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_live_trees_under_bubblewrap_stop_within_one_grace() {
    if warden_sandbox::find_bwrap().is_none_or(|b| !warden_sandbox::bwrap_works(&b)) {
        println!("SKIP: bubblewrap missing or not working on this host");
        return;
    }
    stop_many(&many_settings_bwrap()).await;
}

async fn stop_many(settings: &[(&'static str, &'static str)]) {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut d = deploy(settings).await;
    // The pid files hold pids as each tree sees them (under bubblewrap: its own pid
    // namespace), so the host's processes of the trees are found by their working directory.
    let _ = many_hanging_trees(&d, MANY, 32).await;
    let sandboxes = state(&d).join("sandboxes");
    let before = processes_in(&sandboxes, None);
    let _cleanup = KillOnDrop(before.clone());
    assert!(
        before.len() >= 2 * MANY,
        "{} helper processes",
        before.len()
    );
    let sup = d.take("supervisor").unwrap();
    let t0 = Instant::now();
    assert!(sup.terminate().await.success());
    let stopped = t0.elapsed();
    let left = processes_in(&sandboxes, None);
    eprintln!(
        "{} processes in {MANY} trees: stopped after {stopped:?}",
        before.len()
    );
    assert!(
        left.is_empty(),
        "{} processes outlived the stop",
        left.len()
    );
    assert!(
        stopped < Duration::from_millis(GRACE_MS + 1000 + SLACK_MS),
        "the stop took {stopped:?}"
    );
}
