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
