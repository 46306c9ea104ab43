//! warden-approver between the real supervisor and the real policy, with the scripted agent:
//! people answer escalated permissions with `warden approvals`, the deadline denies with
//! `approval.no-response`, a cancelled task revokes its request, a restart keeps a pending
//! request, the first of two answers wins, and bad input is refused.

mod supervisor_support;

use std::time::{Duration, Instant};

use serde_json::json;
use supervisor_support::*;
use tonic::transport::Channel;
use warden_e2e::{Deployment, Options, binary, run_with_deadline};
use warden_proto::v1 as pb;
use warden_proto::v1::approval_service_client::ApprovalServiceClient;

/// policy (escalating edits) → approver → supervisor [→ gateway], as `warden up --approver`
/// starts them.
async fn deploy_approver(extra: &[(&str, &str)], with_gateway: bool) -> Deployment {
    let mut sets = vec![("policy", r#"policy.global.escalate=["edit"]"#)];
    sets.extend_from_slice(extra);
    let opts = Options {
        sets: sets
            .iter()
            .map(|(d, kv)| (d.to_string(), kv.to_string()))
            .collect(),
        approver: true,
        ..Default::default()
    };
    let mut d = Deployment::new_in(&parent(), opts);
    let mut names = vec!["policy", "approver", "supervisor"];
    if with_gateway {
        names.push("gateway");
    }
    for n in names {
        d.start(n).await;
    }
    if with_gateway {
        std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http))
            .unwrap_or_else(|e| panic!("url file: {e}"));
    }
    d
}

fn approvals_client(d: &Deployment) -> ApprovalServiceClient<Channel> {
    ApprovalServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.approver_admin_socket(),
    ))
}

