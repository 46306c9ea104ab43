//! Warm agents (issue 17): the real supervisor keeps `pool_size` agents of a kind spawned,
//! initialized and in their session, each in a fresh owned root; a new conversation takes one
//! (the agent that serves it was started before the open), the pool refills, two conversations
//! never share a root or a home, an agent that acted before it was asked (wrote into its root or
//! home, asked for something) is never handed out, one that dies is replaced with backoff, a
//! stop or crash leaves nothing of the pool behind and a restart with another configuration
//! serves only agents of the new one, and at the live-agent limit a conversation takes the slot
//! of another kind's warm agent.

mod supervisor_support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use supervisor_support::*;
use warden_proto::v1 as pb;

/// A process's start time (clock ticks since boot): with the pid, its identity.
fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A process's working directory (an agent's: its root).
fn cwd(pid: i32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|e| panic!("cwd of {pid}: {e}"))
}

/// A process's HOME.
fn home_of(pid: i32) -> Option<PathBuf> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"HOME="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
}

fn sandbox_names(d: &warden_e2e::Deployment) -> Vec<String> {
    std::fs::read_dir(state(d).join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_conversation_is_served_by_the_warm_agent_and_the_pool_refills() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    // The built-in scripted agent keeps one warm agent by default.
    let st = wait_figure(&mut c, "scripted", "ready", "1").await;
    assert_eq!(st["pool.scripted.size"], "1", "{st:?}");
    assert_eq!(st["pooled_agents"], "1", "{st:?}");
    assert_eq!(
        st["live_agents"], "1",
        "a warm agent is a live agent: {st:?}"
    );
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let warm_started = start_time(warm);
    let warm_home = home_of(warm).expect("the warm agent's HOME");

    let info = c
        .open_conversation(open("warm-a", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    let root_a = PathBuf::from(&info.root);
    assert!(!info.session_id.is_empty(), "{info:?}");
    assert_eq!(
        info.current_mode, "default",
        "the supervised mode holds: {info:?}"
    );
    // The agent in the conversation's root is the one that was waiting: same pid, same start.
    let in_a = processes_in(&root_a, Some("warden-scripted-agent"));
    assert_eq!(in_a, vec![warm], "the warm agent serves the conversation");
    assert_eq!(start_time(warm), warm_started);
    let st = status(&mut c).await;
    assert_eq!(st["pool.scripted.taken"], "1", "{st:?}");

    // It works as any conversation's agent, and its records name the conversation.
    let evs = run(&mut c, turn("warm-a", "t1", "write a.txt")).await;
    let s = stop(&evs);
    assert_eq!(s.stop_reason, "end_turn", "{evs:#?}");
    assert_eq!(s.files_changed, vec!["a.txt".to_string()], "{s:?}");
    assert!(root_a.join("a.txt").is_file());
    assert!(
        s.transcript_path.contains("/transcripts/warm-a/"),
        "the transcript is the conversation's: {}",
        s.transcript_path
    );
    let permissions = permissions(&evs);
    assert!(!permissions.is_empty(), "{evs:#?}");

    // The pool refilled with another agent, in another root and home; the next conversation
    // gets that one, never the first's root or home.
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm2 = one_agent(&d, "warden-scripted-agent", &[warm]).await;
    let info_b = c
        .open_conversation(open("warm-b", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(info_b.root, info.root);
    assert_eq!(
        processes_in(Path::new(&info_b.root), Some("warden-scripted-agent")),
        vec![warm2]
    );
    let home_b = home_of(warm2).expect("HOME");
    assert_ne!(home_b, warm_home, "two conversations never share a home");
    assert!(!Path::new(&info_b.root).join("a.txt").exists());

    // A read-only conversation cannot use a warm (writable) agent: it starts its own.
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm3 = one_agent(&d, "warden-scripted-agent", &[warm, warm2]).await;
    let ro = c
        .open_conversation(open("read-only", pb::Profile::ReadOnly))
        .await
        .unwrap()
        .into_inner();
    let in_ro = processes_in(Path::new(&ro.root), Some("warden-scripted-agent"));
    assert_eq!(in_ro.len(), 1, "{in_ro:?}");
    assert_ne!(
        in_ro[0], warm3,
        "the warm agent stays for a writable conversation"
    );
    let st = status(&mut c).await;
    assert_eq!(st["pool.scripted.ready"], "1", "{st:?}");

    // A caller cannot name the pool's ids.
    let err = c
        .open_conversation(open("warden-pool~scripted~x", pb::Profile::WorkspaceWrite))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");

    // A close removes the conversation's root and home as always.
    c.close_conversation(pb::CloseConversationRequest {
        context_id: "warm-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!root_a.exists());
    assert!(!warm_home.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_opens_never_share_a_warm_root_or_home() {
    let d = deploy(&[
        ("supervisor", "agents.scripted.pool_size=3"),
        ("supervisor", "limits.max_live_agents=16"),
    ])
    .await;
    let mut c = client(&d);
    wait_figure(&mut c, "scripted", "ready", "3").await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..10 {
        let mut c = c.clone();
        set.spawn(async move {
            c.open_conversation(open(&format!("many-{i}"), pb::Profile::WorkspaceWrite))
                .await
                .map(|r| r.into_inner())
        });
    }
    let mut roots = HashSet::new();
    let mut homes = HashSet::new();
    let mut pids = HashSet::new();
    while let Some(r) = set.join_next().await {
        let info = r.unwrap().unwrap_or_else(|e| panic!("open refused: {e}"));
        let p = processes_in(Path::new(&info.root), Some("warden-scripted-agent"));
        assert_eq!(p.len(), 1, "one agent per root: {p:?} in {}", info.root);
        assert!(roots.insert(info.root.clone()), "root {} twice", info.root);
        assert!(pids.insert(p[0]), "agent {} serves two conversations", p[0]);
        let h = home_of(p[0]).expect("HOME");
        assert!(homes.insert(h.clone()), "home {} twice", h.display());
    }
    let st = status(&mut c).await;
    let taken: u32 = st["pool.scripted.taken"].parse().unwrap();
    assert!(taken >= 3, "the three warm agents served: {st:?}");
}

/// A stdlib ACP agent that acts on its own after `session/new` (argument: what it does).
const ACTOR: &str = r#"
import json, os, sys, threading, time
mode = sys.argv[1]
lock = threading.Lock()
def send(o):
    with lock:
        sys.stdout.write(json.dumps(o) + "\n")
        sys.stdout.flush()
def act():
    # After the warm agent is ready (its home is recorded once quiet for 1 s); a crash earlier.
    time.sleep(0.3 if mode == "crash" else 2.5)
    if mode in ("write-root", "write-root-at-once"):
        open(os.path.join(os.getcwd(), "planted.txt"), "w").write("x")
    elif mode == "write-home":
        open(os.path.join(os.environ["HOME"], ".planted"), "w").write("x")
    elif mode == "write-state":
        os.makedirs(os.path.join(os.environ["HOME"], ".claude", "debug"), exist_ok=True)
        open(os.path.join(os.environ["HOME"], ".claude", "debug", "log.txt"), "w").write("x")
    elif mode == "ask":
        send({"jsonrpc": "2.0", "id": 900, "method": "fs/read_text_file",
              "params": {"sessionId": "s1", "path": os.path.join(os.getcwd(), "x")}})
    elif mode == "crash":
        os._exit(3)
    elif mode == "elevate":
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
              "update": {"sessionUpdate": "current_mode_update", "currentModeId": "bypassPermissions"}}})
for line in sys.stdin:
    m = json.loads(line)
    meth, mid = m.get("method"), m.get("id")
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif meth == "session/new":
        if mode == "write-root-at-once":
            open(os.path.join(os.getcwd(), "planted.txt"), "w").write("x")
        result = {"sessionId": "s1"}
        if mode == "elevate":
            result["modes"] = {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "bypassPermissions", "name": "Bypass"}]}
        send({"jsonrpc": "2.0", "id": mid, "result": result})
        threading.Thread(target=act, daemon=True).start()
    elif meth == "session/prompt":
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
              "update": {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "text", "text": "served in " + os.getcwd()}}}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif meth is not None and mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
"#;

/// The sets for an `actor` agent kind running ACTOR with `mode`, one warm, scripted unpooled.
fn actor_sets(mode: &str) -> (PathBuf, Vec<(String, String)>) {
    let dir = parent().join(format!("actor-{}-{mode}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("actor.py");
    std::fs::write(&script, ACTOR).unwrap();
    let sets = vec![
        ("supervisor".into(), "agents.scripted.pool_size=0".into()),
        (
            "supervisor".into(),
            "agents.actor.command=\"/usr/bin/python3\"".into(),
        ),
        (
            "supervisor".into(),
            format!("agents.actor.args=[\"{}\", \"{mode}\"]", script.display()),
        ),
        (
            "supervisor".into(),
            format!("agents.actor.read_only_paths=[\"{}\"]", dir.display()),
        ),
        ("supervisor".into(), "agents.actor.pool_size=1".into()),
    ];
    (dir, sets)
}

async fn deploy_owned(sets: &[(String, String)]) -> warden_e2e::Deployment {
    let v: Vec<(&str, &str)> = sets.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    deploy(&v).await
}

fn actor_open(ctx: &str) -> pb::OpenConversationRequest {
    let mut o = open(ctx, pb::Profile::WorkspaceWrite);
    o.agent = "actor".into();
    o
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_agent_that_acted_before_it_was_asked_is_never_handed_out() {
    for mode in ["write-root", "write-home", "ask"] {
        let (_dir, sets) = actor_sets(mode);
        let d = deploy_owned(&sets).await;
        let mut c = client(&d);
        wait_figure(&mut c, "actor", "ready", "1").await;
        let warm = one_agent(&d, "python3.11", &[]).await;
        let warm_home = home_of(warm).expect("HOME");
        let warm_root =
            std::fs::read_link(format!("/proc/{warm}/cwd")).expect("the warm agent's root");
        // It acts 2.5 s after its session/new.
        tokio::time::sleep(Duration::from_millis(3000)).await;
        if mode == "write-root" {
            assert!(warm_root.join("planted.txt").exists(), "the actor planted");
        }
        if mode == "write-home" {
            assert!(warm_home.join(".planted").exists(), "the actor planted");
        }
        let info = c
            .open_conversation(actor_open(&format!("victim-{mode}")))
            .await
            .unwrap_or_else(|e| panic!("{mode}: open refused: {e}"))
            .into_inner();
        let root = PathBuf::from(&info.root);
        assert_ne!(
            root, warm_root,
            "{mode}: the acted-upon root was handed out"
        );
        assert!(!root.join("planted.txt").exists(), "{mode}");
        assert!(
            all_gone(&[warm], Duration::from_secs(5)).await,
            "{mode}: the warm agent that acted is killed"
        );
        assert!(!warm_root.exists(), "{mode}: its root is removed");
        assert!(!warm_home.exists(), "{mode}: its home is removed");
        let served = processes_in(&root, Some("python3.11"));
        assert_eq!(served.len(), 1, "{mode}: {served:?}");
        assert_ne!(home_of(served[0]), Some(warm_home.clone()), "{mode}");
        let st = status(&mut c).await;
        assert_eq!(st["pool.actor.discarded"], "1", "{mode}: {st:?}");
        assert_eq!(st["pool.actor.taken"], "0", "{mode}: {st:?}");
        // The conversation works (its own agent, which acts too: the root is its own).
        let evs = run(&mut c, {
            let mut t = turn(&format!("victim-{mode}"), "t1", "hello");
            t.open = Some(actor_open(&format!("victim-{mode}")));
            t
        })
        .await;
        assert_eq!(stop(&evs).stop_reason, "end_turn", "{mode}: {evs:#?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_agent_that_writes_its_own_state_directory_is_still_handed_out() {
    // An adapter's sessions, caches and logs (Claude's debug log keeps growing while it waits).
    let (_dir, sets) = actor_sets("write-state");
    let d = deploy_owned(&sets).await;
    let mut c = client(&d);
    wait_figure(&mut c, "actor", "ready", "1").await;
    let warm = one_agent(&d, "python3.11", &[]).await;
    let home = home_of(warm).expect("HOME");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(
        home.join(".claude/debug/log.txt").exists(),
        "the actor wrote"
    );
    let info = c
        .open_conversation(actor_open("stateful"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("python3.11")),
        vec![warm]
    );
    let st = status(&mut c).await;
    assert_eq!(st["pool.actor.taken"], "1", "{st:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_writes_into_its_root_during_the_handshake_never_becomes_warm() {
    let (_dir, sets) = actor_sets("write-root-at-once");
    let d = deploy_owned(&sets).await;
    let mut c = client(&d);
    let t0 = Instant::now();
    loop {
        let st = status(&mut c).await;
        if st["pool.actor.failed"] != "0" {
            assert_eq!(st["pool.actor.ready"], "0", "{st:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The conversation gets a root of its own (its agent plants there: that is its own doing).
    let info = c
        .open_conversation(actor_open("fresh"))
        .await
        .unwrap()
        .into_inner();
    let st = status(&mut c).await;
    assert_eq!(st["pool.actor.taken"], "0", "{st:?}");
    assert!(Path::new(&info.root).is_dir());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_agent_that_dies_is_replaced_and_a_crashing_one_backs_off() {
    let d = deploy(&[]).await;
    let mut c = client(&d);
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let warm_root = cwd(warm);
    // Our own test's agent, found in our own state directory.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(warm),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_figure(&mut c, "scripted", "died", "1").await;
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let again = one_agent(&d, "warden-scripted-agent", &[warm]).await;
    assert_ne!(again, warm);
    assert!(!warm_root.exists(), "the dead agent's root is removed");
    let info = c
        .open_conversation(open("after-death", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("warden-scripted-agent")),
        vec![again]
    );
    drop(d);

    // An agent that dies 0.3 s after every start: restarted, but ever more slowly.
    let (_dir, sets) = actor_sets("crash");
    let d = deploy_owned(&sets).await;
    let mut c = client(&d);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let st = status(&mut c).await;
    let died: u32 = st["pool.actor.died"].parse().unwrap();
    let failed: u32 = st["pool.actor.failed"].parse().unwrap();
    // Without backoff that is a start every ~0.5 s (12 in 6 s); with it (0.2, 0.4, 0.8, 1.6,
    // 3.2 s between them) about 4.
    assert!(died >= 2, "the crashing agent is restarted: {st:?}");
    assert!(died + failed <= 6, "no spawn storm: {st:?}");
    // A conversation still opens (cold) and gets a root of its own.
    let info = c
        .open_conversation(actor_open("despite-crashes"))
        .await
        .unwrap()
        .into_inner();
    assert!(Path::new(&info.root).is_dir());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_or_crash_leaves_nothing_of_the_pool_and_a_restart_uses_the_new_configuration() {
    let mut d = deploy(&[]).await;
    let mut c = client(&d);
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let warm_root = cwd(warm);
    let warm_home = home_of(warm).unwrap();
    let info = c
        .open_conversation(open("kept", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm2 = one_agent(&d, "warden-scripted-agent", &[warm]).await;
    let warm2_root = cwd(warm2);
    assert_eq!(PathBuf::from(&info.root), warm_root);

    // A graceful stop: the warm agent goes with its root and home; the conversation's root stays.
    let sup = d.take("supervisor").unwrap();
    assert!(sup.terminate().await.success());
    assert!(all_gone(&[warm, warm2], Duration::from_secs(5)).await);
    assert!(!warm2_root.exists(), "the warm root is removed at the stop");
    assert!(!warm_home.exists());
    assert!(
        warm_root.is_dir(),
        "the conversation's root stays for its next task"
    );

    // A restart with another configuration of the agent: its warm agents are of the new one.
    let child = d.spawn(
        "supervisor",
        &["--set", "agents.scripted.set_env.POOL_GENERATION=\"two\""],
    );
    let mut sup = warden_e2e::Daemon {
        name: "supervisor".into(),
        child,
        socket: d.layout.socket_of("supervisor"),
        log: Some(d.log_file("supervisor")),
    };
    warden_e2e::wait_healthy(&mut sup, Duration::from_secs(10)).await;
    let mut c = client(&d);
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm3 = one_agent(&d, "warden-scripted-agent", &[]).await;
    let env = std::fs::read(format!("/proc/{warm3}/environ")).unwrap();
    assert!(
        env.split(|b| *b == 0)
            .any(|kv| kv == b"POOL_GENERATION=two"),
        "the warm agent after the restart is of the new configuration"
    );
    // A crash (SIGKILL) leaves a warm agent and its root behind: the next start removes both.
    let warm3_root = cwd(warm3);
    sup.crash().await;
    d.start("supervisor").await;
    assert!(
        all_gone(&[warm3], Duration::from_secs(5)).await,
        "the crashed run's warm agent is reaped"
    );
    let t0 = Instant::now();
    while warm3_root.exists() && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !warm3_root.exists(),
        "the crashed run's warm root is removed"
    );
    let names = sandbox_names(&d);
    let mut c = client(&d);
    wait_figure(&mut c, "scripted", "ready", "1").await;
    assert!(
        names.iter().any(|n| warm_root.ends_with(n)),
        "the conversation's root survives: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_live_agent_limit_a_conversation_takes_the_slot_of_another_kinds_warm_agent() {
    let scripted = warden_e2e::binary("warden-scripted-agent");
    let d = deploy(&[
        ("supervisor", "limits.max_live_agents=1"),
        ("supervisor", "agents.scripted.pool_size=0"),
        (
            "supervisor",
            &format!("agents.other.command=\"{}\"", scripted.display()),
        ),
        ("supervisor", "agents.other.supervised_mode=\"default\""),
        ("supervisor", "agents.other.pool_size=1"),
    ])
    .await;
    let mut c = client(&d);
    wait_figure(&mut c, "other", "ready", "1").await;
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let st = status(&mut c).await;
    assert_eq!(st["live_agents"], "1", "{st:?}");
    // The only slot is the warm `other` agent's: a `scripted` conversation takes it.
    let evs = run(&mut c, turn("needs-room", "t1", "write a.txt")).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    assert!(
        all_gone(&[warm], Duration::from_secs(5)).await,
        "the warm agent made room"
    );
    let st = status(&mut c).await;
    assert_eq!(st["live_agents"], "1", "{st:?}");
    assert_eq!(st["pool.other.ready"], "0", "no room to refill: {st:?}");
    // Once the conversation is gone, the pool fills again.
    c.close_conversation(pb::CloseConversationRequest {
        context_id: "needs-room".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_figure(&mut c, "other", "ready", "1").await;
}

/// What the scripted agent says its session's model and thought level are (`report_config`).
async fn reported_config(c: &mut Client, ctx: &str) -> String {
    let task = scenario(serde_json::json!({"steps": [{"type": "report_config"}]}));
    let evs = run(c, turn(ctx, "t1", &task)).await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");
    text(&evs)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_with_a_model_an_effort_or_planning_is_served_warm_and_a_value_not_offered_uses_up_the_agent()
 {
    use prost::Message;
    // Planning for `advise` is setting the model (an option the scripted agent offers), so the
    // agent's own report shows whether it was applied at the take.
    let d = deploy(&[(
        "supervisor",
        "agents.scripted.plan_config_option=\"model=scripted-large\"",
    )])
    .await;
    let mut c = client(&d);

    // A model and an effort: the warm agent serves, and its session has both.
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm = one_agent(&d, "warden-scripted-agent", &[]).await;
    let mut req = open("with-options", pb::Profile::WorkspaceWrite);
    req.model = "Large".into(); // by its display name
    req.effort = "high".into();
    let info = c.open_conversation(req).await.unwrap().into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("warden-scripted-agent")),
        vec![warm],
        "the warm agent serves an open with a model and an effort"
    );
    assert_eq!(status(&mut c).await["pool.scripted.taken"], "1");
    let said = reported_config(&mut c, "with-options").await;
    assert!(
        said.contains("model=scripted-large thought_level=high"),
        "{said}"
    );

    // Planning for the verb: the same, on the next warm agent.
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm2 = one_agent(&d, "warden-scripted-agent", &[warm]).await;
    let mut req = open("planning", pb::Profile::WorkspaceWrite);
    req.verb = "advise".into();
    let info = c.open_conversation(req).await.unwrap().into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("warden-scripted-agent")),
        vec![warm2]
    );
    let said = reported_config(&mut c, "planning").await;
    assert!(
        said.contains("model=scripted-large thought_level=medium"),
        "{said}"
    );
    // Without either, the warm agent's session is as it was made.
    wait_figure(&mut c, "scripted", "ready", "1").await;
    let warm3 = one_agent(&d, "warden-scripted-agent", &[warm, warm2]).await;
    let info = c
        .open_conversation(open("plain", pb::Profile::WorkspaceWrite))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("warden-scripted-agent")),
        vec![warm3]
    );
    let said = reported_config(&mut c, "plain").await;
    assert!(
        said.contains("model=scripted-default thought_level=medium"),
        "{said}"
    );

    // A value the agent does not offer: refused with the same fault as a cold start's, the
    // taken agent is killed with its root and home (never given back), the pool refills.
    let mut used = vec![warm, warm2, warm3];
    for (i, (k, v, offered)) in [
        ("model", "gpt-9", "scripted-default, scripted-large"),
        ("effort", "max", "medium, low, high, xhigh"),
    ]
    .into_iter()
    .enumerate()
    {
        wait_figure(&mut c, "scripted", "ready", "1").await;
        let w = one_agent(&d, "warden-scripted-agent", &used).await;
        let (w_root, w_home) = (cwd(w), home_of(w).expect("HOME"));
        let ctx = format!("not-offered-{k}");
        let mut req = open(&ctx, pb::Profile::WorkspaceWrite);
        if k == "model" {
            req.model = v.into();
        } else {
            req.effort = v.into();
        }
        let err = c.open_conversation(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        let f = pb::Fault::decode(err.details()).unwrap();
        assert_eq!(f.fault_class(), pb::FaultClass::OptionNotOffered, "{f:?}");
        assert!(
            f.message.contains(v) && f.message.contains(offered),
            "{}",
            f.message
        );
        assert!(
            all_gone(&[w], Duration::from_secs(5)).await,
            "{k}: the taken agent is killed"
        );
        assert!(!w_root.exists(), "{k}: its root is removed");
        assert!(!w_home.exists(), "{k}: its home is removed");
        let listed = c
            .list_conversations(pb::ListConversationsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(
            !format!("{listed:?}").contains(&ctx),
            "{k}: no conversation kept: {listed:?}"
        );
        let st = wait_figure(&mut c, "scripted", "ready", "1").await;
        assert_eq!(
            st["pool.scripted.taken"],
            (4 + i).to_string(),
            "{k}: the refused open took the warm agent: {st:?}"
        );
        let refill = one_agent(&d, "warden-scripted-agent", &used).await;
        assert_ne!(refill, w, "{k}: a new warm agent, not the used one");
        assert!(
            incidents(&d).is_empty(),
            "not the agent's fault: no incident"
        );
        used.push(w);
    }
    // The context can still be opened with a value the agent offers.
    let mut req = open("not-offered-model", pb::Profile::WorkspaceWrite);
    req.model = "scripted-default".into();
    c.open_conversation(req).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_agent_that_elevated_itself_while_it_waited_is_caught_on_its_first_turn_despite_the_options_set_at_the_take()
 {
    // The actor announces `bypassPermissions` 2.5 s after its session/new (a notification, not a
    // request: it is handed out); the open asks for planning, set at the take, whose echoes are
    // drained — the announced mode is not among them.
    let (_dir, mut sets) = actor_sets("elevate");
    for kv in [
        "agents.actor.supervised_mode=\"default\"",
        "agents.actor.plan_config_option=\"thinking=on\"",
    ] {
        sets.push(("supervisor".into(), kv.into()));
    }
    let d = deploy_owned(&sets).await;
    let mut c = client(&d);
    wait_figure(&mut c, "actor", "ready", "1").await;
    let warm = one_agent(&d, "python3.11", &[]).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let mut req = actor_open("elevated");
    req.verb = "advise".into();
    let info = c.open_conversation(req.clone()).await.unwrap().into_inner();
    assert_eq!(
        processes_in(Path::new(&info.root), Some("python3.11")),
        vec![warm],
        "handed out"
    );
    let mut t = turn("elevated", "t1", "hello");
    t.open = Some(req);
    let evs = run(&mut c, t).await;
    assert!(
        faults(&evs).iter().any(|f| f.class == "mode-escalation"),
        "the mode it announced while waiting is judged: {evs:#?}"
    );
}
