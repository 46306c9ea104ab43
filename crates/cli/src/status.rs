//! `warden status`: each daemon's gRPC health, read from its socket.

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
    }
    all
}
