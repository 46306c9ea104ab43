//! Issue 36's fairness bench, printed (not asserted): alice's SendMessage latency (p50, p99, max)
//! alone and under each of bob's floods, on the real daemons with default shares. Each flood runs
//! while alice sends `WARDEN_BENCH_SENDS` messages one after another (default 40):
//!
//! - `push`: 700 workers creating push configs whose host only a silent nameserver could answer;
//! - `idle-conns`: 3,000 TCP connections to the HTTP port that never send a byte;
//! - `new-contexts`: 120 workers each sending messages in new contexts, again and again;
//! - `hanging-turns`: 64 of bob's turns that sleep (his turn-slot share filled, more waiting).
//!
//! Run: `cargo bench -p warden-e2e --bench fairness` (or, on the debug build,
//! `cargo test -p warden-e2e --bench fairness`); `WARDEN_BENCH_FLOODS=ctx,hang` runs only the
//! floods named (push, idle, ctx, hang). The goal (issue 36): each flood leaves alice's
//! outcome unchanged and her p99 within 2x her baseline.
//!
//! First figures (debug daemons, 15 sends, this 2-core machine, bob's workers in the same
//! process and runtime as alice): baseline p50 85 / p99 129 ms; push 843 / 3,652 ms; idle-conns
//! 66 / 96 ms; new-contexts 632 / 1,727 ms; hanging-turns 94 / 1,336 ms.
//!
//! bob's floods now run on a runtime of their own at nice 19 (his client stands for another
//! machine; see `bob_runtime`). Figures then (20 sends, the machine also compiling at load 7):
//! baseline 103 / 162 ms; push 366 / 844 (5.2x); idle-conns 134 / 192 (1.2x); new-contexts
//! 952 / 2,402 (14.8x); hanging-turns 213 / 855 (5.3x); every message of alice's completed.
//! The outcome holds everywhere; the latency goal is met only under idle connections: bob's
//! requests are refused or queued within his shares, but what the daemons spend on them (and
//! his agents' starts) is not shared per principal. No per-principal CPU share exists yet.
//!
//! With the per-principal CPU shares (gateway requests and supervisor opens under
//! `warden-fairshare`, agents in per-principal cgroups; 20 sends, a quiet machine, load 2):
//! baseline 75 / 103 ms; push 210 / 342 (3.3x); idle-conns 68 / 96 (0.9x); new-contexts
//! 490 / 632 (6.1x); hanging-turns 87 / 234 (2.3x); every message completed. Better, not yet
//! within 2x: what is left is pre-token work (accepting and reading bob's fresh connections),
//! the turn drivers and conversation workers (not wrapped), and the blocking pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

const ALICE: &str = "alice-token-fairness-bench-0123456789";
const BOB: &str = "bob-token-fairness-bench-9876543210";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

async fn rpc(d: &Deployment, token: &str, method: &str, params: Value) -> Option<Value> {
    d.a2a_rpc(token, method, params).await.ok()
}

fn message(id: &str, context: Option<&str>, steps: Value) -> Value {
    let scenario = json!({ "steps": steps }).to_string();
    let mut m = json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": scenario}]});
    if let Some(c) = context {
        m["contextId"] = Value::from(c);
    }
    json!({ "message": m })
}

fn quick(id: &str) -> Value {
    message(
        id,
        None,
        json!([{"type": "message", "text": "done"}, {"type": "stop", "reason": "end_turn"}]),
    )
}

/// alice's `n` messages, one after another: each latency, and how many did not complete.
async fn alice(d: &Deployment, tag: &str, n: usize) -> (Vec<Duration>, usize) {
    let mut took = Vec::new();
    let mut failed = 0;
    for i in 0..n {
        let t0 = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(120),
            d.a2a_rpc(ALICE, "SendMessage", quick(&format!("alice-{tag}-{i}"))),
        )
        .await
        .unwrap_or_else(|_| Err("no answer in 120 s".into()));
        took.push(t0.elapsed());
        let state = r
            .as_ref()
            .ok()
            .and_then(|r| r["result"]["task"]["status"]["state"].as_str())
            .unwrap_or("");
        if state != "TASK_STATE_COMPLETED" {
            if failed == 0 {
                // What alice saw, once per flood: a count alone does not say which share refused.
                let said = match &r {
                    Ok(v) => v.to_string(),
                    Err(e) => e.clone(),
                };
                println!(
                    "  ({tag}: alice's first failure: {})",
                    said.chars().take(300).collect::<String>()
                );
            }
            failed += 1;
        }
    }
    (took, failed)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn row(name: &str, took: &[Duration], failed: usize, base_p99: Option<Duration>) {
    let p99 = pct(took, 0.99);
    let ratio = base_p99
        .map(|b| format!("{:.2}x", p99.as_secs_f64() / b.as_secs_f64().max(1e-6)))
        .unwrap_or_else(|| "-".into());
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} | {ratio} | {failed} |",
        pct(took, 0.5).as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        pct(took, 1.0).as_secs_f64() * 1e3,
    );
}

