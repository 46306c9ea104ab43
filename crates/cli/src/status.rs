//! `warden status`: each daemon's gRPC health, read from its socket, and for a healthy gateway
//! its push notification deliveries (failures included) from its `AdminService.Status`.

use crate::layout::{DAEMONS, DAEMONS_WITH_APPROVER, Layout};

/// Prints one line per daemon; returns true when all are healthy.
pub async fn run(layout: &Layout) -> bool {
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
            println!("  {line}");
        }
    }
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
