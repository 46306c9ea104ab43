//! The child's environment (an allowlist, never inherited wholesale) and the recursion guard.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

use crate::SandboxError;

/// Depth marker: how many warden supervisors are above this process (read by one rule,
/// `warden_daemon::depth`, shared with the gateway).
pub use warden_daemon::depth::DEPTH_ENV;
/// Tree marker: every process of one spawned tree inherits `WARDEN_TREE=<id>`.
pub const TREE_MARKER_ENV: &str = "WARDEN_TREE";
/// Default maximum inherited depth: a supervisor that itself runs under a warden agent refuses.
pub const DEFAULT_MAX_DEPTH: u32 = 1;

/// Base process keys every agent gets when the supervisor has them.
pub const BASE_KEYS: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "COLORTERM",
    "NO_COLOR",
];

/// Which variables of the supervisor's environment a child may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPolicy {
    keys: Vec<String>,
}

fn valid_key(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && k.len() <= 128
}

impl EnvPolicy {
    /// `agent_keys`: provider keys this agent needs (from its configuration, e.g.
    /// `ANTHROPIC_API_KEY`). `operator_extra`: the operator-only extra list (e.g. `HTTPS_PROXY`).
    /// Key names must be plain identifiers; the warden markers can never be allowlisted, so a
    /// configuration cannot lower the depth or forge a tree marker.
    pub fn new<I, J, S, T>(agent_keys: I, operator_extra: J) -> Result<Self, SandboxError>
    where
        I: IntoIterator<Item = S>,
        J: IntoIterator<Item = T>,
        S: AsRef<str>,
        T: AsRef<str>,
    {
        let mut keys: Vec<String> = BASE_KEYS.iter().map(|s| s.to_string()).collect();
        let extra = agent_keys
            .into_iter()
            .map(|s| s.as_ref().to_string())
            .chain(operator_extra.into_iter().map(|s| s.as_ref().to_string()));
        for k in extra {
            if !valid_key(&k) {
                return Err(SandboxError::InvalidInput(format!(
                    "environment key {k:?} is not a plain identifier"
                )));
            }
            if k == DEPTH_ENV || k == TREE_MARKER_ENV {
                return Err(SandboxError::InvalidInput(format!(
                    "{k} is set by the supervisor and cannot be allowlisted"
                )));
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        Ok(Self { keys })
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Builds the child environment from the supervisor's own environment.
    pub fn from_process_env(&self) -> ChildEnv {
        self.build_from(std::env::vars_os())
    }

    /// Builds the child environment from `source`: allowlisted keys that are present are
    /// copied, everything else is omitted (never set to an empty value).
    pub fn build_from<I>(&self, source: I) -> ChildEnv
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut vars = BTreeMap::new();
        for (k, v) in source {
            if k.to_str().is_some_and(|k| self.keys.iter().any(|a| a == k)) {
                vars.insert(k, v);
            }
        }
        ChildEnv { vars }
    }
}

/// A filtered environment. Only [`EnvPolicy`] makes one, so nothing else can add to it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChildEnv {
    vars: BTreeMap<OsString, OsString>,
}

impl ChildEnv {
    pub fn get(&self, key: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(key)).map(OsString::as_os_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&OsStr, &OsStr)> {
        self.vars
            .iter()
            .map(|(k, v)| (k.as_os_str(), v.as_os_str()))
    }

    pub(crate) fn set_home(&mut self, home: &std::path::Path) {
        self.vars
            .insert(OsString::from("HOME"), home.as_os_str().to_os_string());
    }

    /// The proxy variables of an agent whose only way out is the egress relay at
    /// `http://127.0.0.1:<port>` inside its namespace (replacing any the operator passed).
    /// `loopback_direct`: `NO_PROXY` names the namespace's own loopback (`EgressSpec`).
    pub(crate) fn set_proxy(&mut self, port: u16, loopback_direct: bool) {
        let url = format!("http://127.0.0.1:{port}");
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            self.vars.insert(OsString::from(k), OsString::from(&url));
        }
        // Node.js 24+ reads the variables above for its built-in fetch and http only with this.
        self.vars
            .insert(OsString::from("NODE_USE_ENV_PROXY"), OsString::from("1"));
        // Nothing bypasses the proxy by configuration: a client that bypasses it for loopback
        // anyway finds the mirrored loopback ports.
        for k in ["NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"] {
            self.vars.remove(OsStr::new(k));
        }
        if loopback_direct {
            for k in ["NO_PROXY", "no_proxy"] {
                self.vars
                    .insert(OsString::from(k), OsString::from("127.0.0.1,localhost,::1"));
            }
        }
    }

