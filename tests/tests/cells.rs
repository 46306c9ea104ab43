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
    url: String,
    /// Stopped when dropped.
    daemon: Option<Daemon>,
}

/// A cell's own `--set`s on top of what `warden up` gives a supervisor.
fn cell_sets(state: &Path, host: &Host, id: &str, dir: &Path, url: &str) -> Vec<String> {
    let f = |name: &str| q(&dir.join(name));
    let kvs = [
        format!("daemon.state_dir={}", q(state)),
        format!("listen.socket={}", q(&state.join("supervisor.sock"))),
        format!("listen_remote.tcp=\"{}:{PORT}\"", host.addr),
        format!("listen_remote.tls.cert_file={}", f("supervisor.pem")),
        format!("listen_remote.tls.key_file={}", f("supervisor.key")),
        format!("listen_remote.tls.ca_file={}", f("ca.pem")),
        format!("listen_remote.tls.admit=[\"{TD}/gateway\"]"),
        format!("cell.id={id:?}"),
        format!("cell.address=\"{}:{PORT}\"", host.addr),
        format!("cell.store.url={url:?}"),
        format!("cell.refresh_ms={REFRESH_MS}"),
    ];
    kvs.into_iter()
        .flat_map(|kv| ["--set".to_string(), kv])
        .collect()
}

async fn start_cell(d: &Deployment, host: &Host, id: &str, dir: &Path, url: &str) -> Cell {
    let state = d.dir.path().join(id);
    std::fs::create_dir_all(&state).unwrap();
    let socket = state.join("supervisor.sock");
    let mut args: Vec<String> = vec![
        "netns".into(),
        "exec".into(),
        host.name.clone(),
        warden_e2e::binary("warden-supervisor")
            .display()
            .to_string(),
    ];
    args.extend(warden_cli::up::daemon_args("supervisor", &d.plan()));
    args.extend(cell_sets(&state, host, id, dir, url));
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
        url: url.to_string(),
        daemon: Some(daemon),
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

/// PostgreSQL, the policy and a gateway (presenting `client`'s certificate) here, cell-a and
/// cell-b on two other hosts. With `pg_over_links`, the cells reach PostgreSQL over their links
/// (so a partition also stops their reports), else over its socket.
struct World {
    // Dropped in this order: the gateway and policy, the cells, then their hosts.
    d: Deployment,
    a: Cell,
    b: Cell,
    host_a: Host,
    host_b: Host,
    pg: warden_pgstate::Pg,
    dir: PathBuf,
    _certs: tempfile::TempDir,
    pgc: TestCluster,
}

async fn world(pg_over_links: bool, client: &str) -> Option<World> {
    let (Some(host_a), Some(host_b)) = (Host::new(1), Host::new(2)) else {
        return None;
    };
    let mut pgc = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}"))?;
    pgc.create_db("warden").unwrap();
    let url = pgc.url("warden");
    let (url_a, url_b) = if pg_over_links {
        pgc.listen_tcp(&[&host_a.local, &host_b.local], "10.231.0.0/16")
            .unwrap();
        (
            pgc.tcp_url(&host_a.local, "warden"),
            pgc.tcp_url(&host_b.local, "warden"),
        )
    } else {
        (url.clone(), url.clone())
    };
    let pg = warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(url.clone())).unwrap();
    let (certs_dir, dir) = certs();
    let mut d = Deployment::new(Options {
        sets: gateway_sets(&dir, &url, client),
        log_files: true,
        ..Options::default()
    });
    d.start("policy").await;
    let a = start_cell(&d, &host_a, "cell-a", &dir, &url_a).await;
    let b = start_cell(&d, &host_b, "cell-b", &dir, &url_b).await;
    d.start("gateway").await;
    Some(World {
        d,
        a,
        b,
        host_a,
        host_b,
        pg,
        dir,
        _certs: certs_dir,
        pgc,
    })
}

