//! `warden-fs-servant --root ROOT`: serves the supervisor's decided `fs/*` requests on stdin and
//! stdout beneath ROOT (see the library's doc). Started by the supervisor inside the agent's
//! sandbox; exits when stdin ends.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use warden_containment::beneath::RootDir;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let root = match (args.next(), args.next(), args.next()) {
        (Some(flag), Some(root), None) if flag == "--root" => PathBuf::from(root),
        _ => {
            eprintln!("usage: warden-fs-servant --root ROOT");
            return ExitCode::from(2);
        }
    };
    let root = match RootDir::open(&root) {
        Ok(r) => r.no_symlinks(),
        Err(e) => {
            eprintln!("warden-fs-servant: {e}");
            return ExitCode::from(1);
        }
    };
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    match warden_fs_servant::serve(&root, &mut stdin.lock(), &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warden-fs-servant: {e}");
            ExitCode::from(1)
        }
    }
}
