//! Supervisor cells placed by the gateway (issue 28), on one machine made of several hosts:
//! PostgreSQL, the gateway and the policy on this one; a supervisor cell on each of two others
//! (network namespaces joined by veth pairs); gRPC between hosts over mutual TLS only. The cells
//! reach the policy's Unix socket and PostgreSQL's through the shared filesystem (what a cell's
//! own policy beside it, and a database socket, would be): only the gateway ↔ cell traffic
//! crosses the links.
//!
//! What a caller sees: conversations spread over both cells and each turn of a context runs on
//! its cell (the cell's transcripts hold it); a cell killed with kill -9 (supervisor and agents)
//! ends its running turn FAILED `cell-lost` within the bound, new conversations go to the other
//! cell, and the next message to a lost context runs there with a ContextReset note.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden_e2e::netns::Host;
use warden_e2e::{Daemon, Deployment, Options};
use warden_pgstate::cluster::TestCluster;

#[path = "../../crates/daemon/tests/pki/mod.rs"]
mod pki;
use pki::{TD, certs};

/// The gateway counts a cell lost after this long without a report (cells.lost_after_ms).
const LOST_AFTER_MS: u64 = 3_000;
const POLL_MS: u64 = 500;
const REFRESH_MS: u64 = 500;
const PORT: u16 = 7443;

fn q(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

fn gateway_sets(dir: &Path, url: &str, client: &str) -> Vec<(String, String)> {
    let f = |name: &str| q(&dir.join(name));
    [
        // Nothing listens there: a task that runs went to a cell.
        "supervisor.socket=\"/nonexistent/supervisor.sock\"".to_string(),
        format!("cells.store.url={url:?}"),
        format!("cells.tls.cert_file={}", f(&format!("{client}.pem"))),
        format!("cells.tls.key_file={}", f(&format!("{client}.key"))),
        format!("cells.tls.ca_file={}", f("ca.pem")),
        format!("cells.tls.admit=[\"{TD}/supervisor\"]"),
        format!("cells.lost_after_ms={LOST_AFTER_MS}"),
        format!("cells.poll_ms={POLL_MS}"),
    ]
    .into_iter()
    .map(|kv| ("gateway".to_string(), kv))
    .collect()
}

/// One cell: a supervisor on `host`, its state in `<deployment>/<id>`.
struct Cell {
    id: String,
    state: PathBuf,
    /// Stopped when dropped.
    _daemon: Daemon,
}

async fn start_cell(d: &Deployment, host: &Host, id: &str, dir: &Path, url: &str) -> Cell {
    let state = d.dir.path().join(id);
    std::fs::create_dir_all(&state).unwrap();
    let socket = state.join("supervisor.sock");
    let f = |name: &str| q(&dir.join(name));
    let mut args: Vec<String> = vec![
        "netns".into(),
        "exec".into(),
        host.name.clone(),
        warden_e2e::binary("warden-supervisor")
            .display()
            .to_string(),
    ];
    args.extend(warden_cli::up::daemon_args("supervisor", &d.plan()));
    for kv in [
        format!("daemon.state_dir={}", q(&state)),
        format!("listen.socket={}", q(&socket)),
        format!("listen_remote.tcp=\"{}:{PORT}\"", host.addr),
        format!("listen_remote.tls.cert_file={}", f("supervisor.pem")),
        format!("listen_remote.tls.key_file={}", f("supervisor.key")),
        format!("listen_remote.tls.ca_file={}", f("ca.pem")),
        format!("listen_remote.tls.admit=[\"{TD}/gateway\"]"),
        format!("cell.id={id:?}"),
        format!("cell.address=\"{}:{PORT}\"", host.addr),
        format!("cell.store.url={url:?}"),
        format!("cell.refresh_ms={REFRESH_MS}"),
    ] {
        args.push("--set".into());
        args.push(kv);
    }
    let log = d.dir.path().join(format!("{id}.log"));
    let child = warden_e2e::spawn_group_logging(Path::new("/usr/sbin/ip"), &args, Some(&log));
    let mut daemon = Daemon {
        name: id.to_string(),
        child,
        socket,
        log: Some(log),
    };
    warden_e2e::wait_healthy(&mut daemon, Duration::from_secs(30)).await;
    Cell {
        id: id.to_string(),
        state,
        _daemon: daemon,
    }
}

async fn send(d: &Deployment, context: &str, text: &str) -> Value {
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &d.token(),
        Some(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": uuid(), "role": "ROLE_USER", "contextId": context,
                        "parts": [{"text": text}]}}}),
        ),
    )
    .await
    .expect("gateway reachable");
    warden_cli::client::read_answer(resp).await.unwrap().0
}

fn uuid() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("m-{}-{n}", std::process::id())
}

fn state(v: &Value) -> &str {
    v["result"]["task"]["status"]["state"]
        .as_str()
        .unwrap_or("")
}

/// The cell each context is placed on, from the shared store.
async fn placement(pg: &warden_pgstate::Pg, context: &str) -> Option<String> {
    let c = pg.client().await.unwrap();
    c.query_opt(
        "SELECT cell_id FROM placement_contexts WHERE context_id = $1",
        &[&context],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Whether `cell` wrote a transcript for turn `task_id` of `context`.
fn ran_on(cell: &Cell, context: &str, task_id: &str) -> bool {
    let label: String = task_id.chars().take(32).collect();
    std::fs::read_dir(cell.state.join("transcripts").join(context))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().contains(&label))
        })
        .unwrap_or(false)
}

