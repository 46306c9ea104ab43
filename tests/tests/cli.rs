//! The operator's commands against a running deployment: `warden audit` reads what the policy
//! service decided, `warden doctor` reports the host's containment features.

use std::time::Duration;

use warden_e2e::{Deployment, Options, binary, run_with_deadline};
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_proto::v1::{
    Boundary, DecideRequest, Location, PermissionOption, Profile, Subject, ToolCall, Verdict,
};

async fn warden(d: &Deployment, args: &[&str]) -> (bool, String, String) {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut c = tokio::process::Command::new(binary("warden"));
    c.args(["--state-dir", &state]).args(args);
    let out = run_with_deadline(&mut c, Duration::from_secs(30))
        .await
        .expect("warden runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn warden_audit_shows_each_decision_the_policy_made() {
    let mut d = Deployment::new(Options::default());
    d.start("policy").await;
    let root = d.dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut client = PolicyServiceClient::new(d.channel("policy"));
    let ask = |path: &str, ctx: &str| DecideRequest {
        request_id: format!("req-{ctx}"),
        subject: Some(Subject {
            principal: "alice".into(),
            context_id: ctx.into(),
            task_id: "t1".into(),
            session_id: "s1".into(),
            agent: "scripted".into(),
            verb: "implement".into(),
        }),
        boundary: Some(Boundary {
            root: root.to_string_lossy().into(),
            owned: true,
            allow_execute: false,
            profile: Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(ToolCall {
            id: "call-1".into(),
            kind: "edit".into(),
            title: format!("Write {path}"),
            raw_input_json: "{}".into(),
            locations: vec![Location {
                path: path.into(),
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
    };
    let inside = client
        .decide(ask(&root.join("hello.txt").to_string_lossy(), "ctx-in"))
        .await
        .unwrap()
        .into_inner();
    let outside = client
        .decide(ask("/etc/passwd", "ctx-out"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(inside.verdict(), Verdict::Allow);
    assert_eq!(outside.verdict(), Verdict::Deny);

    let (ok, out, err) = warden(&d, &["audit", "tail"]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // Newest first.
    assert!(
        lines[0].contains("DENY") && lines[0].contains(&outside.decision_id),
        "{out}"
    );
    assert!(
        lines[1].contains("ALLOW") && lines[1].contains(&inside.decision_id),
        "{out}"
    );

    let (ok, out, _) = warden(&d, &["audit", "tail", "--context", "ctx-in"]).await;
    assert!(ok);
    assert_eq!(out.lines().count(), 1, "{out}");

    let (ok, out, err) = warden(&d, &["audit", "show", &outside.decision_id]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&outside.rule), "{out}");
    assert!(
        out.contains("/etc/passwd") || out.contains("Write /etc/passwd"),
        "{out}"
    );
    assert!(out.contains("alice"), "{out}");

    let (ok, _, err) = warden(&d, &["audit", "show", "no-such-decision"]).await;
    assert!(!ok);
    assert!(err.contains("no-such-decision"), "{err}");
}

#[tokio::test]
async fn warden_audit_without_a_running_policy_says_it_cannot_connect() {
    let d = Deployment::new(Options::default());
    let (ok, _, err) = warden(&d, &["audit", "tail"]).await;
    assert!(!ok);
    assert!(err.contains("policy-admin.sock"), "{err}");
}

#[tokio::test]
async fn warden_doctor_reports_containment_features_and_binaries() {
    let d = Deployment::new(Options::default());
    let (ok, out, err) = warden(&d, &["doctor"]).await;
    assert!(ok, "{err}");
    for needle in [
        "cgroup v2",
        "bubblewrap",
        "user namespaces",
        "landlock",
        "warden-supervisor",
    ] {
        assert!(out.contains(needle), "doctor output lacks {needle}: {out}");
    }
    assert!(!out.contains("MISSING"), "{out}");
}
