//! The `warden-policy` binary: parses the shared daemon flags and runs [`warden_policy::run`].
//! It must never decide anything itself; all logic lives in the library.

use clap::Parser;

/// warden-policy: decides agents' permission requests and keeps the audit log.
#[derive(Debug, Parser)]
#[command(name = "warden-policy", version)]
struct Cli {
    #[command(flatten)]
    daemon: warden_daemon::DaemonArgs,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = warden_policy::run(cli.daemon).await {
        warden_daemon::args::fail("warden-policy", &e);
    }
}
