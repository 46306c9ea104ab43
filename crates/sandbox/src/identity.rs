//! Who an agent runs as. Never root, never the supervisor's own uid: a supervisor that can change
//! ids (root, or holding `CAP_SETUID` and `CAP_SETGID`, as the deployed unit's unprivileged user
//! does) switches every child it spawns to the agent identity (in the child, before exec:
//! `setgroups([])`, `setgid`, `setuid`, then every capability dropped); one that cannot switch
//! runs its agents as its own uid (`warden doctor` says what that costs).

use std::path::Path;

use crate::SandboxError;

/// The uid (and gid) used when a root supervisor has no `agent_user` configured.
///
/// Why a fixed number and not a created `warden-agent` user: creating a user edits the host's
/// `/etc/passwd` (a different tool on every distribution, not undone when warden goes away),
/// while the sandbox gets its own generated `/etc/passwd` anyway. 61000 lies outside the ranges
/// systemd hands out (homed 60001–60513, `DynamicUser=` 61184–65519) and outside regular users
/// (1000–60000); the supervisor refuses to start when this host's passwd or group file already
/// uses it, so the number never aliases a real account.
pub const DEFAULT_AGENT_UID: u32 = 61_000;
/// The name the agent's own line carries in the sandbox's generated `/etc/passwd`.
pub const AGENT_NAME: &str = "warden-agent";

/// The uid and gid an agent process runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentIdentity {
    pub uid: u32,
    pub gid: u32,
}

impl From<AgentIdentity> for warden_containment::rights::Rights {
    fn from(i: AgentIdentity) -> Self {
        Self {
            uid: i.uid,
            gid: i.gid,
        }
    }
}

/// How the supervisor's agents are run, decided once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityPlan {
    /// The supervisor is root: every child switches to this identity.
    Switch(AgentIdentity),
    /// The supervisor is not root and cannot switch: agents run as its own uid/gid.
    SupervisorUid { uid: u32, gid: u32 },
}

impl IdentityPlan {
    /// The identity children are switched to, if any.
    pub fn switched(&self) -> Option<AgentIdentity> {
        match self {
            IdentityPlan::Switch(i) => Some(*i),
            IdentityPlan::SupervisorUid { .. } => None,
        }
    }

    /// The uid/gid an agent ends up with either way.
    pub fn effective(&self) -> AgentIdentity {
        match self {
            IdentityPlan::Switch(i) => *i,
            IdentityPlan::SupervisorUid { uid, gid } => AgentIdentity {
                uid: *uid,
                gid: *gid,
            },
        }
    }

    /// Decides from the configuration (`agent_user`, `agent_group`: names or numbers, empty =
    /// unset), this process's uid/gid and the host's account files.
    ///
    /// A non-root supervisor with an `agent_user` configured is an error (the separation the
    /// operator asked for cannot be provided), not a silent fallback.
    pub fn decide(
        agent_user: &str,
        agent_group: &str,
        own_uid: u32,
        own_gid: u32,
        passwd: &str,
        group: &str,
    ) -> Result<IdentityPlan, SandboxError> {
        Self::decide_with(
            agent_user,
            agent_group,
            own_uid,
            own_gid,
            own_uid == 0,
            passwd,
            group,
        )
    }

