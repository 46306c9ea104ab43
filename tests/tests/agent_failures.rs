//! An agent that cannot start says why, through the real daemons: its stderr (secrets masked)
//! reaches the FAILED task's status message at the gateway, `warden send`'s output, the startup
//! incident and the supervisor's log.

use std::time::{Duration, Instant};

use warden_e2e::{Deployment, Options, binary, run_with_deadline};

/// A value only the agent's environment holds: it must never be shown.
const SECRET: &str = "s3cr3t-value-of-the-boom-token";

/// An "agent" that writes a long stderr (percent signs, which a gRPC header would have to
/// escape threefold) ending in a marker and its secret, then exits before saying anything.
fn boom_options() -> Options {
    options_for(
        "head -c 6000 /dev/zero | tr '\\000' '%' >&2; echo >&2; \
         echo \"boom-marker: cannot log in with $BOOM_API_TOKEN\" >&2; exit 3",
    )
}

/// The "boom" agent running `script` under `sh -c`.
fn options_for(script: &str) -> Options {
    Options {
        sets: vec![
            (
                "supervisor".into(),
                "agents.boom.command=\"/bin/sh\"".into(),
            ),
            (
                "supervisor".into(),
                format!("agents.boom.args=[\"-c\", {script:?}]"),
            ),
            (
                "supervisor".into(),
                format!("agents.boom.set_env={{ BOOM_API_TOKEN = \"{SECRET}\" }}"),
            ),
        ],
        log_files: true,
        ..Default::default()
    }
}

/// `warden send --agent boom hello` against `d` (the URL file written as `warden up` does).
async fn send_to_boom(d: &Deployment) -> std::process::Output {
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "--agent", "boom", "hello"])
        .stdin(std::process::Stdio::null());
    run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap()
}

/// Polls `read` until it returns Some, or panics with `what` after `limit`.
async fn eventually<T>(limit: Duration, what: &str, mut read: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = read() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_agent_that_exits_at_start_shows_its_stderr_masked_in_the_failed_task() {
    // Metrics on (`warden up --metrics`'s ports: the gateway on BASE, the supervisor on BASE+1).
    let base = loop {
        let base = warden_e2e::free_port();
        if (1..3).all(|i| warden_e2e::free_port() == base + i) {
            break base;
        }
    };
    let d = Deployment::up(Options {
        metrics: Some(std::net::SocketAddr::from(([127, 0, 0, 1], base))),
        ..boom_options()
    })
    .await;
    let out = send_to_boom(&d).await;
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("[FAILED]"), "{shown}");
    assert!(
        shown.contains("boom-marker: cannot log in with [masked]"),
        "{shown}"
    );
    assert!(!shown.contains(SECRET), "{shown}");

    // The same words are the A2A task's status message, for any client of the gateway.
    let task_id = shown
        .lines()
        .find_map(|l| l.strip_prefix("[task] "))
        .and_then(|l| l.split_whitespace().next())
        .expect("warden send names the task")
        .to_string();
    let task =
        warden_cli::client::get_json(&d.http, &format!("/a2a/rest/tasks/{task_id}"), &d.token())
            .await
            .unwrap();
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{task}");
    let message = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("initialize"), "{message}");
    assert!(
        message.contains("boom-marker: cannot log in with [masked]"),
        "{message}"
    );
    assert!(!message.contains(SECRET), "{message}");
    // Bounded: the last 4 KiB of stderr, not all 6000 percent signs.
    assert!(message.len() < 4096 + 512, "{} bytes", message.len());

    // An operator's metrics count it: the supervisor refused the turn for its start-up fault,
    // and the gateway's task entered FAILED.
    let scrape = |port: u16| async move {
        let resp = warden_cli::client::request(
            &format!("127.0.0.1:{port}"),
            http::Method::GET,
            "/metrics",
            "",
            None,
        )
        .await
        .unwrap();
        warden_cli::client::read_answer(resp).await.unwrap().1
    };
    let supervisor = scrape(base + 1).await;
    assert!(
        supervisor
            .lines()
            .any(|l| l == "warden_supervisor_refused_total{fault_class=\"startup\"} 1"),
        "{supervisor}"
    );
    let gateway = scrape(base).await;
    assert!(
        gateway
            .lines()
            .any(|l| l == "warden_gateway_tasks_entered_total{state=\"TASK_STATE_FAILED\"} 1"),
        "{gateway}"
    );

    // The startup incident holds the tail as its own field.
    let incidents = d.dir.path().join("supervisor/incidents");
    let incident = eventually(Duration::from_secs(10), "a startup incident", || {
        std::fs::read_dir(&incidents)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .find(|t| t.contains("\"startup\""))
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&incident).unwrap();
    let tail = v["stderr_tail"].as_str().unwrap_or_default();
    assert!(
        tail.ends_with("boom-marker: cannot log in with [masked]"),
        "{incident}"
    );
    assert!(!incident.contains(SECRET), "{incident}");

    // And the operator's log says it too.
    let log_path = d.log_file("supervisor");
    let log = eventually(Duration::from_secs(10), "the failure in the log", || {
        std::fs::read_to_string(&log_path)
            .ok()
            .filter(|l| l.contains("boom-marker"))
    })
    .await;
    assert!(log.contains("conversation failed to start"), "{log}");
    assert!(!log.contains(SECRET), "{log}");
}

/// Issue 24, case 6, in the operator's log and `warden send`: an agent that fails at start with a
/// stderr holding a forged log line and terminal escapes. Its stderr tail is logged and shown,
/// as escapes on the one line of its event, never as a line of its own.
#[tokio::test]
async fn an_agents_stderr_cannot_forge_a_log_line_or_reach_the_terminal_raw() {
    const FORGED: &str = "2026-12-01T00:00:00.000000Z  INFO warden_supervisor: forged-line";
    let d = Deployment::up(options_for(&format!(
        "printf 'boom-marker\\n{FORGED}\\033[2K\\033]0;pwned\\007\\n' >&2; exit 3"
    )))
    .await;
    let out = send_to_boom(&d).await;
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("[FAILED]"), "{shown}");
    assert!(
        shown.contains(r"forged-line\x1b[2K\x1b]0;pwned\x07"),
        "{shown}"
    );
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
        "{shown:?}"
    );
    assert!(!shown.lines().any(|l| l.starts_with(FORGED)), "{shown}");

    let log_path = d.log_file("supervisor");
    let log = eventually(Duration::from_secs(10), "the failure in the log", || {
        std::fs::read_to_string(&log_path)
            .ok()
            .filter(|l| l.contains("forged-line"))
    })
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("forged-line"))
        .unwrap_or_default();
    assert!(line.contains("conversation failed to start"), "{log}");
    assert!(
        line.contains(r"boom-marker\n2026-12-01T00:00:00.000000Z"),
        "{line}"
    );
    assert!(!log.lines().any(|l| l.starts_with(FORGED)), "{log}");
    assert!(!log.contains('\u{1b}') && !log.contains('\u{7}'), "{log:?}");
}
