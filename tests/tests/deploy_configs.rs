//! The example configurations in `deploy/config/` are accepted by the real daemons'
//! `--check-config`, a misspelt key in them is caught by name, and they agree with each other and
//! with `deploy/sysusers.d` and `deploy/tmpfiles.d` (who may call whom, which socket is where,
//! and the directory modes warden-policy needs to resolve agents' paths).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use warden_e2e::{binary, test_root};

const DAEMONS: [&str; 4] = ["policy", "supervisor", "gateway", "approver"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn example(daemon: &str) -> PathBuf {
    deploy_dir().join("config").join(format!("{daemon}.toml"))
}

/// The configuration as the daemons' own loader reads it (file only: the environment prefix is
/// one nothing sets), as JSON for easy inspection.
fn parsed(path: &Path) -> Value {
    match warden_daemon::config::load::<Value>(Some(path), "", "WARDEN_DEPLOY_CONFIGS_TEST", &[]) {
        Ok(c) => c.value,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// `--set` overrides for the socket `group` keys naming groups this machine does not have.
///
/// `ListenerConfig::validate` looks a socket's group up by name, and the test machine has no
/// `warden-operators` etc. (creating system groups on a shared build machine is not ours to
/// do). Those keys alone are pointed at this process's own primary group, which exists; every
/// other key, including the peer allowlists, is checked exactly as written. On a host where
/// the groups exist, nothing is overridden.
fn group_overrides(cfg: &Value) -> Vec<String> {
    let own_group = nix::unistd::Group::from_gid(nix::unistd::getegid())
        .ok()
        .flatten()
        .map(|g| g.name)
        .expect("this process's primary group has a name");
    let mut sets = Vec::new();
    for (section, body) in cfg.as_object().expect("a table") {
        let Some(group) = body.get("group").and_then(Value::as_str) else {
            continue;
        };
        let exists = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .is_some();
        if !exists {
            eprintln!(
                "note: group {group:?} ({section}.group) does not exist here; checking with {own_group:?}"
            );
            sets.push(format!("{section}.group={own_group:?}"));
        }
    }
    sets
}

fn check_config(daemon: &str, path: &Path, sets: &[String]) -> Output {
    let mut cmd = Command::new(binary(&format!("warden-{daemon}")));
    cmd.arg("--config").arg(path).arg("--check-config");
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    // Nothing from the caller's environment may change what is checked.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("WARDEN_") {
            cmd.env_remove(&k);
        }
    }
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run warden-{daemon}: {e}"))
}

#[test]
fn every_example_config_passes_its_daemons_check() {
    for daemon in DAEMONS {
        let path = example(daemon);
        let sets = group_overrides(&parsed(&path));
        let out = check_config(daemon, &path, &sets);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "warden-{daemon} rejected {}: {stderr}",
            path.display()
        );
        assert!(
            stdout.contains("configuration OK") && stdout.contains(&format!("{daemon}.toml")),
            "warden-{daemon} did not say it checked {}: {stdout}",
            path.display()
        );
    }
}

#[test]
fn a_misspelt_key_in_an_example_fails_naming_the_key() {
    // One optional key per file, in a section that refuses unknown keys: dropping it would be
    // silently accepted, so only the strictness of the check can make this fail.
    let cases = [
        ("policy", "max_locations = ", "max_locatoins = "),
        // At a line's start: `terminal_output_bytes = ` holds the same text.
        ("supervisor", "\noutput_bytes = ", "\noutput_bytse = "),
        ("gateway", "max_body_bytes = ", "max_body_byets = "),
        ("approver", "max_pending = ", "max_pendnig = "),
    ];
    let dir = tempfile::Builder::new()
        .prefix("deploy-configs-")
        .tempdir_in({
            let r = test_root();
            std::fs::create_dir_all(&r).expect("test root");
            r
        })
        .expect("temp dir");
    for (daemon, key, misspelt) in cases {
        let path = example(daemon);
        let text = std::fs::read_to_string(&path).expect("example readable");
        assert_eq!(
            text.matches(key).count(),
            1,
            "{}: expected exactly one `{key}`",
            path.display()
        );
        let bad = dir.path().join(format!("{daemon}.toml"));
        std::fs::write(&bad, text.replace(key, misspelt)).expect("write copy");
        let sets = group_overrides(&parsed(&path));
        let out = check_config(daemon, &bad, &sets);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "warden-{daemon} accepted a misspelt key: {stderr}"
        );
        let name = misspelt.trim_end_matches(" = ").trim_start();
        assert!(
            stderr.contains(name) && stderr.contains(&bad.display().to_string()),
            "warden-{daemon}'s error names neither the key {name:?} nor the file: {stderr}"
        );
    }
}

