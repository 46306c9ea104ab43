//! warden-approver's web page in a real headless browser: Debian's Chromium driven by Playwright
//! for Python (`tests/web/approver_page.py`; installed by `.ci/run`). The script logs in with
//! the operator token, sees the request arrive live, reads its diff and approves with the keyboard,
//! checks labels, Tab order, contrast and the phone width, and sees a second request answered by
//! another operator; this side checks that the first task then completes with the write in place
//! and the second gets the other operator's refusal. Screenshots are saved under
//! `<target>/artifacts/approver-web/`. Without a browser: logins with a removed token, expired
//! sessions, and answers that are not allowed, over plain HTTP.

mod supervisor_support;

use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use warden_e2e::{Deployment, Options, free_port, test_root};
use warden_proto::v1 as pb;
use warden_proto::v1::approval_service_client::ApprovalServiceClient;

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
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    let mut out =
        BufReader::new(browser.stdout.take().unwrap_or_else(|| panic!("no stdout"))).lines();
    let mut to_script = browser.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let mut expect_word = async |word: &str| {
        let got = tokio::time::timeout(Duration::from_secs(90), out.next_line())
            .await
            .unwrap_or_else(|_| panic!("the page script did not say {word} within 90 s"));
        assert_eq!(
            got.ok().flatten().as_deref(),
            Some(word),
            "the page script failed before {word} (stderr above)"
        );
    };
    expect_word("READY").await;

    // Only now does the request exist: the page must show it live.
    let mut c = client(&d);
    let text = scenario(json!({"vocabulary": "claude-0.101", "steps": [
        {"type": "tool", "kind": "edit", "path": "page.txt",
         "content": "hello from the browser test\n", "ask": true},
        {"type": "message", "text": "done"}]}));
    let mut s = start(&mut c, turn("web1", "t1", &text)).await;
    let evs = collect(&mut s, Duration::from_secs(90)).await;
    expect_word("APPROVED").await;

    // Two more (second.txt, then third.txt); another operator (this test, on the admin socket)
    // answers second.txt first, the page's operator denies third.txt with the keyboard.
    let mut api = ApprovalServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.approver_admin_socket(),
    ));
    let mut pending_now = async |n: usize| {
        let t0 = std::time::Instant::now();
        loop {
            let got = api
                .list(pb::ListApprovalsRequest { limit: 0 })
                .await
                .unwrap_or_else(|e| panic!("List: {e}"))
                .into_inner()
                .approvals;
            if got.len() >= n {
                return got;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{n} not pending");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    let edit_of = |path: &str| {
        scenario(json!({"vocabulary": "claude-0.101", "steps": [
            {"type": "tool", "kind": "edit", "path": path, "content": "x", "ask": true},
            {"type": "message", "text": "done"}]}))
    };
    let mut s2 = start(&mut c, turn("web2", "t1", &edit_of("second.txt"))).await;
    pending_now(1).await;
    let mut s3 = start(&mut c, turn("web3", "t1", &edit_of("third.txt"))).await;
    let both = pending_now(2).await;
    expect_word("SHOWN").await;
    let second_id = both
        .iter()
        .find(|a| {
            a.request
                .as_ref()
                .and_then(|r| r.tool_call.as_ref())
                .is_some_and(|t| t.title.contains("second.txt"))
        })
        .map(|a| a.id.clone())
        .unwrap_or_else(|| panic!("second.txt not pending: {both:#?}"));
    let mut other = ApprovalServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.approver_admin_socket(),
    ));
    other
        .answer(pb::AnswerRequest {
            id: second_id,
            verdict: pb::Verdict::Deny as i32,
            reason: "answered elsewhere".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("Answer: {e}"));
    to_script
        .write_all(b"ANSWERED\n")
        .await
        .unwrap_or_else(|e| panic!("to the page script: {e}"));
    let evs2 = collect(&mut s2, Duration::from_secs(60)).await;
    expect_word("DONE").await;
    let evs3 = collect(&mut s3, Duration::from_secs(60)).await;
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
    let refused = permissions(&evs2);
    assert_eq!(refused[0].verdict, pb::Verdict::Deny as i32, "{refused:#?}");
    assert!(
        refused[0].reason.contains("answered elsewhere"),
        "{refused:#?}"
    );
    let denied = permissions(&evs3);
    assert_eq!(denied[0].verdict, pb::Verdict::Deny as i32, "{denied:#?}");
    assert_eq!(denied[0].rule, "approval.denied");
    assert!(
        denied[0].reason.contains("web:operator")
            && denied[0].reason.contains("typed in the browser"),
        "{denied:#?}"
    );
    for shot in [
        "1-logged-in.png",
        "2-request.png",
        "3-approved.png",
        "4-answered-elsewhere.png",
        "5-denied.png",
        "approver-page.png",
    ] {
        assert!(artifacts.join(shot).is_file(), "screenshot {shot} missing");
    }
}

