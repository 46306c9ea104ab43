//! Callers signing in with a client certificate (issue 42): the gateway's listeners speak TLS
//! (`http.tls`) and ask for a certificate of a CA this test makes with `openssl`;
//! `[[auth.certs]]` maps one SPIFFE ID and one subject CN to principals. The official A2A Python
//! SDK presents the certificate (httpx for JSON-RPC and HTTP+JSON, grpcio for gRPC) without a
//! bearer token.
//!
//! A mapped certificate runs tasks as its principal (the audit says so, with its groups and the
//! certificate as its issuer) on all three bindings, with the groups its mapping gives: a group
//! rule limits its agents, and a policy rule for the group (`[groups.builders]`) denies its
//! edits while another caller's are allowed; the card declares the `mtls` scheme. Refused: a certificate of another CA carrying the mapped SPIFFE ID (forged),
//! an expired one, and one valid for a cell (same CA, an unmapped SPIFFE ID) — the first two in
//! the handshake, the last with a 401 naming the reason; that same cell certificate with a
//! static token is the token's caller. With `client_certs = "require"`, a caller without a
//! certificate is refused in the handshake, and plain HTTP is never served.
//!
//! a2a-sdk, httpx and grpcio come from `.ci/requirements.txt`; without them the test fails in CI
//! and says it skipped elsewhere.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use warden_e2e::{Deployment, Options, binary, free_port, run_with_deadline};

#[path = "../../crates/daemon/tests/pki/mod.rs"]
mod pki;