// ------------------------------------------------------------------ deploy/ cross-checks

#[derive(Debug, Default)]
struct SysUsers {
    uids: BTreeMap<String, u32>,
    gids: BTreeMap<String, u32>,
    members: BTreeSet<(String, String)>,
}

/// Reads `deploy/sysusers.d/warden.conf`; every user and group must have a pinned id, because
/// the configs name them by number.
fn sysusers() -> SysUsers {
    let path = deploy_dir().join("sysusers.d/warden.conf");
    let text = std::fs::read_to_string(&path).expect("sysusers.d readable");
    let mut s = SysUsers::default();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let id = || -> u32 {
            f[2].parse()
                .unwrap_or_else(|_| panic!("{}: {line:?} has no pinned numeric id", path.display()))
        };
        match f[0] {
            "u" => {
                // `u name id` also creates the user's primary group with the same id.
                s.uids.insert(f[1].into(), id());
                s.gids.insert(f[1].into(), id());
            }
            "g" => {
                s.gids.insert(f[1].into(), id());
            }
            "m" => {
                s.members.insert((f[1].into(), f[2].into()));
            }
            other => panic!("unexpected sysusers.d line type {other}"),
        }
    }
    s
}

#[derive(Debug)]
struct TmpDir {
    mode: u32,
    user: String,
    group: String,
}

/// Reads the `d` and `a+` lines of `deploy/tmpfiles.d/warden.conf`.
fn tmpfiles() -> (BTreeMap<String, TmpDir>, Vec<(String, String)>) {
    let text =
        std::fs::read_to_string(deploy_dir().join("tmpfiles.d/warden.conf")).expect("readable");
    let mut dirs = BTreeMap::new();
    let mut acls = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[0] {
            "d" => {
                dirs.insert(
                    f[1].to_string(),
                    TmpDir {
                        mode: u32::from_str_radix(f[2], 8).expect("octal mode"),
                        user: f[3].into(),
                        group: f[4].into(),
                    },
                );
            }
            "a+" => acls.push((f[1].to_string(), f[6].to_string())),
            other => panic!("unexpected tmpfiles.d line type {other}"),
        }
    }
    (dirs, acls)
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{ptr} is not a string"))
}

fn ids(v: &Value, ptr: &str) -> Vec<u32> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_u64().expect("a number") as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn parent(p: &str) -> &str {
    Path::new(p)
        .parent()
        .and_then(Path::to_str)
        .expect("an absolute socket path")
}

