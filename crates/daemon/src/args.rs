//! Command-line flags every daemon accepts.

use std::path::PathBuf;

/// Flags shared by `warden-gateway`, `warden-supervisor` and `warden-policy`.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Configuration file (TOML). Without it the daemon runs on its embedded default.
    #[arg(long, short = 'c', env = "WARDEN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set daemon.state_dir=/var/lib/warden`. Repeatable;
    /// applied after the file and the environment.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Log format: human or json (overrides `daemon.log_format`).
    #[arg(long, env = "WARDEN_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Check the configuration, print the result, and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Ask the daemon running on this configuration for its gRPC health (grpc.health.v1 on its
    /// own Unix socket) and exit 0 when it is SERVING, 1 otherwise: a container's exec probe.
    #[arg(long, conflicts_with = "check_config")]
    pub health: bool,
}

/// Answers `--health` for `daemon` at `socket` (its own gRPC Unix socket, or None when the
/// configuration names none): prints SERVING and returns, or says why not and exits with
/// status 1. Bounded at 5 s, so a hung daemon fails its probe rather than holding it. For a
/// binary without a runtime; [`health_async`] inside one.
pub fn health(daemon: &str, socket: Option<&std::path::Path>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(daemon, &e),
    };
    rt.block_on(health_async(daemon, socket));
}

/// [`health`] on the caller's runtime.
pub async fn health_async(daemon: &str, socket: Option<&std::path::Path>) {
    let Some(socket) = socket else {
        eprintln!("{daemon}: not serving: the configuration names no gRPC Unix socket to ask");
        std::process::exit(1)
    };
    let serving = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        crate::client::healthy(socket),
    )
    .await
    .unwrap_or(false);
    if serving {
        println!("{daemon}: SERVING at {}", socket.display());
    } else {
        eprintln!("{daemon}: not serving at {}", socket.display());
        std::process::exit(1)
    }
}

/// Prints a fatal start-up error clearly (the error and its causes on one line, no backtrace;
/// a TOML syntax error keeps its caret diagram below it) and exits with status 2. Binaries call this instead of panicking or returning `Err` from `main`.
pub fn fail(daemon: &str, err: &dyn std::error::Error) -> ! {
    let mut line = format!("{daemon}: error: {err}");
    let mut source = err.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !line.contains(&s_text) {
            line.push_str(": ");
            line.push_str(&s_text);
        }
        source = s.source();
    }
    eprintln!("{line}");
    std::process::exit(2)
}
