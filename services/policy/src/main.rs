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
    /// Copy the audit log of the sled store under daemon.state_dir into the PostgreSQL
    /// database [store] names (backend = "postgres"), check every record arrived, and exit.
    /// Run with the daemon stopped; running it again copies nothing twice.
    #[arg(long)]
    import_sled: bool,
}

fn main() {
    let cli = Cli::parse();
    if cli.import_sled {
        std::process::exit(import(&cli.daemon));
    }
    warden_daemon::start::<warden_policy::PolicyDaemon>(cli.daemon);
}

fn import(args: &warden_daemon::DaemonArgs) -> i32 {
    let sources = warden_policy::config::Sources {
        file: args.config.clone(),
        sets: args.set.clone(),
    };
    let cfg = match sources.load() {
        Ok(l) => l.value,
        Err(e) => warden_daemon::args::fail("warden-policy", &e),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => warden_daemon::args::fail("warden-policy", &e),
    };
    match rt.block_on(warden_policy::import_sled(&cfg)) {
        Ok(i) => {
            println!(
                "warden-policy: imported the audit log into {}: {} records, {} new, {} already there",
                cfg.store.describe(),
                i.records,
                i.inserted,
                (i.records as u64).saturating_sub(i.inserted)
            );
            0
        }
        Err(e) => warden_daemon::args::fail("warden-policy", &e),
    }
}
