//! `warden send` against the three real daemons: the live view shows the agent's text, the tool
//! call and the policy's verdict with its reason, and the exit status follows the final state.

use std::time::Duration;

use warden_e2e::{Deployment, Options, binary, run_with_deadline};

async fn send(d: &Deployment, text: &str) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(binary("warden"));
    cmd.arg("--state-dir")
        .arg(d.dir.path())
        .arg("send")
        .arg(text);
    cmd.stdin(std::process::Stdio::null());
    let out = run_with_deadline(&mut cmd, Duration::from_secs(60))
        .await
        .expect("warden send runs");
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
    assert!(code == 0 || code == 1, "{out}");

    let crash = r#"{"steps": [{"type": "message", "text": "going down"}, {"type": "crash"}]}"#;
    let (code, out) = send(&d, crash).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAILED]"), "{out}");

    let question = r#"{"steps": [{"type": "question", "message": "Which name?"}, {"type": "stop", "reason": "end_turn"}]}"#;
    let (code, out) = send(&d, question).await;
    assert_eq!(code, 3, "no answer on stdin: {out}");
    assert!(out.contains("[question] Which name?"), "{out}");

    std::fs::remove_file(d.layout.url_file()).unwrap();
    let (code, out) = send(&d, "write hello.txt").await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("warden up"), "{out}");
}
