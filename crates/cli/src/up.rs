//! `warden up`: the three daemons (four with `--approver`) as separate child processes on one
//! state directory.
//!
//! Each daemon gets its own process group, so a Ctrl-C reaches only `up`, which then stops them in
//! reverse start order (gateway, supervisor, [approver,] policy). `PR_SET_PDEATHSIG` makes the kernel kill them
//! if `up` itself is killed, so no daemon outlives it.
//!
//! Quiet by default: the terminal shows the daemons' warnings and errors only (`-v` info too,
//! `-vv` debug), while each daemon's log at info (debug with `-vv`) goes to
//! `<state>/logs/<daemon>.log` (`warden logs`), a short status says when all are ready, and a failure ends with one plain line saying what to change
//! ([`UpError::fix`]). `warden up -d` ([`detach`]) runs the same `up` in a session of its own
//! and returns once every daemon is healthy; `warden down` ([`down`]) stops it through the
//! pid file `up` keeps in `<state>/run/up.pid` (its pid and start time, so a reused pid is never
//! signalled).
//!
//! One `warden up` per state directory: each takes an advisory lock on `<state>/up.lock`
//! ([`lock`], `flock(2)`, released by the kernel however the holder ends) before it touches
//! anything — logs, token, pid file, daemons. `up -d` takes it in the foreground and hands the
//! very same open file (and so the lock) to the background `up`, so no second `up` can slip in
//! between; it reports success only when the `up` it started (named in the pid file) is ready,
//! and that `up`'s own failure otherwise. Logs are rotated (`.log` → `.log.1`) only under the
//! lock, so a second attempt never renames a running instance's log.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::layout::{DAEMONS, DAEMONS_WITH_APPROVER, Layout, toml_str};
use warden_daemon::logging::Severity;

mod args;
mod state;

