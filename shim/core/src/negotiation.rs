//! The shim's negotiation messages: the app payloads of the connection manager's private data
//! (docs/shim-protocol.md, "Messages"). The transport's own header
//! ([`rdma_streams_transport::wire`]) comes before them; CLAIM and CONFIRM are the transport's
//! control messages.
//!
//! | message | bytes (big-endian) | length | in |
//! | --- | --- | --- | --- |
//! | HELLO  | `S`, 1, flags u8, nonce u64, client address | 18 (IPv4) / 30 (IPv6) | connect request |
//! | ACCEPT | `S`, 2, nonce u64 | 10 | accept |
//! | REFUSE | `S`, 3, nonce u64, reason code u16 | 12 | reject |
//!
//! An address is `family u8 (4|6) | port u16 | ip (4|16)`: the client's TCP address (C:c),
//! bound before the SYN, under which the server's `accept()` finds the registration. Every
//! message fits the 36 bytes a connect request leaves the app.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::reason::Reason;

/// The app tag of the shim's payloads.
pub const TAG: u8 = b'S';
/// Type byte of HELLO.
pub const TYPE_HELLO: u8 = 1;
/// Type byte of ACCEPT.
pub const TYPE_ACCEPT: u8 = 2;
/// Type byte of REFUSE.
pub const TYPE_REFUSE: u8 = 3;
/// HELLO's flag of a connect made back by the accepting side to its TCP client, whose
/// connection came through a Service's virtual IP (docs/shim-protocol.md, "Services"): its
/// address is the client's as the accepting side's `accept()` returned it. A listener of the
/// app's port refuses such a HELLO; the client's own listener takes no other.
pub const HELLO_BACK: u8 = 1;
/// Family byte of an IPv4 address.
pub const FAMILY_V4: u8 = 4;
/// Family byte of an IPv6 address.
pub const FAMILY_V6: u8 = 6;

/// Default bound of each negotiation step (`STREAMSHIM_NEGOTIATE_MS`): the RDMA connect (HELLO
/// to ACCEPT), and the client's wait after its kernel connect (TCP establishment of a
/// non-blocking connect, then CLAIM).
pub const DEFAULT_NEGOTIATE_TIMEOUT: Duration = Duration::from_millis(200);
/// Largest negotiation bound accepted from the environment (larger values are clamped).
pub const MAX_NEGOTIATE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's offer, in the connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hello {
    /// [`HELLO_BACK`], or 0; other bits are carried, not rejected.
    pub flags: u8,
    /// Echoed in the answer.
    pub nonce: u64,
    /// The client's TCP address (C:c), bound before the SYN.
    pub client: SocketAddr,
}

/// One negotiation message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// Client -> server (connect request).
    Hello(Hello),
    /// Server -> client (accept): registered; the accepting process's CLAIM follows in-band.
    Accept {
        /// The HELLO's nonce.
        nonce: u64,
    },
    /// Server -> client (reject): stay on TCP.
    Refuse {
        /// The HELLO's nonce (0 when the HELLO did not parse).
        nonce: u64,
        /// A [`Reason`] code; codes this version does not know are kept as they are.
        code: u16,
    },
}

impl Message {
    /// A refusal for `reason`.
    pub const fn refuse(nonce: u64, reason: Reason) -> Message {
        Message::Refuse {
            nonce,
            code: reason.code(),
        }
    }

    /// The bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(30);
        match self {
            Message::Hello(h) => {
                out.extend_from_slice(&[TAG, TYPE_HELLO, h.flags]);
                out.extend_from_slice(&h.nonce.to_be_bytes());
                put_addr(&mut out, h.client);
            }
            Message::Accept { nonce } => {
                out.extend_from_slice(&[TAG, TYPE_ACCEPT]);
                out.extend_from_slice(&nonce.to_be_bytes());
            }
            Message::Refuse { nonce, code } => {
                out.extend_from_slice(&[TAG, TYPE_REFUSE]);
                out.extend_from_slice(&nonce.to_be_bytes());
                out.extend_from_slice(&code.to_be_bytes());
            }
        }
        out
    }

    /// Decodes a payload (bytes after the message are ignored).
    pub fn decode(buf: &[u8]) -> Result<Message, Invalid> {
        let mut r = Reader { buf, pos: 0 };
        if r.u8()? != TAG {
            return Err(Invalid::NotShim);
        }
        match r.u8()? {
            TYPE_HELLO => Ok(Message::Hello(Hello {
                flags: r.u8()?,
                nonce: r.u64()?,
                client: r.addr()?,
            })),
            TYPE_ACCEPT => Ok(Message::Accept { nonce: r.u64()? }),
            TYPE_REFUSE => Ok(Message::Refuse {
                nonce: r.u64()?,
                code: r.u16()?,
            }),
            other => Err(Invalid::UnknownType(other)),
        }
    }
}

