//! Supervisor end to end, issue 36 finding 3 (the rest): with `sandbox.agent_uid_range`, an open
//! conversation held its uid until it was closed (an hour of idleness at the gateway), after its
//! agent had stopped. With a 6-uid range, bob's 4 finished tasks left alice two uids: her third
//! new context was refused. Now a conversation whose agent stopped (idle stop) gives its uid back,
//! its root and home handed to the supervisor meanwhile (nothing of it stays the uid's, so the
//! uid's next holder can reach none of it), and takes a uid again on its next turn, its files
//! handed to that uid.

mod supervisor_support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use supervisor_support::*;
use warden_proto::v1 as pb;

const FIRST: u32 = 200_100;
const LAST: u32 = 200_105;

fn field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_string()
}

fn turn_as(ctx: &str, principal: &str, id: &str, cmd: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, id, &shell(cmd));
    let o = t.open.as_mut().expect("turn() opens");
    o.principal = principal.into();
    t
}

/// Runs `cmd` in `ctx` as `principal`; the uid the agent ran as and the command's output.
async fn run_as(c: &mut Client, ctx: &str, principal: &str, id: &str, cmd: &str) -> (u32, String) {
    let evs = run(
        c,
        turn_as(ctx, principal, id, &format!("echo uid=$(id -u); {cmd}")),
    )
    .await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{ctx}: {evs:#?}");
    let out = output(&evs);
    let uid = field(&out, "uid").parse().unwrap_or(0);
    assert!((FIRST..=LAST).contains(&uid), "{ctx} ran as {uid}: {out}");
    (uid, out)
}

async fn conversations(c: &mut Client) -> Vec<pb::ConversationInfo> {
    c.list_conversations(pb::ListConversationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .conversations
}

/// Every path under `dir` (itself included) with its owner uid.
fn owners(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        }
        out.push((p, m.uid()));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_stopped_conversation_gives_its_uid_back_and_takes_one_on_its_next_turn() {
    if !runs_contained() {
        return;
    }
    let d = deploy(&[
        (
            "supervisor",
            &format!("sandbox.agent_uid_range=[{FIRST}, {LAST}]"),
        ),
        ("supervisor", "limits.idle_timeout_secs=2"),
    ])
    .await;
    let mut c = client(&d);

    // bob's four finished tasks, each in a new context, each leaving a file of his.
    let mut bob_uids = Vec::new();
    for i in 0..4 {
        let (uid, _) = run_as(
            &mut c,
            &format!("bob-{i}"),
            "bob",
            "t1",
            &format!("echo secret-of-bob-{i} > notes.txt"),
        )
        .await;
        bob_uids.push(uid);
    }
    // Their agents stop when idle (2 s); each gives its uid back.
    let t0 = Instant::now();
    let bob_roots: Vec<PathBuf> = loop {
        let convs = conversations(&mut c).await;
        let mut bobs: Vec<_> = convs.iter().filter(|i| i.principal == "bob").collect();
        bobs.sort_by(|a, b| a.context_id.cmp(&b.context_id));
        if bobs.len() == 4
            && bobs
                .iter()
                .all(|i| i.state == pb::ConversationState::IdleStopped as i32)
        {
            break bobs.iter().map(|i| PathBuf::from(&i.root)).collect();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "bob's agents did not idle-stop: {convs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Nothing of an idle-stopped conversation stays its given-back uid's: not its root, not a
    // file in it (the uid's next holder could otherwise reach them).
    let range = FIRST..=LAST;
    let t0 = Instant::now();
    loop {
        let still: Vec<_> = bob_roots
            .iter()
            .flat_map(|r| owners(r))
            .filter(|(_, uid)| range.contains(uid))
            .collect();
        if still.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "idle-stopped conversations' files still belong to agent uids: {still:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // alice opens and runs her share of new contexts (4 of the 6 uids): on the old supervisor
    // bob's idle conversations held four uids and her third was refused.
    let mut alice_uids = Vec::new();
    for i in 0..4 {
        let (uid, _) = run_as(&mut c, &format!("alice-{i}"), "alice", "t1", "true").await;
        alice_uids.push(uid);
    }
    alice_uids.sort_unstable();
    alice_uids.dedup();
    assert_eq!(alice_uids.len(), 4, "alice's conversations share uids");

    // bob's next turn in one of his contexts takes a uid again (one alice's do not hold), and
    // finds his file, handed to that uid.
    let (uid, out) = run_as(
        &mut c,
        "bob-0",
        "bob",
        "t2",
        "cat notes.txt; echo more >> notes.txt && echo appended=yes",
    )
    .await;
    assert!(
        !alice_uids.contains(&uid),
        "bob's turn ran as alice's uid {uid}"
    );
    assert!(out.contains("secret-of-bob-0"), "{out}");
    assert_eq!(field(&out, "appended"), "yes", "{out}");
    // bob-0's root (the list was sorted by context id).
    let notes = bob_roots[0].join("notes.txt");
    assert_eq!(std::fs::metadata(&notes).unwrap().uid(), uid);
    assert_eq!(std::fs::metadata(&bob_roots[0]).unwrap().uid(), uid);
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "secret-of-bob-0\nmore\n"
    );
}