/// Where bob's floods run: a runtime of their own whose threads run at the lowest priority
/// (nice 19). bob's client stands for another machine: in alice's runtime his hundreds of tasks
/// would queue hers in this process, and at normal priority the flood's own CPU (a debug build's
/// JSON and HTTP) would be counted against the daemons. What remains is what the daemons do.
fn bob_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| {
            // This thread only (Linux: a thread's nice value is its own).
            // SAFETY: setpriority has no memory effects; a failure leaves the priority as it was.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
        })
        .build()
        .expect("bob's runtime")
}

/// Runs `flood` (given a stop flag) on bob's runtime while alice sends, then stops it.
async fn under<F, Fut>(
    bob: &tokio::runtime::Runtime,
    d: &Arc<Deployment>,
    tag: &str,
    n: usize,
    flood: F,
) -> (Vec<Duration>, usize)
where
    F: FnOnce(Arc<Deployment>, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let h = bob.spawn(flood(d.clone(), stop.clone()));
    // The flood builds up first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = alice(d, tag, n).await;
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(90), h).await;
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let n = std::env::var("WARDEN_BENCH_SENDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let sets = vec![
        (
            "gateway".to_string(),
            format!(
                "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
                digest(ALICE),
                digest(BOB)
            ),
        ),
        (
            "gateway".to_string(),
            format!(
                "push.nameservers=[\"{}\"]",
                silent.local_addr().expect("its address")
            ),
        ),
    ];
    let d = Arc::new(
        Deployment::up(Options {
            sets,
            ..Options::default()
        })
        .await,
    );
    let _ = alice(&d, "warm", 3).await;
    let bob = bob_runtime();
    let floods = std::env::var("WARDEN_BENCH_FLOODS").unwrap_or_default();
    let wanted = |name: &str| floods.is_empty() || floods.split(',').any(|f| f.trim() == name);
    println!("alice's SendMessage, {n} one after another, under each of bob's floods (ms):\n");
    println!("| flood | p50 | p99 | max | p99 / baseline p99 | not completed |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let (base, failed) = alice(&d, "base", n).await;
    let base_p99 = pct(&base, 0.99);
    row("none (baseline)", &base, failed, None);

    if wanted("push") {
        // push: configs on bob's own task, each naming a host only the silent nameserver could answer.
        let task = rpc(&d, BOB, "SendMessage", quick("bob-task"))
            .await
            .and_then(|r| r["result"]["task"]["id"].as_str().map(str::to_string))
            .expect("bob's task");
        let (t, f) = under(&bob, &d, "push", n, move |d, stop| async move {
            let mut ws = Vec::new();
            for w in 0..700 {
                let (d, stop, task) = (d.clone(), stop.clone(), task.clone());
                ws.push(tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let cfg = json!({"taskId": task, "id": format!("w{w}-{i}"),
                        "url": format!("https://hook-{w}-{i}.example.invalid/h")});
                        let _ = tokio::time::timeout(
                            Duration::from_secs(60),
                            rpc(&d, BOB, "CreateTaskPushNotificationConfig", cfg),
                        )
                        .await;
                    }
                }));
            }
            for w in ws {
                let _ = w.await;
            }
        })
        .await;
        row("push (700 workers, silent DNS)", &t, f, Some(base_p99));
    }

    if wanted("idle") {
        let (t, f) = under(&bob, &d, "idle", n, |d, stop| async move {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if held.len() < 3000 {
                    if let Ok(Ok(s)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::net::TcpStream::connect(&d.http),
                    )
                    .await
                    {
                        held.push(s);
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
        .await;
        row("idle-conns (3,000 silent TCP)", &t, f, Some(base_p99));
    }

    if wanted("ctx") {
        let (t, f) = under(&bob, &d, "ctx", n, |d, stop| async move {
            let mut ws = Vec::new();
            for w in 0..120 {
                let (d, stop) = (d.clone(), stop.clone());
                ws.push(tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let _ = rpc(&d, BOB, "SendMessage", quick(&format!("bob-{w}-{i}"))).await;
                    }
                }));
            }
            for w in ws {
                let _ = w.await;
            }
        })
        .await;
        row("new-contexts (120 workers)", &t, f, Some(base_p99));
    }

    if wanted("hang") {
        let (t, f) = under(&bob, &d, "hang", n, |d, stop| async move {
            let mut ws = Vec::new();
            for w in 0..64 {
                let (d, stop) = (d.clone(), stop.clone());
                ws.push(tokio::spawn(async move {
                    let steps = json!([{"type": "tool", "kind": "execute", "command": "sleep 20",
                    "ask": false, "via": "direct"}, {"type": "stop", "reason": "end_turn"}]);
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let m = message(&format!("bob-hang-{w}-{i}"), None, steps.clone());
                        let _ = rpc(&d, BOB, "SendMessage", m).await;
                    }
                }));
            }
            for w in ws {
                let _ = w.await;
            }
        })
        .await;
        row("hanging-turns (64 sleeping)", &t, f, Some(base_p99));
    }
    println!("\n(goal: not completed 0, p99 within 2x the baseline's)");
    bob.shutdown_background();
}
