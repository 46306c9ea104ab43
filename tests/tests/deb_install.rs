//! The multi-user end-to-end test (issue 16): the Debian package installed with `dpkg -i` on this
//! machine, each daemon started as its unit's `User=`/`Group=` with the unit's `ExecStart`,
//! capabilities, `UMask` and state directory (read from the installed unit files and applied with
//! `setpriv`, since systemd is not PID 1 here), then:
//!
//! - the example configurations pass `--check-config` as installed, and the postinst put this
//!   host's real ids in their allowlists (`warden-operators` is made beforehand with an id other
//!   than the pinned one);
//! - a task completes through gateway → supervisor → policy, its agent running as uid 61000 with no
//!   capability, unable to see any daemon's socket directory;
//! - every socket admits exactly its callers: the gateway's uid cannot call the policy, an agent
//!   uid cannot call anything (not even with the clients' groups, past the directory and file
//!   modes: the peer allowlist refuses it), an operator in `warden-operators` can use the admin
//!   sockets, `warden --deployed status` and `warden --deployed audit tail`;
//! - an agent uid cannot read any daemon's state; `warden doctor --deployed` passes;
//! - `dpkg --purge` removes every file the package installed and the state, and keeps the state
//!   only when asked (`/var/lib/warden/keep-on-purge`).
//!
//! It installs into `/`, so it runs only as root; in CI (`CI` set) anything missing is a failure,
//! elsewhere it says why it skipped. One run at a time (a lock file); whatever it installed or
//! created is purged and deleted again when it ends, failed or not.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use warden_e2e::{bin_dir, binary, free_port};

const DAEMONS: [&str; 4] = ["policy", "approver", "supervisor", "gateway"];
const OPERATOR: &str = "warden-e2e-operator";
/// The agents' uid in this test: not the default 61000, which the root-run supervisors of other
/// tests on the same machine also use (this test must neither count nor signal their agents). An
/// operator's edit of `[sandbox] agent_user`, as a host would make it.
fn pick_agent_uid() -> u32 {
    let used = |db: &str, id: u32| {
        Command::new("getent")
            .args([db, &id.to_string()])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let start = 61_100 + std::process::id() % 800;
    (start..start + 800)
        .find(|id| !used("passwd", *id) && !used("group", *id))
        .unwrap_or(start)
}
/// Users and groups the package (sysusers.d) creates, removed again at the end.
const USERS: [&str; 4] = [
    "warden-policy",
    "warden-supervisor",
    "warden-gateway",
    "warden-approver",
];
const GROUPS: [&str; 8] = [
    "warden-operators",
    "warden-supervisor-clients",
    "warden-policy-clients",
    "warden-approver-clients",
    "warden-policy",
    "warden-supervisor",
    "warden-gateway",
    "warden-approver",
];
/// Written right after this test's `dpkg -i`: an installation found with it is a killed run's.
const MARKER: &str = "/var/lib/warden/.installed-by-deb-install-test";
/// What this machine must not already have: an operator's own installation would be purged.
const SYSTEM_PATHS: [&str; 3] = ["/etc/warden", "/var/lib/warden", "/run/warden"];

fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("deb_install cannot run in CI: {why}");
    }
    eprintln!("SKIPPED deb_install: {why}");
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn id_of(db: &str, name: &str) -> Option<u32> {
    let out = Command::new("getent").args([db, name]).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split(':')
        .nth(2)?
        .trim()
        .parse()
        .ok()
}

/// The settings of an installed unit this test applies itself (systemd would).
#[derive(Debug, Default)]
struct Unit {
    user: String,
    group: String,
    exec: Vec<String>,
    ambient: Vec<String>,
    bounding: Option<Vec<String>>,
    umask: Option<String>,
    no_new_privs: bool,
    state_dirs: Vec<String>,
    state_mode: Option<String>,
    runtime_dirs: Vec<String>,
    runtime_mode: Option<String>,
}

fn parse_unit(path: &Path) -> Unit {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut u = Unit::default();
    let mut in_service = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let words = || v.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        match k {
            "User" => u.user = v.to_string(),
            "Group" => u.group = v.to_string(),
            // No quoting in warden's units: a plain word list.
            "ExecStart" => u.exec = words(),
            "AmbientCapabilities" => u.ambient.extend(words()),
            "CapabilityBoundingSet" => u.bounding.get_or_insert_with(Vec::new).extend(words()),
            "UMask" => u.umask = Some(v.to_string()),
            "NoNewPrivileges" => u.no_new_privs = v == "yes",
            "StateDirectory" => u.state_dirs.extend(words()),
            "StateDirectoryMode" => u.state_mode = Some(v.to_string()),
            "RuntimeDirectory" => u.runtime_dirs.extend(words()),
            "RuntimeDirectoryMode" => u.runtime_mode = Some(v.to_string()),
            _ => {}
        }
    }
    assert!(
        !u.user.is_empty() && !u.group.is_empty() && !u.exec.is_empty(),
        "{}: no User=, Group= or ExecStart=",
        path.display()
    );
    u
}

