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
    /// Copy the queue of the sled store under daemon.state_dir (pending and decided requests)
    /// into the PostgreSQL database [store] names (backend = "postgres"), check every request
    /// arrived, and exit. Run with the daemon stopped; running it again copies nothing twice.
    #[arg(long)]
    import_sled: bool,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if cli.import_sled {
        if let Err(e) = warden_approver::import_sled(&cli.daemon).await {
            warden_daemon::args::fail("warden-approver", &e);
        }
        return;
    }
    if let Err(e) = warden_approver::run(cli.daemon).await {
        warden_daemon::args::fail("warden-approver", &e);
    }
}
