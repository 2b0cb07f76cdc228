//! The side-channel messages of the upgrade protocol (docs/shim-protocol.md, "Messages").
//!
//! Every message starts with the magic `RDSS` and the version byte 1, then a type byte. All
//! integers are big-endian. Addresses are `family (u8: 4 or 6) | address (4 or 16 bytes) |
//! port (u16)`; IPv6 flow info and scope id are not carried (they decode as 0).
//!
//! | message | bytes after `RDSS` 1 | total length |
//! | --- | --- | --- |
//! | HELLO  | `1`, flags u8, nonce u64, client address, server address | 29 (v4+v4) .. 53 (v6+v6) |
//! | ACCEPT | `2`, nonce u64, limits u32 (reserved, 0) | 18 |
//! | REFUSE | `3`, nonce u64, reason code u16 ([`crate::reason::Reason::code`]) | 16 |
//! | CONFIRM | `4`, nonce u64 | 14 |
//!
//! HELLO and CONFIRM are sent by the client, ACCEPT and REFUSE by the server. The server sends
//! ACCEPT only from the process whose `accept()` claimed the connection, and swaps only after
//! the client's CONFIRM (docs/shim-protocol.md, "Sequence").
//!
//! [`encode`] writes into a caller's fixed buffer ([`MAX_MESSAGE_LEN`] bytes) and never
//! allocates. [`decode`] reads one message from the front of a buffer and returns how many bytes
//! it used (bytes after it belong to the stream); it tells [`DecodeError::Incomplete`] (a valid
//! prefix: read more) from [`DecodeError::Invalid`] (not our protocol: refuse or close). For an
//! incomplete prefix, `needed` never exceeds the message's real length, so a reader that reads
//! exactly `needed - have` more bytes never consumes bytes past the message.

use std::ffi::OsStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::reason::Reason;

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"RDSS";
/// Protocol version this code speaks.
pub const VERSION: u8 = 1;
/// Magic, version and type byte.
pub const HEADER_LEN: usize = 6;
/// Type byte of HELLO.
pub const TYPE_HELLO: u8 = 1;
/// Type byte of ACCEPT.
pub const TYPE_ACCEPT: u8 = 2;
/// Type byte of REFUSE.
pub const TYPE_REFUSE: u8 = 3;
/// Type byte of CONFIRM.
pub const TYPE_CONFIRM: u8 = 4;
/// Length of an ACCEPT message.
pub const ACCEPT_LEN: usize = HEADER_LEN + 8 + 4;
/// Length of a REFUSE message.
pub const REFUSE_LEN: usize = HEADER_LEN + 8 + 2;
/// Length of a CONFIRM message.
pub const CONFIRM_LEN: usize = HEADER_LEN + 8;
/// Length of a HELLO with two IPv4 addresses (the shortest).
pub const HELLO_MIN_LEN: usize = HEADER_LEN + 1 + 8 + 2 * (1 + 4 + 2);
/// Length of a HELLO with two IPv6 addresses (the longest message).
pub const HELLO_MAX_LEN: usize = HEADER_LEN + 1 + 8 + 2 * (1 + 16 + 2);
/// Buffer size that holds any message.
pub const MAX_MESSAGE_LEN: usize = HELLO_MAX_LEN;

/// Family byte of an IPv4 address.
pub const FAMILY_V4: u8 = 4;
/// Family byte of an IPv6 address.
pub const FAMILY_V6: u8 = 6;

