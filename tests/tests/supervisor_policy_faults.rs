//! Supervisor end to end against a misbehaving PolicyService: a policy that answers too late,
//! names an option that was not offered, or answers without a reason. Each is a DENY with reason
//! `policy_unavailable` (fail closed), and the agent still gets an id it offered.
//!
//! The misbehaving policies are real gRPC servers implementing the contract badly, on a Unix
//! socket, as an operator's third implementation could.

mod supervisor_support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use supervisor_support::*;
use tonic::{Request, Response, Status};
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_server::{PolicyService, PolicyServiceServer};

#[derive(Clone, Copy)]
enum Bad {
    Slow,
    UnofferedOption,
    NoReason,
}

struct BadPolicy(Bad);

#[tonic::async_trait]
impl PolicyService for BadPolicy {
    async fn decide(
        &self,
        req: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        let ok = pb::Decision {
            decision_id: format!("bad-{}", req.get_ref().request_id),
            verdict: pb::Verdict::Allow as i32,
            option_id: None,
            reason: "allowed".into(),
            rule: "bad.rule".into(),
            end_turn: false,
            end_turn_reason: 0,
        };
        Ok(Response::new(match self.0 {
            Bad::Slow => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                ok
            }
            Bad::UnofferedOption => pb::Decision {
                option_id: Some("allow-with-updates-invented".into()),
                ..ok
            },
            Bad::NoReason => pb::Decision {
                reason: String::new(),
                ..ok
            },
        }))
    }
}

async fn serve_bad(bad: Bad, name: &str) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let dir = parent().join(format!("bad-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("p.sock");
    let _ = std::fs::remove_file(&sock);
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    let h = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PolicyServiceServer::new(BadPolicy(bad)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
            .await;
    });
    (sock, h)
}

#[tokio::test(flavor = "multi_thread")]
async fn late_invented_or_reasonless_decisions_fail_closed() {
    for (bad, name) in [
        (Bad::Slow, "slow"),
        (Bad::UnofferedOption, "invented"),
        (Bad::NoReason, "noreason"),
    ] {
        let (sock, h) = serve_bad(bad, name).await;
        let d = deploy_without_policy(&[(
            "supervisor",
            &format!("policy.socket=\"{}\"", sock.display()),
        )])
        .await;
        let mut c = client(&d);
        let text = scenario(json!({"report": "perm.jsonl",
            "steps": [{"type": "tool", "kind": "execute", "command": "echo ran > ran.txt"}]}));
        let evs = run(&mut c, turn(name, "t1", &text)).await;
        let s = stop(&evs);
        assert_eq!(s.refusals.len(), 1, "{name}: {evs:#?}");
        assert_eq!(s.refusals[0].rule, "policy_unavailable", "{name}");
        let p = &permissions(&evs)[0];
        assert_eq!(p.verdict, pb::Verdict::Deny as i32, "{name}");
        assert_eq!(p.option_id_sent, "reject", "{name}");
        if let Bad::Slow = bad {
            assert!(
                p.policy_latency_micros < 1_000_000,
                "the 200 ms deadline held: {p:?}"
            );
        }
        let info = c
            .open_conversation(open(name, pb::Profile::WorkspaceWrite))
            .await
            .unwrap()
            .into_inner();
        assert!(
            !PathBuf::from(info.root).join("ran.txt").exists(),
            "{name}: ran"
        );
        let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
        assert_eq!(st.details["policy_failures"], "1", "{name}: counted");
        h.abort();
    }
}
