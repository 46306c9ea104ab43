//! The end-to-end harness: starts the real daemon binaries on temporary sockets and state
//! directories, exactly as `warden up` would (same layout, same flags), waits for their health,
//! and tears them down even when a test panics.
//!
//! Owns: finding (and if needed building) the binaries, process lifetime of what a test starts.
//! Must never: replace a daemon with an in-process imitation — every test here talks to real
//! processes over their real sockets.
//!
//! No process outlives the test run: each daemon runs in its own process group, is killed with its
//! group when its [`Daemon`] handle drops (including during a panic's unwinding), and carries
//! `PR_SET_PDEATHSIG` so the kernel kills it if the test process itself dies.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

pub mod netns;
pub mod real;
pub use warden_cli::layout::Layout;

/// The directory holding the workspace's binaries (`target/debug` for `cargo test`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WARDEN_BIN_DIR") {
        return PathBuf::from(d);
    }
    // The test executable lives in target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target/debug"))
}

/// Path of a workspace binary, building the workspace's binaries once per test process so a test
/// never runs a stale daemon.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        if std::env::var_os("WARDEN_BIN_DIR").is_some() {
            return Ok(());
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let out = std::process::Command::new(cargo)
            .args([
                "build",
                "--workspace",
                "--bins",
                "--quiet",
                "--manifest-path",
            ])
            .arg(manifest)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run cargo build: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = built {
        panic!("building the workspace binaries failed:\n{e}");
    }
    let p = bin_dir().join(name);
    assert!(p.is_file(), "binary {} not found", p.display());
    p
}

/// A running daemon process. Dropping it kills its whole process group.
pub struct Daemon {
    pub name: String,
    pub child: Child,
    pub socket: PathBuf,
    /// Where its stderr goes, when to a file (shown when it fails to start).
    pub log: Option<PathBuf>,
}

impl Daemon {
    pub fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(Ok(s)) => s,
            other => panic!("{} did not exit after SIGTERM: {other:?}", self.name),
        }
    }

    /// SIGKILL, no grace: simulates a crash.
    pub async fn crash(mut self) {
        let _ = self.child.kill().await;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Options of a test deployment.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra `--set KEY=VALUE` per daemon name ("policy", "supervisor", "gateway").
    pub sets: Vec<(String, String)>,
    /// Inherit the daemons' stderr into the test output (noisy; default off unless WARDEN_TEST_LOGS=1).
    pub show_logs: bool,
    /// Flags as `warden up --approver` gives them: the supervisor asks warden-approver (and
    /// adopts the deadline it describes), which chains to the policy (asking it for escalations
    /// in each request; the demo policy `approve-reads`).
    pub approver: bool,
    /// The approver's web page address (`--approver-http`); empty = no page.
    pub approver_http: String,
    /// `warden up --config DIR`: the daemons read `DIR/<daemon>.toml` where present.
    pub config_dir: Option<PathBuf>,
    /// Says that a test reads `<state>/<daemon>.log` (what an operator reads there). Every
    /// daemon's stderr goes there anyway unless `show_logs` (or `WARDEN_TEST_LOGS`) shows it.
    pub log_files: bool,
    /// `warden up --metrics IP:PORT`: each daemon serves Prometheus metrics (gateway on PORT,
    /// supervisor PORT+1, policy PORT+2, approver PORT+3).
    pub metrics: Option<std::net::SocketAddr>,
}

/// A state directory and the daemons started on it.
pub struct Deployment {
    pub dir: tempfile::TempDir,
    pub layout: Layout,
    pub http: String,
    pub opts: Options,
    pub daemons: Vec<Daemon>,
}

/// Where test deployments live: `WARDEN_TEST_ROOT`, else `<target>/tmp` — unless the checkout
/// is inside a temp tree (a clone in `/tmp` or `/var/tmp`), where the supervisor refuses its
/// state directory: then [`outside_temp_trees`] picks a place it accepts.
pub fn test_root() -> PathBuf {
    if let Some(d) = std::env::var_os("WARDEN_TEST_ROOT") {
        return PathBuf::from(d);
    }
    let target = bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    outside_temp_trees(&target.join("tmp"), nix::unistd::Uid::effective().is_root())
}

