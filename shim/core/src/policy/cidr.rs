//! Peer addresses in a policy: [`Cidr`] networks (IPv4 kept as IPv4-mapped IPv6, so one
//! comparison serves both families) and the address forms rules compare ([`canonical_ip`],
//! [`is_local_peer`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// An IP network. IPv4 networks are kept as IPv4-mapped IPv6 (`::ffff:0:0/96` + prefix), so one
/// comparison serves both families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: u128,
    prefix: u8,
}

/// A CIDR string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {why}")]
pub struct CidrError {
    input: String,
    why: &'static str,
}

const V4_MAPPED_PREFIX: u128 = 0xffff_u128 << 32;

/// The 128-bit form of an address, IPv4 as IPv4-mapped IPv6.
fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => V4_MAPPED_PREFIX | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn mask(prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p if p >= 128 => u128::MAX,
        p => u128::MAX << (128 - u32::from(p)),
    }
}

/// IPv4-mapped IPv6 addresses become IPv4; everything else is returned as is.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// Loopback or unspecified (connecting to 0.0.0.0 or :: reaches the local host), IPv4-mapped
/// forms included.
pub fn is_local_peer(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified(),
    }
}

impl Cidr {
    /// The network `ip/prefix` (host bits cleared). `prefix` is at most 32 for IPv4 and 128 for
    /// IPv6 (IPv6 terms also for IPv4-mapped addresses: `::ffff:10.0.0.0/104` is `10.0.0.0/8`).
    pub fn new(ip: IpAddr, prefix: u8) -> Result<Cidr, CidrError> {
        // IPv4 is stored as IPv4-mapped IPv6, so an IPv6 network inside ::ffff:0:0/96 with a
        // prefix of 96 or more is the same value as the IPv4 network.
        let (bits, prefix) = match ip {
            IpAddr::V4(v4) => {
                if prefix > 32 {
                    return Err(CidrError {
                        input: format!("{ip}/{prefix}"),
                        why: "IPv4 prefix length above 32",
                    });
                }
                (ip_bits(IpAddr::V4(v4)), prefix.saturating_add(96))
            }
            IpAddr::V6(v6) => {
                if prefix > 128 {
                    return Err(CidrError {
                        input: format!("{ip}/{prefix}"),
                        why: "IPv6 prefix length above 128",
                    });
                }
                (u128::from(v6), prefix)
            }
        };
        Ok(Cidr {
            net: bits & mask(prefix),
            prefix,
        })
    }

    /// Whether `ip` lies in this network (IPv4 and IPv4-mapped IPv6 are the same address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip_bits(ip) & mask(self.prefix) == self.net
    }

    /// Prefix length in the network's own family (IPv4 networks: 0..=32).
    pub fn prefix_len(&self) -> u8 {
        if self.is_v4() {
            self.prefix.saturating_sub(96)
        } else {
            self.prefix
        }
    }

    /// The network address in its own family.
    pub fn network(&self) -> IpAddr {
        if self.is_v4() {
            // The low 32 bits; truncation is the point.
            IpAddr::V4(Ipv4Addr::from((self.net & u128::from(u32::MAX)) as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.net))
        }
    }

    fn is_v4(&self) -> bool {
        self.prefix >= 96 && self.net & mask(96) == V4_MAPPED_PREFIX
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix_len())
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `a.b.c.d/n`, `a.b.c.d` (/32), `v6/n`, `v6` (/128). No spaces, no leading `+`.
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = |why| CidrError {
            input: s.to_owned(),
            why,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let max: u8 = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => parse_prefix(p).ok_or_else(|| err("prefix length is not a number"))?,
        };
        if prefix > max {
            return Err(err(if ip.is_ipv4() {
                "IPv4 prefix length above 32"
            } else {
                "IPv6 prefix length above 128"
            }));
        }
        Cidr::new(ip, prefix)
    }
}

