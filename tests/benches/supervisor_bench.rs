//! Supervisor figures, printed (not asserted):
//!
//! * the permission round trip as the scripted agent measures it (agent -> supervisor -> policy
//!   -> supervisor -> agent), p50/p99 over 10,000 requests in one turn;
//! * the supervisor's RSS per idle conversation with 200 open (the agents' memory excluded: they
//!   are separate processes).
//!
//! Run: `cargo bench -p warden-e2e --bench supervisor_bench` (release binaries are built first).
//! `WARDEN_BENCH_REQUESTS` and `WARDEN_BENCH_CONVERSATIONS` override the counts;
//! `WARDEN_BENCH_AUDIT_SYNC=0` turns the policy's fsync off, `WARDEN_BENCH_WORKERS=n` sets the
//! supervisor's runtime threads, `WARDEN_BENCH_AGENT=PATH` runs another scripted-agent build.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU time of a process, in microseconds.
fn cpu_us(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3; utime and stime are fields 14 and 15.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000 / hz
}

/// The scripted agents serving the conversation rooted at `root` (host PIDs; under bubblewrap the
/// agent is a grandchild, so they are found by working directory, not by parentage).
fn agent_pids(root: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with("warden-scripted"))
                && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == root)
        })
        .collect()
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The release daemons for a release run of this bench.
fn binaries() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-policy",
        "warden-supervisor",
        "warden-fs-servant",
        "warden-scripted-agent",
        "warden-gateway",
    ]);
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    binaries();
    let requests = env_num("WARDEN_BENCH_REQUESTS", 10_000);
    let convs = env_num("WARDEN_BENCH_CONVERSATIONS", 200);
    let parent = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("svb");

    // --- permission round trip ---
    let d = Deployment::new_in(&parent, Options::default());
    let scen = d.dir.path().join("bench-scenario.json");
    let step = serde_json::json!({"type": "tool", "kind": "edit", "path": "bench.txt",
        "content": "x", "ask": true, "via": "direct", "vocabulary": "claude-0.101"});
    let steps: Vec<_> = (0..requests).map(|_| step.clone()).collect();
    std::fs::write(
        &scen,
        serde_json::json!({"report": "perm.jsonl", "steps": steps}).to_string(),
    )
    .unwrap();
    // WARDEN_BENCH_AGENT: another build of the scripted agent, to measure a change to it alone.
    let agent = std::env::var_os("WARDEN_BENCH_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| warden_e2e::bin_dir().join("warden-scripted-agent"));
    let sets = [
        format!("agents.bench.command=\"{}\"", agent.display()),
        "agents.bench.supervised_mode=\"default\"".to_string(),
        "agents.bench.budget_in_prompt=false".to_string(),
        "agents.bench.env=[\"WARDEN_SCENARIO\"]".to_string(),
        format!(
            "agents.bench.set_env.WARDEN_SCENARIO=\"{}\"",
            scen.display()
        ),
        // Under bubblewrap (the default) the agent reads only what the operator binds.
        format!("agents.bench.read_only_paths=[\"{}\"]", scen.display()),
        "limits.output_bytes=1073741824".to_string(),
        "limits.turn_timeout_secs=3600".to_string(),
        // Thousands of permissions in one turn are the measurement, not a flood.
        "limits.permissions_per_turn=0".to_string(),
    ];
    let mut d = d;
    d.opts.sets = sets
        .iter()
        .map(|s| ("supervisor".to_string(), s.clone()))
        .collect();
    // The policy's audit log is fsynced per decision by default; WARDEN_BENCH_AUDIT_SYNC=0
    // measures without that disk flush, to show where the time goes.
    let audit_sync = std::env::var("WARDEN_BENCH_AUDIT_SYNC")
        .map(|v| v != "0")
        .unwrap_or(true);
    if let Ok(w) = std::env::var("WARDEN_BENCH_WORKERS") {
        d.opts
            .sets
            .push(("supervisor".into(), format!("runtime.worker_threads={w}")));
    }
    if !audit_sync {
        d.opts
            .sets
            .push(("policy".into(), "audit.sync=false".into()));
    }
    println!(
        "policy audit.sync={audit_sync}  supervisor runtime.worker_threads={}",
        std::env::var("WARDEN_BENCH_WORKERS").unwrap_or_else(|_| "default".into())
    );
    d.start("policy").await;
    d.start("supervisor").await;
    let mut c = SupervisorServiceClient::new(d.channel("supervisor"));
    let mut open = pb::OpenConversationRequest {
        context_id: "bench".into(),
        agent: "bench".into(),
        profile: pb::Profile::WorkspaceWrite as i32,
        principal: "bench".into(),
        verb: "implement".into(),
        ..Default::default()
    };
    let info = c
        .open_conversation(open.clone())
        .await
        .unwrap()
        .into_inner();
    let sup_pid = d.daemon("supervisor").map(|x| x.pid()).unwrap_or(0);
    let pol_pid = d.daemon("policy").map(|x| x.pid()).unwrap_or(0);
    let (sup_cpu0, pol_cpu0) = (cpu_us(sup_pid), cpu_us(pol_pid));
    let agents = agent_pids(Path::new(&info.root));
    let own_pid = std::process::id() as i32;
    let agent_cpu = || agents.iter().map(|p| cpu_us(*p)).sum::<u64>();
    let (agent_cpu0, own_cpu0) = (agent_cpu(), cpu_us(own_pid));
    let t0 = Instant::now();
    let mut s = c
        .run_turn(pb::RunTurnRequest {
            context_id: "bench".into(),
            turn_id: "bench".into(),
            text: "run the bench scenario".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut allowed = 0usize;
    let mut policy_us: Vec<u64> = Vec::new();
    let mut stop_reason = String::new();
    while let Some(ev) = s.message().await.unwrap() {
        match ev.event {
            Some(Event::Permission(p)) => {
                policy_us.push(p.policy_latency_micros);
                if p.verdict == pb::Verdict::Allow as i32 {
                    allowed += 1;
                }
            }
            Some(Event::Stop(st)) => {
                stop_reason = st.stop_reason;
                break;
            }
            _ => {}
        }
    }
    let wall = t0.elapsed();
    let sup_cpu = cpu_us(sup_pid).saturating_sub(sup_cpu0);
    let pol_cpu = cpu_us(pol_pid).saturating_sub(pol_cpu0);
    let agent_cpu = agent_cpu().saturating_sub(agent_cpu0);
    let own_cpu = cpu_us(own_pid).saturating_sub(own_cpu0);
    let report =
        std::fs::read_to_string(Path::new(&info.root).join("perm.jsonl")).unwrap_or_default();
    let mut rtts: Vec<u64> = report
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["rtt_us"].as_u64())
        .collect();
    rtts.sort_unstable();
    println!(
        "permission round trip (scripted agent's measure, agent -> supervisor -> policy -> supervisor -> agent)"
    );
    println!(
        "  requests={} allowed={} stop={stop_reason} wall={:.1}s",
        rtts.len(),
        allowed,
        wall.as_secs_f64()
    );
    println!(
        "  p50={} us  p90={} us  p99={} us  max={} us   (targets: p50 <= 400 us, p99 <= 2000 us)",
        pct(&rtts, 0.50),
        pct(&rtts, 0.90),
        pct(&rtts, 0.99),
        rtts.last().copied().unwrap_or(0)
    );
    let n = (rtts.len() as u64).max(1);
    println!(
        "  CPU per request (whole turn, 2 cores shared): supervisor={} us  policy={} us  agent={} us  bench client (RunTurn stream)={} us",
        sup_cpu / n,
        pol_cpu / n,
        agent_cpu / n,
        own_cpu / n
    );
    let st = c
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .details;
    let g = |k: &str| st.get(k).cloned().unwrap_or_default();
    println!(
        "  supervisor's own view (Status): permission handler p50={} us p99={} us; Decide p50={} us p99={} us",
        g("permission_handler_p50_us"),
        g("permission_handler_p99_us"),
        g("decide_p50_us"),
        g("decide_p99_us")
    );
    policy_us.sort_unstable();
    println!(
        "  of which the Decide call as the supervisor saw it: p50={} us  p99={} us",
        pct(&policy_us, 0.50),
        pct(&policy_us, 0.99)
    );
    let _ = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "bench".into(),
            ..Default::default()
        })
        .await;

    // --- RSS per idle conversation ---
    let pid = d.daemon("supervisor").map(|x| x.pid()).unwrap_or(0);
    // One warm-up conversation, so per-process one-time allocations are not counted.
    open.context_id = "warm".into();
    open.agent = String::new();
    c.open_conversation(open.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let t1 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..convs {
        let mut c = c.clone();
        let mut o = open.clone();
        o.context_id = format!("idle-{i}");
        set.spawn(async move { c.open_conversation(o).await.map(|_| ()) });
        if set.len() >= 16 {
            set.join_next().await.unwrap().unwrap().unwrap();
        }
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }
    let opened = t1.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before)) as f64 / convs as f64;
    println!("supervisor memory with {convs} idle conversations open (agents excluded)");
    println!(
        "  RSS before={before} KiB after={after} KiB  per conversation={per:.1} KiB  (target <= 300 KiB); opened in {:.1}s",
        opened.as_secs_f64()
    );
}