fn python_ready() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import a2a.client, httpx, grpc"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// A leaf `name` signed by `ca` with the extension lines `san` and a validity of `days`
/// (negative: already expired).
fn leaf_with(dir: &Path, ca: &str, name: &str, cn: &str, san: &str, days: &str) {
    pki::openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!(
            "subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        ),
    )
    .unwrap();
    pki::openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            days,
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

const BUILDER: &str = "spiffe://example.org/ci/builder";

fn make_pki(d: &Path) {
    pki::ca(d, "ca");
    pki::ca(d, "other-ca");
    // The gateway's own certificate, for the address callers dial.
    leaf_with(
        d,
        "ca",
        "gateway",
        "gateway",
        &format!("IP:127.0.0.1,URI:{}/gateway", pki::TD),
        "2",
    );
    leaf_with(
        d,
        "ca",
        "builder",
        "builder",
        &format!("URI:{BUILDER}"),
        "2",
    );
    leaf_with(
        d,
        "ca",
        "laptop",
        "laptop-of-frank",
        "URI:spiffe://example.org/people/frank",
        "2",
    );
    // A cell's certificate: the same CA, an identity nobody mapped to a caller.
    pki::leaf(d, "ca", "cell", &format!("{}/supervisor", pki::TD));
    // The builder's SPIFFE ID, forged under another CA; and the builder's, expired.
    leaf_with(
        d,
        "other-ca",
        "forger",
        "builder",
        &format!("URI:{BUILDER}"),
        "2",
    );
    leaf_with(
        d,
        "ca",
        "expired",
        "builder",
        &format!("URI:{BUILDER}"),
        "-1",
    );
}

/// `caller.py send` with the certificate `who` ("" = none); its one line of answer.
async fn send(
    base: &str,
    pki: &Path,
    who: &str,
    binding: &str,
    agent: &str,
    token: &str,
) -> String {
    let (cert, key) = if who.is_empty() {
        (String::new(), String::new())
    } else {
        (
            pki.join(format!("{who}.pem")).display().to_string(),
            pki.join(format!("{who}.key")).display().to_string(),
        )
    };
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/mtls/caller.py"))
        .args(["send", base])
        .arg(pki.join("ca.pem"))
        .args([&cert, &key, binding, agent, token]);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
        .await
        .expect("caller.py runs");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !stdout.is_empty(),
        "caller.py {who} {binding}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn audit_principal(d: &Deployment, context: &str) -> Value {
    let state = d.dir.path().to_string_lossy().to_string();
    let out = Command::new(binary("warden"))
        .args([
            "--state-dir",
            &state,
            "audit",
            "tail",
            "--context",
            context,
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let recs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let id = recs[0]["decisionId"]
        .as_str()
        .unwrap_or_else(|| panic!("audit: {recs}"))
        .to_string();
    let show = Command::new(binary("warden"))
        .args(["--state-dir", &state, "audit", "show", &id, "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&show.stdout).unwrap_or(Value::Null)
}

#[tokio::test]
async fn client_certificates_sign_callers_in_on_every_binding_and_nothing_else_does() {
    if let Err(why) = python_ready() {
        if std::env::var_os("CI").is_some() {
            panic!("a2a-sdk/httpx/grpcio missing in CI: {why}");
        }
        eprintln!("SKIPPED mtls_callers: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    make_pki(p);
    let f = |n: &str| p.join(n).display().to_string();
    let grpc = format!("127.0.0.1:{}", free_port());
    let tls = |mode: &str| {
        format!(
            r#"http.tls={{cert_file="{}", key_file="{}", client_ca_file="{}", client_certs="{mode}"}}"#,
            f("gateway.pem"),
            f("gateway.key"),
            f("ca.pem"),
        )
    };
    let mut d = Deployment::new(Options {
        sets: vec![
            ("gateway".into(), tls("request")),
            (
                "gateway".into(),
                format!(
                    r#"auth.certs=[{{spiffe_id="{BUILDER}", principal="ci-builder", groups=["builders"]}}, {{subject_cn="laptop-of-frank", principal="frank"}}]"#
                ),
            ),
            (
                "gateway".into(),
                r#"agents.access=[{group="builders", agents=["scripted"]}]"#.into(),
            ),
            // A policy rule for the group: its members' edits are denied.
            (
                "policy".into(),
                r#"policy.groups.builders.auto_deny=["edit"]"#.into(),
            ),
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
            (
                "supervisor".into(),
                format!(
                    "agents.claude.command={:?}",
                    binary("warden-scripted-agent").display().to_string()
                ),
            ),
        ],
        ..Options::default()
    });
    let base = format!("https://{}", d.http);
    d.opts
        .sets
        .push(("gateway".into(), format!("http.public_url={base:?}")));
    for name in d.plan().daemons() {
        d.start(name).await;
    }

    // The card declares the mtls scheme beside the bearer one.
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/mtls/caller.py"))
        .args(["card", &base])
        .arg(p.join("ca.pem"));
    let out = run_with_deadline(&mut cmd, Duration::from_secs(60))
        .await
        .unwrap();
    let card: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        card["securitySchemes"]["mtls"]["mtlsSecurityScheme"].is_object(),
        "{card}"
    );
    assert!(card["securitySchemes"]["bearer"].is_object(), "{card}");
    assert!(
        card["securityRequirements"].to_string().contains("mtls"),
        "{card}"
    );

    // The builder's certificate, no token: a task on each binding, as its principal.
    for binding in ["JSONRPC", "HTTP+JSON", "GRPC"] {
        let got = send(&base, p, "builder", binding, "", "").await;
        assert!(got.starts_with("TASK_STATE_COMPLETED "), "{binding}: {got}");
        if binding == "JSONRPC" {
            // The policy judged its edit as ci-builder, of the group builders, vouched for by
            // its certificate; the group's rule decided.
            let context = got.split_whitespace().nth(1).unwrap();
            let show = audit_principal(&d, context);
            assert_eq!(show["subject"]["principal"], "ci-builder", "{show}");
            assert_eq!(
                show["subject"]["groups"],
                serde_json::json!(["builders"]),
                "{show}"
            );
            assert_eq!(
                show["subject"]["issuer"],
                format!("mtls:{BUILDER}"),
                "{show}"
            );
            assert_eq!(show["verdict"], "DENY", "{show}");
            assert_eq!(show["rule"], "tool.autoDeny", "{show}");
        }
    }
    // Its mapping's group limits its agents, on every binding (the SDK's HTTP+JSON client
    // shows only the status of the refusal).
    for (binding, said) in [
        ("JSONRPC", "yours: scripted"),
        ("HTTP+JSON", "400 Bad Request"),
        ("GRPC", "yours: scripted"),
    ] {
        let got = send(&base, p, "builder", binding, "claude", "").await;
        assert!(
            got.starts_with("refused") && got.contains(said),
            "{binding}: {got}"
        );
    }
    // Mapped by its subject CN: frank, without groups, may use claude.
    let got = send(&base, p, "laptop", "JSONRPC", "claude", "").await;
    assert!(got.starts_with("TASK_STATE_COMPLETED "), "{got}");
    let show = audit_principal(&d, got.split_whitespace().nth(1).unwrap());
    assert_eq!(show["subject"]["principal"], "frank", "{show}");
    assert_eq!(
        show["subject"]["issuer"], "mtls:CN=laptop-of-frank",
        "{show}"
    );
    // Not in the group: the same edit is allowed.
    assert_eq!(show["verdict"], "ALLOW", "{show}");

    // MCP, too: the builder's certificate is ci-builder with its group's agents; a cell's is no
    // caller.
    let mcp = |who: &'static str| {
        let mut cmd = tokio::process::Command::new("python3");
        cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/mtls/caller.py"))
            .args(["mcp", &base])
            .arg(p.join("ca.pem"))
            .arg(p.join(format!("{who}.pem")))
            .arg(p.join(format!("{who}.key")))
            .arg("status");
        async move {
            let out = run_with_deadline(&mut cmd, Duration::from_secs(60))
                .await
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let text = mcp("builder").await;
    assert!(text.starts_with("200 "), "{text}");
    assert!(
        text.contains("ci-builder") && text.contains(r#"\"agents\":[\"scripted\"]"#),
        "{text}"
    );
    let text = mcp("cell").await;
    assert!(
        text.starts_with("401 ") && text.contains("names no caller"),
        "{text}"
    );

    // A cell's certificate is no caller; with a static token it is that token's caller.
    let got = send(&base, p, "cell", "JSONRPC", "", "").await;
    assert!(
        got.starts_with("refused") && got.contains("401 Unauthorized"),
        "{got}"
    );
    let got = send(&base, p, "cell", "GRPC", "", "").await;
    assert!(
        got.starts_with("refused") && got.contains("names no caller"),
        "{got}"
    );
    let got = send(&base, p, "cell", "HTTP+JSON", "", &d.token()).await;
    assert!(got.starts_with("TASK_STATE_COMPLETED "), "{got}");
    // No certificate (client_certs = "request"): the static token, over TLS.
    let got = send(&base, p, "", "JSONRPC", "", &d.token()).await;
    assert!(got.starts_with("TASK_STATE_COMPLETED "), "{got}");

    // Refused in the handshake, with the alert that says why.
    let got = send(&base, p, "forger", "JSONRPC", "", "").await;
    assert!(
        got.starts_with("refused") && got.to_ascii_lowercase().contains("unknown ca"),
        "{got}"
    );
    let got = send(&base, p, "expired", "JSONRPC", "", "").await;
    assert!(
        got.starts_with("refused") && got.to_ascii_lowercase().contains("expired"),
        "{got}"
    );
    // Plain HTTP is not served on a TLS listener.
    assert!(
        warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
            .await
            .is_err()
    );

    // `require`: a caller without a certificate is refused in the handshake, token or not.
    d.daemons.retain(|x| x.name != "gateway");
    d.opts.sets.push(("gateway".into(), tls("require")));
    d.start("gateway").await;
    let got = send(&base, p, "", "JSONRPC", "", &d.token()).await;
    assert!(
        got.starts_with("refused") && got.to_ascii_lowercase().contains("certificate required"),
        "{got}"
    );
    let got = send(&base, p, "builder", "JSONRPC", "", "").await;
    assert!(got.starts_with("TASK_STATE_COMPLETED "), "{got}");
}
