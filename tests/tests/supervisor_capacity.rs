//! Supervisor end to end, the long-running-service issue's findings 1 and 2: conversations that
//! stopped being used must not make every new one fail, and live agents are bounded. With
//! `max_live_agents = 3`, twelve contexts used one after another all work, never more than three
//! agents are alive, the least recently used idle agent is the one stopped, a stopped
//! conversation works again when it is used, and only when every live agent is busy is a new one
//! refused, with a typed `capacity` fault.

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

#[tokio::test(flavor = "multi_thread")]
async fn with_every_live_agent_busy_a_new_one_is_refused_as_capacity() {
    let d = deploy(&[("supervisor", "limits.max_live_agents=2")]).await;
    let mut c = client(&d);
    let hang = scenario(serde_json::json!({"steps": [{"type": "hang"}]}));
    let mut s1 = start(&mut c, turn("busy-1", "t1", &hang)).await;
    let mut s2 = start(&mut c, turn("busy-2", "t1", &hang)).await;
    // Both turns are running (their TurnStarted arrived).
    for s in [&mut s1, &mut s2] {
        let ev = tokio::time::timeout(Duration::from_secs(20), s.message())
            .await
            .expect("a started event")
            .unwrap()
            .unwrap();
        assert!(
            matches!(ev.event, Some(pb::turn_event::Event::Started(_))),
            "{ev:?}"
        );
    }
    let err = c
        .open_conversation(open("busy-3", pb::Profile::WorkspaceWrite))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_live_agents"), "{err}");
    use prost::Message;
    let f = pb::Fault::decode(err.details()).unwrap();
    assert_eq!(f.fault_class(), pb::FaultClass::Capacity);
    // Nothing of the refused conversation stays behind: no incident, no slot.
    assert!(incidents(&d).iter().all(|i| i["class"] != "capacity"));
    assert_eq!(agents_alive(&d), 2);
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
