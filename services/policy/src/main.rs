//! The `warden-policy` binary: parses the shared daemon flags and starts
//! [`warden_policy::PolicyDaemon`].
//! It must never decide anything itself; all logic lives in the library.

#![forbid(unsafe_code)]

use clap::Parser;

/// warden-policy: decides agents' permission requests and keeps the audit log.
#[derive(Debug, Parser)]
#[command(name = "warden-policy", version)]
struct Cli {
    #[command(flatten)]
    daemon: warden_daemon::DaemonArgs,
}

fn main() {
    warden_daemon::start::<warden_policy::PolicyDaemon>(Cli::parse().daemon);
}
