//! `warden-policy-bench`: latency and throughput of the decision, for `warden-rules` alone and
//! for `Decide` over the Unix socket to a real `warden-policy` process, sequential and with 8
//! concurrent callers. Prints p50/p99/p99.9 and decisions per second.
//!
//! Run in release: `cargo run --release -p warden-policy --bin warden-policy-bench`.
//! Options: `--n N` (requests per socket run, default 20000), `--rules-n N` (default 200000),
//! `--log-level LEVEL` (the daemon's, default `warn`; `info` logs one line per decision).
//!
//! Also `warden-policy-bench probe SOCKET`: one Decide call, prints the outcome (used by the
//! peer-allowlist test, which runs it under another uid). It never changes anything.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_rules::{
    AgentHomes, Boundary, DecisionInput, Engine, OfferedOption, PolicyConfig, Profile, RealFs,
    RootCheck, Subject, ToolCall,
};

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort_unstable();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).saturating_sub(1);
        v.get(i.min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (at(0.50), at(0.99), at(0.999))
}

/// CPU time (user + system) the process `pid` has used so far, in microseconds (0 if unknown).
/// Read from `/proc/PID/stat`, so it counts every thread of the daemon, sled's included.
fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may contain spaces; the fields after its closing parenthesis do not.
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

fn report_cpu(pid: u32, before: u64, n: usize) {
    let used = cpu_us(pid).saturating_sub(before);
    println!(
        "{:<48} warden-policy CPU per decision: {:.0} µs",
        "",
        used as f64 / n.max(1) as f64
    );
}

fn report(label: &str, lat: Vec<Duration>, wall: Duration) {
    let n = lat.len();
    let (p50, p99, p999) = percentiles(lat);
    println!(
        "{label:<48} n={n:<7} p50={:>8.1}µs p99={:>8.1}µs p99.9={:>8.1}µs  {:>9.0} decisions/s",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
        p999.as_secs_f64() * 1e6,
        n as f64 / wall.as_secs_f64()
    );
}

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn tree() -> std::io::Result<Tree> {
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?.join("root");
    std::fs::create_dir_all(root.join("src/deep/er"))?;
    std::fs::write(root.join("src/lib.rs"), "")?;
    std::os::unix::fs::symlink("/etc", root.join("out"))?;
    Ok(Tree { _dir: dir, root })
}

/// A realistic mix: reads, edits inside and outside the root, commands, a plan exit.
fn inputs(root: &Path) -> Vec<DecisionInput> {
    let opts = |v: &[(&str, &str)]| -> Vec<OfferedOption> {
        v.iter().map(|(i, k)| OfferedOption::new(i, k)).collect()
    };
    let claude = opts(&[
        ("allow-once", "allow_once"),
        ("allow-with-updates", "allow_always"),
        ("reject", "reject_once"),
    ]);
    let mk = |tool: ToolCall, options: Vec<OfferedOption>| DecisionInput {
        subject: Subject {
            principal: "bench".into(),
            agent: "claude".into(),
            verb: "implement".into(),
            groups: Vec::new(),
        },
        boundary: Boundary {
            root: root.to_path_buf(),
            owned: false,
            allow_execute: false,
            profile: Profile::WorkspaceWrite,
        },
        tool,
        options,
    };
    vec![
        mk(ToolCall::new("read", "Read src/lib.rs"), claude.clone()),
        mk(
            ToolCall::new("edit", "Edit src/lib.rs").with_locations(["src/lib.rs"]),
            claude.clone(),
        ),
        mk(
            ToolCall::new("edit", "Write").with_locations(["src/deep/er/new/file.rs"]),
            claude.clone(),
        ),
        mk(
            ToolCall::new("edit", "Write").with_locations(["out/passwd"]),
            claude.clone(),
        ),
        mk(
            ToolCall::new("execute", "`cargo test`").with_raw_input(r#"{"command":"cargo test"}"#),
            claude.clone(),
        ),
        mk(
            ToolCall::new("switch_mode", "Ready to code?"),
            opts(&[
                ("exit-plan-auto", "allow_always"),
                ("exit-plan-default", "allow_once"),
                ("reject", "reject_once"),
            ]),
        ),
    ]
}

fn to_request(i: &DecisionInput, n: usize) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("bench-{n}"),
        subject: Some(pb::Subject {
            principal: i.subject.principal.clone(),
            context_id: "bench".into(),
            task_id: "t".into(),
            session_id: "s".into(),
            agent: i.subject.agent.clone(),
            verb: i.subject.verb.clone(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: i.boundary.root.display().to_string(),
            owned: i.boundary.owned,
            allow_execute: i.boundary.allow_execute,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: format!("call-{n}"),
            kind: i.tool.kind_raw.clone(),
            title: i.tool.title.clone(),
            raw_input_json: i.tool.raw_input_json.clone(),
            locations: i
                .tool
                .locations
                .iter()
                .map(|p| pb::Location {
                    path: p.display().to_string(),
                    line: None,
                })
                .collect(),
        }),
        options: i
            .options
            .iter()
            .map(|o| pb::PermissionOption {
                id: o.id.clone(),
                name: o.name.clone(),
                kind: match &o.kind {
                    warden_rules::OptionKind::AllowOnce => "allow_once".into(),
                    warden_rules::OptionKind::AllowAlways => "allow_always".into(),
                    warden_rules::OptionKind::RejectOnce => "reject_once".into(),
                    warden_rules::OptionKind::RejectAlways => "reject_always".into(),
                    warden_rules::OptionKind::Unknown(s) => s.clone(),
                },
            })
            .collect(),
        current_mode: "default".into(),
        deadline_unix_ms: 0,
        return_escalations: false,
    }
}

