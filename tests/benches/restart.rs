//! The supervisor's restart after a crash, printed (not asserted; issue 37, item 7): the
//! supervisor killed with SIGKILL while N agent trees run (each a SIGTERM-ignoring child and a
//! setsid'ed grandchild, without bubblewrap so they outlive it), then started again. Printed: the
//! time to healthy (what `d.start` waits for: both listeners answer gRPC health), until every
//! leftover process is gone, and until every leftover agent home is removed; then that a new turn
//! runs.
//!
//! Run: `cargo bench -p warden-e2e --bench restart` (`WARDEN_BENCH_TREES`, default 500;
//! `WARDEN_BENCH_ROUNDS`, default 3). The goal is healthy within 0.5 s with 500 trees.

#[path = "../tests/supervisor_support/mod.rs"]
mod supervisor_support;

use std::time::{Duration, Instant};

use supervisor_support::*;

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn homes(d: &warden_e2e::Deployment) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(state(d).join("homes"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn still_there(homes: &[std::path::PathBuf]) -> usize {
    homes
        .iter()
        .filter(|h| std::fs::symlink_metadata(h).is_ok())
        .count()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let trees = env_num("WARDEN_BENCH_TREES", 500);
    let rounds = env_num("WARDEN_BENCH_ROUNDS", 3);
    let n = (trees + 100).to_string();
    let sets: Vec<(&str, String)> = vec![
        ("supervisor", "sandbox.bubblewrap=false".into()),
        ("supervisor", "limits.kill_grace_ms=1000".into()),
        ("supervisor", format!("limits.max_active_turns={n}")),
        (
            "supervisor",
            format!("limits.max_active_turns_per_principal={n}"),
        ),
        ("supervisor", format!("limits.max_live_agents={n}")),
        ("supervisor", format!("limits.max_conversations={n}")),
        (
            "supervisor",
            format!("limits.max_open_conversations_per_principal={n}"),
        ),
    ];
    let sets: Vec<(&str, &str)> = sets.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for round in 0..rounds {
        let mut d = deploy(&sets).await;
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..trees {
            let mut c = client(&d);
            let sem = sem.clone();
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.ok();
                let ctx = format!("many-{i}");
                let s = start(&mut c, turn(&ctx, "t1", &spawn_and_hang())).await;
                let root = std::path::PathBuf::from(
                    c.open_conversation(open(&ctx, warden_proto::v1::Profile::WorkspaceWrite))
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
        let sup = d.take("supervisor").unwrap();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sup.pid()),
            nix::sys::signal::Signal::SIGKILL,
        );
        sup.crash().await;
        drop(streams);
        let leftover_homes = homes(&d);
        let homes = leftover_homes.len();
        let t0 = Instant::now();
        d.start("supervisor").await;
        let healthy = t0.elapsed();
        let gone = all_gone(&pids, Duration::from_secs(30)).await;
        let reaped = t0.elapsed();
        while still_there(&leftover_homes) > 0 && t0.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let homes_gone = t0.elapsed();
        let mut c = client(&d);
        let evs = run(&mut c, turn("after", "t1", "write after.txt")).await;
        println!(
            "round {round}: {trees} trees ({} processes, {homes} homes): healthy after {:.3} s, \
             processes gone after {:.3} s{}, homes removed after {:.3} s ({} left); a new turn: {}",
            pids.len(),
            healthy.as_secs_f64(),
            reaped.as_secs_f64(),
            if gone { "" } else { " (NOT ALL)" },
            homes_gone.as_secs_f64(),
            still_there(&leftover_homes),
            stop(&evs).stop_reason
        );
        for p in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
