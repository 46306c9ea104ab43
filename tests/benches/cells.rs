//! Cells (issue 28), printed, not asserted:
//!
//! 1. Placements per second: the gateway's placement (`warden_gateway::cells::Cells::route`,
//!    what every new conversation goes through in `[cells]` mode: the best of K live cells, one
//!    INSERT into `placement_contexts`) against a real PostgreSQL on its Unix socket, with
//!    `WARDEN_CELLS_N` registered cells (16) and `WARDEN_CELLS_CONCURRENCY` callers at once
//!    (32); then the routing of a turn of an already placed context (one SELECT ... JOIN).
//!    No supervisor is involved: the cells are registry rows kept fresh by the bench.
//! 2. Send → first event across hosts vs on one host: one real supervisor on another "host" (a
//!    network namespace joined by a veth pair) with both its Unix socket (same host) and its
//!    mutual-TLS TCP listener (across the link); the bench sends `RunTurn` over each, interleaved,
//!    timed to the turn's first event (`TurnStarted`) and to its stop: the first turn of a new
//!    context (it opens the conversation: the agent is spawned or taken warm) and a next turn of
//!    an open one (no spawn: the transport's share shows). `WARDEN_CELLS_SAMPLES` per side (30).
//!    Needs root (network namespaces); part 1 runs without.
//!
//! Run: `cargo bench -p warden-e2e --bench cells` (release daemons), or with the dev profile's
//! daemons `cargo bench --profile dev -p warden-e2e --bench cells`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_e2e::netns::Host;
use warden_e2e::{Daemon, Deployment, Options};
use warden_pgstate::cluster::TestCluster;
use warden_proto::v1 as pb;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;

#[path = "../../crates/daemon/tests/pki/mod.rs"]
mod pki;
use pki::{TD, certs};

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn tls_config(dir: &Path, me: &str, peer: &str) -> warden_daemon::tls::TlsConfig {
    warden_daemon::tls::TlsConfig {
        cert_file: dir.join(format!("{me}.pem")),
        key_file: dir.join(format!("{me}.key")),
        ca_file: dir.join("ca.pem"),
        admit: vec![format!("{TD}/{peer}")],
    }
}

async fn placements(dir: &Path) {
    let Some(pgc) = TestCluster::start_or_skip().expect("PostgreSQL") else {
        println!("placements: skipped (no PostgreSQL binaries)");
        return;
    };
    pgc.create_db("warden").expect("createdb");
    let url = pgc.url("warden");
    let store = warden_pgstate::StoreSection {
        pool_size: 32,
        ..warden_pgstate::StoreSection::postgres(url)
    };
    let pg = warden_pgstate::Pg::new(&store).expect("pool");
    warden_pgstate::migrate::migrate(&pg)
        .await
        .expect("migrate");
    let n_cells = env_num("WARDEN_CELLS_N", 16);
    {
        let c = pg.client().await.expect("db");
        for i in 0..n_cells {
            c.execute(
                "INSERT INTO cell_registry (cell_id, address, live_agents, max_live_agents,
                     free_slots, mem_total_bytes, mem_avail_bytes, started_at, refreshed_at)
                 VALUES ($1, $2, 0, 100, $3, 0, 0, now(), now())",
                &[
                    &format!("cell-{i}"),
                    &format!("10.0.0.{i}:7443"),
                    &(50 + (i as i32 * 7) % 50),
                ],
            )
            .await
            .expect("insert cell");
        }
    }
    // The cells' refreshes, as N supervisors would write them.
    let keep = {
        let pg = pg.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(c) = pg.client().await {
                    let _ = c
                        .execute("UPDATE cell_registry SET refreshed_at = now()", &[])
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let section = warden_gateway::config::CellsSection {
        store,
        tls: tls_config(dir, "gateway", "supervisor"),
        choices: 2,
        lost_after_ms: 6_000,
        poll_ms: 1_000,
    };
    let cells = warden_gateway::cells::Cells::start(&section, dir)
        .await
        .expect("cells");
    let total = env_num("WARDEN_CELLS_PLACEMENTS", 5_000);
    let conc = env_num("WARDEN_CELLS_CONCURRENCY", 32);
    for (what, place_first) in [("new conversations placed", true), ("turns routed", false)] {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let (cells, next) = (cells.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return lat;
                    }
                    let t = Instant::now();
                    // The second round routes the contexts the first placed.
                    let r = cells
                        .route(&format!("bench-ctx-{i}"), place_first.then_some("bench"))
                        .await
                        .expect("route");
                    assert!(r.is_some(), "placed");
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.expect("task"));
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{what}: {total} in {secs:.2} s = {:.0}/s ({conc} at once, {n_cells} cells, K=2); latency p50 {:.2} ms, p99 {:.2} ms",
            total as f64 / secs,
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
    }
    let c = pg.client().await.expect("db");
    let rows = c
        .query(
            "SELECT cell_id, count(*) FROM placement_contexts GROUP BY cell_id ORDER BY 2",
            &[],
        )
        .await
        .expect("spread");
    let counts: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    println!(
        "spread over {} cells: fewest {}, most {} (free slots 50..99: more to the emptier)",
        counts.len(),
        counts.first().copied().unwrap_or(0),
        counts.last().copied().unwrap_or(0)
    );
    keep.abort();
}