pub use args::{daemon_args, metrics_addr, warden_listeners};
use state::*;
pub use state::{UpLock, lock};

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("cannot create {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("warden is already running on {0} (try `warden status`)")]
    AlreadyRunning(PathBuf),
    #[error(
        "daemon binary {0} not found (build with `cargo build --release --workspace --bins`, or pass --bin-dir)"
    )]
    MissingBinary(PathBuf),
    #[error("cannot start {daemon}: {source}")]
    Spawn {
        daemon: String,
        #[source]
        source: std::io::Error,
    },
    #[error("warden-{daemon} exited during start-up ({status})")]
    DiedAtStart {
        daemon: String,
        status: String,
        log: PathBuf,
    },
    #[error("warden-{daemon} did not report healthy within {secs} s")]
    NotHealthy {
        daemon: String,
        secs: u64,
        log: PathBuf,
    },
    #[error("warden-{daemon} exited unexpectedly ({status}); the others were stopped")]
    Died {
        daemon: String,
        status: String,
        log: PathBuf,
    },
    #[error("the background warden up exited before it was ready ({status}); its output:\n{tail}")]
    DetachedDied { status: String, tail: String },
    #[error(
        "the background warden up was not ready within {0} s (still starting; `warden status`)"
    )]
    DetachedSlow(u64),
    #[error("cannot write the caller token {path}: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("signal handling: {0}")]
    Signal(#[source] std::io::Error),
    #[error("{flag} {value:?}: {why}")]
    Flag {
        flag: &'static str,
        value: String,
        why: String,
    },
    #[error("warden-{daemon} refuses its configuration (nothing was started):\n{message}")]
    Config { daemon: String, message: String },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl UpError {
    /// The one plain line that says what to change, ending a failed `warden up`.
    pub fn fix(&self) -> Option<String> {
        Some(match self {
            UpError::Dir { .. } | UpError::Token { .. } => {
                "To fix: give warden a state directory it may write (--state-dir DIR).".into()
            }
            UpError::AlreadyRunning(dir) => format!(
                "To fix: stop the running one first (`{} down`, or Ctrl-C where it runs), or pick another --state-dir.",
                Layout::new(dir).command()
            ),
            UpError::MissingBinary(_) => "To fix: build the daemons (`cargo build --release --workspace --bins`) or pass --bin-dir DIR.".into(),
            UpError::Flag { flag, .. } => format!("To fix: change {flag}."),
            UpError::Config { .. } => {
                "To fix: change what the message names; nothing was started.".into()
            }
            UpError::DiedAtStart { daemon, log, .. } | UpError::Died { daemon, log, .. } => {
                format!(
                    "To fix: read warden-{daemon}'s own reason above or in {} (`warden logs {daemon}`).",
                    log.display()
                )
            }
            UpError::NotHealthy { daemon, log, .. } => format!(
                "To fix: give it longer (--start-timeout SECS) or read why in {} (`warden logs {daemon}`).",
                log.display()
            ),
            UpError::DetachedDied { .. } => {
                "To fix: see its output above; it is also in <state>/logs/up.log.".into()
            }
            UpError::DetachedSlow(_) => {
                "To fix: wait and check `warden status`, or give more time (--start-timeout SECS).".into()
            }
            UpError::Lock { .. } => {
                "To fix: give warden a state directory it may write (--state-dir DIR).".into()
            }
            UpError::Spawn { .. } | UpError::Signal(_) => return None,
        })
    }
}

/// For `warden up -v…`: the daemons' own log level (what their log files get) and the least
/// severe line also shown on the terminal (warnings by default).
pub fn log_levels(verbose: u8) -> (&'static str, Severity) {
    match verbose {
        0 => ("info", Severity::Warn),
        1 => ("info", Severity::Info),
        _ => ("debug", Severity::Debug),
    }
}

/// Checks `warden up`'s own flags, then every daemon's whole configuration (its file under
/// `--config`, the keys `warden up` sets) with the daemon's own `--check-config`, before any
/// daemon starts: a mistake is blamed on the flag or the file that holds it, not found by the
/// third daemon after the first two started.
pub async fn preflight(o: &UpOptions) -> Result<(), UpError> {
    let addr = |flag: &'static str, value: &str| -> Result<(), UpError> {
        value
            .parse::<std::net::SocketAddr>()
            .map(|_| ())
            .map_err(|_| UpError::Flag {
                flag,
                value: value.to_string(),
                why: "not an address like 127.0.0.1:7541 (HOST:PORT, the host an IP address)"
                    .into(),
            })
    };
    addr("--http", &o.http)?;
    if o.approver && !o.approver_http.is_empty() {
        addr("--approver-http", &o.approver_http)?;
    }
    for name in o.daemons().iter().copied() {
        let bin = o.bin_dir.join(format!("warden-{name}"));
        if !bin.is_file() {
            return Err(UpError::MissingBinary(bin));
        }
        let out = Command::new(&bin)
            .args(daemon_args(name, o))
            .arg("--check-config")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| UpError::Spawn {
                daemon: name.to_string(),
                source,
            })?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim_end();
            let message = said
                .strip_prefix(&format!("warden-{name}: error: "))
                .unwrap_or(said);
            return Err(UpError::Config {
                daemon: name.to_string(),
                message: message.to_string(),
            });
        }
    }
    Ok(())
}

/// Options of `warden up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub layout: Layout,
    pub bin_dir: PathBuf,
    pub http: String,
    pub log_format: String,
    pub start_timeout: Duration,
    /// Run warden-approver between the supervisor and the policy (`warden up --approver`).
    pub approver: bool,
    /// Where the approver serves its web page (`--approver-http`); empty = no page.
    pub approver_http: String,
    /// `warden up --config DIR`: each daemon reads `DIR/<daemon>.toml` when it exists (the
    /// layout's own keys are still set over it).
    pub config_dir: Option<PathBuf>,
    /// `warden up --metrics IP:PORT`: each daemon serves Prometheus metrics on its own port
    /// from this one on ([`metrics_addr`]); None = none does.
    pub metrics: Option<std::net::SocketAddr>,
    /// `daemon.log_level` set on every daemon ([`log_levels`]); None leaves each daemon's own
    /// setting.
    pub log_level: Option<String>,
    /// The least severe daemon log line `warden up` also shows on its terminal (every line is
    /// in the daemon's log file; a line not in the log format, such as a start-up error, is
    /// always shown).
    pub echo_from: Severity,
}

impl UpOptions {
    /// The daemons this deployment runs, in start order.
    pub fn daemons(&self) -> &'static [&'static str] {
        if self.approver {
            &DAEMONS_WITH_APPROVER
        } else {
            &DAEMONS
        }
    }
}

struct Running {
    name: &'static str,
    child: Child,
}

