//! warden against the field, side by side in one run (issue 17), printed (not asserted).
//!
//! The same stdlib Python ACP agent (`tests/bench_agents/perm_agent.py`) asks N sequential edit
//! permissions and times each round trip itself; it is driven, interleaved, round after round, by
//!
//! * **acpx** 0.19.1 `--approve-all` (installed from npm into `<target>/npm/acpx-0.19.1` when
//!   missing; without node/npm the bench says so and leaves its row out);
//! * **raw floor**: `tests/bench_agents/raw_client.py`, a Python ACP client that approves at once;
//! * **warden**, `audit.sync = true` (the default) and `audit.sync = false`: an A2A
//!   `message:stream` to the real gateway -> supervisor -> agent, each permission decided by the
//!   real warden-policy over gRPC.
//!
//! Each statistic is the median over the rounds. CPU is utime + stime from `/proc/<pid>/stat`,
//! sampled every 5 ms and taken at the agent's own loop start/end (same monotonic clock), divided
//! by the permissions. Also printed: the machine's `fdatasync` latency, spawn -> first permission
//! answered, A2A events/s end to end (and the gateway's CPU per relayed event), supervisor RSS
//! per idle conversation, and close/kill latency for a cooperative and a TERM-ignoring tree.
//!
//! Run: `cargo bench -p warden-e2e --bench vs_acpx` (release daemons are built first).
//! `WARDEN_VS_N` permissions per run (2000), `WARDEN_VS_ROUNDS` (3), `WARDEN_VS_CHUNKS` streamed
//! chunks (10000), `WARDEN_VS_IDLE` idle conversations (100), `WARDEN_VS_KILLS` closes per kind
//! (3). `WARDEN_VS_ONLY` and `WARDEN_VS_EXTRAS` narrow a run (see `main`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;

const ACPX_VERSION: &str = "0.19.1";

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// CLOCK_MONOTONIC in ns: the clock Python's `time.monotonic_ns` reads, so the agent's
/// timestamps compare with the bench's.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// User + system CPU time of a process, in microseconds (None once it is gone).
fn cpu_us(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit(')').next()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000 / hz)
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

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Samples the CPU time (and the largest RSS) of a fixed set of processes every 5 ms on its own
/// thread, with the monotonic time of each sample.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Samples>,
}

#[derive(Default)]
struct Samples {
    at: Vec<(u64, Vec<Option<u64>>)>,
    max_rss_kib: Vec<u64>,
}

