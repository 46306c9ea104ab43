//! Reloading a running deployment (issue 37, item 1): SIGHUP — what `systemctl reload` sends —
//! on every real daemon reloads what can change while it runs and never ends it; a configuration
//! that does not load changes nothing and the daemon's log says why; `warden reload` asks the
//! same of every running daemon. The tokens come from `warden token new|hash` (item 5): the
//! entry it prints is what the gateway accepts.

use std::path::Path;
use std::time::Duration;

use warden_e2e::{Deployment, Options, binary};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;

/// `warden ARGS` with `stdin` on its standard input: (success, stdout, stderr).
async fn warden(state: &Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(binary("warden"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("warden runs");
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin.as_bytes()).await.expect("stdin");
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("warden answers within 30 s")
        .expect("warden output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A token and its `[[auth.tokens]]` entry, minted by `warden token new`.
async fn minted(state: &Path, principal: &str) -> (String, String) {
    let (ok, out, err) = warden(
        state,
        &["token", "new", "--principal", principal, "-o", "json"],
        "",
    )
    .await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let token = v["token"].as_str().expect("token").to_string();
    // `hash` of the same token (from standard input) gives the same entry.
    let (ok, hashed, err) =
        warden(state, &["token", "hash", "--principal", principal], &token).await;
    assert!(ok, "{err}");
    let entry = v["toml"].as_str().expect("toml").to_string();
    assert!(hashed.contains(&entry), "{hashed} / {entry}");
    (token, entry)
}

fn gateway_toml(entries: &str) -> String {
    format!(
        "[daemon]\nstate_dir = \".\"\n[listen]\nsocket = \"gateway.sock\"\n[supervisor]\nsocket = \"supervisor.sock\"\n[http]\nbind = \"127.0.0.1:1\"\npublic_url = \"http://127.0.0.1:1\"\n[auth]\n{entries}"
    )
}

fn supervisor_toml(task_text_bytes: usize) -> String {
    format!(
        "[daemon]\nstate_dir = \".\"\n[listen]\nsocket = \"supervisor.sock\"\n[policy]\nsocket = \"policy.sock\"\n[limits]\ntask_text_bytes = {task_text_bytes}\n"
    )
}

/// The HTTP status of the extended card with `token` (200 admitted, 401 not).
async fn card_status(d: &Deployment, token: &str) -> u16 {
    warden_cli::client::request(
        &d.http,
        http::Method::GET,
        "/a2a/rest/extendedAgentCard",
        token,
        None,
    )
    .await
    .expect("gateway reachable")
    .status()
    .as_u16()
}

/// A daemon's Status details on its admin socket.
async fn details(socket: &Path) -> std::collections::HashMap<String, String> {
    let ch = warden_daemon::client::connect_unix(socket)
        .await
        .expect("admin socket");
    AdminServiceClient::new(ch)
        .status(pb::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .details
}

/// Sends SIGHUP to daemon `name` and waits until its Status counts `attempts` reloads (the
/// outcome of that one is in place then); the daemon must still be running.
async fn hangup(d: &mut Deployment, name: &str, admin: &Path, attempts: u64) {
    let daemon = d.daemon(name).expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("kill -HUP");
    let begin = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            panic!("warden-{name} ended on SIGHUP: {status}");
        }
        let counted = match warden_daemon::client::connect_unix(admin).await {
            Ok(ch) => AdminServiceClient::new(ch)
                .status(pb::StatusRequest {})
                .await
                .ok()
                .and_then(|s| s.into_inner().details.get("reload_attempts").cloned())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0),
            Err(_) => 0,
        };
        if counted >= attempts {
            return;
        }
        assert!(
            begin.elapsed() < Duration::from_secs(10),
            "warden-{name} did not count reload {attempts} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_of(d: &Deployment, name: &str) -> String {
    std::fs::read_to_string(d.log_file(name)).unwrap_or_default()
}

#[tokio::test]
async fn sighup_swaps_the_gateways_tokens_and_a_broken_file_changes_nothing() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let scratch = tempfile::tempdir().expect("tempdir");
    let (alice, alice_entry) = minted(scratch.path(), "alice").await;
    let (bob, bob_entry) = minted(scratch.path(), "bob").await;
    let file = cfg.path().join("gateway.toml");
    std::fs::write(&file, gateway_toml(&alice_entry)).expect("write");
    let mut d = Deployment::up(Options {
        config_dir: Some(cfg.path().to_path_buf()),
        log_files: true,
        ..Options::default()
    })
    .await;
    let admin = d.layout.socket_of("gateway");
    assert_eq!(card_status(&d, &alice).await, 200);
    assert_eq!(card_status(&d, &bob).await, 401);

    // bob in, alice out: in force after the reload, without a restart.
    std::fs::write(&file, gateway_toml(&bob_entry)).expect("write");
    hangup(&mut d, "gateway", &admin, 1).await;
    assert_eq!(
        card_status(&d, &bob).await,
        200,
        "{}",
        log_of(&d, "gateway")
    );
    assert_eq!(card_status(&d, &alice).await, 401);
    let st = details(&admin).await;
    assert_eq!(st["reloads_applied"], "1", "{st:?}");
    assert_eq!(st["last_reload_error"], "", "{st:?}");

    // A file that does not load: nothing changes, and the log and Status say why.
    std::fs::write(
        &file,
        gateway_toml("[[auth.tokens]]\nprincipal = \"alice\"\nsha256 = \"not-a-digest\"\n"),
    )
    .expect("write");
    hangup(&mut d, "gateway", &admin, 2).await;
    assert_eq!(card_status(&d, &bob).await, 200);
    assert_eq!(card_status(&d, &alice).await, 401);
    let st = details(&admin).await;
    assert_eq!(st["reloads_applied"], "1", "{st:?}");
    assert!(st["last_reload_error"].contains("sha256"), "{st:?}");
    let log = log_of(&d, "gateway");
    assert!(
        log.contains("reload refused; nothing changed") && log.contains("sha256"),
        "{log}"
    );

    // `warden reload` runs the same reload on every running daemon and says which refused.
    let (ok, out, err) = warden(d.dir.path(), &["reload"], "").await;
    assert!(!ok, "a refused reload exits non-zero: {out}{err}");
    assert!(
        out.contains("warden-policy reloaded: policy version 2"),
        "{out}"
    );
    assert!(out.contains("warden-supervisor reloaded"), "{out}");
    assert!(
        out.contains("warden-gateway changed nothing") && out.contains("sha256"),
        "{out}"
    );
    std::fs::write(&file, gateway_toml(&alice_entry)).expect("write");
    let (ok, out, err) = warden(d.dir.path(), &["reload"], "").await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("warden-gateway reloaded"), "{out}");
    assert_eq!(card_status(&d, &alice).await, 200);
    assert_eq!(card_status(&d, &bob).await, 401);
}

#[tokio::test]
async fn sighup_changes_the_supervisors_limits_for_new_turns_and_keeps_it_running() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let file = cfg.path().join("supervisor.toml");
    std::fs::write(&file, supervisor_toml(5000)).expect("write");
    let mut d = Deployment::new(Options {
        config_dir: Some(cfg.path().to_path_buf()),
        log_files: true,
        ..Options::default()
    });
    d.start("policy").await;
    d.start("supervisor").await;
    let socket = d.layout.socket_of("supervisor");
    let mut sup = SupervisorServiceClient::new(d.channel("supervisor"));
    let limit = |r: pb::ListAgentsResponse| r.task_text_bytes;
    let listed = sup.list_agents(pb::ListAgentsRequest {}).await.unwrap();
    assert_eq!(limit(listed.into_inner()), 5000);

    std::fs::write(&file, supervisor_toml(1000)).expect("write");
    hangup(&mut d, "supervisor", &socket, 1).await;
    let listed = sup.list_agents(pb::ListAgentsRequest {}).await.unwrap();
    assert_eq!(limit(listed.into_inner()), 1000);
    // The new limit is what a new turn meets.
    let refused = match sup
        .run_turn(pb::RunTurnRequest {
            context_id: "ctx-reload".into(),
            turn_id: "turn-reload".into(),
            text: "x".repeat(2000),
            ..Default::default()
        })
        .await
    {
        Ok(_) => panic!("a task text over the reloaded limit was taken"),
        Err(e) => e,
    };
    assert!(
        refused.message().contains("prompt-too-large") && refused.message().contains("1000"),
        "{refused:?}"
    );

    // A file that does not parse: the limit in force stays, the log says why.
    std::fs::write(&file, "[limits\ntask_text_bytes = 10\n").expect("write");
    hangup(&mut d, "supervisor", &socket, 2).await;
    let listed = sup.list_agents(pb::ListAgentsRequest {}).await.unwrap();
    assert_eq!(limit(listed.into_inner()), 1000);
    let log = log_of(&d, "supervisor");
    assert!(
        log.contains("reload refused; nothing changed") && log.contains("supervisor.toml"),
        "{log}"
    );
    // What a reload cannot change while agents run is kept, and named.
    std::fs::write(
        &file,
        format!("{}max_live_agents = 3\n", supervisor_toml(1000)),
    )
    .expect("write");
    hangup(&mut d, "supervisor", &socket, 3).await;
    let log = log_of(&d, "supervisor");
    assert!(
        log.contains("applied only at a restart: limits.max_live_agents"),
        "{log}"
    );
}

