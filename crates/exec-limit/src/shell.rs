//! `warden-agent-shell`: the shell an agent runs its commands in (`SHELL`), for an agent whose
//! own control API listens in its sandbox (OpenCode's server on loopback, which answers
//! permission requests and changes settings, without a password). It puts itself in a Landlock
//! domain where a TCP connection to that one port (`WARDEN_AGENT_SHELL_CLOSED_PORT`) is refused
//! and every other port stays open (the egress relay, servers the commands start themselves),
//! then `exec`s the real shell (`WARDEN_AGENT_SHELL_PROGRAM`, default `/bin/bash`) with its
//! arguments. Everything the commands start inherits the domain, and Landlock also keeps a
//! process from tracing (`ptrace`, `/proc/<pid>/mem`, `environ`) one outside its domain: the
//! agent itself.
//!
//! Owns: that restriction, all of it or nothing — on a kernel without Landlock's TCP rules
//! (ABI 4, Linux 6.7) it refuses to run the command (exit 126) rather than run it unrestricted.
//!
//! Must never: run the shell when the restriction is not in force, or read stdin or write
//! stdout itself (they are the command's).
#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use landlock::{
    AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};

/// The exit status when the command is not run (the shell's "cannot execute").
const REFUSED: u8 = 126;

/// Restricts this process (and what it will exec) to TCP connections to any port but `closed`.
fn restrict(closed: u16) -> Result<(), String> {
    let connect = AccessNet::ConnectTcp;
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(connect)
        .and_then(|r| r.create())
        .map_err(|e| format!("Landlock: {e}"))?;
    // Landlock's network rules are an allowlist: every port but the closed one is named.
    let ruleset = ruleset
        .add_rules(
            (1..=u16::MAX)
                .filter(|p| *p != closed)
                .map(|p| Ok::<_, landlock::RulesetError>(NetPort::new(p, connect))),
        )
        .map_err(|e| format!("Landlock rules: {e}"))?;
    let status = ruleset
        .restrict_self()
        .map_err(|e| format!("Landlock: {e}"))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(format!(
            "Landlock did not enforce the TCP restriction ({:?})",
            status.ruleset
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let closed = match std::env::var("WARDEN_AGENT_SHELL_CLOSED_PORT")
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|p| *p != 0)
    {
        Some(p) => p,
        None => {
            eprintln!("warden-agent-shell: WARDEN_AGENT_SHELL_CLOSED_PORT names no port");
            return ExitCode::from(REFUSED);
        }
    };
    let program =
        std::env::var_os("WARDEN_AGENT_SHELL_PROGRAM").unwrap_or_else(|| "/bin/bash".into());
    if let Err(e) = restrict(closed) {
        eprintln!("warden-agent-shell: {e}; the command is not run");
        return ExitCode::from(REFUSED);
    }
    let e = std::process::Command::new(&program)
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "warden-agent-shell: cannot run {}: {e}",
        program.to_string_lossy()
    );
    ExitCode::from(REFUSED)
}
