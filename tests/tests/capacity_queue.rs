//! Issue 30 ("at capacity, work waits its turn") and issue 31 case 5 ("one principal's hanging
//! tasks take every turn slot"), through the A2A front as callers see it, with two principals
//! (`alice`, `bob`, each with its own token) against the real daemons:
//!
//! - more concurrent tasks over distinct contexts than live agents: every task COMPLETES (none
//!   fails `capacity`), and a caller whose task waited was told "queued for an agent, position N"
//!   while WORKING;
//! - alice fills her whole share of the turn slots with tasks that never finish (and queues more
//!   behind them): bob's one-line task still completes within a few seconds.

mod supervisor_support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

const ALICE: &str = "alice-token-capacity-0123456789";
const BOB: &str = "bob-token-capacity-9876543210";

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

async fn up(sets: &[(&str, &str)]) -> Deployment {
    let mut sets: Vec<(String, String)> = sets
        .iter()
        .map(|(d, kv)| (d.to_string(), kv.to_string()))
        .collect();
    sets.push((
        "gateway".into(),
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    ));
    Deployment::up(Options {
        sets,
        ..Options::default()
    })
    .await
}

/// What one caller saw of one streamed task: every event, in order.
struct Seen {
    events: Vec<Value>,
}

impl Seen {
    /// The last state the stream reported.
    fn state(&self) -> String {
        self.events
            .iter()
            .rev()
            .find_map(|e| {
                e["statusUpdate"]["status"]["state"]
                    .as_str()
                    .or(e["task"]["status"]["state"].as_str())
            })
            .unwrap_or("")
            .to_string()
    }

    /// The status messages' texts, in order.
    fn status_texts(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| {
                e["statusUpdate"]["status"]["message"]["parts"][0]["text"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    }

    /// Whether a status said the task waited for an agent, WORKING, with its place.
    fn queued_for_an_agent(&self) -> bool {
        self.events.iter().any(|e| {
            let s = &e["statusUpdate"]["status"];
            s["state"] == "TASK_STATE_WORKING"
                && s["message"]["parts"][0]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("queued for an agent, position "))
        })
    }
}

fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
    )
}

type Events = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send>,
>;

/// One streamed task as its caller reads it.
struct Streaming {
    sse: Events,
    seen: Seen,
}

impl Streaming {
    /// Sends one message (`message:stream`) in context `ctx` as `token`.
    async fn open(addr: &str, token: &str, ctx: &str, text: &str) -> Streaming {
        let body = json!({"message": {
            "messageId": format!("m-{ctx}"),
            "role": "ROLE_USER",
            "contextId": ctx,
            "parts": [{"text": text}],
        }});
        let resp = warden_cli::client::request(
            addr,
            http::Method::POST,
            "/a2a/rest/message:stream",
            token,
            Some(&body),
        )
        .await
        .expect("gateway reachable");
        assert_eq!(resp.status(), http::StatusCode::OK, "{ctx}");
        Streaming {
            sse: Box::pin(sse_stream::SseStream::new(resp.into_body())),
            seen: Seen { events: Vec::new() },
        }
    }