#[tokio::test]
async fn conversations_spread_over_two_cells_and_a_killed_cell_loses_only_its_own() {
    let Some(w) = world(false, "gateway").await else {
        return;
    };
    let World {
        d,
        a,
        b,
        host_a,
        pg,
        ..
    } = &w;
    let cells = [a, b];
    let pid = std::process::id();

    // Ten conversations, two turns each.
    let mut placed: Vec<(String, String)> = Vec::new();
    for i in 0..10 {
        let ctx = format!("ctx{i}-{pid}");
        let first = send(d, &ctx, "hello").await;
        assert_eq!(state(&first), "TASK_STATE_COMPLETED", "{first}");
        let second = send(d, &ctx, "hello again").await;
        assert_eq!(state(&second), "TASK_STATE_COMPLETED", "{second}");
        let cell = placement(pg, &ctx).await.expect("placed");
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
        let r = send(d, &ctx, "hello").await;
        assert_eq!(state(&r), "TASK_STATE_COMPLETED", "{r}");
        assert_eq!(placement(pg, &ctx).await.as_deref(), Some("cell-b"));
        assert!(ran_on(b, &ctx, &task_id(&r)));
    }

    // The lost context's next message starts over on cell-b, and says so.
    let back = send(d, &lost_ctx, "are you there?").await;
    assert_eq!(state(&back), "TASK_STATE_COMPLETED", "{back}");
    assert_eq!(placement(pg, &lost_ctx).await.as_deref(), Some("cell-b"));
    assert!(ran_on(b, &lost_ctx, &task_id(&back)));
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
}

/// Sends a new conversation (a fresh context) and returns it with its cell.
async fn place_one(w: &World, ctx: &str) -> String {
    let r = send(&w.d, ctx, "hello").await;
    assert_eq!(state(&r), "TASK_STATE_COMPLETED", "{r}");
    placement(&w.pg, ctx).await.expect("placed")
}

/// A context on each cell, placing new conversations until both have one.
async fn one_on_each(w: &World, tag: &str) -> (String, String) {
    let (mut on_a, mut on_b) = (None, None);
    for i in 0..20 {
        let ctx = format!("{tag}{i}-{}", std::process::id());
        match place_one(w, &ctx).await.as_str() {
            "cell-a" => on_a = on_a.or(Some(ctx)),
            _ => on_b = on_b.or(Some(ctx)),
        }
        if let (Some(a), Some(b)) = (&on_a, &on_b) {
            return (a.clone(), b.clone());
        }
    }
    panic!("20 conversations never spread over both cells");
}

