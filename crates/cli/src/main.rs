//! `warden`: the operator's and the caller's command line.
//!
//! Owns: argument parsing and exit codes; the work lives in the `warden_cli` library.

use warden_cli::{audit, layout, status, up};

mod send;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "warden",
    version,
    about = "Hand work to coding agents; every action judged by a separate authority"
)]
struct Cli {
    /// State directory of the local deployment (default: $XDG_STATE_HOME/warden or ~/.local/state/warden).
    #[arg(long, global = true, env = "WARDEN_STATE_DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start warden-policy, warden-supervisor and warden-gateway as separate processes.
    Up {
        /// Where the gateway serves A2A over HTTP.
        #[arg(long, default_value = "127.0.0.1:7420")]
        http: String,
        /// Directory holding the warden-* daemon binaries (default: next to this executable).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Daemon log format: human or json.
        #[arg(long, default_value = "human")]
        log_format: String,
        /// Seconds each daemon has to report healthy.
        #[arg(long, default_value_t = 10)]
        start_timeout: u64,
    },
    /// Report each daemon's health; exits non-zero if any is down.
    Status,
    /// Send one task to the running gateway and watch it live; Ctrl-C/SIGTERM cancels it. Exits 0
    /// when it COMPLETED with every permission allowed, 4 when a permission was refused.
    #[command(after_help = send::EXIT_CODES)]
    Send {
        /// The configured agent to run (default: the gateway's default agent).
        #[arg(long)]
        agent: Option<String>,
        /// Continue this A2A context (conversation) instead of starting a new one.
        #[arg(long)]
        context: Option<String>,
        /// What to ask the agent.
        text: String,
    },
    /// Report which containment features this host offers (cgroups, bubblewrap, namespaces,
    /// landlock) and what warden falls back to where one is missing.
    Doctor,
    /// Read the policy service's audit log.
    Audit {
        #[command(subcommand)]
        what: AuditCommand,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// The newest decisions, newest first.
    Tail {
        /// How many records.
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: u32,
        /// Only this context's decisions.
        #[arg(long)]
        context: Option<String>,
    },
    /// One decision in full.
    Show { decision_id: String },
}

fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("."))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let layout = layout::resolve(cli.state_dir.as_deref());
    match cli.command {
        Command::Up {
            http,
            bin_dir,
            log_format,
            start_timeout,
        } => {
            let opts = up::UpOptions {
                layout,
                bin_dir: bin_dir.unwrap_or_else(exe_dir),
                http,
                log_format,
                start_timeout: Duration::from_secs(start_timeout),
            };
            match up::run(opts).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden up: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Audit { what } => {
            let socket = layout.policy_admin_socket();
            let result = match what {
                AuditCommand::Tail { limit, context } => audit::query(
                    &socket,
                    warden_proto::v1::AuditQueryRequest {
                        limit,
                        decision_id: String::new(),
                        context_id: context.unwrap_or_default(),
                    },
                )
                .await
                .map(|recs| {
                    for r in &recs {
                        println!("{}", audit::line(r));
                    }
                }),
                AuditCommand::Show { decision_id } => audit::show(&socket, &decision_id)
                    .await
                    .map(|r| println!("{}", audit::detail(&r))),
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden audit: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Doctor => {
            let features = warden_sandbox::host_features();
            println!("{features}");
            if let Ok(warden_sandbox::IdentityPlan::Switch(who)) = &features.agent_identity {
                // The agent uid must search its way down to its roots and homes under the
                // state directory (bubblewrap resolves them as the agent).
                let existing = layout.root.ancestors().find(|a| a.exists());
                match existing.and_then(|e| warden_sandbox::first_unsearchable(e, *who)) {
                    None => println!(
                        "  state directory:    {} is reachable by uid {}",
                        layout.root.display(),
                        who.uid
                    ),
                    Some(b) => println!(
                        "  state directory:    {} is NOT reachable by uid {}: {} blocks it \
                         (the supervisor refuses to start; chmod o+x it or pick another --state-dir)",
                        layout.root.display(),
                        who.uid,
                        b.display()
                    ),
                }
            }
            let bins = exe_dir();
            println!("binaries in {}:", bins.display());
            for b in [
                "warden-policy",
                "warden-supervisor",
                "warden-gateway",
                "warden-scripted-agent",
            ] {
                let found = bins.join(b).is_file();
                println!("  {b:<22} {}", if found { "found" } else { "MISSING" });
            }
            ExitCode::SUCCESS
        }
        Command::Send {
            agent,
            context,
            text,
        } => {
            send::run(
                &layout,
                send::SendArgs {
                    agent,
                    context,
                    text,
                },
            )
            .await
        }
        Command::Status => {
            if status::run(&layout).await {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
