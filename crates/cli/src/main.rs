//! `warden`: the operator's and the caller's command line.
//!
//! Owns: argument parsing and exit codes; the work lives in the `warden_cli` library.

#![forbid(unsafe_code)]

use warden_cli::{approvals, audit, layout, status, up};

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
    /// Use the host installed from the Debian package (deploy/): sockets in /run/warden, as a
    /// member of warden-operators. For status, audit, approvals and doctor (also accepted after
    /// them: `warden doctor --deployed`).
    #[arg(long, conflicts_with = "state_dir")]
    deployed: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start warden-policy, warden-supervisor and warden-gateway as separate processes (and
    /// warden-approver between the supervisor and the policy with --approver).
    Up {
        /// Also run warden-approver: what the policy escalates waits for a person
        /// (`warden approvals`, or the web page).
        #[arg(long)]
        approver: bool,
        /// Where the approver serves its web page (with --approver; "" = no page).
        #[arg(long, default_value = "127.0.0.1:7421")]
        approver_http: String,
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
        /// Configuration directory: policy.toml, supervisor.toml, gateway.toml, approver.toml,
        /// each optional, in the format of deploy/config/ (default: <state>/config when it
        /// exists; `warden init` writes a starter set). The state directory's paths, --http and
        /// --log-format are set over the files.
        #[arg(long, value_name = "DIR")]
        config: Option<PathBuf>,
        /// Serve each daemon's Prometheus metrics over HTTP: the gateway on this IP:PORT, the
        /// supervisor on PORT+1, the policy on PORT+2, the approver on PORT+3 (off by default;
        /// no authentication, so keep it on loopback).
        #[arg(long, value_name = "IP:PORT")]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Write a commented starter configuration for `warden up --config DIR`, one file per
    /// daemon (default DIR: <state>/config). Never overwrites a file.
    Init {
        /// Where to write (default: <state>/config).
        dir: Option<PathBuf>,
    },
    /// Report each daemon's health; exits non-zero if any is down.
    Status {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
    },
    /// A stdio MCP server for hosts that launch tools as processes (`claude mcp add warden --
    /// warden mcp`): relays to the running gateway's /mcp with the caller token from the state
    /// directory. Never talks to the supervisor.
    Mcp,
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
        /// The gateway's URL (default: the one `warden up` wrote in the state directory).
        #[arg(long, env = "WARDEN_GATEWAY_URL")]
        url: Option<String>,
        /// A file holding your bearer token (default: the one `warden up` generated).
        #[arg(long, env = "WARDEN_TOKEN_FILE")]
        token_file: Option<PathBuf>,
        /// Read what to ask from this file instead of the command line.
        #[arg(long, value_name = "PATH", conflicts_with = "text")]
        file: Option<PathBuf>,
        /// What to ask the agent; `-` reads it from standard input.
        #[arg(required_unless_present = "file")]
        text: Option<String>,
    },
    /// Report which containment features this host offers (cgroups, bubblewrap, namespaces,
    /// landlock) and what warden falls back to where one is missing; with an approver running,
    /// compare the supervisor's Decide deadlines with what the approver needs (exit 1 when the
    /// supervisor would wait less).
    #[command(
        after_help = "With --deployed it checks a host installed from the Debian package (or \
                      deploy/): users, groups, socket and state directories, the allowlists \
                      against the users' real ids, who can reach what, bubblewrap and cgroup \
                      delegation; one PASS/FAIL/WARN/SKIP line per check, exit code 0 when \
                      nothing failed, 1 otherwise (warnings do not fail). Run it as root for the \
                      full report."
    )]
    Doctor {
        /// Check the host installed from the Debian package instead of the local deployment.
        #[arg(long)]
        deployed: bool,
        /// The supervisor's socket (default: the local deployment's; on a deploy/ host
        /// /run/warden/supervisor/supervisor.sock).
        #[arg(long)]
        supervisor_socket: Option<PathBuf>,
        /// The approver's admin socket (default: the local deployment's; on a deploy/ host
        /// /run/warden/approver/approver-admin.sock).
        #[arg(long)]
        approver_admin: Option<PathBuf>,
    },
    /// Answer what the policy escalated (warden-approver's admin socket; your uid is recorded).
    #[command(
        after_help = "Exit codes: 0 done, 1 error, 3 no such request, 4 someone answered first."
    )]
    Approvals {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
        #[command(subcommand)]
        what: ApprovalsCommand,
    },
    /// Read the policy service's audit log.
    Audit {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
        #[command(subcommand)]
        what: AuditCommand,
    },
    /// Print a shell completion script: `source <(warden completion bash)`, or write it where
    /// your shell loads completions (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Print the manual page (roff) generated from these definitions:
    /// `warden manpage | man -l -`.
    Manpage,
}