/// Decimal digits only (1-3 of them), value up to 255.
fn parse_prefix(p: &str) -> Option<u8> {
    if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Cidr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP address or CIDR such as 10.0.0.0/8 or fd00::/8")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Cidr, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parse_and_contains() {
        let c = cidr("10.0.0.0/8");
        assert!(c.contains(ip("10.255.1.2")));
        assert!(c.contains(ip("::ffff:10.1.2.3")));
        assert!(!c.contains(ip("11.0.0.0")));
        assert!(!c.contains(ip("::a00:1"))); // IPv4-compatible, not mapped
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.prefix_len(), 8);

        // Host bits ignored.
        assert_eq!(cidr("10.1.2.3/8"), c);
        assert_eq!(cidr("10.1.2.3/8").to_string(), "10.0.0.0/8");

        // Single addresses.
        assert_eq!(cidr("192.168.1.1").to_string(), "192.168.1.1/32");
        assert!(cidr("192.168.1.1").contains(ip("192.168.1.1")));
        assert!(!cidr("192.168.1.1").contains(ip("192.168.1.2")));
        assert_eq!(cidr("fe80::1").to_string(), "fe80::1/128");

        // Zero prefixes.
        let all4 = cidr("0.0.0.0/0");
        assert!(all4.contains(ip("1.2.3.4")));
        assert!(all4.contains(ip("::ffff:1.2.3.4")));
        assert!(!all4.contains(ip("2001:db8::1")));
        let all6 = cidr("::/0");
        assert!(all6.contains(ip("2001:db8::1")));
        assert!(all6.contains(ip("1.2.3.4")));

        // IPv6.
        let c6 = cidr("fd00::/8");
        assert!(c6.contains(ip("fd12:3456::1")));
        assert!(!c6.contains(ip("fe00::1")));
        assert_eq!(c6.to_string(), "fd00::/8");
        let c6 = cidr("2001:db8:1::/48");
        assert!(c6.contains(ip("2001:db8:1:ffff::1")));
        assert!(!c6.contains(ip("2001:db8:2::1")));

        // Mapped CIDR behaves as IPv4.
        let m = cidr("::ffff:10.0.0.0/104");
        assert_eq!(m, cidr("10.0.0.0/8"));
        assert_eq!(m.to_string(), "10.0.0.0/8");
        assert!(m.contains(ip("10.9.9.9")));
        // A mapped address with a short prefix stays IPv6.
        assert_eq!(cidr("::ffff:10.0.0.0/80").to_string(), "::/80");

        // Odd prefixes.
        let c = cidr("172.16.0.0/12");
        assert!(c.contains(ip("172.31.255.255")));
        assert!(!c.contains(ip("172.32.0.0")));
        assert!(cidr("1.2.3.4/31").contains(ip("1.2.3.5")));
        assert!(!cidr("1.2.3.4/31").contains(ip("1.2.3.6")));
    }

    #[test]
    fn cidr_rejects() {
        for bad in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/ 8",
            " 10.0.0.0/8",
            "10.0.0/8",
            "10.0.0.0/8/8",
            "010.0.0.0/8",
            "::/129",
            "::/1000",
            "fd00::/0x8",
            "host.example/8",
            "10.0.0.256",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} parsed");
        }
        let e = "10.0.0.0/33".parse::<Cidr>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid CIDR \"10.0.0.0/33\": IPv4 prefix length above 32"
        );
        assert!(Cidr::new(ip("10.0.0.0"), 33).is_err());
        assert!(Cidr::new(ip("::"), 129).is_err());
        assert_eq!(
            Cidr::new(ip("::ffff:1.2.3.4"), 112).unwrap().to_string(),
            "1.2.0.0/16"
        );
        assert_eq!(
            Cidr::new(ip("::ffff:1.2.3.4"), 16).unwrap().to_string(),
            "::/16"
        );
    }

    #[test]
    fn local_peers_and_canonical_forms() {
        assert!(is_local_peer(ip("127.0.0.2")));
        assert!(is_local_peer(ip("::ffff:127.0.0.2")));
        assert!(is_local_peer(ip("::")));
        assert!(!is_local_peer(ip("10.0.0.1")));
        assert_eq!(canonical_ip(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(canonical_ip(ip("::1")), ip("::1"));
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
            any::<u128>().prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
        ]
    }

    proptest! {
        #[test]
        fn cidr_contains_matches_mask_definition(a in arb_ip(), b in arb_ip(), len in 0u8..=128) {
            let max = if a.is_ipv4() { 32 } else { 128 };
            let len = len % (max + 1);
            let c = Cidr::new(a, len).unwrap();
            prop_assert!(c.contains(a));
            let text = format!("{a}/{len}");
            prop_assert_eq!(text.parse::<Cidr>().unwrap(), c);
            prop_assert_eq!(c.to_string().parse::<Cidr>().unwrap(), c);
            // Reference: compare the top `len` bits in the address's own family.
            let expect = match (canonical_ip(a), canonical_ip(b)) {
                (IpAddr::V4(x), IpAddr::V4(y)) => {
                    len == 0 || (u32::from(x) ^ u32::from(y)) >> (32 - u32::from(len)) == 0
                }
                (IpAddr::V6(x), IpAddr::V6(y)) => {
                    len == 0 || (u128::from(x) ^ u128::from(y)) >> (128 - u32::from(len)) == 0
                }
                (IpAddr::V6(x), IpAddr::V4(y)) => {
                    let y = u128::from(y.to_ipv6_mapped());
                    len == 0 || (u128::from(x) ^ y) >> (128 - u32::from(len)) == 0
                }
                (IpAddr::V4(_), IpAddr::V6(_)) => false,
            };
            prop_assert_eq!(c.contains(b), expect);
        }

        #[test]
        fn cidr_parse_never_panics(s in "[0-9a-f:./+-]{0,50}") {
            let _ = s.parse::<Cidr>();
        }
    }
}
