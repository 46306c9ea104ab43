//! `warden doctor`'s deadline check: the running supervisor's effective Decide deadlines (its
//! admin `Status`, `decide_deadline_ms.*`) against what the running approver needs (its admin
//! `Status`, `decide_deadline_ms[.<agent>]`). The supervisor adopts the approver's deadline by
//! itself (`PolicyService.Describe`); this finds where it has not (an approver restarted with a
//! longer deadline not yet re-read, a supervisor that cannot reach it, one pointed elsewhere).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_client::AdminServiceClient;

/// What the comparison found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineReport {
    /// Lines for people.
    pub lines: Vec<String>,
    /// True when the supervisor asks the approver and waits less than it needs for some agent.
    pub mismatch: bool,
}

fn ms(details: &HashMap<String, String>, key: &str) -> Option<u64> {
    details.get(key).and_then(|v| v.parse().ok())
}

/// Compares the two daemons' `Status` details (`None` = not running / not reachable).
pub fn compare(
    supervisor: Option<&HashMap<String, String>>,
    approver: Option<&HashMap<String, String>>,
) -> DeadlineReport {
    let mut lines = Vec::new();
    let Some(a) = approver else {
        lines.push("  no warden-approver running here: nothing to compare".into());
        return DeadlineReport {
            lines,
            mismatch: false,
        };
    };
    let agents_of = |d: &HashMap<String, String>, prefix: &str| -> Vec<String> {
        d.keys()
            .filter_map(|k| k.strip_prefix(prefix).map(str::to_string))
            .collect()
    };
    let approver_agents = agents_of(a, "decide_deadline_ms.");
    let need_default = ms(a, "decide_deadline_ms").unwrap_or(0);
    let need = |agent: &str| ms(a, &format!("decide_deadline_ms.{agent}")).unwrap_or(need_default);
    let per_agent: Vec<String> = approver_agents
        .iter()
        .map(|g| format!("{g}: {} ms", need(g)))
        .collect();
    lines.push(format!(
        "  warden-approver      needs {need_default} ms{}",
        if per_agent.is_empty() {
            String::new()
        } else {
            format!(" ({})", per_agent.join(", "))
        }
    ));
    let Some(s) = supervisor else {
        lines.push("  warden-supervisor    not running: nothing to compare".into());
        return DeadlineReport {
            lines,
            mismatch: false,
        };
    };
    let have_default = ms(s, "decide_deadline_ms.effective").unwrap_or(0);
    let have = |agent: &str| {
        ms(s, &format!("decide_deadline_ms.effective.{agent}")).unwrap_or(have_default)
    };
    let supervisor_agents = agents_of(s, "decide_deadline_ms.effective.");
    let waits: Vec<String> = supervisor_agents
        .iter()
        .map(|g| format!("{g}: {} ms", have(g)))
        .collect();
    lines.push(format!(
        "  warden-supervisor    waits {have_default} ms (own setting {} ms; described by {}: {}){}",
        s.get("decide_deadline_ms.own")
            .map(String::as_str)
            .unwrap_or("?"),
        s.get("policy_implementation")
            .map(String::as_str)
            .unwrap_or("nobody"),
        s.get("decide_deadline_ms.described")
            .map(String::as_str)
            .unwrap_or("none"),
        if waits.is_empty() {
            String::new()
        } else {
            format!(" [{}]", waits.join(", "))
        }
    ));
    let Some(implementation) = s.get("policy_implementation").cloned() else {
        lines.push(
            "  MISMATCH: the supervisor cannot read its policy service's deadline (Describe): it \
             waits its own setting, and a person's answer would come too late. Is its \
             policy.socket this approver's socket, and is it reachable?"
                .into(),
        );
        return DeadlineReport {
            lines,
            mismatch: true,
        };
    };
    if implementation != "warden-approver" {
        lines.push(format!(
            "  note: the supervisor asks {implementation}, not the approver: human approval is not \
             swapped in (services/approver/README.md, \"Swap in human approval\")"
        ));
        return DeadlineReport {
            lines,
            mismatch: false,
        };
    }
    let mut mismatch = false;
    let agents: BTreeSet<String> = approver_agents
        .into_iter()
        .chain(supervisor_agents)
        .collect();
    let mut check = |label: &str, have: u64, need: u64| {
        if have < need {
            mismatch = true;
            lines.push(format!(
                "  MISMATCH {label}: the supervisor waits {have} ms, the approver needs {need} ms \
                 (people get {have} ms); the supervisor re-reads the approver's deadline every \
                 10 s, so a lasting mismatch means it cannot reach this approver"
            ));
        }
    };
    check("(default)", have_default, need_default);
    for g in &agents {
        check(&format!("agent {g}"), have(g), need(g));
    }
    if !mismatch {
        lines.push(
            "  OK: the supervisor waits at least as long as the approver needs, for every agent"
                .into(),
        );
    }
    DeadlineReport { lines, mismatch }
}