impl Sampler {
    fn start(pids: Vec<i32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Samples {
                max_rss_kib: vec![0; pids.len()],
                ..Default::default()
            };
            loop {
                let t = mono_ns();
                let cpu: Vec<Option<u64>> = pids.iter().map(|p| cpu_us(*p)).collect();
                out.at.push((t, cpu));
                for (i, p) in pids.iter().enumerate() {
                    out.max_rss_kib[i] = out.max_rss_kib[i].max(status_kib(*p, "VmRSS:"));
                }
                if s.load(Ordering::Relaxed) {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

impl Samples {
    /// CPU µs of process `i` between the samples nearest to `from` and `to` (ns).
    fn cpu_between(&self, i: usize, from: u64, to: u64) -> u64 {
        let near = |t: u64| {
            self.at
                .iter()
                .filter_map(|(at, v)| v.get(i).copied().flatten().map(|c| (at.abs_diff(t), c)))
                .min_by_key(|(d, _)| *d)
                .map(|(_, c)| c)
                .unwrap_or(0)
        };
        near(to).saturating_sub(near(from))
    }
}

/// What the agent wrote about one run.
struct Report {
    rtt_us: Vec<u64>,
    first_answer_ns: u64,
    loop_start_ns: u64,
    loop_end_ns: u64,
    agent_cpu_us: u64,
    allowed: u64,
}

fn read_report(path: &Path) -> Result<Report, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut rtt_us: Vec<u64> = v["rtt_us"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    rtt_us.sort_unstable();
    Ok(Report {
        rtt_us,
        first_answer_ns: n("first_answer_ns"),
        loop_start_ns: n("loop_start_ns"),
        loop_end_ns: n("loop_end_ns"),
        agent_cpu_us: n("agent_cpu_end_us").saturating_sub(n("agent_cpu_start_us")),
        allowed: v["answers"]["allow-once"].as_u64().unwrap_or(0),
    })
}

/// One client's result in one round.
struct Run {
    p50: u64,
    p99: u64,
    p999: u64,
    count: usize,
    allowed: u64,
    /// (process, CPU µs per permission)
    cpu: Vec<(String, f64)>,
    agent_cpu: f64,
    first_ms: f64,
    rss_mib: Option<f64>,
}

impl Run {
    fn of(r: &Report, s: &Samples, names: &[&str], t0: u64) -> Run {
        let n = r.rtt_us.len().max(1) as f64;
        let cpu = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    name.to_string(),
                    s.cpu_between(i, r.loop_start_ns, r.loop_end_ns) as f64 / n,
                )
            })
            .collect();
        Run {
            p50: pct(&r.rtt_us, 0.50),
            p99: pct(&r.rtt_us, 0.99),
            p999: pct(&r.rtt_us, 0.999),
            count: r.rtt_us.len(),
            allowed: r.allowed,
            cpu,
            agent_cpu: r.agent_cpu_us as f64 / n,
            first_ms: r.first_answer_ns.saturating_sub(t0) as f64 / 1e6,
            rss_mib: None,
        }
    }
}

struct Env {
    python: PathBuf,
    agent: PathBuf,
    raw_client: PathBuf,
    n: usize,
    work: PathBuf,
}

impl Env {
    fn fresh_dir(&self, tag: &str) -> PathBuf {
        tempfile::Builder::new()
            .prefix(tag)
            .tempdir_in(&self.work)
            .map(|d| d.keep())
            .unwrap_or_else(|e| panic!("tempdir in {}: {e}", self.work.display()))
    }
}

/// acpx's entry point under `<target>/npm/acpx-<version>`, installing it when missing; or why
/// it cannot run here.
fn acpx(target: &Path) -> Result<(PathBuf, PathBuf), String> {
    let node = which("node").ok_or("node is not installed (the acpx row needs node and npm)")?;
    let dir = target.join(format!("npm/acpx-{ACPX_VERSION}"));
    let entry = dir.join("node_modules/acpx/dist/cli.js");
    if !entry.is_file() {
        let npm = which("npm").ok_or("npm is not installed (needed once to install acpx)")?;
        println!("installing acpx@{ACPX_VERSION} into {}", dir.display());
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let st = std::process::Command::new(npm)
            .args(["install", "--prefix"])
            .arg(&dir)
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .arg(format!("acpx@{ACPX_VERSION}"))
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if !st.success() || !entry.is_file() {
            return Err(format!("npm install acpx@{ACPX_VERSION} failed ({st})"));
        }
    }
    Ok((node, entry))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a client process (acpx or the raw floor) to completion, sampling its CPU.
async fn run_process(
    env: &Env,
    mut cmd: tokio::process::Command,
    cwd: &Path,
) -> Result<Run, String> {
    let t0 = mono_ns();
    let mut child = cmd
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let sampler = Sampler::start(vec![pid]);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(900), e.read_to_string(&mut err)).await;
    }
    let st = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .map_err(|_| "the client did not exit".to_string())?
        .map_err(|e| e.to_string())?;
    let s = sampler.finish();
    let r = read_report(&cwd.join("perm-report.json"))
        .map_err(|e| format!("{e} (client {st}; stderr: {})", err.trim()))?;
    if r.rtt_us.len() != env.n {
        return Err(format!(
            "{} of {} permissions answered (client {st}; stderr: {})",
            r.rtt_us.len(),
            env.n,
            err.trim()
        ));
    }
    let mut run = Run::of(&r, &s, &["client"], t0);
    run.rss_mib = s.max_rss_kib.first().map(|k| *k as f64 / 1024.0);
    Ok(run)
}

