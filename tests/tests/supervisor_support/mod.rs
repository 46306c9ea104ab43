//! Shared helpers of the supervisor end-to-end tests: a deployment of the real `warden-policy` and
//! `warden-supervisor` (with the real `warden-scripted-agent` as the agent), driven with the
//! generated gRPC client over the supervisor's Unix socket.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;

pub type Client = SupervisorServiceClient<Channel>;

/// Whether this host runs agents contained: root (the supervisor can switch agents to their own
/// uid) and a working bubblewrap. Elsewhere the hostile containment tests say they skipped; under
/// CI (`CI` set, as `.ci/run` runs: root, bubblewrap installed) a missing piece is a failure, so a
/// containment test can never pass by not running.
pub fn runs_contained() -> bool {
    let missing = if !nix::unistd::geteuid().is_root() {
        "not root; the supervisor cannot switch agents to their own uid"
    } else if warden_sandbox::find_bwrap().is_none_or(|b| !warden_sandbox::bwrap_works(&b)) {
        "bubblewrap missing or not working on this host"
    } else {
        return true;
    };
    assert!(std::env::var_os("CI").is_none(), "under CI: {missing}");
    println!("SKIP: {missing}");
    false
}

/// Where supervisor test deployments live (not /tmp: the supervisor refuses temp trees).
pub fn parent() -> PathBuf {
    warden_e2e::test_root()
}

/// A deployment with extra `--set`s (`("policy"|"supervisor", "k=v")`) running `daemons` in order.
async fn deploy_daemons(sets: &[(&str, &str)], daemons: &[&str]) -> Deployment {
    let opts = Options {
        sets: sets
            .iter()
            .map(|(d, kv)| (d.to_string(), kv.to_string()))
            .collect(),
        ..Default::default()
    };
    let mut d = Deployment::new(opts);
    for name in daemons {
        d.start(name).await;
    }
    d
}

/// policy + supervisor with extra `--set`s.
pub async fn deploy(sets: &[(&str, &str)]) -> Deployment {
    deploy_daemons(sets, &["policy", "supervisor"]).await
}

/// supervisor only (the policy socket has no listener: the policy is down).
pub async fn deploy_without_policy(sets: &[(&str, &str)]) -> Deployment {
    deploy_daemons(sets, &["supervisor"]).await
}

/// Live processes whose working directory is `root` or inside it, optionally only those whose
/// executable is named `exe`. Agent trees are found this way from the host's side: PIDs an agent
/// writes inside bubblewrap's PID namespace mean nothing here.
pub fn processes_in(root: &Path, exe: Option<&str>) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        let exe_matches = exe.is_none_or(|name| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|p| p.file_name().is_some_and(|n| n == name))
        });
        if cwd.starts_with(root) && exe_matches && alive(pid) {
            out.push(pid);
        }
    }
    out
}

pub fn client(d: &Deployment) -> Client {
    SupervisorServiceClient::new(d.channel("supervisor"))
}

pub fn open(ctx: &str, profile: pb::Profile) -> pb::OpenConversationRequest {
    pb::OpenConversationRequest {
        context_id: ctx.into(),
        agent: String::new(),
        workspace: String::new(),
        profile: profile as i32,
        principal: "tester".into(),
        verb: "implement".into(),
        ..Default::default()
    }
}

pub fn turn(ctx: &str, id: &str, text: &str) -> pb::RunTurnRequest {
    pb::RunTurnRequest {
        instructions: String::new(),
        context_id: ctx.into(),
        turn_id: id.into(),
        text: text.into(),
        message_id: format!("m-{id}"),
        task_id: format!("t-{id}"),
        timeout_seconds: 0,
        open: Some(open(ctx, pb::Profile::WorkspaceWrite)),
        groups: Vec::new(),
        issuer: String::new(),
    }
}

/// Starts a turn and returns its event stream.
pub async fn start(c: &mut Client, req: pb::RunTurnRequest) -> tonic::Streaming<pb::TurnEvent> {
    c.run_turn(req)
        .await
        .unwrap_or_else(|e| panic!("RunTurn refused: {e}"))
        .into_inner()
}

