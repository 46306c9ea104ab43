//! systemd readiness and watchdog notification (`sd_notify`), harmless without systemd.
//!
//! Written by hand rather than with a crate: it is one datagram to `$NOTIFY_SOCKET`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

fn notify_socket() -> Option<String> {
    std::env::var_os("NOTIFY_SOCKET").map(|p| p.to_string_lossy().into_owned())
}

fn send(state: &str) {
    if let Some(path) = notify_socket() {
        send_to(&path, state);
    }
}

fn send_to(path: &str, state: &str) {
    let addr = if let Some(name) = path.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else {
        SocketAddr::from_pathname(path)
    };
    let result = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, notify_socket = %path, "sd_notify failed");
    }
}

/// How often to send `WATCHDOG=1`, from systemd's `WATCHDOG_USEC` (and `WATCHDOG_PID`, which
/// names the process the watchdog is for): half the period, as `sd_watchdog_enabled(3)`
/// recommends, so one late tick does not get the daemon killed. `None` when the unit has no
/// `WatchdogSec=`, the value is not a positive number, or it is meant for another process.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok()? != own_pid
    {
        return None;
    }
    let usec = usec?.trim().parse::<u64>().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Pings systemd's watchdog from the async runtime until the returned guard is dropped: if the
/// runtime stops making progress (a blocked worker, a deadlock), the pings stop and systemd
/// restarts the daemon after `WatchdogSec=`. `None` (nothing started) without a watchdog.
/// Must be called inside a tokio runtime.
pub fn start_watchdog() -> Option<WatchdogGuard> {
    let interval = watchdog_interval(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )?;
    let path = notify_socket()?;
    tracing::info!(
        interval_ms = interval.as_millis() as u64,
        "systemd watchdog enabled"
    );
    Some(watchdog_to(path, interval))
}

fn watchdog_to(path: String, interval: Duration) -> WatchdogGuard {
    WatchdogGuard(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        // A late tick is sent once, not in a burst: the watchdog wants liveness, not a count.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            send_to(&path, "WATCHDOG=1");
        }
    }))
}

/// Stops the watchdog pings when dropped.
#[derive(Debug)]
pub struct WatchdogGuard(tokio::task::JoinHandle<()>);

impl Drop for WatchdogGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `READY=1`: the daemon accepts calls.
pub fn ready() {
    send("READY=1");
}

/// `STOPPING=1`: the daemon is shutting down.
pub fn stopping() {
    send("STOPPING=1");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::watchdog_interval;

    #[test]
    fn the_watchdog_pings_at_half_the_period_systemd_sets() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
    }

    #[test]
    fn no_watchdog_without_a_period_or_for_another_process() {
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        // WATCHDOG_PID names the main process; a child that inherited the variables must not ping.
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("30000000"), Some("x"), 7), None);
    }

    #[tokio::test]
    async fn the_watchdog_task_keeps_pinging_until_its_guard_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = tokio::net::UnixDatagram::bind(&path).unwrap();
        let guard = super::watchdog_to(
            path.to_string_lossy().into_owned(),
            Duration::from_millis(5),
        );
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            let n = tokio::time::timeout(Duration::from_secs(10), sock.recv(&mut buf))
                .await
                .expect("a ping within 10 s")
                .unwrap();
            assert_eq!(&buf[..n], b"WATCHDOG=1");
        }
        drop(guard);
        // Pings already queued in the socket are drained (at most one per period may have been
        // sent since the last recv); then a still-running task would send one every 5 ms.
        for _ in 0..2 {
            let _ = tokio::time::timeout(Duration::from_millis(20), sock.recv(&mut buf)).await;
        }
        let late = tokio::time::timeout(Duration::from_millis(100), sock.recv(&mut buf)).await;
        assert!(late.is_err(), "a ping after the guard was dropped");
    }
    #[test]
    fn ready_reaches_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // SAFETY: the only test in this crate touching NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        super::ready();
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
