//! The long-running-service soak, printed (not asserted): waves of concurrent turns through the
//! real policy and supervisor with the scripted agent, each turn asking for edit permissions.
//! For each concurrency it prints tasks/s, p50/p99 turn latency, permissions denied for lack of
//! time (`policy_unavailable` / `deadline_exceeded`; the target is 0), and the RSS and open fds
//! of each daemon at start, at the peak, and after the agents went idle and were stopped.
//!
//! Run: `cargo bench -p warden-e2e --bench soak` (release binaries are built first).
//! `WARDEN_SOAK_LEVELS=50,200,500` chooses the concurrencies, `WARDEN_SOAK_EDITS=5` the
//! permissions per turn, `WARDEN_SOAK_WAVES=2` the waves per level.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;

fn env_list(k: &str, d: &[usize]) -> Vec<usize> {
    std::env::var(k)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| d.to_vec())
}

fn status_kib(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn pct(sorted: &[u128], p: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// The release daemons for a release run of this bench.
fn binaries() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-policy",
        "warden-supervisor",
        "warden-fs-servant",
        "warden-scripted-agent",
    ]);
}

struct Sample {
    rss_kib: u64,
    fds: usize,
}

fn sample(pid: i32) -> Sample {
    Sample {
        rss_kib: status_kib(pid, "VmRSS:"),
        fds: fds(pid),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    binaries();
    let levels = env_list("WARDEN_SOAK_LEVELS", &[50, 200, 500]);
    let edits = env_list("WARDEN_SOAK_EDITS", &[5])[0];
    let waves = env_list("WARDEN_SOAK_WAVES", &[2])[0];
    let parent = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("soak");
    let top = levels.iter().copied().max().unwrap_or(50);
    println!("soak: {edits} edit permissions per turn, {waves} waves per level, levels {levels:?}");
    println!(
        "| concurrent | tasks/s | p50 ms | p99 ms | denied for time | supervisor RSS MiB start/peak/idle | fds start/peak/idle | policy RSS MiB start/peak/idle |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for level in levels {
        let opts = Options {
            sets: vec![
                (
                    "supervisor".into(),
                    format!("limits.max_conversations={}", top.max(512)),
                ),
                (
                    "supervisor".into(),
                    format!(
                        "limits.max_open_conversations_per_principal={}",
                        top.max(512)
                    ),
                ),
                (
                    "supervisor".into(),
                    format!("limits.max_live_agents={}", top.max(512)),
                ),
                ("supervisor".into(), "limits.idle_timeout_secs=2".into()),
            ],
            ..Options::default()
        };
        let mut d = Deployment::new_in(&parent, opts);
        d.start("policy").await;
        d.start("supervisor").await;
        let pid_of = |d: &mut Deployment, n: &str| {
            d.daemon(n).and_then(|x| x.child.id()).unwrap_or(0) as i32
        };
        let (sup, pol) = (pid_of(&mut d, "supervisor"), pid_of(&mut d, "policy"));
        let (s0, p0) = (sample(sup), sample(pol));
        let (mut s_peak, mut p_peak) = (sample(sup), sample(pol));
        let client = SupervisorServiceClient::new(d.channel("supervisor"));
        let steps: Vec<_> = (0..edits)
            .map(|i| {
                serde_json::json!({"type": "tool", "kind": "edit", "path": format!("f{i}.txt"),
                    "content": "x", "ask": true})
            })
            .collect();
        let text = serde_json::json!({"steps": steps}).to_string();
        let mut latencies: Vec<u128> = Vec::new();
        let mut denied_for_time = 0usize;
        let mut failures: std::collections::BTreeMap<String, usize> = Default::default();
        let t_all = Instant::now();
        for wave in 0..waves {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..level {
                let mut c = client.clone();
                let text = text.clone();
                set.spawn(async move {
                    let ctx = format!("soak-{wave}-{i}");
                    let t0 = Instant::now();
                    let req = pb::RunTurnRequest {
                        instructions: String::new(),
                        context_id: ctx.clone(),
                        turn_id: "t1".into(),
                        text,
                        message_id: "m".into(),
                        task_id: ctx.clone(),
                        timeout_seconds: 0,
                        open: Some(pb::OpenConversationRequest {
                            context_id: ctx,
                            agent: String::new(),
                            workspace: String::new(),
                            profile: pb::Profile::WorkspaceWrite as i32,
                            principal: "soak".into(),
                            verb: "implement".into(),
                            ..Default::default()
                        }),
                        groups: Vec::new(),
                        issuer: String::new(),
                    };
                    let mut late = 0;
                    let mut why = String::new();
                    let ok = match c.run_turn(req).await {
                        Ok(s) => {
                            let mut s = s.into_inner();
                            let mut stopped = false;
                            loop {
                                let ev = match s.message().await {
                                    Ok(Some(ev)) => ev,
                                    Ok(None) => {
                                        why = "the stream ended without a stop".into();
                                        break;
                                    }
                                    Err(e) => {
                                        why = format!("{:?}: {}", e.code(), e.message());
                                        break;
                                    }
                                };
                                match ev.event {
                                    Some(Event::Permission(p))
                                        if p.rule == "policy_unavailable"
                                            || p.rule == "deadline_exceeded" =>
                                    {
                                        late += 1
                                    }
                                    Some(Event::Stop(_)) => {
                                        stopped = true;
                                        break;
                                    }
                                    _ => {}
                                }
                            }
                            stopped
                        }
                        Err(e) => {
                            why = format!("{:?}: {}", e.code(), e.message());
                            false
                        }
                    };
                    (ok, t0.elapsed().as_micros(), late, why)
                });
            }
            let sampler = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let (s, p) = (sample(sup), sample(pol));
                    if s.rss_kib > s_peak.rss_kib {
                        s_peak.rss_kib = s.rss_kib;
                    }
                    s_peak.fds = s_peak.fds.max(s.fds);
                    p_peak.rss_kib = p_peak.rss_kib.max(p.rss_kib);
                }
            };
            let joined = async {
                let mut out = Vec::new();
                while let Some(r) = set.join_next().await {
                    if let Ok(r) = r {
                        out.push(r);
                    }
                }
                out
            };
            let results = tokio::select! {
                r = joined => r,
                _ = sampler => unreachable!("the sampler never ends"),
            };
            for (ok, us, late, why) in results {
                if ok {
                    latencies.push(us);
                } else {
                    *failures.entry(why).or_default() += 1;
                }
                denied_for_time += late;
            }
        }
        let elapsed = t_all.elapsed();
        // Idle: the agents stop after the (short) idle timeout; wait for it, bounded.
        let idle_deadline = Instant::now() + Duration::from_secs(30);
        let state = d_state(&d);
        while Instant::now() < idle_deadline
            && std::fs::read_dir("/proc")
                .map(|dir| {
                    dir.flatten().any(|e| {
                        std::fs::read_to_string(e.path().join("comm"))
                            .is_ok_and(|c| c.starts_with("warden-scripted"))
                            && std::fs::read_link(e.path().join("cwd"))
                                .is_ok_and(|c| c.starts_with(&state))
                    })
                })
                .unwrap_or(false)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (s_idle, p_idle) = (sample(sup), sample(pol));
        latencies.sort_unstable();
        let done = latencies.len();
        println!(
            "| {level} | {:.1} | {:.1} | {:.1} | {denied_for_time} | {:.1}/{:.1}/{:.1} | {}/{}/{} | {:.1}/{:.1}/{:.1} |",
            done as f64 / elapsed.as_secs_f64(),
            pct(&latencies, 0.5) as f64 / 1000.0,
            pct(&latencies, 0.99) as f64 / 1000.0,
            s0.rss_kib as f64 / 1024.0,
            s_peak.rss_kib as f64 / 1024.0,
            s_idle.rss_kib as f64 / 1024.0,
            s0.fds,
            s_peak.fds,
            s_idle.fds,
            p0.rss_kib as f64 / 1024.0,
            p_peak.rss_kib as f64 / 1024.0,
            p_idle.rss_kib as f64 / 1024.0,
        );
        if done < level * waves {
            println!(
                "  ({} of {} turns did not reach a stop)",
                level * waves - done,
                level * waves
            );
            for (why, n) in &failures {
                println!("    {n} x {why}");
            }
        }
    }
}

fn d_state(d: &Deployment) -> PathBuf {
    d.layout.state_of("supervisor")
}
