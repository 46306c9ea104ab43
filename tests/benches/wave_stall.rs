//! Issue 30's wave stall, reproduced and watched (printed, not asserted; not run by CI): the
//! real policy, supervisor and gateway with the scripted agent, fewer live agents than contexts,
//! the gateway's store bounded and swept every second, and waves of concurrent A2A streams
//! (`SendStreamingMessage` over SSE, a real HTTP/1.1 client, one connection per stream), each
//! wave reusing the same contexts. Per wave it prints how many tasks completed, failed or broke,
//! how many streams were silent longer than the stall bound, the longest silence of any stream
//! (keep-alives count as heard), the longest answer to an agent-card request made every 250 ms
//! during the wave (the gateway answering anything at all), and the gateway's RSS.
//!
//! When a stream has been silent past the stall bound the bench dumps what it can while the
//! daemons still wait: `warden status`, every gateway and supervisor thread's kernel wait
//! channel and stack, and (when `gdb` is installed) every thread's user stack; the daemons'
//! logs are kept beside the dump. The dump directory is printed.
//!
//! Run: `cargo bench -p warden-e2e --bench wave_stall` (release daemons), or in debug with
//! `cargo test -p warden-e2e --bench wave_stall`. Knobs (defaults are the run):
//! `WARDEN_WAVES` (14), `WARDEN_WAVE_STREAMS` (100), `WARDEN_WAVE_LIVE_AGENTS` (80),
//! `WARDEN_WAVE_RUNS` (1: whole runs, each on fresh daemons), `WARDEN_WAVE_STALL_S` (15),
//! `WARDEN_WAVE_READ_TIMEOUT_S` (90, the outside tester's read timeout), `WARDEN_WAVE_MAX_TASKS`
//! (200), `WARDEN_WAVE_SWEEP_MS` (1000), `WARDEN_WAVE_CACHE_BYTES` (8 MiB),
//! `WARDEN_WAVE_ACTIVE_TURNS` (0 = the supervisor's default, sixteen per core: on 2 cores 32
//! turns run at once and the rest queue, so the live agents are never all busy; the outside
//! tester's larger host ran every turn of a wave at once, 128 does that here),
//! `WARDEN_WAVE_TURN_MS` (0: the scripted agent echoes at once; n: each turn says a line, sleeps
//! n ms, says another, so a wave's turns overlap and hold their agents), `WARDEN_WAVE_PAUSE_MS`
//! (0: the pause between waves), `WARDEN_WAVE_GDB` (1; 0 = no user stacks in the dump). A smaller run for this 2-core machine:
//! `WARDEN_WAVE_STREAMS=30 WARDEN_WAVE_LIVE_AGENTS=20`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio_stream::StreamExt;
use warden_e2e::{Deployment, Options};

fn env_num(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(d)
}

struct Knobs {
    waves: u64,
    streams: u64,
    live_agents: u64,
    runs: u64,
    stall: Duration,
    read_timeout: Duration,
    max_tasks: u64,
    sweep_ms: u64,
    cache_bytes: u64,
    active_turns: u64,
    turn_ms: u64,
    pause_ms: u64,
    gdb: bool,
}

impl Knobs {
    fn from_env() -> Self {
        Knobs {
            waves: env_num("WARDEN_WAVES", 14),
            streams: env_num("WARDEN_WAVE_STREAMS", 100),
            live_agents: env_num("WARDEN_WAVE_LIVE_AGENTS", 80),
            runs: env_num("WARDEN_WAVE_RUNS", 1),
            stall: Duration::from_secs(env_num("WARDEN_WAVE_STALL_S", 15)),
            read_timeout: Duration::from_secs(env_num("WARDEN_WAVE_READ_TIMEOUT_S", 90)),
            max_tasks: env_num("WARDEN_WAVE_MAX_TASKS", 200),
            sweep_ms: env_num("WARDEN_WAVE_SWEEP_MS", 1000),
            cache_bytes: env_num("WARDEN_WAVE_CACHE_BYTES", 8 * 1024 * 1024),
            active_turns: env_num("WARDEN_WAVE_ACTIVE_TURNS", 0),
            turn_ms: env_num("WARDEN_WAVE_TURN_MS", 0),
            pause_ms: env_num("WARDEN_WAVE_PAUSE_MS", 0),
            gdb: env_num("WARDEN_WAVE_GDB", 1) != 0,
        }
    }
}

