//! The nesting marker every warden front reads the same way: how many warden supervisors are
//! above a process (`WARDEN_DEPTH` in an agent's environment, forwarded by `warden mcp` as the
//! `Warden-Depth` header). The supervisor refuses to run under too deep a marker (the sandbox's
//! `DepthGuard`) and the gateway's MCP front treats a deep caller as an agent.
//!
//! Must never: read a marker that is not a plain decimal number as shallow — a mangled value can
//! only refuse, never permit.

use std::ffi::OsStr;

/// Depth marker: how many warden supervisors are above this process.
pub const DEPTH_ENV: &str = "WARDEN_DEPTH";
/// The same marker on an HTTP request (`warden mcp` forwards its environment's value).
pub const DEPTH_HEADER: &str = "warden-depth";

/// The depth a marker says: absent = 0; anything but a plain decimal `u32` counts as infinitely
/// deep (`u32::MAX`).
pub fn inherited(marker: Option<&OsStr>) -> u32 {
    match marker {
        None => 0,
        Some(v) => v
            .to_str()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_number_is_read_as_a_depth() {
        let d = |s: &str| inherited(Some(OsStr::new(s)));
        assert_eq!(inherited(None), 0);
        assert_eq!(d("0"), 0);
        assert_eq!(d("2"), 2);
        for mangled in ["", "-1", "+1", " 1", "1 ", "0x1", "1e3", "99999999999", "١"] {
            assert_eq!(d(mangled), u32::MAX, "{mangled:?}");
        }
    }
}
