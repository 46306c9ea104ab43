//! Supervisor end to end, issue 36 finding 6: agent starts have a share per principal. A
//! conversation's open starts its agent before any turn slot applies, and the start slots
//! (`limits.max_starting_agents`) were one FIFO that knew no principal: bob's burst of 120 new
//! contexts queued alice's one new context behind all of them (4.5 s instead of 0.05 s; with real
//! adapters, 0.5–2 s a start, far worse). Now the starts waiting are served round robin across
//! principals and one principal holds at most `limits.max_starting_agents_per_principal` of them.
//!
//! The agent is the scripted agent behind `sleep 0.4` (a slow start that costs no CPU, as a real
//! adapter's model-less start mostly waits): alice's open-to-first-event latency is measured
//! alone, then while bob's 120 opens wait for start slots, and must stay within twice her own
//! baseline plus a generous slack for a loaded machine. On the old FIFO she waits behind most of
//! the burst (120 / 4 slots × 0.4 s ≈ 12 s).

mod supervisor_support;

use std::time::{Duration, Instant};

use supervisor_support::*;
use warden_proto::v1 as pb;

const BURST: usize = 120;
const START_DELAY: &str = "0.4";

/// The `slow` agent: the scripted agent, started after a `sleep`, by a script in `dir` next to a
/// link of the scripted agent (the sandbox binds the program's own directory, not the build's).
fn slow_agent(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    let agent = warden_e2e::binary("warden-scripted-agent");
    let linked = dir.join("warden-scripted-agent");
    if std::fs::hard_link(&agent, &linked).is_err() {
        std::fs::copy(&agent, &linked).expect("copy the scripted agent");
    }
    let script = dir.join("slow-agent");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsleep {START_DELAY}\nexec {}\n",
            linked.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Reachable (search only) by the agent's uid, as the build's own directory is.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    vec![
        (
            "supervisor",
            format!("agents.slow.command={:?}", script.display().to_string()),
        ),
        // Four start slots whatever the host's cores (the default is two per core).
        ("supervisor", "limits.max_starting_agents=4".into()),
        // Room for the whole burst alive at once: the starts are what is measured.
        ("supervisor", "limits.max_live_agents=200".into()),
        ("supervisor", "limits.max_conversations=256".into()),
    ]
}

fn open_as(ctx: &str, principal: &str) -> pb::OpenConversationRequest {
    let mut o = open(ctx, pb::Profile::WorkspaceWrite);
    o.principal = principal.into();
    o.agent = "slow".into();
    o
}

/// alice's turn in a new context: the time from the call to its first event, and its events.
async fn alice_new_context(c: &mut Client, ctx: &str) -> (Duration, Vec<pb::TurnEvent>) {
    let mut t = turn(ctx, "t1", "write a.txt");
    t.open = Some(open_as(ctx, "alice"));
    let t0 = Instant::now();
    let mut s = start(c, t).await;
    let first = tokio::time::timeout(Duration::from_secs(120), s.message())
        .await
        .unwrap_or_else(|_| panic!("no first event of alice's turn in {ctx} within 120 s"))
        .unwrap_or_else(|e| panic!("alice's stream in {ctx}: {e}"))
        .unwrap_or_else(|| panic!("alice's stream in {ctx} ended at once"));
    let took = t0.elapsed();
    let mut evs = vec![first];
    if !matches!(evs[0].event, Some(pb::turn_event::Event::Stop(_))) {
        evs.extend(collect(&mut s, Duration::from_secs(60)).await);
    }
    (took, evs)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_one_principals_new_contexts_does_not_queue_anothers_start() {
    let bin = tempfile::tempdir_in(parent()).unwrap();
    let sets = slow_agent(bin.path());
    let sets: Vec<(&str, &str)> = sets.iter().map(|(d, kv)| (*d, kv.as_str())).collect();
    let d = deploy(&sets).await;
    let mut alice = client(&d);

    // alice alone: her baseline (the better of two, so one slow moment does not set it).
    let mut baseline = Duration::MAX;
    for i in 0..2 {
        let (took, evs) = alice_new_context(&mut alice, &format!("alice-base-{i}")).await;
        assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
        baseline = baseline.min(took);
    }
    println!(
        "alice alone: {} ms to her first event",
        baseline.as_millis()
    );

    // bob's burst: 120 new contexts at once, over four connections of his own.
    let bobs: Vec<Client> = (0..4).map(|_| client(&d)).collect();
    let burst_started = Instant::now();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..BURST {
        let mut c = bobs[i % bobs.len()].clone();
        let opened = opened.clone();
        burst.spawn(async move {
            let r = c
                .open_conversation(open_as(&format!("bob-{i}"), "bob"))
                .await
                .map(|_| ())
                .map_err(|e| format!("bob-{i}: {e}"));
            opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            r
        });
    }
    // Most of the burst waits for start slots by now (4 slots, 0.4 s a start).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (took, evs) = alice_new_context(&mut alice, "alice-during").await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    let under = BURST - opened.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "alice during bob's burst of {BURST}: {} ms to her first event ({under} of bob's opens \
         still under way)",
        took.as_millis()
    );
    assert!(
        under > BURST / 2,
        "the burst was mostly over before alice's start ({under} of {BURST} opens left): the \
         test measured nothing"
    );
    let slack = Duration::from_secs(3);
    assert!(
        took <= baseline * 2 + slack,
        "alice's new context took {} ms while bob's burst waited for start slots; alone {} ms \
         (allowed: twice that + {} s)",
        took.as_millis(),
        baseline.as_millis(),
        slack.as_secs()
    );

    // bob's burst is served all the same: every open succeeds, behind his own.
    let mut failed = Vec::new();
    while let Some(r) = burst.join_next().await {
        if let Err(e) = r.expect("an open task panicked") {
            failed.push(e);
        }
    }
    assert!(failed.is_empty(), "bob's opens failed: {failed:#?}");
    println!(
        "bob's burst of {BURST} opened in {} ms",
        burst_started.elapsed().as_millis()
    );

    // `warden status` shows the share in force: three quarters of the 4 slots.
    let st = status(&mut alice).await;
    assert_eq!(st["max_starting_agents"], "4", "{st:?}");
    assert_eq!(st["max_starting_agents_per_principal"], "3", "{st:?}");
    assert_eq!(st["starts_waiting"], "0", "{st:?}");
}