async fn run_acpx(env: &Env, node: &Path, entry: &Path) -> Result<Run, String> {
    let cwd = env.fresh_dir("acpx");
    let agent = format!(
        "{} {} --n {}",
        env.python.display(),
        env.agent.display(),
        env.n
    );
    let mut cmd = tokio::process::Command::new(node);
    cmd.arg(entry)
        .args(["--agent", &agent, "--approve-all", "--cwd"])
        .arg(&cwd)
        .args(["--format", "quiet", "exec", "edit bench.txt"]);
    run_process(env, cmd, &cwd).await
}

async fn run_raw(env: &Env) -> Result<Run, String> {
    let cwd = env.fresh_dir("raw");
    let mut cmd = tokio::process::Command::new(&env.python);
    cmd.arg(&env.raw_client)
        .arg("--cwd")
        .arg(&cwd)
        .arg("--")
        .arg(&env.python)
        .arg(&env.agent)
        .args(["--n", &env.n.to_string()]);
    run_process(env, cmd, &cwd).await
}

const STOP_PATIENCE: Duration = Duration::from_secs(120);

/// A running warden (policy, supervisor, gateway) with the bench's agents configured.
struct Warden {
    d: Deployment,
    pids: Vec<i32>,
    seen: HashSet<PathBuf>,
    contexts: usize,
}

const DAEMONS: [&str; 3] = ["gateway", "supervisor", "policy"];

