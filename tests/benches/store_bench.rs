//! Durable decisions per second and `Decide` latency with 8 callers, for warden-policy's audit
//! log on sled (the default: journal + group-committed `fdatasync`) and on PostgreSQL (one
//! group-committed INSERT per batch, a real cluster started here from the distribution's
//! binaries, `fsync` on), on the same machine. Printed, not asserted (issue 27).
//!
//! Every answer is checked to be an ALLOW (so each was audited before it was sent); with
//! PostgreSQL the rows are counted afterwards.
//!
//! Run: `cargo bench -p warden-e2e --bench store_bench` (release daemons are built first), or
//! with debug daemons `cargo bench --profile dev -p warden-e2e --bench store_bench`;
//! `WARDEN_STORE_BENCH_N` decisions per backend (4000), `WARDEN_STORE_BENCH_CALLERS` (8).

use std::time::{Duration, Instant};

use warden_e2e::{Deployment, Options};
use warden_pgstate::cluster::TestCluster;
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn request(root: &str, n: usize) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("bench-{n}"),
        subject: Some(pb::Subject {
            principal: "bench".into(),
            context_id: "bench".into(),
            task_id: "t".into(),
            session_id: "s".into(),
            agent: "scripted".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: root.into(),
            owned: true,
            allow_execute: true,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: format!("call-{n}"),
            kind: "read".into(),
            title: format!("Read f{n}.txt"),
            raw_input_json: "{}".into(),
            locations: vec![pb::Location {
                path: format!("{root}/f{n}.txt"),
                line: None,
            }],
        }),
        options: vec![
            pb::PermissionOption {
                id: "allow".into(),
                name: "Allow".into(),
                kind: "allow_once".into(),
            },
            pb::PermissionOption {
                id: "reject".into(),
                name: "Reject".into(),
                kind: "reject_once".into(),
            },
        ],
        ..Default::default()
    }
}

fn pct(v: &[Duration], q: f64) -> Duration {
    let i = ((v.len() as f64 * q).ceil() as usize).saturating_sub(1);
    v.get(i.min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// `n` decisions from `callers` concurrent callers (each its own connection, one Decide at a
/// time); returns decisions/s, p50, p99.
async fn run(d: &Deployment, root: &str, n: usize, callers: usize) -> (f64, Duration, Duration) {
    // Warm up: connections, the pool, the first commits.
    let mut c = PolicyServiceClient::new(d.channel("policy"));
    for i in 0..50 {
        let got = c
            .decide(request(root, 1_000_000 + i))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.verdict, pb::Verdict::Allow as i32, "{got:?}");
    }
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..callers {
        let mut c = PolicyServiceClient::new(d.channel("policy"));
        let root = root.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n / callers + 1);
            for i in (k..n).step_by(callers) {
                let s = Instant::now();
                let got = c.decide(request(&root, i)).await.unwrap().into_inner();
                lat.push(s.elapsed());
                assert_eq!(got.verdict, pb::Verdict::Allow as i32, "{got:?}");
            }
            lat
        }));
    }
    let mut lat = Vec::with_capacity(n);
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    (n as f64 / secs, pct(&lat, 0.50), pct(&lat, 0.99))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    warden_e2e::use_release_binaries_in_benches(&["warden-policy"]);
    let n = env_num("WARDEN_STORE_BENCH_N", 4000);
    let callers = env_num("WARDEN_STORE_BENCH_CALLERS", 8);
    let root_dir = tempfile::Builder::new()
        .prefix("bench-root")
        .tempdir_in(warden_e2e::test_root())
        .unwrap();
    let root = root_dir.path().display().to_string();
    println!(
        "warden-policy, Decide over its Unix socket, {callers} callers, {n} durable decisions each backend"
    );
    println!(
        "{:<44} {:>12} {:>10} {:>10}",
        "backend", "decisions/s", "p50", "p99"
    );

    let mut sled = Deployment::new(Options::default());
    sled.start("policy").await;
    let (rate, p50, p99) = run(&sled, &root, n, callers).await;
    println!(
        "{:<44} {:>12.0} {:>10.2?} {:>10.2?}",
        "sled (audit.sync = true: journal fdatasync)", rate, p50, p99
    );
    drop(sled);

    let Some(cluster) = TestCluster::start_or_skip().unwrap() else {
        println!("postgres: skipped (PostgreSQL not installed)");
        return;
    };
    cluster.create_db("warden").unwrap();
    let url = cluster.url("warden");
    let mut pg = Deployment::new(Options {
        sets: vec![
            ("policy".into(), "store.backend=\"postgres\"".into()),
            ("policy".into(), format!("store.url={url:?}")),
        ],
        ..Default::default()
    });
    pg.start("policy").await;
    let (rate, p50, p99) = run(&pg, &root, n, callers).await;
    println!(
        "{:<44} {:>12.0} {:>10.2?} {:>10.2?}",
        "postgres (one INSERT per group, fsync on)", rate, p50, p99
    );
    let db = warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(url)).unwrap();
    let rows: i64 = db
        .client()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM policy_audit", &[])
        .await
        .unwrap()
        .get(0);
    println!("postgres audit rows: {rows} (of {} decisions)", n + 50);
}
