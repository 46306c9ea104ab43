//! `warden`: the operator's and the caller's command line.
//!
//! Owns: argument parsing and exit codes; the work lives in the `warden_cli` library.

#![forbid(unsafe_code)]

use warden_cli::output::Format;
use warden_cli::{agents, approvals, audit, layout, logs, status, up};

mod send;
mod tasks;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// `-o human|json` / `--json`, on every command that reads something.
#[derive(Debug, Clone, Copy, clap::Args)]
struct OutputArgs {
    /// Output format: human, or json for scripts (one JSON document; one JSON object a line
    /// where the output streams: send, audit tail -f, approvals watch). Times in JSON are
    /// RFC 3339 (UTC), with the epoch milliseconds beside them.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Human, global = true)]
    output: Format,
    /// The same as -o json.
    #[arg(long, global = true)]
    json: bool,
}

impl OutputArgs {
    fn json(&self) -> bool {
        self.json || self.output == Format::Json
    }
}

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
    /// member of warden-operators. For status, audit, approvals, reload and doctor (also
    /// accepted after them: `warden doctor --deployed`).
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
        /// More of the daemons' logs on the terminal: -v info, -vv debug (default: warnings and
        /// errors only). Each daemon's log (info, or debug with -vv) is in
        /// <state>/logs/<daemon>.log (`warden logs`).
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
        /// Start in the background and return once every daemon is healthy; `warden down`
        /// stops it (its own output goes to <state>/logs/up.log).
        #[arg(short, long)]
        detach: bool,
    },
    /// Stop a `warden up -d` running on this state directory (each daemon in reverse start
    /// order, as Ctrl-C does), and wait until it has stopped.
    Down {
        /// Seconds to wait for it to stop.
        #[arg(long, default_value_t = 40)]
        timeout: u64,
    },
    /// Show the daemons' logs (<state>/logs/<daemon>.log, as `warden up` writes them).
    Logs {
        /// Only this daemon's: policy, approver, supervisor, gateway, or up (`warden up -d`'s
        /// own output).
        daemon: Option<String>,
        /// Keep printing what is appended.
        #[arg(short, long)]
        follow: bool,
        /// How many lines of each log to show first.
        #[arg(short = 'n', long, default_value_t = 40)]
        lines: usize,
    },
    /// Make every running daemon read its configuration again, as SIGHUP (`systemctl reload`)
    /// does: the policy its rules, the gateway its callers' tokens, access rules and webhook
    /// allowlist, the supervisor its agents, workspaces and limits for what starts next. A
    /// configuration that does not load changes nothing, and the daemon says why; exit 1 when
    /// any daemon refused.
    Reload {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// The agents a task may name, the default one, and whether each can start (its program
    /// or adapter installed), from the running supervisor.
    Agents {
        #[command(flatten)]
        out: OutputArgs,
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
        #[command(flatten)]
        out: OutputArgs,
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
        /// Have the agent work on a copy of DIR (its files, `.git` left out; in a repository
        /// what a worktree of HEAD plus your uncommitted changes holds, ignored files left
        /// out), made by warden inside the agent's sandbox: DIR is never touched; `warden tasks
        /// apply ID -C DIR` brings the change back. Local deployments (`warden up`), your own
        /// directories only.
        #[arg(short = 'C', long = "dir", value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The model for a new conversation, from those the agent offers (refused, naming
        /// them, when it offers no such model; a context keeps the model it opened with).
        #[arg(long)]
        model: Option<String>,
        /// The effort (reasoning level) for a new conversation, from those the agent offers.
        #[arg(long)]
        effort: Option<String>,
        /// How the conversation may work: `edit` (the default: changes inside its root),
        /// `read-only` (every edit, delete, move, command and fetch is denied by warden's
        /// policy floor, whatever the agent does), `plan` (read-only, and the agent's own
        /// planning mode where it offers one).
        #[arg(long, value_parser = ["read-only", "edit", "plan"])]
        mode: Option<String>,
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
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Your tasks at the running gateway: list them, show one, print the change it made (a
    /// unified diff computed by warden from the agent's root), or apply that change in a
    /// directory with git. An ID may be any unique prefix.
    #[command(
        after_help = "Exit codes: 0 done, 1 error (a change that does not apply cleanly changes \
                      nothing), 3 no such task, or the task changed no file."
    )]
    Tasks {
        /// The gateway's URL (default: the one `warden up` wrote in the state directory).
        #[arg(long, env = "WARDEN_GATEWAY_URL", global = true)]
        url: Option<String>,
        /// A file holding your bearer token (default: the one `warden up` generated).
        #[arg(long, env = "WARDEN_TOKEN_FILE", global = true)]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        out: OutputArgs,
        #[command(subcommand)]
        what: TasksCommand,
    },
    /// The contexts (conversations) of your tasks at the running gateway: `send --context ID`
    /// continues one (on the same copy, with `-C`).
    Contexts {
        /// The gateway's URL (default: the one `warden up` wrote in the state directory).
        #[arg(long, env = "WARDEN_GATEWAY_URL", global = true)]
        url: Option<String>,
        /// A file holding your bearer token (default: the one `warden up` generated).
        #[arg(long, env = "WARDEN_TOKEN_FILE", global = true)]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        out: OutputArgs,
        #[command(subcommand)]
        what: ContextsCommand,
    },
    /// Move the local deployment's durable state from sled into PostgreSQL: warden-policy's
    /// audit log, warden-approver's queue and warden-gateway's tasks are copied (each daemon
    /// reading its own store, checked record by record; running it again copies nothing
    /// twice). Stop `warden up`
    /// first; then run the daemons with [store] backend = "postgres" and this url.
    MigrateStore {
        /// The database: a libpq connection string or URL
        /// ("host=/run/postgresql dbname=warden user=warden").
        #[arg(long)]
        url: String,
        /// Where the daemon binaries are (default: next to this one).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
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
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Answer what the policy escalated (warden-approver's admin socket; your uid is recorded).
    #[command(
        after_help = "Exit codes: 0 done, 1 error, 3 no such request, 4 someone answered first."
    )]
    Approvals {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
        #[command(flatten)]
        out: OutputArgs,
        #[command(subcommand)]
        what: ApprovalsCommand,
    },
    /// Read the policy service's audit log.
    Audit {
        /// The host installed from the Debian package.
        #[arg(long)]
        deployed: bool,
        #[command(flatten)]
        out: OutputArgs,
        #[command(subcommand)]
        what: AuditCommand,
    },
    /// Make a caller's bearer token and the `[[auth.tokens]]` entry gateway.toml keeps for it
    /// (the principal and the token's SHA-256; the gateway never holds the token itself).
    Token {
        #[command(flatten)]
        out: OutputArgs,
        #[command(subcommand)]
        what: TokenCommand,
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
enum TasksCommand {
    /// Your tasks, newest first.
    List {
        /// Only the tasks of this context (conversation).
        #[arg(long)]
        context: Option<String>,
    },
    /// One task: its context, state, what was asked, the files it changed.
    Show { id: String },
    /// The task's change as a unified diff on stdout (also saved under the state directory).
    Diff { id: String },
    /// Apply the task's change in DIR (default: the current directory): to its files as they
    /// are (`git apply`), or where they changed since, merged (`git apply --3way`); checked
    /// first, nothing changed when it does not apply cleanly. git runs with hooks off and no
    /// system or global configuration.
    Apply {
        id: String,
        #[arg(short = 'C', long = "dir", value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ContextsCommand {
    /// Your contexts, newest first: how many tasks each holds, the newest one and its state.
    List,
    /// End a context's conversation and remove its copy (`send -C`); a later `send --context
    /// ID` starts afresh. Refused while a task of it runs.
    Close {
        /// The context's id, or a unique prefix of it.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Mint a random token (64 hex characters) and print it with its entry for gateway.toml.
    /// Give the token to the caller over a private channel: it is shown once and cannot be
    /// recovered from the entry.
    New {
        /// The principal the token stands for (owns its tasks; the policy's subject).
        #[arg(long, default_value = "caller")]
        principal: String,
    },
    /// Print the gateway.toml entry of a token you already have, read from standard input
    /// (never an argument: it would land in shell history and `ps`):
    /// `warden token hash --principal ci < token-file`.
    Hash {
        /// The principal the token stands for.
        #[arg(long, default_value = "caller")]
        principal: String,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// The newest decisions, oldest of them first (the newest last, as tail does).
    Tail {
        /// How many records.
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: u32,
        /// Only this context's decisions.
        #[arg(long)]
        context: Option<String>,
        /// Keep printing decisions as they are made (one JSON object a line with -o json).
        #[arg(short, long)]
        follow: bool,
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
        Command::Status { deployed, .. }
        | Command::Doctor { deployed, .. }
        | Command::Approvals { deployed, .. }
        | Command::Audit { deployed, .. }
        | Command::Reload { deployed, .. } => cli.deployed || *deployed,
        _ if cli.deployed => {
            eprintln!(
                "warden: --deployed applies to status, audit, approvals, reload and doctor (the installed host); this command uses a local state directory (--state-dir)"
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
            verbose,
            detach,
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
                log_level: Some(up::log_levels(verbose).0.to_string()),
                echo_from: up::log_levels(verbose).1,
            };
            let result = if detach {
                up::detach(opts).await
            } else {
                up::run(opts).await
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden up: {e}");
                    if let Some(fix) = e.fix() {
                        eprintln!("{fix}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::MigrateStore { url, bin_dir } => {
            let opts = up::UpOptions {
                config_dir: Some(layout.config_dir()).filter(|d| d.is_dir()),
                layout: layout.clone(),
                bin_dir: bin_dir.unwrap_or_else(exe_dir),
                // The gateway's import binds nothing; its configuration still needs an address.
                http: "127.0.0.1:0".into(),
                log_format: "human".into(),
                start_timeout: Duration::from_secs(10),
                approver: false,
                approver_http: String::new(),
                metrics: None,
                log_level: None,
                echo_from: warden_daemon::logging::Severity::Info,
            };
            let mut moved = 0;
            for name in ["policy", "approver", "gateway"] {
                if !layout.state_of(name).join("store").is_dir() {
                    println!(
                        "{name}: no sled store under {}",
                        layout.state_of(name).display()
                    );
                    continue;
                }
                let mut args = up::daemon_args(name, &opts);
                for set in [
                    "store.backend=\"postgres\"".to_string(),
                    format!("store.url={}", layout::toml_str(std::path::Path::new(&url))),
                ] {
                    args.push("--set".into());
                    args.push(set);
                }
                args.push("--import-sled".into());
                let bin = opts.bin_dir.join(format!("warden-{name}"));
                match std::process::Command::new(&bin).args(&args).output() {
                    Ok(out) if out.status.success() => {
                        print!("{}", String::from_utf8_lossy(&out.stdout));
                        moved += 1;
                    }
                    Ok(out) => {
                        eprint!("{}", String::from_utf8_lossy(&out.stderr));
                        eprintln!("warden migrate-store: {name} failed; nothing was removed");
                        return ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("warden migrate-store: cannot run {}: {e}", bin.display());
                        return ExitCode::FAILURE;
                    }
                }
            }
            if moved == 0 {
                eprintln!("warden migrate-store: no sled store to move");
                return ExitCode::FAILURE;
            }
            println!(
                "the sled stores are left as they were; run the daemons with [store] backend = \"postgres\""
            );
            ExitCode::SUCCESS
        }
        Command::Down { timeout } => match up::down(&layout, Duration::from_secs(timeout)).await {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warden down: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Logs {
            daemon,
            follow,
            lines,
        } => match logs::run(&layout, daemon.as_deref(), follow, lines).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warden logs: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Reload { out, .. } => {
            let answers = agents::reload_all(&layout).await;
            if answers.is_empty() {
                eprintln!(
                    "warden reload: no daemon is running on {} (`warden status`)",
                    layout.root.display()
                );
                return ExitCode::FAILURE;
            }
            let mut all = true;
            let mut docs = Vec::new();
            for (name, answer) in &answers {
                match answer {
                    Ok(r) => {
                        all &= r.reloaded;
                        docs.push(serde_json::json!({
                            "daemon": format!("warden-{name}"), "reloaded": r.reloaded,
                            "version": r.policy_version, "error": r.error,
                        }));
                        if out.json() {
                            continue;
                        }
                        match (r.reloaded, *name) {
                            (true, "policy") => println!(
                                "warden-policy reloaded: policy version {}",
                                r.policy_version
                            ),
                            (true, _) => println!("warden-{name} reloaded"),
                            (false, "policy") => println!(
                                "warden-policy refused the new rules (version {} stays in force): {}",
                                r.policy_version,
                                warden_terminal_text::Inline(&r.error)
                            ),
                            (false, _) => println!(
                                "warden-{name} changed nothing: {}",
                                warden_terminal_text::Inline(&r.error)
                            ),
                        }
                    }
                    Err(e) => {
                        all = false;
                        docs.push(serde_json::json!({
                            "daemon": format!("warden-{name}"), "reloaded": false,
                            "error": e.to_string(),
                        }));
                        if !out.json() {
                            // On the packaged host an operator may not reach every daemon's
                            // socket (the supervisor's is the gateway's); systemd reaches all.
                            let hint = if layout.deployed {
                                format!(
                                    " (`systemctl reload warden-{name}` sends it the same reload)"
                                )
                            } else {
                                String::new()
                            };
                            eprintln!("warden reload: warden-{name}: {e}{hint}");
                        }
                    }
                }
            }
            if out.json() {
                // The policy's figures at the top, as before every daemon reloaded; each
                // daemon's answer in `daemons`.
                let policy = answers
                    .iter()
                    .find(|(n, _)| *n == "policy")
                    .and_then(|(_, a)| a.as_ref().ok());
                let errors: Vec<String> = docs
                    .iter()
                    .filter_map(|d| {
                        let e = d["error"].as_str().filter(|e| !e.is_empty())?;
                        Some(format!("{}: {e}", d["daemon"].as_str().unwrap_or("")))
                    })
                    .collect();
                warden_cli::output::print_doc(&serde_json::json!({
                    "reloaded": all,
                    "policyVersion": policy.map(|p| p.policy_version),
                    "error": errors.join("; "),
                    "daemons": docs,
                }));
            }
            if all {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Agents { out } => match agents::list(&layout.socket_of("supervisor")).await {
            Ok(list) => {
                if out.json() {
                    warden_cli::output::print_doc(&agents::json(&list));
                } else {
                    for l in agents::lines(&list) {
                        println!("{}", warden_terminal_text::Inline(&l));
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warden agents: {e}");
                ExitCode::FAILURE
            }
        },
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
        Command::Approvals { what, out, .. } => {
            let socket = layout.approver_admin_socket();
            let json = out.json();
            let command = layout.command();
            let one = |a: &warden_proto::v1::Approval| {
                if json {
                    warden_cli::output::print_doc(&warden_cli::output::approval_json(a, &command));
                } else {
                    println!("{}", approvals::line(a));
                }
            };
            let result = match what {
                ApprovalsCommand::List => approvals::list(&socket, false, 0, json, &command).await,
                ApprovalsCommand::History { limit } => {
                    approvals::list(&socket, true, limit, json, &command).await
                }
                ApprovalsCommand::Show { id } => {
                    approvals::show(&socket, &id, json, &command).await
                }
                ApprovalsCommand::Approve { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Allow, &reason)
                        .await
                        .map(|a| one(&a))
                }
                ApprovalsCommand::Deny { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Deny, &reason)
                        .await
                        .map(|a| one(&a))
                }
                ApprovalsCommand::Watch if json => approvals::watch_json(&socket, &command).await,
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
        Command::Audit { what, out, .. } => {
            let socket = layout.policy_admin_socket();
            let json = out.json();
            let result = match what {
                AuditCommand::Tail {
                    limit,
                    context,
                    follow,
                } => audit::tail(&socket, limit, context.unwrap_or_default(), follow, json).await,
                AuditCommand::Show { decision_id } => {
                    audit::show(&socket, &decision_id).await.map(|r| {
                        if json {
                            warden_cli::output::print_doc(&warden_cli::output::audit_json(&r));
                        } else {
                            println!("{}", audit::detail(&r));
                        }
                    })
                }
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
        Command::Doctor { out, .. } if layout.deployed => {
            let report = warden_cli::deployed::check();
            if out.json() {
                warden_cli::output::print_doc(&serde_json::json!({
                    "checks": report.checks.iter().map(|c| serde_json::json!({
                        "level": c.level.to_string(), "what": c.what,
                    })).collect::<Vec<_>>(),
                    "failed": report.failed(),
                }));
            } else {
                println!("{report}");
            }
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Doctor {
            supervisor_socket,
            approver_admin,
            out,
            ..
        } => {
            let supervisor_socket =
                supervisor_socket.unwrap_or_else(|| layout.socket_of("supervisor"));
            let approver_admin = approver_admin.unwrap_or_else(|| layout.approver_admin_socket());
            let report =
                warden_cli::doctor::local(&layout, &exe_dir(), &supervisor_socket, &approver_admin)
                    .await;
            if out.json() {
                warden_cli::output::print_doc(&report.json());
            } else {
                print!("{}", report.text());
            }
            if report.failed() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Send {
            agent,
            context,
            dir,
            model,
            effort,
            mode,
            url,
            token_file,
            file,
            text,
            out,
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
                    copy_from: dir,
                    model,
                    effort,
                    mode,
                    text,
                    url,
                    token_file,
                    json: out.json(),
                },
            )
            .await
        }
        Command::Tasks {
            url,
            token_file,
            out,
            what,
        } => {
            let json = out.json();
            let name = match &what {
                TasksCommand::List { .. } => "tasks list",
                TasksCommand::Show { .. } => "tasks show",
                TasksCommand::Diff { .. } => "tasks diff",
                TasksCommand::Apply { .. } => "tasks apply",
            };
            let r = async {
                let gw = tasks::Gateway::locate(&layout, url.as_deref(), token_file.as_deref())?;
                match what {
                    TasksCommand::List { context } => {
                        tasks::list(&gw, context.as_deref(), json).await
                    }
                    TasksCommand::Show { id } => tasks::show(&gw, &id, json).await,
                    TasksCommand::Diff { id } => tasks::diff(&gw, &layout, &id, json).await,
                    TasksCommand::Apply { id, dir } => {
                        tasks::apply(&gw, &layout, &id, &dir, json).await
                    }
                }
            }
            .await;
            tasks::finish(name, r, json)
        }
        Command::Contexts {
            url,
            token_file,
            out,
            what,
        } => {
            let json = out.json();
            let r = async {
                let gw = tasks::Gateway::locate(&layout, url.as_deref(), token_file.as_deref())?;
                match &what {
                    ContextsCommand::List => tasks::contexts(&gw, json).await,
                    ContextsCommand::Close { id } => tasks::close_context(&gw, id, json).await,
                }
            }
            .await;
            let name = match what {
                ContextsCommand::List => "contexts list",
                ContextsCommand::Close { .. } => "contexts close",
            };
            tasks::finish(name, r, json)
        }
        Command::Mcp => match warden_cli::mcp::run(&layout).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warden mcp: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Status { out, .. } => {
            if status::run(&layout, out.json()).await {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Token { what, out } => {
            let minted = match what {
                TokenCommand::New { principal } => warden_cli::token::new(&principal),
                TokenCommand::Hash { principal } => warden_cli::token::read_stdin()
                    .and_then(|t| warden_cli::token::hash(&principal, &t)),
            };
            match minted {
                Ok(m) if out.json() => {
                    warden_cli::output::print_doc(&m.json());
                    ExitCode::SUCCESS
                }
                Ok(m) => {
                    if !m.token.is_empty() {
                        println!("token  {}", m.token);
                        println!(
                            "       (give it to the caller over a private channel; it is not shown again)"
                        );
                        println!();
                    }
                    println!(
                        "# gateway.toml; then `systemctl reload warden-gateway` or `warden reload`"
                    );
                    print!("{}", m.toml());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("warden token: {e}");
                    ExitCode::FAILURE
                }
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
