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
    let (d, token_file) = operator_deployment(&http).await;
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
    let mut api = approvals(&d);
    let mut pending_now = async |n: usize| {
        let t0 = std::time::Instant::now();
        loop {
            let got = held(&mut api).await;
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
    let mut other = approvals(&d);
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

/// Policy (escalating edits), approver with its page on `http` and supervisor, and the token
/// file as `warden up --approver` writes it (`operator <token>`, mode 0600).
async fn operator_deployment(http: &str) -> (Deployment, std::path::PathBuf) {
    let opts = Options {
        sets: vec![("policy".into(), r#"policy.global.escalate=["edit"]"#.into())],
        approver: true,
        approver_http: http.to_string(),
        ..Default::default()
    };
    let mut d = Deployment::new_in(&parent(), opts);
    let token_file = d.layout.operator_token_file();
    std::fs::write(&token_file, "operator 0123456789abcdef0123456789abcdef\n")
        .unwrap_or_else(|e| panic!("token file: {e}"));
    for n in ["policy", "approver", "supervisor"] {
        d.start(n).await;
    }
    (d, token_file)
}

/// The approver's admin API, as an operator on its socket.
fn approvals(d: &Deployment) -> ApprovalServiceClient<tonic::transport::Channel> {
    ApprovalServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.approver_admin_socket(),
    ))
}

/// A write of `path` by the scripted agent, in a turn of conversation `ctx`, held for a person:
/// the client, the turn's stream, the approver's admin API and the held request's id.
async fn held_write(
    d: &Deployment,
    ctx: &str,
    path: &str,
) -> (
    Client,
    tonic::Streaming<pb::TurnEvent>,
    ApprovalServiceClient<tonic::transport::Channel>,
    String,
) {
    let mut c = client(d);
    let text = scenario(json!({"vocabulary": "claude-0.101", "steps": [
        {"type": "tool", "kind": "edit", "path": path, "content": "x", "ask": true},
        {"type": "message", "text": "done"}]}));
    let s = start(&mut c, turn(ctx, "t1", &text)).await;
    let mut api = approvals(d);
    let id = first_pending(&mut api).await;
    (c, s, api, id)
}

/// The requests held for a person right now.
async fn held(api: &mut ApprovalServiceClient<tonic::transport::Channel>) -> Vec<pb::Approval> {
    api.list(pb::ListApprovalsRequest { limit: 0 })
        .await
        .unwrap_or_else(|e| panic!("List: {e}"))
        .into_inner()
        .approvals
}

/// The id of the first request held for a person, waiting up to 15 s for one.
async fn first_pending(api: &mut ApprovalServiceClient<tonic::transport::Channel>) -> String {
    let t0 = std::time::Instant::now();
    loop {
        let got = held(api).await;
        if let Some(a) = got.first() {
            return a.id.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "nothing pending");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `Authorization` value of the session a login answered.
fn bearer_of(login_body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(login_body)
        .unwrap_or_else(|e| panic!("login answer {login_body}: {e}"));
    let s = v["session"].as_str().unwrap_or_default();
    assert!(s.len() >= 32, "a session secret: {login_body}");
    format!("Bearer {s}")
}

/// One HTTP/1.1 request to the page's address: (status, Set-Cookie value, body).
/// `GET /api/pending` with `authorization` (a bearer token or a session): status, headers, body.
async fn pending_as(addr: &str, authorization: &str) -> (u16, String, String) {
    http(
        addr,
        "GET",
        "/api/pending",
        &[("authorization", authorization)],
        "",
    )
    .await
}

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
        "{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    // The address itself unless the test names another Host.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("host: {addr}\r\n"));
    }
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
    let (code, cookie, body) = login("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").await;
    assert_eq!(code, 200);
    assert!(
        cookie.is_empty(),
        "no cookie: it would travel to every port of the host"
    );
    let alice = bearer_of(&body);
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
    let (_c, mut s, _api, id) = held_write(&d, "webx", "x.txt").await;
    let answer = |id: String, auth: String, header: bool| {
        let addr = http_addr.clone();
        async move {
            let mut h = vec![("authorization", auth.as_str())];
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
    let (code, _, _) = answer(id.clone(), "Bearer forged".into(), true).await;
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
        &[("authorization", alice.as_str()), ("x-warden", "1")],
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
    let (code, _, _) = pending_as(&http_addr, &alice).await;
    assert_eq!(code, 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, _, body) = pending_as(&http_addr, &alice).await;
    assert_eq!(code, 401, "an expired session: {body}");
    let (code, _, _) = answer(id, alice, true).await;
    assert_eq!(code, 401);
    // Still serving: a fresh login works.
    let (code, _, _) = login("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").await;
    assert_eq!(code, 200);
}

/// A server on another loopback port, run by another local user (`nobody`), that writes each
/// request's head to a file: what a browser sends to a neighbour on the same host.
struct Neighbour {
    child: tokio::process::Child,
    heads: std::path::PathBuf,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Neighbour {
    async fn start() -> Neighbour {
        let dir = tempfile::tempdir_in(parent()).unwrap_or_else(|e| panic!("tempdir: {e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("chmod: {e}"));
        let heads = dir.path().join("heads.txt");
        let addr = format!("127.0.0.1:{}", free_port());
        let port = addr.rsplit(':').next().unwrap_or_default().to_string();
        let server = format!(
            "import http.server\n\
             class H(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       open({heads:?}, 'a').write(self.requestline + '\\n' + str(self.headers) + '\\n')\n\
             \x20       self.send_response(200); self.send_header('content-type', 'text/html'); self.end_headers()\n\
             \x20       self.wfile.write(b'<html><body>neighbour</body></html>')\n\
             \x20   def log_message(self, *a): pass\n\
             http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n",
            heads = heads.to_string_lossy()
        );
        let child = tokio::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                // Debian's interpreter: a pyenv shim under /root is closed to another uid.
                "/usr/bin/python3",
                "-c",
            ])
            .arg(server)
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("setpriv python3: {e}"));
        let mut child = child;
        let t0 = std::time::Instant::now();
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err).await;
                }
                panic!("the neighbour exited: {status}: {err}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the neighbour does not listen"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Neighbour {
            child,
            heads,
            addr,
            _dir: dir,
        }
    }
}

/// Issue 31, case 3, the hostile way: the operator logs in on the approver's page in Chromium,
/// then opens a page on another loopback port served by another local uid. Before, the browser
/// sent the `warden_session` cookie there (cookies are not port-scoped) and the neighbour
/// replayed it to approve a held write as `web:operator`. Now nothing of the session reaches the
/// neighbour, and whatever it replays is refused; the write stays held.
#[tokio::test]
async fn the_approvers_session_does_not_travel_to_another_port_of_the_host() {
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        println!("SKIP: not root; cannot run the neighbour as another uid");
        return;
    }
    let http_addr = format!("127.0.0.1:{}", free_port());
    let (d, token_file) = operator_deployment(&http_addr).await;
    // alice's write, held for a person.
    let (_c, mut s, mut api, id) = held_write(&d, "leak1", "held.txt").await;

    let mut neighbour = Neighbour::start().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web/approver_session_leak.py");
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("python3")
            .arg(&script)
            .arg(format!("http://{http_addr}/"))
            .arg(&token_file)
            .arg(format!("http://{}/", neighbour.addr))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the browser script did not finish in 90 s"))
    .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && said.contains("VISITED"),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = said
        .lines()
        .find_map(|l| l.strip_prefix("SESSION "))
        .unwrap_or_default()
        .to_string();
    let _ = neighbour.child.start_kill();
    let heads = std::fs::read_to_string(&neighbour.heads).unwrap_or_default();
    assert!(
        heads.contains("GET / "),
        "the neighbour was visited: {heads}"
    );
    assert!(
        !heads.to_ascii_lowercase().contains("cookie:"),
        "a cookie reached the neighbour: {heads}"
    );
    assert!(secret.len() >= 32, "the page holds a session: {said}");
    assert!(
        !heads.contains(&secret),
        "the session reached the neighbour: {heads}"
    );

    // Whatever the neighbour saw, replayed with the header a page would add, approves nothing.
    let mut replay: Vec<(String, String)> = heads
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            k == "cookie" || k == "authorization"
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    replay.push(("x-warden".into(), "1".into()));
    let headers: Vec<(&str, &str)> = replay
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (code, _, body) = http(
        &http_addr,
        "POST",
        "/api/answer",
        &headers,
        &format!(r#"{{"id":"{id}","verdict":"approve"}}"#),
    )
    .await;
    assert_eq!(code, 401, "{body}");
    let a = api
        .get(pb::GetApprovalRequest { id: id.clone() })
        .await
        .unwrap_or_else(|e| panic!("Get: {e}"))
        .into_inner();
    assert_eq!(a.state(), pb::ApprovalState::Pending, "still held: {a:?}");

    // The page's own session, sent from the neighbour's origin, is refused too.
    let bearer = format!("Bearer {secret}");
    let origin = format!("http://{}", neighbour.addr);
    let (code, _, body) = http(
        &http_addr,
        "POST",
        "/api/answer",
        &[
            ("authorization", bearer.as_str()),
            ("x-warden", "1"),
            ("origin", origin.as_str()),
        ],
        &format!(r#"{{"id":"{id}","verdict":"approve"}}"#),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    // And the page's answer, with its own session, is taken.
    let (code, _, body) = http(
        &http_addr,
        "POST",
        "/api/answer",
        &[("authorization", bearer.as_str()), ("x-warden", "1")],
        &format!(r#"{{"id":"{id}","verdict":"approve"}}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let evs = collect(&mut s, Duration::from_secs(30)).await;
    assert_eq!(permissions(&evs)[0].verdict, pb::Verdict::Allow as i32);
}

/// The session answers only under the Host it was issued for, a request naming another Host
/// (a rebound DNS name) is refused, failed logins are limited per minute, and a session
/// survives the approver's restart until it expires.
#[tokio::test]
async fn sessions_are_bound_to_the_host_limited_on_failure_and_survive_a_restart() {
    let http_addr = format!("127.0.0.1:{}", free_port());
    let port = http_addr.rsplit(':').next().unwrap_or_default().to_string();
    let opts = Options {
        sets: vec![("approver".into(), "web.login_failures_per_minute=3".into())],
        approver: true,
        approver_http: http_addr.clone(),
        ..Default::default()
    };
    let mut d = Deployment::new_in(&parent(), opts);
    let token_file = d.layout.operator_token_file();
    std::fs::write(&token_file, "operator 0123456789abcdef0123456789abcdef\n")
        .unwrap_or_else(|e| panic!("token file: {e}"));
    for n in ["policy", "approver"] {
        d.start(n).await;
    }
    let token = r#"{"token":"0123456789abcdef0123456789abcdef"}"#;
    let (code, _, body) = http(&http_addr, "POST", "/login", &[("x-warden", "1")], token).await;
    assert_eq!(code, 200, "{body}");
    let auth = bearer_of(&body);

    // Another Host name for the same address: refused, page and API alike.
    let rebound = [("host", "attacker.example:80")];
    let (code, _, _) = http(&http_addr, "GET", "/", &rebound, "").await;
    assert_eq!(code, 421);
    let (code, _, _) = http(
        &http_addr,
        "GET",
        "/api/pending",
        &[
            ("host", "attacker.example:80"),
            ("authorization", auth.as_str()),
        ],
        "",
    )
    .await;
    assert_eq!(code, 421);
    // `localhost:PORT` is the same page, but not the Host this session was issued for.
    let localhost = format!("localhost:{port}");
    let (code, _, _) = http(
        &http_addr,
        "GET",
        "/api/pending",
        &[
            ("host", localhost.as_str()),
            ("authorization", auth.as_str()),
        ],
        "",
    )
    .await;
    assert_eq!(code, 401, "a session answers under its own Host only");
    let (code, _, _) = pending_as(&http_addr, &auth).await;
    assert_eq!(code, 200);

    // Failed logins: three a minute, then 429 even for the right token.
    for _ in 0..3 {
        let (code, _, _) = http(
            &http_addr,
            "POST",
            "/login",
            &[("x-warden", "1")],
            r#"{"token":"wrong"}"#,
        )
        .await;
        assert_eq!(code, 401);
    }
    let (code, _, body) = http(&http_addr, "POST", "/login", &[("x-warden", "1")], token).await;
    assert_eq!(code, 429, "{body}");

    // The approver restarts: the session it issued still answers (stored with its expiry).
    let approver = d.take("approver").unwrap_or_else(|| panic!("no approver"));
    approver.terminate().await;
    d.start("approver").await;
    let (code, _, body) = pending_as(&http_addr, &auth).await;
    assert_eq!(code, 200, "{body}");
    // Logout ends it.
    let (code, _, _) = http(
        &http_addr,
        "POST",
        "/logout",
        &[("authorization", auth.as_str()), ("x-warden", "1")],
        "",
    )
    .await;
    assert_eq!(code, 200);
    let (code, _, _) = pending_as(&http_addr, &auth).await;
    assert_eq!(code, 401);
}