/// Reads events until the TurnStop (panics after `limit`).
pub async fn collect(
    s: &mut tonic::Streaming<pb::TurnEvent>,
    limit: Duration,
) -> Vec<pb::TurnEvent> {
    let mut out = Vec::new();
    let res = tokio::time::timeout(limit, async {
        while let Some(ev) = s
            .message()
            .await
            .unwrap_or_else(|e| panic!("stream error: {e}"))
        {
            let last = matches!(ev.event, Some(Event::Stop(_)));
            out.push(ev);
            if last {
                return;
            }
        }
    })
    .await;
    assert!(res.is_ok(), "no TurnStop within {limit:?}; got {out:#?}");
    out
}

/// Runs one turn to its end.
pub async fn run(c: &mut Client, req: pb::RunTurnRequest) -> Vec<pb::TurnEvent> {
    let mut s = start(c, req).await;
    collect(&mut s, Duration::from_secs(30)).await
}

pub fn stop(evs: &[pb::TurnEvent]) -> pb::TurnStop {
    match evs.last().and_then(|e| e.event.clone()) {
        Some(Event::Stop(s)) => s,
        other => panic!("last event is not a stop: {other:?}"),
    }
}

pub fn permissions(evs: &[pb::TurnEvent]) -> Vec<pb::PermissionDecisionEvent> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(Event::Permission(p)) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

pub fn text(evs: &[pb::TurnEvent]) -> String {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(Event::MessageChunk(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

pub fn faults(evs: &[pb::TurnEvent]) -> Vec<pb::Fault> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(Event::Fault(f)) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// The supervisor's state directory.
pub fn state(d: &Deployment) -> PathBuf {
    d.layout.state_of("supervisor")
}

/// Incident records (parsed) under the supervisor's state.
pub fn incidents(d: &Deployment) -> Vec<serde_json::Value> {
    let dir = state(d).join("incidents");
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path())
                && let Ok(v) = serde_json::from_str(&t)
            {
                out.push(v);
            }
        }
    }
    out
}

