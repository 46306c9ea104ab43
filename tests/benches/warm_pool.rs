//! Send → first event for a new conversation, cold (`pool_size = 0`: the open spawns the agent)
//! against warm (`pool_size = 1`: a warm agent of the pool serves it), printed, not asserted
//! (issue 17).
//!
//! Two deployments of the real warden-policy and warden-supervisor, the scripted agent, side by
//! side, interleaved: each sample is a `RunTurn` in a new context that opens its conversation
//! (what the gateway sends for a new A2A context), timed from the request to the first
//! `TurnStarted`, to the agent's first message chunk, and to the `TurnStop`; the conversation
//! is then closed. Before each warm sample the bench waits until the pool is refilled (so every
//! warm sample is one a warm agent serves: the pool's `taken` figure is printed to show it).
//!
//! Run: `cargo bench -p warden-e2e --bench warm_pool` (release daemons are built first);
//! `WARDEN_WARM_N` samples per side (30). The scripted agent is measured twice: with the host's
//! network, and with `network = "proxy"` (its own namespace and egress proxy, whose warm agents
//! are bound to the conversation at the take) when bubblewrap works here.
//! A real adapter's pool is the same code: when `.ci/run` has installed the Claude adapter
//! (`<target>/npm/claude-code-acp-0.16.2`) and node is there, the same comparison is made for
//! it, against the fake Anthropic server of `tests/tests/real_claude.rs` (`WARDEN_WARM_CLAUDE_N`
//! samples per side, 8); otherwise the bench says why that part is left out. The four pinned
//! adapters (`tests/src/real.rs`) are then measured as the real-adapter tests run them, under
//! `network = "proxy"` (`WARDEN_WARM_REAL_N` samples per side, 8).
//!
//! With debug daemons (the lead's release build left alone): `cargo bench --profile dev -p
//! warden-e2e --bench warm_pool` (the binaries of the profile the bench was built in are used).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;

type Client = SupervisorServiceClient<Channel>;

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

async fn status(c: &mut Client) -> HashMap<String, String> {
    c.status(pb::StatusRequest {})
        .await
        .map(|r| r.into_inner().details)
        .unwrap_or_default()
}

async fn wait_ready(c: &mut Client, agent: &str) -> bool {
    let key = format!("pool.{agent}.ready");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if status(c).await.get(&key).is_some_and(|v| v != "0") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// One new context's first turn: (to TurnStarted, to the first message chunk, to the stop), ms.
async fn sample(
    c: &mut Client,
    agent: &str,
    ctx: &str,
    text: &str,
) -> Result<(f64, f64, f64), String> {
    let req = pb::RunTurnRequest {
        context_id: ctx.into(),
        turn_id: "t1".into(),
        text: text.into(),
        message_id: format!("m-{ctx}"),
        task_id: format!("t-{ctx}"),
        timeout_seconds: 0,
        instructions: String::new(),
        open: Some(pb::OpenConversationRequest {
            context_id: ctx.into(),
            agent: agent.into(),
            workspace: String::new(),
            profile: pb::Profile::WorkspaceWrite as i32,
            principal: "bench".into(),
            verb: "task".into(),
            ..Default::default()
        }),
        groups: Vec::new(),
        issuer: String::new(),
    };
    let t0 = Instant::now();
    let mut s = c
        .run_turn(req)
        .await
        .map_err(|e| format!("RunTurn refused: {e}"))?
        .into_inner();
    let (mut started, mut first) = (None, None);
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(120), s.message())
            .await
            .map_err(|_| "no event within 120 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("the stream ended without a stop")?;
        let now = Instant::now();
        match ev.event {
            Some(Event::Started(_)) => started = started.or(Some(ms(now))),
            Some(Event::MessageChunk(_)) => first = first.or(Some(ms(now))),
            Some(Event::Stop(st)) => {
                if st.stop_reason != "end_turn" {
                    return Err(format!("turn ended {}: {:?}", st.stop_reason, st.fault));
                }
                let end = ms(now);
                let _ = c
                    .close_conversation(pb::CloseConversationRequest {
                        context_id: ctx.into(),
                        ..Default::default()
                    })
                    .await;
                return Ok((started.unwrap_or(end), first.unwrap_or(end), end));
            }
            _ => {}
        }
    }
}

