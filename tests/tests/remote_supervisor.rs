//! A gateway reaching its supervisor between hosts: gRPC over TCP with mutual TLS, each side
//! admitting the other by the SPIFFE ID in its certificate (issue 28). The real daemons, real
//! certificates (openssl), a real A2A call; the gateway's Unix path to the supervisor is pointed
//! at nothing, so a task that completes went over TCP. The second test puts the supervisor on
//! another "host" (a network namespace joined by a veth pair) and cuts the link mid-turn.

use serde_json::{Value, json};
use warden_e2e::netns::Host;
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

/// A supervisor cell on another "host" (a network namespace, mutual TLS only between them): a
/// task runs there; a partition during a running turn ends it FAILED within the channel's
/// keep-alive bound instead of leaving it waiting on a silent connection; once the link is back
/// the cell takes tasks again.
#[tokio::test]
async fn a_cell_behind_a_partition_fails_its_running_turn_within_the_keepalive_bound_and_rejoins() {
    let Some(host) = Host::new(0) else { return };
    let (_keep, dir) = certs();
    let port = warden_e2e::free_port();
    let mut opts_sets = sets(&dir, port, "gateway");
    for (d, kv) in &mut opts_sets {
        if d == "supervisor" && kv.starts_with("listen_remote.tcp=") {
            *kv = format!("listen_remote.tcp=\"{}:{port}\"", host.addr);
        }
        if d == "gateway" && kv.starts_with("supervisor.tcp=") {
            *kv = format!("supervisor.tcp=\"{}:{port}\"", host.addr);
        }
    }
    let mut d = Deployment::new(Options {
        sets: opts_sets.clone(),
        log_files: true,
        ..Options::default()
    });
    d.start("policy").await;
    // The supervisor runs on the other host: `ip netns exec` execs it there (its Unix sockets
    // are files, so the policy's is still at hand, as a cell's own policy would be).
    let mut args: Vec<String> = vec![
        "netns".into(),
        "exec".into(),
        host.name.clone(),
        warden_e2e::binary("warden-supervisor")
            .display()
            .to_string(),
    ];
    args.extend(warden_cli::up::daemon_args("supervisor", &d.plan()));
    for (daemon, kv) in &opts_sets {
        if daemon == "supervisor" {
            args.push("--set".into());
            args.push(kv.clone());
        }
    }
    let log = d.log_file("supervisor");
    let child =
        warden_e2e::spawn_group_logging(std::path::Path::new("/usr/sbin/ip"), &args, Some(&log));
    let mut sup = warden_e2e::Daemon {
        name: "supervisor".into(),
        child,
        socket: d.layout.socket_of("supervisor"),
        log: Some(log),
    };
    warden_e2e::wait_healthy(&mut sup, std::time::Duration::from_secs(20)).await;
    d.daemons.push(sup);
    d.start("gateway").await;

    let done = send(&d, "hello from another host").await;
    assert_eq!(
        done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );

    // A turn that takes a minute; the link goes down while it runs.
    let long = json!({"steps": [
        {"type": "message", "text": "working. "},
        {"type": "sleep", "ms": 60000},
        {"type": "message", "text": "done."},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    let running = {
        let http = d.http.clone();
        let token = d.token();
        tokio::spawn(async move {
            let resp = warden_cli::client::request(
                &http,
                http::Method::POST,
                "/a2a/jsonrpc",
                &token,
                Some(&json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {
                    "message": {"messageId": "m-long", "role": "ROLE_USER", "parts": [{"text": long}]}}})),
            )
            .await
            .expect("gateway reachable");
            warden_cli::client::read_answer(resp).await.unwrap().0
        })
    };
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    host.link(false);
    let cut = std::time::Instant::now();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(40), running)
        .await
        .expect("the turn waited on a silent connection (no keep-alive)")
        .unwrap();
    let after = cut.elapsed();
    assert_eq!(
        ended["result"]["task"]["status"]["state"], "TASK_STATE_FAILED",
        "{ended}"
    );
    let bound = warden_daemon::tls::KEEPALIVE_EVERY + warden_daemon::tls::KEEPALIVE_TIMEOUT;
    eprintln!(
        "partition: the running turn ended FAILED {after:?} after the link went down (keep-alive bound {bound:?})"
    );

    // The cell rejoins: the link comes back and the next task runs there.
    host.link(true);
    let back = send(&d, "hello again").await;
    assert_eq!(
        back["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{back}"
    );
}
