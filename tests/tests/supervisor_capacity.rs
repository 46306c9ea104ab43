//! Supervisor end to end, the long-running-service issue's findings 1 and 2: conversations that
//! stopped being used must not make every new one fail, and live agents are bounded. With
//! `max_live_agents = 3`, twelve contexts used one after another all work, never more than three
//! agents are alive, the least recently used idle agent is the one stopped, a stopped
//! conversation works again when it is used; with every live agent busy a conversation's turn
//! waits for one (issue 30), told its place, and fails with a typed `capacity` fault only past
//! `limits.capacity_wait_ms` or beyond `limits.max_agent_waiters`.

mod supervisor_support;

use std::time::Duration;

use supervisor_support::*;
use warden_proto::v1 as pb;

fn agents_alive(d: &warden_e2e::Deployment) -> usize {
    let state = state(d);
    processes_in(&state.join("sandboxes"), Some("warden-scripted-agent")).len()
}

/// Each conversation's state, from ListConversations (no side effects).
async fn states(c: &mut Client) -> std::collections::HashMap<String, i32> {
    c.list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
        .into_iter()
        .map(|i| (i.context_id, i.state))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn contexts_beyond_the_live_agent_limit_all_work_and_the_lru_idle_agent_makes_room() {
    let d = deploy(&[("supervisor", "limits.max_live_agents=3")]).await;
    let mut c = client(&d);
    for i in 0..12 {
        let ctx = format!("ctx-{i}");
        let evs = run(&mut c, turn(&ctx, "t1", "write a.txt")).await;
        assert_eq!(stop(&evs).stop_reason, "end_turn", "{ctx}: {evs:#?}");
        let alive = agents_alive(&d);
        assert!(alive <= 3, "{alive} agents alive after {ctx}");
    }
    // ctx-9, 10, 11 are the live ones; ctx-0 was stopped long ago and still works (restarted,
    // making room by stopping the least recently used: ctx-9).
    let st = states(&mut c).await;
    assert_eq!(st["ctx-0"], pb::ConversationState::IdleStopped as i32);
    let evs = run(&mut c, turn("ctx-0", "t2", "write b.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    let st = states(&mut c).await;
    assert_eq!(
        st["ctx-9"],
        pb::ConversationState::IdleStopped as i32,
        "the least recently used idle agent makes room: {st:?}"
    );
    for ctx in ["ctx-10", "ctx-11", "ctx-0"] {
        assert_eq!(
            st[ctx],
            pb::ConversationState::Ready as i32,
            "{ctx}: {st:?}"
        );
    }
}

/// The places a turn was told while it waited for a live agent.
fn agent_places(evs: &[pb::TurnEvent]) -> Vec<u32> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(pb::turn_event::Event::Queued(q)) if q.agent => Some(q.position),
            _ => None,
        })
        .collect()
}

/// Reads the next event, which must come within 20 s.
async fn next(s: &mut tonic::Streaming<pb::TurnEvent>) -> pb::TurnEvent {
    tokio::time::timeout(Duration::from_secs(20), s.message())
        .await
        .expect("an event")
        .unwrap()
        .expect("the stream goes on")
}

/// Two conversations whose turns hang hold both live agents (`max_live_agents = 2`); returns
/// their streams once both turns run.
async fn hold_both_agents(c: &mut Client) -> Vec<tonic::Streaming<pb::TurnEvent>> {
    let hang = scenario(serde_json::json!({"steps": [{"type": "hang"}]}));
    let mut held = Vec::new();
    for ctx in ["busy-1", "busy-2"] {
        let mut s = start(c, turn(ctx, "t1", &hang)).await;
        let ev = next(&mut s).await;
        assert!(
            matches!(ev.event, Some(pb::turn_event::Event::Started(_))),
            "{ev:?}"
        );
        held.push(s);
    }
    held
}

