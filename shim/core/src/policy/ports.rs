//! Port lists in a policy: [`PortRange`], one port (`5201`) or an inclusive range
//! (`"8000-8100"`).

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// An inclusive port range (`lo == hi` for one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (inclusive).
    pub hi: u16,
}

impl PortRange {
    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }
}

impl FromStr for PortRange {
    type Err = String;

    /// `"5201"` or `"8000-8100"` (inclusive, lo <= hi).
    fn from_str(s: &str) -> Result<PortRange, String> {
        let port = |p: &str| -> Result<u16, String> {
            let p = p.trim();
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("invalid port {p:?} in {s:?}"));
            }
            p.parse::<u16>()
                .map_err(|_| format!("port {p} in {s:?} is above 65535"))
        };
        match s.split_once('-') {
            None => {
                let p = port(s)?;
                Ok(PortRange { lo: p, hi: p })
            }
            Some((a, b)) => {
                let (lo, hi) = (port(a)?, port(b)?);
                if lo > hi {
                    return Err(format!("port range {s:?} is empty (start above end)"));
                }
                Ok(PortRange { lo, hi })
            }
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortRange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or a \"lo-hi\" range")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .map(|p| PortRange { lo: p, hi: p })
                    .map_err(|_| E::custom(format!("port {v} is above 65535")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .map(|p| PortRange { lo: p, hi: p })
                    .map_err(|_| E::custom(format!("port {v} is out of range 0-65535")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortRange, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ports() {
        assert_eq!(
            "5201".parse::<PortRange>(),
            Ok(PortRange { lo: 5201, hi: 5201 })
        );
        assert_eq!(
            "8000-8100".parse::<PortRange>(),
            Ok(PortRange { lo: 8000, hi: 8100 })
        );
        assert_eq!("1 - 2".parse::<PortRange>(), Ok(PortRange { lo: 1, hi: 2 }));
        for bad in ["", "-", "a", "1-", "-1", "70000", "2-1", "1-2-3", "+5"] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad:?}");
        }
        let r = PortRange { lo: 10, hi: 20 };
        assert!(r.contains(10) && r.contains(20) && !r.contains(9) && !r.contains(21));
        assert_eq!(r.to_string(), "10-20");
        assert_eq!(PortRange { lo: 7, hi: 7 }.to_string(), "7");
    }
}