/// Environment variable bounding each negotiation step, in milliseconds: rconnect + HELLO; the
/// client's wait after its kernel connect (TCP establishment of a non-blocking connect, then
/// ACCEPT); the server's wait for a HELLO not read yet when `accept()` returns.
pub const NEGOTIATE_ENV: &str = "STREAMSHIM_NEGOTIATE_MS";
/// Default negotiation bound.
pub const DEFAULT_NEGOTIATE_TIMEOUT: Duration = Duration::from_millis(200);
/// Largest negotiation bound accepted from the environment (larger values are clamped).
pub const MAX_NEGOTIATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server keeps a registered upgrade that no TCP connection claimed.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server's pump waits after ACCEPT for the client's CONFIRM or for its give-up
/// (rsocket closed, or bytes on the TCP connection) before it relays over TCP. Either comes
/// within a round trip from a live client; only a stalled or vanished one takes this long.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's offer, sent first on the side channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hello {
    /// Reserved for options; 0 today. Unknown bits are carried, not rejected.
    pub flags: u8,
    /// Echoed in the reply.
    pub nonce: u64,
    /// The client's TCP address (C:c), already bound before the SYN.
    pub client: SocketAddr,
    /// The TCP address the app connects to (S:P).
    pub server: SocketAddr,
}

/// The server agreed and registered the pending upgrade; the rsocket now carries the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accept {
    /// The HELLO's nonce.
    pub nonce: u64,
    /// Server limits; reserved, 0 today.
    pub limits: u32,
}

/// The server declines; the client stays on TCP (`PEER_REFUSED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Refuse {
    /// The HELLO's nonce (0 when the HELLO did not parse).
    pub nonce: u64,
    /// Why, as a [`Reason`] code; codes this version does not know are kept as they are.
    pub code: u16,
}

impl Refuse {
    /// A refusal for `reason`.
    pub const fn new(nonce: u64, reason: Reason) -> Refuse {
        Refuse {
            nonce,
            code: reason.code(),
        }
    }

    /// The reason, when the code is one this version knows.
    pub const fn reason(&self) -> Option<Reason> {
        Reason::from_code(self.code)
    }
}

/// The client got ACCEPT in time and swaps now; the server swaps when it reads this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Confirm {
    /// The HELLO's (and ACCEPT's) nonce.
    pub nonce: u64,
}

/// One side-channel message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// Client -> server.
    Hello(Hello),
    /// Server -> client.
    Accept(Accept),
    /// Server -> client.
    Refuse(Refuse),
    /// Client -> server, after ACCEPT.
    Confirm(Confirm),
}

impl Message {
    /// The message's nonce.
    pub const fn nonce(&self) -> u64 {
        match self {
            Message::Hello(h) => h.nonce,
            Message::Accept(a) => a.nonce,
            Message::Refuse(r) => r.nonce,
            Message::Confirm(c) => c.nonce,
        }
    }

    /// The type byte.
    pub const fn type_byte(&self) -> u8 {
        match self {
            Message::Hello(_) => TYPE_HELLO,
            Message::Accept(_) => TYPE_ACCEPT,
            Message::Refuse(_) => TYPE_REFUSE,
            Message::Confirm(_) => TYPE_CONFIRM,
        }
    }

    /// Bytes [`encode`] writes for this message.
    pub const fn encoded_len(&self) -> usize {
        match self {
            Message::Hello(h) => {
                HEADER_LEN + 1 + 8 + addr_wire_len(&h.client) + addr_wire_len(&h.server)
            }
            Message::Accept(_) => ACCEPT_LEN,
            Message::Refuse(_) => REFUSE_LEN,
            Message::Confirm(_) => CONFIRM_LEN,
        }
    }

    /// The encoded bytes in a fixed-size value (no allocation).
    pub fn to_bytes(&self) -> Encoded {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let len = encode(self, &mut buf);
        Encoded { buf, len }
    }
}

const fn addr_wire_len(a: &SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2,
    }
}

/// An encoded message on the stack.
#[derive(Clone, Copy)]
pub struct Encoded {
    buf: [u8; MAX_MESSAGE_LEN],
    len: usize,
}

impl Encoded {
    /// The message's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

impl std::ops::Deref for Encoded {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Encoded").field(&self.as_bytes()).finish()
    }
}