    /// [`IdentityPlan::decide`] where `can_switch` says whether this process may change its
    /// ids: root, or an unprivileged user holding `CAP_SETUID` and `CAP_SETGID` (the deployed
    /// unit grants them, see [`can_switch_ids`]).
    pub fn decide_with(
        agent_user: &str,
        agent_group: &str,
        own_uid: u32,
        own_gid: u32,
        can_switch: bool,
        passwd: &str,
        group: &str,
    ) -> Result<IdentityPlan, SandboxError> {
        let user = agent_user.trim();
        let grp = agent_group.trim();
        if !can_switch {
            if !user.is_empty() || !grp.is_empty() {
                return Err(SandboxError::InvalidInput(format!(
                    "sandbox.agent_user/agent_group are set but the supervisor runs as uid \
                     {own_uid}, neither root nor holding CAP_SETUID and CAP_SETGID, and cannot \
                     switch agents to another uid"
                )));
            }
            return Ok(IdentityPlan::SupervisorUid {
                uid: own_uid,
                gid: own_gid,
            });
        }
        let (uid, primary_gid) = if user.is_empty() {
            for (what, file) in [("passwd", passwd), ("group", group)] {
                if let Some(line) = file
                    .lines()
                    .find(|l| field(l, 2) == Some(DEFAULT_AGENT_UID))
                {
                    let name = line.split(':').next().unwrap_or("?");
                    return Err(SandboxError::InvalidInput(format!(
                        "the default agent id {DEFAULT_AGENT_UID} is already used by {what} \
                         entry {name:?} on this host; set sandbox.agent_user to a dedicated user"
                    )));
                }
            }
            (DEFAULT_AGENT_UID, DEFAULT_AGENT_UID)
        } else if let Ok(n) = user.parse::<u32>() {
            let gid = passwd
                .lines()
                .find(|l| field(l, 2) == Some(n))
                .and_then(|l| field(l, 3))
                .unwrap_or(n);
            (n, gid)
        } else {
            let line = passwd
                .lines()
                .find(|l| l.split(':').next() == Some(user))
                .ok_or_else(|| {
                    SandboxError::InvalidInput(format!(
                        "sandbox.agent_user {user:?} is not in /etc/passwd"
                    ))
                })?;
            match (field(line, 2), field(line, 3)) {
                (Some(u), Some(g)) => (u, g),
                _ => {
                    return Err(SandboxError::InvalidInput(format!(
                        "the /etc/passwd entry of {user:?} is malformed"
                    )));
                }
            }
        };
        let gid = if grp.is_empty() {
            primary_gid
        } else if let Ok(n) = grp.parse::<u32>() {
            n
        } else {
            group
                .lines()
                .find(|l| l.split(':').next() == Some(grp))
                .and_then(|l| field(l, 2))
                .ok_or_else(|| {
                    SandboxError::InvalidInput(format!(
                        "sandbox.agent_group {grp:?} is not in /etc/group"
                    ))
                })?
        };
        if uid == 0 || uid == own_uid {
            return Err(SandboxError::InvalidInput(format!(
                "sandbox.agent_user resolves to uid {uid}: agents never run as root or as the \
                 supervisor"
            )));
        }
        if gid == 0 || gid == own_gid {
            return Err(SandboxError::InvalidInput(format!(
                "the agent group resolves to gid {gid}: agents never run in root's or the \
                 supervisor's group"
            )));
        }
        Ok(IdentityPlan::Switch(AgentIdentity { uid, gid }))
    }

    /// [`IdentityPlan::decide`] with this process's ids and the host's `/etc/passwd` and
    /// `/etc/group`.
    pub fn for_this_process(
        agent_user: &str,
        agent_group: &str,
    ) -> Result<IdentityPlan, SandboxError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(String::new()),
                _ => Err(SandboxError::io("read", Path::new(p), e)),
            })
        };
        let uid = nix::unistd::geteuid().as_raw();
        Self::decide_with(
            agent_user,
            agent_group,
            uid,
            nix::unistd::getegid().as_raw(),
            uid == 0 || can_switch_ids(),
            &read("/etc/passwd")?,
            &read("/etc/group")?,
        )
    }
}

const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// True when this process holds `CAP_SETUID` and `CAP_SETGID` in its effective set (as the
/// deployed `warden-supervisor.service` gives its unprivileged user with
/// `AmbientCapabilities=`), read from `/proc/self/status`.
pub fn can_switch_ids() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_caps(&s))
        .is_some_and(|caps| caps & (1 << CAP_SETUID) != 0 && caps & (1 << CAP_SETGID) != 0)
}

/// The `CapEff:` mask of a `/proc/PID/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The numeric field `i` of a colon-separated account line.
fn field(line: &str, i: usize) -> Option<u32> {
    line.split(':').nth(i)?.parse().ok()
}

