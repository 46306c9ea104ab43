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
    /// Copy the tasks of the sled store under daemon.state_dir into the PostgreSQL database
    /// [store] names (backend = "postgres"), check each reads back the same, and exit. Run with
    /// the gateway stopped; running it again rewrites the same rows.
    #[arg(long)]
    import_sled: bool,
}

fn main() {
    let cli = Cli::parse();
    if cli.import_sled {
        std::process::exit(import(&cli.daemon));
    }
    warden_daemon::start::<warden_gateway::daemon::GatewayDaemon>(cli.daemon);
}

fn import(args: &warden_daemon::DaemonArgs) -> i32 {
    let cfg = match warden_gateway::daemon::load_config(args) {
        Ok(l) => l.value,
        Err(e) => warden_daemon::args::fail("warden-gateway", &e),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => warden_daemon::args::fail("warden-gateway", &e),
    };
    match rt.block_on(warden_gateway::daemon::import_sled(&cfg)) {
        Ok(i) => {
            println!(
                "warden-gateway: imported the task store into {}: {} tasks, {} contexts, {} push configs",
                cfg.store.database().describe(),
                i.tasks,
                i.contexts,
                i.push_configs
            );
            0
        }
        Err(e) => warden_daemon::args::fail("warden-gateway", &e),
    }
}