async fn details(socket: &Path) -> Option<HashMap<String, String>> {
    let ch = tokio::time::timeout(
        Duration::from_secs(2),
        warden_daemon::client::connect_unix(socket),
    )
    .await
    .ok()?
    .ok()?;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        AdminServiceClient::new(ch).status(pb::StatusRequest {}),
    )
    .await
    .ok()?
    .ok()?;
    Some(r.into_inner().details)
}

/// Asks the supervisor (its socket) and the approver (its admin socket) and compares their
/// deadlines.
pub async fn deadlines(supervisor_socket: &Path, approver_admin: &Path) -> DeadlineReport {
    let approver = details(approver_admin).await;
    let supervisor = if approver.is_some() {
        details(supervisor_socket).await
    } else {
        None
    };
    compare(supervisor.as_ref(), approver.as_ref())
}

/// The running supervisor's capacity (its `Status`): the live-agent cap (from memory, ~300 MiB
/// per agent tree, unless configured), the active-turn cap (from cores), and how much of each
/// is in use. Lines to print; a supervisor that does not answer is said so.
pub async fn capacity(supervisor_socket: &Path) -> Vec<String> {
    let Some(d) = details(supervisor_socket).await else {
        return vec![format!(
            "  supervisor not reachable at {} (its caps are derived at start:              limits.max_live_agents from memory, ~300 MiB per agent tree;              limits.max_active_turns from cores)",
            supervisor_socket.display()
        )];
    };
    capacity_lines(&d)
}

/// The installed adapters the running supervisor's entries run (its `Status`: `adapter.<agent>`),
/// each found (where) or missing (with the command that installs it).
pub async fn adapters(supervisor_socket: &Path) -> Vec<String> {
    let Some(d) = details(supervisor_socket).await else {
        return vec![format!(
            "  supervisor not reachable at {}; the built-ins claude and codex run adapters \
             installed under its [adapters] dir (default /usr/local/lib/warden/adapters)",
            supervisor_socket.display()
        )];
    };
    adapter_lines(&d)
}

/// Where the policy's audit log, the approver's queue and the gateway's tasks live (their
/// `Status`: `store_backend` and `store`, the database without a password): sled on this host,
/// or PostgreSQL shared by replicas. A daemon that does not answer is said so (the approver is
/// optional).
pub async fn stores(policy_admin: &Path, approver_admin: &Path, gateway: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (who, socket) in [
        ("policy", policy_admin),
        ("approver", approver_admin),
        ("gateway", gateway),
    ] {
        let line = match details(socket).await {
            Some(d) => store_line(who, &d),
            None => format!("  {who:<9} not reachable at {}", socket.display()),
        };
        out.push(line);
    }
    out
}

fn store_line(who: &str, d: &HashMap<String, String>) -> String {
    let get = |k: &str| d.get(k).map(String::as_str).unwrap_or("?");
    let mut line = format!("  {who:<9} {} ({})", get("store_backend"), get("store"));
    if let Some(n) = d.get("decisions_not_audited") {
        line.push_str(&format!(
            "; {} audit records, {n} decisions denied because their record could not be written",
            get("audit_records")
        ));
    }
    if d.contains_key("pending") && who == "approver" {
        line.push_str(&format!("; {} pending", get("pending")));
    }
    if who == "gateway" && d.contains_key("tasks_stored") {
        line.push_str(&format!(
            "; {} tasks stored, {} followed here",
            get("tasks_stored"),
            get("tasks_live")
        ));
    }
    line
}

fn adapter_lines(d: &HashMap<String, String>) -> Vec<String> {
    let mut found: Vec<(&str, &str)> = d
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("adapter.")?, v.as_str())))
        .collect();
    found.sort();
    if found.is_empty() {
        return vec!["  no agent entry runs an installed adapter".into()];
    }
    found
        .into_iter()
        .map(|(agent, v)| format!("  {agent:<20} {v}"))
        .collect()
}

