//! `warden status`: each daemon's gRPC health, read from its socket.

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