/// The free slots each cell last reported, by cell id.
async fn reported_free(pg: &warden_pgstate::Pg) -> Vec<(String, i32)> {
    let c = pg.client().await.unwrap();
    c.query(
        "SELECT cell_id, free_slots FROM cell_registry ORDER BY cell_id",
        &[],
    )
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// Issue 38: a burst of new conversations is placed by what was just placed, not by the free
/// slots of the cells' last reports (written every `cell.refresh_ms`, read every
/// `cells.poll_ms`). One conversation is placed and reported first, so one cell reports a slot
/// fewer; nine more arrive at once, before any cell reports again. Counted at once, they even
/// the cells out (5/5 ± 1 over the ten); by the reports alone all nine went to the cell that
/// reported more free slots (1/9).
#[tokio::test]
async fn a_burst_of_new_conversations_splits_evenly_over_two_equal_cells() {
    let Some(w) = world(false, "gateway").await else {
        return;
    };
    let pid = std::process::id();
    let first = place_one(&w, &format!("first-{pid}")).await;
    // Until the registry shows that conversation's slot taken, and this gateway has read it
    // (its own count of the placement lapses a second after it).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let free = reported_free(&w.pg).await;
        let of = |id: &str| free.iter().find(|(c, _)| c == id).map(|(_, n)| *n);
        let other = if first == "cell-a" {
            "cell-b"
        } else {
            "cell-a"
        };
        if let (Some(f), Some(o)) = (of(&first), of(other))
            && f + 1 == o
        {
            eprintln!("reported before the burst: {free:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cells never reported {first}'s conversation: {free:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2 * POLL_MS + 2 * REFRESH_MS + 1_000)).await;

    let burst: Vec<_> = (0..9)
        .map(|i| {
            let (http, token, ctx) = (w.d.http.clone(), w.d.token(), format!("burst{i}-{pid}"));
            tokio::spawn(async move {
                let resp = warden_cli::client::request(
                    &http,
                    http::Method::POST,
                    "/a2a/jsonrpc",
                    &token,
                    Some(
                        &json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {
                    "message": {"messageId": uuid(), "role": "ROLE_USER", "contextId": ctx,
                                "parts": [{"text": "hello"}]}}}),
                    ),
                )
                .await
                .expect("gateway reachable");
                (ctx, warden_cli::client::read_answer(resp).await.unwrap().0)
            })
        })
        .collect();
    let mut cells = vec![first];
    for t in burst {
        let (ctx, r) = t.await.unwrap();
        assert_eq!(state(&r), "TASK_STATE_COMPLETED", "{r}");
        cells.push(placement(&w.pg, &ctx).await.expect("placed"));
    }
    let on_a = cells.iter().filter(|c| *c == "cell-a").count();
    eprintln!(
        "ten conversations, the last nine at once: {on_a} on cell-a, {} on cell-b",
        cells.len() - on_a
    );
    assert!(
        (4..=6).contains(&on_a),
        "10 new conversations on two equal cells split 5/5 ± 1: {cells:?}"
    );
}

fn long_turn(w: &World, ctx: &str) -> tokio::task::JoinHandle<Value> {
    turn_sleeping(w, ctx, 60_000)
}

/// A turn in `ctx`, sent over A2A JSON-RPC in a task of its own, whose agent says "working. ",
/// sleeps `ms`, then says "done.": the task's answer once it ends.
fn turn_sleeping(w: &World, ctx: &str, ms: u64) -> tokio::task::JoinHandle<Value> {
    let script = json!({"steps": [
        {"type": "message", "text": "working. "},
        {"type": "sleep", "ms": ms},
        {"type": "message", "text": "done."},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    let (http, token, ctx) = (w.d.http.clone(), w.d.token(), ctx.to_string());
    tokio::spawn(async move {
        let resp = warden_cli::client::request(
            &http,
            http::Method::POST,
            "/a2a/jsonrpc",
            &token,
            Some(
                &json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {
                "message": {"messageId": uuid(), "role": "ROLE_USER", "contextId": ctx,
                            "parts": [{"text": script}]}}}),
            ),
        )
        .await
        .expect("gateway reachable");
        warden_cli::client::read_answer(resp).await.unwrap().0
    })
}

/// Transcripts of turn `task_id` on `cell`, over every context.
fn transcripts_of(cell: &Cell, task_id: &str) -> usize {
    let label: String = task_id.chars().take(32).collect();
    let Ok(contexts) = std::fs::read_dir(cell.state.join("transcripts")) else {
        return 0;
    };
    contexts
        .flatten()
        .filter_map(|c| std::fs::read_dir(c.path()).ok())
        .flat_map(|rd| rd.flatten())
        .filter(|e| e.file_name().to_string_lossy().contains(&label))
        .count()
}

/// cell-a's link goes down for 20 s (to the gateway and to PostgreSQL alike: it can neither
/// answer nor report). Its running turn ends FAILED cell-lost within the bound, not at the turn's
/// own deadline; the context's next message starts over on cell-b; cell-b is untouched; no turn
/// ran twice; once the link is back cell-a reports again and takes new conversations.
#[tokio::test]
async fn a_partitioned_cell_ends_its_turns_within_the_bound_runs_none_twice_and_rejoins() {
    let Some(w) = world(true, "gateway").await else {
        return;
    };
    let (ctx_a, ctx_b) = one_on_each(&w, "p").await;
    let running = long_turn(&w, &ctx_a);
    let running_b = long_turn(&w, &ctx_b);
    tokio::time::sleep(Duration::from_secs(3)).await;
    w.host_a.link(false);
    let cut = Instant::now();
    // Stale after LOST_AFTER_MS since its last report (at most REFRESH_MS before the cut),
    // seen at the next poll; the HTTP/2 keep-alive (10 s) is the other way it could be found.
    let bound = Duration::from_millis(LOST_AFTER_MS + POLL_MS + REFRESH_MS);
    let ended = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the partitioned cell's turn ended")
        .unwrap();
    let after = cut.elapsed();
    eprintln!(
        "partition: cell-a's running turn ended {} {after:?} after the cut (bound {bound:?})",
        state(&ended)
    );
    assert_eq!(state(&ended), "TASK_STATE_FAILED", "{ended}");
    assert!(ended.to_string().contains("cell-lost"), "{ended}");
    assert!(
        after <= bound + Duration::from_secs(1),
        "{after:?} > {bound:?}"
    );
    let long_id = task_id(&ended);

    // During the partition: the lost context starts over on cell-b, new ones go there too.
    let moved = send(&w.d, &ctx_a, "still there?").await;
    assert_eq!(state(&moved), "TASK_STATE_COMPLETED", "{moved}");
    assert_eq!(placement(&w.pg, &ctx_a).await.as_deref(), Some("cell-b"));
    assert!(ran_on(&w.b, &ctx_a, &task_id(&moved)));
    let ctx_new = format!("pnew-{}", std::process::id());
    assert_eq!(place_one(&w, &ctx_new).await, "cell-b");
    assert!(
        !running_b.is_finished(),
        "cell-b's running turn is not touched by cell-a's partition"
    );

    // The partition lasts 20 s.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(cut.elapsed())).await;
    w.host_a.link(true);
    let healed = Instant::now();

    // cell-a rejoins: it reports again and new conversations are placed on it.
    let mut rejoined = None;
    for i in 0..60 {
        let ctx = format!("back{i}-{}", std::process::id());
        if place_one(&w, &ctx).await == "cell-a" {
            rejoined = Some(healed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let rejoined = rejoined.expect("cell-a took a new conversation after the link came back");
    eprintln!("partition: cell-a took a new conversation {rejoined:?} after the link came back");

    // The conversation the moved context left on cell-a is closed there once cell-a is back
    // (the agent of a context that now lives on cell-b holds no slot on cell-a).
    let mut local = warden_proto::v1::supervisor_service_client::SupervisorServiceClient::new(
        warden_daemon::client::unix_channel(&w.a.state.join("supervisor.sock")),
    );
    let mut left = true;
    for _ in 0..50 {
        let list = local
            .list_conversations(warden_proto::v1::ListConversationsRequest::default())
            .await
            .expect("cell-a answers on its socket")
            .into_inner();
        left = list.conversations.iter().any(|c| c.context_id == ctx_a);
        if !left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !left,
        "the conversation left on cell-a by the move is closed after it rejoined"
    );

    // No turn ran twice: the cut turn ran once, on cell-a only; its context's next turn ran on
    // cell-b only; the gateway's record of the cut turn stays FAILED.
    assert_eq!(transcripts_of(&w.a, &long_id), 1);
    assert_eq!(transcripts_of(&w.b, &long_id), 0);
    assert_eq!(transcripts_of(&w.a, &task_id(&moved)), 0);
    assert_eq!(transcripts_of(&w.b, &task_id(&moved)), 1);
    let get = warden_cli::client::request(
        &w.d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &w.d.token(),
        Some(&json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": long_id}})),
    )
    .await
    .unwrap();
    let got = warden_cli::client::read_answer(get).await.unwrap().0;
    assert_eq!(
        got["result"]["status"]["state"], "TASK_STATE_FAILED",
        "{got}"
    );
    running_b.abort();
}

/// Every cell's remote listener refuses a peer whose certificate names another role (the
/// policy's), another trust domain (same CA), or comes from another CA, and logs whom it
/// refused; the gateway's own certificate is admitted. A gateway configured with a wrong
/// certificate runs no task on any cell.
#[tokio::test]
async fn every_cell_refuses_a_wrong_role_another_trust_domain_and_another_ca() {
    let Some(w) = world(false, "policy").await else {
        return;
    };
    pki::leaf(
        &w.dir,
        "ca",
        "foreign",
        "spiffe://other.example/warden/gateway",
    );
    // The gateway presents the policy's certificate: no cell admits it. The caller is told the
    // certificate was refused (a misconfiguration), not that a cell was lost, and the gateway's
    // log names the identity it presented.
    let r = send(&w.d, &format!("wrong-{}", std::process::id()), "hello").await;
    assert_eq!(state(&r), "TASK_STATE_FAILED", "{r}");
    let said = r.to_string();
    assert!(said.contains("cell-refused"), "{said}");
    assert!(!said.contains("cell-lost"), "{said}");
    assert!(said.contains(&format!("{TD}/policy")), "{said}");
    let gateway_log = std::fs::read_to_string(w.d.log_file("gateway")).unwrap_or_default();
    assert!(
        gateway_log.contains("cell refused this gateway's certificate")
            && gateway_log.contains(&format!("{TD}/policy")),
        "the gateway logs the refusal with its identity: {gateway_log}"
    );
    for (client, admitted) in [
        ("gateway", true),
        ("policy", false),
        ("foreign", false),
        ("impostor", false),
    ] {
        let tls = warden_daemon::tls::TlsConfig {
            cert_file: w.dir.join(format!("{client}.pem")),
            key_file: w.dir.join(format!("{client}.key")),
            ca_file: w.dir.join("ca.pem"),
            admit: vec![format!("{TD}/supervisor")],
        };
        let tls = warden_daemon::tls::ClientTls::new(&tls, &w.dir).unwrap();
        for (cell, host) in [(&w.a, &w.host_a), (&w.b, &w.host_b)] {
            let addr = format!("{}:{PORT}", host.addr);
            let channel = tls.channel(&addr).unwrap();
            let mut c =
                warden_proto::v1::supervisor_service_client::SupervisorServiceClient::new(channel);
            let answer = c.list_agents(warden_proto::v1::ListAgentsRequest {}).await;
            assert_eq!(
                answer.is_ok(),
                admitted,
                "{client} at {}: {answer:?}",
                cell.id
            );
            if let Err(status) = &answer {
                // A refusal the client can tell from a lost host: the cell's TLS alert.
                let refusal = std::error::Error::source(status)
                    .and_then(warden_daemon::tls::refusal)
                    .or_else(|| tls.refused(&addr));
                assert!(
                    matches!(refusal, Some(warden_daemon::tls::Refusal::ByPeer(_))),
                    "{client} at {}: {refusal:?} from {status:?}",
                    cell.id
                );
            }
            if !admitted {
                let log = std::fs::read_to_string(d_log(&w.d, &cell.id)).unwrap_or_default();
                assert!(
                    log.contains("peer refused"),
                    "{} logs that it refused {client}: {log}",
                    cell.id
                );
            }
        }
    }
    // The other way round: a client that expects another identity than the cell's refuses it.
    let wrong_server = warden_daemon::tls::ClientTls::new(
        &warden_daemon::tls::TlsConfig {
            cert_file: w.dir.join("gateway.pem"),
            key_file: w.dir.join("gateway.key"),
            ca_file: w.dir.join("ca.pem"),
            admit: vec![format!("{TD}/policy")],
        },
        &w.dir,
    )
    .unwrap();
    let addr = format!("{}:{PORT}", w.host_a.addr);
    let channel = wrong_server.channel(&addr).unwrap();
    let answer = warden_proto::v1::supervisor_service_client::SupervisorServiceClient::new(channel)
        .list_agents(warden_proto::v1::ListAgentsRequest {})
        .await;
    let refusal = answer
        .as_ref()
        .err()
        .and_then(std::error::Error::source)
        .and_then(warden_daemon::tls::refusal)
        .or_else(|| wrong_server.refused(&addr));
    assert!(
        matches!(refusal, Some(warden_daemon::tls::Refusal::OfPeer(_))),
        "{refusal:?} from {answer:?}"
    );
    for cell in [&w.a, &w.b] {
        let log = std::fs::read_to_string(d_log(&w.d, &cell.id)).unwrap_or_default();
        for id in [
            format!("{TD}/policy"),
            "spiffe://other.example/warden/gateway".to_string(),
        ] {
            assert!(
                log.contains(&id),
                "{} names the refused {id}: {log}",
                cell.id
            );
        }
    }
}

fn d_log(d: &Deployment, id: &str) -> PathBuf {
    d.dir.path().join(format!("{id}.log"))
}

/// A drained cell (`warden-supervisor --drain`) takes no new conversation, while the turns of
/// a conversation already on it still go there; `--undrain` takes it back.
#[tokio::test]
async fn a_drained_cell_takes_no_new_conversation_and_keeps_its_own() {
    let Some(mut w) = world(false, "gateway").await else {
        return;
    };
    let (_, ctx_b) = one_on_each(&w, "d").await;
    let drain = |flag: &str| {
        let mut args = vec![flag.to_string()];
        args.extend(warden_cli::up::daemon_args("supervisor", &w.d.plan()));
        args.extend(cell_sets(&w.b.state, &w.host_b, "cell-b", &w.dir, &w.b.url));
        let out = std::process::Command::new(warden_e2e::binary("warden-supervisor"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = drain("--drain");
    assert!(said.contains("cell-b draining"), "{said}");
    tokio::time::sleep(Duration::from_millis(2 * POLL_MS)).await;
    for i in 0..6 {
        let ctx = format!("drained{i}-{}", std::process::id());
        assert_eq!(
            place_one(&w, &ctx).await,
            "cell-a",
            "nothing new on a draining cell"
        );
    }
    let again = send(&w.d, &ctx_b, "next turn").await;
    assert_eq!(state(&again), "TASK_STATE_COMPLETED", "{again}");
    assert_eq!(placement(&w.pg, &ctx_b).await.as_deref(), Some("cell-b"));
    assert!(
        ran_on(&w.b, &ctx_b, &task_id(&again)),
        "its own conversation stays"
    );
    drain("--undrain");
    tokio::time::sleep(Duration::from_millis(2 * POLL_MS)).await;
    let mut back = false;
    for i in 0..20 {
        if place_one(&w, &format!("undrained{i}-{}", std::process::id())).await == "cell-b" {
            back = true;
            break;
        }
    }
    assert!(back, "an undrained cell takes new conversations again");

    // SIGTERM: the cell marks itself draining before it stops. Started again, it takes
    // conversations again, and a context it held (its agent gone with the old process) is told
    // of the reset at its next turn.
    let old = w.b.daemon.take().expect("running");
    let status = old.terminate().await;
    eprintln!("cell-b stopped on SIGTERM: {status}");
    let c = w.pg.client().await.unwrap();
    let draining: bool = c
        .query_one(
            "SELECT draining FROM cell_registry WHERE cell_id = 'cell-b'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        draining,
        "a cell going away on SIGTERM is out of placement first"
    );
    let b = start_cell(&w.d, &w.host_b, "cell-b", &w.dir, &w.b.url.clone()).await;
    w.b = b;
    let after = send(&w.d, &ctx_b, "after the restart").await;
    assert_eq!(state(&after), "TASK_STATE_COMPLETED", "{after}");
    let now_on = placement(&w.pg, &ctx_b).await;
    eprintln!("after cell-b restarted, its context ran on {now_on:?}");
    let get = warden_cli::client::request(
        &w.d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &w.d.token(),
        Some(
            &json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {
            "id": task_id(&after), "historyLength": 100}}),
        ),
    )
    .await
    .unwrap();
    let got = warden_cli::client::read_answer(get).await.unwrap().0;
    assert!(
        after.to_string().contains("context_reset") || got.to_string().contains("context_reset"),
        "a restarted cell's context is reset, and the caller told: {after} {got}"
    );
}

/// The shared store freezes (SIGSTOP of PostgreSQL) for longer than the lost bound: the turns
/// running on the cells keep going and complete (the gateway judges no cell on what it could
/// not read, nor right after, before the cells could write again), a new conversation fails
/// within seconds instead of hanging, and once the store is back conversations are placed
/// again.
#[tokio::test]
async fn a_frozen_store_ends_no_running_turn_and_fails_new_conversations_fast() {
    let Some(w) = world(false, "gateway").await else {
        return;
    };
    let (ctx_a, ctx_b) = one_on_each(&w, "f").await;
    let turn = |ctx: &str| turn_sleeping(&w, ctx, 3 * LOST_AFTER_MS);
    let (on_a, on_b) = (turn(&ctx_a), turn(&ctx_b));
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.pgc.pause();
    let frozen = Instant::now();
    let refused = send(&w.d, &format!("frozen-{}", std::process::id()), "hello").await;
    let waited = frozen.elapsed();
    eprintln!(
        "store frozen: a new conversation ended {} after {waited:?}",
        state(&refused)
    );
    assert_eq!(state(&refused), "TASK_STATE_FAILED", "{refused}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    tokio::time::sleep(Duration::from_millis(LOST_AFTER_MS + 2 * POLL_MS)).await;
    w.pgc.resume();
    for (cell, running) in [("cell-a", on_a), ("cell-b", on_b)] {
        let done = tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .expect("the turn ended")
            .unwrap();
        assert_eq!(
            state(&done),
            "TASK_STATE_COMPLETED",
            "{cell}'s turn runs through the store's outage: {done}"
        );
    }
    // Placement needs a live cell: the cells' first writes after the thaw (within
    // REFRESH_MS, read within POLL_MS) make them placeable again.
    let thawed = Instant::now();
    let mut placed = None;
    for i in 0..20 {
        let ctx = format!("thawed{i}-{}", std::process::id());
        let r = send(&w.d, &ctx, "hello").await;
        if state(&r) == "TASK_STATE_COMPLETED" {
            placed = placement(&w.pg, &ctx).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let placed = placed.expect("conversations are placed again after the thaw");
    eprintln!(
        "store thawed: a new conversation placed on {placed} {:?} after",
        thawed.elapsed()
    );
}

/// One stateless MCP `tools/call` (the 2026-07-28 era) to the gateway's `/mcp`; its result.
async fn mcp_call(d: &Deployment, tool: &str, args: Value) -> Value {
    use http_body_util::BodyExt;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientInfo": {"name": "cells", "version": "0"},
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let tcp = tokio::net::TcpStream::connect(&d.http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("Host", &d.http)
        .header("Authorization", format!("Bearer {}", d.token()))
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    // SSE `data:` lines or one JSON body: the message answering id 7.
    text.split("\n\n")
        .flat_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .map(|l| l.strip_prefix("data:").map(str::trim_start).unwrap_or(l))
                .collect();
            serde_json::from_str::<Value>(data.join("\n").trim()).ok()
        })
        .find(|m| m["id"] == 7)
        .and_then(|m| m.get("result").cloned())
        .unwrap_or_else(|| panic!("no result: {text}"))
}

/// The MCP front places its conversations on cells the same way: each verb's turn runs on the
/// cell its context was placed on (its transcript is in that cell's state).
#[tokio::test]
async fn an_mcp_verb_runs_on_the_cell_its_context_is_placed_on() {
    let Some(w) = world(false, "gateway").await else {
        return;
    };
    for i in 0..4 {
        let r = mcp_call(
            &w.d,
            "advise",
            json!({"task": format!("question {i}: which map should I use?")}),
        )
        .await;
        let e = &r["structuredContent"];
        assert_ne!(r["isError"], true, "{r}");
        let transcript = e["transcript_path"].as_str().unwrap_or_default();
        let c = w.pg.client().await.unwrap();
        let rows = c
            .query(
                "SELECT context_id, cell_id FROM placement_contexts WHERE context_id LIKE 'mcp-%'",
                &[],
            )
            .await
            .unwrap();
        let on = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            // The supervisor labels a context's directory with its first 32 characters.
            .find(|(ctx, _)| {
                let label: String = ctx.chars().take(32).collect();
                transcript.contains(&format!("/transcripts/{label}/"))
            })
            .unwrap_or_else(|| panic!("{transcript} is the transcript of a placed context: {r}"));
        let cell = if on.1 == "cell-a" { &w.a } else { &w.b };
        assert!(
            transcript.starts_with(&cell.state.display().to_string()),
            "{transcript} is on {}",
            on.1
        );
    }
}
