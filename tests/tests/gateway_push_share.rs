//! Issue 36, finding 2: "push webhook DNS on the blocking pool". Two principals (`alice`, `bob`,
//! each with its own token) against the real daemons on default settings, the gateway's webhook
//! nameserver (`push.nameservers`) a UDP socket this test holds open and never answers.
//!
//! - bob floods `CreateTaskPushNotificationConfig` (hundreds in flight, again and again, each
//!   naming a host whose lookup never gets an answer) while alice sends quick messages: her
//!   `SendMessage` latency stays within twice her own baseline (measured just before, in the same
//!   test) plus slack for a loaded machine, and her outcome is unchanged. Before the fix each of
//!   bob's lookups held a thread of tokio's 512-thread blocking pool past its timeout, and the task
//!   store's flush (which alice's answer waits for) queued behind them: 0.15 s became 56 s.
//!   bob's requests past his share of lookups are refused at once in the protocol's shape
//!   (-32029, `push.max_lookups_per_principal`).
//! - bob's 11th config on one task is refused (`push.max_configs_per_task`) without a lookup: at
//!   once, not after the lookup's timeout.
//!
//! Against a gateway that has no `push.nameservers` (main's binaries:
//! `WARDEN_BIN_DIR=<dir> WARDEN_PUSH_SHARE_SYSTEM_DNS=1`), the key is left out and the system's
//! resolver must be the silent one (run the test where `/etc/resolv.conf` names a nameserver that
//! never answers, e.g. in a mount namespace with a bind-mounted resolv.conf).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use warden_e2e::{Deployment, Options};

const ALICE: &str = "alice-token-push-share-0123456789";
const BOB: &str = "bob-token-push-share-9876543210";

/// bob's requests in flight at once, and how long he keeps it up.
const FLOOD: usize = 700;
const FLOOD_FOR: Duration = Duration::from_secs(25);

fn digest(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

async fn rpc(d: &Deployment, token: &str, method: &str, params: Value) -> Value {
    d.a2a_rpc(token, method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn quick(id: &str, text: &str) -> Value {
    let scenario = json!({"steps": [{"type": "message", "text": text},
                                     {"type": "stop", "reason": "end_turn"}]})
    .to_string();
    json!({"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": scenario}]}})
}