/// Opens `<state>/logs/<daemon>.log` afresh, the previous run's kept as `.log.1`.
fn open_log(path: &Path) -> Option<std::fs::File> {
    let _ = std::fs::rename(path, path.with_extension("log.1"));
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .ok()
}

fn spawn(name: &'static str, o: &UpOptions) -> Result<Running, UpError> {
    let bin = o.bin_dir.join(format!("warden-{name}"));
    if !bin.is_file() {
        return Err(UpError::MissingBinary(bin));
    }
    let mut cmd = Command::new(&bin);
    cmd.args(daemon_args(name, o))
        // The lock's descriptor number means nothing to a daemon (the descriptor itself is
        // close-on-exec again).
        .env_remove(LOCK_FD_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().map_err(|source| UpError::Spawn {
        daemon: name.to_string(),
        source,
    })?;
    // Both streams into one file, a line at a time (a line is written whole: two streams
    // never mix inside one).
    let log =
        open_log(&o.layout.log_of(name)).map(|f| std::sync::Arc::new(std::sync::Mutex::new(f)));
    for (stream, out) in [
        (
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            false,
        ),
        (
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            true,
        ),
    ] {
        if let Some(s) = stream {
            let log = log.clone();
            let echo_from = o.echo_from;
            tokio::spawn(async move {
                let mut lines = BufReader::new(s).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(f) = &log {
                        use std::io::Write;
                        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = f.write_all(format!("{line}\n").as_bytes());
                    }
                    if warden_daemon::logging::severity_of(&line).is_some_and(|s| s < echo_from) {
                        continue;
                    }
                    if out {
                        eprintln!("[{name:>10}] {line}");
                    } else {
                        println!("[{name:>10}] {line}");
                    }
                }
            });
        }
    }
    Ok(Running { name, child })
}

fn status_text(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}

