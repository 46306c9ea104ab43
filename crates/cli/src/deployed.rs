//! `warden doctor --deployed`: checks a host installed from the Debian package (or by hand from
//! `deploy/`) against what the units, `sysusers.d`, `tmpfiles.d` and `/etc/warden/*.toml` must
//! agree on: the users and groups and their memberships, the socket and state directories'
//! owners and modes, the peer allowlists against the users' real ids, that warden-policy can
//! search its way into the supervisor's sandboxes while an agent uid can reach none of the
//! daemons' sockets or state, and what the supervisor's sandbox needs (bubblewrap, cgroup v2
//! delegation).
//!
//! Must never: change anything on the host. Access checks run a `test` child under the user in
//! question (only possible as root; otherwise they are reported as skipped), so ACLs count as
//! the kernel counts them.

use std::collections::BTreeSet;
use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// Where the package puts things. The same paths as `deploy/`.
pub const CONFIG_DIR: &str = "/etc/warden";
pub const RUN_DIR: &str = "/run/warden";
pub const STATE_DIR: &str = "/var/lib/warden";

/// The daemons, their users, and the group of their main socket's clients.
const DAEMONS: [(&str, &str); 4] = [
    ("policy", "warden-policy-clients"),
    ("supervisor", "warden-supervisor-clients"),
    ("gateway", "warden-operators"),
    ("approver", "warden-approver-clients"),
];
const OPERATORS: &str = "warden-operators";
/// Who must be in which group (`deploy/sysusers.d/warden.conf`).
const MEMBERSHIPS: [(&str, &str); 5] = [
    ("warden-gateway", "warden-supervisor-clients"),
    ("warden-supervisor", "warden-policy-clients"),
    ("warden-supervisor", "warden-approver-clients"),
    ("warden-approver", "warden-policy-clients"),
    ("warden-policy", "warden-supervisor"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Pass => "PASS",
            Level::Skip => "SKIP",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    pub level: Level,
    pub what: String,
}

/// Every check, in order. `failed()` decides the exit code.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    fn add(&mut self, level: Level, what: impl Into<String>) {
        self.checks.push(Check {
            level,
            what: what.into(),
        });
    }
    fn pass(&mut self, what: impl Into<String>) {
        self.add(Level::Pass, what)
    }
    fn fail(&mut self, what: impl Into<String>) {
        self.add(Level::Fail, what)
    }
    fn check(&mut self, ok: bool, what: impl Into<String>, why_not: impl FnOnce() -> String) {
        let what = what.into();
        if ok {
            self.pass(what)
        } else {
            self.fail(format!("{what}: {}", why_not()))
        }
    }

    pub fn failed(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.level == Level::Fail)
            .count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            writeln!(f, "{}  {}", c.level, c.what)?;
        }
        let n = |l| self.checks.iter().filter(|c| c.level == l).count();
        write!(
            f,
            "{} passed, {} failed, {} warnings, {} skipped",
            n(Level::Pass),
            n(Level::Fail),
            n(Level::Warn),
            n(Level::Skip)
        )
    }
}

#[derive(Debug, Clone)]
struct Account {
    uid: u32,
    gid: u32,
    /// Primary and supplementary gids.
    groups: Vec<u32>,
}

fn user(name: &str) -> Option<Account> {
    let u = nix::unistd::User::from_name(name).ok().flatten()?;
    let mut groups = vec![u.gid.as_raw()];
    if let Ok(cname) = std::ffi::CString::new(name)
        && let Ok(g) = nix::unistd::getgrouplist(&cname, u.gid)
    {
        groups.extend(g.into_iter().map(|g| g.as_raw()));
    }
    groups.sort_unstable();
    groups.dedup();
    Some(Account {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        groups,
    })
}

fn group_id(name: &str) -> Option<u32> {
    nix::unistd::Group::from_name(name)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw())
}

fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| gid.to_string())
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// Whether `who` may `op` (`-x` search, `-r` read, `-w` write) `path`, as the kernel decides
/// (modes and ACLs): a `test` child switched to `who`. `None` when this process cannot switch
/// (not root) or cannot run the child.
fn may(who: &Account, op: &str, path: &Path) -> Option<bool> {
    run_as(
        who,
        Path::new("test"),
        &[op.into(), path.as_os_str().to_owned()],
    )
}

