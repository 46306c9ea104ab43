//! Supervisor end to end: the scripted agent's demo turn with real policy decisions, the
//! conversation lifecycle, queueing and questions.

mod supervisor_support;

use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

#[tokio::test(flavor = "multi_thread")]
async fn demo_turn_writes_the_file_after_a_real_policy_allow() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let evs = run(&mut c, turn("demo", "t1", "write hello.txt")).await;
    let s = stop(&evs);
    assert_eq!(s.stop_reason, "end_turn", "{evs:#?}");
    assert!(s.refusals.is_empty(), "{:?}", s.refusals);
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{evs:#?}");
    let p = &perms[0];
    assert_eq!(p.verdict, pb::Verdict::Allow as i32);
    assert_eq!(p.option_id_sent, "allow-once");
    assert!(!p.decision_id.is_empty() && !p.decision_id.starts_with("local-"));
    assert!(!p.rule.is_empty());
    // Sequence numbers are 1..n, the stream starts with Started.
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
        assert_eq!(e.turn_id, "t1");
    }
    assert!(matches!(evs[0].event, Some(Event::Started(_))));
    let info = c
        .open_conversation(open("demo", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert!(info.owned);
    assert_eq!(info.state, pb::ConversationState::Ready as i32);
    assert_eq!(info.current_mode, "default");
    let root = std::path::PathBuf::from(&info.root);
    assert!(root.starts_with(state(&d)), "{}", root.display());
    assert!(root.join("hello.txt").is_file(), "the agent wrote nothing");
    // Transcript and health record.
    assert!(std::path::Path::new(&s.transcript_path).is_file());
    let h = health(&d);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["stop_reason"], "end_turn");
    assert_eq!(h[0]["agent"], "scripted");
    let closed = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "demo".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    // The conversation ended: its owned sandbox goes, its transcript stays.
    assert!(
        !root.exists(),
        "an ended conversation's owned sandbox is removed"
    );
    assert!(std::path::Path::new(&s.transcript_path).is_file());
    // The context's next conversation gets a fresh, empty root.
    let info = c
        .open_conversation(open("demo", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let again = std::path::PathBuf::from(&info.root);
    assert_ne!(again, root);
    assert!(
        !again.join("hello.txt").exists(),
        "an ended conversation's files reached the next"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_profile_refusal_reaches_the_stop_event() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let mut req = turn("ro", "t1", "write hello.txt");
    req.open = Some(open("ro", pb::Profile::ReadOnly));
    let evs = run(&mut c, req).await;
    let s = stop(&evs);
    assert_eq!(s.refusals.len(), 1, "{evs:#?}");
    let p = &permissions(&evs)[0];
    assert_eq!(p.verdict, pb::Verdict::Deny as i32);
    assert_eq!(p.option_id_sent, "reject");
    assert_eq!(s.refusals[0].decision_id, p.decision_id);
    let info = c
        .open_conversation(open("ro", pb::Profile::ReadOnly))
        .await
        .unwrap()
        .into_inner();
    assert!(!std::path::Path::new(&info.root).join("hello.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_task_text_is_refused_before_anything_starts() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let big = "x".repeat(16 * 1024 + 1);
    let err = c.run_turn(turn("big", "t1", &big)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("prompt-too-large"), "{err}");
    let list = c
        .list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        list.conversations.is_empty(),
        "a conversation was opened: {list:?}"
    );
    // Exactly at the limit is accepted.
    let ok = "y".repeat(16 * 1024);
    let evs = run(&mut c, turn("big", "t2", &ok)).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_opens_start_one_agent() {
    let d = deploy(&[]).await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let mut c = client(&d);
        set.spawn(async move {
            c.open_conversation(open("same", pb::Profile::WorkspaceWrite))
                .await
                .map(|r| r.into_inner())
        });
    }
    let mut infos = Vec::new();
    while let Some(r) = set.join_next().await {
        infos.push(r.unwrap().unwrap());
    }
    let sid = &infos[0].session_id;
    assert!(!sid.is_empty());
    assert!(
        infos
            .iter()
            .all(|i| &i.session_id == sid && i.root == infos[0].root)
    );
    // Exactly one agent process works in the root. (The tree may hold more processes: under
    // bubblewrap, bwrap itself and the PID namespace's init.)
    let root = std::path::PathBuf::from(&infos[0].root);
    let agents = processes_in(&root, Some("warden-scripted-agent"));
    assert_eq!(agents.len(), 1, "exactly one agent process: {agents:?}");
    let mut c = client(&d);
    let closed = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "same".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    assert!(closed.processes >= 1, "{closed:?}");
    assert!(
        processes_in(&root, Some("warden-scripted-agent")).is_empty(),
        "the agent outlived close"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn questions_go_to_the_caller_and_back() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = scenario(json!({"steps": [{"type": "question", "message": "Which colour?"}]}));
    let mut s = start(&mut c, turn("q", "t1", &text)).await;
    let mut qid = String::new();
    while let Some(ev) = s.message().await.unwrap() {
        if let Some(Event::Question(q)) = ev.event {
            assert_eq!(q.message, "Which colour?");
            qid = q.question_id;
            break;
        }
    }
    assert!(!qid.is_empty());
    let r = c
        .answer_question(pb::AnswerQuestionRequest {
            context_id: "q".into(),
            turn_id: "t1".into(),
            question_id: qid,
            action: "accept".into(),
            content_json: r#"{"answer":"teal"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.delivered);
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    assert!(text_of(&evs).contains("teal"), "{evs:#?}");
    assert!(
        permissions(&evs).is_empty(),
        "a question must not reach the policy"
    );
}

fn text_of(evs: &[pb::TurnEvent]) -> String {
    text(evs)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_crash_is_a_fault_and_the_next_turn_restarts_it() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = scenario(json!({"steps": [
        {"type": "stderr", "bytes": 100},
        {"type": "message", "text": "about to die"},
        {"type": "crash"}]}));
    let evs = run(&mut c, turn("boom", "t1", &text)).await;
    let s = stop(&evs);
    assert_eq!(s.stop_reason, "fault", "{evs:#?}");
    assert_eq!(s.fault.as_ref().unwrap().class, "crash");
    let transcript = std::fs::read_to_string(&s.transcript_path).unwrap();
    assert!(transcript.contains("agent_stderr_tail"), "{transcript}");
    let inc = incidents(&d);
    let i = inc
        .iter()
        .find(|i| i["class"] == "crash")
        .expect("crash incident");
    assert_eq!(i["transcript_path"], s.transcript_path);
    let evs = run(&mut c, turn("boom", "t2", "write alive.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_turn_answers_its_open_question_cancelled() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let text = scenario(json!({"steps": [{"type": "question", "message": "Proceed?"}]}));
    let mut s = start(&mut c, turn("qc", "t1", &text)).await;
    let mut qid = String::new();
    while let Some(ev) = s.message().await.unwrap() {
        if let Some(Event::Question(q)) = ev.event {
            qid = q.question_id;
            break;
        }
    }
    assert!(!qid.is_empty());
    let out = c
        .cancel_turn(pb::CancelTurnRequest {
            context_id: "qc".into(),
            turn_id: "t1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.outcome, "active");
    let evs = collect(&mut s, Duration::from_secs(20)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
    let late = c
        .answer_question(pb::AnswerQuestionRequest {
            context_id: "qc".into(),
            turn_id: "t1".into(),
            question_id: qid,
            action: "accept".into(),
            content_json: r#"{"answer":"yes"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !late.delivered,
        "the question was already answered `cancel`"
    );
    let bad = c
        .answer_question(pb::AnswerQuestionRequest {
            context_id: "qc".into(),
            turn_id: "t1".into(),
            question_id: "x".into(),
            action: "maybe".into(),
            content_json: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

/// AttachTurn (a gateway replica taking over a task): a turn whose RunTurn caller went away
/// runs on; another caller of the same principal attaches and gets every event after the
/// number it names, then the live ones, in order, to the stop; a caller naming another
/// principal, or a turn that does not exist, is told NOT_FOUND; an ended turn can still be
/// attached to, from its first event.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_outlives_its_stream_and_another_caller_attaches_to_it() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    let slow = scenario(json!({"steps": [
        {"type": "message", "text": "one "},
        {"type": "sleep", "ms": 1500},
        {"type": "message", "text": "two"},
        {"type": "stop", "reason": "end_turn"}
    ]}));
    let mut s = start(&mut c, turn("attach", "a1", &slow)).await;
    // The first caller reads the start and goes away.
    let first = s.message().await.unwrap().unwrap();
    assert_eq!(first.seq, 1);
    drop(s);
    let attach = |principal: &str, turn_id: &str, after_seq: u64| pb::AttachTurnRequest {
        context_id: "attach".into(),
        turn_id: turn_id.into(),
        principal: principal.into(),
        after_seq,
    };
    let e = c.attach_turn(attach("mallory", "a1", 0)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = c
        .attach_turn(attach("tester", "nope", 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let mut s = c
        .attach_turn(attach("tester", "a1", 1))
        .await
        .expect("AttachTurn")
        .into_inner();
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    assert_eq!(evs.first().map(|e| e.seq), Some(2), "after seq 1: {evs:#?}");
    for w in evs.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1, "in order, none missing: {evs:#?}");
    }
    assert_eq!(text(&evs), "one two");
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    // Ended: attached again from the first event, the whole turn.
    let mut s = c
        .attach_turn(attach("tester", "a1", 0))
        .await
        .expect("AttachTurn after the end")
        .into_inner();
    let again = collect(&mut s, Duration::from_secs(5)).await;
    assert_eq!(again.first().map(|e| e.seq), Some(1));
    assert_eq!(again.len(), evs.len() + 1);
    assert!(s.message().await.unwrap().is_none(), "ends after the stop");
}
