//! Callers signing in with OpenID Connect (issue 42), against a real OpenID provider the test
//! starts: `tests/oidc/provider.py`, Authlib's OAuth 2.0 authorization server (client_credentials,
//! RFC 9068 JWT access tokens) over HTTPS with a CA this test makes with openssl; the gateway
//! trusts that CA for the issuer (`auth.oidc[].ca_file`) and finds the keys by discovery.
//!
//! A caller gets its token from the provider (Authlib's OAuth client) and runs a task with the
//! official A2A Python SDK as `ISSUER#ci-bot` (the audit says so); a group rule limits the
//! `interns` group to one agent on JSON-RPC, HTTP+JSON, gRPC and MCP; the card declares the
//! `openIdConnect` scheme; each bad token (expired, not yet valid, wrong audience, unknown key,
//! `none`, HS256 with the public key, too large, an issuer's JWKS turned to garbage) is a 401
//! in each front's shape with its reason, counted in the gateway's metrics by reason; the
//! static token keeps working.
//!
//! Authlib and Flask come from `.ci/requirements.txt`; without them the test fails in CI and
//! says it skipped elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::metadata::MetadataValue;
use warden_e2e::{Deployment, Options, binary, free_port, run_with_deadline};
use warden_proto::a2a::v1 as pb;

fn here() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/oidc"))
}

fn python_ready() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import authlib, flask, joserfc, a2a.client, httpx"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a certificate it signed for 127.0.0.1 (the provider's).
fn make_pki(dir: &Path) {
    let days = ["-days", "2"];
    openssl(
        dir,
        &[
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=warden-e2e OIDC CA",
            ][..],
            &days,
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "idp.key",
            "-out",
            "idp.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            &[
                "x509",
                "-req",
                "-in",
                "idp.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "idp.pem",
                "-extfile",
                "ext",
            ][..],
            &days,
        ]
        .concat(),
    );
}