fn bench_rules(root: &Path, n: usize) -> Result<(), String> {
    let policy = PolicyConfig::from_toml_str(
        "[global]\nmode='approve-all'\nauto_deny=['WebFetch','curl']\nescalate=['git']\n",
    )
    .map_err(|e| e.to_string())?;
    // The host's homes, as the daemon judges boundaries: the bench measures what it serves.
    let engine = Arc::new(
        Engine::new(policy)
            .map_err(|e| e.to_string())?
            .with_root_check(RootCheck::new(&AgentHomes::from_host(), &RealFs)),
    );
    let inputs = Arc::new(inputs(root));
    // warm up
    for i in inputs.iter() {
        std::hint::black_box(engine.decide(i, &RealFs));
    }
    let run = |engine: Arc<Engine>, inputs: Arc<Vec<DecisionInput>>, n: usize| {
        let mut lat = Vec::with_capacity(n);
        for k in 0..n {
            let i = &inputs[k % inputs.len()];
            let t = Instant::now();
            std::hint::black_box(engine.decide(i, &RealFs));
            lat.push(t.elapsed());
        }
        lat
    };
    let t0 = Instant::now();
    let lat = run(engine.clone(), inputs.clone(), n);
    report("rules alone, sequential (mix)", lat, t0.elapsed());
    // Per case: the path checks cost one lstat per component; the rest is pure computation.
    let names = [
        "read",
        "edit inside (lstat)",
        "edit new deep file (lstat)",
        "edit via symlink out (lstat)",
        "execute + matchers",
        "plan exit",
    ];
    for (k, name) in names.iter().enumerate() {
        let one = Arc::new(vec![inputs[k].clone()]);
        let t0 = Instant::now();
        let lat = run(engine.clone(), one, n / 10);
        report(&format!("  rules alone, {name}"), lat, t0.elapsed());
    }

    let t0 = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (e, i) = (engine.clone(), inputs.clone());
            std::thread::spawn(move || run(e, i, n / 8))
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.join().map_err(|_| "bench thread panicked".to_string())?);
    }
    report("rules alone, 8 threads", all, t0.elapsed());
    Ok(())
}

struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_daemon(sync: bool, log_level: &str) -> Result<Daemon, String> {
    let bin = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("warden-policy");
    let dir = tempfile::Builder::new()
        .prefix("wpb")
        .tempdir_in("/tmp")
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&bin);
    for s in warden_policy::config::for_dir(dir.path()) {
        cmd.arg("--set").arg(s);
    }
    cmd.arg("--set").arg(format!("audit.sync={sync}"));
    cmd.arg("--set")
        .arg(format!("daemon.log_level={log_level:?}"));
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    Ok(Daemon {
        child,
        socket: dir.path().join("policy.sock"),
        _dir: dir,
    })
}