/// `CAP_SETUID CAP_KILL` -> `+setuid,+kill` (setpriv's names).
fn setpriv_caps(caps: &[String]) -> String {
    caps.iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A command run as `user` with its groups from /etc/group (setpriv --init-groups).
fn as_user(user: &str, argv: &[&str]) -> Command {
    // The user's primary gid: the fourth field of its passwd entry.
    let gid = Command::new("getent")
        .args(["passwd", user])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split(':')
                .nth(3)
                .and_then(|g| g.trim().parse::<u32>().ok())
        })
        .unwrap_or_else(|| panic!("no user {user}"));
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={user}"))
        .arg(format!("--regid={gid}"))
        .arg("--init-groups")
        .arg("--")
        .args(argv);
    c
}

/// A command run as a bare uid with exactly `groups` (an agent has none).
fn as_ids(uid: u32, groups: &[u32], argv: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"));
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        c.arg(format!(
            "--groups={}",
            groups
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    c.arg("--").args(argv);
    c
}

/// `pid command` of every process of `uid` that is not a zombie.
fn live_processes_of(uid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            };
            let owner: u32 = field("Uid:")?.parse().ok()?;
            (owner == uid && field("State:")? != "Z").then(|| {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ");
                format!("{pid} {cmd}")
            })
        })
        .collect()
}

/// Everything this test did to the machine, undone on drop (also when an assertion fails).
struct Host {
    daemons: Vec<(String, Child)>,
    installed: bool,
    created_users: Vec<String>,
    /// This test's own agent uid (only its processes are ever signalled).
    agent_uid: u32,
    /// Processes of the agent uid still there after the daemons stopped (`pgrep -a`).
    agents_left: String,
    /// What existed before the test, moved aside: (original, where it is now).
    moved: Vec<(PathBuf, PathBuf)>,
    _lock: std::fs::File,
}