#[tokio::test]
async fn sighup_never_ends_the_policy_or_the_approver() {
    let cfg = tempfile::tempdir().expect("tempdir");
    let mut d = Deployment::new(Options {
        approver: true,
        config_dir: Some(cfg.path().to_path_buf()),
        log_files: true,
        ..Options::default()
    });
    // `warden init`'s approver.toml, so that the approver reads a file it can be given again.
    warden_cli::init::write(cfg.path(), &d.layout).expect("warden init");
    for other in ["policy", "supervisor", "gateway"] {
        let _ = std::fs::remove_file(warden_cli::layout::file_of(cfg.path(), other));
    }
    d.start("policy").await;
    d.start("approver").await;
    let policy_admin = d.layout.policy_admin_socket();
    let approver_admin = d.layout.approver_admin_socket();
    hangup(&mut d, "policy", &policy_admin, 1).await;
    assert_eq!(details(&policy_admin).await["policy_version"], "2");
    hangup(&mut d, "approver", &approver_admin, 1).await;
    assert!(
        log_of(&d, "approver").contains("restart it to apply it"),
        "{}",
        log_of(&d, "approver")
    );
    // A broken approver.toml is named, and the approver keeps serving.
    std::fs::write(cfg.path().join("approver.toml"), "[approval\n").expect("write");
    hangup(&mut d, "approver", &approver_admin, 2).await;
    let st = details(&approver_admin).await;
    assert!(st["last_reload_error"].contains("approver.toml"), "{st:?}");
    assert!(
        warden_daemon::client::healthy(&d.layout.socket_of("approver")).await,
        "the approver stopped serving"
    );
}
