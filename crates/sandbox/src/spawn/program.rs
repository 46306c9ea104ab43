//! Which program a spawn runs and with what environment: a configured program resolved on the
//! host, an agent-supplied one taken only as a name looked up inside the sandbox, every variable a
//! plain `NAME=value`. Must never look up on the host a program the agent supplied.

use std::path::{Path, PathBuf};

use crate::SandboxError;
use crate::env::ChildEnv;

pub(super) fn resolve_program(program: &Path, env: &ChildEnv) -> Result<PathBuf, SandboxError> {
    let missing =
        |p: &Path| SandboxError::InvalidInput(format!("program {} not found", p.display()));
    let found = if program.components().count() > 1 || program.is_absolute() {
        if !program.is_absolute() {
            return Err(SandboxError::InvalidInput(format!(
                "program {} must be absolute or a bare name",
                program.display()
            )));
        }
        program.to_path_buf()
    } else {
        let path = env.get("PATH").ok_or_else(|| missing(program))?;
        std::env::split_paths(path)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(program))
            .find(|c| c.is_file())
            .ok_or_else(|| missing(program))?
    };
    let real = std::fs::canonicalize(&found).map_err(|_| missing(&found))?;
    if !real.is_file() {
        return Err(missing(&found));
    }
    Ok(real)
}

/// Every variable of a child's environment is a plain `NAME=value` with no NUL anywhere: a NUL
/// would end the word early in the `--args` bytes bubblewrap reads, and what follows would be
/// read as bubblewrap's own options (a bind of the host's `/`, say).
pub(super) fn check_env(env: &ChildEnv) -> Result<(), SandboxError> {
    for (k, v) in env.iter() {
        let kb = k.as_encoded_bytes();
        if kb.is_empty() || kb.contains(&0) || kb.contains(&b'=') || kb[0] == b'-' {
            return Err(SandboxError::InvalidInput(format!(
                "environment variable name {:?} is not a plain name",
                k
            )));
        }
        if v.as_encoded_bytes().contains(&0) {
            return Err(SandboxError::InvalidInput(format!(
                "environment variable {} holds a NUL byte",
                k.to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// The program of a command the agent asked for, as it wrote it: an absolute path or a bare
/// name, checked only as text. It is never looked up, canonicalised or opened here: bubblewrap
/// finds it inside the sandbox (a `/proc/self/fd/N/…` there names the command's own fds, a
/// symlink resolves in the sandbox's view).
pub(super) fn agent_program(program: &Path) -> Result<PathBuf, SandboxError> {
    let b = program.as_os_str().as_encoded_bytes();
    if b.is_empty() || b.contains(&0) {
        return Err(SandboxError::InvalidInput(
            "the program is empty or holds a NUL byte".into(),
        ));
    }
    if !program.is_absolute() && program.components().count() != 1 {
        return Err(SandboxError::InvalidInput(format!(
            "program {} must be absolute or a bare name",
            program.display()
        )));
    }
    Ok(program.to_path_buf())
}
