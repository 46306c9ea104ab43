//! Foundation: the three daemons start, report health, refuse strangers and bad configuration,
//! and stop cleanly — alone and under `warden up`.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt as _;
use std::time::{Duration, Instant};

use warden_e2e::{Deployment, Options, binary, run_with_deadline, spawn_group};

const DAEMONS: [&str; 3] = ["policy", "supervisor", "gateway"];

#[tokio::test]
async fn three_daemons_come_up_healthy_as_separate_processes_and_stop_on_sigterm() {
    let mut d = Deployment::up(Options::default()).await;
    let pids: Vec<i32> = d.daemons.iter().map(|x| x.pid()).collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|p| *p > 0));
    assert!(pids[0] != pids[1] && pids[1] != pids[2] && pids[0] != pids[2]);
    for name in ["gateway", "supervisor", "policy"] {
        let daemon = d.take(name).expect("started");
        let socket = daemon.socket.clone();
        let status = daemon.terminate().await;
        assert!(
            status.success(),
            "warden-{name} exited with {status} on SIGTERM"
        );
        assert!(!socket.exists(), "warden-{name} left its socket behind");
    }
}

/// Runs `grpc-probe SOCKET` as `uid` and returns what it printed.
async fn probe_as(uid: u32, socket: &std::path::Path) -> String {
    let mut cmd = std::process::Command::new(binary("grpc-probe"));
    cmd.arg(socket).uid(uid).gid(uid);
    let mut cmd = tokio::process::Command::from(cmd);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(10))
        .await
        .expect("probe runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_peer_whose_uid_is_not_on_the_allowlist_gets_permission_denied() {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP: needs root to run the probe as another uid");
        return;
    }
    const NOBODY: u32 = 65534;
    let opts = Options {
        // A world-connectable socket, so only the peer-credential check stands in the way.
        sets: vec![("policy".into(), "listen.mode=\"0666\"".into())],
        ..Default::default()
    };
    let mut d = Deployment::new(opts);
    for p in [d.dir.path().to_path_buf(), d.layout.run_dir()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d.start("policy").await;
    let socket = d.layout.socket_of("policy");
    assert_eq!(probe_as(0, &socket).await, "SERVING");
    assert_eq!(probe_as(NOBODY, &socket).await, "PermissionDenied");

    // The same uid is admitted once the operator lists it.
    d.take("policy").expect("running").crash().await;
    d.opts
        .sets
        .push(("policy".into(), format!("listen.allow_uids=[0, {NOBODY}]")));
    d.start("policy").await;
    assert_eq!(probe_as(NOBODY, &socket).await, "SERVING");
}

#[tokio::test]
async fn a_broken_configuration_exits_non_zero_with_one_line_naming_the_key() {
    let d = Deployment::new(Options::default());
    let bad_file = d.dir.path().join("bad.toml");
    std::fs::write(
        &bad_file,
        "[daemon]\nstate_dir = \"/tmp/x\"\nno_such_key = 1\n",
    )
    .unwrap();
    for name in DAEMONS {
        // A misspelt key in a file: named, with the file.
        let bad = bad_file.to_string_lossy().to_string();
        let mut c = tokio::process::Command::new(binary(&format!("warden-{name}")));
        c.args(["--config", &bad]);
        let out = run_with_deadline(&mut c, Duration::from_secs(10))
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "warden-{name} accepted a bad file");
        assert!(err.contains("no_such_key"), "warden-{name}: {err}");
        assert!(err.contains("bad.toml"), "warden-{name}: {err}");
        assert!(!err.contains("panicked"), "warden-{name} panicked: {err}");

        // A malformed value given as a flag: named by its dotted key.
        let mut c = tokio::process::Command::new(binary(&format!("warden-{name}")));
        c.args(["--set", "listen.mode=\"99x\""]);
        let out = run_with_deadline(&mut c, Duration::from_secs(10))
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "warden-{name} accepted mode 99x");
        assert!(err.contains("listen.mode"), "warden-{name}: {err}");

        // A missing configuration file.
        let mut c = tokio::process::Command::new(binary(&format!("warden-{name}")));
        c.args(["--config", "/nonexistent/warden.toml"]);
        let out = run_with_deadline(&mut c, Duration::from_secs(10))
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("/nonexistent/warden.toml"),
            "warden-{name}: {err}"
        );
        assert_eq!(
            err.trim().lines().count(),
            1,
            "warden-{name}: more than one line: {err}"
        );
    }
}

