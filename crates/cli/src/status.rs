//! `warden status`: each daemon's gRPC health, read from its socket, and for a healthy gateway
//! its push notification deliveries (failures included) from its `AdminService.Status`.

use crate::layout::{DAEMONS, DAEMONS_WITH_APPROVER, Layout};

/// One daemon's health as `status` reports it.
struct Health {
    name: &'static str,
    /// None: not reachable from here (the deployed supervisor admits the gateway alone).
    healthy: Option<bool>,
    socket: std::path::PathBuf,
    note: Option<String>,
}

/// Prints one line per daemon (or, with `json`, one JSON document); returns true when all are
/// healthy.
pub async fn run(layout: &Layout, json: bool) -> bool {
    let all = if layout.deployed {
        deployed(layout).await
    } else {
        local(layout).await
    };
    let ok = all.iter().all(|h| h.healthy != Some(false));
    if json {
        let daemons: Vec<serde_json::Value> = all
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": format!("warden-{}", h.name), "healthy": h.healthy,
                    "socket": h.socket.display().to_string(), "note": h.note,
                })
            })
            .collect();
        crate::output::print_doc(&serde_json::json!({
            "stateDirectory": layout.root.display().to_string(),
            "allHealthy": ok,
            "daemons": daemons,
        }));
        return ok;
    }
    for h in &all {
        let state = match h.healthy {
            Some(true) => "healthy",
            Some(false) => "DOWN",
            None => "-",
        };
        println!("warden-{:<10} {:<8} {}", h.name, state, h.socket.display());
        if let Some(n) = &h.note {
            println!("  {}", warden_terminal_text::Inline(n));
        }
    }
    ok
}

async fn local(layout: &Layout) -> Vec<Health> {
    // The approver only where one was started on this state directory (`warden up --approver`).
    let with_approver = layout.socket_of("approver").exists();
    let daemons: &[&'static str] = if with_approver {
        &DAEMONS_WITH_APPROVER
    } else {
        &DAEMONS
    };
    let mut out = Vec::new();
    for d in daemons {
        let socket = layout.socket_of(d);
        let ok = warden_daemon::client::healthy(&socket).await;
        let note = if *d == "gateway" && ok {
            gateway_push(&socket).await
        } else {
            None
        };
        out.push(Health {
            name: d,
            healthy: Some(ok),
            socket,
            note,
        });
    }
    out
}

/// The deployed host: what an operator (`warden-operators`) may reach. The policy and the
/// approver answer on their admin sockets; the gateway on its own. The supervisor's socket
/// admits warden-gateway alone, so its health is what the gateway reports of it: the gateway's
/// Status carries it.
async fn deployed(layout: &Layout) -> Vec<Health> {
    let mut probes = vec![
        ("policy", layout.policy_admin_socket()),
        ("gateway", layout.socket_of("gateway")),
    ];
    if layout.socket_of("approver").exists() {
        probes.insert(1, ("approver", layout.approver_admin_socket()));
    }
    let mut out = Vec::new();
    for (d, socket) in probes {
        let ok = warden_daemon::client::healthy(&socket).await;
        out.push(Health {
            name: d,
            healthy: Some(ok),
            socket,
            note: None,
        });
    }
    out.push(Health {
        name: "supervisor",
        healthy: None,
        socket: layout.socket_of("supervisor"),
        note: Some("admits warden-gateway only".into()),
    });
    out
}

/// The gateway's push delivery counters, when it serves push notifications.
async fn gateway_push(socket: &std::path::Path) -> Option<String> {
    use warden_proto::v1::StatusRequest;
    use warden_proto::v1::admin_service_client::AdminServiceClient;
    let mut c = AdminServiceClient::new(warden_daemon::client::unix_channel(socket));
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        c.status(StatusRequest {}),
    )
    .await
    .ok()?
    .ok()?
    .into_inner();
    let d = &resp.details;
    let delivered = d.get("push_delivered")?;
    let mut line = format!(
        "push notifications: {delivered} delivered, {} retried, {} failed",
        d.get("push_retries").map(String::as_str).unwrap_or("0"),
        d.get("push_failed").map(String::as_str).unwrap_or("0"),
    );
    if let Some(last) = d.get("push_last_failure") {
        line.push_str(&format!("; last failure: {last}"));
    }
    Some(line)
}