/// True when `uid`/`gid` may search (`x`) every directory from `/` down to `dir` inclusive,
/// judged by the mode bits (owner, group, other). Returns the first directory that blocks.
pub fn first_unsearchable(dir: &Path, who: AgentIdentity) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    for a in ancestors {
        let Ok(m) = std::fs::metadata(a) else {
            return Some(a.to_path_buf());
        };
        let mode = m.mode();
        let ok = if m.uid() == who.uid {
            mode & 0o100 != 0
        } else if m.gid() == who.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Some(a.to_path_buf());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\nsvc:x:990:985::/var/lib/svc:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nalice:x:1000:\nagents:x:4242:\n";

    #[test]
    fn a_root_supervisor_without_configuration_uses_the_fixed_agent_id() {
        let p = IdentityPlan::decide("", "", 0, 0, PASSWD, GROUP).unwrap();
        assert_eq!(
            p.switched(),
            Some(AgentIdentity {
                uid: DEFAULT_AGENT_UID,
                gid: DEFAULT_AGENT_UID
            })
        );
    }

    #[test]
    fn the_fixed_id_is_refused_when_the_host_uses_it() {
        let passwd = format!("{PASSWD}taken:x:{DEFAULT_AGENT_UID}:5::/:/bin/sh\n");
        let e = IdentityPlan::decide("", "", 0, 0, &passwd, GROUP).unwrap_err();
        assert!(e.to_string().contains("taken"), "{e}");
        let group = format!("{GROUP}g:x:{DEFAULT_AGENT_UID}:\n");
        assert!(IdentityPlan::decide("", "", 0, 0, PASSWD, &group).is_err());
    }

    #[test]
    fn names_and_numbers_resolve() {
        let p = IdentityPlan::decide("svc", "", 0, 0, PASSWD, GROUP).unwrap();
        assert_eq!(p.switched(), Some(AgentIdentity { uid: 990, gid: 985 }));
        let p = IdentityPlan::decide("svc", "agents", 0, 0, PASSWD, GROUP).unwrap();
        assert_eq!(
            p.switched(),
            Some(AgentIdentity {
                uid: 990,
                gid: 4242
            })
        );
        let p = IdentityPlan::decide("5000", "", 0, 0, PASSWD, GROUP).unwrap();
        assert_eq!(
            p.switched(),
            Some(AgentIdentity {
                uid: 5000,
                gid: 5000
            })
        );
        assert!(IdentityPlan::decide("ghost", "", 0, 0, PASSWD, GROUP).is_err());
        assert!(IdentityPlan::decide("svc", "ghosts", 0, 0, PASSWD, GROUP).is_err());
    }

    #[test]
    fn root_is_never_an_agent() {
        for (u, g) in [("root", ""), ("0", ""), ("svc", "0"), ("svc", "root")] {
            assert!(
                IdentityPlan::decide(u, g, 0, 0, PASSWD, GROUP).is_err(),
                "{u}:{g}"
            );
        }
    }

    #[test]
    fn a_non_root_supervisor_runs_agents_as_itself_and_refuses_a_configured_user() {
        let p = IdentityPlan::decide("", "", 962, 962, PASSWD, GROUP).unwrap();
        assert_eq!(p.switched(), None);
        assert_eq!(p.effective(), AgentIdentity { uid: 962, gid: 962 });
        assert!(IdentityPlan::decide("svc", "", 962, 962, PASSWD, GROUP).is_err());
    }

    #[test]
    fn an_unprivileged_supervisor_holding_the_id_capabilities_switches_but_never_to_itself() {
        let p = IdentityPlan::decide_with("", "", 962, 962, true, PASSWD, GROUP).unwrap();
        assert_eq!(
            p.switched(),
            Some(AgentIdentity {
                uid: DEFAULT_AGENT_UID,
                gid: DEFAULT_AGENT_UID
            })
        );
        let e = IdentityPlan::decide_with("962", "", 962, 962, true, PASSWD, GROUP).unwrap_err();
        assert!(
            e.to_string()
                .contains("never run as root or as the supervisor")
        );
        assert!(IdentityPlan::decide_with("0", "", 962, 962, true, PASSWD, GROUP).is_err());
        // Without the capabilities the same request is refused, not silently unseparated.
        let e = IdentityPlan::decide_with("svc", "", 962, 962, false, PASSWD, GROUP).unwrap_err();
        assert!(e.to_string().contains("CAP_SETUID"), "{e}");
    }

    #[test]
    fn the_effective_capability_mask_is_read_from_proc_status() {
        let status = "Name:\tx\nCapInh:\t00000000000000c0\nCapPrm:\t00000000000000c0\nCapEff:\t00000000000000c0\n";
        assert_eq!(effective_caps(status), Some(0xc0));
        assert_eq!(effective_caps("Name:\tx\n"), None);
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
    }
}

/// One uid per open conversation, from an operator-given range (`[sandbox] agent_uid_range`):
/// agents of two conversations then cannot touch each other's files even where bubblewrap is
/// missing. The gid is the uid's own number unless a shared agent group is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
    /// A shared group for every conversation's agent; `None`: gid = uid.
    pub group: Option<u32>,
}