#[tokio::test]
async fn socket_problems_are_refused_cleanly_and_a_stale_socket_is_replaced() {
    let mut d = Deployment::new(Options::default());
    // A socket directory that does not exist.
    let mut c = tokio::process::Command::new(binary("warden-policy"));
    // Its own state directory: never the host's default (a deployed warden may hold it).
    let state = d.dir.path().join("policy-nosocket");
    c.args([
        "--set",
        "listen.socket=\"/nonexistent-dir/p.sock\"",
        "--set",
        &format!("daemon.state_dir={:?}", state.to_string_lossy()),
    ]);
    let out = run_with_deadline(&mut c, Duration::from_secs(10))
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("/nonexistent-dir"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // A socket in use by a live daemon is refused ...
    d.start("policy").await;
    let second = d.spawn("policy", &[]);
    let out = tokio::time::timeout(Duration::from_secs(10), second.wait_with_output())
        .await
        .expect("second daemon exits")
        .unwrap();
    assert!(
        !out.status.success(),
        "a second daemon took over a live socket"
    );

    // ... but a crashed daemon's stale socket file is replaced.
    let first = d.take("policy").unwrap();
    first.crash().await;
    assert!(
        d.layout.socket_of("policy").exists(),
        "crash leaves the socket file"
    );
    d.start("policy").await;
}

#[tokio::test]
async fn warden_up_starts_three_healthy_daemons_and_ctrl_c_leaves_nothing_behind() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let args: Vec<String> = ["--state-dir", &state, "up", "--http", &d.http]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let start = Instant::now();
    let mut up = spawn_group(&binary("warden"), &args, false);
    let healthy = wait_until_status_healthy(&state, &mut up, Duration::from_secs(15)).await;
    let took = start.elapsed();
    assert!(healthy, "warden status never reported all healthy");
    eprintln!("warden up healthy after {took:?}");

    let daemon_pids = daemon_pids_with_arg(&state);
    assert_eq!(
        daemon_pids.len(),
        3,
        "expected three daemon processes: {daemon_pids:?}"
    );

    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait())
        .await
        .expect("warden up exits after Ctrl-C")
        .unwrap();
    assert!(status.success(), "warden up exited with {status}");
    let left: Vec<_> = std::fs::read_dir(d.layout.run_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    assert!(
        pids_with_arg(&state).is_empty(),
        "daemon processes left behind"
    );

    // `warden status` now says they are down.
    let mut st = tokio::process::Command::new(binary("warden"));
    st.args(["--state-dir", &state, "status"]);
    let out = run_with_deadline(&mut st, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!out.status.success());
}

/// Polls `warden status` until it reports all three daemons healthy (true) or `within` passes
/// (false); panics if `warden up` exits meanwhile.
async fn wait_until_status_healthy(
    state: &str,
    up: &mut tokio::process::Child,
    within: Duration,
) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        let mut st = tokio::process::Command::new(binary("warden"));
        st.args(["--state-dir", state, "status"]);
        let out = run_with_deadline(&mut st, Duration::from_secs(10))
            .await
            .unwrap();
        if out.status.success() {
            return true;
        }
        if let Ok(Some(s)) = up.try_wait() {
            panic!("warden up exited early: {s}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Live (non-zombie) processes whose command line mentions `needle`, other than `warden up` itself.
/// The daemons among [`pids_with_arg`] (not the scripted agent's warm agent, whose sandbox's
/// command line names the state directory too).
fn daemon_pids_with_arg(needle: &str) -> Vec<i32> {
    const DAEMONS: [&str; 4] = [
        "warden-policy",
        "warden-supervisor",
        "warden-gateway",
        "warden-approver",
    ];
    pids_with_arg(needle)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
                let name = String::from_utf8_lossy(argv0);
                DAEMONS.iter().any(|d| name.rsplit('/').next() == Some(*d))
            })
        })
        .collect()
}