    /// The account name an agent sees in `USER`/`LOGNAME` once it runs as its own identity
    /// (the supervisor's would name an account that is not the agent's).
    pub(crate) fn set_user(&mut self, name: &str) {
        for k in ["USER", "LOGNAME"] {
            self.vars.insert(OsString::from(k), OsString::from(name));
        }
    }
}

/// The recursion guard: the depth this supervisor inherited and the maximum it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthGuard {
    inherited: u32,
    max: u32,
}

impl DepthGuard {
    /// Reads `WARDEN_DEPTH` from this process's environment.
    pub fn from_process_env(max: u32) -> Self {
        Self::from_marker(std::env::var_os(DEPTH_ENV).as_deref(), max)
    }

    /// An absent marker is depth 0. A marker that is not a plain number counts as infinitely
    /// deep, so a mangled value can only refuse, never permit.
    pub fn from_marker(value: Option<&OsStr>, max: u32) -> Self {
        Self {
            inherited: warden_daemon::depth::inherited(value),
            max,
        }
    }

    pub fn inherited(&self) -> u32 {
        self.inherited
    }

    /// The depth to hand the child, or a refusal when this supervisor is already too deep.
    pub fn child_depth(&self) -> Result<u32, SandboxError> {
        if self.inherited >= self.max {
            return Err(SandboxError::DepthExceeded {
                inherited: self.inherited,
                max: self.max,
            });
        }
        Ok(self.inherited.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(k: &str, v: &str) -> (OsString, OsString) {
        (k.into(), v.into())
    }

    #[test]
    fn only_allowlisted_keys_survive_and_absent_ones_stay_absent() {
        let p = EnvPolicy::new(["ANTHROPIC_API_KEY"], ["HTTPS_PROXY"]).unwrap();
        let env = p.build_from([
            os("PATH", "/usr/bin"),
            os("ANTHROPIC_API_KEY", "k"),
            os("OPENAI_API_KEY", "other"),
            os("AWS_SECRET_ACCESS_KEY", "s"),
            os("WARDEN_DEPTH", "0"),
            os("WARDEN_TREE", "forged"),
        ]);
        let keys: Vec<_> = env.iter().map(|(k, _)| k.to_owned()).collect();
        assert_eq!(
            keys,
            vec![OsString::from("ANTHROPIC_API_KEY"), "PATH".into()]
        );
        assert!(env.get("HTTPS_PROXY").is_none());
    }

    #[test]
    fn markers_and_odd_names_cannot_be_allowlisted() {
        assert!(EnvPolicy::new(["WARDEN_DEPTH"], [""; 0]).is_err());
        assert!(EnvPolicy::new([""; 0], ["WARDEN_TREE"]).is_err());
        for bad in ["", "A=B", "1X", "A B", "A\0"] {
            assert!(EnvPolicy::new([bad], [""; 0]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn depth_guard_fails_closed() {
        assert_eq!(DepthGuard::from_marker(None, 1).child_depth().unwrap(), 1);
        assert_eq!(
            DepthGuard::from_marker(Some(OsStr::new("0")), 1)
                .child_depth()
                .unwrap(),
            1
        );
        for v in ["1", "2", "-1", "", " 0", "0x0", "99999999999999"] {
            assert!(
                DepthGuard::from_marker(Some(OsStr::new(v)), 1)
                    .child_depth()
                    .is_err(),
                "{v:?}"
            );
        }
        assert_eq!(
            DepthGuard::from_marker(Some(OsStr::new("1")), 3)
                .child_depth()
                .unwrap(),
            2
        );
    }
}
