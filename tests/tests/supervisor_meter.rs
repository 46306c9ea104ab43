//! Supervisor end to end, every request metered (issue 35, finding 4): the real policy and
//! supervisor, the real scripted agent with terminals (`agents.scripted.terminal=true`) playing a
//! hostile agent.
//!
//! * An agent that goes on after its turn was answered (alive until the idle stop) and asks for
//!   600 permissions, reads, writes, terminals and terminal output: every one is refused in
//!   ACP's shape (a permission `cancelled`, the rest a `-32602` error saying no turn is
//!   running), none is decided (the policy's audit of the conversation does not change), none
//!   touches a file, and each is counted in `warden_supervisor_requests_between_turns_total`.
//!   Before, the 600 permissions were 600 decisions audited and the reads were served.
//! * One turn that asks for 300 terminals, each writing 300 KB of output, and holds them: at
//!   most `limits.max_terminals` (16) are held and decided, the rest are refused before any
//!   decision, the supervisor's resident memory stays within [`RSS_GROWTH_BOUND_KIB`] of where
//!   it was, and another conversation's turns are served meanwhile. Before, all 300 ran, were
//!   audited, and held their output (RSS 15 → 93 MiB in the finding's release build).
//! * The held output across a conversation's terminals is bounded on its own
//!   (`limits.terminal_output_bytes`), a terminal released gives its share back, and every
//!   `terminal/create` counts against the turn's quota (`limits.terminals_per_turn`, 64): the
//!   65th ends the turn with fault `request-limit`.

mod supervisor_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use supervisor_support::*;
use warden_proto::v1 as pb;

/// How much the supervisor's resident memory may grow while one conversation floods it with
/// terminals: the 4 MiB of output the conversation may hold (`limits.terminal_output_bytes`),
/// plus what 64 requests in flight, 16 live terminals' tasks and pipes, the other
/// conversation's turns and the allocator's slack take. 300 terminals holding 256 KiB each, as
/// before, are 75 MiB of output alone.
const RSS_GROWTH_BOUND_KIB: u64 = 24 * 1024;

fn flood(method: &str, count: usize, extra: Value) -> Value {
    let mut v = json!({"type": "flood", "method": method, "count": count});
    if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        v.extend(extra.clone());
    }
    v
}

/// The `flood-result` lines an agent said (in a turn, or reported later as `after-turn:`).
fn flood_results(said: &str) -> Vec<Value> {
    said.lines()
        .filter_map(|l| {
            let l = l.strip_prefix("after-turn: ").unwrap_or(l);
            l.strip_prefix("flood-result: ")
        })
        .map(|r| serde_json::from_str(r.trim()).unwrap_or_else(|e| panic!("{r}: {e}")))
        .collect()
}

/// The supervisor's metrics page.
async fn metrics(addr: &str) -> String {
    let resp = warden_cli::client::request(addr, http::Method::GET, "/metrics", "", None)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}/metrics: {e}"));
    warden_cli::client::read_answer(resp).await.unwrap().1
}

