//! `GetExtendedAgentCard` through the real daemons: the public card announces it; each
//! authenticated principal gets a card whose skills are exactly the agents it may use
//! (`[[agents.access]]`), on JSON-RPC, HTTP+JSON and gRPC alike; without a token there is no
//! extended card; and the access list is enforced, not only shown: a principal cannot start a
//! task on an agent outside its list, by name or by default.

use serde_json::{Value, json};
use tonic::metadata::MetadataValue;
use warden_e2e::{Deployment, Options};
use warden_proto::a2a::v1 as pb;

const ALICE: &str = "alice-token-extended-card-0123456789";
const ALICE_SHA: &str = "5a4b1d39c02400cd73ac3e1ee5fa8811692464da63677d408a1d2c58c16d3c44";
const BOB: &str = "bob-token-extended-card-0123456789";
const BOB_SHA: &str = "a642d253d7013463eef44b0a7d215d132a05e727951fcd580f822401d2a837bc";

async fn rpc(d: &Deployment, token: &str, method: &str, params: Value) -> Value {
    d.a2a_rpc(token, method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn skills(card: &Value) -> Vec<String> {
    card["skills"]
        .as_array()
        .unwrap_or_else(|| panic!("{card}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn each_principal_gets_the_card_of_its_own_agents_and_only_those_run() {
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                format!(
                    r#"auth.tokens=[{{principal="alice", sha256="{ALICE_SHA}"}}, {{principal="bob", sha256="{BOB_SHA}"}}]"#
                ),
            ),
            (
                "gateway".into(),
                r#"agents.access=[{principal="bob", agents=["claude"]}]"#.into(),
            ),
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
            // An agent the card may list must be able to start (one whose adapter is not
            // installed is left off): here "claude" runs the scripted agent's program, the
            // name is what the access rules are about.
            (
                "supervisor".into(),
                format!(
                    "agents.claude.command={:?}",
                    warden_e2e::binary("warden-scripted-agent").display().to_string()
                ),
            ),
        ],
        ..Options::default()
    })
    .await;
    let public = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
        .await
        .unwrap();
    assert_eq!(
        public["capabilities"]["extendedAgentCard"], true,
        "{public}"
    );
    let all = skills(&public);
    assert!(
        all.contains(&"scripted".to_string()) && all.contains(&"claude".to_string()),
        "{all:?}"
    );

    // alice has no entry: every agent, the default tagged so.
    let a = rpc(&d, ALICE, "GetExtendedAgentCard", json!({})).await["result"].clone();
    assert_eq!(skills(&a), all, "{a}");
    let default = a["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["tags"].as_array().unwrap().contains(&json!("default")))
        .map(|s| s["id"].clone());
    assert_eq!(default, Some(json!("scripted")), "{a}");
    assert!(a["description"].as_str().unwrap().contains("alice"), "{a}");
    // bob: only claude, on every binding.
    let b = rpc(&d, BOB, "GetExtendedAgentCard", json!({})).await["result"].clone();
    assert_eq!(skills(&b), ["claude"], "{b}");
    let rest = warden_cli::client::get_json(&d.http, "/a2a/rest/extendedAgentCard", BOB)
        .await
        .unwrap();
    assert_eq!(skills(&rest), ["claude"], "{rest}");
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = warden_proto::a2a::v1::a2a_service_client::A2aServiceClient::new(ch);
    let mut req = tonic::Request::new(pb::GetExtendedAgentCardRequest::default());
    req.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {BOB}")).unwrap(),
    );
    let g = c.get_extended_agent_card(req).await.unwrap().into_inner();
    let ids: Vec<&str> = g.skills.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["claude"]);
    assert!(g.capabilities.unwrap().extended_agent_card.unwrap());
    // No token, a wrong token: no extended card.
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::GET,
        "/a2a/rest/extendedAgentCard",
        "wrong",
        None,
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let e = c
        .get_extended_agent_card(pb::GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // Enforced: bob's default (scripted) and scripted by name are refused; alice runs it.
    let msg = |id: &str, meta: Value| json!({"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": "hi"}], "metadata": meta}});
    let r = rpc(
        &d,
        BOB,
        "SendMessage",
        msg("tck-complete-task-b1", json!({})),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not available to you; yours: claude"),
        "{r}"
    );
    let r = rpc(
        &d,
        BOB,
        "SendMessage",
        msg("tck-complete-task-b2", json!({"agent": "scripted"})),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let listed = rpc(&d, BOB, "ListTasks", json!({})).await;
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    let r = rpc(
        &d,
        ALICE,
        "SendMessage",
        msg("tck-complete-task-a", json!({})),
    )
    .await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
}
