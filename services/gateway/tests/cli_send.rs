//! `warden send` against the three real daemons: the live view shows the agent's text, the tool
//! call and the policy's verdict with its reason, and the exit status follows the final state.

use std::time::Duration;

use warden_e2e::{Deployment, Options, binary};

async fn send(d: &Deployment, text: &str) -> (i32, String) {
    send_with_stdin(d, text, None).await
}

/// Runs `warden send TEXT` with `stdin` (closed at once when None) and a 60 s deadline.
async fn send_with_stdin(d: &Deployment, text: &str, stdin: Option<&str>) -> (i32, String) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(binary("warden"));
    cmd.arg("--state-dir")
        .arg(d.dir.path())
        .arg("send")
        .arg(text);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("warden send starts");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(answer) = stdin {
        input
            .write_all(answer.as_bytes())
            .await
            .expect("answer written");
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("warden send finishes within 60 s")
        .expect("warden send output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn warden_send_shows_the_decision_and_exits_by_the_final_state() {
    let d = Deployment::up(Options::default()).await;
    // `warden up` records where the gateway listens; the harness starts the daemons the same way
    // but leaves that file to us.
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();

    let (code, out) = send(&d, "write hello.txt").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("I'll write hello.txt."), "{out}");
    assert!(
        out.contains("[tool] tool call pending: Write hello.txt (edit)"),
        "{out}"
    );
    assert!(
        out.contains("[policy] ALLOW Write hello.txt (edit): "),
        "{out}"
    );
    assert!(out.contains("[COMPLETED]"), "{out}");

    let (code, out) = send(&d, "write /etc/warden-cli-denied.txt").await;
    assert!(
        out.contains("[policy] DENY Write /etc/warden-cli-denied.txt (edit): "),
        "{out}"
    );
    assert!(
        out.contains("refused by policy: Write /etc/warden-cli-denied.txt"),
        "{out}"
    );
    // The task completes, but not cleanly: a refused permission has its own exit status.
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("[COMPLETED]"), "{out}");

    let crash = r#"{"steps": [{"type": "message", "text": "going down"}, {"type": "crash"}]}"#;
    let (code, out) = send(&d, crash).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAILED]"), "{out}");

    let question = r#"{"steps": [{"type": "question", "message": "Which name?"}, {"type": "stop", "reason": "end_turn"}]}"#;
    let (code, out) = send(&d, question).await;
    assert_eq!(code, 3, "no answer on stdin: {out}");
    assert!(out.contains("[question] Which name?"), "{out}");

    // With an answer on stdin the same task resumes (streamed again) and completes.
    let (code, out) = send_with_stdin(&d, question, Some("notes.txt\n")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[COMPLETED]"), "{out}");

    std::fs::remove_file(d.layout.url_file()).unwrap();
    let (code, out) = send(&d, "write hello.txt").await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("warden up"), "{out}");
}
