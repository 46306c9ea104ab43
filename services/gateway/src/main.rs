//! The `warden-gateway` binary: parses the shared daemon flags and runs
//! [`warden_gateway::daemon::GatewayDaemon`]. It holds no logic of its own; it never spawns agents and never
//! decides permissions.

#![forbid(unsafe_code)]

use clap::Parser;

/// warden-gateway: A2A 1.0 for callers, mapped onto warden-supervisor conversations.
#[derive(Debug, Parser)]
#[command(name = "warden-gateway", version)]
struct Cli {
    #[command(flatten)]
    daemon: warden_daemon::DaemonArgs,
}

fn main() {
    warden_daemon::start::<warden_gateway::daemon::GatewayDaemon>(Cli::parse().daemon);
}
