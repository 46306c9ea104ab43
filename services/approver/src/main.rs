//! The `warden-approver` binary: parses the shared daemon flags and runs [`warden_approver::run`].
//! It must never decide anything itself; all logic lives in the library.

#![forbid(unsafe_code)]

use clap::Parser;

/// warden-approver: people decide what the policy escalates.
#[derive(Debug, Parser)]
#[command(name = "warden-approver", version)]
struct Cli {
    #[command(flatten)]
    daemon: warden_daemon::DaemonArgs,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = warden_approver::run(cli.daemon).await {
        warden_daemon::args::fail("warden-approver", &e);
    }
}
