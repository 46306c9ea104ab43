//! Where a local deployment (`warden up`) keeps its state and sockets. `up`, `status`, `send`,
//! `audit` and the end-to-end tests all derive paths from here, so they cannot disagree.

use std::path::{Path, PathBuf};

/// The three daemons, in start order.
pub const DAEMONS: [&str; 3] = ["policy", "supervisor", "gateway"];

/// The four daemons of `warden up --approver`, in start order (the approver chains to the
/// policy, the supervisor asks the approver).
pub const DAEMONS_WITH_APPROVER: [&str; 4] = ["policy", "approver", "supervisor", "gateway"];

/// Paths of one state directory, or of the deployed host (`--deployed`).
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    /// The host installed from the package (deploy/): each daemon's sockets in
    /// `/run/warden/<daemon>/`, as `deploy/config/*.toml` put them.
    pub deployed: bool,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout {
            root: root.into(),
            deployed: false,
        }
    }

    /// The deployed host's layout: state in `/var/lib/warden`, sockets in `/run/warden`.
    pub fn deployed() -> Self {
        Layout {
            root: PathBuf::from(crate::deployed::STATE_DIR),
            deployed: true,
        }
    }

    /// `/run/warden/<daemon>/<file>` of the deployed host.
    fn deployed_socket(daemon: &str, file: &str) -> PathBuf {
        Path::new(crate::deployed::RUN_DIR).join(daemon).join(file)
    }

    /// The default: `$XDG_STATE_HOME/warden`, else `~/.local/state/warden`; for root
    /// `/var/lib/warden-up`: a root supervisor runs agents as their own uid, which must be able
    /// to search the way down to its roots and homes, and root's home (`/root`, 0700) is closed.
    pub fn default_root() -> PathBuf {
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(x).join("warden");
        }
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/lib/warden-up");
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib"));
        home.join(".local/state/warden")
    }

    /// How a person runs `warden` against this layout, for the hints the CLI prints: `warden`
    /// for the default state directory, `warden --deployed` for the installed host, else
    /// `warden --state-dir DIR` (quoted for a POSIX shell when it needs it).
    pub fn command(&self) -> String {
        if self.deployed {
            return "warden --deployed".into();
        }
        if self.root == Self::default_root() {
            return "warden".into();
        }
        let dir = self.root.to_string_lossy();
        match shlex::try_quote(&dir) {
            Ok(q) => format!("warden --state-dir {q}"),
            // A path with a NUL cannot be typed; shown as it is.
            Err(_) => format!("warden --state-dir {dir}"),
        }
    }

    /// Where `warden init` writes and `warden up` reads configuration by default.
    pub fn config_dir(&self) -> PathBuf {
        self.root.join("config")
    }

    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// A daemon's own state directory.
    pub fn state_of(&self, daemon: &str) -> PathBuf {
        self.root.join(daemon)
    }

    /// A daemon's main gRPC socket (the gateway's is its admin/health socket).
    pub fn socket_of(&self, daemon: &str) -> PathBuf {
        if self.deployed {
            return Self::deployed_socket(daemon, &format!("{daemon}.sock"));
        }
        self.run_dir().join(format!("{daemon}.sock"))
    }

    /// The policy service's admin (audit, reload) socket.
    pub fn policy_admin_socket(&self) -> PathBuf {
        if self.deployed {
            return Self::deployed_socket("policy", "policy-admin.sock");
        }
        self.run_dir().join("policy-admin.sock")
    }

    /// The approver's admin socket (`warden approvals`).
    pub fn approver_admin_socket(&self) -> PathBuf {
        if self.deployed {
            return Self::deployed_socket("approver", "approver-admin.sock");
        }
        self.run_dir().join("approver-admin.sock")
    }

    /// The operator token `warden up --approver` generates for the web page (`operator TOKEN`).
    pub fn operator_token_file(&self) -> PathBuf {
        self.state_of("approver").join("operator-tokens")
    }

    /// The caller token `warden up` generates when none is configured.
    pub fn token_file(&self) -> PathBuf {
        self.state_of("gateway").join("token")
    }

    /// The file where `warden up` writes the gateway's URL for `warden send`.
    pub fn url_file(&self) -> PathBuf {
        self.run_dir().join("gateway.url")
    }

    /// Where `warden up` writes each daemon's output (`warden logs`).
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// One daemon's log as `warden up` writes it (`up` for `warden up -d`'s own output).
    pub fn log_of(&self, daemon: &str) -> PathBuf {
        self.logs_dir().join(format!("{daemon}.log"))
    }

    /// The running `warden up`'s pid and start time (`warden down`).
    pub fn up_pid_file(&self) -> PathBuf {
        self.run_dir().join("up.pid")
    }

    /// Written by a running `warden up` (its pid record) once every daemon is healthy and it
    /// has said so: what `warden up -d` waits for.
    pub fn up_ready_file(&self) -> PathBuf {
        self.run_dir().join("up.ready")
    }

    /// The advisory lock one `warden up` holds on this state directory for as long as it runs
    /// (`up::lock`).
    pub fn up_lock_file(&self) -> PathBuf {
        self.root.join("up.lock")
    }
}

/// Resolves `--state-dir` or the default, made absolute (daemons resolve relative paths against
/// their own state directories, so a relative path here would point somewhere else for them).
pub fn resolve(state_dir: Option<&Path>) -> Layout {
    let root = state_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(Layout::default_root);
    let root = if root.is_absolute() {
        root
    } else {
        std::env::current_dir()
            .map(|d| d.join(&root))
            .unwrap_or(root)
    };
    Layout::new(root)
}

/// The configuration file of `daemon` in an operator's `--config DIR` (`warden init` writes it).
pub fn file_of(dir: &Path, daemon: &str) -> PathBuf {
    dir.join(format!("{daemon}.toml"))
}

/// `p` as a TOML string literal (quotes and control characters escaped by the `toml` crate), for
/// the `--set key=value` flags and the starter files that name paths.
pub fn toml_str(p: &Path) -> String {
    toml::Value::String(p.to_string_lossy().into_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_state_directory_that_was_given() {
        assert_eq!(Layout::new(Layout::default_root()).command(), "warden");
        assert_eq!(Layout::deployed().command(), "warden --deployed");
        assert_eq!(Layout::new("/srv/w").command(), "warden --state-dir /srv/w");
        // Quoted so that a shell gives back the same path.
        let odd = "/srv/my state/it's $HOME";
        let words = shlex::split(&Layout::new(odd).command()).unwrap();
        assert_eq!(words, ["warden", "--state-dir", odd]);
    }

    #[test]
    fn a_path_written_as_toml_reads_back_as_the_same_path() {
        for p in [
            "/tmp/plain",
            "/tmp/with space/and \"quotes\"",
            "/tmp/back\\slash/it's",
            "/tmp/line\nbreak\tand\u{7f}del",
        ] {
            let text = format!("v = {}", toml_str(Path::new(p)));
            let back: toml::Table = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(back["v"].as_str(), Some(p), "{text}");
        }
    }
}
