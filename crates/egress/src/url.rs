//! `http://` and `https://` URLs taken apart strictly (push webhooks, the agents' model base
//! URLs, absolute-form proxy requests).

use crate::allow::{canonical_host, split_authority};

/// Longest accepted URL.
pub const MAX_URL: usize = 2048;

/// A URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// Canonical host (brackets removed from an IPv6 literal, lower case).
    pub host: String,
    pub port: u16,
    /// The request target: path and query (`/` when empty), fragment dropped.
    pub target: String,
    /// The authority as written (the `Host` header value).
    pub authority: String,
    /// `https`.
    pub tls: bool,
}

impl HttpUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        if url.len() > MAX_URL {
            return Err(format!("the URL is longer than {MAX_URL} characters"));
        }
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err("the URL contains spaces or control characters".into());
        }
        let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
        let (rest, tls) = if lower.starts_with("https://") {
            (&url[8..], true)
        } else if lower.starts_with("http://") {
            (&url[7..], false)
        } else {
            return Err("the URL must start with https:// or http://".into());
        };
        let (authority, target) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let target = target.split('#').next().unwrap_or("/");
        let target = if target.starts_with('?') {
            format!("/{target}")
        } else if target.is_empty() {
            "/".to_string()
        } else {
            target.to_string()
        };
        if authority.contains('@') {
            return Err("the URL must not carry user information".into());
        }
        let (host, port) = split_authority(authority)
            .ok_or_else(|| format!("{authority:?} is not host[:port]"))?;
        let port = port.unwrap_or(if tls { 443 } else { 80 });
        let host = canonical_host(host).map_err(|e| e.to_string())?;
        Ok(Self {
            host,
            port,
            target,
            authority: authority.to_string(),
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_taken_apart_strictly() {
        let u = HttpUrl::parse("http://Hooks.Example.com:8080/a/b?x=1#frag").unwrap();
        assert_eq!(u.host, "hooks.example.com");
        assert_eq!(u.port, 8080);
        assert_eq!(u.target, "/a/b?x=1");
        let u = HttpUrl::parse("http://[::1]:9/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9));
        let u = HttpUrl::parse("http://h?q").unwrap();
        assert_eq!((u.port, u.target.as_str(), u.tls), (80, "/?q", false));
        let u = HttpUrl::parse("https://hooks.example.com/x").unwrap();
        assert_eq!((u.port, u.tls), (443, true));
        let u = HttpUrl::parse("HTTP://127.0.0.1:5/v1").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.tls), ("127.0.0.1", 5, false));
        for bad in [
            "ftp://h/",
            "http://user:pw@h/",
            "http://h:0/",
            "http://h:99999/",
            "http://h /",
            "http://[::1/",
            "http:///x",
            "http://h\n/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