/// Health lines.
pub fn health(d: &Deployment) -> Vec<serde_json::Value> {
    std::fs::read_to_string(state(d).join("health.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Whether a process is alive (not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// Pids the scripted agent's helpers wrote to `file`.
pub fn pids_in(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits (bounded) until none of `pids` is alive.
pub async fn all_gone(pids: &[i32], within: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if pids.iter().all(|p| !alive(*p)) {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An inline scenario prompt for the scripted agent.
pub fn scenario(v: serde_json::Value) -> String {
    v.to_string()
}

/// The supervisor's Status details.
pub async fn status(c: &mut Client) -> HashMap<String, String> {
    c.status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .details
}

/// Waits (bounded) until `pool.<agent>.<what>` is `want`.
pub async fn wait_figure(
    c: &mut Client,
    agent: &str,
    what: &str,
    want: &str,
) -> HashMap<String, String> {
    let key = format!("pool.{agent}.{what}");
    let t0 = Instant::now();
    loop {
        let st = status(c).await;
        if st.get(&key).map(String::as_str) == Some(want) {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{key} never became {want}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent processes (by executable name) in the supervisor's sandboxes.
pub fn agents(d: &warden_e2e::Deployment, exe: &str) -> Vec<i32> {
    processes_in(&state(d).join("sandboxes"), Some(exe))
}

/// Waits (bounded) for exactly one agent process of `exe` in the sandboxes other than `not`.
pub async fn one_agent(d: &warden_e2e::Deployment, exe: &str, not: &[i32]) -> i32 {
    let t0 = Instant::now();
    loop {
        let found: Vec<i32> = agents(d, exe)
            .into_iter()
            .filter(|p| !not.contains(p))
            .collect();
        if found.len() == 1 {
            return found[0];
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "expected one {exe} agent besides {not:?}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The audit records of one context, newest first, from the policy's admin socket.
pub async fn audit_of(d: &Deployment, ctx: &str) -> Vec<pb::AuditRecord> {
    let ch = warden_daemon::client::unix_channel(&d.layout.policy_admin_socket());
    let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
    admin
        .audit_query(pb::AuditQueryRequest {
            limit: 1000,
            decision_id: String::new(),
            context_id: ctx.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .records
}

/// A process's resident set size in KiB, from `/proc/PID/status` (0 once it is gone).
pub fn vm_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A process's resident set size sampled every 5 ms from [`RssSampler::start`] to
/// [`RssSampler::stop`]: what a flood made a daemon hold at its worst.
pub struct RssSampler {
    pid: i32,
    before: u64,
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    sampling: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// What an [`RssSampler`] saw, in KiB.
#[derive(Debug, Clone, Copy)]
pub struct Rss {
    pub before: u64,
    pub peak: u64,
    pub after: u64,
}

impl RssSampler {
    pub fn start(pid: i32) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let before = vm_rss_kib(pid);
        let peak = std::sync::Arc::new(AtomicU64::new(before));
        let sampling = std::sync::Arc::new(AtomicBool::new(true));
        let task = {
            let (peak, sampling) = (peak.clone(), sampling.clone());
            tokio::spawn(async move {
                while sampling.load(Ordering::Relaxed) {
                    peak.fetch_max(vm_rss_kib(pid), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        Self {
            pid,
            before,
            peak,
            sampling,
            task,
        }
    }

    pub async fn stop(self) -> Rss {
        use std::sync::atomic::Ordering;
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        let after = vm_rss_kib(self.pid);
        Rss {
            before: self.before,
            peak: self.peak.load(Ordering::Relaxed).max(after),
            after,
        }
    }
}

/// One turn of [`calm_turns`]: how it stopped, how many permissions it asked, whether all were
/// allowed, and its text.
#[derive(Debug, Clone)]
pub struct CalmTurn {
    pub stop_reason: String,
    pub asked: usize,
    pub allowed: bool,
    pub text: String,
}

/// `n` ordinary turns (`write calm-N.txt`) of conversation `ctx`, one after another, in the
/// background: another caller's conversation going on while a test floods the supervisor.
pub fn calm_turns(
    mut c: Client,
    ctx: &'static str,
    n: usize,
) -> tokio::task::JoinHandle<Vec<CalmTurn>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        for i in 1..=n {
            let evs = run(
                &mut c,
                turn(ctx, &format!("calm-{i}"), &format!("write calm-{i}.txt")),
            )
            .await;
            let p = permissions(&evs);
            out.push(CalmTurn {
                stop_reason: stop(&evs).stop_reason,
                asked: p.len(),
                allowed: p.iter().all(|p| p.verdict == pb::Verdict::Allow as i32),
                text: text(&evs),
            });
        }
        out
    })
}

/// A turn that leaves a SIGTERM-ignoring child and a setsid'ed grandchild behind and hangs.
pub fn spawn_and_hang() -> String {
    scenario(serde_json::json!({"on_cancel": "never", "steps": [
        {"type": "spawn", "ignore_term": true, "grandchild_setsid": true, "pid_file": "pids"},
        {"type": "hang"}]}))
}

/// The pids in `file` once there are at least `n` (10 s).
pub async fn wait_pids(file: &Path, n: usize) -> Vec<i32> {
    for _ in 0..400 {
        let p = pids_in(file);
        if p.len() >= n {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("helpers did not start: {:?}", pids_in(file));
}

/// A command the scripted agent runs itself (`sh -c` in its cwd), asking nothing.
pub fn shell(cmd: &str) -> String {
    scenario(serde_json::json!({"steps": [
        {"type": "tool", "kind": "execute", "command": cmd, "ask": false, "via": "direct"}]}))
}

/// The text of the last tool-call update: the command's output.
pub fn output(evs: &[pb::TurnEvent]) -> String {
    evs.iter()
        .rev()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) if t.update && !t.status.is_empty() => {
                Some(t.content_text.clone())
            }
            _ => None,
        })
        .unwrap_or_default()
}
