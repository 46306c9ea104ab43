//! Where warden lets a connection go, as pure functions: the classification of IP addresses
//! (`address`: loopback, private, link-local, metadata, CGNAT, unspecified, multicast, and the
//! IPv4-mapped, -compatible and NAT64 forms of them), `http://`/`https://` URLs taken apart
//! (`url`), the `host:port` entries of an egress allowlist and the check of every address a
//! name resolved to (`allow`), and the request head a client sends to an HTTP proxy
//! (`request`: `CONNECT host:port` and absolute-form `GET http://host/...`).
//!
//! Used by the gateway (push webhooks) and the supervisor (the agents' egress proxy): there is
//! one classification, here.
//!
//! Must never: do I/O (resolve a name, open a socket, read a clock); accept a host spelled in a
//! non-canonical numeric form (`127.1`, `2130706433`, `0x7f.0.0.1`), which resolvers would
//! turn into an address the allowlist never named.
#![forbid(unsafe_code)]

pub mod address;
pub mod allow;
pub mod request;
pub mod url;

pub use address::{Cidr, never_connectable, non_public};
pub use allow::{
    AllowEntry, Allowlist, Destination, EntryError, HostError, Matched, check_addresses,
};
pub use request::{
    MAX_HEAD_BYTES, MIRROR_HEADER, ProxyRequest, RequestError, head_end, parse as parse_request,
};
pub use url::HttpUrl;