/// One of alice's messages to the end: how long it took, and what she saw (state and text).
async fn alice_sends(d: &Deployment, n: usize) -> (Duration, (String, String)) {
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        rpc(
            d,
            ALICE,
            "SendMessage",
            quick(&format!("alice-{n}"), "alice's answer"),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("alice's SendMessage {n} got no answer within 120 s"));
    let took = started.elapsed();
    let task = &r["result"]["task"];
    let text = task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect::<String>();
    (
        took,
        (
            task["status"]["state"].as_str().unwrap_or("").to_string(),
            text,
        ),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn up(nameserver: &str) -> Deployment {
    let mut sets = vec![(
        "gateway".to_string(),
        format!(
            "auth.tokens=[{{principal=\"alice\", sha256=\"{}\"}}, {{principal=\"bob\", sha256=\"{}\"}}]",
            digest(ALICE),
            digest(BOB)
        ),
    )];
    if std::env::var_os("WARDEN_PUSH_SHARE_SYSTEM_DNS").is_none() {
        sets.push((
            "gateway".into(),
            format!("push.nameservers=[\"{nameserver}\"]"),
        ));
    }
    Deployment::up(Options {
        sets,
        ..Options::default()
    })
    .await
}

/// A completed task of bob's to hang configs on.
async fn bobs_task(d: &Deployment, id: &str) -> String {
    let r = rpc(d, BOB, "SendMessage", quick(id, "bob's answer")).await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    r["result"]["task"]["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bobs_silent_webhook_lookups_leave_alices_messages_as_fast_as_before() {
    // Reads nothing, answers nothing: every query to it waits for its timeout.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let d = up(&silent.local_addr().unwrap().to_string()).await;

    // alice alone: her baseline and what she sees.
    let _ = alice_sends(&d, 0).await; // warms the agent path up
    let mut baseline = Vec::new();
    let mut outcome = None;
    for n in 1..=3 {
        let (took, seen) = alice_sends(&d, n).await;
        assert_eq!(seen.0, "TASK_STATE_COMPLETED", "{seen:?}");
        outcome.get_or_insert(seen.clone());
        assert_eq!(Some(&seen), outcome.as_ref());
        baseline.push(took);
    }
    let baseline = median(baseline);

    // bob floods: FLOOD workers, each creating a config again and again for FLOOD_FOR, naming a
    // new host each time (ids c0..c9 reused: a replaced config passes the per-task limit, so
    // every request asks for a lookup).
    let tid = bobs_task(&d, "bob-flood").await;
    let stop = Instant::now() + FLOOD_FOR;
    let (sent, shared_out, other) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::<String>::new())),
    );
    let mut workers = Vec::new();
    for w in 0..FLOOD {
        let (http, tid) = (d.http.clone(), tid.clone());
        let (sent, shared_out, other) = (sent.clone(), shared_out.clone(), other.clone());
        workers.push(tokio::spawn(async move {
            // Staggered, as callers arrive (a burst of new connections is the HTTP edge's
            // business, not this test's).
            tokio::time::sleep(Duration::from_millis(3 * w as u64)).await;
            let mut i = 0;
            while Instant::now() < stop {
                i += 1;
                let body = json!({"jsonrpc": "2.0", "id": 1,
                    "method": "CreateTaskPushNotificationConfig",
                    "params": {"taskId": tid, "id": format!("c{}", w % 10),
                               "url": format!("https://hook-{w}-{i}.example.com/h")}});
                sent.fetch_add(1, Ordering::Relaxed);
                let call = async {
                    match warden_cli::client::request(
                        &http,
                        http::Method::POST,
                        "/a2a/jsonrpc",
                        BOB,
                        Some(&body),
                    )
                    .await
                    {
                        Ok(resp) => warden_cli::client::read_answer(resp)
                            .await
                            .map(|a| a.0)
                            .unwrap_or(Value::Null),
                        Err(_) => Value::Null,
                    }
                };
                let answer = tokio::time::timeout(Duration::from_secs(60), call)
                    .await
                    .unwrap_or_else(|_| json!({"error": "no answer within 60 s"}));
                if answer["error"]["code"] == -32029 {
                    shared_out.fetch_add(1, Ordering::Relaxed);
                } else if answer["result"].is_null() {
                    other.lock().unwrap().push(answer.to_string());
                }
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        }));
    }
    // Long enough for the lookups to pile up (each holds its thread on the old gateway).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut during = Vec::new();
    for n in 11..=13 {
        let (took, seen) = alice_sends(&d, n).await;
        assert_eq!(
            Some(&seen),
            outcome.as_ref(),
            "alice's outcome changed under bob's flood"
        );
        during.push(took);
    }
    let during_max = *during.iter().max().unwrap();
    let during = median(during);
    for w in workers {
        w.await.unwrap();
    }
    // Right after bob stopped (his last lookups still timing out on the old gateway).
    let (after, seen) = alice_sends(&d, 20).await;
    assert_eq!(Some(&seen), outcome.as_ref());
    let (sent, shared_out) = (
        sent.load(Ordering::Relaxed),
        shared_out.load(Ordering::Relaxed),
    );
    let other = other.lock().unwrap().clone();
    eprintln!(
        "alice's SendMessage: baseline {baseline:?}, under bob's flood median {during:?} (max {during_max:?}), after {after:?}; bob sent {sent} configs, {shared_out} refused past his share, {} other errors",
        other.len()
    );
    let slack = Duration::from_secs(3);
    assert!(
        during <= baseline * 2 + slack,
        "alice's SendMessage took {during:?} under bob's flood, her baseline {baseline:?}"
    );
    assert!(
        after <= baseline * 2 + slack,
        "alice's SendMessage took {after:?} after bob's flood, her baseline {baseline:?}"
    );
    // bob was told why, in the protocol's shape; nothing else went wrong for him.
    assert!(
        shared_out > 0,
        "no request of bob's was refused past his share"
    );
    assert!(
        other
            .iter()
            .all(|e| e.contains("-32029") || e.contains("-32602")),
        "{other:?}"
    );
}

#[tokio::test]
async fn the_eleventh_config_of_a_task_is_refused_before_any_lookup() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let d = up(&silent.local_addr().unwrap().to_string()).await;
    let tid = bobs_task(&d, "bob-ten").await;
    // Ten configs at public IP literals (no lookup; never contacted: the task has ended).
    for i in 0..10 {
        let r = rpc(
            &d,
            BOB,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": tid, "id": format!("lit{i}"), "url": format!("https://8.8.{i}.8/h")}),
        )
        .await;
        assert!(r["result"].is_object(), "{r}");
    }
    // The eleventh names a host whose lookup would never be answered: refused at once.
    let started = Instant::now();
    let r = rpc(
        &d,
        BOB,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": tid, "url": "https://eleventh.example.com/h"}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("push.max_configs_per_task"),
        "{r}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the 11th config took {took:?}: it waited for a lookup"
    );
    // A name on a task with room waits for the lookup and is kept (checked again at delivery).
    let other = bobs_task(&d, "bob-room").await;
    let started = Instant::now();
    let r = rpc(
        &d,
        BOB,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": other, "url": "https://unanswered.example.com/h"}),
    )
    .await;
    assert!(r["result"].is_object(), "{r}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the lookup was not made: {:?}",
        started.elapsed()
    );
}
