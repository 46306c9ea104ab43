//! `warden status`: each daemon's gRPC health, read from its socket.

use crate::layout::{DAEMONS, Layout};

/// Prints one line per daemon; returns true when all are healthy.
pub async fn run(layout: &Layout) -> bool {
    let mut all = true;
    for d in DAEMONS {
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