async fn wait_healthy(socket: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if warden_daemon::client::healthy(socket).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "warden-policy at {} never became healthy",
        socket.display()
    ))
}

async fn bench_socket(root: &Path, n: usize, sync: bool, log_level: &str) -> Result<(), String> {
    let d = start_daemon(sync, log_level)?;
    wait_healthy(&d.socket).await?;
    let reqs: Arc<Vec<pb::DecideRequest>> = Arc::new(
        inputs(root)
            .iter()
            .enumerate()
            .map(|(k, i)| to_request(i, k))
            .collect(),
    );
    let label = if sync {
        "fsync per record"
    } else {
        "audit.sync=false"
    };

    let ch = warden_daemon::client::connect_unix(&d.socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut c = PolicyServiceClient::new(ch);
    for r in reqs.iter() {
        c.decide(r.clone()).await.map_err(|e| e.to_string())?;
    }
    let pid = d.child.id();
    let cpu0 = cpu_us(pid);
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(n);
    for k in 0..n {
        let r = reqs[k % reqs.len()].clone();
        let t = Instant::now();
        c.decide(r).await.map_err(|e| e.to_string())?;
        lat.push(t.elapsed());
    }
    report(
        &format!("Decide over the socket, sequential ({label})"),
        lat,
        t0.elapsed(),
    );
    report_cpu(pid, cpu0, n);

    let mut tasks = Vec::new();
    let mut chans = Vec::new();
    for _ in 0..8 {
        chans.push(
            warden_daemon::client::connect_unix(&d.socket)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let cpu0 = cpu_us(pid);
    let t0 = Instant::now();
    for ch in chans {
        let reqs = reqs.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = PolicyServiceClient::new(ch);
            let mut lat = Vec::with_capacity(n / 8);
            for k in 0..n / 8 {
                let r = reqs[k % reqs.len()].clone();
                let t = Instant::now();
                c.decide(r).await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed());
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    report(
        &format!("Decide over the socket, 8 callers ({label})"),
        all,
        t0.elapsed(),
    );
    report_cpu(pid, cpu0, n / 8 * 8);
    Ok(())
}

async fn probe(socket: &Path) -> i32 {
    let ch = match warden_daemon::client::connect_unix(socket).await {
        Ok(c) => c,
        Err(e) => {
            println!("error=connect {e}");
            return 3;
        }
    };
    let mut c = PolicyServiceClient::new(ch);
    let req = pb::DecideRequest {
        request_id: "probe".into(),
        boundary: Some(pb::Boundary {
            root: "/".into(),
            ..Default::default()
        }),
        tool_call: Some(pb::ToolCall {
            kind: "read".into(),
            title: "probe".into(),
            ..Default::default()
        }),
        options: vec![pb::PermissionOption {
            id: "allow-once".into(),
            name: "Yes".into(),
            kind: "allow_once".into(),
        }],
        ..Default::default()
    };
    match c.decide(req).await {
        Ok(d) => {
            let d = d.into_inner();
            println!("verdict={} rule={}", d.verdict, d.rule);
            0
        }
        Err(s) => {
            println!("error={:?} {}", s.code(), s.message());
            3
        }
    }
}

fn arg_usize(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warden-policy-bench: cannot start a runtime: {e}");
            std::process::exit(2);
        }
    };
    if args.get(1).map(String::as_str) == Some("probe") {
        let Some(sock) = args.get(2) else {
            eprintln!("usage: warden-policy-bench probe SOCKET");
            std::process::exit(2);
        };
        std::process::exit(rt.block_on(probe(Path::new(sock))));
    }
    let n = arg_usize(&args, "--n", 20_000);
    let rules_n = arg_usize(&args, "--rules-n", 200_000);
    // The daemon's stderr goes nowhere either way; `info` adds the one log line per decision a
    // deployment at the default level writes.
    let log_level = args
        .iter()
        .position(|a| a == "--log-level")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "warn".to_string());
    let result = (|| {
        let t = tree().map_err(|e| e.to_string())?;
        bench_rules(&t.root, rules_n)?;
        rt.block_on(bench_socket(&t.root, n, true, &log_level))?;
        rt.block_on(bench_socket(&t.root, n, false, &log_level))
    })();
    if let Err(e) = result {
        eprintln!("warden-policy-bench: {e}");
        std::process::exit(1);
    }
}
