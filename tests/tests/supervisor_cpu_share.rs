//! Issue 36, agents' CPU: under contention a principal's agents share one CPU weight, so bob's
//! four spinning agents get together what alice's one gets alone — not four times it.
//!
//! Five agents spin at once for a few seconds on this machine's two cores: one of alice's and
//! four of bob's, each counting the loop iterations it managed. Shared per process, alice's
//! agent would count about as many as each of bob's; shared per principal it counts about four
//! times as many (her group has half the machine, his four share the other half). Counted, not
//! timed: what is compared is work done in the same seconds, whatever else loads the machine.
//! Skips, saying so, where agents cannot run contained or the host has no writable `cpu`
//! hierarchy of its own (cgroup v1; see `crates/sandbox/src/cpu_share.rs`).

mod supervisor_support;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

/// Spins for `secs` seconds of wall time, then prints how many iterations it did.
fn spin(secs: u32) -> String {
    format!(
        "i=0; end=$(( $(date +%s) + {secs} )); while :; do i=$((i+1)); \
         if [ $((i % 20000)) -eq 0 ] && [ $(date +%s) -ge $end ]; then break; fi; done; \
         echo iterations=$i"
    )
}

fn spinning_turn(ctx: &str, principal: &str, id: &str) -> pb::RunTurnRequest {
    let steps = json!([
        {"type": "tool", "kind": "execute", "command": spin(6), "ask": false, "via": "direct"},
        {"type": "stop", "reason": "end_turn"}
    ]);
    let mut t = turn(ctx, id, &scenario(json!({ "steps": steps })));
    if let Some(o) = t.open.as_mut() {
        o.principal = principal.into();
    }
    t
}

fn iterations(evs: &[pb::TurnEvent]) -> u64 {
    evs.iter()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) => t
                .content_text
                .split("iterations=")
                .nth(1)
                .and_then(|n| n.split_whitespace().next())
                .and_then(|n| n.parse().ok()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no iteration count in {evs:#?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principals_many_agents_get_the_cpu_of_one() {
    if !runs_contained() {
        return;
    }
    let d = deploy(&[
        ("supervisor", "limits.max_active_turns=8"),
        ("supervisor", "limits.max_starting_agents=8"),
    ])
    .await;
    let mut c = client(&d);
    let st = status(&mut c).await;
    let root = st.get("cpu_share").cloned().unwrap_or_default();
    if root == "off" || root.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "under CI: the supervisor found no cgroup cpu hierarchy to share CPU per principal"
        );
        println!("SKIP: no writable cgroup v1 cpu hierarchy on this host");
        return;
    }
    let mut runs = Vec::new();
    for (i, who) in ["alice", "bob", "bob", "bob", "bob"].iter().enumerate() {
        let mut c = client(&d);
        let req = spinning_turn(&format!("spin-{i}"), who, &format!("s{i}"));
        runs.push(tokio::spawn(async move {
            let mut s = start(&mut c, req).await;
            collect(&mut s, std::time::Duration::from_secs(120)).await
        }));
    }
    // While they spin: one group per principal, each holding its agents.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let during = status(&mut c).await;
    let groups = std::fs::read_dir(&root)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("p-"))
                .count()
        })
        .unwrap_or(0);
    let mut counts = Vec::new();
    for r in runs {
        counts.push(iterations(&r.await.expect("the turn's task")));
    }
    let alice = counts[0] as f64;
    let bob: f64 = counts[1..].iter().map(|n| *n as f64).sum::<f64>() / 4.0;
    println!(
        "iterations in 6 s: alice {alice}, bob's four {:?}",
        &counts[1..]
    );
    assert_eq!(
        groups, 2,
        "one CPU group per principal under {root}: {during:?}"
    );
    // Per process, alice ≈ each of bob's (ratio ~1); per principal, ~4 (2 on a host whose
    // other load leaves her less than a core). 2 sits between the two.
    assert!(
        alice >= 2.0 * bob,
        "alice's one agent did {alice} iterations, bob's four {:?} each: CPU is not shared per principal",
        &counts[1..]
    );
    // Once the agents are gone, so are their groups (the conversations stay open).
    drop(d);
}