fn task_id(v: &Value) -> String {
    v["result"]["task"]["id"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn conversations_spread_over_two_cells_and_a_killed_cell_loses_only_its_own() {
    let (Some(host_a), Some(host_b)) = (Host::new(1), Host::new(2)) else {
        return;
    };
    let Some(pgc) = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}"))
    else {
        return;
    };
    pgc.create_db("warden").unwrap();
    let url = pgc.url("warden");
    let pg = warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(url.clone())).unwrap();
    let (_keep, dir) = certs();
    let mut d = Deployment::new(Options {
        sets: gateway_sets(&dir, &url, "gateway"),
        log_files: true,
        ..Options::default()
    });
    d.start("policy").await;
    let a = start_cell(&d, &host_a, "cell-a", &dir, &url).await;
    let b = start_cell(&d, &host_b, "cell-b", &dir, &url).await;
    d.start("gateway").await;
    let cells = [&a, &b];
    let pid = std::process::id();

    // Ten conversations, two turns each.
    let mut placed: Vec<(String, String)> = Vec::new();
    for i in 0..10 {
        let ctx = format!("ctx{i}-{pid}");
        let first = send(&d, &ctx, "hello").await;
        assert_eq!(state(&first), "TASK_STATE_COMPLETED", "{first}");
        let second = send(&d, &ctx, "hello again").await;
        assert_eq!(state(&second), "TASK_STATE_COMPLETED", "{second}");
        let cell = placement(&pg, &ctx).await.expect("placed");
        let on = cells.iter().find(|c| c.id == cell).expect("a known cell");
        let other = cells.iter().find(|c| c.id != cell).unwrap();
        for t in [task_id(&first), task_id(&second)] {
            assert!(
                ran_on(on, &ctx, &t),
                "turn {t} of {ctx} ran on its cell {cell}"
            );
            assert!(
                !ran_on(other, &ctx, &t),
                "turn {t} of {ctx} reached only its cell"
            );
        }
        placed.push((ctx, cell));
    }
    let on_a = placed.iter().filter(|(_, c)| c == "cell-a").count();
    eprintln!(
        "placements: {on_a} on cell-a, {} on cell-b",
        placed.len() - on_a
    );
    assert!(
        on_a > 0 && on_a < placed.len(),
        "conversations spread over both cells: {placed:?}"
    );

    // A long turn on a conversation of cell-a; the whole cell dies under it.
    let (lost_ctx, _) = placed.iter().find(|(_, c)| c == "cell-a").cloned().unwrap();
    let long = json!({"steps": [
        {"type": "message", "text": "working. "},
        {"type": "sleep", "ms": 60000},
        {"type": "message", "text": "done."},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    let running = {
        let (http, token, ctx) = (d.http.clone(), d.token(), lost_ctx.clone());
        tokio::spawn(async move {
            let resp = warden_cli::client::request(
                &http,
                http::Method::POST,
                "/a2a/jsonrpc",
                &token,
                Some(
                    &json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {
                    "message": {"messageId": "m-long", "role": "ROLE_USER", "contextId": ctx,
                                "parts": [{"text": long}]}}}),
                ),
            )
            .await
            .expect("gateway reachable");
            warden_cli::client::read_answer(resp).await.unwrap().0
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let agents_before = host_a.pids().len();
    host_a.kill_all();
    let killed = Instant::now();
    let bound = Duration::from_millis(LOST_AFTER_MS + POLL_MS)
        + warden_daemon::tls::KEEPALIVE_EVERY
        + warden_daemon::tls::KEEPALIVE_TIMEOUT;
    let ended = tokio::time::timeout(bound + Duration::from_secs(5), running)
        .await
        .expect("the running turn of a killed cell ended within the bound")
        .unwrap();
    let after = killed.elapsed();
    eprintln!(
        "kill -9 of cell-a ({agents_before} processes): its running turn ended {} {after:?} later (bound {bound:?})",
        state(&ended)
    );
    assert_eq!(state(&ended), "TASK_STATE_FAILED", "{ended}");
    assert!(
        ended.to_string().contains("cell-lost"),
        "typed fault: {ended}"
    );
    assert!(after <= bound, "{after:?} > {bound:?}");

    // Once the registry says cell-a is lost, new conversations all go to cell-b.
    tokio::time::sleep(Duration::from_millis(LOST_AFTER_MS + 2 * POLL_MS)).await;
    for i in 0..4 {
        let ctx = format!("after{i}-{pid}");
        let r = send(&d, &ctx, "hello").await;
        assert_eq!(state(&r), "TASK_STATE_COMPLETED", "{r}");
        assert_eq!(placement(&pg, &ctx).await.as_deref(), Some("cell-b"));
        assert!(ran_on(&b, &ctx, &task_id(&r)));
    }

    // The lost context's next message starts over on cell-b, and says so.
    let back = send(&d, &lost_ctx, "are you there?").await;
    assert_eq!(state(&back), "TASK_STATE_COMPLETED", "{back}");
    assert_eq!(placement(&pg, &lost_ctx).await.as_deref(), Some("cell-b"));
    assert!(ran_on(&b, &lost_ctx, &task_id(&back)));
    let get = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &d.token(),
        Some(
            &json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {
            "id": task_id(&back), "historyLength": 100}}),
        ),
    )
    .await
    .unwrap();
    let got = warden_cli::client::read_answer(get).await.unwrap().0;
    assert!(
        back.to_string().contains("context_reset") || got.to_string().contains("context_reset"),
        "the caller is told the context was reset: {back} {got}"
    );
    drop(a);
}