impl Warden {
    async fn start(env: &Env, parent: &Path, audit_sync: bool, chunks: usize) -> Warden {
        let mut d = Deployment::new_in(parent, Options::default());
        let py = env.python.display().to_string();
        let script = env.agent.display().to_string();
        let dir = env
            .agent
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let n = env.n.to_string();
        let chunks = chunks.to_string();
        let agents: [(&str, Vec<&str>); 4] = [
            ("perm", vec![&script, "--n", &n]),
            ("perm-stream", vec![&script, "--chunks", &chunks]),
            ("perm-coop", vec![&script, "--n", "1"]),
            ("perm-hostile", vec![&script, "--n", "1", "--hostile"]),
        ];
        let mut sets = vec![
            "limits.output_bytes=1073741824".to_string(),
            "limits.turn_timeout_secs=3600".to_string(),
            // Thousands of permissions in one turn are the measurement, not a flood.
            "limits.permissions_per_turn=0".to_string(),
            "limits.max_conversations=1024".to_string(),
            "limits.max_open_conversations_per_principal=1024".to_string(),
            "limits.max_live_agents=1024".to_string(),
        ];
        for (name, args) in agents {
            sets.push(format!("agents.{name}.command={py:?}"));
            sets.push(format!("agents.{name}.args={}", json!(args)));
            sets.push(format!("agents.{name}.supervised_mode=\"default\""));
            sets.push(format!("agents.{name}.budget_in_prompt=false"));
            sets.push(format!("agents.{name}.read_only_paths=[{dir:?}]"));
        }
        d.opts.sets = sets.into_iter().map(|s| ("supervisor".into(), s)).collect();
        // WARDEN_VS_SETS="daemon:key=value ...": further settings (e.g. a longer Decide
        // deadline for a daemon run under a profiler).
        for kv in std::env::var("WARDEN_VS_SETS")
            .unwrap_or_default()
            .split_whitespace()
        {
            if let Some((daemon, set)) = kv.split_once(':') {
                d.opts.sets.push((daemon.into(), set.into()));
            }
        }
        if !audit_sync {
            d.opts
                .sets
                .push(("policy".into(), "audit.sync=false".into()));
        }
        for name in ["policy", "supervisor", "gateway"] {
            d.start(name).await;
        }
        let pids: Vec<i32> = DAEMONS
            .iter()
            .map(|n| d.daemon(n).map(|x| x.pid()).unwrap_or(0))
            .collect();
        // For a profiler to attach to (`perf record -p`) while the rounds run.
        println!(
            "warden (audit.sync = {audit_sync}) pids: {}",
            DAEMONS
                .iter()
                .zip(&pids)
                .map(|(n, p)| format!("{n} {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Warden {
            d,
            pids,
            seen: HashSet::new(),
            contexts: 0,
        }
    }

    /// Stops the daemons with SIGTERM, gateway first, waiting for each (a profiler wrapped
    /// around one writes its output at exit).
    async fn stop(mut self) {
        for name in DAEMONS {
            if let Some(mut d) = self.d.take(name) {
                let pid = nix::unistd::Pid::from_raw(d.pid());
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                if tokio::time::timeout(STOP_PATIENCE, d.child.wait())
                    .await
                    .is_err()
                {
                    println!("warden-{name} did not stop within {STOP_PATIENCE:?}");
                }
            }
        }
    }

    /// One A2A `message:stream` in a new context to `agent`; returns the SSE `data:` payloads
    /// and the monotonic time the request was written.
    async fn stream(
        &mut self,
        agent: &str,
        text: &str,
    ) -> Result<(Vec<String>, u64, Vec<u64>), String> {
        self.contexts += 1;
        let body = json!({"message": {"messageId": format!("m-{}", self.contexts),
            "role": "ROLE_USER", "parts": [{"text": text}], "metadata": {"agent": agent}}})
        .to_string();
        let req = format!(
            "POST /a2a/rest/message:stream HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\nA2A-Version: 1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.d.http,
            self.d.token(),
            body.len()
        );
        let mut sock = tokio::net::TcpStream::connect(&self.d.http)
            .await
            .map_err(|e| format!("connect to the gateway: {e}"))?;
        let t0 = mono_ns();
        sock.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut tmp = vec![0u8; 65536];
        // Arrival time of each read that carried an artifact (for events/s), then of the end.
        let mut reads = Vec::new();
        loop {
            let n = tokio::time::timeout(Duration::from_secs(900), sock.read(&mut tmp))
                .await
                .map_err(|_| "the A2A stream stalled".to_string())?
                .map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            if tmp[..n].windows(14).any(|w| w == b"artifactUpdate") {
                reads.push(mono_ns());
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        // The stream's end (its last status), after the last artifact.
        reads.push(mono_ns());
        let text = String::from_utf8_lossy(&buf);
        let data = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect();
        Ok((data, t0, reads))
    }

    /// The agent's report of the run that just ended (the newest one not read before).
    fn take_report(&mut self) -> Option<PathBuf> {
        let mut found = Vec::new();
        find(
            &self.d.layout.state_of("supervisor"),
            "perm-report.json",
            &mut found,
        );
        let p = found.into_iter().find(|p| !self.seen.contains(p))?;
        self.seen.insert(p.clone());
        Some(p)
    }

    async fn run_perm(&mut self, env: &Env) -> Result<Run, String> {
        let sampler = Sampler::start(self.pids.clone());
        let (events, t0, _) = self.stream("perm", "edit bench.txt").await?;
        let s = sampler.finish();
        let last = events.last().cloned().unwrap_or_default();
        let path = self
            .take_report()
            .ok_or_else(|| format!("no agent report; last A2A event: {last}"))?;
        let r = read_report(&path)?;
        if r.rtt_us.len() != env.n || !last.contains("TASK_STATE_COMPLETED") {
            return Err(format!(
                "{} of {} permissions answered; last A2A event: {last}",
                r.rtt_us.len(),
                env.n
            ));
        }
        Ok(Run::of(&r, &s, &DAEMONS, t0))
    }
}

fn find(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_symlink() {
            continue;
        }
        if p.is_dir() {
            find(&p, name, out);
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
}

/// p50/p99 of a 4 KiB append + `fdatasync` on the filesystem the policy's audit lives on.
fn fdatasync_us(dir: &Path) -> (u64, u64) {
    use std::io::Write;
    let path = dir.join("fdatasync-probe");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return (0, 0);
    };
    let block = vec![b'x'; 4096];
    let mut v = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        if f.write_all(&block).and_then(|_| f.sync_data()).is_err() {
            break;
        }
        v.push(t.elapsed().as_micros() as u64);
    }
    let _ = std::fs::remove_file(&path);
    v.sort_unstable();
    (pct(&v, 0.5), pct(&v, 0.99))
}

/// Host PIDs of the Python agents whose working directory is `root` (under bubblewrap they are
/// grandchildren of the supervisor, so they are found by working directory).
fn agent_pids(root: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with("python"))
                && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == root)
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for this purpose: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Opens a conversation with `agent`, then closes it: the close's latency and how long until
/// every process of the tree was gone (ms).
async fn kill_latency(w: &Warden, agent: &str, i: usize) -> Result<(f64, f64, usize), String> {
    let mut c = SupervisorServiceClient::new(w.d.channel("supervisor"));
    let ctx = format!("kill-{agent}-{i}");
    let info = c
        .open_conversation(pb::OpenConversationRequest {
            context_id: ctx.clone(),
            agent: agent.into(),
            profile: pb::Profile::WorkspaceWrite as i32,
            principal: "bench".into(),
            verb: "implement".into(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("open {agent}: {e}"))?
        .into_inner();
    let root = PathBuf::from(&info.root);
    let want = if agent.contains("hostile") { 2 } else { 1 };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pids = agent_pids(&root);
    while pids.len() < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        pids = agent_pids(&root);
    }
    if pids.len() < want {
        return Err(format!(
            "{agent}: found {} of {want} agent processes",
            pids.len()
        ));
    }
    let t = Instant::now();
    c.close_conversation(pb::CloseConversationRequest {
        context_id: ctx.clone(),
        ..Default::default()
    })
    .await
    .map_err(|e| format!("close {agent}: {e}"))?;
    let answered = t.elapsed().as_secs_f64() * 1e3;
    while pids.iter().any(|p| alive(*p)) && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let gone = t.elapsed().as_secs_f64() * 1e3;
    Ok((answered, gone, pids.len()))
}

/// Supervisor RSS per idle conversation (agents excluded: they are their own processes).
async fn idle_rss(w: &mut Warden, convs: usize) -> Result<(f64, u64, u64), String> {
    let c = SupervisorServiceClient::new(w.d.channel("supervisor"));
    let pid = w.pids[1];
    let open = |ctx: String| pb::OpenConversationRequest {
        context_id: ctx,
        agent: "scripted".into(),
        profile: pb::Profile::WorkspaceWrite as i32,
        principal: "bench".into(),
        verb: "implement".into(),
        ..Default::default()
    };
    c.clone()
        .open_conversation(open("idle-warm".into()))
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = status_kib(pid, "VmRSS:");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..convs {
        let mut c = c.clone();
        let o = open(format!("idle-{i}"));
        set.spawn(async move { c.open_conversation(o).await.map(|_| ()) });
        if set.len() >= 8
            && let Some(r) = set.join_next().await
        {
            r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        }
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = status_kib(pid, "VmRSS:");
    Ok((
        after.saturating_sub(before) as f64 / convs.max(1) as f64,
        before,
        after,
    ))
}

fn fmt_cpu(r: &[&Run]) -> String {
    let Some(first) = r.first() else {
        return String::new();
    };
    let parts: Vec<String> = first
        .cpu
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let m = median(r.iter().map(|x| x.cpu[i].1).collect());
            format!("{name} {m:.0}")
        })
        .collect();
    parts.join(" + ")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-policy",
        "warden-supervisor",
        "warden-fs-servant",
        "warden-gateway",
        "warden-scripted-agent",
    ]);
    let n = env_num("WARDEN_VS_N", 2000);
    let rounds = env_num("WARDEN_VS_ROUNDS", 3).max(1);
    let chunks = env_num("WARDEN_VS_CHUNKS", 10_000);
    let idle = env_num("WARDEN_VS_IDLE", 100);
    let kills = env_num("WARDEN_VS_KILLS", 3);
    // WARDEN_VS_ONLY=1,2: only these rows (0 acpx, 1 raw, 2 warden durable, 3 warden not durable);
    // WARDEN_VS_EXTRAS=0: the table alone (for profiling a daemon, e.g. under callgrind).
    let only: Vec<usize> = std::env::var("WARDEN_VS_ONLY")
        .unwrap_or_default()
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let extras = std::env::var("WARDEN_VS_EXTRAS").map_or(true, |v| v != "0");
    let bin = warden_e2e::bin_dir();
    let target = bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let parent = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vs");
    let work = parent.join("clients");
    std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("mkdir {}: {e}", work.display()));
    let agents = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench_agents");
    // The interpreter must be visible inside the sandbox: the system one, not a user's shim.
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| which("python3"))
        .unwrap_or_else(|| panic!("python3 is needed for the bench's agent"));
    let env = Env {
        python,
        agent: agents.join("perm_agent.py"),
        raw_client: agents.join("raw_client.py"),
        n,
        work,
    };
    let acpx = acpx(&target);
    if let Err(why) = &acpx {
        println!("NOTE: the acpx row is not measured: {why}");
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "vs_acpx: commit {commit}, {cores} cores ({cpu_model}), load average at start {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{n} sequential edit permissions per run, {rounds} interleaved rounds, medians of rounds; python {}",
        env.python.display()
    );

    let mut sync = Warden::start(&env, &parent, true, chunks).await;
    let mut nosync = Warden::start(&env, &parent, false, chunks).await;
    let (fd50, fd99) = fdatasync_us(&sync.d.layout.state_of("policy"));
    println!("machine: fdatasync of a 4 KiB append p50 {fd50} µs, p99 {fd99} µs");

    const ROWS: [&str; 4] = [
        "acpx 0.19.1 --approve-all",
        "raw floor (Python client)",
        "warden, durable audit (default)",
        "warden, audit.sync = false",
    ];
    let mut results: Vec<Vec<Run>> = (0..ROWS.len()).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for k in 0..ROWS.len() {
            let row = (round + k) % ROWS.len();
            if !only.is_empty() && !only.contains(&row) {
                continue;
            }
            let r = match row {
                0 => match &acpx {
                    Ok((node, entry)) => run_acpx(&env, node, entry).await,
                    Err(_) => continue,
                },
                1 => run_raw(&env).await,
                2 => sync.run_perm(&env).await,
                _ => nosync.run_perm(&env).await,
            };
            match r {
                Ok(run) => {
                    println!(
                        "  round {} {:<34} p50 {:>5} µs p99 {:>6} µs p99.9 {:>6} µs ({} answered, {} allow-once) first answer {:.0} ms after start",
                        round + 1,
                        ROWS[row],
                        run.p50,
                        run.p99,
                        run.p999,
                        run.count,
                        run.allowed,
                        run.first_ms
                    );
                    results[row].push(run);
                }
                Err(e) => println!("  round {} {}: FAILED: {e}", round + 1, ROWS[row]),
            }
        }
    }

    println!();
    println!(
        "| client | p50 µs | p99 µs | p99.9 µs | CPU µs per permission | agent CPU µs per permission | start → first permission answered ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (row, runs) in results.iter().enumerate() {
        if runs.is_empty() {
            let why = match (&acpx, row) {
                (Err(why), 0) => format!(": {why}"),
                _ => String::new(),
            };
            println!("| {} | not measured{why} | | | | | |", ROWS[row]);
            continue;
        }
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let refs: Vec<&Run> = runs.iter().collect();
        let mut cpu = fmt_cpu(&refs);
        if row == 0 {
            let rss = median(runs.iter().filter_map(|r| r.rss_mib).collect());
            cpu = format!("{cpu} (node; RSS {rss:.0} MiB)");
        } else if row == 1 {
            cpu = format!("{cpu} (python)");
        } else {
            let total = median(
                runs.iter()
                    .map(|r| r.cpu.iter().map(|c| c.1).sum())
                    .collect(),
            );
            cpu = format!("{cpu} = {total:.0}");
        }
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {cpu} | {:.0} | {:.0} |",
            ROWS[row],
            m(|r| r.p50 as f64),
            m(|r| r.p99 as f64),
            m(|r| r.p999 as f64),
            m(|r| r.agent_cpu),
            m(|r| r.first_ms),
        );
    }
    println!(
        "(warden's start → first answer is from the A2A request of a new context: gateway, a contained spawn under the sandbox, the ACP handshake, the first Decide; the machine's fdatasync p50 is {fd50} µs)"
    );

    if !extras {
        sync.stop().await;
        nosync.stop().await;
        return;
    }
    // --- A2A events/s end to end (median of `rounds` streams) ---
    println!();
    let mut streams: Vec<[f64; 6]> = Vec::new();
    for _ in 0..rounds {
        let sampler = Sampler::start(sync.pids.clone());
        match sync.stream("perm-stream", "stream").await {
            Ok((events, t0, reads)) => {
                let s = sampler.finish();
                let seen: usize = events
                    .iter()
                    .filter(|e| e.contains("artifactUpdate"))
                    .map(|e| e.matches(';').count())
                    .sum();
                if seen != chunks {
                    println!("A2A stream: {seen} of {chunks} chunks arrived");
                }
                let (from, to) = (
                    reads.first().copied().unwrap_or(0),
                    reads.last().copied().unwrap_or(0),
                );
                let secs = (to.saturating_sub(from) as f64 / 1e9).max(1e-9);
                let per = |i: usize| s.cpu_between(i, from, to) as f64 / seen.max(1) as f64;
                streams.push([
                    seen as f64 / secs,
                    events.len() as f64,
                    secs * 1e3,
                    to.saturating_sub(t0) as f64 / 1e6,
                    per(0),
                    per(1),
                ]);
            }
            Err(e) => {
                sampler.finish();
                println!("A2A stream: FAILED: {e}");
            }
        }
    }
    if !streams.is_empty() {
        let m = |i: usize| median(streams.iter().map(|x| x[i]).collect());
        let rates: Vec<String> = streams.iter().map(|x| format!("{:.0}", x[0])).collect();
        println!(
            "A2A stream end to end (agent -> supervisor -> gateway -> SSE client), {chunks} message chunks, median of {}: {:.0} agent events/s relayed (runs: {}), from the first artifact to the end {:.0} ms (request -> end {:.0} ms, with the spawn), {:.0} SSE events (the gateway coalesces chunks); CPU per relayed agent event in that window: gateway {:.1} µs, supervisor {:.1} µs",
            streams.len(),
            m(0),
            rates.join(", "),
            m(2),
            m(3),
            m(1),
            m(4),
            m(5),
        );
    }

    // --- kill latency ---
    for agent in ["perm-coop", "perm-hostile"] {
        let mut answered = Vec::new();
        let mut gone = Vec::new();
        let mut procs = 0;
        for i in 0..kills {
            match kill_latency(&sync, agent, i).await {
                Ok((a, g, p)) => {
                    answered.push(a);
                    gone.push(g);
                    procs = p;
                }
                Err(e) => println!("kill {agent}: FAILED: {e}"),
            }
        }
        let what = if agent == "perm-hostile" {
            "hostile tree (agent + child, both ignore SIGTERM and EOF; default limits.kill_grace_ms)"
        } else {
            "cooperative tree (exits on SIGTERM)"
        };
        let runs = gone.len();
        println!(
            "CloseConversation of an idle {what}: answered in {:.1} ms, all {procs} processes gone after {:.1} ms (median of {runs})",
            median(answered),
            median(gone),
        );
    }

    // --- RSS per idle conversation ---
    match idle_rss(&mut sync, idle).await {
        Ok((per, before, after)) => println!(
            "supervisor RSS per idle conversation ({idle} open, scripted agent, agents excluded): {per:.1} KiB (before {before} KiB, after {after} KiB)"
        ),
        Err(e) => println!("idle RSS: FAILED: {e}"),
    }
    sync.stop().await;
    nosync.stop().await;
}