    /// Reads events until `done` holds for what was seen (true), the stream ends or `limit`
    /// passes (false).
    async fn until(&mut self, limit: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        let sse = &mut self.sse;
        let seen = &mut self.seen;
        tokio::time::timeout(limit, async {
            while let Some(Ok(ev)) = sse.next().await {
                let Some(data) = ev.data.filter(|d| !d.is_empty()) else {
                    continue;
                };
                seen.events
                    .push(serde_json::from_str(&data).unwrap_or(Value::Null));
                if done(seen) {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false)
    }

    /// The task's id (from its first event).
    fn task_id(&self) -> String {
        self.seen
            .events
            .iter()
            .find_map(|e| {
                e["task"]["id"]
                    .as_str()
                    .or(e["statusUpdate"]["taskId"].as_str())
            })
            .expect("a task id")
            .to_string()
    }
}

/// Streams one message to its end (a terminal state), or until `limit` passes.
async fn stream(
    addr: String,
    token: &'static str,
    ctx: String,
    text: String,
    limit: Duration,
) -> Seen {
    let mut s = Streaming::open(&addr, token, &ctx, &text).await;
    s.until(limit, |seen| is_terminal(&seen.state())).await;
    s.seen
}

fn sleeper(ms: u64, said: &str) -> String {
    json!({"steps": [{"type": "sleep", "ms": ms}, {"type": "message", "text": said}]}).to_string()
}

fn hang() -> String {
    json!({"steps": [{"type": "hang"}]}).to_string()
}

/// Issue 30's first case at a small scale: 2 live agents, 6 concurrent tasks in 6 new contexts.
/// Before, the opens beyond the busy agents failed `capacity`; now every task completes, and
/// those that waited said so while WORKING.
#[tokio::test(flavor = "multi_thread")]
async fn more_tasks_than_live_agents_all_complete_and_a_waiting_caller_is_told_queued_for_an_agent()
{
    const TASKS: usize = 6;
    let d = up(&[
        ("supervisor", "limits.max_live_agents=2"),
        // One principal sends them all: its share must cover both agents.
        ("supervisor", "limits.max_active_turns_per_principal=8"),
    ])
    .await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..TASKS {
        let addr = d.http.clone();
        set.spawn(async move {
            let seen = stream(
                addr,
                ALICE,
                format!("wave-{i}"),
                sleeper(1500, &format!("done {i}")),
                Duration::from_secs(90),
            )
            .await;
            (i, seen)
        });
    }
    let mut queued = 0;
    while let Some(r) = set.join_next().await {
        let (i, seen) = r.unwrap();
        assert_eq!(
            seen.state(),
            "TASK_STATE_COMPLETED",
            "task {i}: {:#?}",
            seen.status_texts()
        );
        assert!(
            seen.events
                .iter()
                .any(|e| e.to_string().contains(&format!("done {i}"))),
            "task {i} has its answer"
        );
        if seen.queued_for_an_agent() {
            queued += 1;
        }
    }
    // Six tasks of 1.5 s each on two agents: at least the last ones waited for one.
    assert!(queued >= 1, "no caller was told it waited for an agent");
    eprintln!("{queued} of {TASKS} tasks waited for an agent");
}

/// Issue 30, the caller's view of a cancel while queued: with both live agents held by hanging
/// tasks, a third task is WORKING "queued for an agent"; `tasks/{id}:cancel` ends it CANCELED
/// at once, and it never started (no agent was spawned for it).
#[tokio::test(flavor = "multi_thread")]
async fn a_task_queued_for_an_agent_is_cancelled_while_it_waits() {
    let d = up(&[
        ("supervisor", "limits.max_live_agents=2"),
        ("supervisor", "limits.max_active_turns_per_principal=8"),
    ])
    .await;
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = Streaming::open(&d.http, ALICE, &format!("hold-{i}"), &hang()).await;
        // Running: the agent has the task.
        assert!(
            s.until(Duration::from_secs(30), |seen| seen.state()
                == "TASK_STATE_WORKING")
                .await,
            "{:#?}",
            s.seen.events
        );
        held.push(s);
    }
    let mut sup = supervisor_support::client(&d);
    let t0 = Instant::now();
    while supervisor_support::status(&mut sup).await["turns_running"] != "2" {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the hanging tasks never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut w = Streaming::open(&d.http, BOB, "waits", "write w.txt").await;
    assert!(
        w.until(Duration::from_secs(30), Seen::queued_for_an_agent)
            .await,
        "{:#?}",
        w.seen.events
    );
    let st = supervisor_support::status(&mut sup).await;
    assert_eq!(st["turns_waiting_agent"], "1", "{st:?}");
    let id = w.task_id();
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        &format!("/a2a/rest/tasks/{id}:cancel"),
        BOB,
        None,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    assert!(
        w.until(Duration::from_secs(10), |seen| is_terminal(&seen.state()))
            .await,
        "{:#?}",
        w.seen.events
    );
    assert_eq!(w.seen.state(), "TASK_STATE_CANCELED");
    let st = supervisor_support::status(&mut sup).await;
    assert_eq!(st["turns_waiting_agent"], "0", "{st:?}");
    assert_eq!(
        st["live_agents"], "2",
        "no agent was started for it: {st:?}"
    );
    drop(held);
}

/// Issue 31 case 5: alice fills her whole share of the turn slots (the default, three quarters:
/// 3 of `max_active_turns = 4`) with tasks that never finish, and queues two more behind them;
/// bob's one-line task still completes within a few seconds. Before, her fourth task took the
/// last slot and bob waited behind her fifth for the whole turn timeout.
#[tokio::test(flavor = "multi_thread")]
async fn bob_completes_within_seconds_while_alice_holds_her_whole_share_with_hanging_tasks() {
    let d = up(&[("supervisor", "limits.max_active_turns=4")]).await;
    let mut sup = supervisor_support::client(&d);
    let st = supervisor_support::status(&mut sup).await;
    assert_eq!(st["max_active_turns_per_principal"], "3", "{st:?}");
    let mut alice = Vec::new();
    for i in 0..5 {
        let addr = d.http.clone();
        alice.push(tokio::spawn(stream(
            addr,
            ALICE,
            format!("alice-{i}"),
            hang(),
            Duration::from_secs(120),
        )));
    }
    // Her share runs, the rest waits for a slot.
    let t0 = Instant::now();
    loop {
        let st = supervisor_support::status(&mut sup).await;
        if st["turns_running"] == "3" && st["turns_waiting_admission"] == "2" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "alice's tasks never filled her share: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    let bob = stream(
        d.http.clone(),
        BOB,
        "bob-1".into(),
        "write a.txt".into(),
        Duration::from_secs(30),
    )
    .await;
    let took = t0.elapsed();
    eprintln!("bob's task took {took:?} while alice held her share");
    assert_eq!(
        bob.state(),
        "TASK_STATE_COMPLETED",
        "{:#?}",
        bob.status_texts()
    );
    assert!(took < Duration::from_secs(5), "bob's task took {took:?}");
    // Alice's are still there, hers still waiting: only she is slowed by her limit.
    let st = supervisor_support::status(&mut sup).await;
    assert_eq!(st["turns_running"], "3", "{st:?}");
    assert_eq!(st["turns_waiting_admission"], "2", "{st:?}");
    for a in &alice {
        assert!(!a.is_finished(), "an alice task ended");
    }
    for a in alice {
        a.abort();
    }
}