/// Writes `msg` to the front of `buf` and returns its length ([`Message::encoded_len`]).
/// Infallible: the buffer holds any message.
pub fn encode(msg: &Message, buf: &mut [u8; MAX_MESSAGE_LEN]) -> usize {
    let mut w = Writer { buf, pos: 0 };
    w.put(&MAGIC);
    w.put(&[VERSION, msg.type_byte()]);
    match msg {
        Message::Hello(h) => {
            w.put(&[h.flags]);
            w.put(&h.nonce.to_be_bytes());
            w.put_addr(&h.client);
            w.put_addr(&h.server);
        }
        Message::Accept(a) => {
            w.put(&a.nonce.to_be_bytes());
            w.put(&a.limits.to_be_bytes());
        }
        Message::Refuse(r) => {
            w.put(&r.nonce.to_be_bytes());
            w.put(&r.code.to_be_bytes());
        }
        Message::Confirm(c) => w.put(&c.nonce.to_be_bytes()),
    }
    w.pos
}

/// Like [`encode`] into any slice; `None` (nothing written) when it is shorter than
/// [`Message::encoded_len`].
pub fn encode_into(msg: &Message, buf: &mut [u8]) -> Option<usize> {
    let enc = msg.to_bytes();
    let out = buf.get_mut(..enc.len)?;
    out.copy_from_slice(enc.as_bytes());
    Some(enc.len)
}

struct Writer<'a> {
    buf: &'a mut [u8; MAX_MESSAGE_LEN],
    pos: usize,
}

impl Writer<'_> {
    /// Messages never exceed the buffer, so the `None` arm is unreachable; it keeps the code
    /// panic-free by construction.
    fn put(&mut self, bytes: &[u8]) {
        let end = self.pos.saturating_add(bytes.len());
        if let Some(dst) = self.buf.get_mut(self.pos..end) {
            dst.copy_from_slice(bytes);
            self.pos = end;
        }
    }

    fn put_addr(&mut self, a: &SocketAddr) {
        match a {
            SocketAddr::V4(v4) => {
                self.put(&[FAMILY_V4]);
                self.put(&v4.ip().octets());
            }
            SocketAddr::V6(v6) => {
                self.put(&[FAMILY_V6]);
                self.put(&v6.ip().octets());
            }
        }
        self.put(&a.port().to_be_bytes());
    }
}

/// Why bytes are not (yet) a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A valid prefix: at least `needed` bytes in total are required. `needed` is never more than
    /// the full message's length.
    #[error("incomplete side-channel message: need at least {needed} bytes")]
    Incomplete {
        /// Lower bound on the message's total length.
        needed: usize,
    },
    /// Not a message of this protocol version.
    #[error("invalid side-channel message: {0}")]
    Invalid(#[from] Invalid),
}

/// What makes a message invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The first bytes are not `RDSS`.
    #[error("bad magic")]
    BadMagic,
    /// The version byte is not [`VERSION`].
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// The type byte is not HELLO, ACCEPT, REFUSE or CONFIRM.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// An address family byte is not 4 or 6.
    #[error("bad address family {0}")]
    BadFamily(u8),
}

fn family_len(f: u8) -> Result<usize, Invalid> {
    match f {
        FAMILY_V4 => Ok(4),
        FAMILY_V6 => Ok(16),
        other => Err(Invalid::BadFamily(other)),
    }
}

