//! IP address classification: which addresses are global unicast, and why the others are not.

use std::net::{IpAddr, Ipv4Addr};

/// An IP network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `127.0.0.1/32`, `fd00::/8`; None when it is not a network.
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        fn masked(bits: u128, prefix: u8, width: u8) -> u128 {
            if prefix == 0 {
                0
            } else {
                bits >> (width - prefix)
            }
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                masked(u32::from(n).into(), self.prefix, 32)
                    == masked(u32::from(a).into(), self.prefix, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                masked(u128::from(n), self.prefix, 128) == masked(u128::from(a), self.prefix, 128)
            }
            _ => false,
        }
    }
}

/// The IPv4 address an IPv6 address reaches when it is one in IPv6 clothing: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated) or NAT64 (`64:ff9b::/96`).
pub fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else {
        return None;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let seg = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    // `::` and `::1` are IPv6's own unspecified and loopback addresses, not compatible forms.
    if seg[..6] == [0, 0, 0, 0, 0, 0] && u32::from(tail) > 1 {
        return Some(tail);
    }
    None
}

/// Why an address is not public, or None when it is a global unicast address.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    if let Some(v4) = embedded_v4(ip) {
        // Judged as the IPv4 address it reaches; a public one through the deprecated
        // compatible form is still refused (nothing legitimate uses it).
        return non_public_v4(v4).or_else(|| {
            matches!(ip, IpAddr::V6(v6) if v6.segments()[..6] == [0, 0, 0, 0, 0, 0])
                .then_some("IPv4-compatible (deprecated)")
        });
    }
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => {
            let seg = v6.segments();
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if seg[0] & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else if seg[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if seg[0] & 0xffc0 == 0xfec0 {
                Some("site-local")
            } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
                Some("documentation")
            } else {
                None
            }
        }
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if o == [169, 254, 169, 254] {
        Some("cloud metadata (link-local)")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified (0.0.0.0/8)")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("shared address space (100.64.0.0/10)")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if ip.is_broadcast() || o[0] >= 240 {
        Some("reserved")
    } else if ip.is_documentation() || (o[0] == 198 && (o[1] & 0xfe) == 18) {
        Some("documentation/benchmarking")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("IETF protocol assignments (192.0.0.0/24)")
    } else {
        None
    }
}

/// Why no connection may ever go to `ip`, even when an operator named it: the unspecified
/// address (a connection to it reaches the local host), multicast, broadcast and reserved
/// space. None for every address one can meaningfully connect to.
pub fn never_connectable(ip: IpAddr) -> Option<&'static str> {
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => embedded_v4(ip),
    };
    if let Some(v4) = v4 {
        let o = v4.octets();
        return if v4.is_unspecified() || o[0] == 0 {
            Some("unspecified (0.0.0.0/8)")
        } else if v4.is_multicast() {
            Some("multicast")
        } else if v4.is_broadcast() || o[0] >= 240 {
            Some("reserved")
        } else {
            None
        };
    }
    match ip {
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("multicast"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_non_public_range_is_refused() {
        for a in [
            "127.0.0.1",
            "127.1.2.3",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "::8.8.8.8",
            "2001:db8::1",
            "fec0::1",
        ] {
            assert!(non_public(ip(a)).is_some(), "{a} must not count as public");
        }
        for a in [
            "93.184.215.14",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(non_public(ip(a)), None, "{a} is public");
        }
        assert_eq!(
            non_public(ip("169.254.169.254")),
            Some("cloud metadata (link-local)")
        );
    }

    #[test]
    fn unspecified_multicast_and_reserved_are_never_connectable() {
        for a in [
            "0.0.0.0",
            "0.0.0.1",
            "::",
            "::ffff:0.0.0.0",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            "64:ff9b::e000:1",
        ] {
            assert!(never_connectable(ip(a)).is_some(), "{a}");
        }
        for a in [
            "127.0.0.1",
            "::1",
            "10.0.0.1",
            "8.8.8.8",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(never_connectable(ip(a)), None, "{a}");
        }
    }

    #[test]
    fn networks() {
        assert!(
            Cidr::parse("10.0.0.0/8")
                .unwrap()
                .contains(ip("10.255.0.1"))
        );
        assert!(!Cidr::parse("10.0.0.0/8").unwrap().contains(ip("11.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
        assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        assert!(!Cidr::parse("127.0.0.1/32").unwrap().contains(ip("::1")));
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nope/8").is_none());
    }
}
