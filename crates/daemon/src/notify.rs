//! systemd readiness notification (`sd_notify`), harmless without systemd.
//!
//! Written by hand rather than with a crate: it is one datagram to `$NOTIFY_SOCKET`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = if let Some(name) = path.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else {
        SocketAddr::from_pathname(&path)
    };
    let result = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, notify_socket = %path, "sd_notify failed");
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
