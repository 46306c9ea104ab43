//! Every `--help` text of `warden`, snapshot-tested (insta): a paragraph that moves to the wrong
//! command, a flag whose text changes, a command that disappears — each fails here until the
//! snapshot under `tests/snapshots/` is reviewed and accepted (`cargo insta review`, or
//! `INSTA_UPDATE=always` then read the diff). Issue 37 found `warden --help` describing
//! `doctor` with the `-o` flag's text and `migrate-store` with doctor's paragraph.

use std::process::Command;

/// Every command and subcommand, as typed after `warden`.
const COMMANDS: &[&[&str]] = &[
    &[],
    &["up"],
    &["down"],
    &["logs"],
    &["reload"],
    &["agents"],
    &["init"],
    &["status"],
    &["mcp"],
    &["send"],
    &["tasks"],
    &["tasks", "list"],
    &["tasks", "show"],
    &["tasks", "diff"],
    &["tasks", "apply"],
    &["contexts"],
    &["contexts", "list"],
    &["contexts", "close"],
    &["migrate-store"],
    &["doctor"],
    &["approvals"],
    &["approvals", "list"],
    &["approvals", "show"],
    &["approvals", "approve"],
    &["approvals", "deny"],
    &["approvals", "history"],
    &["approvals", "watch"],
    &["audit"],
    &["audit", "tail"],
    &["audit", "show"],
    &["token"],
    &["token", "new"],
    &["token", "hash"],
    &["completion"],
    &["manpage"],
];

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .arg("--help")
        // Flags read from the environment show its value in their help: none here.
        .env_remove("WARDEN_STATE_DIR")
        .env_remove("WARDEN_GATEWAY_URL")
        .env_remove("WARDEN_TOKEN_FILE")
        .env_remove("COLUMNS")
        .output()
        .expect("warden runs");
    assert!(out.status.success(), "warden {args:?} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_help_text_matches_its_snapshot() {
    for args in COMMANDS {
        let name = if args.is_empty() {
            "warden".to_string()
        } else {
            format!("warden-{}", args.join("-"))
        };
        insta::assert_snapshot!(name, help(args));
    }
}

/// The finding itself, without a snapshot: each command's own paragraph is on that command.
#[test]
fn doctor_and_migrate_store_each_have_their_own_description() {
    let top = help(&[]);
    let line = |cmd: &str| {
        top.lines()
            .find(|l| l.trim_start().starts_with(&format!("{cmd} ")))
            .unwrap_or_else(|| panic!("{cmd} is not listed:\n{top}"))
            .to_string()
    };
    assert!(line("doctor").contains("containment features"), "{top}");
    assert!(line("migrate-store").contains("PostgreSQL"), "{top}");
    let doctor = help(&["doctor"]);
    assert!(
        doctor.starts_with("Report which containment features"),
        "{doctor}"
    );
    assert!(doctor.contains("With --deployed it checks"), "{doctor}");
    let migrate = help(&["migrate-store"]);
    assert!(!migrate.contains("containment"), "{migrate}");
    assert!(!migrate.contains("With --deployed"), "{migrate}");
    assert!(help(&["token", "hash"]).contains("standard input"));
}
