//! warden-approver's web page in a real headless browser: Debian's Chromium driven by Playwright
//! for Python (`tests/web/approver_page.py`; installed by `.ci/run`). The script logs in with
//! the operator token, sees the request arrive live, reads its diff and approves with the keyboard;
//! this side checks that the task then completes with the write in place. Screenshots are saved
//! under `<target>/artifacts/approver-web/`.

mod supervisor_support;

use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use warden_e2e::{Deployment, Options, free_port, test_root};
use warden_proto::v1 as pb;

#[tokio::test]
async fn an_operator_approves_a_live_request_on_the_web_page_with_the_keyboard() {
    let http = format!("127.0.0.1:{}", free_port());
    let opts = Options {
        sets: vec![("policy".into(), r#"policy.global.escalate=["edit"]"#.into())],
        approver: true,
        approver_http: http.clone(),
        ..Default::default()
    };
    let mut d = Deployment::new_in(&parent(), opts);
    // As `warden up --approver` writes it: `operator <token>`, mode 0600.
    let token_file = d.layout.operator_token_file();
    std::fs::write(&token_file, "operator 0123456789abcdef0123456789abcdef\n")
        .unwrap_or_else(|e| panic!("token file: {e}"));
    for n in ["policy", "approver", "supervisor"] {
        d.start(n).await;
    }
    let artifacts = test_root()
        .parent()
        .map(|t| t.join("artifacts/approver-web"))
        .unwrap_or_else(|| "target/artifacts/approver-web".into());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web/approver_page.py");
    let mut browser = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(format!("http://{http}/"))
        .arg(&token_file)
        .arg(&artifacts)
        .arg("hello from the browser test")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    let mut out =
        BufReader::new(browser.stdout.take().unwrap_or_else(|| panic!("no stdout"))).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), out.next_line())
        .await
        .unwrap_or_else(|_| panic!("the page script did not log in within 60 s"));
    assert_eq!(
        ready.ok().flatten().as_deref(),
        Some("READY"),
        "the page script failed before logging in (stderr above)"
    );

    // Only now does the request exist: the page must show it live.
    let mut c = client(&d);
    let text = scenario(json!({"vocabulary": "claude-0.101", "steps": [
        {"type": "tool", "kind": "edit", "path": "page.txt",
         "content": "hello from the browser test\n", "ask": true},
        {"type": "message", "text": "done"}]}));
    let mut s = start(&mut c, turn("web1", "t1", &text)).await;
    let evs = collect(&mut s, Duration::from_secs(90)).await;
    let status = tokio::time::timeout(Duration::from_secs(60), browser.wait())
        .await
        .unwrap_or_else(|_| panic!("the page script did not finish"))
        .unwrap_or_else(|e| panic!("page script: {e}"));
    assert!(status.success(), "the page script failed: {status}");
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "{perms:#?}");
    assert_eq!(perms[0].verdict, pb::Verdict::Allow as i32, "{perms:#?}");
    assert!(perms[0].reason.contains("web:operator"), "{perms:#?}");
    assert_eq!(stop(&evs).stop_reason, "end_turn");
    let root = evs
        .iter()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::Started(s)) => Some(std::path::PathBuf::from(&s.root)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Started event"));
    assert_eq!(
        std::fs::read_to_string(root.join("page.txt")).unwrap_or_default(),
        "hello from the browser test\n"
    );
    for shot in [
        "1-logged-in.png",
        "2-request.png",
        "3-approved.png",
        "approver-page.png",
    ] {
        assert!(artifacts.join(shot).is_file(), "screenshot {shot} missing");
    }
}