#[derive(Debug, Subcommand)]
enum ApprovalsCommand {
    /// Pending requests, newest first.
    List,
    /// One request in full: tool, locations, boundary, why it escalated, the raw input.
    Show { id: String },
    /// Allow the request once (never "always").
    Approve {
        id: String,
        /// Why (recorded, and shown to the caller).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Refuse the request; the reason travels back to the caller.
    Deny {
        id: String,
        #[arg(long)]
        reason: String,
    },
    /// Recently decided requests, newest first (who answered, how long it took, why).
    History {
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: u32,
    },
    /// Stream requests as they arrive; on a terminal, answer with a key: a = approve the
    /// selected one, d = deny it (asks for a reason), n = select the next, q = quit.
    Watch,
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

/// The task text of `warden send`: the argument, `-` for standard input, or `--file PATH`.
fn prompt_text(text: Option<String>, file: Option<PathBuf>) -> Result<String, String> {
    let read = match (text.as_deref(), file) {
        (_, Some(path)) => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read --file {}: {e}", path.display()))?,
        (Some("-"), None) => std::io::read_to_string(std::io::stdin())
            .map_err(|e| format!("cannot read the task from standard input: {e}"))?,
        (Some(t), None) => return Ok(t.to_string()),
        (None, None) => return Err("no task: give it as an argument, `-` or --file".into()),
    };
    if read.trim().is_empty() {
        return Err("the task read is empty".into());
    }
    Ok(read)
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
    // `--deployed` means something only where a command reads a daemon's sockets.
    let deployed = match &cli.command {
        Command::Status { deployed }
        | Command::Doctor { deployed, .. }
        | Command::Approvals { deployed, .. }
        | Command::Audit { deployed, .. } => cli.deployed || *deployed,
        _ if cli.deployed => {
            eprintln!(
                "warden: --deployed applies to status, audit, approvals and doctor (the installed host); this command uses a local state directory (--state-dir)"
            );
            return ExitCode::from(2);
        }
        _ => false,
    };
    let layout = if deployed {
        layout::Layout::deployed()
    } else {
        layout::resolve(cli.state_dir.as_deref())
    };
    match cli.command {
        Command::Up {
            approver,
            approver_http,
            http,
            bin_dir,
            log_format,
            start_timeout,
            config,
            metrics,
        } => {
            let config_dir = match config {
                Some(dir) if !dir.is_dir() => {
                    eprintln!(
                        "warden up: --config {}: not a directory (`warden init {}` writes one)",
                        dir.display(),
                        dir.display()
                    );
                    return ExitCode::FAILURE;
                }
                Some(dir) => Some(dir),
                None => Some(layout.config_dir()).filter(|d| d.is_dir()),
            };
            let opts = up::UpOptions {
                config_dir,
                layout,
                bin_dir: bin_dir.unwrap_or_else(exe_dir),
                http,
                log_format,
                start_timeout: Duration::from_secs(start_timeout),
                approver,
                approver_http,
                metrics,
            };
            match up::run(opts).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden up: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Init { dir } => {
            let dir = dir.unwrap_or_else(|| layout.config_dir());
            match warden_cli::init::write(&dir, &layout) {
                Ok(files) => {
                    for f in files {
                        println!("wrote {}", f.display());
                    }
                    let dir_arg = dir.to_string_lossy();
                    let dir_arg = shlex::try_quote(&dir_arg).unwrap_or(dir_arg.clone());
                    println!("start with: {} up --config {dir_arg}", layout.command());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("warden init: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Approvals { what, .. } => {
            let socket = layout.approver_admin_socket();
            let result = match what {
                ApprovalsCommand::List => approvals::list(&socket, false, 0).await,
                ApprovalsCommand::History { limit } => approvals::list(&socket, true, limit).await,
                ApprovalsCommand::Show { id } => approvals::show(&socket, &id).await,
                ApprovalsCommand::Approve { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Allow, &reason)
                        .await
                        .map(|a| println!("{}", approvals::line(&a)))
                }
                ApprovalsCommand::Deny { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Deny, &reason)
                        .await
                        .map(|a| println!("{}", approvals::line(&a)))
                }
                ApprovalsCommand::Watch => approvals::watch(&socket).await,
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!(
                        "warden approvals: {}",
                        warden_terminal_text::Inline(&e.to_string())
                    );
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::Audit { what, .. } => {
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
                    eprintln!(
                        "warden audit: {}",
                        warden_terminal_text::Inline(&e.to_string())
                    );
                    ExitCode::FAILURE
                }
            }
        }
        Command::Doctor { .. } if layout.deployed => {
            let report = warden_cli::deployed::check();
            println!("{report}");
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Doctor {
            supervisor_socket,
            approver_admin,
            ..
        } => {
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
                "warden-approver",
                "warden-supervisor",
                "warden-gateway",
                "warden-scripted-agent",
                "warden-egress-relay",
                "warden-fs-servant",
                "warden-exec-limit",
            ] {
                let found = bins.join(b).is_file();
                println!("  {b:<22} {}", if found { "found" } else { "MISSING" });
            }
            let supervisor_socket =
                supervisor_socket.unwrap_or_else(|| layout.socket_of("supervisor"));
            println!("capacity:");
            // The daemons' answers are shown as data (an agent's name or error text among them).
            for l in warden_cli::doctor::capacity(&supervisor_socket).await {
                println!("{}", warden_terminal_text::Inline(&l));
            }
            println!("adapters:");
            for l in warden_cli::doctor::adapters(&supervisor_socket).await {
                println!("{}", warden_terminal_text::Inline(&l));
            }
            println!("Decide deadlines:");
            let report = warden_cli::doctor::deadlines(
                &supervisor_socket,
                &approver_admin.unwrap_or_else(|| layout.approver_admin_socket()),
            )
            .await;
            for l in &report.lines {
                println!("{}", warden_terminal_text::Inline(l));
            }
            if report.mismatch {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Send {
            agent,
            context,
            url,
            token_file,
            file,
            text,
        } => {
            let text = match prompt_text(text, file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("warden send: {e}");
                    return ExitCode::from(2);
                }
            };
            send::run(
                &layout,
                send::SendArgs {
                    agent,
                    context,
                    text,
                    url,
                    token_file,
                },
            )
            .await
        }
        Command::Mcp => match warden_cli::mcp::run(&layout).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warden mcp: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Status { .. } => {
            if status::run(&layout).await {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "warden", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Manpage => {
            use clap::CommandFactory;
            let man = clap_mangen::Man::new(Cli::command());
            match man.render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden manpage: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
