//! The sleeping helper process a `spawn` step starts (`--helper-sleep-ms`): a child, optionally
//! ignoring SIGTERM or in its own session, for the kill ladder's tests. Must never outlive its sleep.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Spawn `warden-scripted-agent --helper-sleep-ms ...` (a sleeping child).
pub(super) fn spawn_helper(
    ignore_term: bool,
    grandchild_setsid: bool,
    pid_file: Option<&Path>,
    ms: u64,
) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--helper-sleep-ms").arg(ms.to_string());
    if ignore_term {
        cmd.arg("--helper-ignore-term");
    }
    if grandchild_setsid {
        cmd.arg("--helper-grandchild");
    }
    if let Some(p) = pid_file {
        cmd.arg("--helper-pid-file").arg(p);
    }
    // The helper must never write on our stdout: that is the protocol stream.
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.spawn().map(|_| ())
}

/// The helper process: optionally ignore SIGTERM / setsid / start a grandchild
/// that does both, record its pid, sleep.
pub fn helper_main(
    ms: u64,
    ignore_term: bool,
    setsid: bool,
    grandchild: bool,
    pid_file: Option<PathBuf>,
) -> ExitCode {
    use nix::sys::signal::{SigHandler, Signal, signal};
    if ignore_term {
        // SAFETY: SIG_IGN installs no Rust handler; nothing runs in signal context.
        if let Err(e) = unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) } {
            eprintln!("helper: cannot ignore SIGTERM: {e}");
        }
    }
    if setsid && let Err(e) = nix::unistd::setsid() {
        eprintln!("helper: setsid failed: {e}");
    }
    if let Some(p) = &pid_file {
        use std::io::Write;
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .and_then(|mut f| writeln!(f, "{}", std::process::id()));
        if let Err(e) = res {
            eprintln!("helper: cannot write pid file: {e}");
        }
    }
    if grandchild {
        let spawned = std::env::current_exe().and_then(|exe| {
            let mut c = std::process::Command::new(exe);
            c.arg("--helper-sleep-ms")
                .arg(ms.to_string())
                .arg("--helper-ignore-term")
                .arg("--helper-setsid");
            if let Some(p) = &pid_file {
                c.arg("--helper-pid-file").arg(p);
            }
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
        });
        if let Err(e) = spawned {
            eprintln!("helper: cannot spawn the grandchild: {e}");
        }
    }
    std::thread::sleep(Duration::from_millis(ms));
    ExitCode::SUCCESS
}
