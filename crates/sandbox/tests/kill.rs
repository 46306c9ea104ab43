//! The termination ladder against real process trees built from `sh`.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use warden_sandbox::{KillOptions, ProcessIdentity, ProcessTree, set_child_subreaper};

/// Starts `sh -c script` in its own process group. The script prints one pid per line, then
/// `ready`. Returns the tree and the identities of the printed pids.
async fn spawn_tree(script: &str) -> (ProcessTree, Vec<ProcessIdentity>) {
    set_child_subreaper().expect("subreaper");
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let stdout = child.stdout.take().expect("stdout");
    let tree = ProcessTree::from_child(child).expect("tree");
    let mut lines = BufReader::new(stdout).lines();
    let mut ids = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line == "ready" {
                break;
            }
            let pid: i32 = line.trim().parse().expect("pid line");
            ids.push(ProcessIdentity::of(pid).expect("printed pid exists"));
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("script became ready");
    (tree, ids)
}

fn assert_all_gone(ids: &[ProcessIdentity]) {
    for id in ids {
        assert!(!id.is_alive(), "process {} survived the kill", id.pid);
    }
}

// A process that ignores SIGTERM; the ignore survives exec. The script goes on only once the
// trap is in place (the subshell creates a marker file after `trap`), so the test never signals
// a child that has not started ignoring TERM yet.
const STUBBORN: &str = "f=/tmp/warden-stubborn.$$; \
    (trap '' TERM; : > $f; exec sleep 100) & echo $!; \
    while [ ! -e $f ]; do sleep 0.01; done; rm -f $f;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_ignoring_grandchild_is_killed_after_the_grace() {
    let script = format!("{STUBBORN} sleep 100 & echo $!; echo ready; wait");
    let (mut tree, ids) = spawn_tree(&script).await;
    assert!(ids.iter().all(|i| i.is_alive()));
    let grace = warden_sandbox::DEFAULT_GRACE;
    let report = tree
        .kill(KillOptions::with_grace(grace))
        .await
        .expect("kill");
    println!("stubborn tree: {report:?}");
    assert!(report.forced, "a TERM-ignoring member forces the kill");
    assert!(report.elapsed >= grace);
    // Forced once, right after the grace (not after a second one); the margin is for a loaded
    // host (the figures are the soak bench's business, not this test's).
    assert!(
        report.elapsed < grace + Duration::from_secs(1),
        "took {:?}",
        report.elapsed
    );
    assert_eq!(report.remaining, 0);
    assert!(
        report.processes >= 3,
        "leader + 2 grandchildren: {report:?}"
    );
    assert_all_gone(&ids);
    assert!(!tree.leader().still_exists(), "leader reaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_tree_goes_quickly_without_force() {
    let (mut tree, ids) =
        spawn_tree("sleep 100 & echo $!; sleep 100 & echo $!; echo ready; wait").await;
    let report = tree.kill(KillOptions::default()).await.expect("kill");
    println!("cooperative tree: {report:?}");
    assert!(!report.forced);
    assert!(
        report.elapsed < Duration::from_millis(100),
        "took {:?}",
        report.elapsed
    );
    assert_all_gone(&ids);
    assert!(report.leader_status.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_grandchild_ignoring_term_is_killed() {
    // What Claude's Bash tool does: a new session, out of the agent's process group.
    let script = "export g=/tmp/warden-setsid.$$; setsid sh -c 'trap \"\" TERM; echo $$; : > $g; exec sleep 100' & while [ ! -e $g ]; do sleep 0.01; done; rm -f $g; \
                  sleep 0.2; echo ready; wait";
    let (mut tree, ids) = spawn_tree(script).await;
    assert_eq!(ids.len(), 1);
    let report = tree
        .kill(KillOptions::with_grace(Duration::from_millis(300)))
        .await
        .expect("kill");
    println!("setsid tree: {report:?}");
    assert!(report.forced);
    assert_all_gone(&ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_of_an_exited_leader_are_killed() {
    // The leader prints, then exits 0, leaving a TERM-ignoring orphan and a plain one behind in
    // its process group.
    let script = format!("{STUBBORN} sleep 100 & echo $!; echo ready; exec 1>&-; exit 0");
    let (mut tree, ids) = spawn_tree(&script).await;
    for _ in 0..200 {
        if tree.leader_exited() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(tree.leader_exited(), "leader should have exited");
    assert!(
        ids.iter().all(|i| i.is_alive()),
        "orphans alive before kill"
    );
    let report = tree
        .kill(KillOptions::with_grace(Duration::from_millis(300)))
        .await
        .expect("kill");
    println!("orphans: {report:?}");
    assert!(report.forced);
    assert_eq!(report.remaining, 0);
    assert_all_gone(&ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_member_is_still_terminated_gracefully() {
    // SIGSTOPped processes cannot act on SIGTERM; the ladder continues them.
    let (mut tree, ids) = spawn_tree("sleep 100 & echo $!; kill -STOP $!; echo ready; wait").await;
    let report = tree.kill(KillOptions::default()).await.expect("kill");
    assert!(!report.forced, "{report:?}");
    assert_all_gone(&ids);
}
