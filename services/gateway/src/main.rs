//! The `warden-gateway` binary: parses the shared daemon flags and runs
//! [`warden_gateway::daemon::run`]. It holds no logic of its own; it never spawns agents and never
//! decides permissions.

use clap::Parser;

/// warden-gateway: A2A 1.0 for callers, mapped onto warden-supervisor conversations.
#[derive(Debug, Parser)]
#[command(name = "warden-gateway", version)]
struct Cli {
    #[command(flatten)]
    daemon: warden_daemon::DaemonArgs,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = warden_gateway::daemon::run(cli.daemon).await {
        warden_daemon::args::fail("warden-gateway", &e);
    }
}