async fn wait_healthy(r: &mut Running, l: &Layout, timeout: Duration) -> Result<(), UpError> {
    let start = Instant::now();
    let socket = l.socket_of(r.name);
    loop {
        if let Ok(Some(status)) = r.child.try_wait() {
            return Err(UpError::DiedAtStart {
                daemon: r.name.to_string(),
                status: status_text(status),
                log: l.log_of(r.name),
            });
        }
        if warden_daemon::client::healthy(&socket).await {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(UpError::NotHealthy {
                daemon: r.name.to_string(),
                secs: timeout.as_secs(),
                log: l.log_of(r.name),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM to each daemon in reverse start order, waiting for each (SIGKILL after 10 s).
async fn stop_all(running: &mut Vec<Running>) {
    while let Some(mut r) = running.pop() {
        if let Ok(Some(_)) = r.child.try_wait() {
            continue;
        }
        if let Some(pid) = r.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(Duration::from_secs(10), r.child.wait()).await {
            // A daemon stopped by its SIGTERM exits 0: said only when it did not.
            Ok(Ok(s)) if s.success() => {}
            Ok(Ok(s)) => eprintln!("warden: warden-{} stopped with {}", r.name, status_text(s)),
            _ => {
                eprintln!(
                    "warden: warden-{} did not stop within 10 s; killing it",
                    r.name
                );
                let _ = r.child.kill().await;
            }
        }
    }
}

/// Runs the deployment until Ctrl-C (Ok) or until a daemon dies (Err).
pub async fn run(o: UpOptions) -> Result<(), UpError> {
    use tokio::signal::unix::{SignalKind, signal};
    let l = &o.layout;
    // Before anything is touched; held until this function returns.
    let _lock = lock(l)?;
    preflight(&o).await?;
    if nix::unistd::geteuid().is_root() {
        // Agents of a root supervisor run as their own uid and need search (not listing) on the
        // way to their roots; each daemon's directory below stays closed (0700).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&l.root, std::fs::Permissions::from_mode(0o711)).map_err(
            |source| UpError::Dir {
                path: l.root.clone(),
                source,
            },
        )?;
    }
    make_dir(&l.run_dir())?;
    make_dir(&l.logs_dir())?;
    for d in o.daemons() {
        make_dir(&l.state_of(d))?;
        if warden_daemon::client::healthy(&l.socket_of(d)).await {
            return Err(UpError::AlreadyRunning(l.root.clone()));
        }
    }
    let new_token = ensure_token(&l.token_file())?;
    if o.approver && !o.approver_http.is_empty() {
        ensure_operator_token(&l.operator_token_file())?;
    }
    // Written before the daemons start, so that once `warden status` reports all healthy,
    // `warden send` can already find the gateway.
    let _ = std::fs::write(l.url_file(), format!("http://{}\n", o.http));
    let mut int = signal(SignalKind::interrupt()).map_err(UpError::Signal)?;
    let mut term = signal(SignalKind::terminate()).map_err(UpError::Signal)?;

    // A ready file an earlier instance left (killed) names another process; gone before this
    // one starts its daemons.
    let _ = std::fs::remove_file(l.up_ready_file());
    // For `warden down`: this process, named by its pid and its start time.
    let _ = std::fs::write(
        l.up_pid_file(),
        pid_record(std::process::id()).unwrap_or_default(),
    );
    let mut running: Vec<Running> = Vec::new();
    for name in o.daemons().iter().copied() {
        let started = spawn(name, &o).map(|r| running.push(r));
        let health = match started {
            Ok(()) => match running.last_mut() {
                Some(r) => wait_healthy(r, l, o.start_timeout).await,
                None => Ok(()),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = health {
            stop_all(&mut running).await;
            let _ = std::fs::remove_file(l.url_file());
            let _ = std::fs::remove_file(l.up_pid_file());
            return Err(e);
        }
    }
    let names: Vec<&str> = running.iter().map(|r| r.name).collect();
    println!(
        "warden is up: {} healthy (state directory {}; logs: {} logs)",
        names.join(", "),
        l.root.display(),
        l.command()
    );
    println!(
        "  A2A endpoint        http://{}/  (agent card: http://{}/.well-known/agent-card.json)",
        o.http, o.http
    );
    println!(
        "  caller token        {}{}",
        l.token_file().display(),
        if new_token { " (new)" } else { "" }
    );
    if o.approver {
        println!(
            "  approvals           warden approvals watch   (or list / approve ID / deny ID --reason ...)"
        );
        if !o.approver_http.is_empty() {
            println!(
                "  approval page       http://{}/  (operator token: last word of {})",
                o.approver_http,
                l.operator_token_file().display()
            );
        }
    }
    if let Some(base) = o.metrics {
        for r in &running {
            if let Some(addr) = metrics_addr(base, r.name) {
                println!("  metrics {:<11} http://{addr}/metrics", r.name);
            }
        }
    }
    println!(
        "Try: {} send \"write hello.txt\"    Stop: Ctrl-C{}",
        l.command(),
        if std::env::var_os(DETACHED_ENV).is_some() {
            format!(" or {} down", l.command())
        } else {
            String::new()
        }
    );
    // Ready once all of the above is said (a `warden up -d` that started this one reports
    // success only then, and its caller finds this output in up.log).
    {
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    let _ = std::fs::write(
        l.up_ready_file(),
        pid_record(std::process::id()).unwrap_or_default(),
    );
    {
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }

    let died = loop {
        tokio::select! {
            _ = int.recv() => break None,
            _ = term.recv() => break None,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let mut dead = None;
                for r in running.iter_mut() {
                    if let Ok(Some(s)) = r.child.try_wait() {
                        dead = Some((r.name, status_text(s)));
                        break;
                    }
                }
                if let Some(d) = dead {
                    break Some(d);
                }
            }
        }
    };
    if let Some((name, status)) = &died {
        eprintln!("warden: warden-{name} exited unexpectedly ({status}); stopping the others");
    } else {
        eprintln!("warden: stopping");
    }
    let _ = std::fs::remove_file(l.up_ready_file());
    stop_all(&mut running).await;
    let _ = std::fs::remove_file(l.url_file());
    let _ = std::fs::remove_file(l.up_pid_file());
    match died {
        Some((daemon, status)) => Err(UpError::Died {
            daemon: daemon.to_string(),
            status,
            log: l.log_of(daemon),
        }),
        None => {
            eprintln!("warden: stopped");
            Ok(())
        }
    }
}

/// Set on the `warden up` that `warden up -d` starts: it runs in the foreground of its own
/// session (the flag `-d` it was given again is then ignored).
pub const DETACHED_ENV: &str = "WARDEN_UP_DETACHED";

/// `warden up -d`: the same `warden up` in a session of its own (its output to
/// `<state>/logs/up.log`), returning once every daemon answers healthy, or with the background
/// one's own words when it gave up.
pub async fn detach(o: UpOptions) -> Result<(), UpError> {
    if std::env::var_os(DETACHED_ENV).is_some() {
        return run(o).await;
    }
    let l = &o.layout;
    // Taken here, before the log is rotated, and handed to the background `up` (below).
    let held = lock(l)?;
    // Checked here too, so the mistakes are said in this terminal at once.
    preflight(&o).await?;
    make_dir(&l.logs_dir())?;
    let log_path = l.logs_dir().join("up.log");
    let log = open_log(&log_path).ok_or_else(|| UpError::Dir {
        path: log_path.clone(),
        source: std::io::Error::other("cannot open the log"),
    })?;
    let err_log = log.try_clone().map_err(|source| UpError::Dir {
        path: log_path.clone(),
        source,
    })?;
    let exe = std::env::current_exe().map_err(|source| UpError::Spawn {
        daemon: "up".into(),
        source,
    })?;
    let lock_fd = {
        use std::os::fd::AsRawFd;
        held.as_raw_fd()
    };
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(DETACHED_ENV, "1")
        .env(LOCK_FD_ENV, lock_fd.to_string())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    // SAFETY: setsid and fcntl are async-signal-safe; nothing else runs between fork and exec
    // here. A session of its own: the terminal closing sends it no SIGHUP, and Ctrl-C here
    // none either. The lock's descriptor stays open across the exec: the child holds the same
    // lock (`lock` adopts it).
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            nix::fcntl::fcntl(
                std::os::fd::BorrowedFd::borrow_raw(lock_fd),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .map(|_| ())
            .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().map_err(|source| UpError::Spawn {
        daemon: "up".into(),
        source,
    })?;
    // The background `up` shares this open file and so the lock: dropping it here would
    // unlock it (LOCK_UN applies to the open file, not to this descriptor), so it is kept,
    // unlocked by nobody, until this process exits; the child's copy holds the lock on.
    std::mem::forget(held);
    let child_pid = child.id();
    let wait = o.start_timeout * o.daemons().len() as u32 + Duration::from_secs(10);
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(UpError::DetachedDied {
                status: status_text(status),
                tail: tail.join("\n"),
            });
        }
        let mut all = true;
        for d in o.daemons() {
            all &= warden_daemon::client::healthy(&l.socket_of(d)).await;
        }
        // Ready means the `up` started here said so (its ready file, written once it has
        // printed its status): healthy sockets alone could be another instance's, and its pid
        // file is written before its daemons start.
        let ours = std::fs::read_to_string(l.up_ready_file())
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok());
        if all && ours.is_some() && ours == child_pid {
            break;
        }
        if start.elapsed() > wait {
            return Err(UpError::DetachedSlow(wait.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "warden is up in the background (pid {}): {} healthy",
        child_pid.unwrap_or(0),
        o.daemons().join(", ")
    );
    println!(
        "  A2A endpoint        http://{}/   caller token {}",
        o.http,
        l.token_file().display()
    );
    println!(
        "Try: {c} send \"write hello.txt\"    Logs: {c} logs -f    Stop: {c} down",
        c = l.command()
    );
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum DownError {
    #[error("no warden up is running on {0} (no {1})")]
    NotRunning(PathBuf, PathBuf),
    #[error("cannot signal pid {pid}: {source}")]
    Signal {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error(
        "pid {0} did not stop within {1} s (its daemons may still be stopping; `warden status`)"
    )]
    Slow(i32, u64),
}

/// `warden down`: SIGTERM to the `warden up` named in `<state>/run/up.pid` (when that pid is
/// still the process that wrote it), then waits until it is gone.
pub async fn down(l: &Layout, timeout: Duration) -> Result<String, DownError> {
    let file = l.up_pid_file();
    let not_running = || DownError::NotRunning(l.root.clone(), file.clone());
    let record = std::fs::read_to_string(&file).map_err(|_| not_running())?;
    let mut words = record.split_whitespace();
    let pid: u32 = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(not_running)?;
    let started: u64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(not_running)?;
    if start_time(pid) != Some(started) {
        // The process that wrote it is gone (killed without cleaning up): a stale file.
        let _ = std::fs::remove_file(&file);
        return Err(not_running());
    }
    let target = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM).map_err(|source| {
        DownError::Signal {
            pid: pid as i32,
            source,
        }
    })?;
    let begin = Instant::now();
    while start_time(pid) == Some(started) {
        if begin.elapsed() > timeout {
            return Err(DownError::Slow(pid as i32, timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(format!(
        "warden stopped (pid {pid}, state directory {})",
        l.root.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(approver: bool) -> UpOptions {
        UpOptions {
            layout: Layout::new("/tmp/warden-up-test"),
            bin_dir: PathBuf::from("/nonexistent"),
            http: "127.0.0.1:7420".into(),
            log_format: "human".into(),
            start_timeout: Duration::from_secs(10),
            approver,
            approver_http: String::new(),
            config_dir: None,
            metrics: None,
            log_level: None,
            echo_from: Severity::Warn,
        }
    }

    /// `warden up --metrics BASE`: each daemon its own port, each listed among warden's own doors
    /// that no agent's egress proxy may connect to.
    #[test]
    fn metrics_ports_follow_the_base_and_are_warden_listeners() {
        let mut o = options(true);
        o.metrics = Some("127.0.0.1:9464".parse().unwrap());
        for (name, port) in [
            ("gateway", 9464),
            ("supervisor", 9465),
            ("policy", 9466),
            ("approver", 9467),
        ] {
            let args = daemon_args(name, &o);
            let want = format!("daemon.metrics_listen=\"127.0.0.1:{port}\"");
            assert!(args.contains(&want), "{name}: {args:?}");
        }
        let doors = warden_listeners(&o);
        for port in 9464..=9467 {
            assert!(doors.contains(&format!("127.0.0.1:{port}")), "{doors:?}");
        }
        assert!(metrics_addr("127.0.0.1:65535".parse().unwrap(), "policy").is_none());
        o.metrics = None;
        assert!(
            !daemon_args("policy", &o)
                .iter()
                .any(|a| a.contains("metrics_listen"))
        );
    }

    /// `warden up --approver` swaps the approver in the way an operator does: the supervisor's
    /// flags differ by the policy socket alone, and nothing of the policy's is about the swap.
    #[test]
    fn the_swap_is_the_supervisors_socket_alone() {
        let with = daemon_args("supervisor", &options(true));
        let without = daemon_args("supervisor", &options(false));
        let differ: Vec<(&String, &String)> = with
            .iter()
            .zip(without.iter())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(with.len(), without.len(), "{with:?} / {without:?}");
        assert_eq!(differ.len(), 1, "{differ:?}");
        assert!(
            differ[0].0.starts_with("policy.socket=") && differ[0].0.contains("approver.sock"),
            "{differ:?}"
        );
        let policy = daemon_args("policy", &options(true)).join(" ");
        assert!(!policy.contains("return_escalations"), "{policy}");
        assert!(!with.join(" ").contains("decide_deadline_ms"), "{with:?}");
    }

    /// The supervisor learns every TCP listener of the deployment it is part of, so its egress
    /// proxies refuse them: the gateway's, the approver's page, a gRPC listener and the
    /// listeners the operator's supervisor.toml names.
    #[test]
    fn the_supervisor_is_told_every_listener_of_its_warden() {
        let dir = std::env::temp_dir().join(format!("warden-up-listeners-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            crate::layout::file_of(&dir, "gateway"),
            "[grpc]\ntcp = \"127.0.0.1:50051\"\nallow_any_peer = true\n",
        )
        .unwrap();
        std::fs::write(
            crate::layout::file_of(&dir, "supervisor"),
            "[egress]\nwarden_listeners = [\"10.0.0.5:443\"]\n",
        )
        .unwrap();
        let mut o = options(true);
        o.approver_http = "127.0.0.1:7421".into();
        o.config_dir = Some(dir.clone());
        assert_eq!(
            warden_listeners(&o),
            [
                "10.0.0.5:443",
                "127.0.0.1:50051",
                "127.0.0.1:7420",
                "127.0.0.1:7421"
            ]
        );
        let args = daemon_args("supervisor", &o).join(" ");
        assert!(
            args.contains(r#"egress.warden_listeners=["10.0.0.5:443","127.0.0.1:50051","127.0.0.1:7420","127.0.0.1:7421"]"#),
            "{args}"
        );
        assert_eq!(warden_listeners(&options(false)), ["127.0.0.1:7420"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