/// The provider, running until dropped; its issuer URL.
async fn provider(dir: &Path) -> (tokio::process::Child, String) {
    let port = free_port();
    let mut child = tokio::process::Command::new("python3")
        .arg(here().join("provider.py"))
        .arg(port.to_string())
        .arg(dir.join("idp.pem"))
        .arg(dir.join("idp.key"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("provider.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 provider.py");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the provider starts")
        .unwrap()
        .unwrap_or_default();
    let issuer = ready
        .strip_prefix("ready ")
        .unwrap_or_else(|| {
            panic!(
                "provider: {ready:?}\n{}",
                std::fs::read_to_string(dir.join("provider.log")).unwrap_or_default()
            )
        })
        .to_string();
    (child, issuer)
}

async fn caller(args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(here().join("caller.py")).args(args);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
        .await
        .expect("caller.py runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "caller.py {args:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A JSON-RPC call; the HTTP status, the `WWW-Authenticate` header and the answer.
async fn rpc(d: &Deployment, token: &str, method: &str, params: Value) -> (u16, String, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        token,
        Some(&body),
    )
    .await
    .unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (
        status,
        challenge,
        warden_cli::client::read_answer(resp).await.unwrap().0,
    )
}

async fn rest(d: &Deployment, token: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let method = if body.is_some() {
        http::Method::POST
    } else {
        http::Method::GET
    };
    let resp = warden_cli::client::request(&d.http, method, path, token, body)
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (
        status,
        warden_cli::client::read_answer(resp).await.unwrap().0,
    )
}

/// A stateless MCP (2026-07-28) tools/call: the HTTP status and the body.
async fn mcp(d: &Deployment, token: &str, tool: &str, args: Value) -> (u16, String) {
    let era = "2026-07-28";
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": era,
                  "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                  "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let req = format!(
        "POST /mcp HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {era}\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        d.http,
        body.len()
    );
    let mut sock = tokio::net::TcpStream::connect(&d.http).await.unwrap();
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(90), sock.read_to_end(&mut buf))
        .await
        .expect("MCP answers")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

async fn grpc_send(
    grpc: &str,
    token: &str,
    agent: Option<&str>,
) -> Result<pb::SendMessageResponse, tonic::Status> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = pb::a2a_service_client::A2aServiceClient::new(ch);
    let mut message = pb::Message {
        message_id: format!("grpc-{}", uuid_ish()),
        role: pb::Role::User as i32,
        parts: vec![pb::Part {
            content: Some(pb::part::Content::Text("write grpc.txt".into())),
            ..Default::default()
        }],
        ..Default::default()
    };
    if let Some(a) = agent {
        message.metadata = Some(prost_types::Struct {
            fields: [(
                "agent".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(a.into())),
                },
            )]
            .into(),
        });
    }
    let mut req = tonic::Request::new(pb::SendMessageRequest {
        message: Some(message),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    c.send_message(req).await.map(|r| r.into_inner())
}

fn uuid_ish() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[tokio::test]
async fn oidc_callers_run_tasks_as_issuer_principals_groups_limit_agents_and_bad_tokens_are_refused()
 {
    if let Err(why) = python_ready() {
        if std::env::var_os("CI").is_some() {
            panic!("Authlib/Flask/a2a-sdk missing in CI: {why}");
        }
        eprintln!("SKIPPED oidc: {why}");
        return;
    }
    let pki = tempfile::tempdir().unwrap();
    make_pki(pki.path());
    let ca = pki.path().join("ca.pem");
    let ca_s = ca.to_string_lossy().to_string();
    let (_idp, issuer) = provider(pki.path()).await;

    let grpc = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let d = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                format!(
                    r#"auth.oidc=[{{issuer="{issuer}", audiences=["warden"], groups_claim="groups", ca_file="{ca_s}", algorithms=["RS256"]}}]"#
                ),
            ),
            (
                "gateway".into(),
                format!(r#"agents.access=[{{group="{issuer}#interns", agents=["claude"]}}]"#),
            ),
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
            (
                "gateway".into(),
                format!("daemon.metrics_listen=\"127.0.0.1:{metrics_port}\""),
            ),
            (
                "supervisor".into(),
                format!(
                    "agents.claude.command={:?}",
                    binary("warden-scripted-agent").display().to_string()
                ),
            ),
        ],
        ..Options::default()
    })
    .await;
    let base = format!("http://{}", d.http);

    // The card declares how to sign in: the static bearer token, and the issuer by discovery.
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
        .await
        .unwrap();
    let oidc = &card["securitySchemes"]["oidc1"];
    assert_eq!(
        oidc["openIdConnectSecurityScheme"]["openIdConnectUrl"],
        format!("{issuer}/.well-known/openid-configuration"),
        "{card}"
    );
    assert!(card["securitySchemes"]["bearer"].is_object(), "{card}");
    let meta =
        warden_cli::client::get_json(&d.http, "/.well-known/oauth-protected-resource/mcp", "")
            .await
            .unwrap();
    assert_eq!(meta["authorization_servers"], json!([issuer]), "{meta}");
    let reqs = card["securityRequirements"].to_string();
    assert!(reqs.contains("oidc1") && reqs.contains("bearer"), "{card}");

    // ci-bot (group builders, no rule): a token from the provider, a task with the A2A SDK.
    let out = caller(&[
        "send",
        &base,
        &issuer,
        &ca_s,
        "ci-bot",
        "ci-bot-secret",
        "JSONRPC",
    ])
    .await;
    let bot_token = out
        .lines()
        .find_map(|l| l.strip_prefix("token "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    let done = out.lines().last().unwrap_or("");
    assert!(done.starts_with("TASK_STATE_COMPLETED "), "{out}");
    assert!(done.contains("oidc.txt"), "{out}");
    let context = done.split_whitespace().nth(1).unwrap().to_string();
    // The policy judged the task's action as the issuer-prefixed principal.
    let state = d.dir.path().to_string_lossy().to_string();
    let audit = Command::new(binary("warden"))
        .args([
            "--state-dir",
            &state,
            "audit",
            "tail",
            "--context",
            &context,
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let recs: Value = serde_json::from_slice(&audit.stdout).unwrap_or(Value::Null);
    let id = recs[0]["decisionId"]
        .as_str()
        .unwrap_or_else(|| panic!("audit: {recs}"))
        .to_string();
    let show = Command::new(binary("warden"))
        .args(["--state-dir", &state, "audit", "show", &id, "--json"])
        .output()
        .unwrap();
    let show: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        show["subject"]["principal"],
        format!("{issuer}#ci-bot"),
        "{show}"
    );
    // …vouched for by the issuer, with the groups its token carried.
    assert_eq!(show["subject"]["issuer"], issuer, "{show}");
    assert_eq!(
        show["subject"]["groups"],
        json!([format!("{issuer}#builders")]),
        "{show}"
    );
    // The task is ci-bot's: listed for its token, not for the static token's principal.
    let (_, _, mine) = rpc(&d, &bot_token, "ListTasks", json!({"contextId": context})).await;
    assert_eq!(mine["result"]["totalSize"], 1, "{mine}");
    let (_, _, theirs) = rpc(&d, &d.token(), "ListTasks", json!({"contextId": context})).await;
    assert_eq!(theirs["result"]["totalSize"], 0, "{theirs}");

    // intern (group interns): only claude, on every front.
    let out = caller(&[
        "send",
        &base,
        &issuer,
        &ca_s,
        "intern",
        "intern-secret",
        "JSONRPC",
    ])
    .await;
    assert!(
        out.contains("refused") && out.contains("not available to you; yours: claude"),
        "{out}"
    );
    let out = caller(&[
        "send",
        &base,
        &issuer,
        &ca_s,
        "intern",
        "intern-secret",
        "HTTP+JSON",
        "claude",
    ])
    .await;
    assert!(
        out.lines()
            .last()
            .unwrap_or("")
            .starts_with("TASK_STATE_COMPLETED"),
        "{out}"
    );
    let intern = caller(&["token", &issuer, &ca_s, "intern", "intern-secret"])
        .await
        .trim()
        .to_string();
    let msg = |meta: Value| json!({"message": {"messageId": format!("m-{}", uuid_ish()), "role": "ROLE_USER", "parts": [{"text": "hi"}], "metadata": meta}});
    let (_, _, r) = rpc(
        &d,
        &intern,
        "SendMessage",
        msg(json!({"agent": "scripted"})),
    )
    .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("yours: claude"),
        "{r}"
    );
    let (status, r) = rest(&d, &intern, "/a2a/rest/message:send", Some(&msg(json!({})))).await;
    assert_eq!(status, 400, "{r}");
    assert!(r.to_string().contains("yours: claude"), "{r}");
    let (_, r) = rest(&d, &intern, "/a2a/rest/extendedAgentCard", None).await;
    let skills: Vec<&str> = r["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(skills, ["claude"], "{r}");
    let e = grpc_send(&grpc, &intern, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("yours: claude"), "{e:?}");
    let ok = grpc_send(&grpc, &bot_token, None)
        .await
        .expect("ci-bot on gRPC");
    assert!(ok.payload.is_some(), "{ok:?}");
    let (status, text) = mcp(&d, &intern, "status", json!({})).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(&format!("{issuer}#intern")), "{text}");
    assert!(
        text.contains(r#"\"agents\":[\"claude\"]"#) || text.contains(r#""agents":["claude"]"#),
        "{text}"
    );
    let (status, text) = mcp(&d, &intern, "advise", json!({"task": "hello"})).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("yours: claude"), "{text}");

    // Bad tokens: each a 401 with its reason.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mint = |body: Value| {
        let issuer = issuer.clone();
        let ca_s = ca_s.clone();
        async move {
            caller(&["mint", &issuer, &ca_s, &body.to_string()])
                .await
                .trim()
                .to_string()
        }
    };

    // One subject, two tokens with different groups: each request gets its own token's access,
    // not the other's and not the union, whichever came last (the identity travels with the
    // request; no table of a principal's groups).
    let as_intern = mint(json!({"claims": {"sub": "shared", "groups": ["interns"]}})).await;
    let as_builder = mint(json!({"claims": {"sub": "shared", "groups": ["builders"]}})).await;
    let skills_of = |card: &Value| -> Vec<String> {
        card["skills"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let scripted = || {
        let mut m = msg(json!({"agent": "scripted"}));
        m["configuration"] = json!({"returnImmediately": true});
        m
    };
    // Sequentially, then interleaved: the requests of both tokens at once, so a check that
    // read the subject's groups from anywhere but its own request would see the other's.
    for round in 0..2 {
        let (_, r) = rest(&d, &as_builder, "/a2a/rest/extendedAgentCard", None).await;
        assert!(
            skills_of(&r).contains(&"scripted".to_string()),
            "round {round}: {r}"
        );
        let (_, r) = rest(&d, &as_intern, "/a2a/rest/extendedAgentCard", None).await;
        assert_eq!(skills_of(&r), ["claude"], "round {round}: {r}");
        let (_, _, r) = rpc(&d, &as_builder, "SendMessage", scripted()).await;
        assert!(r["result"]["task"]["id"].is_string(), "round {round}: {r}");
        let (_, _, r) = rpc(&d, &as_intern, "SendMessage", scripted()).await;
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("yours: claude"),
            "round {round}: {r}"
        );
        let (status, text) = mcp(&d, &as_intern, "status", json!({})).await;
        assert_eq!(status, 200, "{text}");
        assert!(
            text.contains(r#"\"agents\":[\"claude\"]"#) || text.contains(r#""agents":["claude"]"#),
            "round {round}: {text}"
        );
        let e = grpc_send(&grpc, &as_intern, Some("scripted"))
            .await
            .unwrap_err();
        assert!(e.message().contains("yours: claude"), "{e:?}");
    }
    let at_once = (0..12).map(|i| {
        let token = if i % 2 == 0 { &as_builder } else { &as_intern };
        let d = &d;
        async move { (i % 2 == 0, rpc(d, token, "SendMessage", scripted()).await.2) }
    });
    for (builder, r) in futures::future::join_all(at_once).await {
        if builder {
            assert!(r["result"]["task"]["id"].is_string(), "builder: {r}");
        } else {
            assert!(
                r["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("yours: claude"),
                "intern: {r}"
            );
        }
    }
    let cases = [
        (
            "expired",
            mint(json!({"claims": {"exp": now - 600}})).await,
            "expired",
        ),
        (
            "not_yet_valid",
            mint(json!({"claims": {"nbf": now + 600}})).await,
            "not valid yet",
        ),
        (
            "audience",
            mint(json!({"claims": {"aud": "someone-else"}})).await,
            "audience",
        ),
        (
            "unknown_key",
            mint(json!({"key": "rogue"})).await,
            "signing key",
        ),
        ("algorithm", mint(json!({"alg": "none"})).await, "algorithm"),
        (
            "algorithm",
            mint(json!({"alg": "HS256"})).await,
            "algorithm",
        ),
        (
            "too_large",
            format!("{}.{}.x", "a".repeat(6000), "b".repeat(6000)),
            "larger",
        ),        (
            "claims",
            mint(json!({"claims": {"groups": {"admins": true}}})).await,
            "wrong type",
        ),
        (
            "claims",
            mint(json!({"claims": {"groups": (0..300).map(|i| format!("g{i}")).collect::<Vec<_>>()}})).await,
            "wrong type",
        ),
    ];
    for (reason, token, said) in &cases {
        let (status, challenge, body) = rpc(&d, token, "ListTasks", json!({})).await;
        assert_eq!(status, 401, "{reason}: {body}");
        assert!(challenge.contains("invalid_token"), "{reason}: {challenge}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(said),
            "{reason}: {body}"
        );
    }
    // The same refusal in the other fronts' shapes.
    let expired = &cases[0].1;
    let (status, body) = rest(&d, expired, "/a2a/rest/tasks", None).await;
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    let e = grpc_send(&grpc, expired, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("expired"), "{e:?}");
    let (status, text) = mcp(&d, expired, "status", json!({})).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("expired"), "{text}");

    // The JWKS endpoint turns to garbage: the cached key keeps working, an unknown one is
    // refused (fail closed).
    caller(&["jwks", &issuer, &ca_s, "garbage"]).await;
    let (status, _, body) = rpc(&d, &bot_token, "ListTasks", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = rpc(&d, &cases[3].1, "ListTasks", json!({})).await;
    assert_eq!(status, 401, "{body}");

    // The static token works as before.
    let (status, _, body) = rpc(&d, &d.token(), "ListTasks", json!({})).await;
    assert_eq!(status, 200, "{body}");

    // Counted by reason.
    let resp = warden_cli::client::request(
        &format!("127.0.0.1:{metrics_port}"),
        http::Method::GET,
        "/metrics",
        "",
        None,
    )
    .await
    .unwrap();
    let text = warden_cli::client::read_answer(resp).await.unwrap().1;
    for reason in [
        "expired",
        "not_yet_valid",
        "audience",
        "unknown_key",
        "algorithm",
        "too_large",
        "claims",
    ] {
        let line = format!("warden_gateway_auth_refused_total{{reason=\"{reason}\"}}");
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line}:\n{text}"));
        assert!(n >= 1, "{line} {n}");
    }
}