impl Host {
    fn stop_daemons(&mut self) {
        for (_, child) in &mut self.daemons {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        for (name, child) in &mut self.daemons {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        eprintln!("warden-{name} did not stop on SIGTERM; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        self.daemons.clear();
        // Agents the supervisor left: it kills every agent tree at shutdown, across the uid
        // boundary (CAP_KILL), so there must be none; killed here only as a safety net.
        // Zombies are not left running (their parent exited, init reaps them); a dying process
        // gets a moment.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = live_processes_of(self.agent_uid);
            if left.is_empty() || Instant::now() > deadline {
                self.agents_left = left.join("\n");
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-U", &self.agent_uid.to_string()])
            .status();
    }

    fn purge(&mut self) {
        if self.installed {
            let _ = run(Command::new("dpkg").args(["--purge", "warden"]));
            self.installed = false;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop_daemons();
        self.purge();
        let _ = std::fs::remove_dir_all("/var/lib/warden");
        let _ = std::fs::remove_dir_all("/run/warden");
        let _ = std::fs::remove_dir_all("/etc/warden");
        for u in self.created_users.iter().chain(
            USERS
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .iter(),
        ) {
            let _ = Command::new("userdel")
                .arg(u)
                .stderr(Stdio::null())
                .status();
        }
        for g in GROUPS {
            let _ = Command::new("groupdel")
                .arg(g)
                .stderr(Stdio::null())
                .status();
        }
        for (original, aside) in &self.moved {
            if let Err(e) = std::fs::rename(aside, original) {
                eprintln!(
                    "cannot put {} back from {}: {e}",
                    original.display(),
                    aside.display()
                );
            }
        }
    }
}

/// The package to install: `WARDEN_DEB` (.ci/run builds it), else built here with cargo-deb from
/// the binaries of this test run.
fn package(scratch: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WARDEN_DEB") {
        return Some(PathBuf::from(p));
    }
    let target = bin_dir().parent()?.to_path_buf();
    // Where .ci/run installs it.
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let cargo_deb = cargo_home.join("warden-tools/cargo-deb-3.8.0/bin/cargo-deb");
    let cargo_deb = if cargo_deb.is_file() {
        cargo_deb
    } else if have("cargo-deb") {
        PathBuf::from("cargo-deb")
    } else {
        return None;
    };
    // The binaries must exist before packaging them.
    let _ = binary("warden");
    ok(Command::new(cargo_deb)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "-p",
            "warden-cli",
            "--no-build",
            "--profile",
            "dev",
            "--fast",
            "-q",
            "-o",
        ])
        .arg(scratch));
    std::fs::read_dir(scratch)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
}

fn wait_serving(probe: &Path, socket: &str, user: &str, log: &Path) {
    // Generous: on a loaded two-core machine a debug daemon's start can take seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = run(&mut as_user(
            user,
            &[probe.to_str().unwrap_or_default(), socket],
        ));
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{socket} never served {user}: {}\n--- {}:\n{}",
            String::from_utf8_lossy(&out.stdout),
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_package_runs_every_daemon_and_agent_under_its_own_uid_and_purges_cleanly() {
    if !nix::unistd::geteuid().is_root() {
        return skip_or_fail("it installs a package into /, which needs root");
    }
    for tool in [
        "dpkg",
        "setpriv",
        "systemd-sysusers",
        "systemd-tmpfiles",
        "useradd",
        "groupadd",
    ] {
        if !have(tool) {
            return skip_or_fail(&format!("{tool} is not installed"));
        }
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lock/warden-deb-install.lock")
        .expect("lock file");
    // SAFETY: flock on an fd we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    let installed_before = run(Command::new("dpkg-query").args(["-W", "-f=${Status}", "warden"]));
    if String::from_utf8_lossy(&installed_before.stdout).contains("installed") {
        // Ours, from a run that was killed before it could clean up (the marker says so), is
        // purged; anyone else's installation is left alone and the test fails.
        assert!(
            Path::new(MARKER).exists(),
            "the warden package is installed here, not by this test; it would purge it"
        );
        eprintln!("note: purging what an interrupted earlier run of this test installed");
        ok(Command::new("dpkg").args(["--purge", "warden"]));
        let _ = std::fs::remove_dir_all("/var/lib/warden");
    }
    let scratch = tempfile::Builder::new()
        .prefix("deb-install-")
        .tempdir_in("/tmp")
        .expect("scratch dir");
    std::fs::set_permissions(
        scratch.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod scratch");
    let Some(deb) = package(scratch.path()) else {
        return skip_or_fail(
            "cargo-deb is not installed (.ci/run installs it) and WARDEN_DEB is unset",
        );
    };
    // The probe, where every test user can execute it.
    let probe = scratch.path().join("warden-e2e-probe");
    std::fs::copy(binary("warden-e2e-probe"), &probe).expect("copy probe");
    let probe_s = probe.to_str().expect("utf-8 path").to_string();

    let mut host = Host {
        daemons: Vec::new(),
        installed: false,
        created_users: Vec::new(),
        moved: Vec::new(),
        agents_left: String::new(),
        agent_uid: pick_agent_uid(),
        _lock: lock,
    };
    let agent = host.agent_uid;
    // Left by something else without the package (a daemon run by hand with the example
    // configuration): moved aside for the test's duration and put back afterwards, never deleted.
    for p in SYSTEM_PATHS {
        if Path::new(p).exists() {
            let aside = PathBuf::from(format!("{p}.deb-install-aside-{}", std::process::id()));
            std::fs::rename(p, &aside).unwrap_or_else(|e| panic!("cannot move {p} aside: {e}"));
            eprintln!(
                "note: {p} existed without the package; moved to {} until the end",
                aside.display()
            );
            host.moved.push((PathBuf::from(p), aside));
        }
    }
    // Leftovers of an earlier run that could not clean up (sysusers would keep their ids).
    for u in USERS {
        let _ = Command::new("userdel")
            .arg(u)
            .stderr(Stdio::null())
            .status();
    }
    for g in GROUPS {
        let _ = Command::new("groupdel")
            .arg(g)
            .stderr(Stdio::null())
            .status();
    }
    let _ = Command::new("userdel")
        .arg(OPERATOR)
        .stderr(Stdio::null())
        .status();

    // The operators' group exists before the package, with an id other than the pinned 964:
    // sysusers keeps it, and the postinst must put its real gid into the allowlists.
    let operators_gid = (4_964..5_964)
        .find(|g| {
            Command::new("getent")
                .args(["group", &g.to_string()])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| !s.success())
        })
        .expect("a free gid");
    ok(Command::new("groupadd").args(["-r", "-g", &operators_gid.to_string(), "warden-operators"]));

    // ---- install
    let t = Instant::now();
    ok(Command::new("dpkg").arg("-i").arg(&deb));
    host.installed = true;
    std::fs::write(MARKER, "").expect("marker");
    eprintln!("dpkg -i took {:?}", t.elapsed());
    let files: Vec<PathBuf> = ok(Command::new("dpkg").args(["-L", "warden"]))
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    assert!(
        files
            .iter()
            .any(|p| p == Path::new("/usr/bin/warden-supervisor"))
    );
    // The monitoring files an operator points Prometheus and Grafana at.
    for f in [
        "/usr/share/warden/monitoring/prometheus/prometheus.yml",
        "/usr/share/warden/monitoring/prometheus/warden-alerts.yml",
        "/usr/share/warden/monitoring/grafana/warden-dashboard.json",
    ] {
        assert!(
            files.iter().any(|p| p == Path::new(f)),
            "the package does not install {f}"
        );
    }

    ok(Command::new("useradd").args([
        "-r",
        "-M",
        "-s",
        "/usr/sbin/nologin",
        "-G",
        "warden-operators",
        OPERATOR,
    ]));
    host.created_users.push(OPERATOR.to_string());

    // The postinst's id fill-in: the operators' real gid, nothing else changed.
    let policy_toml = std::fs::read_to_string("/etc/warden/policy.toml").expect("policy.toml");
    assert!(
        policy_toml.contains(&format!("allow_gids = [{operators_gid}]"))
            && !policy_toml.contains("allow_gids = [964]"),
        "the postinst did not put warden-operators' real gid {operators_gid} in policy.toml"
    );
    assert!(policy_toml.contains("allow_uids = [962, 967]"));
    for d in DAEMONS {
        let m = std::fs::metadata(format!("/etc/warden/{d}.toml")).expect("config");
        assert_eq!(m.mode() & 0o777, 0o640, "{d}.toml mode");
        assert_eq!(
            Some(m.gid()),
            id_of("group", &format!("warden-{d}")),
            "{d}.toml group"
        );
    }

    // ---- the example configurations as installed, checked by their daemons as their users
    for d in DAEMONS {
        let conf = format!("/etc/warden/{d}.toml");
        let out = run(&mut as_user(
            &format!("warden-{d}"),
            &[
                &format!("/usr/bin/warden-{d}"),
                "--config",
                &conf,
                "--check-config",
            ],
        ));
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("configuration OK"),
            "{conf} as installed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // ---- the operator's edits: a caller token and a free port for the gateway
    let token = format!("e2e-{}", uuid_like());
    let digest = {
        let out =
            ok(Command::new("sh").args(["-c", &format!("printf '%s' '{token}' | sha256sum")]));
        out.split_whitespace().next().expect("digest").to_string()
    };
    let port = free_port();
    let gw = std::fs::read_to_string("/etc/warden/gateway.toml").expect("gateway.toml");
    let gw = gw
        .replace(
            "279dba2097250d875175f26b5ca2a8ee271093e370d47991313f6ac79e2c7739",
            &digest,
        )
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    std::fs::write("/etc/warden/gateway.toml", gw).expect("edit gateway.toml");
    let sup = std::fs::read_to_string("/etc/warden/supervisor.toml").expect("supervisor.toml");
    assert!(
        sup.contains("\n# agent_user = \"\"\n"),
        "supervisor.toml has no agent_user line"
    );
    let sup = sup.replace(
        "\n# agent_user = \"\"\n",
        &format!("\nagent_user = \"{agent}\"\n"),
    );
    // No systemd here, so nothing delegates a cgroup subtree to the supervisor (Delegate=yes):
    // as on such a host, no cgroups. Its agents are then
    // stopped by signals, across the uid boundary: what CAP_KILL is for.
    assert!(
        sup.contains("\ncgroup = true\n"),
        "supervisor.toml has no cgroup line"
    );
    let sup = sup.replace("\ncgroup = true\n", "\ncgroup = false\n");
    // The cancel check below counts the agent uid's new processes after a send: without a warm
    // scripted agent, whose refill would start new ones that rightly stay.
    let sup = format!("{sup}\n[agents.scripted]\npool_size = 0\n");
    std::fs::write("/etc/warden/supervisor.toml", sup).expect("edit supervisor.toml");
    let token_file = scratch.path().join("token");
    std::fs::write(&token_file, &token).expect("token file");

    // ---- start each daemon as its unit says
    let logs = scratch.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let mut units = BTreeMap::new();
    for d in DAEMONS {
        let unit = start_daemon(&mut host, d, &probe, &logs);
        units.insert(d, unit);
    }
    let show_logs = || {
        for d in DAEMONS {
            let text = std::fs::read_to_string(logs.join(format!("{d}.log"))).unwrap_or_default();
            eprintln!("--- warden-{d}\n{text}");
        }
    };

    // ---- a task through all three, its agent as uid 61000
    let scenario = serde_json::json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "hello.txt", "content": "hello from the agent\n"},
        // fs/write_text_file, carried out by the fs servant in the agent's sandbox as the agent.
        {"type": "tool", "kind": "edit", "path": "client.txt", "content": "written for the agent\n",
         "via": "client"},
        {"type": "tool", "kind": "execute", "command":
            "id -u > uid.txt; id -G > gids.txt; grep ^Cap /proc/self/status > caps.txt; \
             ls /run/warden/policy > run.txt 2>&1; ls /var/lib/warden/policy > state.txt 2>&1; true"},
        {"type": "message", "text": "done"}
    ]});
    let out = run(Command::new("/usr/bin/warden")
        .args([
            "send",
            "--agent",
            "scripted",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .arg("--token-file")
        .arg(&token_file)
        .arg(scenario.to_string()));
    if !out.status.success() {
        show_logs();
    }
    assert!(
        out.status.success(),
        "the task did not complete with every permission allowed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let root = std::fs::read_dir("/var/lib/warden/supervisor/sandboxes")
        .expect("sandboxes")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("uid.txt").is_file())
        .expect("the agent's root with its uid.txt");
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap_or_default();
    assert_eq!(read("hello.txt"), "hello from the agent\n");
    assert_eq!(
        read("client.txt"),
        "written for the agent\n",
        "fs/write_text_file"
    );
    assert_eq!(
        std::fs::metadata(root.join("client.txt"))
            .expect("client.txt")
            .uid(),
        agent
    );
    assert_eq!(
        std::fs::metadata(root.join("hello.txt"))
            .expect("hello")
            .uid(),
        agent
    );
    assert_eq!(read("uid.txt").trim(), agent.to_string(), "the agent's uid");
    let daemon_gids: Vec<u32> = GROUPS.iter().filter_map(|g| id_of("group", g)).collect();
    for g in read("gids.txt").split_whitespace() {
        let g: u32 = g.parse().expect("gid");
        assert!(
            !daemon_gids.contains(&g),
            "the agent is in warden group {g}"
        );
    }
    let caps = read("caps.txt");
    eprintln!(
        "the agent: uid {} groups {} in {}\n{caps}",
        read("uid.txt").trim(),
        read("gids.txt").trim(),
        root.display()
    );
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert!(
            caps.lines()
                .any(|l| l.starts_with(set) && l.ends_with("0000000000000000")),
            "the agent holds capabilities ({set}): {caps}"
        );
    }
    for f in ["run.txt", "state.txt"] {
        let text = read(f);
        assert!(
            text.contains("No such file") || text.contains("Permission denied"),
            "the agent listed a daemon's directory ({f}): {text}"
        );
    }
    for d in DAEMONS {
        let uid = id_of("passwd", &format!("warden-{d}")).expect("uid");
        assert_ne!(uid, agent);
    }

    // ---- a close removes the conversation's root and home with the agent's rights (the unit
    // gives the supervisor no CAP_DAC_OVERRIDE): what the agent closed to itself goes too, and
    // the links it planted to what it cannot delete (the supervisor's own file and directory)
    // are removed as links, their targets untouched
    let sandboxes = Path::new("/var/lib/warden/supervisor/sandboxes");
    let homes = Path::new("/var/lib/warden/supervisor/homes");
    let named = |dir: &Path, prefix: &str| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let victim = Path::new("/var/lib/warden/supervisor/victim");
    std::fs::create_dir_all(victim).expect("victim dir");
    std::fs::write(victim.join("keep"), "the supervisor's\n").expect("victim file");
    ok(Command::new("chown")
        .args(["-R", "warden-supervisor:warden-supervisor"])
        .arg(victim));
    ok(Command::new("chmod").arg("0700").arg(victim));
    let send_in = |context: &str, scenario: &serde_json::Value| {
        let out = run(Command::new("/usr/bin/warden")
            .args([
                "send",
                "--agent",
                "scripted",
                "--context",
                context,
                "--url",
                &format!("http://127.0.0.1:{port}"),
            ])
            .arg("--token-file")
            .arg(&token_file)
            .arg(scenario.to_string()));
        assert!(
            out.status.success(),
            "the task in {context} did not complete ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // `closed`: whether a live conversation was there (after a restart only its root is).
    let close = |context: &str, closed: bool| {
        let out = run(&mut as_user(
            "warden-gateway",
            &[
                &probe_s,
                "/run/warden/supervisor/supervisor.sock",
                "close",
                context,
            ],
        ));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("CLOSED {closed}"),
            "closing {context}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    send_in(
        "deb-close",
        &serde_json::json!({"steps": [
            {"type": "tool", "kind": "execute", "command": format!(
                "mkdir -p closed/inner deep/a/b && echo x > closed/inner/f && echo y > deep/a/b/g \
                 && ln -s {v} deep/a/b/planted && chmod 000 closed && chmod 500 deep/a \
                 && ln -s {v}/keep planted-file && ln -s {v} planted-dir && touch planted.done",
                v = victim.display())},
            {"type": "message", "text": "planted"}
        ]}),
    );
    let planted_root = std::fs::read_dir(sandboxes)
        .expect("sandboxes")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("planted.done").is_file())
        .expect("the root the agent planted its links in");
    assert!(
        std::fs::symlink_metadata(planted_root.join("planted-file"))
            .expect("planted-file")
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        named(homes, "deb-close-").len(),
        1,
        "the conversation's home"
    );
    close("deb-close", true);
    if planted_root.exists() || !named(homes, "deb-close-").is_empty() {
        show_logs();
    }
    assert!(
        !planted_root.exists(),
        "the closed conversation's root {} is still there",
        planted_root.display()
    );
    assert!(
        named(homes, "deb-close-").is_empty(),
        "the closed conversation's home is still there"
    );
    assert_eq!(
        std::fs::read_to_string(victim.join("keep")).expect("the supervisor's file survives"),
        "the supervisor's\n"
    );
    let vm = std::fs::metadata(victim).expect("the supervisor's directory survives");
    assert_eq!(vm.mode() & 0o7777, 0o700);
    assert_eq!(vm.uid(), id_of("passwd", "warden-supervisor").expect("uid"));

    // ---- a cancelled turn whose agent ignores the cancel: the supervisor kills the agent's
    // tree across the uid boundary (CAP_KILL), while it keeps running
    let agent_pids = || -> std::collections::BTreeSet<u32> {
        let out = run(Command::new("pgrep").args(["-U", &agent.to_string()]));
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let before = agent_pids();
    let hang = serde_json::json!({"on_cancel": "never", "ignore_stdin_eof": true,
        "steps": [{"type": "spawn", "ignore_term": true, "grandchild_setsid": true},
                  {"type": "hang"}]});
    let mut send = Command::new("/usr/bin/warden")
        .args([
            "send",
            "--agent",
            "scripted",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .arg("--token-file")
        .arg(&token_file)
        .arg(hang.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("warden send");
    let deadline = Instant::now() + Duration::from_secs(20);
    // The agent, its SIGTERM-ignoring child and the grandchild that left the process group.
    let started = loop {
        let new: Vec<u32> = agent_pids().difference(&before).copied().collect();
        if new.len() >= 3 {
            break new;
        }
        assert!(Instant::now() < deadline, "the hanging agent never started");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Let the turn reach its hang, then cancel as Ctrl-C would.
    std::thread::sleep(Duration::from_millis(500));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(send.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = send.wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let live = live_processes_of(agent);
        let alive: Vec<u32> = started
            .iter()
            .copied()
            .filter(|p| {
                live.iter()
                    .any(|l| l.split(' ').next() == Some(&p.to_string()))
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            show_logs();
            panic!("the cancelled turn's agent processes {alive:?} (uid {agent}) survived");
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // ---- who may call which socket
    let gid = |g: &str| id_of("group", g).expect("gid");
    // The clients' groups without the operators': past every directory and file mode.
    let clients = [
        gid("warden-supervisor-clients"),
        gid("warden-policy-clients"),
        gid("warden-approver-clients"),
    ];
    let sockets: [(&str, &[&str]); 6] = [
        (
            "/run/warden/policy/policy.sock",
            &["warden-supervisor", "warden-approver"],
        ),
        ("/run/warden/policy/policy-admin.sock", &[OPERATOR]),
        ("/run/warden/approver/approver.sock", &["warden-supervisor"]),
        ("/run/warden/approver/approver-admin.sock", &[OPERATOR]),
        (
            "/run/warden/supervisor/supervisor.sock",
            &["warden-gateway"],
        ),
        ("/run/warden/gateway/gateway.sock", &[OPERATOR]),
    ];
    let callers = [
        "warden-policy",
        "warden-supervisor",
        "warden-gateway",
        "warden-approver",
        OPERATOR,
    ];
    for (socket, admitted) in sockets {
        for who in callers {
            let out = run(&mut as_user(who, &[&probe_s, socket]));
            let said = String::from_utf8_lossy(&out.stdout).into_owned();
            if admitted.contains(&who) {
                assert!(
                    out.status.success(),
                    "{who} was refused by {socket}: {said}"
                );
            } else {
                assert!(
                    !out.status.success() && !said.starts_with("SERVING"),
                    "{who} was served by {socket}, which is not its to call: {said}"
                );
            }
        }
        // An agent uid: no group at all, then every clients' group (the modes let it connect;
        // the peer allowlist must still refuse it).
        for groups in [&[][..], &clients[..]] {
            let out = run(&mut as_ids(agent, groups, &[&probe_s, socket]));
            let said = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                !out.status.success() && !said.starts_with("SERVING"),
                "uid {agent} with groups {groups:?} was served by {socket}: {said}"
            );
            if !groups.is_empty() && !socket.contains("admin") && !socket.contains("gateway.sock") {
                assert!(
                    said.starts_with("DENIED"),
                    "{socket}: past the modes, the allowlist must refuse uid {agent}: {said}"
                );
            }
        }
    }

    // ---- the operator's own tools
    let out = run(&mut as_user(
        OPERATOR,
        &["/usr/bin/warden", "--deployed", "status"],
    ));
    assert!(
        out.status.success(),
        "warden --deployed status as an operator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let audit = ok(&mut as_user(
        OPERATOR,
        &["/usr/bin/warden", "--deployed", "audit", "tail", "-n", "10"],
    ));
    eprintln!("warden --deployed audit tail as {OPERATOR}:\n{audit}");
    assert!(
        audit.contains("ALLOW") && audit.contains("hello.txt"),
        "the operator's audit tail does not show the task's decisions:\n{audit}"
    );
    let out = run(&mut as_user(
        OPERATOR,
        &["/usr/bin/warden", "--deployed", "approvals", "list"],
    ));
    assert!(
        out.status.success(),
        "warden --deployed approvals list as an operator: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not an operator: refused.
    let out = run(&mut as_user(
        "warden-gateway",
        &["/usr/bin/warden", "--deployed", "audit", "tail"],
    ));
    assert!(!out.status.success(), "warden-gateway read the audit log");

    // ---- an agent uid cannot read any daemon's state
    for d in ["policy", "gateway", "approver"] {
        let p = format!("/var/lib/warden/{d}");
        let out = run(&mut as_ids(agent, &[], &["ls", &p]));
        assert!(!out.status.success(), "uid {agent} listed {p}");
    }
    let out = run(&mut as_ids(
        agent,
        &[],
        &["ls", "/var/lib/warden/supervisor/store"],
    ));
    assert!(
        !out.status.success(),
        "uid {agent} listed the supervisor's store"
    );
    let out = run(&mut as_ids(
        agent,
        &[],
        &["cat", "/etc/warden/gateway.toml"],
    ));
    assert!(!out.status.success(), "uid {agent} read gateway.toml");

    // ---- the doctor agrees
    let out = run(Command::new("/usr/bin/warden").args(["doctor", "--deployed"]));
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("warden doctor --deployed:\n{report}");
    assert!(
        out.status.success() && !report.contains("FAIL"),
        "warden doctor --deployed on this installation:\n{report}"
    );
    assert!(
        report.contains(&format!("admits warden-operators ({operators_gid})")),
        "{report}"
    );
    // A stale id in an allowlist (the gateway's uid as it would be on another host): the
    // doctor names it and fails.
    let sup_conf = std::fs::read_to_string("/etc/warden/supervisor.toml").expect("read");
    let gateway_uid = id_of("passwd", "warden-gateway").expect("gateway uid");
    let stale = sup_conf.replace(
        &format!("allow_uids = [{gateway_uid}]"),
        "allow_uids = [4242424]",
    );
    assert_ne!(
        stale, sup_conf,
        "supervisor.toml has no allow_uids = [{gateway_uid}]"
    );
    std::fs::write("/etc/warden/supervisor.toml", &stale).expect("write");
    let out = run(Command::new("/usr/bin/warden").args(["doctor", "--deployed"]));
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !out.status.success()
            && report.contains(&format!(
                "FAIL  supervisor.toml [listen] allow_uids admits warden-gateway ({gateway_uid})"
            ))
            && report.contains("allow_uids has 4242424, which no user on this host has"),
        "the doctor did not fail on a stale allowlist:\n{report}"
    );
    std::fs::write("/etc/warden/supervisor.toml", &sup_conf).expect("restore");

    // ---- purge, keeping the state when asked
    let live_agents = run(Command::new("pgrep").args(["-U", &agent.to_string()]));
    assert!(
        live_agents.status.success(),
        "the conversation's agent (uid {agent}) should still be running, idle"
    );
    host.stop_daemons();
    assert_eq!(
        host.agents_left, "",
        "the supervisor's shutdown left agent processes (uid {agent}) running"
    );
    // ---- warm agents and crash recovery, still without CAP_DAC_OVERRIDE: the pool's checks of
    // a warm root and home (walked with the agent's rights) hand a warm agent to a task; after
    // the supervisor is killed, its next start removes the warm roots and the homes it left
    let sup_conf = std::fs::read_to_string("/etc/warden/supervisor.toml").expect("read");
    let warm_conf = sup_conf.replace(
        "\n[agents.scripted]\npool_size = 0\n",
        "\n[agents.scripted]\npool_size = 1\n",
    );
    assert_ne!(warm_conf, sup_conf, "supervisor.toml has no pool_size = 0");
    std::fs::write("/etc/warden/supervisor.toml", &warm_conf).expect("write");
    let sup_log = logs.join("supervisor.log");
    let count = |what: &str| {
        std::fs::read_to_string(&sup_log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    let wait_for = |what: &str, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(what) < n {
            if Instant::now() > deadline {
                show_logs();
                panic!("the supervisor's log has fewer than {n} lines saying {what:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for d in DAEMONS {
        start_daemon(&mut host, d, &probe, &logs);
    }
    wait_for("warm agent ready", 1);
    send_in(
        "deb-warm",
        &serde_json::json!({"steps": [
            {"type": "tool", "kind": "edit", "path": "warm.txt", "content": "from a warm agent\n"},
            {"type": "message", "text": "done"}
        ]}),
    );
    assert_eq!(
        count("conversation takes a warm agent"),
        1,
        "the task did not take the warm agent"
    );
    assert_eq!(count("a warm agent is not handed out"), 0);
    let warm_root = std::fs::read_dir(sandboxes)
        .expect("sandboxes")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("warm.txt").is_file())
        .expect("the warm agent's root, now the task's");
    assert_eq!(
        std::fs::metadata(warm_root.join("warm.txt"))
            .expect("warm.txt")
            .uid(),
        agent
    );
    // The pool refills; then the supervisor dies without a word.
    wait_for("warm agent ready", 2);
    // The warm roots waiting (the task's root keeps its warm name: it is the task's now).
    let left_roots: Vec<PathBuf> = named(sandboxes, "warden-pool_")
        .into_iter()
        .filter(|p| *p != warm_root)
        .collect();
    let left_homes: Vec<PathBuf> = named(homes, "");
    assert!(!left_roots.is_empty() && !left_homes.is_empty());
    let i = host
        .daemons
        .iter()
        .position(|(n, _)| n == "supervisor")
        .expect("the supervisor runs");
    let (_, mut sup) = host.daemons.remove(i);
    sup.kill().expect("SIGKILL the supervisor");
    sup.wait().expect("reap the supervisor");
    start_daemon(&mut host, "supervisor", &probe, &logs);
    wait_for("removed the warm roots of a previous run", 1);
    wait_for("removed agent homes left by a previous run", 1);
    if left_roots.iter().chain(&left_homes).any(|p| p.exists()) {
        show_logs();
    }
    for p in left_roots.iter().chain(&left_homes) {
        assert!(
            !p.exists(),
            "{} survived the restart after the crash",
            p.display()
        );
    }
    // The task's own root is its context's until a close: the close removes it.
    assert!(warm_root.is_dir(), "the task's root went with the crash");
    close("deb-warm", false);
    assert!(!warm_root.exists(), "the closed task's root is still there");
    host.stop_daemons();
    assert_eq!(
        host.agents_left, "",
        "the supervisor's shutdown left agent processes (uid {agent}) running"
    );
    std::fs::write("/etc/warden/supervisor.toml", &sup_conf).expect("restore");

    std::fs::write("/var/lib/warden/keep-on-purge", "").expect("keep marker");
    ok(Command::new("dpkg").args(["--purge", "warden"]));
    host.installed = false;
    for f in &files {
        assert!(!f.exists(), "{} survived the purge", f.display());
    }
    assert!(!Path::new("/etc/warden").exists() && !Path::new("/run/warden").exists());
    assert!(
        Path::new("/var/lib/warden/policy/store").is_dir(),
        "the audit store went although keep-on-purge asked to keep it"
    );
    // Again, without the marker, onto an /etc/warden/policy.toml the operator wrote before
    // installing (dpkg keeps it, --force-confold): the postinst leaves that file's allowlists
    // alone (the users, kept by the purge, still have the non-pinned operators' gid) and fills
    // in the others.
    std::fs::remove_file("/var/lib/warden/keep-on-purge").expect("marker");
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/policy.toml"),
    )
    .expect("deploy/config/policy.toml");
    let edited = shipped.replace("log_level = \"info\"", "log_level = \"debug\"");
    assert_ne!(edited, shipped);
    std::fs::create_dir_all("/etc/warden").expect("mkdir /etc/warden");
    std::fs::write("/etc/warden/policy.toml", &edited).expect("operator's policy.toml");
    ok(Command::new("dpkg")
        .args(["-i", "--force-confold"])
        .arg(&deb));
    host.installed = true;
    assert_eq!(
        std::fs::read_to_string("/etc/warden/policy.toml").expect("policy.toml"),
        edited,
        "the package changed a configuration the operator had written"
    );
    let gateway = std::fs::read_to_string("/etc/warden/gateway.toml").expect("gateway.toml");
    assert!(
        gateway.contains(&format!("allow_gids = [{operators_gid}]")),
        "the postinst did not fill in the unedited gateway.toml"
    );
    ok(Command::new("dpkg").args(["--purge", "warden"]));
    host.installed = false;
    assert!(
        !Path::new("/var/lib/warden").exists(),
        "/var/lib/warden survived the purge"
    );
    drop(host);
}

/// Starts warden-`d` as its installed unit says (`User=`/`Group=`, capabilities,
/// `NoNewPrivileges=`, `UMask=`, `StateDirectory=`, `ExecStart`) under `setpriv`, and returns once
/// it serves (in dependency order, each one serving before the next starts: `After=`).
fn start_daemon(host: &mut Host, d: &'static str, probe: &Path, logs: &Path) -> Unit {
    let unit = parse_unit(Path::new(&format!(
        "/usr/lib/systemd/system/warden-{d}.service"
    )));
    assert_eq!(unit.user, format!("warden-{d}"));
    for (base, dirs, mode) in [
        ("/var/lib", &unit.state_dirs, &unit.state_mode),
        ("/run", &unit.runtime_dirs, &unit.runtime_mode),
    ] {
        for rel in dirs {
            let p = Path::new(base).join(rel);
            std::fs::create_dir_all(&p).expect("state dir");
            ok(Command::new("chown")
                .arg(format!("{}:{}", unit.user, unit.group))
                .arg(&p));
            ok(Command::new("chmod")
                .arg(mode.as_deref().unwrap_or("0755"))
                .arg(&p));
        }
    }
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={}", unit.user))
        .arg(format!("--regid={}", unit.group))
        .arg("--init-groups");
    if !unit.ambient.is_empty() {
        cmd.arg(format!("--inh-caps={}", setpriv_caps(&unit.ambient)))
            .arg(format!("--ambient-caps={}", setpriv_caps(&unit.ambient)));
    }
    if let Some(b) = &unit.bounding {
        let mut set = "-all".to_string();
        if !b.is_empty() {
            set.push(',');
            set.push_str(&setpriv_caps(b));
        }
        cmd.arg(format!("--bounding-set={set}"));
    }
    if unit.no_new_privs {
        cmd.arg("--no-new-privs");
    }
    let umask = unit.umask.clone().unwrap_or_else(|| "0022".into());
    cmd.args([
        "--",
        "/bin/sh",
        "-c",
        &format!("umask {umask} && exec \"$@\""),
        "sh",
    ])
    .args(&unit.exec);
    // Appended to: a daemon started again (the test's restarts) keeps its earlier lines.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{d}.log")))
        .expect("log");
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0);
    let child = cmd.spawn().expect("start daemon");
    host.daemons.push((d.to_string(), child));
    // In dependency order, each one serving before the next starts (After=).
    let (socket, who) = match d {
        "policy" => ("/run/warden/policy/policy.sock", "warden-supervisor"),
        "approver" => ("/run/warden/approver/approver.sock", "warden-supervisor"),
        "supervisor" => ("/run/warden/supervisor/supervisor.sock", "warden-gateway"),
        _ => ("/run/warden/gateway/gateway.sock", OPERATOR),
    };
    wait_serving(probe, socket, who, &logs.join(format!("{d}.log")));
    unit
}

/// A random enough token suffix without a new dependency (the pid and the clock).
fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}{:x}", std::process::id(), t)
}
