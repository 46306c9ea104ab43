//! The `AdminService.Status` answer every daemon gives: its name, version, pid, uptime and
//! listeners, plus the figures only it knows.

use std::collections::HashMap;
use std::time::Instant;

/// A daemon's status, `details` being its own figures.
pub fn response(
    daemon: &str,
    started: Instant,
    listeners: Vec<String>,
    details: HashMap<String, String>,
) -> warden_proto::v1::StatusResponse {
    warden_proto::v1::StatusResponse {
        daemon: daemon.to_string(),
        // One workspace version for every daemon.
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        uptime_seconds: started.elapsed().as_secs(),
        listeners,
        details,
    }
}