/// Runs `program args` as `who` (its uid, gid and groups); `Some(success)`, or `None` when this
/// process cannot switch (not root) or cannot run the child.
fn run_as(who: &Account, program: &Path, args: &[std::ffi::OsString]) -> Option<bool> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let (uid, gid) = (who.uid, who.gid);
    let groups: Vec<nix::unistd::Gid> = who
        .groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only setgroups/setgid/setuid, on data built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(gid))?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(uid))?;
            Ok(())
        });
    }
    cmd.status().ok().map(|s| s.success())
}

/// An agent: the configured `[sandbox] agent_user` or the default uid, in no group but its own.
fn agent_account(cfg: Option<&Value>) -> Account {
    let configured = cfg
        .and_then(|c| c.pointer("/sandbox/agent_user"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let first_of_range = cfg
        .and_then(|c| c.pointer("/sandbox/agent_uid_range/0"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    let uid = match (configured, first_of_range) {
        (Some(u), _) => u
            .parse::<u32>()
            .ok()
            .or_else(|| user(u).map(|a| a.uid))
            .unwrap_or(warden_sandbox::DEFAULT_AGENT_UID),
        (None, Some(first)) => first,
        (None, None) => warden_sandbox::DEFAULT_AGENT_UID,
    };
    let gid = configured.and_then(user).map(|a| a.gid).unwrap_or(uid);
    Account {
        uid,
        gid,
        groups: vec![gid],
    }
}

fn load(path: &Path) -> Result<Value, String> {
    warden_daemon::config::load::<Value>(Some(path), "", "WARDEN_DOCTOR_DEPLOYED_UNUSED", &[])
        .map(|c| c.value)
        .map_err(|e| e.to_string())
}

fn numbers(cfg: &Value, pointer: &str) -> BTreeSet<u32> {
    cfg.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .filter_map(|n| u32::try_from(n).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn mode_of(p: &Path) -> Option<(u32, u32, u32)> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.uid(), m.gid(), m.permissions().mode() & 0o7777))
}

/// (daemon, listener section, uids that must be admitted, gids that must be admitted)
type Expected<'a> = (&'a str, &'a str, Vec<Option<u32>>, Vec<Option<u32>>);

/// Runs every check. Reads only.
pub fn check() -> Report {
    let mut r = Report::default();
    let root = nix::unistd::geteuid().is_root();
    if !root {
        r.add(
            Level::Skip,
            "not run as root: the configuration files (0640) and the access checks as each \
             user need root; run `sudo warden doctor --deployed` for the full report",
        );
    }

    // Users, groups, memberships.
    let mut users = std::collections::BTreeMap::new();
    for (d, _) in DAEMONS {
        let name = format!("warden-{d}");
        match user(&name) {
            Some(a) => {
                r.pass(format!("user {name} exists (uid {}, gid {})", a.uid, a.gid));
                users.insert(d, a);
            }
            None => r.fail(format!(
                "user {name} is missing (systemd-sysusers /usr/lib/sysusers.d/warden.conf)"
            )),
        }
    }
    for g in [
        OPERATORS,
        "warden-supervisor-clients",
        "warden-policy-clients",
        "warden-approver-clients",
    ] {
        match group_id(g) {
            Some(id) => r.pass(format!("group {g} exists (gid {id})")),
            None => r.fail(format!("group {g} is missing")),
        }
    }
    for (u, g) in MEMBERSHIPS {
        if let (Some(a), Some(gid)) = (user(u), group_id(g)) {
            r.check(a.groups.contains(&gid), format!("{u} is in {g}"), || {
                "it is not: it cannot reach the socket this membership is for".into()
            });
        }
    }

    // Configurations and their allowlists.
    let mut cfgs = std::collections::BTreeMap::new();
    for (d, _) in DAEMONS {
        let path = Path::new(CONFIG_DIR).join(format!("{d}.toml"));
        if !path.exists() {
            r.fail(format!("{} is missing", path.display()));
            continue;
        }
        match load(&path) {
            Ok(v) => {
                r.pass(format!("{} parses", path.display()));
                cfgs.insert(d, v);
            }
            Err(e) if !root && e.contains("ermission denied") => r.add(
                Level::Skip,
                format!("{}: not readable by this user", path.display()),
            ),
            Err(e) => r.fail(format!("{}: {e}", path.display())),
        }
    }
    let uid = |d: &str| users.get(d).map(|a: &Account| a.uid);
    let operators = group_id(OPERATORS);
    // (daemon, listener, the uids that must be admitted, the gids that must be admitted)
    let expect: [Expected; 6] = [
        ("policy", "listen", vec![uid("supervisor")], vec![]),
        ("policy", "admin", vec![], vec![operators]),
        ("supervisor", "listen", vec![uid("gateway")], vec![]),
        ("gateway", "listen", vec![], vec![operators]),
        ("approver", "listen", vec![uid("supervisor")], vec![]),
        ("approver", "admin", vec![], vec![operators]),
    ];
    // Who may appear in an allowlist at all: the daemons that call each other and the
    // operators. Anything else is reported (an agent uid, a stale number).
    let known_uids: BTreeSet<u32> = users.values().map(|a| a.uid).chain([0]).collect();
    for (d, section, uids, gids) in expect {
        let Some(cfg) = cfgs.get(d) else { continue };
        let have_u = numbers(cfg, &format!("/{section}/allow_uids"));
        let have_g = numbers(cfg, &format!("/{section}/allow_gids"));
        let label = format!("{d}.toml [{section}]");
        for want in uids.into_iter().flatten() {
            r.check(
                have_u.contains(&want),
                format!("{label} allow_uids admits {} ({want})", user_name(want)),
                || format!("it has {have_u:?}: that caller is refused"),
            );
        }
        for want in gids.into_iter().flatten() {
            r.check(
                have_g.contains(&want),
                format!("{label} allow_gids admits {} ({want})", group_name(want)),
                || format!("it has {have_g:?}: the operators are refused"),
            );
        }
        for u in &have_u {
            if !known_uids.contains(u)
                && nix::unistd::User::from_uid((*u).into())
                    .ok()
                    .flatten()
                    .is_none()
            {
                r.fail(format!(
                    "{label} allow_uids has {u}, which no user on this host has (a stale id? \
                     `id warden-...` gives the real ones)"
                ));
            }
        }
        // The socket's group must be the one its clients are in.
        if let Some(g) = cfg
            .pointer(&format!("/{section}/group"))
            .and_then(Value::as_str)
        {
            r.check(
                group_id(g).is_some(),
                format!("{label} group {g:?} exists"),
                || "it does not: the daemon refuses to start".into(),
            );
        }
    }

    // Runtime (socket) directories and sockets.
    for (d, clients) in DAEMONS {
        let dir = Path::new(RUN_DIR).join(d);
        let Some(a) = users.get(d) else { continue };
        match mode_of(&dir) {
            None => r.fail(format!(
                "{} is missing (systemd-tmpfiles --create /usr/lib/tmpfiles.d/warden.conf)",
                dir.display()
            )),
            Some((u, g, m)) => {
                let want_g = group_id(clients);
                r.check(
                    u == a.uid && Some(g) == want_g && m == 0o750,
                    format!("{} is 0750 warden-{d}:{clients}", dir.display()),
                    || format!("it is {m:04o} {}:{}", user_name(u), group_name(g)),
                );
            }
        }
        let Some(cfg) = cfgs.get(d) else { continue };
        for section in ["listen", "admin"] {
            let Some(sock) = cfg
                .pointer(&format!("/{section}/socket"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            let sock = PathBuf::from(sock);
            let want_mode = cfg
                .pointer(&format!("/{section}/mode"))
                .and_then(Value::as_str)
                .and_then(|m| u32::from_str_radix(m, 8).ok());
            let want_group = cfg
                .pointer(&format!("/{section}/group"))
                .and_then(Value::as_str)
                .and_then(group_id);
            match mode_of(&sock) {
                None => r.add(
                    Level::Skip,
                    format!("{}: not there (warden-{d} not running)", sock.display()),
                ),
                Some((_, g, m)) => r.check(
                    Some(m) == want_mode && (want_group.is_none() || Some(g) == want_group),
                    format!(
                        "{} is {:04o} group {}",
                        sock.display(),
                        want_mode.unwrap_or(0),
                        want_group.map(group_name).unwrap_or_default()
                    ),
                    || format!("it is {m:04o} group {}", group_name(g)),
                ),
            }
        }
    }

    // State directories.
    for (d, _) in DAEMONS {
        let dir = Path::new(STATE_DIR).join(d);
        let Some(a) = users.get(d) else { continue };
        let want = if d == "supervisor" { 0o710 } else { 0o700 };
        match mode_of(&dir) {
            None => r.fail(format!("{} is missing", dir.display())),
            Some((u, _, m)) => r.check(
                u == a.uid && m & 0o7770 == want & 0o7770 && m & 0o006 == 0,
                format!("{} is owned by warden-{d}, mode {want:04o}", dir.display()),
                || format!("it is {m:04o} owned by {}", user_name(u)),
            ),
        }
    }

    // Who can reach what, as the kernel decides (modes and ACLs).
    if let Some(policy) = users.get("policy") {
        let sandboxes = Path::new(STATE_DIR).join("supervisor/sandboxes");
        match may(policy, "-x", &sandboxes) {
            None => r.add(Level::Skip, "access as warden-policy: needs root"),
            Some(ok) => r.check(
                ok,
                format!(
                    "warden-policy can search {} (it resolves agents' paths there)",
                    sandboxes.display()
                ),
                || "it cannot: every located edit would be denied as unresolvable".into(),
            ),
        }
        let gateway_state = Path::new(STATE_DIR).join("gateway");
        if gateway_state.exists()
            && let Some(op) = may(policy, "-r", &gateway_state)
        {
            r.check(!op, "warden-policy cannot read the gateway's state", || {
                "it can".into()
            });
        }
    }
    let agent = agent_account(cfgs.get("supervisor"));
    for (d, _) in DAEMONS {
        // The supervisor's state directory is open to agents for search (their roots and
        // homes are below it); its store is not.
        let state = Path::new(STATE_DIR).join(d);
        let state = if d == "supervisor" {
            state.join("store")
        } else {
            state
        };
        for dir in [Path::new(RUN_DIR).join(d), state] {
            if !dir.exists() {
                continue;
            }
            match may(&agent, "-x", &dir) {
                None => {}
                Some(ok) => r.check(
                    !ok,
                    format!(
                        "an agent (uid {}) cannot enter {}",
                        agent.uid,
                        dir.display()
                    ),
                    || "it can: an agent could reach a daemon's sockets or store".into(),
                ),
            }
        }
    }
    if users.values().any(|a| a.uid == agent.uid) {
        r.fail(format!(
            "the agent uid {} is a daemon's uid: agents must run as their own",
            agent.uid
        ));
    } else {
        r.pass(format!(
            "the agent uid {} is none of the daemons' uids",
            agent.uid
        ));
    }

    // The supervisor can switch agents to their uid only with the unit's capabilities.
    let unit = Path::new("/usr/lib/systemd/system/warden-supervisor.service");
    match std::fs::read_to_string(unit) {
        Err(e) => r.fail(format!("{}: {e}", unit.display())),
        Ok(text) => {
            let ambient: BTreeSet<&str> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("AmbientCapabilities="))
                .flat_map(str::split_whitespace)
                .collect();
            r.check(
                ambient.contains("CAP_SETUID") && ambient.contains("CAP_SETGID"),
                format!(
                    "{} gives the supervisor CAP_SETUID and CAP_SETGID (agents get their own uid)",
                    unit.display()
                ),
                || format!("its AmbientCapabilities= are {ambient:?}: agents would run as warden-supervisor"),
            );
        }
    }

    // The supervisor's sandbox.
    let features = warden_sandbox::host_features();
    // bubblewrap runs as the agent (the supervisor switches before exec): probe it as the agent.
    let as_agent = features.bwrap_path.as_deref().and_then(|b| {
        let args: Vec<std::ffi::OsString> = warden_sandbox::BWRAP_PROBE
            .iter()
            .map(std::ffi::OsString::from)
            .collect();
        run_as(&agent, b, &args)
    });
    match (&features.bwrap_path, features.bwrap_works) {
        (Some(p), true) if as_agent == Some(false) => r.add(
            Level::Warn,
            format!(
                "bubblewrap at {} works for this user but not as an agent (uid {}):                  unprivileged user namespaces? agents run without the OS sandbox",
                p.display(),
                agent.uid
            ),
        ),
        (Some(p), true) => r.pass(format!(
            "bubblewrap works ({}{})",
            p.display(),
            if as_agent == Some(true) {
                format!(", also as an agent, uid {}", agent.uid)
            } else {
                String::new()
            }
        )),
        (Some(p), false) => r.add(
            Level::Warn,
            format!(
                "bubblewrap at {} does not work here (user namespaces?): agents run without the \
                 OS sandbox",
                p.display()
            ),
        ),
        (None, _) => r.add(
            Level::Warn,
            "bubblewrap is missing (apt install bubblewrap): agents run without the OS sandbox",
        ),
    }
    match features.proxy_egress() {
        Ok(()) if as_agent != Some(false) => r.pass(
            "proxy egress available: agents with network = \"proxy\" (the built-in claude and codex) reach only their egress_allow",
        ),
        Ok(()) => r.add(
            Level::Warn,
            "proxy egress unavailable as an agent (bubblewrap fails for the agent uid): network = \"proxy\" agents are refused",
        ),
        Err(why) => r.add(
            Level::Warn,
            format!("proxy egress unavailable ({why}): network = \"proxy\" agents (the built-in claude and codex) are refused"),
        ),
    }
    let systemd = Path::new("/run/systemd/system").is_dir();
    match (&features.cgroup2_mount, systemd) {
        (None, _) => r.add(
            Level::Warn,
            "no cgroup v2 hierarchy: agents get no process or memory limits and no cgroup kill",
        ),
        (Some(m), true) => {
            let delegated = Command::new("systemctl")
                .args([
                    "show",
                    "-p",
                    "Delegate",
                    "--value",
                    "warden-supervisor.service",
                ])
                .stderr(Stdio::null())
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "yes");
            match delegated {
                Some(true) => r.pass(format!(
                    "cgroup v2 at {}, delegated to warden-supervisor.service (Delegate=yes)",
                    m.display()
                )),
                _ => r.add(
                    Level::Warn,
                    "warden-supervisor.service has no Delegate=yes: no per-conversation cgroups",
                ),
            }
        }
        (Some(m), false) => r.add(
            Level::Warn,
            format!(
                "cgroup v2 at {}, but systemd is not PID 1 here: nothing delegates a subtree to \
                 the supervisor, which then runs agents without cgroup limits",
                m.display()
            ),
        ),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_account_follows_the_supervisor_configuration() {
        assert_eq!(agent_account(None).uid, warden_sandbox::DEFAULT_AGENT_UID);
        let by_number = serde_json::json!({"sandbox": {"agent_user": "61234"}});
        let a = agent_account(Some(&by_number));
        assert_eq!(
            (a.uid, a.gid, a.groups.clone()),
            (61234, 61234, vec![61234])
        );
        let range =
            serde_json::json!({"sandbox": {"agent_user": "", "agent_uid_range": [62000, 62009]}});
        assert_eq!(agent_account(Some(&range)).uid, 62000);
    }

    #[test]
    fn allowlists_read_only_numbers_that_fit_a_uid() {
        let cfg = serde_json::json!({"listen": {"allow_uids": [962, "x", -1, 4294967296u64, 967]}});
        assert_eq!(
            numbers(&cfg, "/listen/allow_uids"),
            BTreeSet::from([962, 967])
        );
        assert!(numbers(&cfg, "/admin/allow_gids").is_empty());
    }

    #[test]
    fn a_failed_check_fails_the_report_and_warnings_do_not() {
        let mut r = Report::default();
        r.pass("a");
        r.add(Level::Warn, "b");
        assert_eq!(r.failed(), 0);
        r.check(false, "c", || "because".into());
        assert_eq!(r.failed(), 1);
        let text = r.to_string();
        assert!(
            text.contains("FAIL  c: because") && text.contains("1 passed, 1 failed, 1 warnings"),
            "{text}"
        );
    }
}
