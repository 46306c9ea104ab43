//! Spawn to first event for each installed real adapter, printed (not asserted): through the
//! real policy and supervisor, each adapter against its fake model server on loopback
//! (`tests/fake_models/`), a new conversation per sample. For each adapter it prints the time
//! to `TurnStarted` (spawn, `initialize`, authentication, `session/new`, the supervised mode) and
//! to the agent's first text, cold (the first start on a fresh deployment: Node, the adapter and
//! its Codex, Claude Code, Gemini CLI or Qwen Code loaded from disk for the first time in this run, npm never involved:
//! the adapters are installed, not fetched) and warm (the median of the following starts).
//!
//! Run: `cargo bench -p warden-e2e --bench real_adapters` after `.ci/run` installed the adapters
//! (missing ones are listed and skipped). `WARDEN_BENCH_SAMPLES=5` sets the warm samples.

use std::time::{Duration, Instant};

use warden_e2e::real::{self, FakeModel, Pinned};
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;

/// (name in the table, adapter, agent entry, extra supervisor settings).
fn adapters() -> Vec<(&'static str, Pinned, &'static str, Vec<String>)> {
    vec![
        (
            "claude-code-acp 0.16.2",
            real::CLAUDE_CODE_ACP,
            "claude-code",
            vec![],
        ),
        (
            "claude-agent-acp 0.101.0",
            real::CLAUDE_AGENT_ACP,
            "claude",
            vec![],
        ),
        (
            "codex-acp 0.16.0",
            real::CODEX_ACP_016,
            "codex-016",
            vec![
                format!(
                    "agents.codex-016.codex_config={:?}",
                    warden_sandbox::CODEX_CONFIG_UNTRUSTED
                ),
                format!(
                    "agents.codex-016.codex_requirements={:?}",
                    warden_sandbox::CODEX_REQUIREMENTS_UNTRUSTED
                ),
                "agents.codex-016.supervised_mode=\"\"".into(),
            ],
        ),
        ("codex-acp 2.6.0", real::CODEX_ACP_26, "codex", vec![]),
        ("gemini-cli 0.61.0", real::GEMINI_CLI, "gemini", vec![]),
        ("qwen-code 0.24.4", real::QWEN_CODE, "qwen", vec![]),
        ("opencode 1.18.33", real::OPENCODE, "opencode", vec![]),
    ]
}

/// (to TurnStarted, to the first text) of one new conversation.
async fn sample(d: &warden_e2e::Deployment, agent: &str, n: usize) -> (Duration, Duration) {
    let mut c =
        pb::supervisor_service_client::SupervisorServiceClient::new(d.channel("supervisor"));
    let ctx = format!("bench-{agent}-{n}");
    let req = pb::RunTurnRequest {
        context_id: ctx.clone(),
        turn_id: "t1".into(),
        text: r#"SCRIPT {"steps": [], "final": "first words"}"#.into(),
        instructions: String::new(),
        message_id: "m1".into(),
        task_id: "t1".into(),
        timeout_seconds: 120,
        open: Some(pb::OpenConversationRequest {
            context_id: ctx.clone(),
            agent: agent.into(),
            workspace: String::new(),
            profile: pb::Profile::WorkspaceWrite as i32,
            principal: "bench".into(),
            verb: "task".into(),
            ..Default::default()
        }),
        groups: Vec::new(),
        issuer: String::new(),
    };
    let t0 = Instant::now();
    let mut s = c.run_turn(req).await.expect("RunTurn").into_inner();
    let (mut started, mut text) = (None, None);
    while let Ok(Some(ev)) = s.message().await {
        match ev.event {
            Some(Event::Started(_)) if started.is_none() => started = Some(t0.elapsed()),
            Some(Event::MessageChunk(_)) if text.is_none() => text = Some(t0.elapsed()),
            Some(Event::Stop(_)) => break,
            _ => {}
        }
    }
    let _ = c
        .close_conversation(pb::CloseConversationRequest {
            context_id: ctx,
            ..Default::default()
        })
        .await;
    (
        started.unwrap_or(Duration::MAX),
        text.unwrap_or(Duration::MAX),
    )
}

fn ms(d: Duration) -> String {
    if d == Duration::MAX {
        "-".into()
    } else {
        format!("{:.0}", d.as_secs_f64() * 1000.0)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or(Duration::MAX)
}

#[tokio::main]
async fn main() {
    warden_e2e::use_release_binaries_in_benches(&[
        "warden-policy",
        "warden-supervisor",
        "warden-fs-servant",
        "warden-gateway",
        "warden-cli",
    ]);
    let samples: usize = std::env::var("WARDEN_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut rows = Vec::new();
    for (name, p, agent, extra) in adapters() {
        if real::installed(p).is_none() {
            rows.push(format!("| {name} | not installed | | | |"));
            continue;
        }
        let d = real::deployment();
        let model = FakeModel::start(p.model, d.dir.path()).await;
        let mut sets = real::agent_sets(agent, p, &model);
        sets.extend(extra.into_iter().map(|kv| ("supervisor".to_string(), kv)));
        let d = real::deploy(d, sets).await;
        let (cold_start, cold_text) = sample(&d, agent, 0).await;
        let mut warm_start = Vec::new();
        let mut warm_text = Vec::new();
        for n in 1..=samples {
            let (s, t) = sample(&d, agent, n).await;
            warm_start.push(s);
            warm_text.push(t);
        }
        rows.push(format!(
            "| {name} | {} | {} | {} | {} |",
            ms(cold_start),
            ms(cold_text),
            ms(median(warm_start)),
            ms(median(warm_text)),
        ));
    }
    println!("\nspawn -> first event, ms (new conversation; warm = median of {samples})\n");
    println!(
        "| adapter | cold: TurnStarted | cold: first text | warm: TurnStarted | warm: first text |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for r in rows {
        println!("{r}");
    }
}