#[test]
fn the_examples_agree_with_each_other_and_with_sysusers_and_tmpfiles() {
    let users = sysusers();
    let (dirs, acls) = tmpfiles();
    let uid = |n: &str| users.uids[n];
    let gid = |n: &str| users.gids[n];
    let policy = parsed(&example("policy"));
    let supervisor = parsed(&example("supervisor"));
    let gateway = parsed(&example("gateway"));
    let approver = parsed(&example("approver"));

    for (daemon, cfg) in [
        ("policy", &policy),
        ("supervisor", &supervisor),
        ("gateway", &gateway),
        ("approver", &approver),
    ] {
        let state = s(cfg, "/daemon/state_dir");
        assert_eq!(state, format!("/var/lib/warden/{daemon}"));
        let d = &dirs[state];
        assert_eq!(d.user, format!("warden-{daemon}"), "{state}");
        assert_eq!(d.mode & 0o007, 0, "{state} must be closed to others");
        // Every socket a daemon listens on is in its own /run/warden/<daemon>, which it owns.
        for l in ["/listen", "/admin"] {
            if let Some(sock) = cfg.pointer(&format!("{l}/socket")).and_then(Value::as_str) {
                let run = format!("/run/warden/{daemon}");
                assert_eq!(parent(sock), run, "{daemon}{l}");
                assert_eq!(dirs[&run].user, format!("warden-{daemon}"));
                assert_eq!(dirs[&run].mode & 0o007, 0, "{run} must be closed to others");
                assert_ne!(
                    cfg.pointer(&format!("{l}/allow_any_peer")),
                    Some(&Value::Bool(true))
                );
                assert!(
                    cfg.pointer(&format!("{l}/tcp")).is_none(),
                    "{daemon}{l} on TCP"
                );
            }
        }
    }

    // Only the supervisor may call Decide (and the approver, asking on its behalf once swapped
    // in): by uid, through a group it is a member of.
    assert_eq!(
        ids(&policy, "/listen/allow_uids"),
        vec![uid("warden-supervisor"), uid("warden-approver")]
    );
    assert!(
        users
            .members
            .contains(&("warden-approver".into(), "warden-policy-clients".into()))
    );
    assert_eq!(
        s(&approver, "/upstream/socket"),
        s(&policy, "/listen/socket")
    );
    // The approver's Decide: the supervisor only; its answers: the operators only.
    assert_eq!(
        ids(&approver, "/listen/allow_uids"),
        vec![uid("warden-supervisor")]
    );
    assert!(ids(&approver, "/listen/allow_gids").is_empty());
    assert_eq!(s(&approver, "/listen/group"), "warden-approver-clients");
    assert_eq!(
        dirs["/run/warden/approver"].group,
        "warden-approver-clients"
    );
    assert!(
        users
            .members
            .contains(&("warden-supervisor".into(), "warden-approver-clients".into()))
    );
    assert!(
        acls.contains(&(
            "/run/warden/approver".into(),
            "group:warden-operators:--x".into()
        )),
        "{acls:?}"
    );
    assert!(ids(&policy, "/listen/allow_gids").is_empty());
    assert_eq!(s(&policy, "/listen/group"), "warden-policy-clients");
    assert_eq!(dirs["/run/warden/policy"].group, "warden-policy-clients");
    assert!(
        users
            .members
            .contains(&("warden-supervisor".into(), "warden-policy-clients".into()))
    );
    assert_eq!(
        s(&supervisor, "/policy/socket"),
        s(&policy, "/listen/socket")
    );

    // Only the gateway may call the supervisor.
    assert_eq!(
        ids(&supervisor, "/listen/allow_uids"),
        vec![uid("warden-gateway")]
    );
    assert!(ids(&supervisor, "/listen/allow_gids").is_empty());
    assert_eq!(s(&supervisor, "/listen/group"), "warden-supervisor-clients");
    assert_eq!(
        dirs["/run/warden/supervisor"].group,
        "warden-supervisor-clients"
    );
    assert!(
        users
            .members
            .contains(&("warden-gateway".into(), "warden-supervisor-clients".into()))
    );
    assert_eq!(
        s(&gateway, "/supervisor/socket"),
        s(&supervisor, "/listen/socket")
    );

    // Operators on the admin sockets, and nobody's daemon uid sneaks onto them.
    for (cfg, l) in [
        (&policy, "/admin"),
        (&gateway, "/listen"),
        (&approver, "/admin"),
    ] {
        assert_eq!(s(cfg, &format!("{l}/group")), "warden-operators");
        assert_eq!(
            ids(cfg, &format!("{l}/allow_gids")),
            vec![gid("warden-operators")]
        );
        let uids = ids(cfg, &format!("{l}/allow_uids"));
        for daemon_user in [
            "warden-policy",
            "warden-supervisor",
            "warden-gateway",
            "warden-approver",
        ] {
            assert!(!uids.contains(&uid(daemon_user)), "{daemon_user} on {l}");
        }
    }
    assert_ne!(s(&policy, "/admin/socket"), s(&policy, "/listen/socket"));
    assert_eq!(dirs["/run/warden/gateway"].group, "warden-operators");
    // The policy's run directory belongs to its clients' group; operators get search by ACL.
    assert!(
        acls.contains(&(
            "/run/warden/policy".into(),
            "group:warden-operators:--x".into()
        )),
        "{acls:?}"
    );

    // warden-policy resolves agents' paths: it needs search (x) down to the owned sandboxes,
    // through the supervisor's group, and nothing more (no read, no write, not for others).
    let sup_state = s(&supervisor, "/daemon/state_dir");
    let sandboxes = format!("{sup_state}/sandboxes");
    assert!(
        users
            .members
            .contains(&("warden-policy".into(), "warden-supervisor".into()))
    );
    assert_eq!(dirs["/var/lib/warden"].mode & 0o001, 0o001);
    for d in [sup_state, sandboxes.as_str()] {
        let t = dirs
            .get(d)
            .unwrap_or_else(|| panic!("tmpfiles.d does not make {d}"));
        assert_eq!(t.group, "warden-supervisor", "{d}");
        assert_eq!(t.mode, 0o710, "{d}: group search only");
    }

    // Bearer tokens are digests; principals are distinct, and every policy principal scope names
    // one of them (a misspelt scope would silently never apply).
    let tokens = gateway
        .pointer("/auth/tokens")
        .and_then(Value::as_array)
        .expect("gateway tokens");
    assert!(!tokens.is_empty());
    let mut principals = BTreeSet::new();
    let mut digests = BTreeSet::new();
    for t in tokens {
        let d = s(t, "/sha256");
        assert!(
            d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()),
            "{d} is not a SHA-256 digest"
        );
        assert!(digests.insert(d.to_ascii_lowercase()), "digest {d} twice");
        assert!(principals.insert(s(t, "/principal").to_string()));
    }
    for name in policy
        .pointer("/policy/principals")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.keys())
    {
        assert!(
            principals.contains(name),
            "policy scope for unknown principal {name:?}"
        );
    }

    // The gateway offers only agents the supervisor has, with the same default.
    let mut agents: BTreeSet<String> = ["scripted", "claude", "codex"].map(String::from).into();
    if let Some(m) = supervisor.pointer("/agents").and_then(Value::as_object) {
        agents.extend(m.keys().filter(|k| *k != "default").cloned());
    }
    for a in gateway
        .pointer("/agents/list")
        .and_then(Value::as_array)
        .expect("agents.list")
    {
        assert!(agents.contains(s(a, "/name")), "{a}");
    }
    assert_eq!(
        s(&gateway, "/agents/default"),
        s(&supervisor, "/agents/default")
    );
    // Policy scopes for agents name agents that exist.
    for name in policy
        .pointer("/policy/agents")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.keys())
    {
        assert!(
            agents.contains(name),
            "policy scope for unknown agent {name:?}"
        );
    }
}

