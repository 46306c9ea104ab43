//! Every command and flag of `warden`, as clap parses them (`--help` is written here).
//!
//! Owns: the command line's shape. Must never: do a command's work (`main.rs` dispatches it to the
//! library).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use warden_cli::output::Format;

/// `-o human|json` / `--json`, on every command that reads something.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct OutputArgs {
    /// Output format: human, or json for scripts (one JSON document; one JSON object a line
    /// where the output streams: send, audit tail -f, approvals watch). Times in JSON are
    /// RFC 3339 (UTC), with the epoch milliseconds beside them.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Human, global = true)]
    pub(crate) output: Format,
    /// The same as -o json.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

impl OutputArgs {
    pub(crate) fn json(&self) -> bool {
        self.json || self.output == Format::Json
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "warden",
    version,
    about = "Hand work to coding agents; every action judged by a separate authority"
)]
pub(crate) struct Cli {
    /// State directory of the local deployment (default: $XDG_STATE_HOME/warden or ~/.local/state/warden).
    #[arg(long, global = true, env = "WARDEN_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Use the host installed from the Debian package (deploy/): sockets in /run/warden, as a
    /// member of warden-operators. For status, audit, approvals, reload and doctor (also
    /// accepted after them: `warden doctor --deployed`).
    #[arg(long, conflicts_with = "state_dir")]
    pub(crate) deployed: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    #[command(after_help = crate::send::EXIT_CODES)]
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
        /// Have the agent work directly in this operator workspace (`[[workspaces]]` of the
        /// supervisor; `warden agents` and the operator say which you may use), as MCP's
        /// bind_workspace does: its changes land there at once. Not with -C.
        #[arg(long, value_name = "NAME", conflicts_with = "dir")]
        workspace: Option<String>,
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
pub(crate) enum ApprovalsCommand {
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
pub(crate) enum TasksCommand {
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
pub(crate) enum ContextsCommand {
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
pub(crate) enum TokenCommand {
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
pub(crate) enum AuditCommand {
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
