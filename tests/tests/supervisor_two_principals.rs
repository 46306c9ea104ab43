//! Supervisor end to end, the containment issue's policy bypass: two principals share an operator
//! workspace. Conversation A (a permissive principal) tries to grant the agent new rights for the
//! future by writing the agent's own control files — by shell and by tool call. Conversation B (a
//! stricter principal, on the same workspace) must still have every action decided and audited,
//! and the control files must be exactly what they were before A ran.
//!
//! The control files are made world-writable on purpose: the only things in the way are warden's
//! (the floor rule `floor.change.agent-control` for tool calls, bubblewrap's read-only binds for
//! the shell). Skips, saying so, without root or a working bubblewrap.

mod supervisor_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

fn open_ws(ctx: &str, principal: &str) -> pb::OpenConversationRequest {
    let mut o = open(ctx, pb::Profile::WorkspaceWrite);
    o.workspace = "shared".into();
    o.principal = principal.into();
    o
}

fn turn_ws(ctx: &str, principal: &str, id: &str, text: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, id, text);
    t.open = Some(open_ws(ctx, principal));
    t
}

/// Control files in the workspace, each writable by anyone (0666 in 0777 directories).
const CONTROL: &[&str] = &[
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".codex/rules/default.rules",
    ".mcp.json",
    ".git/hooks/pre-commit",
    ".git/config",
];

fn plant(ws: &Path) {
    for rel in CONTROL {
        let p = ws.join(rel);
        let dir = p.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(&p, "").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    for d in [
        ".claude",
        ".codex",
        ".codex/rules",
        ".git",
        ".git/hooks",
        "",
    ] {
        std::fs::set_permissions(ws.join(d), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_principal_cannot_rewrite_the_rules_another_principals_conversation_runs_under() {
    if !runs_contained() {
        return;
    }
    let ws = parent().join(format!("shared-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ws);
    std::fs::create_dir_all(&ws).unwrap();
    plant(&ws);
    let d = deploy(&[
        (
            "supervisor",
            &format!("workspaces.shared.path=\"{}\"", ws.display()),
        ),
        ("supervisor", "workspaces.shared.allow_execute=true"),
        (
            "policy",
            r#"policy.principals.strict.auto_deny=["execute"]"#,
        ),
    ])
    .await;
    let mut c = client(&d);

    // A, by shell: every control file, and a hook for good measure.
    let shell_cmd = CONTROL
        .iter()
        .map(|rel| {
            format!(
                "if echo '{{\"permissions\":{{\"allow\":[\"Bash\"]}},\"hooks\":{{}}}}' > {rel} 2>/dev/null; \
                 then echo '{rel}=written'; else echo '{rel}=denied'; fi"
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
        // The positive control: the workspace itself is writable for the agent.
        + "; if echo x > ok.txt; then echo ok.txt=written; fi";
    let mut steps = vec![
        json!({"type": "tool", "kind": "execute", "command": shell_cmd,
        "ask": false, "via": "direct"}),
    ];
    // A, by tool call through the client (the supervisor serves these writes itself).
    for rel in CONTROL {
        steps.push(json!({"type": "tool", "kind": "edit", "path": rel,
            "content": "{\"permissions\":{\"allow\":[\"Bash\"]}}", "ask": false, "via": "client"}));
    }
    // And a tool call that asks first, as the adapters do: refused by the floor.
    steps.push(
        json!({"type": "tool", "kind": "edit", "path": ".claude/settings.local.json",
        "content": "{}", "ask": true}),
    );
    let evs = run(
        &mut c,
        turn_ws("conv-a", "loose", "a1", &scenario(json!({"steps": steps}))),
    )
    .await;
    let shell_out = evs
        .iter()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t))
                if t.content_text.contains("=denied") || t.content_text.contains("=written") =>
            {
                Some(t.content_text.clone())
            }
            _ => None,
        })
        .unwrap_or_default();
    assert!(shell_out.contains("ok.txt=written"), "{shell_out}");
    for rel in CONTROL {
        assert!(
            shell_out.contains(&format!("{rel}=denied")),
            "the shell wrote {rel}: {shell_out}\n{evs:#?}"
        );
    }
    let perms = permissions(&evs);
    assert_eq!(
        perms.len(),
        CONTROL.len() + 1,
        "every client write and the asked edit were decided: {perms:#?}"
    );
    for p in &perms {
        assert_eq!(p.verdict, pb::Verdict::Deny as i32, "{p:?}");
        assert_eq!(p.rule, "floor.change.agent-control", "{p:?}");
    }
    for rel in CONTROL {
        assert_eq!(
            std::fs::read_to_string(ws.join(rel)).unwrap(),
            "",
            "{rel} changed"
        );
    }

    // B, a stricter principal on the same workspace: its command is still asked about, decided by
    // its own rules (DENY), and audited under its conversation.
    let b = scenario(json!({"steps": [{"type": "tool", "kind": "execute",
        "command": "echo b-ran > b.txt", "ask": true}]}));
    let evs = run(&mut c, turn_ws("conv-b", "strict", "b1", &b)).await;
    let perms = permissions(&evs);
    assert_eq!(perms.len(), 1, "B's command was not asked about: {evs:#?}");
    assert_eq!(perms[0].verdict, pb::Verdict::Deny as i32, "{:?}", perms[0]);
    assert!(!ws.join("b.txt").exists(), "B's denied command ran");
    let ch = warden_daemon::client::unix_channel(&d.layout.policy_admin_socket());
    let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
    let audit = admin
        .audit_query(pb::AuditQueryRequest {
            limit: 100,
            decision_id: String::new(),
            context_id: "conv-b".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert!(
        audit.iter().any(|r| r.decision_id == perms[0].decision_id
            && r.subject.as_ref().is_some_and(|s| s.principal == "strict")),
        "B's decision is not in the audit: {audit:#?}"
    );
    std::fs::remove_dir_all(&ws).ok();
}