fn capacity_lines(d: &HashMap<String, String>) -> Vec<String> {
    let get = |k: &str| d.get(k).map(String::as_str).unwrap_or("?");
    let mut out = vec![
        format!(
            "  live agents:        {} of max_live_agents {} (beyond it a warm agent, then the least recently used idle agent stops)",
            get("live_agents"),
            get("max_live_agents")
        ),
        format!(
            "  active turns:       max_active_turns {}, one principal at most {} (beyond them turns wait, round robin across principals, \"queued, position N\"); {} running, {} waiting",
            get("max_active_turns"),
            get("max_active_turns_per_principal"),
            get("turns_running"),
            get("turns_waiting_admission")
        ),
        format!(
            "  waiting for agents: {} turns (at most max_agent_waiters {}, each for capacity_wait_ms {}, \"queued for an agent, position N\")",
            get("turns_waiting_agent"),
            get("max_agent_waiters"),
            get("capacity_wait_ms")
        ),
    ];
    // One line per agent with warm agents (`agents.<name>.pool_size`), sorted by name.
    let mut pools: Vec<&str> = d
        .keys()
        .filter_map(|k| k.strip_prefix("pool.")?.strip_suffix(".size"))
        .collect();
    pools.sort_unstable();
    if pools.is_empty() {
        out.push("  warm agents:        none (agents.<name>.pool_size = 0 for every agent)".into());
    }
    for name in pools {
        let f = |what: &str| get(&format!("pool.{name}.{what}")).to_string();
        out.push(format!(
            "  warm agents:        {name}: {} ready of pool_size {} ({} starting; {} taken, {} discarded, {} died, {} failed to start)",
            f("ready"),
            f("size"),
            f("starting"),
            f("taken"),
            f("discarded"),
            f("died"),
            f("failed")
        ));
    }
    out
}

/// The binaries `warden up` and the supervisor start, looked for next to `warden`.
pub const BINARIES: [&str; 9] = [
    "warden-policy",
    "warden-approver",
    "warden-supervisor",
    "warden-gateway",
    "warden-scripted-agent",
    "warden-egress-relay",
    "warden-fs-servant",
    "warden-exec-limit",
    "warden-agent-shell",
];

/// What `warden doctor` found on this host and its running deployment.
#[derive(Debug, Clone)]
pub struct LocalReport {
    pub features: String,
    /// The state directory, and what keeps the agents' uid from searching its way down (None:
    /// reachable; not checked when agents keep the supervisor's uid).
    pub state_dir: std::path::PathBuf,
    pub state_dir_check: Option<(u32, Option<std::path::PathBuf>)>,
    pub bin_dir: std::path::PathBuf,
    pub binaries: Vec<(&'static str, bool)>,
    pub capacity: Vec<String>,
    pub adapters: Vec<String>,
    /// Where the policy's audit, the approver's queue and the gateway's tasks live ([`stores`]).
    pub stores: Vec<String>,
    /// Every enabled agent and whether it can start (None: the supervisor is not reachable).
    pub agents: Option<crate::agents::Agents>,
    pub deadlines: DeadlineReport,
}

impl LocalReport {
    /// A deadline mismatch fails the report (exit 1); a missing adapter is a warning (operators
    /// install adapters after the package).
    pub fn failed(&self) -> bool {
        self.deadlines.mismatch
    }

    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(o, "{}", self.features);
        if let Some((uid, blocked)) = &self.state_dir_check {
            match blocked {
                None => {
                    let _ = writeln!(
                        o,
                        "  state directory:    {} is reachable by uid {uid}",
                        self.state_dir.display()
                    );
                }
                Some(b) => {
                    let _ = writeln!(
                        o,
                        "  state directory:    {} is NOT reachable by uid {uid}: {} blocks it \
                         (the supervisor refuses to start; chmod o+x it or pick another --state-dir)",
                        self.state_dir.display(),
                        b.display()
                    );
                }
            }
        }
        let _ = writeln!(o, "binaries in {}:", self.bin_dir.display());
        for (b, found) in &self.binaries {
            let _ = writeln!(o, "  {b:<22} {}", if *found { "found" } else { "MISSING" });
        }
        // The daemons' answers are shown as data (an agent's name or error text among them).
        let mut section = |title: &str, lines: &[String]| {
            let _ = writeln!(o, "{title}");
            for l in lines {
                let _ = writeln!(o, "{}", warden_terminal_text::Inline(l));
            }
        };
        section("capacity:", &self.capacity);
        section("adapters:", &self.adapters);
        section("durable state:", &self.stores);
        let agents = match &self.agents {
            Some(a) => crate::agents::lines(a)
                .into_iter()
                .map(|l| format!("  {l}"))
                .collect(),
            None => vec!["  supervisor not reachable: nothing to check".to_string()],
        };
        section("agents:", &agents);
        section("Decide deadlines:", &self.deadlines.lines);
        o
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "hostFeatures": self.features.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>(),
            "stateDirectory": {
                "path": self.state_dir.display().to_string(),
                "agentUid": self.state_dir_check.as_ref().map(|(u, _)| *u),
                "blockedBy": self.state_dir_check.as_ref().and_then(|(_, b)| b.as_ref().map(|b| b.display().to_string())),
            },
            "binDir": self.bin_dir.display().to_string(),
            "binaries": self.binaries.iter().map(|(b, f)| serde_json::json!({"name": b, "found": f})).collect::<Vec<_>>(),
            "capacity": self.capacity.iter().map(|l| l.trim()).collect::<Vec<_>>(),
            "adapters": self.adapters.iter().map(|l| l.trim()).collect::<Vec<_>>(),
            "durableState": self.stores.iter().map(|l| l.trim()).collect::<Vec<_>>(),
            "agents": self.agents.as_ref().map(crate::agents::json),
            "deadlines": {"lines": self.deadlines.lines.iter().map(|l| l.trim()).collect::<Vec<_>>(), "mismatch": self.deadlines.mismatch},
            "failed": self.failed(),
        })
    }
}