/// Decodes one message from the front of `buf`; returns it and the bytes it used.
pub fn decode(buf: &[u8]) -> Result<(Message, usize), DecodeError> {
    // Magic, checked as far as the bytes go, so a non-shim peer is rejected early.
    let have = buf.len().min(MAGIC.len());
    if buf.get(..have) != MAGIC.get(..have) {
        return Err(Invalid::BadMagic.into());
    }
    let incomplete = |needed| DecodeError::Incomplete { needed };
    let version = *buf.get(4).ok_or(incomplete(HEADER_LEN))?;
    if version != VERSION {
        return Err(Invalid::UnsupportedVersion(version).into());
    }
    let ty = *buf.get(5).ok_or(incomplete(HEADER_LEN))?;
    let total = match ty {
        TYPE_ACCEPT => ACCEPT_LEN,
        TYPE_REFUSE => REFUSE_LEN,
        TYPE_CONFIRM => CONFIRM_LEN,
        TYPE_HELLO => {
            // flags(1) nonce(8), then the client family byte.
            let cfam_at = HEADER_LEN + 1 + 8;
            let cfam = *buf.get(cfam_at).ok_or(incomplete(HELLO_MIN_LEN))?;
            let clen = family_len(cfam)?;
            let sfam_at = cfam_at + 1 + clen + 2;
            let lower = sfam_at + 1 + 4 + 2;
            let sfam = *buf.get(sfam_at).ok_or(incomplete(lower))?;
            let slen = family_len(sfam)?;
            sfam_at + 1 + slen + 2
        }
        other => return Err(Invalid::UnknownType(other).into()),
    };
    if buf.len() < total {
        return Err(incomplete(total));
    }
    let mut r = Reader {
        buf,
        pos: HEADER_LEN,
    };
    let msg = match ty {
        TYPE_HELLO => Message::Hello(Hello {
            flags: r.u8(),
            nonce: r.u64(),
            client: r.addr()?,
            server: r.addr()?,
        }),
        TYPE_ACCEPT => Message::Accept(Accept {
            nonce: r.u64(),
            limits: r.u32(),
        }),
        TYPE_CONFIRM => Message::Confirm(Confirm { nonce: r.u64() }),
        _ => Message::Refuse(Refuse {
            nonce: r.u64(),
            code: r.u16(),
        }),
    };
    Ok((msg, total))
}

/// Reads fields whose presence [`decode`] already checked; a short buffer reads as zeros instead
/// of panicking (unreachable, and the length check above makes it so).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let end = self.pos.saturating_add(N);
        let mut out = [0u8; N];
        if let Some(src) = self.buf.get(self.pos..end) {
            out.copy_from_slice(src);
        }
        self.pos = end;
        out
    }
    fn u8(&mut self) -> u8 {
        let [b] = self.take::<1>();
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
    fn addr(&mut self) -> Result<SocketAddr, Invalid> {
        match self.u8() {
            FAMILY_V4 => {
                let ip = Ipv4Addr::from(self.take::<4>());
                Ok(SocketAddr::V4(SocketAddrV4::new(ip, self.u16())))
            }
            FAMILY_V6 => {
                let ip = Ipv6Addr::from(self.take::<16>());
                Ok(SocketAddr::V6(SocketAddrV6::new(ip, self.u16(), 0, 0)))
            }
            other => Err(Invalid::BadFamily(other)),
        }
    }
}