/// The widest range accepted: enough for any conversation limit, small enough to check.
const UID_RANGE_MAX: u32 = 1 << 20;

impl UidRange {
    /// Validates `[first, last]` (empty = no range). The range may not contain 0, the
    /// supervisor's uid, or any uid (gid, when gid = uid) this host's account files use, and
    /// needs a root supervisor.
    pub fn decide(
        range: &[u32],
        agent_group: &str,
        own_uid: u32,
        passwd: &str,
        group: &str,
    ) -> Result<Option<UidRange>, SandboxError> {
        Self::decide_with(range, agent_group, own_uid, own_uid == 0, passwd, group)
    }

    /// [`UidRange::decide`] where `can_switch` says whether this process may change its ids
    /// (root, or `CAP_SETUID` and `CAP_SETGID`: [`can_switch_ids`]).
    pub fn decide_with(
        range: &[u32],
        agent_group: &str,
        own_uid: u32,
        can_switch: bool,
        passwd: &str,
        group: &str,
    ) -> Result<Option<UidRange>, SandboxError> {
        let (first, last) = match range {
            [] => return Ok(None),
            [f, l] => (*f, *l),
            _ => {
                return Err(SandboxError::InvalidInput(
                    "sandbox.agent_uid_range must be [first, last]".into(),
                ));
            }
        };
        if !can_switch {
            return Err(SandboxError::InvalidInput(format!(
                "sandbox.agent_uid_range is set but the supervisor runs as uid {own_uid}, neither \
                 root nor holding CAP_SETUID and CAP_SETGID, and cannot switch agents to other uids"
            )));
        }
        if first == 0 || first > last || last - first >= UID_RANGE_MAX || last == u32::MAX {
            return Err(SandboxError::InvalidInput(format!(
                "sandbox.agent_uid_range [{first}, {last}] must be non-empty, above 0 and at most \
                 {UID_RANGE_MAX} ids wide"
            )));
        }
        let grp = agent_group.trim();
        let shared_group = if grp.is_empty() {
            None
        } else if let Ok(n) = grp.parse::<u32>() {
            Some(n)
        } else {
            Some(
                group
                    .lines()
                    .find(|l| l.split(':').next() == Some(grp))
                    .and_then(|l| field(l, 2))
                    .ok_or_else(|| {
                        SandboxError::InvalidInput(format!(
                            "sandbox.agent_group {grp:?} is not in /etc/group"
                        ))
                    })?,
            )
        };
        if shared_group == Some(0) {
            return Err(SandboxError::InvalidInput(
                "the agent group resolves to gid 0".into(),
            ));
        }
        let inside = |n: u32| (first..=last).contains(&n);
        let mut files = vec![("passwd", passwd)];
        if shared_group.is_none() {
            files.push(("group", group));
        }
        for (what, file) in files {
            if let Some(line) = file.lines().find(|l| field(l, 2).is_some_and(inside)) {
                let name = line.split(':').next().unwrap_or("?");
                return Err(SandboxError::InvalidInput(format!(
                    "sandbox.agent_uid_range [{first}, {last}] contains the id of {what} entry \
                     {name:?}; pick ids no account on this host uses"
                )));
            }
        }
        Ok(Some(UidRange {
            first,
            last,
            group: shared_group,
        }))
    }

    /// [`UidRange::decide`] with this process's uid and the host's account files.
    pub fn for_this_process(
        range: &[u32],
        agent_group: &str,
    ) -> Result<Option<UidRange>, SandboxError> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let uid = nix::unistd::geteuid().as_raw();
        Self::decide_with(
            range,
            agent_group,
            uid,
            uid == 0 || can_switch_ids(),
            &read("/etc/passwd"),
            &read("/etc/group"),
        )
    }

    fn identity(&self, uid: u32) -> AgentIdentity {
        AgentIdentity {
            uid,
            gid: self.group.unwrap_or(uid),
        }
    }
}

/// Which conversation holds which uid of a [`UidRange`].
#[derive(Debug)]
pub(crate) struct UidPool {
    range: UidRange,
    held: std::sync::Mutex<std::collections::BTreeMap<String, u32>>,
}

impl UidPool {
    pub(crate) fn new(range: UidRange) -> Self {
        Self {
            range,
            held: Default::default(),
        }
    }

