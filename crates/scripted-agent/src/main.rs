//! warden-scripted-agent: an ACP v1 agent (NDJSON JSON-RPC over stdin/stdout)
//! whose behaviour comes from a scenario, so one binary is the deterministic
//! peer of every test and the demo backend of `warden up`.
//!
//! It owns: imitating the real Claude/Codex adapters' option vocabularies and
//! their reactions to each answer, performing tools for real inside the
//! session cwd (directly or through the client's fs/terminal methods),
//! process misbehaviour on request (for containment tests), the A2A TCK
//! behaviours keyed on messageId prefixes, and measuring its own permission
//! round trips (JSON lines to stderr or a report file).
//!
//! It must never: pretend a tool ran when it did not, run a tool the answer
//! refused, or misbehave unless a scenario asks for it. Scenario sources, in
//! order: inline JSON in the prompt text (the text starts with `{` or has a
//! fenced json block), an A2A TCK messageId prefix (prompt `_meta.warden.messageId`
//! or the start of the text), the `--scenario` file, the demo reading of the
//! prompt (`write FILE`, `run CMD`, `read FILE`). See `scenarios/README.md`.

mod agent;
mod net;
mod scenario;
mod turn;
mod vocab;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Command line. Every option also has an environment variable, so a
/// supervisor can configure the agent without changing its argv.
#[derive(Debug, Parser)]
#[command(
    name = "warden-scripted-agent",
    version,
    about = "Scenario-driven ACP agent (test peer and demo backend)"
)]
struct Cli {
    /// Scenario file (JSON).
    #[arg(long, env = "WARDEN_SCENARIO")]
    scenario: Option<PathBuf>,
    /// Default option vocabulary: claude-0.16, claude-0.101, codex-0.16, codex-2.6.
    #[arg(
        long,
        env = "WARDEN_SCRIPTED_VOCABULARY",
        default_value = "claude-0.101"
    )]
    vocabulary: String,
    /// Permission report file (JSON lines); default stderr.
    #[arg(long, env = "WARDEN_SCRIPTED_REPORT")]
    report: Option<PathBuf>,
    /// Keep running after stdin closes (like the real adapters).
    #[arg(long, env = "WARDEN_SCRIPTED_IGNORE_EOF", value_parser = clap::builder::BoolishValueParser::new())]
    ignore_stdin_eof: bool,
    /// Internal: run as a sleeping helper process (containment tests).
    #[arg(long, hide = true)]
    helper_sleep_ms: Option<u64>,
    /// Internal: the helper ignores SIGTERM.
    #[arg(long, hide = true)]
    helper_ignore_term: bool,
    /// Internal: the helper calls setsid.
    #[arg(long, hide = true)]
    helper_setsid: bool,
    /// Internal: the helper spawns a setsid, SIGTERM-ignoring grandchild.
    #[arg(long, hide = true)]
    helper_grandchild: bool,
    /// Internal: file the helper appends its pid to.
    #[arg(long, hide = true)]
    helper_pid_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(ms) = cli.helper_sleep_ms {
        return turn::helper_main(
            ms,
            cli.helper_ignore_term,
            cli.helper_setsid,
            cli.helper_grandchild,
            cli.helper_pid_file,
        );
    }
    let Some(vocabulary) = vocab::Vocab::parse(&cli.vocabulary) else {
        eprintln!(
            "warden-scripted-agent: unknown vocabulary {:?} (expected claude-0.16, claude-0.101, codex-0.16, codex-2.6)",
            cli.vocabulary
        );
        return ExitCode::from(2);
    };
    let file_scenario = match &cli.scenario {
        None => None,
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<scenario::Scenario>(&s).map_err(|e| e.to_string()))
        {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!(
                    "warden-scripted-agent: cannot load scenario {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        },
    };
    // One thread: the agent's work is tiny and sequential per turn; cross-thread wake-ups of a
    // multi-thread runtime cost more CPU than everything else it does per permission request,
    // and would distort the round trips it measures.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warden-scripted-agent: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let config = agent::Config {
        vocabulary,
        report: cli.report,
        ignore_stdin_eof: cli.ignore_stdin_eof
            || file_scenario.as_ref().is_some_and(|s| s.ignore_stdin_eof),
        file_scenario,
    };
    runtime.block_on(agent::run(config, |a, s, id, params| {
        Box::pin(turn::run_turn(a, s, id, params))
    }))
}