/// Appends `a` in the messages' address format (see the module docs).
pub fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.push(FAMILY_V4);
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(FAMILY_V6);
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&ip.octets());
        }
    }
}

/// The address `bytes` hold, exactly (no byte before or after it).
pub fn read_addr(bytes: &[u8]) -> Result<SocketAddr, Invalid> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let a = r.addr()?;
    if r.pos == bytes.len() {
        Ok(a)
    } else {
        Err(Invalid::Truncated)
    }
}

/// Why a payload is not a negotiation message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    /// Not the shim's tag (another app of the transport, such as the gateway).
    #[error("not a shim message")]
    NotShim,
    /// Shorter than its fields.
    #[error("truncated message")]
    Truncated,
    /// An unknown type byte.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// An address family byte that is not 4 or 6.
    #[error("bad address family {0}")]
    BadFamily(u8),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Invalid> {
        let end = self.pos.checked_add(N).ok_or(Invalid::Truncated)?;
        let src = self.buf.get(self.pos..end).ok_or(Invalid::Truncated)?;
        let mut out = [0u8; N];
        out.copy_from_slice(src);
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, Invalid> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, Invalid> {
        Ok(u16::from_be_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, Invalid> {
        Ok(u64::from_be_bytes(self.take()?))
    }
    fn addr(&mut self) -> Result<SocketAddr, Invalid> {
        let family = self.u8()?;
        let port = self.u16()?;
        let ip = match family {
            FAMILY_V4 => IpAddr::V4(Ipv4Addr::from(self.take::<4>()?)),
            FAMILY_V6 => IpAddr::V6(Ipv6Addr::from(self.take::<16>()?)),
            other => return Err(Invalid::BadFamily(other)),
        };
        Ok(SocketAddr::new(ip, port))
    }
}

/// The process's id for [`new_nonce`], read once (0: not yet); a fork child reads its own
/// ([`after_fork_child`]).
static PID: AtomicU32 = AtomicU32::new(0);

/// A fresh nonce: unique per process and call (pid, wall clock, a counter, mixed with
/// SplitMix64). Not secret: it pairs an answer with its HELLO. No system call: the pid is read
/// once per process, and the coarse wall clock comes from the vDSO on every clock source.
pub fn new_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = crate::sys::coarse_wall_clock_ns();
    let pid = match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    };
    let pid = u64::from(pid);
    splitmix64(splitmix64(nanos ^ pid.rotate_left(32)) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// In a fork child: its nonces mix its own pid.
pub fn after_fork_child() {
    PID.store(0, Ordering::Relaxed);
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The negotiation bound for a `STREAMSHIM_NEGOTIATE_MS` value (read by [`crate::settings`]):
/// decimal milliseconds; unset, empty, unparsable or 0 give [`DEFAULT_NEGOTIATE_TIMEOUT`];
/// values above [`MAX_NEGOTIATE_TIMEOUT`] are clamped.
pub fn negotiate_timeout_from_value(value: Option<&OsStr>) -> Duration {
    let Some(ms) = value
        .and_then(OsStr::to_str)
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
    else {
        return DEFAULT_NEGOTIATE_TIMEOUT;
    };
    Duration::from_millis(ms).min(MAX_NEGOTIATE_TIMEOUT)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rdma_streams_transport::wire::MAX_CONNECT_PAYLOAD;

    #[test]
    fn exact_bytes() {
        let hello = Message::Hello(Hello {
            flags: 0,
            nonce: 0x0102_0304_0506_0708,
            client: "198.18.0.2:40000".parse().unwrap(),
        });
        assert_eq!(
            hello.encode(),
            [
                b'S', 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 4, 0x9c, 0x40, 198, 18, 0, 2
            ]
        );
        assert_eq!(
            Message::Accept { nonce: 9 }.encode(),
            [b'S', 2, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        assert_eq!(
            Message::refuse(1, Reason::Policy).encode(),
            [b'S', 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 5]
        );
    }

    #[test]
    fn the_longest_hello_fits_a_connect_request() {
        let hello = Message::Hello(Hello {
            flags: 0xff,
            nonce: u64::MAX,
            client: "[fd00::1:2:3:4]:65535".parse().unwrap(),
        });
        assert_eq!(hello.encode().len(), 30);
        assert!(hello.encode().len() <= MAX_CONNECT_PAYLOAD);
    }

    #[test]
    fn invalid_payloads() {
        assert_eq!(Message::decode(b""), Err(Invalid::Truncated));
        assert_eq!(Message::decode(b"G\x01"), Err(Invalid::NotShim));
        assert_eq!(Message::decode(b"S\x09"), Err(Invalid::UnknownType(9)));
        assert_eq!(Message::decode(b"S\x02\x00"), Err(Invalid::Truncated));
        let mut bad = Message::Hello(Hello {
            flags: 0,
            nonce: 1,
            client: "10.0.0.1:1".parse().unwrap(),
        })
        .encode();
        bad[11] = 5;
        assert_eq!(Message::decode(&bad), Err(Invalid::BadFamily(5)));
    }

    #[test]
    fn read_addr_takes_exactly_one_address() {
        for a in ["198.18.0.1:80", "[fd00::1]:65535", "[::ffff:10.0.0.1]:1"] {
            let a: SocketAddr = a.parse().unwrap();
            let mut b = Vec::new();
            put_addr(&mut b, a);
            assert_eq!(read_addr(&b), Ok(a));
            assert!(read_addr(&b[..b.len() - 1]).is_err(), "short");
            b.push(0);
            assert!(read_addr(&b).is_err(), "long");
        }
        assert_eq!(
            read_addr(&[5, 0, 80, 1, 2, 3, 4]),
            Err(Invalid::BadFamily(5))
        );
        assert!(read_addr(&[]).is_err());
    }

    #[test]
    fn nonces_differ() {
        let a = new_nonce();
        let b = new_nonce();
        assert_ne!(a, b);
    }

    #[test]
    fn negotiate_timeout_values() {
        let v = |s: &str| negotiate_timeout_from_value(Some(OsStr::new(s)));
        assert_eq!(
            negotiate_timeout_from_value(None),
            DEFAULT_NEGOTIATE_TIMEOUT
        );
        assert_eq!(v(""), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("0"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("x"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v(" 50 "), Duration::from_millis(50));
        assert_eq!(v("99999999"), MAX_NEGOTIATE_TIMEOUT);
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, p)| SocketAddr::new(Ipv4Addr::from(ip).into(), p)),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, p)| SocketAddr::new(Ipv6Addr::from(ip).into(), p)),
        ]
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (any::<u8>(), any::<u64>(), arb_addr()).prop_map(|(flags, nonce, client)| {
                Message::Hello(Hello {
                    flags,
                    nonce,
                    client,
                })
            }),
            any::<u64>().prop_map(|nonce| Message::Accept { nonce }),
            (any::<u64>(), any::<u16>()).prop_map(|(nonce, code)| Message::Refuse { nonce, code }),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip_with_padding(m in arb_message(), pad in 0usize..20) {
            let mut b = m.encode();
            b.extend(std::iter::repeat_n(0, pad));
            prop_assert_eq!(Message::decode(&b), Ok(m));
        }

        #[test]
        fn every_truncation_is_refused(m in arb_message()) {
            let b = m.encode();
            for cut in 0..b.len() {
                prop_assert!(Message::decode(&b[..cut]).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Message::decode(&bytes);
        }
    }
}