// ------------------------------------------------------------------ the documented token recipe

/// The command gateway.toml documents for making a token and its entry (`warden token new ...`),
/// uncommented, as words.
fn documented_token_command(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix('#').map(str::trim))
        .find(|cmd| cmd.starts_with("warden token new"))
        .map(|cmd| cmd.split_whitespace().map(str::to_string).collect())
        .expect("gateway.toml documents `warden token new`")
}

/// One HTTP/1.1 request to the gateway; returns the status code.
fn http_status(port: u16, path: &str, bearer: Option<&str>) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nA2A-Version: 1.0\r\n{auth}Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    resp.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test]
async fn a_token_made_with_the_documented_command_authenticates_at_the_real_gateway() {
    let path = example("gateway");
    let text = std::fs::read_to_string(&path).expect("readable");
    // Run exactly the documented command (the `warden` built with the daemons).
    let words = documented_token_command(&text);
    let out = Command::new(binary("warden"))
        .args(&words[1..])
        .output()
        .expect("run warden");
    assert!(
        out.status.success(),
        "the documented command failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token"))
        .map(|t| t.trim().to_string())
        .expect("a token");
    // The entry it prints is TOML for gateway.toml: read as such.
    let entry: Value = toml::from_str(
        &stdout
            .lines()
            .skip_while(|l| !l.starts_with("[[auth.tokens]]"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .expect("the printed entry is TOML");
    let sha = entry
        .pointer("/auth/tokens/0/sha256")
        .and_then(Value::as_str)
        .expect("sha256")
        .to_string();
    assert_eq!(
        entry
            .pointer("/auth/tokens/0/principal")
            .and_then(Value::as_str),
        Some("alice"),
        "{stdout}"
    );
    assert_eq!(token.len(), 64, "32 random bytes as hex: {token:?}");
    assert!(
        sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sha:?}"
    );

    // The example with alice's placeholder digest replaced by this one; everything else as
    // shipped, except where the daemon keeps state and listens (a test cannot use /run or /var).
    let cfg = parsed(&path);
    let placeholder = cfg
        .pointer("/auth/tokens")
        .and_then(Value::as_array)
        .and_then(|t| t.iter().find(|t| s(t, "/principal") == "alice"))
        .map(|t| s(t, "/sha256").to_string())
        .expect("an alice token in the example");
    let root = test_root();
    std::fs::create_dir_all(&root).expect("test root");
    let dir = tempfile::Builder::new()
        .prefix("deploy-token-")
        .tempdir_in(&root)
        .expect("temp dir");
    let file = dir.path().join("gateway.toml");
    std::fs::write(&file, text.replace(&placeholder, &sha)).expect("write config");
    let port = warden_e2e::free_port();
    let mut args = vec![
        "--config".to_string(),
        file.display().to_string(),
        "--set".into(),
        format!(
            "daemon.state_dir={:?}",
            dir.path().join("state").display().to_string()
        ),
        "--set".into(),
        format!(
            "listen.socket={:?}",
            dir.path().join("gw.sock").display().to_string()
        ),
        "--set".into(),
        format!(
            "supervisor.socket={:?}",
            dir.path().join("none.sock").display().to_string()
        ),
        "--set".into(),
        format!("http.bind=\"127.0.0.1:{port}\""),
        "--set".into(),
        format!("http.public_url=\"http://127.0.0.1:{port}\""),
    ];
    for set in group_overrides(&cfg) {
        args.push("--set".into());
        args.push(set);
    }
    let mut child = warden_e2e::spawn_group(&binary("warden-gateway"), &args, false);
    let start = std::time::Instant::now();
    let unauthenticated = loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("warden-gateway exited during start-up: {status}");
        }
        if let Some(code) = tokio::task::spawn_blocking(move || http_status(port, "/tasks", None))
            .await
            .expect("join")
        {
            break code;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "warden-gateway not listening on {port}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(unauthenticated, 401, "no token must be refused");
    let ask = |bearer: String| {
        tokio::task::spawn_blocking(move || http_status(port, "/tasks", Some(&bearer)))
    };
    assert_eq!(
        ask(token.clone()).await.expect("join"),
        Some(200),
        "the documented token"
    );
    assert_eq!(
        ask(sha.clone()).await.expect("join"),
        Some(401),
        "the digest is not a token"
    );
    assert_eq!(
        ask(format!("{token}x")).await.expect("join"),
        Some(401),
        "a different token"
    );
    child.kill().await.ok();
}

// ---- the systemd units -------------------------------------------------------------------

/// The exposure `systemd-analyze security --offline=true` may give each unit at most (issue 16).
/// The supervisor's is higher because bubblewrap and its agents inherit its restrictions: see
/// the comments in its unit and deploy/README.md.
const EXPOSURE_TARGETS: [(&str, f64); 4] = [
    ("warden-policy.service", 2.0),
    ("warden-gateway.service", 2.0),
    ("warden-approver.service", 2.0),
    ("warden-supervisor.service", 4.0),
];

fn units() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(deploy_dir().join("systemd"))
        .expect("deploy/systemd")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "service"))
        .collect();
    v.sort();
    assert_eq!(v.len(), DAEMONS.len(), "one unit per daemon: {v:?}");
    v
}

