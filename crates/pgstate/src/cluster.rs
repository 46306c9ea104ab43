//! A real PostgreSQL cluster for tests (feature `test-cluster`): `initdb` into a temporary
//! directory, the server listening only on a Unix socket in that directory (no TCP), stopped
//! and removed when dropped. The binaries are the distribution's (`pg_config --bindir`, else
//! the newest `/usr/lib/postgresql/<n>/bin`). Run as root, the cluster belongs to `nobody`:
//! initdb refuses root. Without the binaries a test skips, except under CI (`CI=true`), where
//! that is a failure.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "PostgreSQL server binaries not found (pg_config --bindir, /usr/lib/postgresql/*/bin): install the distribution's postgresql package"
    )]
    NoBinaries,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed: {output}")]
    Failed { what: String, output: String },
    #[error("the server did not accept connections within 30 s; its log:\n{0}")]
    NotReady(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// The uid/gid the cluster runs as when the test runs as root.
const NOBODY: u32 = 65534;

/// A running (or stopped, see [`TestCluster::stop`]) cluster.
pub struct TestCluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    server: Option<Child>,
    /// `listen_addresses`: empty (the socket only) unless [`TestCluster::listen_tcp`].
    listen: String,
}

/// The superuser the cluster is created with (trust authentication on its private socket).
pub const USER: &str = "warden";

impl TestCluster {
    /// Starts a cluster, or `Ok(None)` when PostgreSQL is not installed outside CI (the caller
    /// prints that it skipped). Under `CI=true` a missing PostgreSQL is an error.
    pub fn start_or_skip() -> Result<Option<TestCluster>, ClusterError> {
        match find_bindir() {
            Some(b) => Self::start_with(b).map(Some),
            None if std::env::var("CI").is_ok_and(|v| v == "true") => Err(ClusterError::NoBinaries),
            None => {
                eprintln!("SKIP: {}", ClusterError::NoBinaries);
                Ok(None)
            }
        }
    }

    fn start_with(bindir: PathBuf) -> Result<TestCluster, ClusterError> {
        // /tmp, not the target directory: the socket path must stay under the kernel's 107
        // bytes, and every ancestor must be traversable by `nobody`.
        let dir = tempfile::Builder::new()
            .prefix("warden-pg-")
            .tempdir_in("/tmp")
            .map_err(io("temporary directory"))?;
        if as_root() {
            nix::unistd::chown(
                dir.path(),
                Some(nix::unistd::Uid::from_raw(NOBODY)),
                Some(nix::unistd::Gid::from_raw(NOBODY)),
            )
            .map_err(|e| ClusterError::Io {
                what: "chown the cluster directory".into(),
                source: e.into(),
            })?;
        }
        let data = dir.path().join("data");
        let out = owned(Command::new(bindir.join("initdb")))
            .args([
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ])
            .arg(format!("--username={USER}"))
            .arg("-D")
            .arg(&data)
            .output()
            .map_err(io("initdb"))?;
        if !out.status.success() {
            return Err(ClusterError::Failed {
                what: "initdb".into(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let mut c = TestCluster {
            dir,
            bindir,
            server: None,
            listen: String::new(),
        };
        c.start()?;
        Ok(c)
    }

    /// The directory holding the server's socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A connection string for database `db` on the cluster's socket.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host={} port=5432 user={USER} dbname={db}",
            self.dir.path().display()
        )
    }

    /// Restarts the server listening on TCP port 5432 of `addrs` too (beside its socket),
    /// trusting clients from `cidr`: tests whose "hosts" are network namespaces reach it over
    /// their links. The addresses must exist on this host.
    pub fn listen_tcp(&mut self, addrs: &[&str], cidr: &str) -> Result<(), ClusterError> {
        use std::io::Write;
        self.stop();
        let hba = self.dir.path().join("data").join("pg_hba.conf");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&hba)
            .map_err(io("pg_hba.conf"))?;
        writeln!(f, "host all all {cidr} trust").map_err(io("pg_hba.conf"))?;
        self.listen = addrs.join(",");
        self.start()
    }

    /// A connection string for database `db` over TCP at `addr` (see [`TestCluster::listen_tcp`]).
    pub fn tcp_url(&self, addr: &str, db: &str) -> String {
        format!("host={addr} port=5432 user={USER} dbname={db} connect_timeout=2")
    }

    /// Creates database `db` (names are the tests' own: letters, digits, underscores).
    pub fn create_db(&self, db: &str) -> Result<(), ClusterError> {
        let out = owned(Command::new(self.bindir.join("createdb")))
            .arg("-h")
            .arg(self.dir.path())
            .args(["-p", "5432", "-U", USER, db])
            .output()
            .map_err(io("createdb"))?;
        if !out.status.success() {
            return Err(ClusterError::Failed {
                what: format!("createdb {db}"),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start(&mut self) -> Result<(), ClusterError> {
        if self.server.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .map_err(io("server log"))?;
        if as_root() {
            let _ = nix::unistd::chown(
                &self.dir.path().join("server.log"),
                Some(nix::unistd::Uid::from_raw(NOBODY)),
                Some(nix::unistd::Gid::from_raw(NOBODY)),
            );
        }
        let err = log.try_clone().map_err(io("server log"))?;
        let child = owned(Command::new(self.bindir.join("postgres")))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-k")
            .arg(self.dir.path())
            .args([
                "-p",
                "5432",
                "-c",
                &format!("listen_addresses={}", self.listen),
                "-c",
                "max_connections=200",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io("postgres"))?;
        self.server = Some(child);
        let t0 = Instant::now();
        loop {
            let ready = Command::new(self.bindir.join("pg_isready"))
                .arg("-h")
                .arg(self.dir.path())
                .args(["-p", "5432", "-U", USER, "-d", "postgres", "-q"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(ClusterError::NotReady(self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: open connections are closed), keeping its data; a
    /// test's outage. [`TestCluster::start`] brings it back.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server and every process it started (SIGSTOP): a database that accepts
    /// connections and answers nothing, as a hung host does. [`TestCluster::resume`] thaws it.
    pub fn pause(&self) {
        self.signal_all(nix::sys::signal::Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal_all(nix::sys::signal::Signal::SIGCONT);
    }

    /// The postmaster and its children (read from /proc: they share the test's process group,
    /// so the group cannot be signalled).
    fn signal_all(&self, sig: nix::sys::signal::Signal) {
        let Some(child) = &self.server else { return };
        let master = child.id() as i32;
        let mut pids = vec![master];
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The fields after the command's closing parenthesis: state, then the parent's pid.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(master) {
                pids.push(pid);
            }
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // A paused server would not take the signal below.
        self.resume();
        if let Some(mut child) = self.server.take() {
            // Immediate shutdown: the data is thrown away with the directory.
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The command, run as `nobody` when the test runs as root (std drops the supplementary
/// groups when root sets a uid).
fn owned(mut c: Command) -> Command {
    if as_root() {
        c.uid(NOBODY).gid(NOBODY);
    }
    // The server and its tools inherit no locale or PG* settings from the test's environment.
    c.env_remove("PGHOST")
        .env_remove("PGPORT")
        .env_remove("PGDATABASE");
    c
}

fn find_bindir() -> Option<PathBuf> {
    let has_server = |d: &Path| d.join("postgres").is_file() && d.join("initdb").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server(&d) {
            return Some(d);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| has_server(d))
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d)
}