/// One sample of the page (0 when the series is not there).
fn sample(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

fn between_turns(page: &str, method: &str) -> u64 {
    sample(
        page,
        &format!("warden_supervisor_requests_between_turns_total{{method=\"{method}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_after_its_turn_is_refused_everything_and_nothing_is_decided() {
    let addr = format!("127.0.0.1:{}", warden_e2e::free_port());
    let listen = format!("daemon.metrics_listen={addr:?}");
    let d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("supervisor", listen.as_str()),
    ])
    .await;
    let mut c = client(&d);
    let info = c
        .open_conversation(open("idle", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    std::fs::write(root.join("secret.txt"), "read me between turns").unwrap();

    // Turn 1: one terminal, decided and left running (term-1); then the agent answers the
    // prompt and, 200 ms later, goes on: 12 x 50 permission requests (each under the 64
    // requests in flight), 50 reads, 50 writes, 20 terminals, 10 reads of term-1's output.
    let mut later: Vec<Value> = (0..12)
        .map(|_| flood("session/request_permission", 50, json!({})))
        .collect();
    later.extend([
        flood("fs/read_text_file", 50, json!({"path": "secret.txt"})),
        flood("fs/write_text_file", 50, json!({"path": "written.txt"})),
        flood(
            "terminal/create",
            20,
            json!({"command": "touch ran-between-turns.txt"}),
        ),
        flood("terminal/output", 10, json!({"terminal_id": "term-1"})),
    ]);
    let steps = json!({"steps": [
        flood("terminal/create", 1, json!({"command": "echo in-turn; sleep 30"})),
        {"type": "after_turn", "ms": 200, "steps": later},
    ]});
    let evs = run(&mut c, turn("idle", "t1", &scenario(steps))).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    assert_eq!(
        flood_results(&text(&evs)),
        [json!({"ok": 1, "errors": 0, "first_error": null})],
        "the terminal of the turn ran"
    );
    let audited = audit_of(&d, "idle").await.len();
    assert_eq!(audited, 1, "one decision in the turn: its terminal");

    // Wait until the agent's requests between turns are all answered (the supervisor counts
    // each refusal): 600 + 50 + 50 + 20 + 10. Without the count (before), the wait gives up
    // after 20 s and the audit below tells what happened.
    let want = 730;
    let t0 = Instant::now();
    let mut page = String::new();
    while t0.elapsed() < Duration::from_secs(20) {
        page = metrics(&addr).await;
        let n: u64 = [
            "session/request_permission",
            "fs/read_text_file",
            "fs/write_text_file",
            "terminal/create",
            "terminal/output",
        ]
        .iter()
        .map(|m| between_turns(&page, m))
        .sum();
        if n >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Nothing the agent asked for between turns was decided: the audit is what turn 1 left.
    let after = audit_of(&d, "idle").await;
    assert_eq!(
        after.len(),
        audited,
        "requests between turns were decided and audited: {} records",
        after.len()
    );
    assert!(!root.join("written.txt").exists(), "a write between turns");
    assert!(
        !root.join("ran-between-turns.txt").exists(),
        "a terminal between turns"
    );
    for (method, n) in [
        ("session/request_permission", 600),
        ("fs/read_text_file", 50),
        ("fs/write_text_file", 50),
        ("terminal/create", 20),
        ("terminal/output", 10),
    ] {
        assert_eq!(between_turns(&page, method), n, "{method}:\n{page}");
    }

    // Turn 2: the agent says what it got between turns, in ACP's shape.
    let evs = run(
        &mut c,
        turn(
            "idle",
            "t2",
            &scenario(json!({"steps": [{"type": "after_turn_report"}]})),
        ),
    )
    .await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    let r = flood_results(&text(&evs));
    assert_eq!(r.len(), 16, "{}", text(&evs));
    for p in &r[..12] {
        // A permission between turns is `cancelled`: never an option, allow or refuse.
        assert_eq!(
            *p,
            json!({"ok": 50, "errors": 0, "first_error": null, "cancelled": 50})
        );
    }
    for (res, n) in r[12..].iter().zip([50, 50, 20, 10]) {
        assert_eq!(res["ok"], 0, "{res}");
        assert_eq!(res["errors"], n, "{res}");
        let e = res["first_error"].as_str().unwrap_or_default();
        assert!(e.contains("no turn is running"), "{res}");
    }
    assert_eq!(audit_of(&d, "idle").await.len(), audited);
    // Within a turn the same requests are served again: a read is decided and answered.
    let evs = run(
        &mut c,
        turn(
            "idle",
            "t3",
            &scenario(
                json!({"steps": [flood("fs/read_text_file", 1, json!({"path": "secret.txt"}))]}),
            ),
        ),
    )
    .await;
    assert_eq!(
        flood_results(&text(&evs)),
        [json!({"ok": 1, "errors": 0, "first_error": null})]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_flood_is_capped_and_another_conversation_is_served() {
    // The per-turn quota is off here (it is tested below): what is measured is what 300
    // terminals of one turn hold. Decisions are not measured: a loaded test host must not deny
    // the other conversation's permission for lack of time.
    let mut d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("supervisor", "limits.terminals_per_turn=0"),
        ("supervisor", "policy.decide_deadline_ms=5000"),
    ])
    .await;
    let pid = d.daemon("supervisor").unwrap().pid();
    let mut c = client(&d);
    let mut other = client(&d);
    let evs = run(&mut other, turn("calm", "calm-0", "write calm-0.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    let info = c
        .open_conversation(open("terms", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);

    let sampler = RssSampler::start(pid);
    // 6 x 50 terminals (each flood under the 64 requests in flight), never released, each
    // writing 300 KB (more than the 256 KiB tail one terminal may keep) and staying alive; then
    // the turn waits 5 s with them all held.
    let mut steps: Vec<Value> = (0..6)
        .map(|_| {
            flood(
                "terminal/create",
                50,
                json!({"command": "yes 0123456789abcdef | head -c 300000; echo; mktemp ./ran.XXXXXX; sleep 30"}),
            )
        })
        .collect();
    steps.push(json!({"type": "sleep", "ms": 5000}));
    let t0 = Instant::now();
    let mut s = start(
        &mut c,
        turn("terms", "flood-1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let calm = calm_turns(other, "calm", 3);
    let evs = collect(&mut s, Duration::from_secs(120)).await;
    let ended_in = t0.elapsed();
    let calm = calm.await.unwrap();
    let Rss {
        before,
        peak,
        after,
    } = sampler.stop().await;
    let ran = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ran."))
        .count();
    let decided = permissions(&evs).len();
    let audited = audit_of(&d, "terms").await.len();
    let r = flood_results(&text(&evs));
    let ok: u64 = r.iter().filter_map(|r| r["ok"].as_u64()).sum();
    println!(
        "supervisor VmRSS: before {before} KiB, peak {peak} KiB, after {after} KiB (growth bound \
         {RSS_GROWTH_BOUND_KIB} KiB); {ok} terminals created, {ran} ran, {decided} decided, \
         {audited} audited; the flooding turn took {ended_in:?}"
    );

    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    assert_eq!(r.len(), 6, "{}", text(&evs));
    assert_eq!(ok, 16, "terminals held: limits.max_terminals = 16: {r:?}");
    let refused: Vec<&str> = r.iter().filter_map(|r| r["first_error"].as_str()).collect();
    assert!(
        !refused.is_empty() && refused.iter().all(|e| e.contains("limits.max_terminals")),
        "{r:?}"
    );
    assert_eq!(ran, 16, "the terminals held ran");
    assert_eq!(
        (decided, audited),
        (16, 16),
        "only the terminals the caps let through were decided"
    );
    assert!(
        peak.saturating_sub(before) < RSS_GROWTH_BOUND_KIB,
        "the supervisor grew from {before} KiB to {peak} KiB (bound +{RSS_GROWTH_BOUND_KIB} KiB)"
    );
    for (i, t) in calm.iter().enumerate() {
        let (reason, asked, allowed) = (&t.stop_reason, t.asked, t.allowed);
        assert!(
            reason == "end_turn" && asked == 1 && allowed,
            "the other conversation was served (turn {}): {reason}, {asked} permissions, allowed {allowed}",
            i + 1
        );
    }

    // The terminals outlive the turn (an agent may read them again in its next one): the cap
    // still holds them, and a new one is refused, naming it, before any decision.
    let evs = run(
        &mut c,
        turn(
            "terms",
            "flood-2",
            &scenario(json!({"steps": [flood("terminal/create", 1, json!({}))]})),
        ),
    )
    .await;
    let r = flood_results(&text(&evs));
    assert_eq!(r.len(), 1, "{evs:#?}");
    assert_eq!(r[0]["errors"], 1, "{}", r[0]);
    let e = r[0]["first_error"].as_str().unwrap_or_default();
    assert!(e.contains("limits.max_terminals"), "{e}");
    assert!(permissions(&evs).is_empty(), "refused before any decision");
    assert_eq!(audit_of(&d, "terms").await.len(), audited);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_output_terminals_hold_together_is_bounded_and_given_back_at_release() {
    // 1 MiB for one conversation's terminals together; each keeps at most 256 KiB
    // (limits.output_bytes, whatever larger outputByteLimit it asks for).
    let d = deploy(&[
        ("supervisor", "agents.scripted.terminal=true"),
        ("supervisor", "limits.terminal_output_bytes=1048576"),
    ])
    .await;
    let mut c = client(&d);
    // Four terminals of the full 256 KiB fit; the fifth does not, and says why, undecided.
    let evs = run(
        &mut c,
        turn(
            "bytes",
            "t1",
            &scenario(json!({"steps": [flood("terminal/create", 5, json!({"command": "true"}))]})),
        ),
    )
    .await;
    let r = flood_results(&text(&evs));
    assert_eq!(r.len(), 1, "{evs:#?}");
    assert_eq!(
        (r[0]["ok"].as_u64(), r[0]["errors"].as_u64()),
        (Some(4), Some(1)),
        "{}",
        r[0]
    );
    let e = r[0]["first_error"].as_str().unwrap_or_default();
    assert!(e.contains("limits.terminal_output_bytes"), "{e}");
    assert_eq!(
        permissions(&evs).len(),
        4,
        "the refused one was never decided"
    );
    assert_eq!(
        stop(&evs).stop_reason,
        "end_turn",
        "a cap refuses; the turn goes on"
    );

    // The bound is per conversation, and an agent asking for small tails gets more terminals.
    let evs = run(
        &mut c,
        turn(
            "small",
            "t1",
            &scenario(json!({"steps": [
                flood("terminal/create", 12, json!({"command": "true", "output_byte_limit": 1024}))]})),
        ),
    )
    .await;
    let r = flood_results(&text(&evs));
    assert_eq!(r.len(), 1, "{evs:#?}");
    assert_eq!(r[0]["ok"], 12, "{}", r[0]);

    // A terminal released gives its share back: eight commands in a row through the client
    // (each create, wait, output, release), 256 KiB each, 2 MiB over the turn.
    let steps: Vec<Value> = (0..8)
        .map(|i| {
            json!({"type": "tool", "kind": "execute", "command": format!("echo run-{i}"),
            "ask": false, "via": "client"})
        })
        .collect();
    let evs = run(
        &mut c,
        turn("released", "t1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let completed = evs
        .iter()
        .filter(|e| {
            matches!(&e.event, Some(pb::turn_event::Event::ToolCall(t))
                if t.update && t.status == "completed")
        })
        .count();
    assert_eq!(completed, 8, "{evs:#?}");

    // Every terminal/create counts against the turn's quota (limits.terminals_per_turn, 64),
    // refused by a cap or not: the 65th ends the turn with fault request-limit.
    let evs = run(
        &mut c,
        turn(
            "quota",
            "t1",
            &scenario(json!({"steps": [
                flood("terminal/create", 50, json!({"command": "true", "output_byte_limit": 1})),
                flood("terminal/create", 50, json!({"command": "true", "output_byte_limit": 1}))]})),
        ),
    )
    .await;
    let f = stop(&evs)
        .fault
        .unwrap_or_else(|| panic!("the turn ended without a fault: {evs:#?}"));
    assert_eq!(f.fault_class(), pb::FaultClass::RequestLimit, "{f:?}");
    assert!(
        f.message.contains("more than 64 terminal/create requests")
            && f.message.contains("limits.terminals_per_turn"),
        "{f:?}"
    );
    assert!(permissions(&evs).len() <= 16, "{}", permissions(&evs).len());
}
