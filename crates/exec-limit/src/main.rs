//! `warden-exec-limit --allow PATH… -- PROGRAM ARGS…`: runs inside an agent's sandbox (after
//! bubblewrap has made its mounts: a process under a Landlock filesystem ruleset may not mount,
//! so bubblewrap cannot run after it) in front of the agent of a workspace with
//! `allow_execute = false`. It restricts itself with a Landlock ruleset handling only the
//! execute right, allowing it beneath each `--allow` path (the agent's install, its interpreter,
//! the dynamic loader, the egress relay), and then `exec`s PROGRAM in its place. The restriction
//! is inherited by everything the agent starts and can never be lifted: `sh -c …` from the agent
//! fails with EACCES.
//!
//! Owns: that restriction, all of it or nothing — on a kernel without Landlock, or one that
//! cannot enforce the execute right, it refuses to start the agent (exit 126) rather than start
//! it unrestricted.
//!
//! Must never: write to stdout (it becomes the agent's ACP stream), read stdin, or start the
//! program when the restriction is not in force. Landlock's execute right governs `execve`: a
//! program mapped by the dynamic loader run as a program (`ld.so /bin/sh`) is not executed in
//! that sense, and the loader must stay allowed for every dynamically linked agent (README,
//! containment section).
#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use landlock::{
    AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus,
};

/// The exit status when the agent is not started (the shell's "cannot execute").
const REFUSED: u8 = 126;

struct Args {
    allow: Vec<PathBuf>,
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args_os().skip(1);
    let mut allow = Vec::new();
    loop {
        match it.next() {
            Some(a) if a == "--allow" => {
                allow.push(PathBuf::from(it.next().ok_or("--allow needs a path")?))
            }
            Some(a) if a == "--" => break,
            Some(a) => return Err(format!("unexpected argument {a:?}")),
            None => return Err("no program after --".into()),
        }
    }
    let program = PathBuf::from(it.next().ok_or("no program after --")?);
    Ok(Args {
        allow,
        program,
        args: it.collect(),
    })
}

/// Restricts this process (and what it will exec) to executing beneath `allow`.
fn restrict(allow: &[PathBuf]) -> Result<(), String> {
    // ABI 1 is where the execute right was introduced; asking for nothing newer keeps this
    // working on every Landlock kernel, and HardRequirement turns "not supported" into an error.
    let execute = AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(execute)
        .and_then(|r| r.create())
        .map_err(|e| format!("Landlock: {e}"))?;
    for p in allow {
        let fd = PathFd::new(p).map_err(|e| format!("{}: {e}", p.display()))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, execute))
            .map_err(|e| format!("Landlock rule for {}: {e}", p.display()))?;
    }
    let status = ruleset
        .restrict_self()
        .map_err(|e| format!("Landlock: {e}"))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(format!(
            "Landlock did not enforce the execute restriction ({:?})",
            status.ruleset
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("warden-exec-limit: {e}");
            return ExitCode::from(REFUSED);
        }
    };
    if let Err(e) = restrict(&args.allow) {
        eprintln!("warden-exec-limit: {e}; the agent is not started");
        return ExitCode::from(REFUSED);
    }
    let e = std::process::Command::new(&args.program)
        .args(&args.args)
        .exec();
    eprintln!(
        "warden-exec-limit: cannot run {}: {e}",
        args.program.display()
    );
    ExitCode::from(REFUSED)
}