/// ms since the bench started: the clock every stream's "last heard" is kept in.
fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// How one stream ended.
#[derive(Debug, Default)]
struct Outcome {
    /// The last task state the stream showed (`TASK_STATE_…`), empty when none.
    state: String,
    /// Why the stream did not show a terminal state (transport error, read timeout, refusal).
    error: Option<String>,
    /// The longest time without a byte of the stream (an event or a keep-alive), including the
    /// wait for the response head.
    longest_silence: Duration,
    /// How long the response head took (the gateway answering at all).
    head_wait: Duration,
    /// The longest time between two events with data (keep-alives not counted), from the head.
    longest_event_gap: Duration,
    events: usize,
}

fn terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
            | "TASK_STATE_INPUT_REQUIRED"
            | "TASK_STATE_AUTH_REQUIRED"
    )
}

/// The task state an event of the stream carries, if any.
fn state_of(ev: &Value) -> Option<String> {
    let r = &ev["result"];
    [
        &r["task"]["status"]["state"],
        &r["statusUpdate"]["status"]["state"],
    ]
    .into_iter()
    .find_map(|s| s.as_str().map(str::to_string))
}

/// One streaming task in context `ctx`, read to its end; `heard` is set to `now_ms` whenever a
/// byte arrives (for the watcher).
async fn one_stream(
    addr: String,
    token: String,
    ctx: String,
    text: String,
    read_timeout: Duration,
    heard: Arc<AtomicU64>,
    epoch: Instant,
) -> Outcome {
    let mut out = Outcome::default();
    let mut last = Instant::now();
    let note = |out: &mut Outcome, last: &mut Instant| {
        out.longest_silence = out.longest_silence.max(last.elapsed());
        *last = Instant::now();
        heard.store(now_ms(epoch), Ordering::Relaxed);
    };
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": {"messageId": uuid_like(&ctx), "role": "ROLE_USER",
            "contextId": ctx, "parts": [{"text": text}]}}});
    let resp = match tokio::time::timeout(
        read_timeout,
        warden_cli::client::request(
            &addr,
            http::Method::POST,
            "/a2a/jsonrpc",
            &token,
            Some(&body),
        ),
    )
    .await
    {
        Err(_) => {
            out.longest_silence = last.elapsed();
            out.error = Some(format!("no response head within {read_timeout:?}"));
            return out;
        }
        Ok(Err(e)) => {
            out.error = Some(e.to_string());
            return out;
        }
        Ok(Ok(r)) => r,
    };
    out.head_wait = last.elapsed();
    note(&mut out, &mut last);
    let mut last_event = Instant::now();
    if resp.status().as_u16() != 200 {
        out.error = Some(format!("HTTP {}", resp.status()));
        return out;
    }
    let mut events = SseStream::new(resp.into_body());
    loop {
        let item = match tokio::time::timeout(read_timeout, events.next()).await {
            Err(_) => {
                out.longest_silence = out.longest_silence.max(last.elapsed());
                out.longest_event_gap = out.longest_event_gap.max(last_event.elapsed());
                out.error = Some(format!("silent for {read_timeout:?} (read timeout)"));
                return out;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                out.error = Some(format!("stream broke: {e}"));
                return out;
            }
            Ok(Some(Ok(item))) => item,
        };
        note(&mut out, &mut last);
        let Some(data) = item.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        out.events += 1;
        out.longest_event_gap = out.longest_event_gap.max(last_event.elapsed());
        last_event = Instant::now();
        let ev: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        if ev.get("error").is_some() {
            out.error = Some(format!("error event: {}", ev["error"]));
            continue;
        }
        if let Some(s) = state_of(&ev) {
            out.state = s;
            if terminal(&out.state) {
                break;
            }
        }
    }
    if !terminal(&out.state) && out.error.is_none() {
        out.error = Some(format!("the stream ended at state {:?}", out.state));
    }
    out
}

