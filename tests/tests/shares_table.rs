//! `docs/shares.md` is the one table of every per-principal share; the daemons print the shares
//! their configuration gives under `--check-config`. This keeps the two equal on the embedded
//! default configuration: every share a daemon prints has its row, every row names a share its
//! daemon prints, and a numeric default is the value in force. A share added to a daemon and
//! not documented (or a documented one that is gone) fails here.

use std::collections::BTreeMap;
use std::path::Path;

/// `key -> (value, whole)` as `warden-<daemon> --check-config` printed them.
fn printed(daemon: &str) -> BTreeMap<String, (u64, Option<(String, u64)>)> {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(warden_e2e::binary(&format!("warden-{daemon}")))
        .arg("--check-config")
        .current_dir(dir.path())
        .env_remove("WARDEN_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("configuration OK"),
        "warden-{daemon} --check-config: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut shares = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("  ")) {
        // `  key = value` or `  key = value (of whole = value)`
        let (key, rest) = line.trim().split_once(" = ").unwrap();
        let (value, whole) = match rest.split_once(" (of ") {
            Some((v, w)) => {
                let (wk, wv) = w.trim_end_matches(')').split_once(" = ").unwrap();
                (v, Some((wk.to_string(), wv.parse().unwrap())))
            }
            None => (rest, None),
        };
        shares.insert(key.to_string(), (value.parse().unwrap(), whole));
    }
    shares
}

struct Row {
    daemon: String,
    key: String,
    default: String,
    whole: String,
}

fn rows() -> Vec<Row> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/shares.md"))
            .unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Resource") && !l.starts_with("| ---"))
        .map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            assert_eq!(cells.len(), 6, "a row of six cells: {l}");
            Row {
                daemon: cells[1].to_string(),
                key: cells[2].trim_matches('`').to_string(),
                default: cells[3].to_string(),
                whole: cells[4].to_string(),
            }
        })
        .collect()
}

#[test]
fn the_shares_table_is_what_the_daemons_enforce() {
    let rows = rows();
    assert!(rows.len() >= 8, "{} rows", rows.len());
    for daemon in ["gateway", "supervisor", "approver", "policy"] {
        let shares = printed(daemon);
        let documented: Vec<&Row> = rows.iter().filter(|r| r.daemon == daemon).collect();
        for (key, (value, whole)) in &shares {
            let row = documented
                .iter()
                .find(|r| &r.key == key)
                .unwrap_or_else(|| {
                    panic!(
                        "warden-{daemon} enforces {key} = {value}: docs/shares.md has no row for it"
                    )
                });
            if let Ok(n) = row.default.parse::<u64>() {
                assert_eq!(n, *value, "{key}: documented default {n}, in force {value}");
            }
            match whole {
                Some((wk, wv)) => {
                    assert!(
                        row.whole.contains(&format!("`{wk}`")),
                        "{key} is taken from {wk}; its row says {:?}",
                        row.whole
                    );
                    // A documented figure for the whole is the one in force.
                    if let Some(f) = row.whole.split('(').nth(1) {
                        assert_eq!(
                            f.trim_end_matches(')'),
                            wv.to_string(),
                            "{key}'s whole {wk}"
                        );
                    }
                }
                None => assert!(
                    row.whole.is_empty(),
                    "{key} is taken from nothing; its row says {:?}",
                    row.whole
                ),
            }
        }
        for r in documented {
            assert!(
                shares.contains_key(&r.key),
                "docs/shares.md lists {} for warden-{daemon}, which does not print it: {shares:?}",
                r.key
            );
        }
    }
}
