//! A daemon's start-up sequence, written once: load and validate the configuration from the
//! shared flags, answer `--check-config`, set up logging, build the runtime, run the service,
//! and report a fatal error as one clear line (exit status 2). Listeners, health, readiness and
//! the bounded shutdown are [`crate::Server`]'s; a service supplies only what differs.

use std::future::Future;

use crate::args::{DaemonArgs, fail};
use crate::config::DaemonSection;

/// What differs between the daemons' start-ups.
pub trait Daemon: Sized {
    /// The binary's name, for messages.
    const NAME: &'static str;
    /// Why the service stopped with an error.
    type Error: std::error::Error;

    /// Loads and validates the configuration the shared flags name (file, environment,
    /// `--set`), before logging exists: errors are printed by [`start`].
    fn load(args: &DaemonArgs) -> Result<Self, Box<dyn std::error::Error>>;

    /// The `[daemon]` section: log format and level (a `--log-format` flag wins).
    fn daemon_section(&self) -> &DaemonSection;

    /// What `--check-config` reports after "NAME: configuration OK" (where the configuration
    /// came from, and anything worth confirming).
    fn summary(&self) -> String;

    /// What `--check-config` checks beyond the file itself, on this host (a program an agent
    /// entry names exists, say). Not run at start: a daemon starts on a valid file and reports
    /// such a fault where it is met.
    fn check_host(&self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(())
    }

    /// The per-principal shares this configuration gives (and the limits they are taken
    /// from), listed by `--check-config` after its summary. `docs/shares.md` tabulates the
    /// same keys; `tests/tests/shares_table.rs` keeps the two equal.
    fn shares(&self) -> Vec<Share> {
        Vec::new()
    }

    /// The gRPC Unix socket `--health` asks (the one this process's own uid is admitted on).
    fn health_socket(&self) -> Option<std::path::PathBuf>;

    /// Runtime worker threads: 0 = one per core, 1 = a single thread, n = n threads.
    fn worker_threads(&self) -> usize {
        0
    }

    /// Serves until SIGTERM/SIGINT (via [`crate::Server::run`]) or a fatal error.
    fn run(self) -> impl Future<Output = Result<(), Self::Error>>;
}

/// One resource's share per principal (or per conversation, or for the unauthenticated), as
/// the loaded configuration gives it: the key an operator sets, the value in force (computed
/// defaults resolved), and the limit of the whole daemon it is carved from, when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub key: &'static str,
    pub value: u64,
    pub whole: Option<(&'static str, u64)>,
}

impl Share {
    pub fn new(key: &'static str, value: impl TryInto<u64>) -> Share {
        Share {
            key,
            value: value.try_into().unwrap_or(u64::MAX),
            whole: None,
        }
    }

    /// The limit this share is carved from.
    pub fn of(mut self, key: &'static str, value: impl TryInto<u64>) -> Share {
        self.whole = Some((key, value.try_into().unwrap_or(u64::MAX)));
        self
    }
}

/// What `--check-config` prints after its summary: one line per share, `key = value`, and the
/// whole it is taken from in parentheses. Nothing when the daemon has none.
pub fn print_shares(shares: &[Share]) {
    if shares.is_empty() {
        return;
    }
    println!("shares (each principal's unless the key says otherwise):");
    for s in shares {
        match s.whole {
            Some((k, v)) => println!("  {} = {} (of {k} = {v})", s.key, s.value),
            None => println!("  {} = {}", s.key, s.value),
        }
    }
}

/// Runs daemon `D` with the parsed shared flags; returns only after a clean shutdown or a
/// successful `--check-config`, and exits with status 2 on any fatal error.
pub fn start<D: Daemon>(args: DaemonArgs) {
    let daemon = match D::load(&args) {
        Ok(d) => d,
        Err(e) => fail(D::NAME, &*e),
    };
    if args.check_config {
        if let Err(e) = daemon.check_host() {
            fail(D::NAME, &*e);
        }
        println!("{}: configuration OK ({})", D::NAME, daemon.summary());
        print_shares(&daemon.shares());
        return;
    }
    if args.health {
        crate::args::health(D::NAME, daemon.health_socket().as_deref());
        return;
    }
    let section = daemon.daemon_section();
    let format = args
        .log_format
        .clone()
        .unwrap_or_else(|| section.log_format.clone());
    crate::logging::init(
        D::NAME,
        &format,
        &section.log_level,
        section.otlp_endpoint.as_deref(),
    );
    let workers = daemon.worker_threads();
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if workers > 1 {
            b.worker_threads(workers);
        }
        b
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => fail(D::NAME, &e),
    };
    let ran = rt.block_on(async {
        // SIGHUP's default action ends the process: it is caught from here on (tokio keeps a
        // handler installed for the process's life), before the daemon opens its store or binds
        // a listener; from `Server::new` on, each SIGHUP is a reload (`crate::reload`).
        if let Err(e) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            tracing::error!(error = %e, "cannot catch SIGHUP: a reload signal would end the daemon");
        }
        daemon.run().await
    });
    // The spans of the last requests are exported before the process ends.
    crate::otel::shutdown();
    if let Err(e) = ran {
        fail(D::NAME, &e);
    }
}
