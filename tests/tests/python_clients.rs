//! Operators' own gRPC tools against the admin sockets, with Python's grpcio (gRPC C-core): the
//! example client shipped in `deploy/examples/admin_client.py` (stubs generated at run time into a
//! temporary directory by grpcio-tools), and server reflection as a generic client uses it
//! (`tests/grpc/reflection_check.py`, grpcio-reflection: no .proto files). Also what C-core does
//! without `grpc.default_authority`: its %-encoded socket path as `:authority` is refused by the
//! daemons' HTTP/2 layer (h2), which deploy/README.md documents.
//!
//! grpcio, grpcio-tools and grpcio-reflection come from `.ci/requirements.txt`; without them the
//! test fails in CI and says it skipped elsewhere.

use std::path::Path;
use std::process::Command;

use warden_e2e::{Deployment, Options};
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_proto::v1::{
    Boundary, DecideRequest, Location, PermissionOption, Profile, Subject, ToolCall, Verdict,
};

fn python_has_grpc() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, grpc_reflection"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn python(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("python3")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python3 {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[tokio::test]
async fn the_python_admin_client_and_reflection_work_on_the_admin_sockets() {
    if let Err(why) = python_has_grpc() {
        if std::env::var_os("CI").is_some() {
            panic!("grpcio/grpcio-tools/grpcio-reflection missing in CI: {why}");
        }
        eprintln!("SKIPPED python_clients: {why}");
        return;
    }
    let mut d = Deployment::new(Options::default());
    d.start("policy").await;
    let root = d.dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let decision = PolicyServiceClient::new(d.channel("policy"))
        .decide(DecideRequest {
            request_id: "req-py".into(),
            subject: Some(Subject {
                principal: "alice".into(),
                context_id: "ctx-py".into(),
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
                id: "call-1".into(),
                kind: "edit".into(),
                title: "Write py.txt".into(),
                raw_input_json: "{}".into(),
                locations: vec![Location {
                    path: root.join("py.txt").to_string_lossy().into(),
                    line: None,
                }],
            }),
            options: vec![PermissionOption {
                id: "allow-once".into(),
                name: "Allow".into(),
                kind: "allow_once".into(),
            }],
            current_mode: "default".into(),
            deadline_unix_ms: 0,
            return_escalations: false,
        })
        .await
        .expect("decide")
        .into_inner();
    assert_eq!(decision.verdict(), Verdict::Allow);

    let admin = d.layout.policy_admin_socket();
    let admin = admin.to_str().expect("utf-8 socket path");
    let client = repo().join("deploy/examples/admin_client.py");
    let client = client.to_str().expect("path");
    let protos = repo().join("proto");
    let protos = protos.to_str().expect("path");

    let (ok, out, err) = python(&[client, "--socket", admin, "--proto-dir", protos, "status"]);
    assert!(
        ok && out.starts_with("warden-policy "),
        "status: {out}{err}"
    );
    let (ok, out, err) = python(&[client, "--socket", admin, "--proto-dir", protos, "audit"]);
    assert!(
        ok && out.contains(&decision.decision_id) && out.contains("VERDICT_ALLOW"),
        "audit: {out}{err}"
    );
    // A socket nobody listens on: a clear error and a failure exit, not a traceback.
    let gone = d.dir.path().join("gone.sock");
    let (ok, _, err) = python(&[
        client,
        "--socket",
        gone.to_str().expect("path"),
        "--proto-dir",
        protos,
        "status",
    ]);
    assert!(!ok && err.contains("UNAVAILABLE"), "{err}");

    let check = repo().join("tests/grpc/reflection_check.py");
    let (ok, out, err) = python(&[check.to_str().expect("path"), admin]);
    assert!(ok, "reflection: {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("reflection JSON");
    let services: Vec<&str> = v["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert!(services.contains(&"warden.v1.AdminService"), "{v}");
    assert!(services.contains(&"grpc.health.v1.Health"), "{v}");
    // Only what this socket serves: Decide is on the other one.
    assert!(!services.contains(&"warden.v1.PolicyService"), "{v}");
    assert_eq!(
        v["methods"]["warden.v1.AdminService"],
        serde_json::json!(["Status", "AuditQuery", "Reload", "AuditFollow"])
    );
    assert_eq!(v["status"]["daemon"], "warden-policy", "{v}");
    // C-core's own :authority for a unix: target is refused by h2 before warden sees the call.
    assert_eq!(v["without_authority"], "INTERNAL", "{v}");
}
