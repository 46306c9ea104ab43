//! The request head a client sends to an HTTP proxy: `CONNECT host:port HTTP/1.1` (a tunnel,
//! for TLS) or an absolute-form request `GET http://host:port/path HTTP/1.1` (plain HTTP,
//! forwarded with its head rewritten to origin form).

use crate::allow::{Destination, EntryError};
use crate::url::HttpUrl;

/// The longest request head accepted; a longer one is answered 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The header with which warden-egress-relay marks the CONNECT it makes for a connection to a
/// mirrored loopback address.
pub const MIRROR_HEADER: &str = "X-Warden-Egress-Mirror";

/// Header lines at most.
const MAX_HEADERS: usize = 100;

/// Where the head ends (the index after its blank line), when `buf` holds all of it.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// A parsed proxy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// A tunnel to `dest`: answer `200` and relay bytes. `mirrored`: the request carries
    /// [`MIRROR_HEADER`], the relay's mark for a connection the client made to a mirrored
    /// loopback address instead of the proxy (informational: anything in the sandbox can send it).
    Connect { dest: Destination, mirrored: bool },
    /// A plain-HTTP request for `dest`: send `head` (origin form, `Host` set from the URL,
    /// hop-by-hop and `Proxy-*` headers removed, `Connection: close`) and relay the rest.
    Forward {
        dest: Destination,
        method: String,
        head: Vec<u8>,
    },
}

impl ProxyRequest {
    pub fn dest(&self) -> &Destination {
        match self {
            ProxyRequest::Connect { dest, .. } | ProxyRequest::Forward { dest, .. } => dest,
        }
    }
}

/// Why a request head is refused; each maps to the status answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request head is longer than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed proxy request: {0}")]
    Malformed(String),
    #[error("{0}")]
    Target(String),
}

impl RequestError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::TooLarge => 431,
            RequestError::Malformed(_) | RequestError::Target(_) => 400,
        }
    }
}

fn bad(s: impl Into<String>) -> RequestError {
    RequestError::Malformed(s.into())
}

/// Headers never forwarded: hop-by-hop ones, the proxy's own, and `Host` (set from the URL).
const DROPPED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Parses a complete head (up to and including its blank line).
pub fn parse(head: &[u8]) -> Result<ProxyRequest, RequestError> {
    if head.len() > MAX_HEAD_BYTES {
        return Err(RequestError::TooLarge);
    }
    let text = std::str::from_utf8(head).map_err(|_| bad("the head is not UTF-8"))?;
    let text = text
        .strip_suffix("\r\n\r\n")
        .ok_or_else(|| bad("the head does not end with a blank line"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("the request line is not METHOD TARGET VERSION"));
    };
    if method.is_empty()
        || !method
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
    {
        return Err(bad("the method is not a token"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad("the version is not HTTP/1.0 or HTTP/1.1"));
    }
    let mut headers: Vec<(&str, &str)> = Vec::new();
    for l in lines {
        if headers.len() == MAX_HEADERS {
            return Err(bad(format!("more than {MAX_HEADERS} header lines")));
        }
        if l.starts_with([' ', '\t']) {
            return Err(bad("folded header lines are not accepted"));
        }
        let (name, value) = l
            .split_once(':')
            .ok_or_else(|| bad("a header line without ':'"))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
        {
            return Err(bad("a header name is not a token"));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return Err(bad("a header value holds control characters"));
        }
        headers.push((name, value.trim()));
    }
    let target_err = |e: EntryError| RequestError::Target(e.to_string());
    if method.eq_ignore_ascii_case("CONNECT") {
        let dest = Destination::parse_authority(target).map_err(target_err)?;
        let mirrored = headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(MIRROR_HEADER));
        return Ok(ProxyRequest::Connect { dest, mirrored });
    }
    if !target
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    {
        return Err(RequestError::Target(format!(
            "{method} needs an absolute http:// URL through a proxy (use CONNECT for https)"
        )));
    }
    let url = HttpUrl::parse(target).map_err(RequestError::Target)?;
    let dest = Destination {
        host: url.host.clone(),
        port: url.port,
    };
    let mut out = format!(
        "{method} {} {version}\r\nHost: {}\r\n",
        url.target, url.authority
    );
    // Headers the client names in Connection are hop-by-hop too.
    let named: Vec<String> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    for (n, v) in &headers {
        let lower = n.to_ascii_lowercase();
        if DROPPED.contains(&lower.as_str()) || named.contains(&lower) {
            continue;
        }
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    // One request per connection: a second request on it could name another host.
    out.push_str("Connection: close\r\n\r\n");
    Ok(ProxyRequest::Forward {
        dest,
        method: method.to_string(),
        head: out.into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_names_a_host_and_port() {
        let r =
            parse(b"CONNECT API.Anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
                .unwrap();
        assert_eq!(r.dest().to_string(), "api.anthropic.com:443");
        assert!(matches!(
            r,
            ProxyRequest::Connect {
                mirrored: false,
                ..
            }
        ));
        let r =
            parse(b"CONNECT [::ffff:127.0.0.1]:80 HTTP/1.1\r\nx-warden-egress-mirror: 1\r\n\r\n")
                .unwrap();
        assert_eq!(r.dest().host, "::ffff:127.0.0.1");
        assert!(matches!(r, ProxyRequest::Connect { mirrored: true, .. }));
        for bad in [
            &b"CONNECT api.anthropic.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT 127.1:80 HTTP/1.1\r\n\r\n",
            b"CONNECT 2130706433:80 HTTP/1.1\r\n\r\n",
            b"CONNECT 0x7f000001:80 HTTP/1.1\r\n\r\n",
            b"CONNECT h:0 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(RequestError::Target(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn an_absolute_request_is_rewritten_to_origin_form_for_one_request() {
        let r = parse(
            b"GET http://127.0.0.1:9/v1/x?y=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: x\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        let ProxyRequest::Forward { dest, head, .. } = r else {
            panic!("not a forward");
        };
        assert_eq!(dest.to_string(), "127.0.0.1:9");
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /v1/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(
            parse(b"GET http://h/ HTTP/1.1\r\n\r\n")
                .unwrap()
                .dest()
                .port,
            80
        );
    }

    #[test]
    fn garbage_is_refused_with_a_status() {
        for (bad, status) in [
            (&b"\x00\x01\x02\r\n\r\n"[..], 400),
            (b"GET / HTTP/1.1\r\n\r\n", 400),
            (b"GET https://h/ HTTP/1.1\r\n\r\n", 400),
            (b"GET http://h/ HTTP/2\r\n\r\n", 400),
            (b"GET  http://h/ HTTP/1.1\r\n\r\n", 400),
            (b"GET http://h/ HTTP/1.1\r\nX\r\n\r\n", 400),
            (b"GET http://h/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
            (b"GET http://h/ HTTP/1.1\r\nX: a\x01\r\n\r\n", 400),
            (b"\xff\xfe\r\n\r\n", 400),
            (b"CONNECT h:1 HTTP/1.1\r\n", 400),
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(
                e.status(),
                status,
                "{:?}: {e}",
                String::from_utf8_lossy(bad)
            );
        }
        let big = format!(
            "GET http://h/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(parse(big.as_bytes()).unwrap_err().status(), 431);
        let many = format!("GET http://h/ HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(101));
        assert!(parse(many.as_bytes()).is_err());
    }

    #[test]
    fn the_end_of_a_head_is_found() {
        assert_eq!(head_end(b"A\r\n\r\nbody"), Some(5));
        assert_eq!(head_end(b"A\r\n"), None);
    }
}