    pub(crate) fn range(&self) -> &UidRange {
        &self.range
    }

    /// The conversation's identity, assigning the lowest free uid on first use.
    pub(crate) fn assign(&self, conversation_id: &str) -> Result<AgentIdentity, SandboxError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(uid) = held.get(conversation_id) {
            return Ok(self.range.identity(*uid));
        }
        let used: std::collections::BTreeSet<u32> = held.values().copied().collect();
        let uid = (self.range.first..=self.range.last)
            .find(|u| !used.contains(u))
            .ok_or_else(|| {
                SandboxError::InvalidInput(format!(
                    "every uid of sandbox.agent_uid_range [{}, {}] is held by an open conversation",
                    self.range.first, self.range.last
                ))
            })?;
        held.insert(conversation_id.to_string(), uid);
        Ok(self.range.identity(uid))
    }

    pub(crate) fn release(&self, conversation_id: &str) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(conversation_id);
    }

    /// Whether the uid `holder` holds is the one a new conversation would be assigned if
    /// `holder` gave it back (the lowest free one). True when `holder` holds none.
    pub(crate) fn is_lowest_free(&self, holder: &str) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mine) = held.get(holder).copied() else {
            return true;
        };
        let used: std::collections::BTreeSet<u32> = held
            .iter()
            .filter(|(k, _)| k.as_str() != holder)
            .map(|(_, v)| *v)
            .collect();
        (self.range.first..=self.range.last).find(|u| !used.contains(u)) == Some(mine)
    }

    /// Moves the uid `from` holds to `to` (a warm agent handed to its conversation). Refused
    /// when `to` already holds one or `from` holds none.
    pub(crate) fn transfer(&self, from: &str, to: &str) -> Result<AgentIdentity, SandboxError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.contains_key(to) {
            return Err(SandboxError::InvalidInput(format!(
                "{to:?} already holds an agent uid"
            )));
        }
        let uid = held
            .remove(from)
            .ok_or_else(|| SandboxError::InvalidInput(format!("{from:?} holds no agent uid")))?;
        held.insert(to.to_string(), uid);
        Ok(self.range.identity(uid))
    }

    /// The identity held by `spawn_id`: a conversation id, or an ACP terminal's
    /// `<conversation id>~<terminal id>` (terminal ids never contain `~`).
    pub(crate) fn held_by(&self, spawn_id: &str) -> Option<AgentIdentity> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(spawn_id)
            .or_else(|| {
                spawn_id
                    .rsplit_once('~')
                    .and_then(|(conv, _)| held.get(conv))
            })
            .map(|u| self.range.identity(*u))
    }
}

