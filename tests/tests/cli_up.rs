//! One `warden up` per state directory (issue 37, item 2): a second `warden up -d` (or a
//! foreground `warden up`) on a running state directory says so and exits non-zero instead of
//! reporting the running instance's health as its own, and it leaves the running instance's
//! logs where they are (no rename, no truncation). Once the first is down, the state directory
//! is free again.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use warden_e2e::{Deployment, Options, binary, run_with_deadline};

async fn warden(state: &Path, args: &[&str]) -> (bool, String, String) {
    let mut c = tokio::process::Command::new(binary("warden"));
    c.arg("--state-dir").arg(state).args(args);
    let out = run_with_deadline(&mut c, Duration::from_secs(90))
        .await
        .expect("warden runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (inode, length) of each log file in `<state>/logs`, sorted by name.
fn logs(state: &Path) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = std::fs::read_dir(state.join("logs"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let m = e.metadata().ok()?;
                    Some((
                        e.file_name().to_string_lossy().into_owned(),
                        m.ino(),
                        m.len(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[tokio::test]
async fn a_second_up_on_a_running_state_directory_fails_and_leaves_its_logs_alone() {
    let d = Deployment::new(Options::default());
    let state = d.dir.path();
    let (ok, out, err) = warden(state, &["up", "-d", "--http", &d.http]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("warden is up in the background"), "{out}");
    let up_log = std::fs::read_to_string(state.join("logs/up.log")).expect("up.log");
    assert!(up_log.contains("warden is up"), "{up_log}");
    let before = logs(state);
    assert!(
        before.iter().any(|(n, _, _)| n == "gateway.log"),
        "{before:?}"
    );

    // Another port, so nothing but the state directory is shared.
    let other = format!("127.0.0.1:{}", warden_e2e::free_port());
    let (ok, out, err) = warden(state, &["up", "-d", "--http", &other]).await;
    assert!(!ok, "a second up -d reported success: {out}{err}");
    assert!(!out.contains("warden is up"), "{out}");
    assert!(err.contains("already running"), "{err}");
    // The foreground form too, at once.
    let (ok, _, err) = warden(state, &["up", "--http", &other]).await;
    assert!(!ok);
    assert!(err.contains("already running"), "{err}");

    // The running instance's logs: the same files (no rename), none shorter, and up.log still
    // holds what the running instance said.
    let after = logs(state);
    for (name, ino, len) in &before {
        let now = after.iter().find(|(n, _, _)| n == name);
        assert!(
            now.is_some_and(|(_, i, l)| i == ino && l >= len),
            "{name} was replaced or truncated: {before:?} -> {after:?}"
        );
    }
    assert!(
        !after.iter().any(|(n, _, _)| n.ends_with(".log.1")),
        "a log was rotated under the running instance: {after:?}"
    );
    let up_log_now = std::fs::read_to_string(state.join("logs/up.log")).expect("up.log");
    assert!(up_log_now.starts_with(&up_log), "{up_log_now}");
    let (ok, out, _) = warden(state, &["status"]).await;
    assert!(ok, "the running instance is not healthy any more: {out}");

    let (ok, out, err) = warden(state, &["down"]).await;
    assert!(ok, "{out}{err}");
    // Free again: the lock went with the instance.
    let (ok, out, err) = warden(state, &["up", "-d", "--http", &other]).await;
    assert!(ok, "{out}{err}");
    let (ok, out, err) = warden(state, &["down"]).await;
    assert!(ok, "{out}{err}");
}