/// Issue 30: with every live agent busy a conversation is not refused. It opens without an
/// agent; its turn waits for one, told its place; a second waiting turn is cancelled while
/// queued (it leaves the queue, its stream ends cancelled); the first starts as soon as a busy
/// agent is given back (a hanging turn cancelled) and completes.
#[tokio::test(flavor = "multi_thread")]
async fn with_every_live_agent_busy_a_turn_waits_for_one_and_is_cancellable_while_queued() {
    let d = deploy(&[
        ("supervisor", "limits.max_live_agents=2"),
        // One principal ("tester") runs every turn here: its share must cover both agents.
        ("supervisor", "limits.max_active_turns_per_principal=8"),
    ])
    .await;
    let mut c = client(&d);
    let _held = hold_both_agents(&mut c).await;
    // The open is answered (no agent: idle-stopped, like a conversation whose agent stopped).
    let info = c
        .open_conversation(open("waits-1", pb::Profile::WorkspaceWrite))
        .await
        .unwrap_or_else(|e| panic!("an open at the live-agent limit is refused: {e}"))
        .into_inner();
    assert_eq!(info.state, pb::ConversationState::IdleStopped as i32);
    assert_eq!(agents_alive(&d), 2);
    let mut w1 = start(&mut c, turn("waits-1", "t1", "write w1.txt")).await;
    let ev = next(&mut w1).await;
    assert_eq!(
        ev.event,
        Some(pb::turn_event::Event::Queued(pb::TurnQueued {
            position: 1,
            admission: false,
            agent: true,
        }))
    );
    let mut w2 = start(&mut c, turn("waits-2", "t1", "write w2.txt")).await;
    let ev = next(&mut w2).await;
    assert!(
        matches!(ev.event, Some(pb::turn_event::Event::Queued(q)) if q.agent && q.position == 2),
        "{ev:?}"
    );
    let st = status(&mut c).await;
    assert_eq!(st["turns_waiting_agent"], "2", "{st:?}");
    // Cancelled while queued: its stream ends cancelled at once, and it leaves the queue.
    let out = c
        .cancel_turn(pb::CancelTurnRequest {
            context_id: "waits-2".into(),
            turn_id: "t1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.outcome, "active");
    let e2 = collect(&mut w2, Duration::from_secs(10)).await;
    assert_eq!(stop(&e2).stop_reason, "cancelled", "{e2:#?}");
    assert!(faults(&e2).is_empty(), "{e2:#?}");
    assert!(
        !e2.iter()
            .any(|e| matches!(e.event, Some(pb::turn_event::Event::Started(_)))),
        "a cancelled waiting turn never started: {e2:#?}"
    );
    let st = status(&mut c).await;
    assert_eq!(st["turns_waiting_agent"], "1", "{st:?}");
    // One hanging turn is cancelled (its agent is killed): the waiting turn gets the agent.
    let t0 = std::time::Instant::now();
    c.cancel_turn(pb::CancelTurnRequest {
        context_id: "busy-1".into(),
        turn_id: "t1".into(),
    })
    .await
    .unwrap();
    let e1 = collect(&mut w1, Duration::from_secs(30)).await;
    assert_eq!(stop(&e1).stop_reason, "end_turn", "{e1:#?}");
    // Its place was told once (read above) and did not change: nobody went before it.
    assert!(agent_places(&e1).is_empty(), "{e1:#?}");
    assert!(
        e1.iter()
            .any(|e| matches!(e.event, Some(pb::turn_event::Event::Started(_)))),
        "{e1:#?}"
    );
    eprintln!(
        "the waiting turn ended {:?} after an agent was given back",
        t0.elapsed()
    );
    assert!(agents_alive(&d) <= 2);
    // No agent's fault: no incident of class capacity, nothing failed.
    assert!(incidents(&d).iter().all(|i| i["class"] != "capacity"));
}

/// Issue 30: a turn waiting for an agent fails `capacity` only once `limits.capacity_wait_ms`
/// has passed (never sooner), and a turn beyond `limits.max_agent_waiters` at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_waiting_for_an_agent_fails_capacity_only_past_the_configured_wait() {
    let d = deploy(&[
        ("supervisor", "limits.max_live_agents=2"),
        ("supervisor", "limits.max_active_turns_per_principal=8"),
        ("supervisor", "limits.capacity_wait_ms=2000"),
        ("supervisor", "limits.max_agent_waiters=1"),
    ])
    .await;
    let mut c = client(&d);
    let _held = hold_both_agents(&mut c).await;
    let t0 = std::time::Instant::now();
    let mut w = start(&mut c, turn("waits", "t1", "write w.txt")).await;
    let ev = next(&mut w).await;
    assert!(
        matches!(ev.event, Some(pb::turn_event::Event::Queued(q)) if q.agent && q.position == 1),
        "{ev:?}"
    );
    // The queue holds one: the next is refused at once, as capacity.
    let over = run(&mut c, turn("over", "t1", "write o.txt")).await;
    let f = faults(&over);
    assert_eq!(f.len(), 1, "{over:#?}");
    assert_eq!(f[0].fault_class(), pb::FaultClass::Capacity);
    assert!(f[0].message.contains("max_agent_waiters"), "{f:?}");
    let evs = collect(&mut w, Duration::from_secs(30)).await;
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(2000),
        "failed after {waited:?}"
    );
    let f = faults(&evs);
    assert_eq!(f.len(), 1, "{evs:#?}");
    assert_eq!(f[0].fault_class(), pb::FaultClass::Capacity);
    assert!(f[0].message.contains("capacity_wait_ms"), "{f:?}");
    assert_eq!(stop(&evs).stop_reason, "fault");
    // The conversation stays usable: once an agent is free its next turn runs.
    drop(_held);
    for ctx in ["busy-1", "busy-2"] {
        c.close_conversation(pb::CloseConversationRequest {
            context_id: ctx.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let evs = run(&mut c, turn("waits", "t2", "write w.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
}

/// Admission (finding 5): with `max_active_turns = 1`, a second conversation's turn waits for
/// the running one, is told its place in the admission queue, and then runs — it is neither
/// refused nor started alongside.
#[tokio::test(flavor = "multi_thread")]
async fn turns_beyond_the_active_limit_wait_their_turn_in_order() {
    let d = deploy(&[("supervisor", "limits.max_active_turns=1")]).await;
    let mut c = client(&d);
    let slow = scenario(serde_json::json!({"steps": [
        {"type": "sleep", "ms": 800}, {"type": "message", "text": "A done"}]}));
    let mut a = start(&mut c, turn("adm-a", "t1", &slow)).await;
    let first = tokio::time::timeout(Duration::from_secs(20), a.message())
        .await
        .expect("A started")
        .unwrap()
        .unwrap();
    assert!(matches!(
        first.event,
        Some(pb::turn_event::Event::Started(_))
    ));
    let mut b = start(&mut c, turn("adm-b", "t1", "write b.txt")).await;
    let eb = collect(&mut b, Duration::from_secs(30)).await;
    let ea = collect(&mut a, Duration::from_secs(30)).await;
    assert_eq!(stop(&ea).stop_reason, "end_turn");
    assert_eq!(stop(&eb).stop_reason, "end_turn", "{eb:#?}");
    let queued: Vec<_> = eb
        .iter()
        .filter_map(|e| match &e.event {
            Some(pb::turn_event::Event::Queued(q)) => Some(*q),
            _ => None,
        })
        .collect();
    assert_eq!(
        queued,
        vec![pb::TurnQueued {
            position: 1,
            admission: true,
            agent: false,
        }],
        "{eb:#?}"
    );
    // B started only after A had finished: its TurnStarted follows its queued event, and A's
    // answer text arrived before B's stream ended.
    let started_at = eb
        .iter()
        .position(|e| matches!(e.event, Some(pb::turn_event::Event::Started(_))))
        .expect("B started");
    let queued_at = eb
        .iter()
        .position(|e| matches!(e.event, Some(pb::turn_event::Event::Queued(_))))
        .unwrap();
    assert!(queued_at < started_at);
    assert!(text(&ea).contains("A done"));
}

/// Finding 1's last part: a task sent to a context whose conversation ended starts a new
/// conversation and is told so (ContextReset), as after an idle restart; a new context is not.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_in_an_ended_context_says_the_context_was_reset() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let resets = |evs: &[pb::TurnEvent]| -> Vec<String> {
        evs.iter()
            .filter_map(|e| match &e.event {
                Some(pb::turn_event::Event::ContextReset(r)) => Some(r.reason.clone()),
                _ => None,
            })
            .collect()
    };
    let evs = run(&mut c, turn("ended", "t1", "write a.txt")).await;
    assert!(resets(&evs).is_empty(), "a new context is not a reset");
    let closed = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "ended".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    let evs = run(&mut c, turn("ended", "t2", "write b.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    let r = resets(&evs);
    assert_eq!(r.len(), 1, "{evs:#?}");
    assert!(r[0].contains("ended"), "{r:?}");
    // Said once: the next turn of the new conversation is not a reset.
    let evs = run(&mut c, turn("ended", "t3", "write c.txt")).await;
    assert!(resets(&evs).is_empty(), "{evs:#?}");
}