fn unit_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// `(section, key, value)` of every assignment in a unit file, in order.
fn unit_entries(p: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(p).expect("readable unit");
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// `systemd-analyze`, or `None` (with the reason printed) when this machine has none.
fn systemd_analyze() -> Option<PathBuf> {
    let found = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!(
            "SKIP: systemd-analyze is not installed, so the units are not verified or scored \
             (apt-get install systemd; .ci/run does)"
        );
    }
    found
}

/// `systemctl reload` on every unit sends SIGHUP, which every daemon answers with a reload and
/// never by ending (tests/tests/reload.rs sends it to each real daemon): each unit says so,
/// the same way.
#[test]
fn every_unit_reloads_with_sighup() {
    for unit in units() {
        let reload: Vec<String> = unit_entries(&unit)
            .into_iter()
            .filter(|(section, key, _)| section == "Service" && key == "ExecReload")
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(
            reload,
            ["/bin/kill -HUP $MAINPID"],
            "{}: one ExecReload, a SIGHUP",
            unit_name(&unit)
        );
    }
}

/// A value set twice in [Service] is a unit that says two things (the supervisor's once had
/// `ProtectHome=read-only` and `ProtectHome=no`; the last wins, silently). Only list-valued
/// settings may repeat.
#[test]
fn no_unit_sets_a_single_valued_setting_twice() {
    const LISTS: [&str; 5] = [
        "SystemCallFilter",
        "ReadWritePaths",
        "Environment",
        "After",
        "Wants",
    ];
    for unit in units() {
        let mut seen = BTreeSet::new();
        for (section, key, _) in unit_entries(&unit) {
            if LISTS.contains(&key.as_str()) {
                continue;
            }
            assert!(
                seen.insert((section.clone(), key.clone())),
                "{}: [{section}] {key}= is set more than once",
                unit_name(&unit)
            );
        }
    }
}

