//! Supervisor end to end, a hostile agent's request bodies (issue 35, finding 3): permission
//! requests with multi-megabyte raw inputs (3.9 MiB, under the gRPC message bound; 5 MiB, over
//! it) and deeply nested ones, from one conversation, while another conversation asks for 100
//! reads. The real supervisor and policy, the real scripted agent with its `flood` step.
//!
//! Before: each 3.9 MiB request was refused by the policy as malformed yet left about 9 MiB in
//! its audit store, each 5 MiB one ended the one `DecideStream` every conversation shares (the
//! other conversation's reads became "policy unavailable"), a nested one was judged (and an
//! execute in an owned root ALLOWed). Now the supervisor refuses every one of them itself,
//! without sending it: DENY with the bound's rule, kept as kind, size and digest; the policy's
//! store does not grow by them, and the other conversation's reads are all ALLOWed, on time.
//!
//! And on time because the megabytes are parsed, serialised and measured on the blocking pool,
//! one request at a time per conversation: in place, on the runtime's threads, they held the
//! other conversation's decisions behind them (CI measured a median of 516 ms against 27 ms).

mod supervisor_support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

/// The stated bound on the supervisor's resident memory during the attack.
const RSS_BOUND_KIB: u64 = 300 * 1024;
/// The stated bound on what the policy's store may grow by during the attack (the other
/// conversation's 100 records and sled's own bookkeeping; before, 40 requests left ~360 MiB).
const STORE_GROWTH_BOUND: u64 = 16 << 20;

/// The other conversation's turns (of 100 reads each) measured during the attack, at most.
const CALM_TURNS: usize = 10;

fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => n += dir_bytes(&e.path()),
            // Allocated blocks: sled and the journal preallocate, what counts is what grew.
            Ok(m) => n += std::os::unix::fs::MetadataExt::blocks(&m) * 512,
            Err(_) => {}
        }
    }
    n
}

fn flood_results(said: &str) -> Vec<serde_json::Value> {
    said.split("flood-result: ")
        .skip(1)
        .filter_map(|r| {
            serde_json::Deserializer::from_str(r.trim_start())
                .into_iter::<serde_json::Value>()
                .next()
                .and_then(Result::ok)
        })
        .collect()
}

/// 100 reads, asked 50 at a time (an agent has at most 64 requests in flight).
fn reads() -> String {
    let fifty = json!({"type": "flood", "method": "session/request_permission", "count": 50});
    scenario(json!({"steps": [fifty, fifty]}))
}