/// `preferred` when it is outside the temp trees; else `/var/lib/warden-e2e` for root (a path
/// the agent uids it switches to can traverse, unlike `/root`), `$HOME/.cache/warden-e2e` for
/// anyone else.
pub fn outside_temp_trees(preferred: &Path, root: bool) -> PathBuf {
    let probe = std::fs::canonicalize(preferred)
        .or_else(|_| {
            preferred
                .parent()
                .map(std::fs::canonicalize)
                .unwrap_or(Ok(preferred.into()))
        })
        .unwrap_or_else(|_| preferred.to_path_buf());
    if warden_sandbox::temp_tree_of(&probe).is_none() {
        return preferred.to_path_buf();
    }
    if root {
        return PathBuf::from("/var/lib/warden-e2e");
    }
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/warden-e2e"))
        .unwrap_or_else(|| PathBuf::from("/var/lib/warden-e2e"))
}

/// A free loopback TCP port for the gateway.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range (32768-60999 by default), so no outgoing connection of
    // a parallel test (one opens hundreds) can take the port between this check and the
    // daemon's bind; a per-process counter keeps the tests of one binary apart, and the pid
    // spreads binaries. A port that is busy is skipped.
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(397) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Deployment {
    /// One A2A JSON-RPC call to the gateway's HTTP listener with `token`: the whole JSON-RPC
    /// answer (its `result` or its `error`), or why none came (not reachable, not JSON).
    pub async fn a2a_rpc(
        &self,
        token: &str,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let resp = warden_cli::client::request(
            &self.http,
            http::Method::POST,
            "/a2a/jsonrpc",
            token,
            Some(&body),
        )
        .await
        .map_err(|e| format!("gateway not reachable: {e}"))?;
        warden_cli::client::read_answer(resp)
            .await
            .map(|a| a.0)
            .map_err(|e| format!("no answer: {e}"))
    }

    /// A fresh state directory under the target directory's `tmp/` (not `/tmp`: the supervisor
    /// refuses to keep sandboxes in a temp tree). The path stays short because Unix socket paths
    /// are limited to 108 bytes.
    pub fn new(opts: Options) -> Self {
        Self::new_in(&test_root(), opts)
    }

    /// Like [`Deployment::new`], but the state directory is made under `parent` instead of
    /// `/tmp`: the supervisor refuses to keep owned sandboxes inside a temp tree (an agent that
    /// may write /tmp could reach another conversation's sandbox), so its tests run elsewhere,
    /// e.g. under `CARGO_TARGET_TMPDIR`. Keep `parent` short: socket paths are limited to 108 bytes.
    pub fn new_in(parent: &Path, opts: Options) -> Self {
        std::fs::create_dir_all(parent)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        let dir = tempfile::Builder::new()
            .prefix("wd")
            .tempdir_in(parent)
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        // As `warden up` does for root: the agent uid a root supervisor switches to needs search
        // (never listing) on the way down to its roots and homes.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.path().display()));
        }
        let layout = Layout::new(dir.path());
        for d in ["run", "policy", "approver", "supervisor", "gateway"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap_or_else(|e| panic!("mkdir: {e}"));
        }
        let http = format!("127.0.0.1:{}", free_port());
        Deployment {
            dir,
            layout,
            http,
            opts,
            daemons: Vec::new(),
        }
    }

    /// Starts all daemons in order (four with `Options::approver`) and waits until each is healthy.
    pub async fn up(opts: Options) -> Self {
        let mut d = Self::new(opts);
        for name in d.plan().daemons() {
            d.start(name).await;
        }
        d
    }

    /// What `warden up` would be given for this deployment.
    pub fn plan(&self) -> warden_cli::up::UpOptions {
        warden_cli::up::UpOptions {
            layout: self.layout.clone(),
            bin_dir: bin_dir(),
            http: self.http.clone(),
            log_format: "human".into(),
            start_timeout: Duration::from_secs(10),
            approver: self.opts.approver,
            approver_http: self.opts.approver_http.clone(),
            config_dir: self.opts.config_dir.clone(),
            metrics: self.opts.metrics,
            log_level: None,
            echo_from: warden_daemon::logging::Severity::Info,
        }
    }

    /// Starts one daemon (as `warden up` would) and waits for its health (10 s).
    pub async fn start(&mut self, name: &str) {
        let child = self.spawn(name, &[]);
        let socket = self.layout.socket_of(name);
        let mut daemon = Daemon {
            name: name.to_string(),
            child,
            socket: socket.clone(),
            log: (!self.shows_logs()).then(|| self.log_file(name)),
        };
        wait_healthy(&mut daemon, Duration::from_secs(10)).await;
        self.daemons.retain(|d| d.name != name);
        self.daemons.push(daemon);
    }

    /// A second replica of `daemon` (the policy or the approver): the deployment's flags and
    /// database, its own state directory `name` and sockets in the run directory; returned
    /// healthy with its listening and admin sockets.
    pub async fn replica(&self, daemon: &str, name: &str) -> (Daemon, PathBuf, PathBuf) {
        let run = self.dir.path().join("run");
        let state = self.dir.path().join(name);
        std::fs::create_dir_all(&state).expect("the replica's state directory");
        let socket = run.join(format!("{name}.sock"));
        let admin = run.join(format!("{name}-admin.sock"));
        let quoted = |p: &Path| format!("{:?}", p.display().to_string());
        let extra: Vec<String> = [
            format!("daemon.state_dir={}", quoted(&state)),
            format!("listen.socket={}", quoted(&socket)),
            format!("admin.socket={}", quoted(&admin)),
        ]
        .into_iter()
        .flat_map(|s| ["--set".to_string(), s])
        .collect();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let child = self.spawn(daemon, &extra);
        let mut replica = Daemon {
            name: name.into(),
            child,
            socket: socket.clone(),
            log: None,
        };
        wait_healthy(&mut replica, Duration::from_secs(15)).await;
        (replica, socket, admin)
    }

    /// Spawns a daemon with the deployment's flags plus `extra` arguments, without waiting.
    pub fn spawn(&self, name: &str, extra: &[&str]) -> Child {
        let mut args = warden_cli::up::daemon_args(name, &self.plan());
        for (d, kv) in &self.opts.sets {
            if d == name {
                args.push("--set".into());
                args.push(kv.clone());
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let bin = binary(&format!("warden-{name}"));
        // Its log goes to a file in the deployment's directory unless it is shown: a daemon that
        // fails to start then says why in the test's failure (`wait_healthy`).
        if !self.shows_logs() {
            return spawn_group_logging(&bin, &args, Some(&self.log_file(name)));
        }
        spawn_group(&bin, &args, true)
    }

    fn shows_logs(&self) -> bool {
        self.opts.show_logs || std::env::var_os("WARDEN_TEST_LOGS").is_some()
    }

    /// Where a daemon's log goes with [`Options::log_files`].
    pub fn log_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// The running daemon called `name`.
    pub fn daemon(&mut self, name: &str) -> Option<&mut Daemon> {
        self.daemons.iter_mut().find(|d| d.name == name)
    }

    /// Removes the running daemon called `name` from the deployment (to stop or crash it).
    pub fn take(&mut self, name: &str) -> Option<Daemon> {
        let i = self.daemons.iter().position(|d| d.name == name)?;
        Some(self.daemons.remove(i))
    }

    /// A gRPC channel to a daemon's main socket.
    pub fn channel(&self, name: &str) -> tonic::transport::Channel {
        warden_daemon::client::unix_channel(&self.layout.socket_of(name))
    }

    /// The caller token file written for the gateway (created on first use, as `warden up` does).
    /// Runs the `warden` CLI on this deployment's state directory (stdin closed, at most 60 s):
    /// its exit code (-1 when killed by a signal), stdout and stderr.
    pub async fn warden(&self, args: &[&str]) -> (i32, String, String) {
        let state = self.dir.path().to_string_lossy().to_string();
        let mut c = tokio::process::Command::new(binary("warden"));
        c.args(["--state-dir", &state])
            .args(args)
            .stdin(std::process::Stdio::null());
        let out = run_with_deadline(&mut c, std::time::Duration::from_secs(60))
            .await
            .expect("warden runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.layout.token_file())
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }
}

/// Spawns `bin` with `args` in its own process group with PR_SET_PDEATHSIG(SIGKILL).
pub fn spawn_group(bin: &Path, args: &[String], show_logs: bool) -> Child {
    let logs = show_logs || std::env::var_os("WARDEN_TEST_LOGS").is_some();
    spawn_group_with(bin, args, logs, None)
}

/// Like [`spawn_group`], with stderr appended to `log` when given.
pub fn spawn_group_logging(bin: &Path, args: &[String], log: Option<&Path>) -> Child {
    spawn_group_with(bin, args, false, log)
}

fn spawn_group_with(bin: &Path, args: &[String], logs: bool, log: Option<&Path>) -> Child {
    let mut cmd = Command::new(bin);
    let stderr = match log {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map(Stdio::from)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", p.display())),
        None if logs => Stdio::inherit(),
        None => Stdio::null(),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(if logs {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

/// Waits until the daemon's socket reports SERVING; panics if it dies or stays unhealthy, with
/// its exit status and the end of its own log (its reason) when the log went to a file.
pub async fn wait_healthy(d: &mut Daemon, timeout: Duration) {
    let start = Instant::now();
    loop {
        if let Ok(Some(s)) = d.child.try_wait() {
            panic!(
                "warden-{} exited during start-up: {s}{}",
                d.name,
                log_tail(d.log.as_deref())
            );
        }
        if warden_daemon::client::healthy(&d.socket).await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "warden-{} not healthy within {timeout:?}{}",
            d.name,
            log_tail(d.log.as_deref())
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The last lines of a daemon's log, for a start-up failure's message ("" without a log file).
fn log_tail(log: Option<&Path>) -> String {
    let Some(text) = log.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    format!(
        "\n--- the end of its log ({}):\n{tail}",
        log.map(|p| p.display().to_string()).unwrap_or_default()
    )
}

/// Runs a command to completion with a deadline, capturing its output.
pub async fn run_with_deadline(
    cmd: &mut Command,
    deadline: Duration,
) -> std::io::Result<std::process::Output> {
    cmd.kill_on_drop(true);
    match tokio::time::timeout(deadline, cmd.output()).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("command did not finish within {deadline:?}"),
        )),
    }
}

/// For benches: when the bench itself runs in release, builds the release binaries of
/// `packages` and points the harness at them (`WARDEN_BIN_DIR`), so the daemons are optimised
/// too. A debug run (`cargo test --bench …`) keeps the debug binaries. Panics (it is a bench's
/// set-up) when the build fails.
pub fn use_release_binaries_in_benches(packages: &[&str]) {
    if std::env::var_os("WARDEN_BIN_DIR").is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf);
    let Some(dir) = profile_dir.filter(|p| p.ends_with("release")) else {
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(&manifest);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let st = cmd.status().expect("cargo build");
    assert!(st.success(), "release build failed");
    // SAFETY: benches call this first, before any other thread exists.
    unsafe { std::env::set_var("WARDEN_BIN_DIR", dir) };
}

/// git's own id of a blob with `content` (`git hash-object`), for the `index` lines of a task's
/// diff: the answer of the real git, not a second implementation of it.
pub fn git_blob_id(content: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("git")
        .args(["hash-object", "--stdin"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("git runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(content)
        .expect("git reads");
    let out = child.wait_with_output().expect("git answers");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The `index` line of a diff of a file that is new with `content`.
pub fn new_file_index(content: &[u8]) -> String {
    format!("index {}..{}\n", "0".repeat(40), git_blob_id(content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkout_in_a_temp_tree_gets_its_deployments_somewhere_the_supervisor_accepts() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("target-probe/tmp");
        if warden_sandbox::temp_tree_of(Path::new(env!("CARGO_MANIFEST_DIR"))).is_none() {
            assert_eq!(outside_temp_trees(&here, true), here);
        }
        for cloned in [
            "/tmp/warden/target/tmp",
            "/var/tmp/w/target/tmp",
            "/dev/shm/x",
        ] {
            let root = outside_temp_trees(Path::new(cloned), true);
            assert_eq!(root, Path::new("/var/lib/warden-e2e"));
            let user = outside_temp_trees(Path::new(cloned), false);
            assert!(warden_sandbox::temp_tree_of(&user).is_none(), "{user:?}");
        }
    }
}