/// Gives `dir` and what the previous owner of `dir` owned below it to `who`: a reopened
/// conversation whose root an earlier uid owned. Same filesystem only, symlinks changed
/// themselves and never followed, and a file with more than one link stays as it is: the
/// earlier agent may have hard-linked a file it does not own into its root (under the old
/// root-run supervisor, anything), and a chown must not hand that file over.
pub fn chown_tree(dir: &Path, who: AgentIdentity) -> Result<(), SandboxError> {
    use std::os::unix::fs::MetadataExt;
    let top = std::fs::symlink_metadata(dir).map_err(|e| SandboxError::io("inspect", dir, e))?;
    if !top.is_dir() {
        return Err(SandboxError::InvalidInput(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let previous = top.uid();
    // Walked with the earlier uid's rights (it owns what is walked) and CAP_CHOWN alone, never
    // past a mode that stops that uid. Its gid is the range's group when there is one, else
    // its uid (UidRange::identity). Through fds only (`chown_beneath`): an earlier agent's
    // process still running could swap a directory for a link mid-walk, and a walk by path
    // would then hand over what the link points to.
    let rights = (previous != nix::unistd::geteuid().as_raw()).then_some(
        warden_containment::rights::Rights {
            uid: previous,
            gid: if who.gid != who.uid {
                who.gid
            } else {
                previous
            },
        },
    );
    warden_containment::rights::with_rights_keeping(
        rights,
        warden_containment::rights::Capabilities::CHOWN,
        || {
            warden_containment::beneath::chown_beneath(dir, previous, (who.uid, who.gid))
                .map(|_| ())
                .map_err(|e| {
                    SandboxError::InvalidInput(format!("hand over {}: {e}", dir.display()))
                })
        },
    )
    .map_err(|e| SandboxError::InvalidInput(e.to_string()))?
}

#[cfg(test)]
mod range_tests {
    use super::*;

    #[test]
    fn a_range_needs_a_supervisor_that_can_switch_and_never_covers_it() {
        let passwd = "root:x:0:0::/root:/bin/sh\nwarden-supervisor:x:962:962::/var/lib/warden/supervisor:/usr/sbin/nologin\n";
        let group = "root:x:0:\nwarden-supervisor:x:962:\n";
        let r = UidRange::decide_with(&[62000, 62009], "", 962, true, passwd, group)
            .unwrap()
            .unwrap();
        assert_eq!((r.first, r.last, r.group), (62000, 62009, None));
        let e = UidRange::decide_with(&[62000, 62009], "", 962, false, passwd, group).unwrap_err();
        assert!(e.to_string().contains("CAP_SETUID"), "{e}");
        // The supervisor's own id inside the range is an id the host uses.
        assert!(UidRange::decide_with(&[960, 970], "", 962, true, passwd, group).is_err());
    }

    #[test]
    fn a_handed_over_root_keeps_foreign_and_multiply_linked_files() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: chown needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/mine"), "m").unwrap();
        std::fs::write(t.path().join("outside"), "o").unwrap();
        std::fs::hard_link(t.path().join("outside"), root.join("linked")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), root.join("sym")).unwrap();
        std::fs::write(root.join("foreign"), "f").unwrap();
        std::os::unix::fs::lchown(root.join("foreign"), Some(4321), None).unwrap();
        let who = AgentIdentity {
            uid: 200_123,
            gid: 200_123,
        };
        chown_tree(&root, who).unwrap();
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(uid(&root), who.uid);
        assert_eq!(uid(&root.join("sub")), who.uid);
        assert_eq!(uid(&root.join("sub/mine")), who.uid);
        assert_eq!(uid(&root.join("sym")), who.uid, "the link itself");
        assert_eq!(
            uid(&t.path().join("outside")),
            0,
            "not through a link, hard or soft"
        );
        assert_eq!(uid(&root.join("foreign")), 4321, "not the previous owner's");
    }

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\nsvc:x:990:985::/:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nagents:x:4242:\nsvc:x:985:\n";

    #[test]
    fn ranges_are_validated() {
        assert_eq!(UidRange::decide(&[], "", 0, PASSWD, GROUP).unwrap(), None);
        let r = UidRange::decide(&[200_000, 200_009], "", 0, PASSWD, GROUP)
            .unwrap()
            .unwrap();
        assert_eq!((r.first, r.last, r.group), (200_000, 200_009, None));
        let r = UidRange::decide(&[200_000, 200_009], "agents", 0, PASSWD, GROUP)
            .unwrap()
            .unwrap();
        assert_eq!(r.group, Some(4242));
        for bad in [&[0, 10][..], &[10, 5], &[5], &[1, 2, 3], &[900, 1000]] {
            assert!(
                UidRange::decide(bad, "", 0, PASSWD, GROUP).is_err(),
                "{bad:?}"
            );
        }
        // gid = uid: a group id inside the range is refused too.
        assert!(UidRange::decide(&[980, 989], "", 0, PASSWD, GROUP).is_err());
        assert!(UidRange::decide(&[200_000, 200_009], "", 962, PASSWD, GROUP).is_err());
    }

    #[test]
    fn each_open_conversation_holds_its_own_uid_and_terminals_share_it() {
        let pool = UidPool::new(UidRange {
            first: 100,
            last: 101,
            group: None,
        });
        let a = pool.assign("a~x").unwrap();
        let b = pool.assign("b").unwrap();
        assert_ne!(a.uid, b.uid);
        assert_eq!(pool.assign("a~x").unwrap(), a, "stable while held");
        assert_eq!(a.gid, a.uid);
        assert!(pool.assign("c").is_err(), "exhausted");
        assert_eq!(pool.held_by("a~x~term-1"), Some(a));
        assert_eq!(pool.held_by("b~term-3"), Some(b));
        assert_eq!(pool.held_by("zzz~term-1"), None);
        pool.release("a~x");
        assert_eq!(pool.held_by("a~x~term-1"), None);
        assert_eq!(
            pool.assign("c").unwrap().uid,
            a.uid,
            "released ids are reused"
        );
    }
}