/// One HTTP/1.1 request to the page's address: (status, Set-Cookie value, body).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    tcp.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} {path}"))
        .unwrap_or_else(|e| panic!("read: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap_or("")
        .to_string();
    (status, cookie, body.to_string())
}

/// Invalid input on the page: a removed (or never issued) token cannot log in, a session past
/// its lifetime is refused, a cross-site form (no `x-warden` header) cannot answer, and unknown,
/// foreign or already answered ids are refused with what happened; the daemon keeps serving.
#[tokio::test]
async fn the_page_refuses_removed_tokens_expired_sessions_and_answers_it_must_not_take() {
    let http_addr = format!("127.0.0.1:{}", free_port());
    let opts = Options {
        sets: vec![
            ("policy".into(), r#"policy.global.escalate=["edit"]"#.into()),
            ("approver".into(), "web.session_ttl_secs=2".into()),
        ],
        approver: true,
        approver_http: http_addr.clone(),
        ..Default::default()
    };
    let mut d = Deployment::new_in(&parent(), opts);
    let token_file = d.layout.operator_token_file();
    std::fs::write(
        &token_file,
        "alice aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nbob bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n",
    )
    .unwrap_or_else(|e| panic!("token file: {e}"));
    for n in ["policy", "approver", "supervisor"] {
        d.start(n).await;
    }
    let login = |token: &'static str| {
        let addr = http_addr.clone();
        async move {
            http(
                &addr,
                "POST",
                "/login",
                &[("x-warden", "1")],
                &format!(r#"{{"token":"{token}"}}"#),
            )
            .await
        }
    };
    let (code, alice, _) = login("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").await;
    assert_eq!(code, 200);
    assert!(alice.starts_with("warden_session="), "{alice}");
    // Without the header a cross-site form could send, no login.
    let (code, _, _) = http(
        &http_addr,
        "POST",
        "/login",
        &[],
        r#"{"token":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}"#,
    )
    .await;
    assert_eq!(code, 403);
    // bob's line is removed: his token no longer logs in (read at every login).
    std::fs::write(&token_file, "alice aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n")
        .unwrap_or_else(|e| panic!("token file: {e}"));
    let (code, _, body) = login("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb").await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("unknown or expired operator token"), "{body}");
    let (code, _, _) = login("").await;
    assert_eq!(code, 401);

    // A real request, held for a person.
    let mut c = client(&d);
    let text = scenario(json!({"vocabulary": "claude-0.101", "steps": [
        {"type": "tool", "kind": "edit", "path": "x.txt", "content": "x", "ask": true},
        {"type": "message", "text": "done"}]}));
    let mut s = start(&mut c, turn("webx", "t1", &text)).await;
    let mut api = ApprovalServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.approver_admin_socket(),
    ));
    let t0 = std::time::Instant::now();
    let id = loop {
        let got = api
            .list(pb::ListApprovalsRequest { limit: 0 })
            .await
            .unwrap_or_else(|e| panic!("List: {e}"))
            .into_inner()
            .approvals;
        if let Some(a) = got.first() {
            break a.id.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "nothing pending");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let answer = |id: String, cookie: String, header: bool| {
        let addr = http_addr.clone();
        async move {
            let mut h = vec![("cookie", cookie.as_str())];
            if header {
                h.push(("x-warden", "1"));
            }
            http(
                &addr,
                "POST",
                "/api/answer",
                &h,
                &format!(r#"{{"id":"{id}","verdict":"approve"}}"#),
            )
            .await
        }
    };
    let (code, _, _) = answer(id.clone(), alice.clone(), false).await;
    assert_eq!(code, 403, "no x-warden header, no answer");
    let (code, _, _) = answer(id.clone(), "warden_session=forged".into(), true).await;
    assert_eq!(code, 401);
    let (code, _, body) = answer("no-such-id".into(), alice.clone(), true).await;
    assert_eq!(code, 404, "{body}");
    // An id of another deployment is unknown here just the same.
    let (code, _, body) = answer(
        "3f2c1b9e-5d4a-4c1b-8e0f-6a7b8c9d0e1f".into(),
        alice.clone(),
        true,
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, _, body) = http(
        &http_addr,
        "POST",
        "/api/answer",
        &[("cookie", alice.as_str()), ("x-warden", "1")],
        &format!(r#"{{"id":"{id}","verdict":"deny","reason":" "}}"#),
    )
    .await;
    assert_eq!(code, 400, "a denial needs a reason: {body}");
    let (code, _, body) = answer(id.clone(), alice.clone(), true).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("web:alice"), "{body}");
    let (code, _, body) = answer(id.clone(), alice.clone(), true).await;
    assert_eq!(code, 409, "a second answer: {body}");
    assert!(
        body.contains("already decided") && body.contains("web:alice"),
        "{body}"
    );
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    assert_eq!(permissions(&evs)[0].verdict, pb::Verdict::Allow as i32);

    // The session ends with its lifetime (2 s here): the cookie is refused afterwards.
    let (code, _, _) = http(
        &http_addr,
        "GET",
        "/api/pending",
        &[("cookie", alice.as_str())],
        "",
    )
    .await;
    assert_eq!(code, 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, _, body) = http(
        &http_addr,
        "GET",
        "/api/pending",
        &[("cookie", alice.as_str())],
        "",
    )
    .await;
    assert_eq!(code, 401, "an expired session: {body}");
    let (code, _, _) = answer(id, alice, true).await;
    assert_eq!(code, 401);
    // Still serving: a fresh login works.
    let (code, _, _) = login("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").await;
    assert_eq!(code, 200);
}