/// (all ALLOWed, count, p50 and max of the policy latency in µs) of a turn's permissions.
fn decided(evs: &[pb::TurnEvent]) -> (bool, usize, u64, u64) {
    let p = permissions(evs);
    let mut lat: Vec<u64> = p.iter().map(|p| p.policy_latency_micros).collect();
    lat.sort_unstable();
    let p50 = lat.get(lat.len() / 2).copied().unwrap_or(0);
    let max = lat.last().copied().unwrap_or(0);
    (
        p.iter().all(|p| p.verdict == pb::Verdict::Allow as i32),
        p.len(),
        p50,
        max,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_agents_request_bodies_change_nothing_for_another_conversation() {
    // Decisions must not be denied for lack of time on a loaded test host: what is measured is
    // whether they are answered at all, and how fast compared with the same host unattacked.
    let mut d = deploy(&[("supervisor", "policy.decide_deadline_ms=5000")]).await;
    let pid = d.daemon("supervisor").unwrap().pid();
    let store = d.layout.state_of("policy").join("store");
    let mut calm = client(&d);
    let mut hostile = client(&d);

    // The other conversation alone: its 100 reads, all ALLOWed, and how fast.
    let evs = run(&mut calm, turn("calm", "calm-0", &reads())).await;
    let (all, n, base_p50, base_max) = decided(&evs);
    assert!(
        all && n == 100,
        "unattacked: {n} decided, all allowed {all}"
    );
    // The hostile conversation is open (its agent started) before anything is measured.
    let evs = run(&mut hostile, turn("hostile", "hostile-0", "hello")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");

    let store_before = dir_bytes(&store);
    let sampler = RssSampler::start(pid);

    let attack = scenario(json!({"steps": [
        {"type": "flood", "method": "session/request_permission", "count": 40,
         "raw_input_bytes": 3_900_000},
        {"type": "flood", "method": "session/request_permission", "count": 20,
         "raw_input_bytes": 5_000_000},
        {"type": "flood", "method": "session/request_permission", "count": 20,
         "nest_depth": 100},
        {"type": "flood", "method": "session/request_permission", "count": 40,
         "raw_input_bytes": 3_900_000},
    ]}));
    let t0 = Instant::now();
    let mut s = start(&mut hostile, turn("hostile", "hostile-1", &attack)).await;
    let attacking = tokio::spawn(async move { collect(&mut s, Duration::from_secs(180)).await });
    // The other conversation's turns while the attack runs: each 100 reads.
    let mut during = Vec::new();
    let mut i = 1;
    while (!attacking.is_finished() || during.is_empty()) && during.len() < CALM_TURNS {
        let evs = run(&mut calm, turn("calm", &format!("calm-{i}"), &reads())).await;
        during.push(decided(&evs));
        i += 1;
        // Spread over the attack (its floods of each kind come one after another).
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    let evs = attacking.await.unwrap();
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Rss {
        before: rss_before,
        peak,
        ..
    } = sampler.stop().await;
    let store_after = dir_bytes(&store);
    println!(
        "attack of 120 requests took {took:?}; the other conversation ran {} turns of 100 reads \
         meanwhile: (all allowed, decided, p50 µs, max µs) {during:?}, unattacked p50 {base_p50} \
         µs max {base_max} µs; supervisor VmRSS before {rss_before} KiB, peak {peak} KiB; policy \
         store {store_before} -> {store_after} bytes",
        during.len()
    );

    // Every hostile request was refused by the supervisor itself: DENY with the bound's rule,
    // a local decision (never sent), its title a bounded stand-in naming size and digest.
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{:?}", stop(&evs));
    let results = flood_results(&text(&evs));
    assert_eq!(results.len(), 4, "{results:?}");
    // Each hostile request is answered: refused by the bound (the `reject` option), or — when the
    // agent has more of its megabytes waiting to be handled than the supervisor holds for it
    // (`acp.max_incoming_bytes`) — with the error telling it to wait. Never anything else.
    let mut answered = [0usize; 4];
    for ((r, n), a) in results
        .iter()
        .zip([40u64, 20, 20, 40])
        .zip(answered.iter_mut())
    {
        let ok = r["ok"].as_u64().unwrap_or(0);
        let errors = r["errors"].as_u64().unwrap_or(0);
        assert_eq!(ok + errors, n, "{r}");
        assert!(ok > 0, "none refused by the bound: {r}");
        assert_eq!(r["selected"], json!({"reject": ok}), "{r}");
        if errors > 0 {
            let e = r["first_error"].as_str().unwrap_or_default();
            assert!(e.contains("bytes of requests in flight"), "{r}");
        }
        *a = ok as usize;
    }
    let refused = permissions(&evs);
    assert_eq!(refused.len(), answered.iter().sum::<usize>());
    for p in &refused {
        assert_eq!(p.verdict, pb::Verdict::Deny as i32, "{p:?}");
        assert!(p.decision_id.starts_with("local-"), "{p:?}");
        assert!(p.tool_title.len() < 300, "{} bytes", p.tool_title.len());
        assert!(p.tool_title.contains("sha256:"), "{}", p.tool_title);
    }
    let rules = |r: &str| refused.iter().filter(|p| p.rule == r).count();
    assert_eq!(
        rules("request.malformed.raw-input-too-large"),
        answered[0] + answered[1] + answered[3]
    );
    // The nested ones are small: all of them get to the bound.
    assert_eq!(rules("request.malformed.too-deeply-nested"), 20);
    // Nothing of them reached the policy's audit.
    assert_eq!(
        audit_of(&d, "hostile").await.len(),
        0,
        "the policy saw the hostile requests"
    );

    // The other conversation: every read ALLOWed, at its usual pace.
    for (i, (all, n, p50, _max)) in during.iter().enumerate() {
        assert!(
            *all && *n == 100,
            "turn {}: {n} decided, all allowed {all}",
            i + 1
        );
        assert!(
            *p50 <= (10 * base_p50).max(100_000),
            "turn {}: median decision {p50} µs (unattacked {base_p50} µs)",
            i + 1
        );
    }
    assert!(
        store_after.saturating_sub(store_before) < STORE_GROWTH_BOUND,
        "the policy's store grew by {} bytes",
        store_after.saturating_sub(store_before)
    );
    assert!(
        peak < RSS_BOUND_KIB,
        "the supervisor grew to {peak} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
}
