//! Supervisor end to end, issue 36 finding 3: open conversations have a share per principal. Each
//! open conversation holds its root's fd (and, with `sandbox.agent_uid_range`, a uid) until it is
//! closed, so one caller's finished tasks in new contexts could fill the supervisor's files (or
//! its uids) and leave another caller unable to open any context. With
//! `limits.max_open_conversations_per_principal = 3`: bob holds three, his fourth new context is
//! refused — by `OpenConversation` and by a turn's open — RESOURCE_EXHAUSTED with a typed
//! `capacity` fault naming the key, nothing started for it; his own open contexts still reopen
//! and run; alice opens and runs a turn meanwhile; once bob closes one he opens another.

mod supervisor_support;

use prost::Message;
use supervisor_support::*;
use warden_proto::v1 as pb;

const KEY: &str = "limits.max_open_conversations_per_principal";

fn open_as(ctx: &str, principal: &str) -> pb::OpenConversationRequest {
    let mut o = open(ctx, pb::Profile::WorkspaceWrite);
    o.principal = principal.into();
    o
}

fn turn_as(ctx: &str, principal: &str, id: &str, text: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, id, text);
    t.open = Some(open_as(ctx, principal));
    t
}

/// The refusal of an open beyond the share: RESOURCE_EXHAUSTED, fault `capacity`, the key named.
fn assert_share_refusal(err: &tonic::Status) {
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    let f = pb::Fault::decode(err.details()).expect("a typed fault in the status details");
    assert_eq!(f.fault_class(), pb::FaultClass::Capacity, "{f:?}");
    assert_eq!(f.class, "capacity");
    assert!(f.message.contains(KEY), "{}", f.message);
    assert!(err.message().contains(KEY), "{}", err.message());
}

async fn open_contexts(c: &mut Client) -> Vec<String> {
    c.list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
        .into_iter()
        .map(|i| i.context_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_at_its_share_of_open_conversations_is_refused_and_another_still_opens() {
    let d = deploy(&[("supervisor", &format!("{KEY}=3"))]).await;
    let mut c = client(&d);

    // bob holds his share: two conversations opened, one by a turn (finished, idle).
    for ctx in ["bob-1", "bob-2"] {
        c.open_conversation(open_as(ctx, "bob"))
            .await
            .unwrap_or_else(|e| panic!("bob's open of {ctx}: {e}"));
    }
    let evs = run(&mut c, turn_as("bob-3", "bob", "t1", "write b3.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");

    // His fourth new context is refused, by an open and by a turn's open alike.
    let err = c
        .open_conversation(open_as("bob-4", "bob"))
        .await
        .unwrap_err();
    assert_share_refusal(&err);
    let err = c
        .run_turn(turn_as("bob-4", "bob", "t1", "write b4.txt"))
        .await
        .unwrap_err();
    assert_share_refusal(&err);
    assert!(
        !open_contexts(&mut c).await.iter().any(|id| id == "bob-4"),
        "a refused open left a conversation behind"
    );

    // What he holds is still his: a reopen takes nothing more, and a turn runs.
    c.open_conversation(open_as("bob-1", "bob"))
        .await
        .expect("bob reopens a conversation he holds");
    let evs = run(&mut c, turn_as("bob-2", "bob", "t1", "write b2.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");

    // alice is not held back by bob's share: she opens new contexts and runs a turn.
    c.open_conversation(open_as("alice-1", "alice"))
        .await
        .expect("alice's open while bob is at his share");
    let evs = run(&mut c, turn_as("alice-2", "alice", "t1", "write a.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");

    // alice cannot make room for bob by closing his conversation (not hers: nothing closes).
    let r = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "bob-1".into(),
            principal: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.closed, "alice closed bob's conversation");
    let err = c
        .open_conversation(open_as("bob-4", "bob"))
        .await
        .unwrap_err();
    assert_share_refusal(&err);

    // bob closes one of his: he opens a new context again, and is at his share once more.
    let r = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "bob-1".into(),
            principal: "bob".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.closed, "{r:?}");
    let evs = run(&mut c, turn_as("bob-4", "bob", "t1", "write b4.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    let err = c
        .open_conversation(open_as("bob-5", "bob"))
        .await
        .unwrap_err();
    assert_share_refusal(&err);
    // `warden status` shows the share in force.
    assert_eq!(status(&mut c).await[KEY.trim_start_matches("limits.")], "3");
}