/// A fresh nonce: unique per process and call (pid, wall clock, a counter, mixed with
/// SplitMix64). Not secret: it pairs a reply with its HELLO. No syscall beyond the clock read,
/// no allocation, never fails.
pub fn new_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let pid = u64::from(std::process::id());
    let local = 0u8;
    let stack = std::ptr::addr_of!(local) as usize as u64;
    splitmix64(
        splitmix64(nanos ^ pid.rotate_left(32) ^ stack.rotate_left(17))
            ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The negotiation bound from `STREAMSHIM_NEGOTIATE_MS`.
pub fn negotiate_timeout_from_env() -> Duration {
    negotiate_timeout_from_value(std::env::var_os(NEGOTIATE_ENV).as_deref())
}

/// The negotiation bound for a variable value: decimal milliseconds; unset, empty, unparsable or
/// 0 give [`DEFAULT_NEGOTIATE_TIMEOUT`]; values above [`MAX_NEGOTIATE_TIMEOUT`] are clamped.
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn hello(client: &str, server: &str) -> Message {
        Message::Hello(Hello {
            flags: 0,
            nonce: 0x0102_0304_0506_0708,
            client: sa(client),
            server: sa(server),
        })
    }

    #[test]
    fn hello_v4_exact_bytes() {
        let m = hello("198.18.0.1:40000", "198.18.0.2:5201");
        let e = m.to_bytes();
        let expected: &[u8] = &[
            b'R', b'D', b'S', b'S', 1, // magic, version
            1, 0, // HELLO, flags
            1, 2, 3, 4, 5, 6, 7, 8, // nonce
            4, 198, 18, 0, 1, 0x9c, 0x40, // client 198.18.0.1:40000
            4, 198, 18, 0, 2, 0x14, 0x51, // server 198.18.0.2:5201
        ];
        assert_eq!(e.as_bytes(), expected);
        assert_eq!(e.len(), HELLO_MIN_LEN);
        assert_eq!(m.encoded_len(), HELLO_MIN_LEN);
        assert_eq!(decode(expected), Ok((m, HELLO_MIN_LEN)));
    }

    #[test]
    fn hello_v6_and_mixed() {
        let m = hello("[2001:db8::1]:1", "[fd00::2]:65535");
        assert_eq!(m.encoded_len(), HELLO_MAX_LEN);
        let e = m.to_bytes();
        assert_eq!(e.len(), 53);
        assert_eq!(e[15], FAMILY_V6);
        assert_eq!(e[34], FAMILY_V6);
        assert_eq!(&e[51..53], &[0xff, 0xff]);
        assert_eq!(decode(&e), Ok((m, 53)));

        let m = hello("10.0.0.1:1", "[::ffff:10.0.0.2]:2");
        assert_eq!(m.encoded_len(), HEADER_LEN + 9 + 7 + 19);
        assert_eq!(decode(&m.to_bytes()), Ok((m, m.encoded_len())));
    }

    #[test]
    fn accept_and_refuse_exact_bytes() {
        let a = Message::Accept(Accept {
            nonce: 0xdead_beef,
            limits: 0x0102_0304,
        });
        assert_eq!(
            a.to_bytes().as_bytes(),
            &[
                b'R', b'D', b'S', b'S', 1, 2, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4
            ]
        );
        let r = Message::Refuse(Refuse::new(7, Reason::Policy));
        assert_eq!(
            r.to_bytes().as_bytes(),
            &[b'R', b'D', b'S', b'S', 1, 3, 0, 0, 0, 0, 0, 0, 0, 7, 0, 5]
        );
        let Message::Refuse(rf) = r else {
            unreachable!()
        };
        assert_eq!(rf.reason(), Some(Reason::Policy));
        assert_eq!(
            Refuse {
                nonce: 0,
                code: 999
            }
            .reason(),
            None
        );
        assert_eq!(a.nonce(), 0xdead_beef);
        assert_eq!(r.nonce(), 7);
    }

    #[test]
    fn confirm_exact_bytes() {
        let c = Message::Confirm(Confirm {
            nonce: 0x0102_0304_0506_0708,
        });
        let expected: &[u8] = &[b'R', b'D', b'S', b'S', 1, 4, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(c.to_bytes().as_bytes(), expected);
        assert_eq!(c.encoded_len(), CONFIRM_LEN);
        assert_eq!(CONFIRM_LEN, 14);
        assert_eq!(c.nonce(), 0x0102_0304_0506_0708);
        assert_eq!(c.type_byte(), TYPE_CONFIRM);
        assert_eq!(decode(expected), Ok((c, CONFIRM_LEN)));
        // Bytes after it belong to the stream.
        let mut buf = expected.to_vec();
        buf.extend_from_slice(b"app");
        assert_eq!(decode(&buf), Ok((c, CONFIRM_LEN)));
        assert_eq!(
            decode(b"RDSS\x01\x04"),
            Err(DecodeError::Incomplete {
                needed: CONFIRM_LEN
            })
        );
        assert_eq!(
            decode(&expected[..13]),
            Err(DecodeError::Incomplete {
                needed: CONFIRM_LEN
            })
        );
        assert_eq!(decode(b"RDSS\x01\x05"), Err(Invalid::UnknownType(5).into()));
    }

    #[test]
    fn trailing_bytes_are_not_consumed() {
        let m = Message::Accept(Accept {
            nonce: 1,
            limits: 0,
        });
        let mut buf = m.to_bytes().to_vec();
        buf.extend_from_slice(b"app bytes");
        assert_eq!(decode(&buf), Ok((m, ACCEPT_LEN)));
        assert_eq!(&buf[ACCEPT_LEN..], b"app bytes");
    }

    #[test]
    fn invalid_inputs() {
        assert_eq!(decode(b"X"), Err(Invalid::BadMagic.into()));
        assert_eq!(decode(b"RDSx"), Err(Invalid::BadMagic.into()));
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(Invalid::BadMagic.into()));
        assert_eq!(
            decode(b"RDSS\x02"),
            Err(Invalid::UnsupportedVersion(2).into())
        );
        assert_eq!(decode(b"RDSS\x01\x09"), Err(Invalid::UnknownType(9).into()));
        assert_eq!(decode(b"RDSS\x01\x00"), Err(Invalid::UnknownType(0).into()));
        let mut h = hello("1.2.3.4:5", "6.7.8.9:10").to_bytes().to_vec();
        h[15] = 5;
        assert_eq!(decode(&h), Err(Invalid::BadFamily(5).into()));
        let mut h = hello("1.2.3.4:5", "6.7.8.9:10").to_bytes().to_vec();
        h[22] = 0;
        assert_eq!(decode(&h), Err(Invalid::BadFamily(0).into()));
        // Truncated with an invalid server family: still Invalid once the byte is there.
        assert_eq!(decode(&h[..23]), Err(Invalid::BadFamily(0).into()));
        assert_eq!(
            DecodeError::from(Invalid::UnknownType(9)).to_string(),
            "invalid side-channel message: unknown message type 9"
        );
    }

    #[test]
    fn incomplete_prefixes() {
        assert_eq!(
            decode(b""),
            Err(DecodeError::Incomplete { needed: HEADER_LEN })
        );
        assert_eq!(
            decode(b"RD"),
            Err(DecodeError::Incomplete { needed: HEADER_LEN })
        );
        assert_eq!(
            decode(b"RDSS\x01\x02"),
            Err(DecodeError::Incomplete { needed: ACCEPT_LEN })
        );
        assert_eq!(
            decode(b"RDSS\x01\x03"),
            Err(DecodeError::Incomplete { needed: REFUSE_LEN })
        );
        assert_eq!(
            decode(b"RDSS\x01\x01"),
            Err(DecodeError::Incomplete {
                needed: HELLO_MIN_LEN
            })
        );
        // v6 client: after the family byte the bound grows.
        let e = hello("[::1]:1", "[::2]:2").to_bytes();
        assert_eq!(
            decode(&e[..16]),
            Err(DecodeError::Incomplete {
                needed: 16 + 18 + 1 + 6
            })
        );
        assert_eq!(
            decode(&e[..35]),
            Err(DecodeError::Incomplete { needed: 53 })
        );
    }

    #[test]
    fn encode_into_slices() {
        let m = hello("1.2.3.4:5", "[::1]:6");
        let mut small = [0u8; 10];
        assert_eq!(encode_into(&m, &mut small), None);
        assert_eq!(small, [0u8; 10]);
        let mut big = [0xaau8; 100];
        let n = encode_into(&m, &mut big).unwrap();
        assert_eq!(n, m.encoded_len());
        assert_eq!(&big[..n], m.to_bytes().as_bytes());
        assert_eq!(big[n], 0xaa);
        let mut exact = vec![0u8; n];
        assert_eq!(encode_into(&m, &mut exact), Some(n));
    }

    #[test]
    fn nonces_differ() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(new_nonce()));
        }
    }

    #[test]
    fn negotiate_timeout_values() {
        let v = |s: &str| negotiate_timeout_from_value(Some(OsStr::new(s)));
        assert_eq!(
            negotiate_timeout_from_value(None),
            DEFAULT_NEGOTIATE_TIMEOUT
        );
        assert_eq!(v(""), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("abc"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("-5"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("0"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(v("50"), Duration::from_millis(50));
        assert_eq!(v(" 75 "), Duration::from_millis(75));
        assert_eq!(v("99999999"), MAX_NEGOTIATE_TIMEOUT);
        assert_eq!(v("99999999999999999999999"), DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(DEFAULT_NEGOTIATE_TIMEOUT, Duration::from_millis(200));
        assert_eq!(PENDING_TIMEOUT, Duration::from_secs(10));
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<u32>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(ip.into(), port))),
            (any::<u128>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::V6(SocketAddrV6::new(
                ip.into(),
                port,
                0,
                0
            ))),
        ]
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (any::<u8>(), any::<u64>(), arb_addr(), arb_addr()).prop_map(
                |(flags, nonce, client, server)| Message::Hello(Hello {
                    flags,
                    nonce,
                    client,
                    server
                })
            ),
            (any::<u64>(), any::<u32>())
                .prop_map(|(nonce, limits)| Message::Accept(Accept { nonce, limits })),
            (any::<u64>(), any::<u16>())
                .prop_map(|(nonce, code)| Message::Refuse(Refuse { nonce, code })),
            any::<u64>().prop_map(|nonce| Message::Confirm(Confirm { nonce })),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(m in arb_message(), tail in proptest::collection::vec(any::<u8>(), 0..16)) {
            let mut buf = [0u8; MAX_MESSAGE_LEN];
            let n = encode(&m, &mut buf);
            prop_assert_eq!(n, m.encoded_len());
            prop_assert!(n <= MAX_MESSAGE_LEN);
            prop_assert_eq!(decode(&buf[..n]), Ok((m, n)));
            let mut with_tail = buf[..n].to_vec();
            with_tail.extend_from_slice(&tail);
            prop_assert_eq!(decode(&with_tail), Ok((m, n)));
        }

        #[test]
        fn every_truncation_is_incomplete(m in arb_message()) {
            let e = m.to_bytes();
            for cut in 0..e.len() {
                match decode(&e[..cut]) {
                    Err(DecodeError::Incomplete { needed }) => {
                        prop_assert!(needed > cut, "cut {} needed {}", cut, needed);
                        prop_assert!(needed <= e.len(), "cut {} needed {} len {}", cut, needed, e.len());
                    }
                    other => prop_assert!(false, "cut {}: {:?}", cut, other),
                }
            }
        }

        #[test]
        fn reading_exactly_needed_reaches_the_message(m in arb_message()) {
            let e = m.to_bytes();
            let mut have = 0;
            let mut steps = 0;
            loop {
                steps += 1;
                prop_assert!(steps < 10);
                match decode(&e[..have]) {
                    Ok((got, n)) => {
                        prop_assert_eq!(got, m);
                        prop_assert_eq!(n, e.len());
                        break;
                    }
                    Err(DecodeError::Incomplete { needed }) => have = needed,
                    Err(other) => prop_assert!(false, "{:?}", other),
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok((m, n)) = decode(&bytes) {
                prop_assert!(n <= bytes.len());
                // The encoding is canonical.
                prop_assert_eq!(m.to_bytes().to_vec(), bytes[..n].to_vec());
            }
        }

        #[test]
        fn framed_bytes_never_panic(ty in 0u8..6, body in proptest::collection::vec(any::<u8>(), 0..60)) {
            // Valid header, arbitrary body: exercises the deeper branches.
            let mut bytes = b"RDSS\x01".to_vec();
            bytes.push(ty);
            bytes.extend_from_slice(&body);
            match decode(&bytes) {
                Ok((m, n)) => prop_assert_eq!(m.to_bytes().to_vec(), bytes[..n].to_vec()),
                Err(DecodeError::Incomplete { needed }) => prop_assert!(needed > bytes.len()),
                Err(DecodeError::Invalid(_)) => {}
            }
        }
    }
}
