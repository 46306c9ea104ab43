//! A gateway reaching its supervisor between hosts: gRPC over TCP with mutual TLS, each side
//! admitting the other by the SPIFFE ID in its certificate (issue 28). The real daemons, real
//! certificates (openssl), a real A2A call; the gateway's Unix path to the supervisor is pointed
//! at nothing, so a task that completes went over TCP.

use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

#[path = "../../crates/daemon/tests/pki/mod.rs"]
mod pki;
use pki::{TD, certs};

fn toml_path(p: &std::path::Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// The supervisor's remote listener admits the gateway; the gateway presents `client` (one of
/// the test leaves) and expects the supervisor's identity.
fn sets(dir: &std::path::Path, port: u16, client: &str) -> Vec<(String, String)> {
    let f = |name: &str| toml_path(&dir.join(name));
    vec![
        (
            "supervisor".into(),
            format!("listen_remote.tcp=\"127.0.0.1:{port}\""),
        ),
        (
            "supervisor".into(),
            format!("listen_remote.tls.cert_file={}", f("supervisor.pem")),
        ),
        (
            "supervisor".into(),
            format!("listen_remote.tls.key_file={}", f("supervisor.key")),
        ),
        (
            "supervisor".into(),
            format!("listen_remote.tls.ca_file={}", f("ca.pem")),
        ),
        (
            "supervisor".into(),
            format!("listen_remote.tls.admit=[\"{TD}/gateway\"]"),
        ),
        (
            "gateway".into(),
            "supervisor.socket=\"/nonexistent/supervisor.sock\"".into(),
        ),
        (
            "gateway".into(),
            format!("supervisor.tcp=\"127.0.0.1:{port}\""),
        ),
        (
            "gateway".into(),
            format!("supervisor.tls.cert_file={}", f(&format!("{client}.pem"))),
        ),
        (
            "gateway".into(),
            format!("supervisor.tls.key_file={}", f(&format!("{client}.key"))),
        ),
        (
            "gateway".into(),
            format!("supervisor.tls.ca_file={}", f("ca.pem")),
        ),
        (
            "gateway".into(),
            format!("supervisor.tls.admit=[\"{TD}/supervisor\"]"),
        ),
    ]
}

async fn send(d: &Deployment, text: &str) -> Value {
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &d.token(),
        Some(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}}}),
        ),
    )
    .await
    .expect("gateway reachable");
    warden_cli::client::read_answer(resp).await.unwrap().0
}

#[tokio::test]
async fn a_gateway_runs_tasks_on_a_supervisor_over_mutual_tls_and_a_wrong_identity_is_refused() {
    let (_keep, dir) = certs();
    let port = warden_e2e::free_port();
    let d = Deployment::up(Options {
        sets: sets(&dir, port, "gateway"),
        log_files: true,
        ..Options::default()
    })
    .await;
    let done = send(&d, "hello over mutual TLS").await;
    assert_eq!(
        done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );
    let log = std::fs::read_to_string(d.log_file("supervisor")).unwrap_or_default();
    assert!(
        log.contains(&format!("tcp+mtls:127.0.0.1:{port}")),
        "the supervisor says where it listens remotely: {log}"
    );
    drop(d);

    // The same deployment with the gateway presenting the policy's certificate (same CA, wrong
    // role): the supervisor refuses it at the handshake, and no task runs.
    let port = warden_e2e::free_port();
    let d = Deployment::up(Options {
        sets: sets(&dir, port, "policy"),
        log_files: true,
        ..Options::default()
    })
    .await;
    let refused = send(&d, "hello from the wrong role").await;
    assert_ne!(
        refused["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{refused}"
    );
    let log = std::fs::read_to_string(d.log_file("supervisor")).unwrap_or_default();
    assert!(
        log.contains("peer refused") && log.contains(&format!("{TD}/policy")),
        "the supervisor logs whom it refused: {log}"
    );
}