fn stats(v: &[f64]) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        p(0.5),
        p(0.9),
        s[s.len() - 1]
    )
}

struct Side {
    name: &'static str,
    agent: String,
    warm: bool,
    d: Deployment,
    c: Client,
    samples: Vec<(f64, f64, f64)>,
    failures: usize,
}

async fn side(name: &'static str, agent: &str, warm: bool, sets: Vec<String>) -> Side {
    let parent = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("warm");
    let mut d = Deployment::new_in(
        &parent,
        Options {
            log_files: true,
            ..Default::default()
        },
    );
    d.opts.sets = sets.into_iter().map(|s| ("supervisor".into(), s)).collect();
    for n in ["policy", "supervisor"] {
        d.start(n).await;
    }
    let c = SupervisorServiceClient::new(d.channel("supervisor"));
    Side {
        name,
        agent: agent.into(),
        warm,
        d,
        c,
        samples: Vec::new(),
        failures: 0,
    }
}

async fn run_sides(sides: &mut [Side], n: usize, text: &str) {
    for i in 0..n {
        for s in sides.iter_mut() {
            if s.warm && !wait_ready(&mut s.c, &s.agent).await {
                println!("  {}: the pool never refilled", s.name);
                s.failures += 1;
                continue;
            }
            // A quiet moment for both: the previous close's kill and the refill are done.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let agent = s.agent.clone();
            match sample(&mut s.c, &agent, &format!("{}-{i}", s.agent), text).await {
                Ok(x) => s.samples.push(x),
                Err(e) => {
                    s.failures += 1;
                    println!("  {} sample {i}: FAILED: {e}", s.name);
                }
            }
        }
    }
    for s in sides.iter_mut() {
        // Why warm agents were not handed out, from the supervisor's log.
        let log = std::fs::read_to_string(s.d.log_file("supervisor")).unwrap_or_default();
        for l in log
            .lines()
            .filter(|l| l.contains("is not handed out"))
            .take(3)
        {
            println!("  {}: {}", s.name, l.trim());
        }
    }
    for s in sides.iter_mut() {
        let st = status(&mut s.c).await;
        let taken = st
            .get(&format!("pool.{}.taken", s.agent))
            .cloned()
            .unwrap_or_else(|| "0".into());
        let col = |i: usize| {
            s.samples
                .iter()
                .map(|x| [x.0, x.1, x.2][i])
                .collect::<Vec<_>>()
        };
        println!(
            "| {} | {} | {} | {} | {} | {taken} of {} |",
            s.name,
            s.samples.len(),
            stats(&col(0)),
            stats(&col(1)),
            stats(&col(2)),
            s.samples.len() + s.failures,
        );
    }
}

/// The Claude adapter's node and entry point, or why it is not measured.
fn claude_adapter() -> Result<(PathBuf, PathBuf), String> {
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("node is not installed")?;
    let entry = warden_e2e::bin_dir()
        .parent()
        .map(|t| {
            t.join("npm/claude-code-acp-0.16.2/node_modules/@zed-industries/claude-code-acp/dist/index.js")
        })
        .ok_or("no target directory")?;
    if !entry.is_file() {
        return Err(format!(
            "{} is missing (`.ci/run` installs it)",
            entry.display()
        ));
    }
    Ok((node, entry))
}

/// The fake Anthropic server (tests/fake_models/), killed when dropped, and its port.
async fn fake_anthropic(dir: &Path) -> Result<(tokio::process::Child, u16), String> {
    use tokio::io::AsyncBufReadExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake_models/fake_anthropic.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(dir.join("fake-anthropic.jsonl"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("python3 {}: {e}", script.display()))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::BufReader::new(out).read_line(&mut line),
    )
    .await
    .map_err(|_| "the fake model server did not say its port".to_string())?
    .map_err(|e| e.to_string())?;
    let port = line
        .trim()
        .parse()
        .map_err(|_| format!("not a port: {line:?}"))?;
    Ok((child, port))
}