/// The units agree with sysusers.d, tmpfiles.d and the example configs: each runs as its own
/// user, gets its state directory with the mode tmpfiles.d gives it, and may write the
/// directory its sockets are in.
#[test]
fn the_units_agree_with_sysusers_tmpfiles_and_the_configs() {
    let users = sysusers();
    let (dirs, _) = tmpfiles();
    for daemon in DAEMONS {
        let path = deploy_dir()
            .join("systemd")
            .join(format!("warden-{daemon}.service"));
        let entries = unit_entries(&path);
        let get = |k: &str| {
            entries
                .iter()
                .filter(|(s, key, _)| s == "Service" && key == k)
                .map(|(_, _, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        let user = format!("warden-{daemon}");
        assert_eq!(get("User"), [user.as_str()], "{daemon}");
        assert!(users.uids.contains_key(&user), "{user} not in sysusers.d");
        let cfg = parsed(&example(daemon));
        let state = s(&cfg, "/daemon/state_dir");
        assert_eq!(
            get("StateDirectory"),
            [state.trim_start_matches("/var/lib/")],
            "{daemon}: StateDirectory= is the config's state_dir"
        );
        let mode = u32::from_str_radix(get("StateDirectoryMode")[0], 8).expect("octal mode");
        assert_eq!(
            mode, dirs[state].mode,
            "{daemon}: {state} mode as in tmpfiles.d"
        );
        let writable: Vec<&str> = get("ReadWritePaths")
            .iter()
            .flat_map(|v| v.split_whitespace())
            .collect();
        for l in ["/listen", "/admin"] {
            if let Some(sock) = cfg.pointer(&format!("{l}/socket")).and_then(Value::as_str) {
                assert!(
                    writable.contains(&parent(sock)),
                    "{daemon}: the unit does not let it create {sock}"
                );
            }
        }
        assert!(
            !get("WatchdogSec").is_empty(),
            "{daemon}: no WatchdogSec= (the daemons ping it)"
        );
    }
}

/// The supervisor's egress proxies refuse warden's own listeners: the example lists the
/// gateway's HTTP listener (and the approver's page when the example serves one).
#[test]
fn the_supervisor_knows_wardens_own_listeners() {
    let sup = parsed(&example("supervisor"));
    let listed: Vec<&str> = sup
        .pointer("/egress/warden_listeners")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let gw = parsed(&example("gateway"));
    assert!(
        listed.contains(&s(&gw, "/http/bind")),
        "supervisor.toml [egress] warden_listeners {listed:?} lacks the gateway's http.bind"
    );
    let web = s(&parsed(&example("approver")), "/web/bind").to_string();
    assert!(
        web.is_empty() || listed.contains(&web.as_str()),
        "{listed:?} lacks {web}"
    );
}

/// Every unit bounds its memory (issue 24: one agent took the supervisor to 1.1 GiB; nothing
/// stopped a daemon from taking the host): `MemoryMax=` a size, or for the supervisor (whose
/// agents live in its delegated cgroup) a share of the host that leaves the rest some room, and
/// the supervisor's unit survives one agent killed for memory (`OOMPolicy=continue`). The
/// figures are deploy/README.md's.
#[test]
fn every_unit_bounds_its_memory() {
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    for unit in units() {
        let name = unit_name(&unit);
        let entries = unit_entries(&unit);
        let get = |k: &str| {
            entries
                .iter()
                .filter(|(s, key, _)| s == "Service" && key == k)
                .map(|(_, _, v)| v.clone())
                .collect::<Vec<_>>()
        };
        let max = get("MemoryMax");
        assert_eq!(max.len(), 1, "{name}: MemoryMax= {max:?}");
        let v = max[0].as_str();
        let ok = if let Some(pct) = v.strip_suffix('%') {
            pct.parse::<u32>().is_ok_and(|p| (1..=90).contains(&p))
        } else {
            let (num, unit_suffix) = v.split_at(v.len() - 1);
            matches!(unit_suffix, "M" | "G") && num.parse::<u32>().is_ok_and(|n| n > 0)
        };
        assert!(ok, "{name}: MemoryMax={v} is not a bounded size");
        assert!(
            readme.contains(&format!("`{name}` | `MemoryMax={v}`")),
            "{name}: deploy/README.md does not state MemoryMax={v}"
        );
        if name == "warden-supervisor.service" {
            assert_eq!(get("OOMPolicy"), ["continue"], "{name}");
            assert!(
                v.ends_with('%'),
                "{name}: its agents live under it: a share of the host"
            );
        }
    }
}

/// `systemd-analyze verify` on every unit, with nothing installed: it runs against a temporary
/// root holding the units, the host's own systemd units (for network.target and friends) and,
/// at each path an `Exec*=` names, an executable file. verify only checks that such a path is
/// executable, so a one-line script stands in for the binary the package would install. Any
/// complaint fails the test, not only the exit status: verify exits 0 on an unknown key.
#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let root = tempfile::tempdir().expect("temp root");
    let r = root.path();
    let sys = r.join("etc/systemd/system");
    std::fs::create_dir_all(&sys).unwrap();
    std::fs::create_dir_all(r.join("usr/lib/systemd")).unwrap();
    let host_units = Path::new("/usr/lib/systemd/system");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(host_units)
        .arg(r.join("usr/lib/systemd/"))
        .status()
        .expect("run cp");
    assert!(cp.success(), "cannot copy {}", host_units.display());
    let mut names = Vec::new();
    for unit in units() {
        std::fs::copy(&unit, sys.join(unit_name(&unit))).unwrap();
        names.push(unit_name(&unit));
        for (_, key, value) in unit_entries(&unit) {
            if !key.starts_with("Exec") {
                continue;
            }
            let program = value
                .trim_start_matches(['-', '@', ':', '+', '!'])
                .split_whitespace()
                .next()
                .expect("a command");
            assert!(
                program.starts_with('/'),
                "{key}={value}: not an absolute path"
            );
            let stand_in = r.join(program.trim_start_matches('/'));
            std::fs::create_dir_all(stand_in.parent().unwrap()).unwrap();
            std::fs::write(&stand_in, "#!/bin/sh\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let out = Command::new(&analyze)
        .args(["verify", "--man=no", "--generators=no"])
        .arg(format!("--root={}", r.display()))
        .args(&names)
        .stdin(Stdio::null())
        .output()
        .expect("run systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify {names:?} ({}):\n{said}",
        out.status
    );
}

/// The overall exposure figure from `systemd-analyze security` output.
fn exposure(report: &str) -> Option<f64> {
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level for"))?;
    line.rsplit_once(": ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn every_unit_meets_its_exposure_target() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let mut over = Vec::new();
    for unit in units() {
        let name = unit_name(&unit);
        let target = EXPOSURE_TARGETS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} has no exposure target"))
            .1;
        let out = Command::new(&analyze)
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&unit)
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .output()
            .expect("run systemd-analyze security");
        let report = String::from_utf8_lossy(&out.stdout);
        let figure = exposure(&report).unwrap_or_else(|| {
            panic!(
                "no exposure figure for {name}: {report}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        eprintln!("{name}: exposure {figure} (target <= {target})");
        if figure > target {
            over.push(format!("{name}: {figure} > {target}\n{report}"));
        }
    }
    assert!(over.is_empty(), "above target:\n{}", over.join("\n"));
}

#[test]
fn the_exposure_figure_is_read_from_systemd_analyze_output() {
    let report = "✗ PrivateNetwork=   Service has access to the host's network   0.5\n\n\
                  → Overall exposure level for warden-gateway.service: 1.2 OK 🙂\n";
    assert_eq!(exposure(report), Some(1.2));
    assert_eq!(exposure("no summary line"), None);
}

/// Under `WatchdogSec=` systemd sets `WATCHDOG_USEC`; a daemon that does not ping within it is
/// killed. The real warden-policy reports ready and then keeps pinging at half the period.
#[tokio::test]
async fn a_daemon_under_a_watchdog_keeps_pinging_it() {
    let root = test_root();
    std::fs::create_dir_all(&root).expect("test root");
    let dir = tempfile::Builder::new()
        .prefix("deploy-watchdog-")
        .tempdir_in(&root)
        .expect("temp dir");
    let notify = dir.path().join("notify");
    let sock = tokio::net::UnixDatagram::bind(&notify).expect("bind notify socket");
    let q = |p: &str| format!("{:?}", dir.path().join(p).display().to_string());
    let mut cmd = tokio::process::Command::new(binary("warden-policy"));
    for (k, v) in [
        ("daemon.state_dir", q("state")),
        ("listen.socket", q("policy.sock")),
        ("admin.socket", q("admin.sock")),
    ] {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("WARDEN_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .env("NOTIFY_SOCKET", &notify)
        // 400 ms: pings every 200 ms.
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start warden-policy");
    let mut buf = [0u8; 128];
    let mut recv = async || {
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), sock.recv(&mut buf))
            .await
            .expect("a notification within 30 s")
            .expect("recv");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(recv().await, "READY=1");
    let start = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(recv().await, "WATCHDOG=1");
    }
    // Three pings at 200 ms intervals, the first at once: about 400 ms. Fewer would mean the
    // period is not what systemd asked for.
    let took = start.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(350),
        "pinged too often: 3 in {took:?}"
    );
    child.kill().await.ok();
}

/// The supervisor holds no CAP_DAC_OVERRIDE (nor CAP_DAC_READ_SEARCH or CAP_FOWNER): what it
/// does in an agent's root and home runs with the agent's rights (crates/containment rights.rs),
/// the agents' fs/* in the fs servant. Its unit still hides the other daemons' state and
/// configuration and the password hashes, and leaves only its own cgroup subtree writable: a
/// second wall, should a capability that passes over modes ever come back.
#[test]
fn the_supervisor_unit_passes_over_no_mode_and_hides_the_other_daemons() {
    let path = deploy_dir().join("systemd/warden-supervisor.service");
    let entries = unit_entries(&path);
    let words = |k: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|(s, key, _)| s == "Service" && key == k)
            .flat_map(|(_, _, v)| {
                v.split_whitespace()
                    .map(|w| w.trim_start_matches('-').to_string())
            })
            .collect()
    };
    for set in ["AmbientCapabilities", "CapabilityBoundingSet"] {
        let caps = words(set);
        assert_eq!(
            caps,
            ["CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"],
            "{set}"
        );
    }
    let hidden = words("InaccessiblePaths");
    for daemon in ["policy", "gateway", "approver"] {
        let cfg = parsed(&example(daemon));
        let state = s(&cfg, "/daemon/state_dir");
        assert!(
            hidden.iter().any(|h| h == state),
            "{state} is not hidden from the supervisor: {hidden:?}"
        );
        let conf = format!("/etc/warden/{daemon}.toml");
        assert!(
            hidden.contains(&conf),
            "{conf} is not hidden from the supervisor: {hidden:?}"
        );
    }
    for secret in ["/etc/shadow", "/etc/gshadow"] {
        assert!(
            hidden.iter().any(|h| h == secret),
            "{secret} not hidden: {hidden:?}"
        );
    }
    assert_eq!(words("ReadOnlyPaths"), ["/sys/fs/cgroup"]);
    assert!(
        words("ReadWritePaths")
            .iter()
            .any(|p| p == "/sys/fs/cgroup/system.slice/warden-supervisor.service"),
        "the supervisor's own cgroup is not writable"
    );
}

/// The postinst's id fill-in (`substitute_ids` in deploy/debian/postinst), run by `sh` with a
/// stand-in `getent`: only the numbers of `allow_*` lines change, all at once (two users whose
/// real ids are each other's pinned ones are swapped, not both set to one), and a number that
/// merely contains a pinned one, a comment or another key stays as it is.
#[test]
fn the_postinst_puts_real_ids_into_allowlists_only() {
    let postinst = std::fs::read_to_string(deploy_dir().join("debian/postinst")).expect("postinst");
    let start = postinst
        .find("substitute_ids() {")
        .expect("substitute_ids in postinst");
    let end = start + postinst[start..].find("\n}\n").expect("end of function") + 3;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("policy.toml");
    std::fs::write(
        &file,
        "allow_uids = [962, 967]\nallow_gids = [964]\n# allow_uids = [962]\nother = 962\nallow_uids = [9621, 1962]\n",
    )
    .expect("write");
    let script = format!(
        "{}\ngetent() {{ case \"$2\" in warden-supervisor) echo 'warden-supervisor:x:967:967::';; \
         warden-approver) echo 'warden-approver:x:962:962::';; warden-operators) echo 'warden-operators:x:4964:';; \
         *) return 2;; esac; }}\n\
         substitute_ids allow_uids \"$1\" 'warden-supervisor:962 warden-approver:967' passwd; echo\n\
         substitute_ids allow_gids \"$1\" 'warden-operators:964 warden-policy-clients:966' group; echo\n",
        &postinst[start..end]
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .arg("sh")
        .arg(&file)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("warden-supervisor=967 warden-approver=962")
            && said.contains("warden-operators=4964"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "allow_uids = [967, 962]\nallow_gids = [4964]\n# allow_uids = [962]\nother = 962\nallow_uids = [9621, 1962]\n"
    );
}

/// GitHub's heading anchor: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The Debian package ships the monitoring files (scrape configuration, alert rules and their
/// tests, the dashboard), and every alert's `runbook_url` names a section of deploy/README.md
/// as installed (`/usr/share/doc/warden/deploy.md`) that exists.
#[test]
fn the_package_ships_the_monitoring_files_and_every_runbook_url_resolves() {
    let manifest = std::fs::read_to_string(deploy_dir().join("../crates/cli/Cargo.toml")).unwrap();
    let cargo: toml::Value = toml::from_str(&manifest).unwrap();
    let assets: Vec<(String, String)> = cargo["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a[0].as_str().unwrap().to_string(),
                a[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for dir in ["prometheus", "grafana"] {
        for e in std::fs::read_dir(deploy_dir().join(dir)).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let src = format!("../../deploy/{dir}/{name}");
            let shipped = assets
                .iter()
                .find(|(s, _)| *s == src)
                .unwrap_or_else(|| panic!("{src} is not in the package's assets"));
            assert_eq!(
                shipped.1,
                format!("usr/share/warden/monitoring/{dir}/{name}")
            );
        }
    }
    assert!(
        assets
            .iter()
            .any(|(s, d)| s == "../../deploy/README.md" && d == "usr/share/doc/warden/deploy.md")
    );
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    let anchors: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let rules = std::fs::read_to_string(deploy_dir().join("prometheus/warden-alerts.yml")).unwrap();
    // One `- alert:` item after another; its `runbook_url:` annotation before the next.
    let mut alerts = 0;
    for item in rules.split("- alert: ").skip(1) {
        let name = item.lines().next().unwrap_or("").trim();
        alerts += 1;
        let url = item
            .lines()
            .find_map(|l| l.trim().strip_prefix("runbook_url: "))
            .map(|u| u.trim_matches('"'))
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        let target = url
            .strip_prefix("file:///usr/share/doc/warden/deploy.md#")
            .unwrap_or_else(|| panic!("{name}: {url} is not a section of deploy.md"));
        assert!(
            anchors.contains(target),
            "{name}: no section #{target} in deploy/README.md"
        );
    }
    assert!(alerts >= 8, "{alerts}");
}