/// `warden doctor` on the local deployment: host features, binaries, the running supervisor's
/// capacity, adapters and agents, and the Decide deadlines against the approver's.
pub async fn local(
    layout: &crate::layout::Layout,
    bin_dir: &Path,
    supervisor_socket: &Path,
    approver_admin: &Path,
) -> LocalReport {
    let features = warden_sandbox::host_features();
    let state_dir_check = match &features.agent_identity {
        Ok(warden_sandbox::IdentityPlan::Switch(who)) => {
            // The agent uid must search its way down to its roots and homes under the
            // state directory (bubblewrap resolves them as the agent).
            let existing = layout.root.ancestors().find(|a| a.exists());
            Some((
                who.uid,
                existing.and_then(|e| warden_sandbox::first_unsearchable(e, *who)),
            ))
        }
        _ => None,
    };
    LocalReport {
        features: features.to_string(),
        state_dir: layout.root.clone(),
        state_dir_check,
        bin_dir: bin_dir.to_path_buf(),
        binaries: BINARIES
            .iter()
            .map(|b| (*b, bin_dir.join(b).is_file()))
            .collect(),
        capacity: capacity(supervisor_socket).await,
        adapters: adapters(supervisor_socket).await,
        stores: stores(
            &layout.policy_admin_socket(),
            approver_admin,
            &layout.socket_of("gateway"),
        )
        .await,
        agents: crate::agents::list(supervisor_socket).await.ok(),
        deadlines: deadlines(supervisor_socket, approver_admin).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_lines_name_the_backend_and_what_was_not_audited() {
        let policy = map(&[
            ("store_backend", "postgres"),
            ("store", "postgres warden@/run/postgresql/warden"),
            ("audit_records", "12"),
            ("decisions_not_audited", "3"),
        ]);
        let l = store_line("policy", &policy);
        assert!(
            l.contains("postgres (postgres warden@/run/postgresql/warden)"),
            "{l}"
        );
        assert!(l.contains("3 decisions denied"), "{l}");
        let approver = map(&[
            ("store_backend", "sled"),
            ("store", "sled"),
            ("pending", "2"),
        ]);
        assert_eq!(
            store_line("approver", &approver),
            "  approver  sled (sled); 2 pending"
        );
    }

    #[test]
    fn adapter_lines_say_where_each_was_found_or_how_to_install_it() {
        let d = map(&[
            (
                "adapter.codex",
                "MISSING adapter @agentclientprotocol/codex-acp@2.6.0 is not installed (...); install it with: npm install --prefix /a/codex-acp-2.6.0 --no-audit --no-fund @agentclientprotocol/codex-acp@2.6.0",
            ),
            (
                "adapter.claude",
                "@agentclientprotocol/claude-agent-acp@0.101.0 at /a/claude-agent-acp-0.101.0/node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js",
            ),
            ("live_agents", "0"),
        ]);
        let l = adapter_lines(&d);
        assert_eq!(l.len(), 2, "{l:?}");
        assert!(
            l[0].trim_start().starts_with("claude") && l[0].contains(" at /a/"),
            "{l:?}"
        );
        assert!(
            l[1].contains("MISSING") && l[1].contains("npm install --prefix"),
            "{l:?}"
        );
        assert_eq!(
            adapter_lines(&map(&[("live_agents", "0")])),
            vec!["  no agent entry runs an installed adapter".to_string()]
        );
    }

    #[test]
    fn capacity_lines_name_the_caps_and_their_use() {
        let d = map(&[
            ("live_agents", "3"),
            ("max_live_agents", "78"),
            ("max_active_turns", "32"),
        ]);
        let l = capacity_lines(&d);
        assert!(l[0].contains("3 of max_live_agents 78"), "{l:?}");
        assert!(l[1].contains("max_active_turns 32"), "{l:?}");
        assert!(l[2].starts_with("  waiting for agents:"), "{l:?}");
        assert!(l[3].contains("warm agents:        none"), "{l:?}");
        let mut d = d;
        for (k, v) in [
            ("size", "2"),
            ("ready", "1"),
            ("starting", "1"),
            ("taken", "5"),
        ] {
            d.insert(format!("pool.scripted.{k}"), v.into());
        }
        let l = capacity_lines(&d);
        assert!(
            l[3].contains("scripted: 1 ready of pool_size 2 (1 starting; 5 taken"),
            "{l:?}"
        );
    }

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_supervisor_waiting_less_than_the_approver_needs_is_a_mismatch() {
        let approver = map(&[
            ("decide_deadline_ms", "302000"),
            ("decide_deadline_ms.claude", "602000"),
        ]);
        let adopted = map(&[
            ("policy_implementation", "warden-approver"),
            ("decide_deadline_ms.own", "200"),
            ("decide_deadline_ms.described", "302000"),
            ("decide_deadline_ms.effective", "302000"),
            ("decide_deadline_ms.effective.claude", "602000"),
            ("decide_deadline_ms.effective.scripted", "302000"),
        ]);
        let r = compare(Some(&adopted), Some(&approver));
        assert!(!r.mismatch, "{r:?}");
        assert!(r.lines.iter().any(|l| l.starts_with("  OK")), "{r:?}");

        // claude was not adopted (an approver restarted with a longer deadline, not re-read).
        let mut stale = adopted.clone();
        stale.insert(
            "decide_deadline_ms.effective.claude".into(),
            "302000".into(),
        );
        let r = compare(Some(&stale), Some(&approver));
        assert!(r.mismatch, "{r:?}");
        assert!(
            r.lines
                .iter()
                .any(|l| l.contains("MISMATCH agent claude") && l.contains("602000")),
            "{r:?}"
        );

        // The supervisor could not read the description at all: its own 200 ms.
        let unread = map(&[
            ("decide_deadline_ms.own", "200"),
            ("decide_deadline_ms.described", "none"),
            ("decide_deadline_ms.effective", "200"),
        ]);
        let r = compare(Some(&unread), Some(&approver));
        assert!(r.mismatch, "{r:?}");
        assert!(r.lines.iter().any(|l| l.contains("cannot read")), "{r:?}");
        // Its own setting alone, shorter than the approver's: the default is a mismatch too.
        let mut short = adopted.clone();
        short.insert("decide_deadline_ms.effective".into(), "200".into());
        let r = compare(Some(&short), Some(&approver));
        assert!(r.mismatch, "{r:?}");
        assert!(
            r.lines.iter().any(|l| l.contains("MISMATCH (default)")),
            "{r:?}"
        );
    }

    #[test]
    fn nothing_to_compare_is_not_a_mismatch_but_is_said() {
        let approver = map(&[("decide_deadline_ms", "302000")]);
        let r = compare(None, None);
        assert!(!r.mismatch && r.lines[0].contains("no warden-approver"));
        let r = compare(None, Some(&approver));
        assert!(!r.mismatch && r.lines.iter().any(|l| l.contains("not running")));
        // A supervisor that still asks warden-policy: not swapped in, said so.
        let direct = map(&[
            ("policy_implementation", "warden-policy"),
            ("decide_deadline_ms.effective", "200"),
        ]);
        let r = compare(Some(&direct), Some(&approver));
        assert!(!r.mismatch, "{r:?}");
        assert!(
            r.lines.iter().any(|l| l.contains("not swapped in")),
            "{r:?}"
        );
    }
}