/// The settings of a `claude-test` agent running the adapter against the fake model.
fn claude_sets(node: &Path, entry: &Path, port: u16, pool: usize) -> Vec<String> {
    let modules = entry
        .ancestors()
        .nth(4)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let set_env = format!(
        "{{ ANTHROPIC_BASE_URL = \"http://127.0.0.1:{port}\", ANTHROPIC_API_KEY = \"sk-ant-fake-key\", \
         IS_SANDBOX = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", \
         DISABLE_AUTOUPDATER = \"1\", DISABLE_TELEMETRY = \"1\", DISABLE_ERROR_REPORTING = \"1\" }}"
    );
    vec![
        "agents.scripted.pool_size=0".into(),
        format!("agents.claude-test.command={:?}", node.to_string_lossy()),
        format!("agents.claude-test.args=[{:?}]", entry.to_string_lossy()),
        "agents.claude-test.network=\"host\"".into(),
        format!("agents.claude-test.set_env={set_env}"),
        format!(
            "agents.claude-test.read_only_paths=[{:?}]",
            modules.to_string_lossy()
        ),
        "agents.claude-test.supervised_mode=\"default\"".into(),
        "agents.claude-test.supervised_modes=[\"plan\"]".into(),
        format!("agents.claude-test.pool_size={pool}"),
        "limits.handshake_deadline_ms=30000".into(),
    ]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-policy",
        "warden-supervisor",
        "warden-fs-servant",
        "warden-scripted-agent",
        "warden-egress-relay",
    ]);
    let n = env_num("WARDEN_WARM_N", 30);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let profile = if warden_e2e::bin_dir().ends_with("release") {
        "release"
    } else {
        "debug"
    };
    println!(
        "warm_pool: {n} new contexts per side, interleaved; {cores} cores, load average at start {}; {profile} binaries",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!(
        "| agent, pool | samples | RunTurn (opening) → TurnStarted | → first agent message chunk | → TurnStop | served warm |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let text = r#"{"steps": [{"type": "message", "text": "first"}]}"#;
    let mut sides = vec![
        side(
            "scripted, pool_size = 0 (cold)",
            "scripted",
            false,
            vec!["agents.scripted.pool_size=0".into()],
        )
        .await,
        side(
            "scripted, pool_size = 1 (warm)",
            "scripted",
            true,
            vec!["agents.scripted.pool_size=1".into()],
        )
        .await,
    ];
    run_sides(&mut sides, n, text).await;
    drop(sides);

    if warden_sandbox::find_bwrap().is_some_and(|b| warden_sandbox::bwrap_works(&b)) {
        let proxy = |pool: usize| {
            vec![
                "agents.scripted.network=\"proxy\"".into(),
                format!("agents.scripted.pool_size={pool}"),
            ]
        };
        let mut sides = vec![
            side(
                "scripted, network = \"proxy\", pool_size = 0 (cold)",
                "scripted",
                false,
                proxy(0),
            )
            .await,
            side(
                "scripted, network = \"proxy\", pool_size = 1 (warm)",
                "scripted",
                true,
                proxy(1),
            )
            .await,
        ];
        run_sides(&mut sides, n, text).await;
        drop(sides);
    } else {
        println!(
            "| scripted, network = \"proxy\" | not measured: bubblewrap does not work here | | | | |"
        );
    }

    match claude_adapter() {
        Err(why) => println!("| claude-code-acp 0.16.2 | not measured: {why} | | | | |"),
        Ok((node, entry)) => {
            let n = env_num("WARDEN_WARM_CLAUDE_N", 8);
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("warm");
            std::fs::create_dir_all(&dir).ok();
            match fake_anthropic(&dir).await {
                Err(e) => println!("| claude-code-acp 0.16.2 | not measured: {e} | | | | |"),
                Ok((_model, port)) => {
                    let mut sides = vec![
                        side(
                            "claude-code-acp 0.16.2, pool_size = 0 (cold)",
                            "claude-test",
                            false,
                            claude_sets(&node, &entry, port, 0),
                        )
                        .await,
                        side(
                            "claude-code-acp 0.16.2, pool_size = 1 (warm)",
                            "claude-test",
                            true,
                            claude_sets(&node, &entry, port, 1),
                        )
                        .await,
                    ];
                    run_sides(&mut sides, n, r#"SCRIPT {"steps": [], "final": "first"}"#).await;
                }
            }
        }
    }
    real_adapters_under_the_proxy().await;
    println!(
        "(each sample: a RunTurn that opens a new context's conversation, as the gateway sends for a new A2A context; the first agent message chunk is the agent's own first output)"
    );
}

/// The four pinned adapters as the real-adapter tests run them (`network = "proxy"`, against
/// the fake model servers, `tests/src/real.rs`), cold against warm, with the settings that keep
/// them from connecting on their own before they are taken (`real::agent_sets_quiet`); for the
/// two that do connect without them, also warm with the usual settings (never served warm:
/// what a discarded warm agent costs the conversation). `WARDEN_WARM_REAL_N` samples a side (8).
async fn real_adapters_under_the_proxy() {
    use warden_e2e::real::{self, FakeModel, Pinned};
    let n = env_num("WARDEN_WARM_REAL_N", 8);
    let rows: [(&str, Pinned, &str, bool); 4] = [
        (
            "claude-agent-acp 0.101.0",
            real::CLAUDE_AGENT_ACP,
            "claude",
            false,
        ),
        (
            "claude-code-acp 0.16.2",
            real::CLAUDE_CODE_ACP,
            "claude-code",
            true,
        ),
        ("codex-acp 0.16.0", real::CODEX_ACP_016, "codex-016", false),
        ("codex-acp 2.6.0", real::CODEX_ACP_26, "codex", true),
    ];
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("warm");
    std::fs::create_dir_all(&dir).ok();
    for (label, p, agent, noisy) in rows {
        if real::installed(p).is_none() {
            println!("| {label}, network = \"proxy\" | not measured: not installed | | | | |");
            continue;
        }
        let model = FakeModel::start(p.model, &dir).await;
        let sets = |pool: usize, quiet: bool| {
            let mut v: Vec<String> = real::agent_sets_quiet(agent, p, &model, quiet)
                .into_iter()
                .map(|(_, kv)| kv)
                .collect();
            if p.spec == real::CODEX_ACP_016.spec {
                // As tests/tests/real_codex.rs configures Codex 0.137.
                v.push(format!(
                    "agents.{agent}.codex_config={:?}",
                    warden_sandbox::CODEX_CONFIG_UNTRUSTED
                ));
                v.push(format!(
                    "agents.{agent}.codex_requirements={:?}",
                    warden_sandbox::CODEX_REQUIREMENTS_UNTRUSTED
                ));
                v.push(format!("agents.{agent}.supervised_mode=\"\""));
            }
            if agent != "claude" && p.model == real::ModelKind::Anthropic {
                v.push(format!("agents.{agent}.supervised_mode=\"default\""));
                v.push(format!("agents.{agent}.supervised_modes=[\"plan\"]"));
            }
            v.push("agents.scripted.pool_size=0".into());
            v.push(format!("agents.{agent}.pool_size={pool}"));
            v
        };
        let quiet = if noisy { " (quiet settings)" } else { "" };
        let name = |what: &str| -> &'static str {
            Box::leak(format!("{label}, network = \"proxy\"{quiet}, {what}").into_boxed_str())
        };
        let mut sides = vec![
            side(name("pool_size = 0 (cold)"), agent, false, sets(0, true)).await,
            side(name("pool_size = 1 (warm)"), agent, true, sets(1, true)).await,
        ];
        if noisy {
            let usual: &'static str = Box::leak(
                format!("{label}, network = \"proxy\" (usual settings), pool_size = 1")
                    .into_boxed_str(),
            );
            sides.push(side(usual, agent, true, sets(1, false)).await);
        }
        run_sides(&mut sides, n, r#"SCRIPT {"steps": [], "final": "first"}"#).await;
    }
}
