//! `warden audit tail -f` (issue 37, item 3): the backlog, then every decision made while it
//! follows, each printed once and in the audit log's order — never an older decision after a
//! newer one — on the sled log and on PostgreSQL.

use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use warden_e2e::{Deployment, Options, binary, run_with_deadline};
use warden_pgstate::cluster::TestCluster;
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_proto::v1::{
    Boundary, DecideRequest, Location, PermissionOption, Profile, Subject, ToolCall,
};

fn ask(root: &std::path::Path, n: usize, ctx: &str) -> DecideRequest {
    DecideRequest {
        request_id: format!("req-{ctx}-{n}"),
        subject: Some(Subject {
            principal: "alice".into(),
            context_id: ctx.into(),
            task_id: "t1".into(),
            session_id: "s1".into(),
            agent: "scripted".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(Boundary {
            root: root.to_string_lossy().into(),
            owned: true,
            allow_execute: false,
            profile: Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(ToolCall {
            id: format!("call-{n}"),
            kind: "edit".into(),
            title: format!("Write f{n}.txt"),
            raw_input_json: "{}".into(),
            locations: vec![Location {
                path: root.join(format!("f{n}.txt")).to_string_lossy().into(),
                line: None,
            }],
        }),
        options: vec![
            PermissionOption {
                id: "allow-once".into(),
                name: "Allow".into(),
                kind: "allow_once".into(),
            },
            PermissionOption {
                id: "reject".into(),
                name: "Reject".into(),
                kind: "reject_once".into(),
            },
        ],
        current_mode: "default".into(),
        deadline_unix_ms: 0,
        return_escalations: false,
    }
}

/// The decision ids `warden audit tail -n N -o json` lists: the log's order, oldest first.
async fn tail_ids(d: &Deployment, n: usize) -> Vec<String> {
    let mut c = tokio::process::Command::new(binary("warden"));
    c.arg("--state-dir").arg(d.dir.path()).args([
        "audit",
        "tail",
        "-n",
        &n.to_string(),
        "-o",
        "json",
    ]);
    let out = run_with_deadline(&mut c, Duration::from_secs(30))
        .await
        .expect("warden runs");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| r["decisionId"].as_str().unwrap_or_default().to_string())
        .collect()
}

type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// The next followed decision's id (10 s at most).
async fn next_id(lines: &mut Lines) -> Option<String> {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .ok()?
        .ok()??;
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object a line");
    Some(v["decisionId"].as_str()?.to_string())
}

async fn follows_in_order_exactly_once(d: Deployment) {
    let root = d.dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut client = PolicyServiceClient::new(d.channel("policy"));
    let mut old = Vec::new();
    for n in 0..5 {
        let got = client
            .decide(ask(&root, n, "old"))
            .await
            .unwrap()
            .into_inner();
        old.push(got.decision_id);
    }

    let mut follow = tokio::process::Command::new(binary("warden"))
        .arg("--state-dir")
        .arg(d.dir.path())
        .args(["audit", "tail", "-f", "-n", "2", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("warden audit tail -f");
    let mut lines = tokio::io::BufReader::new(follow.stdout.take().expect("stdout")).lines();
    // The backlog: the two newest, oldest first.
    let backlog = [next_id(&mut lines).await, next_id(&mut lines).await];
    assert_eq!(
        backlog,
        [Some(old[3].clone()), Some(old[4].clone())],
        "the backlog"
    );

    // Decisions made while it follows, from four callers at once.
    let made = 40;
    let mut tasks = Vec::new();
    for t in 0..4 {
        let mut c = client.clone();
        let root = root.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..made / 4 {
                c.decide(ask(&root, 100 * t + n, &format!("live-{t}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut followed = Vec::new();
    for _ in 0..made {
        match next_id(&mut lines).await {
            Some(id) => followed.push(id),
            None => panic!(
                "only {} of {made} decisions followed: {followed:?}",
                followed.len()
            ),
        }
    }
    // Nothing more: no decision printed twice, no old one printed as new.
    let extra = tokio::time::timeout(Duration::from_millis(1500), lines.next_line()).await;
    assert!(
        !matches!(extra, Ok(Ok(Some(_)))),
        "printed beyond the decisions made: {extra:?}"
    );
    // In the log's own order: the last `made` records of the audit, oldest first.
    let log = tail_ids(&d, made + old.len()).await;
    assert_eq!(log.len(), made + old.len());
    assert_eq!(followed, log[old.len()..].to_vec());
    assert!(old.iter().all(|o| !followed.contains(o)));
    let _ = follow.kill().await;
}

#[tokio::test]
async fn audit_tail_follow_prints_each_new_decision_once_in_order_on_sled() {
    let mut d = Deployment::new(Options::default());
    d.start("policy").await;
    follows_in_order_exactly_once(d).await;
}

#[tokio::test]
async fn audit_tail_follow_prints_each_new_decision_once_in_order_on_postgres() {
    let Some(c) = TestCluster::start_or_skip().unwrap_or_else(|e| panic!("PostgreSQL: {e}")) else {
        return;
    };
    c.create_db("warden")
        .unwrap_or_else(|e| panic!("createdb: {e}"));
    let mut d = Deployment::new(Options {
        sets: vec![
            ("policy".into(), "store.backend=\"postgres\"".into()),
            ("policy".into(), format!("store.url={:?}", c.url("warden"))),
        ],
        ..Options::default()
    });
    d.start("policy").await;
    follows_in_order_exactly_once(d).await;
}
