//! Reloading, written once for every daemon: SIGHUP (`systemctl reload`, `kill -HUP`) and the
//! admin `Reload` (`warden reload`) run the same function, one at a time.
//!
//! SIGHUP is caught from the moment the [`crate::Server`] exists (as SIGTERM is), so it never
//! has its default action — ending the daemon — whatever the daemon is doing. A daemon gives
//! [`Reloads::set`] the function that re-reads its configuration and swaps in what can change
//! while it runs; that function changes nothing unless the whole new configuration loads
//! (atomic: a bad file leaves everything as it was, and the log says why). A daemon that sets
//! none answers that it has nothing to reload.
//!
//! Must never: end or restart the daemon, or run two reloads at once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a reload function returns: what it changed (for the log), or why nothing changed.
pub type Outcome = Result<String, String>;

type Reloader = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Outcome> + Send>> + Send + Sync>;

/// One daemon's reloads: its reload function and the figures `Status` shows.
#[derive(Clone)]
pub struct Reloads {
    inner: Arc<Inner>,
}

struct Inner {
    daemon: &'static str,
    reloader: OnceLock<Reloader>,
    /// One reload at a time: a second SIGHUP waits for the first.
    serial: tokio::sync::Mutex<()>,
    attempts: AtomicU64,
    applied: AtomicU64,
    last_error: Mutex<String>,
}

impl Reloads {
    pub fn new(daemon: &'static str) -> Self {
        Reloads {
            inner: Arc::new(Inner {
                daemon,
                reloader: OnceLock::new(),
                serial: tokio::sync::Mutex::new(()),
                attempts: AtomicU64::new(0),
                applied: AtomicU64::new(0),
                last_error: Mutex::new(String::new()),
            }),
        }
    }

    /// Sets the daemon's reload function (once; a second call is ignored).
    pub fn set<F, Fut>(&self, f: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let f: Reloader = Arc::new(move || Box::pin(f()));
        if self.inner.reloader.set(f).is_err() {
            tracing::error!(
                daemon = self.inner.daemon,
                "a second reload function was ignored"
            );
        }
    }

    /// Runs one reload (`via`: "SIGHUP" or "admin Reload", for the log), after any running
    /// one; logs and counts its outcome.
    pub async fn reload(&self, via: &str) -> warden_proto::v1::ReloadResponse {
        let i = &self.inner;
        let _serial = i.serial.lock().await;
        tracing::info!(daemon = i.daemon, via, "reloading the configuration");
        let outcome = match i.reloader.get() {
            Some(f) => f().await,
            None => Err(format!(
                "{} has nothing it can change while it runs; restart it to apply a new configuration",
                i.daemon
            )),
        };
        {
            let mut last = i.last_error.lock().unwrap_or_else(|p| p.into_inner());
            match &outcome {
                Ok(_) => last.clear(),
                Err(e) => *last = e.clone(),
            }
        }
        let applied = match &outcome {
            Ok(what) => {
                let n = i.applied.fetch_add(1, Ordering::AcqRel) + 1;
                tracing::info!(daemon = i.daemon, via, reloads = n, changed = %what, "configuration reloaded");
                n
            }
            Err(e) => {
                let n = i.applied.load(Ordering::Acquire);
                tracing::warn!(daemon = i.daemon, via, error = %e, "reload refused; nothing changed");
                n
            }
        };
        // Counted after the outcome is in place: a reader that sees the count sees its result.
        i.attempts.fetch_add(1, Ordering::Release);
        warden_proto::v1::ReloadResponse {
            reloaded: outcome.is_ok(),
            policy_version: applied,
            error: outcome.err().unwrap_or_default(),
        }
    }

    /// `reload_attempts` (every reload tried, refused ones included), `reloads_applied` and
    /// `last_reload_error` (empty after a successful one), for `Status`.
    pub fn details(&self, into: &mut HashMap<String, String>) {
        let i = &self.inner;
        into.insert(
            "reload_attempts".into(),
            i.attempts.load(Ordering::Acquire).to_string(),
        );
        into.insert(
            "reloads_applied".into(),
            i.applied.load(Ordering::Acquire).to_string(),
        );
        into.insert(
            "last_reload_error".into(),
            i.last_error.lock().map(|e| e.clone()).unwrap_or_default(),
        );
    }
}

/// Listens for SIGHUP until `stop` is cancelled, running a reload for each (the signal's
/// stream was registered by the caller, before the daemon served anything).
pub(crate) async fn on_hangup(
    mut hup: tokio::signal::unix::Signal,
    reloads: Reloads,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hup.recv() => {
                if got.is_none() {
                    return;
                }
                reloads.reload("SIGHUP").await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_reload_is_counted_and_said_and_a_good_one_clears_it() {
        let r = Reloads::new("warden-test");
        let none = r.reload("test").await;
        assert!(!none.reloaded);
        assert!(
            none.error.contains("nothing it can change"),
            "{}",
            none.error
        );
        let good = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let g = good.clone();
        r.set(move || {
            let ok = g.load(Ordering::Acquire);
            async move {
                if ok {
                    Ok("tokens".to_string())
                } else {
                    Err("bad file".to_string())
                }
            }
        });
        let refused = r.reload("test").await;
        assert_eq!(
            (refused.reloaded, refused.error.as_str()),
            (false, "bad file")
        );
        good.store(true, Ordering::Release);
        let done = r.reload("test").await;
        assert!(done.reloaded && done.error.is_empty() && done.policy_version == 1);
        let mut d = HashMap::new();
        r.details(&mut d);
        assert_eq!(d["reload_attempts"], "3");
        assert_eq!(d["reloads_applied"], "1");
        assert_eq!(d["last_reload_error"], "");
    }
}