type Client = SupervisorServiceClient<tonic::transport::Channel>;

/// One turn: (to its first event, to its stop) in ms.
async fn turn(c: &mut Client, ctx: &str, n: usize) -> (f64, f64) {
    let req = pb::RunTurnRequest {
        context_id: ctx.into(),
        turn_id: format!("{ctx}-t{n}"),
        text: "hello".into(),
        message_id: format!("{ctx}-m{n}"),
        task_id: format!("{ctx}-t{n}"),
        open: Some(pb::OpenConversationRequest {
            context_id: ctx.into(),
            profile: pb::Profile::WorkspaceWrite as i32,
            principal: "bench".into(),
            verb: "task".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut s = c.run_turn(req).await.expect("RunTurn").into_inner();
    let mut first = None;
    loop {
        let ev = s
            .message()
            .await
            .expect("stream")
            .expect("a stop before the end");
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        first = first.or(Some(ms));
        if let Some(Event::Stop(st)) = ev.event {
            assert_eq!(st.stop_reason, "end_turn", "{st:?}");
            return (first.unwrap_or(ms), ms);
        }
    }
}

async fn across_hosts(dir: &Path) {
    let Some(host) = Host::new(0) else {
        println!("send → first event: skipped (network namespaces need root)");
        return;
    };
    let d = Deployment::new(Options::default());
    let mut d = d;
    d.start("policy").await;
    let f = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    let port = 7443;
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
        format!("listen_remote.tcp=\"{}:{port}\"", host.addr),
        format!("listen_remote.tls.cert_file={}", f("supervisor.pem")),
        format!("listen_remote.tls.key_file={}", f("supervisor.key")),
        format!("listen_remote.tls.ca_file={}", f("ca.pem")),
        format!("listen_remote.tls.admit=[\"{TD}/gateway\"]"),
    ] {
        args.push("--set".into());
        args.push(kv);
    }
    let child = warden_e2e::spawn_group_logging(Path::new("/usr/sbin/ip"), &args, None);
    let mut sup = Daemon {
        name: "supervisor".into(),
        child,
        socket: d.layout.socket_of("supervisor"),
        log: None,
    };
    warden_e2e::wait_healthy(&mut sup, Duration::from_secs(30)).await;
    let mut local = Client::new(warden_daemon::client::unix_channel(
        &d.layout.socket_of("supervisor"),
    ));
    let tls = warden_daemon::tls::ClientTls::new(&tls_config(dir, "gateway", "supervisor"), dir)
        .expect("client tls");
    let mut remote = Client::new(
        tls.channel(&format!("{}:{port}", host.addr))
            .expect("channel"),
    );
    let n = env_num("WARDEN_CELLS_SAMPLES", 30);
    // Warm both paths once (connections, TLS handshake).
    turn(&mut local, "warm-local", 0).await;
    turn(&mut remote, "warm-remote", 0).await;
    let (mut lf, mut ls, mut rf, mut rs) = (vec![], vec![], vec![], vec![]);
    let (mut lf2, mut rf2) = (vec![], vec![]);
    for i in 0..n {
        let (a, b) = turn(&mut local, &format!("l{i}"), 1).await;
        lf.push(a);
        ls.push(b);
        lf2.push(turn(&mut local, &format!("l{i}"), 2).await.0);
        let (a, b) = turn(&mut remote, &format!("r{i}"), 1).await;
        rf.push(a);
        rs.push(b);
        rf2.push(turn(&mut remote, &format!("r{i}"), 2).await.0);
        for ctx in [format!("l{i}"), format!("r{i}")] {
            let _ = local
                .close_conversation(pb::CloseConversationRequest {
                    context_id: ctx,
                    principal: "bench".into(),
                })
                .await;
        }
    }
    for (what, first, stop, next) in [
        ("one host (Unix socket)", &mut lf, &mut ls, &mut lf2),
        ("across hosts (mTLS over veth)", &mut rf, &mut rs, &mut rf2),
    ] {
        println!(
            "{what}: new context send → first event p50 {:.1} ms p90 {:.1} ms, → stop p50 {:.1} ms; next turn send → first event p50 {:.2} ms p90 {:.2} ms ({n} samples)",
            pct(first, 0.5),
            pct(first, 0.9),
            pct(stop, 0.5),
            pct(next, 0.5),
            pct(next, 0.9),
        );
    }
    drop(sup);
    drop(host);
}

#[tokio::main]
async fn main() {
    let (_keep, dir) = certs();
    placements(&dir).await;
    across_hosts(&dir).await;
}