fn pids_with_arg(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        if cmd.contains(needle) && cmd.contains("warden-") && !zombie {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn one_task_id_follows_a_request_through_all_three_daemons_json_logs() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let log_path = d.dir.path().join("up.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = std::process::Command::new(binary("warden"));
    cmd.args([
        "--state-dir",
        &state,
        "up",
        // The daemons' info lines (the default is warnings only).
        "-v",
        "--http",
        &d.http,
        "--log-format",
        "json",
    ])
    .stdin(std::process::Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log)
    .process_group(0);
    let mut up = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        wait_until_status_healthy(&state, &mut up, Duration::from_secs(15)).await,
        "not healthy"
    );
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "write hello.txt"]);
    let out = run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{shown}");
    let task_id = shown
        .lines()
        .find_map(|l| l.strip_prefix("[task] "))
        .and_then(|l| l.split_whitespace().next())
        .expect("warden send names the task")
        .to_string();
    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());

    let text = std::fs::read_to_string(&log_path).unwrap();
    for daemon in ["gateway", "supervisor", "policy"] {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with(&format!("[{daemon:>10}]"))
                    || l.contains(&format!("[{daemon}]"))
            })
            .collect();
        let with_task: Vec<serde_json::Value> = lines
            .iter()
            .filter_map(|l| l.split_once("] ").map(|(_, j)| j))
            .filter_map(|j| serde_json::from_str::<serde_json::Value>(j).ok())
            .filter(|v| v["task_id"] == task_id.as_str())
            .collect();
        assert!(
            !with_task.is_empty(),
            "warden-{daemon} logged nothing with task_id {task_id} as a JSON field"
        );
    }
}

#[tokio::test]
async fn warden_up_with_approver_runs_four_daemons_and_a_write_waits_for_a_person() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let args: Vec<String> = [
        "--state-dir",
        &state,
        "up",
        "--approver",
        "--approver-http",
        "",
        "--http",
        &d.http,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut up = spawn_group(&binary("warden"), &args, false);
    assert!(
        wait_until_status_healthy(&state, &mut up, Duration::from_secs(20)).await,
        "warden status never reported all healthy"
    );
    let mut st = tokio::process::Command::new(binary("warden"));
    st.args(["--state-dir", &state, "status"]);
    let out = run_with_deadline(&mut st, Duration::from_secs(10))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("warden-approver") && shown.contains("healthy"),
        "{shown}"
    );
    assert_eq!(
        daemon_pids_with_arg(&state).len(),
        4,
        "four daemon processes"
    );

    // The demo policy under --approver lets reads pass and puts the write in front of a person.
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "write hello.txt"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let send = send.spawn().unwrap();
    let id = {
        let start = Instant::now();
        loop {
            let mut ls = tokio::process::Command::new(binary("warden"));
            ls.args(["--state-dir", &state, "approvals", "list"]);
            let out = run_with_deadline(&mut ls, Duration::from_secs(10))
                .await
                .unwrap();
            let listed = String::from_utf8_lossy(&out.stdout).to_string();
            if let Some(l) = listed.lines().find(|l| l.contains("PENDING")) {
                break l.split_whitespace().next().unwrap_or_default().to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nothing pending: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut ok = tokio::process::Command::new(binary("warden"));
    ok.args(["--state-dir", &state, "approvals", "approve", &id]);
    let out = run_with_deadline(&mut ok, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = tokio::time::timeout(Duration::from_secs(60), send.wait_with_output())
        .await
        .expect("warden send finishes")
        .unwrap();
    let shown = String::from_utf8_lossy(&sent.stdout).to_string();
    assert_eq!(sent.status.code(), Some(0), "{shown}");
    assert!(shown.contains("approval.approved"), "{shown}");

    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait())
        .await
        .expect("warden up exits after Ctrl-C")
        .unwrap();
    assert!(status.success(), "warden up exited with {status}");
    assert!(
        pids_with_arg(&state).is_empty(),
        "daemon processes left behind"
    );
}

/// A daemon that cannot start says why in the test's failure, not only its exit status: here a
/// supervisor whose state directory is in `/tmp` (where a checkout cloned into `/tmp` used to
/// put every deployment) refuses, and its own reason reaches the panic message.
#[tokio::test]
async fn a_daemon_that_fails_to_start_shows_its_own_reason() {
    let parent = std::path::Path::new("/tmp").join(format!("warden-e2e-{}", std::process::id()));
    let task = tokio::spawn(async move {
        let mut d = Deployment::new_in(&parent, Options::default());
        d.start("policy").await;
        d.start("supervisor").await;
    });
    let err = task
        .await
        .expect_err("the supervisor refuses a state directory in /tmp");
    let msg = err
        .into_panic()
        .downcast::<String>()
        .map(|s| *s)
        .unwrap_or_default();
    assert!(
        msg.contains("exited during start-up") && msg.contains("temp tree"),
        "{msg}"
    );
}

/// `warden up` checks its own flags and every daemon's configuration before starting any
/// daemon, and blames the flag or the file (with the TOML caret diagram) that is wrong. It used
/// to start the policy, then report `--http 7541` as a fault of "the embedded default
/// configuration" of the supervisor.
#[tokio::test]
async fn warden_up_blames_a_bad_flag_or_file_before_starting_anything() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path().display().to_string();
    let up = |extra: &[&str]| {
        let mut c = tokio::process::Command::new(binary("warden"));
        c.args(["--state-dir", &state, "up"]).args(extra);
        c
    };
    let out = run_with_deadline(&mut up(&["--http", "7541"]), Duration::from_secs(30))
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--http \"7541\": not an address"), "{said}");
    assert!(!said.contains("embedded default"), "{said}");
    assert!(!said.contains("[    policy]"), "nothing started: {said}");

    let config = d.dir.path().join("conf");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("supervisor.toml"), "[limits\n").unwrap();
    let config_arg = config.display().to_string();
    let out = run_with_deadline(
        &mut up(&["--http", &d.http, "--config", &config_arg]),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("warden-supervisor refuses its configuration (nothing was started)"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "{}: TOML parse error at line 1",
            config.join("supervisor.toml").display()
        )),
        "{said}"
    );
    assert!(said.contains("1 | [limits"), "the caret diagram: {said}");
    assert!(!said.contains("[    policy]"), "nothing started: {said}");
    assert!(
        !d.layout.socket_of("policy").exists(),
        "no daemon was started"
    );
}

