//! The `PolicyService` contract kit (`warden_decide::contract`) against the real warden-approver
//! binary: chained to the real warden-policy, and on its own (the floor here, every mutating call
//! escalated). Escalated kit cases wait for a person nobody is, and end as DENY
//! `approval.no-response` at the approver's (short) deadline.

use std::time::Duration;

use warden_decide::contract::{Fixture, KitOptions, check_policy_service};
use warden_e2e::{Deployment, Options};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

fn options(upstream: bool) -> Options {
    let mut sets = vec![(
        "approver".to_string(),
        "approval.deadline_ms=300".to_string(),
    )];
    if !upstream {
        sets.push(("approver".into(), "upstream.socket=\"\"".into()));
    }
    Options {
        sets,
        approver: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn the_approver_chained_to_warden_policy_passes_the_contract_kit() {
    let mut d = Deployment::new(options(true));
    d.start("policy").await;
    d.start("approver").await;
    let fixture = Fixture::new().unwrap_or_else(|e| panic!("fixture: {e}"));
    let violations =
        check_policy_service(d.channel("approver"), &fixture, &KitOptions::default()).await;
    assert!(violations.is_empty(), "{violations:#?}");

    // ALLOW and DENY pass through unchanged: the decision id is the policy's, in its audit.
    let mut client = PolicyServiceClient::new(d.channel("approver"));
    let read = pb::DecideRequest {
        request_id: "pass-through".into(),
        subject: Some(pb::Subject {
            agent: "scripted".into(),
            context_id: "ctx-pass".into(),
            ..Default::default()
        }),
        boundary: Some(pb::Boundary {
            root: fixture.root.display().to_string(),
            owned: true,
            allow_execute: false,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: "c1".into(),
            kind: "read".into(),
            title: "Read src".into(),
            ..Default::default()
        }),
        options: vec![pb::PermissionOption {
            id: "allow-once".into(),
            name: "Yes".into(),
            kind: "allow_once".into(),
        }],
        ..Default::default()
    };
    let got = client
        .decide(read)
        .await
        .unwrap_or_else(|e| panic!("Decide: {e}"))
        .into_inner();
    assert_eq!(got.verdict, pb::Verdict::Allow as i32, "{got:?}");
    let mut admin = AdminServiceClient::new(warden_daemon::client::unix_channel(
        &d.layout.policy_admin_socket(),
    ));
    let recs = admin
        .audit_query(pb::AuditQueryRequest {
            decision_id: got.decision_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("AuditQuery: {e}"))
        .into_inner()
        .records;
    assert_eq!(
        recs.len(),
        1,
        "the policy's own record of {}",
        got.decision_id
    );
    assert_eq!(recs[0].rule, got.rule);
}

#[tokio::test]
async fn the_approver_without_an_upstream_passes_the_contract_kit() {
    let mut d = Deployment::new(options(false));
    d.start("approver").await;
    let fixture = Fixture::new().unwrap_or_else(|e| panic!("fixture: {e}"));
    let violations =
        check_policy_service(d.channel("approver"), &fixture, &KitOptions::default()).await;
    assert!(violations.is_empty(), "{violations:#?}");

    // Without an upstream a mutating call the floor allows waits for a person: here nobody.
    let mut client = PolicyServiceClient::new(d.channel("approver"));
    let edit = pb::DecideRequest {
        request_id: "lonely-edit".into(),
        boundary: Some(pb::Boundary {
            root: fixture.root.display().to_string(),
            owned: true,
            allow_execute: false,
            profile: pb::Profile::WorkspaceWrite as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: "c1".into(),
            kind: "edit".into(),
            title: "Write src/a".into(),
            locations: vec![pb::Location {
                path: "src/a".into(),
                line: None,
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let got = tokio::time::timeout(Duration::from_secs(10), client.decide(edit))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("Decide: {e}"))
        .into_inner();
    assert_eq!(got.verdict, pb::Verdict::Deny as i32, "{got:?}");
    assert_eq!(got.rule, "approval.no-response", "{got:?}");
}
