//! `warden status`: each daemon's gRPC health, read from its socket, and for a healthy gateway
//! its push notification deliveries (failures included) from its `AdminService.Status`.

use crate::layout::{DAEMONS, DAEMONS_WITH_APPROVER, Layout};

/// Prints one line per daemon; returns true when all are healthy.
pub async fn run(layout: &Layout) -> bool {
    if layout.deployed {
        return run_deployed(layout).await;
    }
    let mut all = true;
    // The approver only where one was started on this state directory (`warden up --approver`).
    let with_approver = layout.socket_of("approver").exists();
    let daemons: &[&str] = if with_approver {
        &DAEMONS_WITH_APPROVER
    } else {
        &DAEMONS
    };
    for d in daemons {
        let socket = layout.socket_of(d);
        let ok = warden_daemon::client::healthy(&socket).await;
        all &= ok;
        println!(
            "warden-{:<10} {:<8} {}",
            d,
            if ok { "healthy" } else { "DOWN" },
            socket.display()
        );
        if *d == "gateway"
            && ok
            && let Some(line) = gateway_push(&socket).await
        {
            println!("  {}", warden_terminal_text::Inline(&line));
        }
    }
    all
}

/// The deployed host: what an operator (`warden-operators`) may reach. The policy and the
/// approver answer on their admin sockets; the gateway on its own. The supervisor's socket
/// admits warden-gateway alone, so its health is what the gateway reports of it: the gateway's
/// Status carries it.
async fn run_deployed(layout: &Layout) -> bool {
    let mut all = true;
    let mut probes = vec![
        ("policy", layout.policy_admin_socket()),
        ("gateway", layout.socket_of("gateway")),
    ];
    if layout.socket_of("approver").exists() {
        probes.insert(1, ("approver", layout.approver_admin_socket()));
    }
    for (d, socket) in probes {
        let ok = warden_daemon::client::healthy(&socket).await;
        all &= ok;
        println!(
            "warden-{:<10} {:<8} {}",
            d,
            if ok { "healthy" } else { "DOWN" },
            socket.display()
        );
    }
    println!(
        "warden-{:<10} {:<8} {} (admits warden-gateway only)",
        "supervisor",
        "-",
        layout.socket_of("supervisor").display()
    );
    all
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