/// `warden up` is quiet: for a short session (start, one task, Ctrl-C) it prints a short status
/// when ready and a line when stopped, and no daemon log line at all (warnings only, and a
/// normal stop warns of nothing); each daemon's info lines are in <state>/logs. A second `up` on the
/// same state directory fails with one last line saying what to change. It used to stream
/// 70–117 log lines and WARN on a normal stop.
#[tokio::test]
async fn warden_up_is_quiet_and_a_failure_ends_with_what_to_change() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let out_path = d.dir.path().join("up-output.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cmd = std::process::Command::new(binary("warden"));
    cmd.args(["--state-dir", &state, "up", "--http", &d.http])
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    let mut up = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        wait_until_status_healthy(&state, &mut up, Duration::from_secs(20)).await,
        "not healthy"
    );
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "write hello.txt"])
        .stdin(std::process::Stdio::null());
    let sent = run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(sent.status.code(), Some(0));

    let mut again = tokio::process::Command::new(binary("warden"));
    again.args(["--state-dir", &state, "up", "--http", &d.http]);
    let second = run_with_deadline(&mut again, Duration::from_secs(30))
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(!second.status.success(), "{said}");
    assert!(
        said.trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with(&format!(
                "To fix: stop the running one first (`warden --state-dir {state} down`"
            ))),
        "{said}"
    );

    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    let printed = std::fs::read_to_string(&out_path).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    // `up`'s own lines: the status when ready, then stopping and stopped.
    let own: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            warden_daemon::logging::severity_of(l.split_once("] ").map_or(*l, |x| x.1)).is_none()
        })
        .collect();
    assert!(own.len() <= 6, "{} lines:\n{printed}", own.len());
    assert!(
        own[0].starts_with("warden is up: policy, supervisor, gateway healthy"),
        "{printed}"
    );
    assert_eq!(own.last(), Some(&"warden: stopped"), "{printed}");
    // No daemon line below a warning; a normal stop warns of nothing (it used to warn of each
    // agent's ACP connection as a fault).
    assert!(
        !lines.iter().any(|l| {
            warden_daemon::logging::severity_of(l.split_once("] ").map_or(*l, |x| x.1))
                .is_some_and(|s| s < warden_daemon::logging::Severity::Warn)
        }),
        "{printed}"
    );
    assert!(!printed.contains("ACP connection fault"), "{printed}");
    // The rest is kept: each daemon's info lines are in its file, `warden logs` shows them.
    for daemon in ["policy", "supervisor", "gateway"] {
        let log = std::fs::read_to_string(d.layout.log_of(daemon)).unwrap_or_default();
        assert!(log.contains(" INFO "), "warden-{daemon}'s log: {log}");
    }
    let mut logs = tokio::process::Command::new(binary("warden"));
    logs.args(["--state-dir", &state, "logs", "supervisor", "-n", "5"]);
    let out = run_with_deadline(&mut logs, Duration::from_secs(30))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success());
    assert_eq!(shown.lines().count(), 5, "{shown}");
}
