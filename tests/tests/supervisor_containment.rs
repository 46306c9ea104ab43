//! Supervisor end to end, OS containment of a hostile agent (issue 11): under a root supervisor
//! with bubblewrap the agent runs as its own uid (not root, not the supervisor's), cannot read
//! `/etc/shadow`, cannot rewrite its own settings by shell (in the root or in its home), and each
//! conversation has its own home, gone when the conversation closes.
//!
//! Skips, saying so, when the tests do not run as root (the supervisor cannot switch uids) or
//! bubblewrap does not work on this host.

mod supervisor_support;

use std::path::PathBuf;

use supervisor_support::*;
use warden_proto::v1 as pb;

/// A turn of `ctx` for `principal`: a conversation is its opener's, and a turn of another
/// principal is refused as not found.
fn turn_as(principal: &str, ctx: &str, id: &str, text: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, id, text);
    if let Some(o) = t.open.as_mut() {
        o.principal = principal.into();
    }
    t
}

/// The value after `key=` on a line of `out`.
fn field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_string()
}

fn uid_of(pid: i32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_is_not_root_cannot_read_shadow_and_cannot_rewrite_its_settings() {
    if !runs_contained() {
        return;
    }
    let mut d = deploy(&[]).await;
    let supervisor_pid = d
        .daemon("supervisor")
        .and_then(|s| s.child.id())
        .expect("supervisor pid") as i32;
    let supervisor_uid = uid_of(supervisor_pid).expect("supervisor uid");
    let mut c = client(&d);
    let cmd = "echo uid=$(id -u); echo home=$HOME; \
               if cat /etc/shadow >/dev/null 2>&1; then echo shadow=read; else echo shadow=denied; fi; \
               if echo '{\"permissions\":{\"allow\":[\"Bash\"]}}' > .claude/settings.json 2>/dev/null; \
                 then echo root_settings=written; else echo root_settings=denied; fi; \
               if echo '{\"hooks\":{}}' > \"$HOME/.claude/settings.json\" 2>/dev/null; \
                 then echo home_settings=written; else echo home_settings=denied; fi; \
               if echo x > \"$HOME/.claude.json\"; then echo home_state=written; fi; \
               if echo y > work.txt; then echo work=written; fi";
    let evs = run(&mut c, turn("ident", "t1", &shell(cmd))).await;
    let out = output(&evs);
    let uid: u32 = field(&out, "uid").parse().unwrap_or(0);
    assert_ne!(uid, 0, "the agent runs as root: {out}\n{evs:#?}");
    assert_ne!(
        uid, supervisor_uid,
        "the agent runs as the supervisor: {out}"
    );
    assert_eq!(field(&out, "shadow"), "denied", "{out}");
    assert_eq!(field(&out, "root_settings"), "denied", "{out}");
    assert_eq!(field(&out, "home_settings"), "denied", "{out}");
    assert_eq!(
        field(&out, "home_state"),
        "written",
        "the rest of the home is the agent's: {out}"
    );
    assert_eq!(
        field(&out, "work"),
        "written",
        "the root is the agent's: {out}"
    );

    // Seen from the host: the agent process itself carries that uid.
    let info = c
        .open_conversation(open("ident", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root = PathBuf::from(&info.root);
    let agents = processes_in(&root, Some("warden-scripted-agent"));
    assert!(
        !agents.is_empty(),
        "no agent process found in {}",
        root.display()
    );
    for pid in agents {
        assert_eq!(uid_of(pid), Some(uid), "pid {pid}");
    }
    // The settings file in the root is still the empty one warden made.
    let settings = std::fs::read_to_string(root.join(".claude/settings.json")).unwrap_or_default();
    assert!(!settings.contains("Bash"), "{settings}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_conversation_has_its_own_home_removed_when_it_closes() {
    if !runs_contained() {
        return;
    }
    // The operator's template for the agent: copied into every conversation, never shared.
    let template = parent().join(format!("home-template-{}", std::process::id()));
    std::fs::create_dir_all(template.join(".claude")).unwrap();
    std::fs::write(template.join("from-template.txt"), "tpl").unwrap();
    let d = deploy(&[(
        "supervisor",
        &format!("agents.scripted.home=\"{}\"", template.display()),
    )])
    .await;
    let mut c = client(&d);
    let mut a_open = open("conv-a", pb::Profile::WorkspaceWrite);
    a_open.principal = "principal-a".into();
    let mut b_open = open("conv-b", pb::Profile::WorkspaceWrite);
    b_open.principal = "principal-b".into();
    c.open_conversation(a_open).await.unwrap();
    c.open_conversation(b_open).await.unwrap();

    let evs = run(
        &mut c,
        turn_as(
            "principal-a",
            "conv-a",
            "a1",
            &shell(
                "echo home=$HOME; cat \"$HOME/from-template.txt\"; echo; \
                 echo a-was-here > \"$HOME/note.txt\" && \
                 mkdir -p \"$HOME/.claude/hooks\" && echo 'touch /tmp/pwned' > \"$HOME/.claude/hooks/h.sh\" && \
                 echo wrote=yes",
            ),
        ),
    )
    .await;
    let out_a = output(&evs);
    assert_eq!(field(&out_a, "wrote"), "yes", "{out_a}\n{evs:#?}");
    assert!(out_a.contains("tpl"), "the template was copied: {out_a}");
    let home_a = PathBuf::from(field(&out_a, "home"));
    assert!(home_a.join("note.txt").is_file(), "{}", home_a.display());

    let evs = run(
        &mut c,
        turn_as(
            "principal-b",
            "conv-b",
            "b1",
            &shell(
                "echo home=$HOME; \
                 if test -e \"$HOME/note.txt\" || test -e \"$HOME/.claude/hooks/h.sh\"; \
                   then echo seen=yes; else echo seen=no; fi",
            ),
        ),
    )
    .await;
    let out_b = output(&evs);
    let home_b = PathBuf::from(field(&out_b, "home"));
    assert_ne!(home_a, home_b, "{out_a}\n{out_b}");
    assert_eq!(field(&out_b, "seen"), "no", "{out_b}");
    assert!(
        !template.join("note.txt").exists(),
        "the template itself is never written"
    );

    let closed = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: "conv-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    assert!(
        !home_a.exists(),
        "{} outlived its conversation",
        home_a.display()
    );
    assert!(home_b.is_dir(), "the other conversation's home stays");
    std::fs::remove_dir_all(&template).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_uid_range_each_open_conversation_has_its_own_uid() {
    if !runs_contained() {
        return;
    }
    let d = deploy(&[("supervisor", "sandbox.agent_uid_range=[200000, 200009]")]).await;
    let mut c = client(&d);
    let whoami = |ctx: &str, id: &str| {
        turn(
            ctx,
            id,
            &shell("echo uid=$(id -u); echo more >> work.txt && echo appended=yes"),
        )
    };
    let uid_in = |evs: &[pb::TurnEvent]| -> u32 { field(&output(evs), "uid").parse().unwrap_or(0) };
    let a1 = run(&mut c, whoami("range-a", "a1")).await;
    let b1 = run(&mut c, whoami("range-b", "b1")).await;
    let (ua, ub) = (uid_in(&a1), uid_in(&b1));
    assert!((200_000..=200_009).contains(&ua), "{a1:#?}");
    assert!((200_000..=200_009).contains(&ub), "{b1:#?}");
    assert_ne!(ua, ub, "two open conversations share a uid");
    let root_a = PathBuf::from(
        c.open_conversation(open("range-a", pb::Profile::WorkspaceWrite))
            .await
            .unwrap()
            .into_inner()
            .root,
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&root_a).unwrap().uid(), ua);

    // A closed conversation's uid serves the next one; the ended conversation's root is gone,
    // and the context's next task starts afresh under a free uid.
    c.close_conversation(pb::CloseConversationRequest {
        context_id: "range-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!root_a.exists(), "the ended conversation's root stays");
    let c1 = run(&mut c, whoami("range-c", "c1")).await;
    assert_eq!(uid_in(&c1), ua, "the released uid is reused");
    let a2 = run(&mut c, whoami("range-a", "a2")).await;
    let ua2 = uid_in(&a2);
    assert!(ua2 != ua && ua2 != ub, "{a2:#?}");
    assert_eq!(field(&output(&a2), "appended"), "yes", "{}", output(&a2));
    let root_a2 = PathBuf::from(
        c.open_conversation(open("range-a", pb::Profile::WorkspaceWrite))
            .await
            .unwrap()
            .into_inner()
            .root,
    );
    let work = root_a2.join("work.txt");
    assert_eq!(std::fs::metadata(&work).unwrap().uid(), ua2);
    assert_eq!(std::fs::read_to_string(&work).unwrap(), "more\n");
}