/// What a turn asks the scripted agent: an echo, or an inline scenario that takes `turn_ms`.
fn text_of(turn_ms: u64, wave: u64, i: usize) -> String {
    if turn_ms == 0 {
        return format!("hello from wave {wave}, stream {i}");
    }
    json!({"steps": [
        {"type": "message", "text": format!("wave {wave}, stream {i}: working")},
        {"type": "sleep", "ms": turn_ms},
        {"type": "message", "text": "done"},
    ]})
    .to_string()
}

/// Asks for the agent card every 250 ms (a request that touches neither the store nor the
/// supervisor): how long the gateway takes to answer anything at all while the wave runs.
async fn probe_card(addr: String, max_ms: Arc<AtomicU64>) {
    loop {
        let t = Instant::now();
        let card = warden_cli::client::get_json(&addr, "/.well-known/agent-card.json", "");
        let _ = tokio::time::timeout(Duration::from_secs(60), card).await;
        max_ms.fetch_max(t.elapsed().as_millis() as u64, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A message id unique to this process, readable in the logs.
fn uuid_like(ctx: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{ctx}-m{}", N.fetch_add(1, Ordering::Relaxed))
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

fn established_to(port: u16) -> usize {
    // Connections the gateway holds open on its HTTP port (both directions appear in
    // /proc/net/tcp; count the server side: local port = the gateway's).
    let hex = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&hex) && f[3] == "01"
        })
        .count()
}

/// Every thread of `pid`: name, state, kernel wait channel and kernel stack.
fn threads_of(pid: i32) -> String {
    let mut s = String::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(no /proc/{pid}/task)\n");
    };
    let mut tids: Vec<String> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    tids.sort();
    for tid in tids {
        let p = format!("/proc/{pid}/task/{tid}");
        let read = |f: &str| std::fs::read_to_string(format!("{p}/{f}")).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().next().unwrap_or("?").to_string())
            .unwrap_or_default();
        s.push_str(&format!(
            "--- tid {tid} {} state {state} wchan {}\n{}",
            read("comm").trim(),
            read("wchan").trim(),
            read("stack")
        ));
    }
    s
}

fn gdb_stacks(pid: i32) -> String {
    let out = std::process::Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
            "-ex",
            "set pagination off",
            "-ex",
            "thread apply all bt 40",
        ])
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("gdb: {e}\n"),
    }
}