/// `warden --state-dir D ARGS...`: (exit code, stdout, stderr).
async fn warden(d: &Deployment, args: &[&str]) -> (Option<i32>, String, String) {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state]).args(args);
    let out = run_with_deadline(&mut c, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("warden {args:?}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls the approver until `n` requests are pending (15 s).
async fn pending(d: &Deployment, n: usize) -> Vec<pb::Approval> {
    let mut c = approvals_client(d);
    let start = Instant::now();
    loop {
        if let Ok(r) = c.list(pb::ListApprovalsRequest { limit: 0 }).await {
            let got = r.into_inner().approvals;
            if got.len() >= n {
                return got;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{n} pending request(s) did not appear"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Polls one approval until it leaves PENDING (15 s).
async fn decided(d: &Deployment, id: &str) -> pb::Approval {
    let mut c = approvals_client(d);
    let start = Instant::now();
    loop {
        if let Ok(r) = c.get(pb::GetApprovalRequest { id: id.into() }).await {
            let a = r.into_inner();
            if a.state() != pb::ApprovalState::Pending {
                return a;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{id} was not decided"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn edit(path: &str, content: &str) -> String {
    scenario(json!({"vocabulary": "claude-0.101", "steps": [
        {"type": "tool", "kind": "edit", "path": path, "content": content, "ask": true},
        {"type": "message", "text": "done"}]}))
}

fn root_of(evs: &[pb::TurnEvent]) -> std::path::PathBuf {
    evs.iter()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::Started(s)) => Some(std::path::PathBuf::from(&s.root)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Started event: {evs:#?}"))
}

#[tokio::test]
async fn an_escalated_edit_approved_with_the_cli_lands_and_is_audited_with_who_answered() {
    let d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap1", "t1", &edit("hello.txt", "hi"))).await;
    let p = pending(&d, 1).await;
    let id = p[0].id.clone();
    assert_eq!(p[0].escalated_rule, "tool.escalate", "{:?}", p[0]);

    let (code, shown, err) = warden(&d, &["approvals", "show", &id]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(shown.contains("hello.txt"), "{shown}");
    assert!(shown.contains("tool.escalate"), "{shown}");
    let (code, listed, _) = warden(&d, &["approvals", "list"]).await;
    assert_eq!(code, Some(0));
    assert!(listed.contains(&id), "{listed}");

    let (code, out, err) = warden(&d, &["approvals", "approve", &id, "--reason", "fine"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("APPROVED"), "{out}");

    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{perms:#?}");
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32, "{perms:#?}");
    assert_eq!(perms[0].rule, "approval.approved");
    assert_eq!(perms[0].decision_id, id);
    assert_eq!(
        std::fs::read_to_string(root_of(&evs).join("hello.txt")).unwrap_or_default(),
        "hi"
    );

    let (code, hist, _) = warden(&d, &["approvals", "history"]).await;
    assert_eq!(code, Some(0));
    let me = nix::unistd::getuid().as_raw();
    assert!(
        hist.contains(&id) && hist.contains(&format!("uid:{me}")),
        "{hist}"
    );
    let (_, full, _) = warden(&d, &["approvals", "show", &id]).await;
    assert!(full.contains("time to decide"), "{full}");
    assert!(full.contains("reason          fine"), "{full}");
}

#[tokio::test]
async fn a_denial_with_a_reason_reaches_the_a2a_caller() {
    let d = deploy_approver(&[], true).await;
    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", &edit("nope.txt", "x")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = send.spawn().unwrap_or_else(|e| panic!("warden send: {e}"));
    let p = pending(&d, 1).await;
    let (code, _, err) = warden(
        &d,
        &["approvals", "deny", &p[0].id, "--reason", "not on a Friday"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("warden send did not finish"))
        .unwrap_or_else(|e| panic!("warden send: {e}"));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("not on a Friday"), "{shown}");
    assert!(shown.contains("approval.denied"), "{shown}");
    assert_eq!(out.status.code(), Some(4), "{shown}");
}

#[tokio::test]
async fn no_answer_is_denied_at_the_deadline_as_no_response() {
    let d = deploy_approver(&[("approver", "approval.deadline_ms=1500")], false).await;
    let mut c = client(&d);
    let t0 = Instant::now();
    let evs = run(&mut c, turn("ap3", "t1", &edit("late.txt", "x"))).await;
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{perms:#?}");
    assert_eq!(perms[0].verdict, pb::Verdict::Deny as i32);
    assert_eq!(perms[0].rule, "approval.no-response", "{perms:#?}");
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert!(!root_of(&evs).join("late.txt").exists());
    let refusals = stop(&evs).refusals;
    assert!(
        refusals.iter().any(|r| r.rule == "approval.no-response"),
        "{refusals:#?}"
    );
    let a = decided(&d, &perms[0].decision_id).await;
    assert_eq!(a.state(), pb::ApprovalState::NoResponse);
}

#[tokio::test]
async fn cancelling_the_task_revokes_its_pending_request_at_once() {
    let d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap4", "t1", &edit("never.txt", "x"))).await;
    let p = pending(&d, 1).await;
    let out = c
        .cancel_turn(pb::CancelTurnRequest {
            context_id: "ap4".into(),
            turn_id: "t1".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("CancelTurn: {e}"))
        .into_inner();
    assert_eq!(out.outcome, "active");
    let a = decided(&d, &p[0].id).await;
    assert_eq!(a.state(), pb::ApprovalState::Revoked, "{a:?}");
    assert_eq!(a.rule, "approval.revoked");
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    assert_eq!(stop(&evs).stop_reason, "cancelled");
    // Too late now: an answer to a revoked request is refused and names what happened.
    let (code, _, err) = warden(&d, &["approvals", "approve", &p[0].id]).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("revoked"), "{err}");
}

#[tokio::test]
async fn a_pending_request_survives_an_approver_restart() {
    let mut d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap5", "t1", &edit("kept.txt", "kept"))).await;
    let before = pending(&d, 1).await;
    let approver = d.take("approver").unwrap_or_else(|| panic!("no approver"));
    let status = approver.terminate().await;
    assert!(status.success(), "{status}");
    d.start("approver").await;
    let after = pending(&d, 1).await;
    assert_eq!(after[0].id, before[0].id, "the same request, found again");
    let (code, _, err) = warden(&d, &["approvals", "approve", &after[0].id]).await;
    assert_eq!(code, Some(0), "{err}");
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let perms = permissions(&evs);
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32, "{perms:#?}");
    assert_eq!(
        std::fs::read_to_string(root_of(&evs).join("kept.txt")).unwrap_or_default(),
        "kept"
    );
}

#[tokio::test]
async fn a_restart_after_the_caller_gave_up_marks_the_request_expired() {
    let mut d = deploy_approver(
        &[
            ("approver", "approval.deadline_ms=1000"),
            ("supervisor", "policy.decide_deadline_ms=1000"),
        ],
        false,
    )
    .await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap6", "t1", &edit("gone.txt", "x"))).await;
    let p = pending(&d, 1).await;
    // A crash: nothing marks the request on the way down.
    d.take("approver")
        .unwrap_or_else(|| panic!("no approver"))
        .crash()
        .await;
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    assert_eq!(permissions(&evs)[0].verdict, pb::Verdict::Deny as i32);
    // Restarted only once the request's deadline is gone (restarted sooner, it would be held
    // until then and end as no-response).
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    };
    let waited = Instant::now();
    while now_ms() <= p[0].deadline_unix_ms {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the clock stands still"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.start("approver").await;
    let a = decided(&d, &p[0].id).await;
    assert_eq!(a.state(), pb::ApprovalState::Expired, "{a:?}");
    assert_eq!(a.rule, "approval.expired");
}

#[tokio::test]
async fn of_two_operators_answering_at_once_the_first_wins_and_the_other_sees_who() {
    let d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap7", "t1", &edit("race.txt", "x"))).await;
    let id = pending(&d, 1).await[0].id.clone();
    let approve = ["approvals", "approve", id.as_str()];
    let deny = ["approvals", "deny", id.as_str(), "--reason", "race"];
    let (a, b) = tokio::join!(warden(&d, &approve), warden(&d, &deny));
    let codes = [a.0, b.0];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(4)),
        "exactly one answer wins: {a:?} {b:?}"
    );
    let loser = if a.0 == Some(4) { &a.2 } else { &b.2 };
    let me = nix::unistd::getuid().as_raw();
    assert!(
        loser.contains("already decided") && loser.contains(&format!("uid:{me}")),
        "{loser}"
    );
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let won = decided(&d, &id).await;
    let perm = &permissions(&evs)[0];
    let want = if won.state() == pb::ApprovalState::Approved {
        pb::Verdict::Allow
    } else {
        pb::Verdict::Deny
    };
    assert_eq!(perm.verdict, want as i32, "{won:?} {perm:?}");
}

#[tokio::test]
async fn unknown_ids_foreign_ids_and_bad_answers_are_refused() {
    let d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let mut s = start(&mut c, turn("ap8", "t1", &edit("x.txt", "x"))).await;
    let id = pending(&d, 1).await[0].id.clone();

    let (code, _, err) = warden(&d, &["approvals", "approve", "no-such-id"]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no-such-id"), "{err}");
    // A denial without a reason is refused before anything changes (clap requires --reason; the
    // API requires it too).
    let mut api = approvals_client(&d);
    let e = api
        .answer(pb::AnswerRequest {
            id: id.clone(),
            verdict: pb::Verdict::Deny as i32,
            reason: "  ".into(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("a reasonless denial was accepted"));
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = api
        .answer(pb::AnswerRequest {
            id: id.clone(),
            verdict: pb::Verdict::Escalate as i32,
            reason: String::new(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("ESCALATE was accepted as an answer"));
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // The id belongs to this deployment; another deployment's approver does not know it.
    let mut other = Deployment::new_in(
        &parent(),
        Options {
            approver: true,
            sets: vec![("approver".into(), "upstream.socket=\"\"".into())],
            ..Default::default()
        },
    );
    other.start("approver").await;
    let (code, _, err) = warden(&other, &["approvals", "approve", &id]).await;
    assert_eq!(code, Some(3), "{err}");

    let (code, _, _) = warden(&d, &["approvals", "approve", &id]).await;
    assert_eq!(code, Some(0));
    let (code, _, err) = warden(&d, &["approvals", "approve", &id]).await;
    assert_eq!(code, Some(4), "a second answer: {err}");
    collect(&mut s, Duration::from_secs(30)).await;
}

/// What a terminal shows: bytes read from a pseudo-terminal's master side, as text.
struct Terminal {
    master: std::fs::File,
    seen: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    /// Opens a pty; returns it and the slave side for the child's stdin/stdout/stderr.
    fn open() -> (Terminal, std::os::fd::OwnedFd) {
        let pty = nix::pty::openpty(None, None).unwrap_or_else(|e| panic!("openpty: {e}"));
        let master = std::fs::File::from(pty.master);
        let mut reader = master
            .try_clone()
            .unwrap_or_else(|e| panic!("pty clone: {e}"));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = seen.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            // EIO once every slave fd is closed (the child exited): the end.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = into.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        (Terminal { master, seen }, pty.slave)
    }

    fn text(&self) -> String {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits (20 s) until the screen shows `needle` after byte `from`; returns where it ends.
    async fn expect(&self, from: usize, needle: &str) -> usize {
        let t0 = Instant::now();
        loop {
            let t = self.text();
            if let Some(i) = t.get(from..).and_then(|rest| rest.find(needle)) {
                return from + i + needle.len();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the terminal never showed {needle:?}; it shows:\n{t}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn press(&mut self, keys: &str) {
        use std::io::Write;
        self.master
            .write_all(keys.as_bytes())
            .unwrap_or_else(|e| panic!("typing {keys:?}: {e}"));
    }
}

/// `warden approvals watch` on a real pseudo-terminal: a request that arrives while it runs is
/// shown live and selected; the key `a` approves it and the task's write lands; `d` asks for a
/// reason, which reaches the task; `q` quits and the terminal is back in line mode.
#[tokio::test(flavor = "multi_thread")]
async fn approvals_watch_on_a_terminal_answers_live_requests_with_a_key_press() {
    let d = deploy_approver(&[], false).await;
    let (mut term, slave) = Terminal::open();
    let state = d.dir.path().to_string_lossy().to_string();
    let dup = |fd: &std::os::fd::OwnedFd| {
        std::process::Stdio::from(fd.try_clone().unwrap_or_else(|e| panic!("dup: {e}")))
    };
    let mut watch = tokio::process::Command::new(binary("warden"))
        .args(["--state-dir", &state, "approvals", "watch"])
        .stdin(dup(&slave))
        .stdout(dup(&slave))
        .stderr(dup(&slave))
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("warden approvals watch: {e}"));
    let mut at = term.expect(0, "keys: a approve").await;

    // Only now does a request exist: the watch shows it as it arrives.
    let mut c = client(&d);
    let mut s = start(&mut c, turn("w1", "t1", &edit("watched.txt", "by key"))).await;
    let p = pending(&d, 1).await;
    at = term.expect(at, &format!("{}  PENDING", p[0].id)).await;
    at = term.expect(at, &format!("selected {}", p[0].id)).await;
    term.press("a");
    at = term.expect(at, "answered: ").await;
    at = term.expect(at, "APPROVED").await;
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let perms = permissions(&evs);
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32, "{perms:#?}");
    assert_eq!(perms[0].decision_id, p[0].id);
    assert_eq!(
        std::fs::read_to_string(root_of(&evs).join("watched.txt")).unwrap_or_default(),
        "by key"
    );

    // A second one, refused with `d` and a typed reason.
    let mut s = start(&mut c, turn("w2", "t1", &edit("refused.txt", "x"))).await;
    let second = pending(&d, 1).await;
    at = term.expect(at, &format!("selected {}", second[0].id)).await;
    term.press("d");
    at = term.expect(at, "reason for denying").await;
    term.press("not from the terminal\n");
    at = term.expect(at, "DENIED").await;
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let perms = permissions(&evs);
    assert_eq!(perms[0].verdict, pb::Verdict::Deny as i32, "{perms:#?}");
    assert_eq!(perms[0].rule, "approval.denied");
    assert!(
        perms[0].reason.contains("not from the terminal"),
        "{perms:#?}"
    );
    assert!(!root_of(&evs).join("refused.txt").exists());

    term.press("q");
    let status = tokio::time::timeout(Duration::from_secs(10), watch.wait())
        .await
        .unwrap_or_else(|_| panic!("watch did not quit on q:\n{}", term.text()))
        .unwrap_or_else(|e| panic!("watch: {e}"));
    assert!(status.success(), "{status}: {}", &term.text()[at..]);
    let mode = nix::sys::termios::tcgetattr(&slave).unwrap_or_else(|e| panic!("tcgetattr: {e}"));
    assert!(
        mode.local_flags
            .contains(nix::sys::termios::LocalFlags::ICANON | nix::sys::termios::LocalFlags::ECHO),
        "the terminal was left in single-key mode"
    );
}

/// `warden doctor` compares the supervisor's effective deadlines with the approver's: they agree
/// under `warden up --approver` (the supervisor adopted the approver's); an approver restarted
/// with a longer deadline is a mismatch (exit 1) until the supervisor re-reads it.
#[tokio::test(flavor = "multi_thread")]
async fn warden_doctor_checks_that_the_supervisor_waits_as_long_as_the_approver_needs() {
    let mut d = deploy_approver(&[], false).await;
    let (code, out, err) = warden(&d, &["doctor"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("warden-approver      needs 302000 ms"),
        "{out}"
    );
    assert!(
        out.contains("waits 302000 ms (own setting 200 ms; described by warden-approver"),
        "the supervisor's own setting is untouched, the approver's adopted: {out}"
    );
    assert!(out.contains("OK: the supervisor waits"), "{out}");

    // Refresh the supervisor's copy now, then give the approver a longer deadline for claude.
    let mut sup = client(&d);
    sup.status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("status: {e}"));
    let t0 = Instant::now();
    let approver = d.take("approver").unwrap_or_else(|| panic!("no approver"));
    assert!(approver.terminate().await.success());
    d.opts.sets.push((
        "approver".into(),
        "approval.agents.claude.deadline_ms=600000".into(),
    ));
    d.start("approver").await;
    let (code, out, _) = warden(&d, &["doctor"]).await;
    if t0.elapsed() < Duration::from_secs(9) {
        assert_eq!(code, Some(1), "{out}");
        assert!(
            out.contains("MISMATCH agent claude: the supervisor waits 302000 ms, the approver needs 602000 ms"),
            "{out}"
        );
    }
    // Within the supervisor's re-read interval (10 s) it follows, and doctor agrees again.
    loop {
        let (code, out, _) = warden(&d, &["doctor"]).await;
        if code == Some(0) {
            assert!(out.contains("OK"), "{out}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(25),
            "the supervisor never adopted the new deadline: {out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let st = sup
        .status(pb::StatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("status: {e}"))
        .into_inner();
    assert_eq!(st.details["decide_deadline_ms.own"], "200");
    assert_eq!(st.details["decide_deadline_ms.effective"], "302000");
}

/// A deadline beyond what any supervisor waits (one hour, upstream budget included) is refused
/// at start, naming the key: people would be shown a time they do not have.
#[tokio::test]
async fn the_approver_refuses_to_start_with_a_deadline_beyond_the_cap() {
    let d = Deployment::new_in(
        &parent(),
        Options {
            approver: true,
            ..Default::default()
        },
    );
    let mut args = warden_cli::up::daemon_args("approver", &d.plan());
    args.extend(["--set".into(), "approval.deadline_ms=3599000".into()]);
    let mut c = tokio::process::Command::new(binary("warden-approver"));
    c.args(&args);
    let out = run_with_deadline(&mut c, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("warden-approver: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {err}");
    assert!(
        err.contains("approval.deadline_ms") && err.contains("3600000"),
        "{err}"
    );
    assert!(!warden_daemon::client::healthy(&d.layout.socket_of("approver")).await);
}

/// An approval the caller did not act on (it withdrew the request: gave up waiting, or its turn
/// was cancelled as the answer came) is not "approved" in history: it says what was enforced.
#[tokio::test]
async fn history_shows_an_approval_the_caller_withdrew_as_not_enforced() {
    let d = deploy_approver(&[], false).await;
    // As the supervisor would: Decide, an operator approves, then Withdraw.
    let mut policy =
        warden_proto::v1::policy_service_client::PolicyServiceClient::new(d.channel("approver"));
    let root = d.dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    let req = pb::DecideRequest {
        request_id: "withdrawn-1".into(),
        subject: Some(pb::Subject {
            agent: "scripted".into(),
            context_id: "ctx-w".into(),
            task_id: "t1".into(),
            ..Default::default()
        }),
        boundary: Some(pb::Boundary {
            root: root.display().to_string(),
            owned: true,
            allow_execute: false,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: "c1".into(),
            kind: "edit".into(),
            title: "Write w.txt".into(),
            locations: vec![pb::Location {
                path: root.join("w.txt").display().to_string(),
                line: None,
            }],
            ..Default::default()
        }),
        options: vec![pb::PermissionOption {
            id: "allow-once".into(),
            name: "Yes".into(),
            kind: "allow_once".into(),
        }],
        ..Default::default()
    };
    let asked = tokio::spawn({
        let mut policy = policy.clone();
        let req = req.clone();
        async move { policy.decide(req).await }
    });
    let id = pending(&d, 1).await[0].id.clone();
    let (code, _, err) = warden(&d, &["approvals", "approve", &id, "--reason", "ok"]).await;
    assert_eq!(code, Some(0), "{err}");
    let got = asked
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("Decide: {e}"))
        .into_inner();
    assert_eq!(got.verdict, pb::Verdict::Allow as i32);
    let w = policy
        .withdraw(pb::WithdrawRequest {
            request_id: "withdrawn-1".into(),
            reason: "no answer within 200 ms (+500 ms grace)".into(),
            subject: req.subject.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("Withdraw: {e}"))
        .into_inner();
    assert_eq!(w.decision_id, id);
    assert!(w.superseded, "{w:?}");
    let a = approvals_client(&d)
        .get(pb::GetApprovalRequest { id: id.clone() })
        .await
        .unwrap_or_else(|e| panic!("Get: {e}"))
        .into_inner();
    assert_eq!(a.state(), pb::ApprovalState::Withdrawn, "{a:?}");
    assert_eq!(a.reason, "ok", "the person's answer is kept");
    let (_, hist, _) = warden(&d, &["approvals", "history"]).await;
    let line = hist
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("{id} not in history: {hist}"));
    assert!(
        line.contains("WITHDRAWN") && line.contains("not enforced"),
        "{line}"
    );
    let (_, shown, _) = warden(&d, &["approvals", "show", &id]).await;
    assert!(shown.contains("enforced        DENY"), "{shown}");
    // Asked again under the same id, it is a refusal now.
    let again = policy
        .decide(req)
        .await
        .unwrap_or_else(|e| panic!("Decide: {e}"))
        .into_inner();
    assert_eq!(again.verdict, pb::Verdict::Deny as i32, "{again:?}");
    assert_eq!(again.rule, "approval.withdrawn");
}

/// Issue 24, case 4: what a person approves is what is carried out. The agent asks to write
/// "harmless" (escalated; `warden approvals show` names the digest and the content's hash the
/// approval binds), is approved, then asks the client to write other content: that write is not
/// covered by the approval, it is put to a person again carrying the real content, and denied.
#[tokio::test]
async fn an_approval_binds_the_content_the_person_saw() {
    use sha2::Digest;
    let sha = |s: &str| hex::encode(sha2::Sha256::digest(s.as_bytes()));
    let d = deploy_approver(&[], false).await;
    let mut c = client(&d);
    let hostile = scenario(json!({"vocabulary": "claude-0.16", "steps": [
        {"type": "tool", "kind": "edit", "path": "x.txt", "content": "harmless", "ask": true,
         "via": "client", "then_write": "pwned"},
        {"type": "message", "text": "done"}]}));
    let mut s = start(&mut c, turn("apdig", "t1", &hostile)).await;
    let first = pending(&d, 1).await.remove(0);
    let j = first.judged.clone().unwrap_or_default();
    assert_eq!(j.content_sha256, sha("harmless"), "{first:?}");
    assert!(j.digest.starts_with("sha256:"), "{j:?}");
    let (code, shown, err) = warden(&d, &["approvals", "show", &first.id]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        shown.contains(&format!("binds           {}", j.digest)),
        "{shown}"
    );
    assert!(shown.contains(&sha("harmless")), "{shown}");
    let (code, _, err) = warden(&d, &["approvals", "approve", &first.id]).await;
    assert_eq!(code, Some(0), "{err}");

    // The write of other content comes back to a person, as what it really is.
    let mut ap = approvals_client(&d);
    let start_wait = Instant::now();
    let second = loop {
        let list = ap
            .list(pb::ListApprovalsRequest { limit: 0 })
            .await
            .unwrap()
            .into_inner()
            .approvals;
        if let Some(a) = list.into_iter().find(|a| a.id != first.id) {
            break a;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(15),
            "the other write was not put to a person"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let j2 = second.judged.clone().unwrap_or_default();
    assert_eq!(j2.content_sha256, sha("pwned"), "{second:?}");
    assert_ne!(j2.digest, j.digest);
    let (_, shown, _) = warden(&d, &["approvals", "show", &second.id]).await;
    assert!(shown.contains("fs/write_text_file"), "{shown}");
    assert!(
        shown.contains("pwned"),
        "the content itself is shown: {shown}"
    );
    let (code, _, err) = warden(
        &d,
        &[
            "approvals",
            "deny",
            &second.id,
            "--reason",
            "not what I approved",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 2, "{perms:#?}");
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32);
    assert_eq!(perms[1].verdict, pb::Verdict::Deny as i32);
    assert!(
        !root_of(&evs).join("x.txt").exists(),
        "the other content was written"
    );
}

/// `turn` as `principal`.
fn turn_as(principal: &str, ctx: &str, id: &str, text: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, id, text);
    if let Some(o) = t.open.as_mut() {
        o.principal = principal.into();
    }
    t
}

#[tokio::test]
async fn a_caller_flooding_the_queue_leaves_another_callers_request_to_a_person() {
    // Issue 36, finding 1: bob's turns fill the queue and hang; alice's escalation must still
    // reach a person (before: denied at once, `approval.queue-full`). Small shares so the
    // flood is quick: the whole queue 6, a principal 3.
    let d = deploy_approver(
        &[
            ("approver", "approval.max_pending=6"),
            ("approver", "approval.max_pending_per_principal=3"),
        ],
        false,
    )
    .await;
    let c = client(&d);
    let mut bobs = Vec::new();
    for i in 0..5 {
        let mut c = c.clone();
        let req = turn_as("bob", &format!("bob-{i}"), "t1", &edit("b.txt", "b"));
        bobs.push(tokio::spawn(async move {
            let mut s = start(&mut c, req).await;
            collect(&mut s, Duration::from_secs(60)).await
        }));
    }
    // Three of bob's wait for a person; his other two are refused by his share, at once.
    let held = pending(&d, 3).await;
    let mut refused = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while refused.len() < 2 && Instant::now() < until {
        let mut left = Vec::new();
        for b in bobs {
            if b.is_finished() {
                refused.push(b.await.expect("bob's turn"));
            } else {
                left.push(b);
            }
        }
        bobs = left;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused.len(), 2, "two of bob's turns end: {held:#?}");
    for evs in &refused {
        let p = permissions(evs);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(p[0].verdict, pb::Verdict::Deny as i32, "{p:#?}");
        assert_eq!(p[0].rule, "approval.principal-share-full", "{p:#?}");
    }
    assert_eq!(pending(&d, 3).await.len(), 3);

    // alice's escalation is held for a person, and shown among the first (one of each
    // principal in turn).
    let mut ca = c.clone();
    let mut alice = start(
        &mut ca,
        turn_as("alice", "alice-1", "t1", &edit("a.txt", "a")),
    )
    .await;
    let now = pending(&d, 4).await;
    let first_two: Vec<String> = now
        .iter()
        .take(2)
        .map(|a| {
            a.request
                .as_ref()
                .and_then(|r| r.subject.as_ref())
                .map(|s| s.principal.clone())
                .unwrap_or_default()
        })
        .collect();
    assert!(first_two.contains(&"alice".to_string()), "{first_two:?}");
    let alices = now
        .iter()
        .find(|a| {
            a.request
                .as_ref()
                .and_then(|r| r.subject.as_ref())
                .is_some_and(|s| s.principal == "alice")
        })
        .expect("alice's request");
    let (code, out, err) = warden(&d, &["approvals", "approve", &alices.id]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let evs = collect(&mut alice, Duration::from_secs(30)).await;
    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    assert_eq!(
        std::fs::read_to_string(root_of(&evs).join("a.txt")).unwrap_or_default(),
        "a"
    );
    for b in bobs {
        b.abort();
    }
}