/// Writes what can be seen of a stall to `dir` while it lasts.
fn dump(d: &mut Deployment, dir: &Path, knobs: &Knobs, why: &str) {
    let _ = std::fs::create_dir_all(dir);
    let write = |name: &str, text: &str| {
        let _ = std::fs::write(dir.join(name), text);
    };
    write("why.txt", why);
    let status = std::process::Command::new(warden_e2e::binary("warden"))
        .arg("--state-dir")
        .arg(d.dir.path())
        .arg("status")
        .output();
    write(
        "warden-status.txt",
        &match status {
            Ok(o) => format!(
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("warden status: {e}"),
        },
    );
    for name in ["gateway", "supervisor", "policy"] {
        let Some(pid) = d.daemon(name).map(|x| x.pid()) else {
            continue;
        };
        write(&format!("{name}-threads.txt"), &threads_of(pid));
        if knobs.gdb && name != "policy" {
            write(&format!("{name}-gdb.txt"), &gdb_stacks(pid));
        }
    }
    keep_logs(d, dir);
}

fn keep_logs(d: &Deployment, dir: &Path) {
    for name in ["gateway", "supervisor", "policy"] {
        let _ = std::fs::copy(d.log_file(name), dir.join(format!("{name}.log")));
    }
}

#[derive(Default)]
struct WaveFigures {
    completed: usize,
    failed: usize,
    broken: usize,
    stalled: usize,
    longest: Duration,
    /// The longest answer to the agent-card probe during the wave (ms).
    probe_ms: u64,
    head: Duration,
    gap: Duration,
    secs: f64,
    rss_mib: f64,
    faults: std::collections::BTreeMap<String, usize>,
}

async fn run_waves(knobs: &Knobs, run: u64, dumps: &Path) -> (usize, usize) {
    let opts = Options {
        sets: vec![
            (
                "supervisor".into(),
                format!("limits.max_live_agents={}", knobs.live_agents),
            ),
            (
                "supervisor".into(),
                format!("limits.max_conversations={}", knobs.streams.max(512)),
            ),
            (
                "supervisor".into(),
                format!(
                    "limits.max_open_conversations_per_principal={}",
                    knobs.streams.max(512)
                ),
            ),
            (
                "supervisor".into(),
                format!("limits.max_active_turns={}", knobs.active_turns),
            ),
            (
                "gateway".into(),
                format!("store.max_tasks={}", knobs.max_tasks),
            ),
            (
                "gateway".into(),
                format!("store.sweep_interval_ms={}", knobs.sweep_ms),
            ),
            (
                "gateway".into(),
                format!("store.cache_capacity_bytes={}", knobs.cache_bytes),
            ),
        ],
        log_files: true,
        ..Options::default()
    };
    let mut opts = opts;
    // Any other setting, e.g. `supervisor:limits.idle_timeout_secs=5,gateway:store.max_tasks=50`.
    for kv in std::env::var("WARDEN_WAVE_SETS")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((daemon, set)) = kv.trim().split_once(':') {
            opts.sets.push((daemon.to_string(), set.to_string()));
        }
    }
    let mut d = Deployment::up(opts).await;
    let addr = d.http.clone();
    let port: u16 = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let token = d.token();
    let gw = d.daemon("gateway").map(|x| x.pid()).unwrap_or(0);
    let epoch = Instant::now();
    println!(
        "run {run}: {} waves × {} streams over the same {} contexts, {} live agents, max_active_turns {}, turns of {} ms, {} ms between waves, store.max_tasks {}, sweep {} ms, cache {} B (state {})",
        knobs.waves,
        knobs.streams,
        knobs.streams,
        knobs.live_agents,
        knobs.active_turns,
        knobs.turn_ms,
        knobs.pause_ms,
        knobs.max_tasks,
        knobs.sweep_ms,
        knobs.cache_bytes,
        d.dir.path().display()
    );
    println!(
        "| wave | completed | failed | broken | stalled (> {} s) | longest silence s | longest head wait s | longest event gap s | card probe max ms | wave s | gateway RSS MiB | open conns after | failures |",
        knobs.stall.as_secs()
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let (mut stalled_waves, mut bad_tasks) = (0, 0);
    for wave in 0..knobs.waves {
        let t0 = Instant::now();
        let heard: Vec<Arc<AtomicU64>> = (0..knobs.streams)
            .map(|_| Arc::new(AtomicU64::new(now_ms(epoch))))
            .collect();
        let mut finished = vec![false; heard.len()];
        let mut set = tokio::task::JoinSet::new();
        for (i, h) in heard.iter().enumerate() {
            let stream = one_stream(
                addr.clone(),
                token.clone(),
                format!("wave-ctx-{i}"),
                text_of(knobs.turn_ms, wave, i),
                knobs.read_timeout,
                h.clone(),
                epoch,
            );
            set.spawn(async move { (i, stream.await) });
        }
        let probe_max = Arc::new(AtomicU64::new(0));
        let probe = tokio::spawn(probe_card(addr.clone(), probe_max.clone()));
        let mut outcomes = Vec::new();
        let mut dumped = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while !set.is_empty() {
            tokio::select! {
                r = set.join_next() => {
                    if let Some(Ok((i, o))) = r {
                        finished[i] = true;
                        outcomes.push(o);
                    }
                }
                _ = tick.tick() => {
                    if dumped {
                        continue;
                    }
                    let now = now_ms(epoch);
                    // Only streams still open: a finished stream is not heard any more.
                    let silent = heard
                        .iter()
                        .zip(&finished)
                        .filter(|(h, done)| {
                            !**done
                                && now.saturating_sub(h.load(Ordering::Relaxed))
                                    > knobs.stall.as_millis() as u64
                        })
                        .count();
                    if silent > 0 {
                        dumped = true;
                        let dir = dumps.join(format!("run{run}-wave{wave}"));
                        let why = format!(
                            "{silent} of {} streams silent > {:?} ({} finished) at {:.1} s into wave {wave}; gateway connections {}",
                            knobs.streams,
                            knobs.stall,
                            outcomes.len(),
                            t0.elapsed().as_secs_f64(),
                            established_to(port)
                        );
                        println!("STALL: {why}; dumping to {}", dir.display());
                        dump(&mut d, &dir, knobs, &why);
                    }
                }
            }
        }
        probe.abort();
        let mut f = WaveFigures {
            probe_ms: probe_max.load(Ordering::Relaxed),
            secs: t0.elapsed().as_secs_f64(),
            rss_mib: status_kib(gw, "VmRSS:") as f64 / 1024.0,
            ..WaveFigures::default()
        };
        for o in &outcomes {
            f.longest = f.longest.max(o.longest_silence);
            f.head = f.head.max(o.head_wait);
            f.gap = f.gap.max(o.longest_event_gap);
            if o.longest_silence > knobs.stall {
                f.stalled += 1;
            }
            match (o.state.as_str(), &o.error) {
                ("TASK_STATE_COMPLETED", None) => f.completed += 1,
                (s, None) => {
                    f.failed += 1;
                    *f.faults.entry(s.to_string()).or_default() += 1;
                }
                (_, Some(e)) => {
                    f.broken += 1;
                    let short: String = e.chars().take(80).collect();
                    *f.faults.entry(short).or_default() += 1;
                }
            }
        }
        if f.stalled > 0 {
            stalled_waves += 1;
        }
        if knobs.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(knobs.pause_ms)).await;
        }
        bad_tasks += f.failed + f.broken;
        println!(
            "| {wave} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {:?} |",
            f.completed,
            f.failed,
            f.broken,
            f.stalled,
            f.longest.as_secs_f64(),
            f.head.as_secs_f64(),
            f.gap.as_secs_f64(),
            f.probe_ms,
            f.secs,
            f.rss_mib,
            established_to(port),
            f.faults
        );
    }
    if stalled_waves > 0 || bad_tasks > 0 {
        let dir = dumps.join(format!("run{run}-end"));
        let _ = std::fs::create_dir_all(&dir);
        keep_logs(&d, &dir);
        println!("run {run}: logs kept in {}", dir.display());
    }
    (stalled_waves, bad_tasks)
}

fn main() {
    let threads = env_num("WARDEN_WAVE_DAEMON_THREADS", 0);
    if threads > 0 {
        // SAFETY: no other thread exists yet; the daemons the bench starts inherit it.
        unsafe { std::env::set_var("TOKIO_WORKER_THREADS", threads.to_string()) };
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the bench's runtime");
    rt.block_on(bench());
}

async fn bench() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-cli",
        "warden-policy",
        "warden-supervisor",
        "warden-gateway",
        "warden-fs-servant",
        "warden-scripted-agent",
    ]);
    let knobs = Knobs::from_env();
    let dumps = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "wave-stall-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    ));
    let mut passed = 0;
    for run in 0..knobs.runs {
        let (stalled, bad) = run_waves(&knobs, run, &dumps).await;
        let ok = stalled == 0 && bad == 0;
        if ok {
            passed += 1;
        }
        println!(
            "run {run}: {} ({stalled} waves with a stall, {bad} tasks not completed)",
            if ok { "PASSED" } else { "FAILED" }
        );
    }
    println!(
        "wave_stall: {passed} of {} runs passed (every task COMPLETED, no stream silent > {} s)",
        knobs.runs,
        knobs.stall.as_secs()
    );
}
