//! What the stream transport puts on the wire besides the app's bytes: the connection
//! manager's private data and the control messages (docs/shim-protocol.md, "Wire").
//!
//! **Private data** (connect request, accept, reject), big-endian:
//!
//! ```text
//! 0..2   magic "RS"
//! 2      version (3)
//! 3      kind: 1 connect, 2 accept, 3 reject
//! 4..12  receive ring address (0 in a reject)
//! 12..16 receive ring rkey
//! 16     log2 of the ring size (12..=24)
//! 17..19 posted receives (u16)
//! 19     app payload length (connect: at most 36 bytes, the request's 56 minus this header)
//! 20..   app payload (the shim's HELLO, the gateway's destination, a refusal)
//! ```
//!
//! IB CMs pad private data with zeros to the message's full size, so the payload length is
//! carried explicitly and bytes after it are ignored.
//!
//! **Data** travels as RDMA WRITE WITH IMMEDIATE into the peer's ring; the immediate is the
//! stream position after the write (its low 32 bits) and the write's length is the one the
//! receiving device reports, so a write that is empty, larger than the ring or not the next in
//! the stream is refused ([`crate::flow::RecvFlow::arrived`]). **Control messages** are 48-byte
//! SENDs:
//!
//! ```text
//! 0      type: 1 CREDIT, 2 FIN, 3 CLAIM, 4 CONFIRM, 5 URGENT, 6 RING, 7 SWITCH, 8 MOVED,
//!        9 REUSE, 10 REUSED
//! 1..8   zero (REUSE, REUSED: 1 the payload's length)
//! 8..16  bytes of the sender's receive ring consumed so far (u64)
//! 16..24 receives the sender reposted so far (u64)
//! 24..40 CLAIM: the binding secret (16 random bytes)
//! 24..32 URGENT: the stream position of the urgent byte (u64), the first byte of the next
//!        data write
//! 24..32 RING: the address of a ring the sender offers for the peer's writes (u64), 32..36
//!        its rkey (u32), 36 log2 of its size
//! 24..32 SWITCH: the stream position from which the sender writes into the ring offered
//!        last (u64), the first byte of the next data write
//! 24..32 MOVED: the count of bytes the sender sent over TCP before its move
//! 40..48 zero
//! ```
//!
//! REUSE and REUSED (a finished connection's queue pair taken for the next connection between
//! the same two processes: docs/shim-protocol.md, "Reused connections") carry no counters:
//! bytes 8..48 hold an app payload of at most [`MAX_REUSE_PAYLOAD`] bytes (REUSE: a connect
//! request's; REUSED: an accept's). A refusal is a disconnect.

use crate::rdma::MAX_CONNECT_PRIVATE_DATA;

/// First bytes of every private-data message.
pub const MAGIC: [u8; 2] = *b"RS";
/// The version this code speaks (5: control messages of 48 bytes with CLAIM's secret,
/// URGENT, RING, SWITCH, MOVED and the reuse of a finished connection's queue pair; the
/// immediate is the stream position).
pub const VERSION: u8 = 5;
/// Header bytes before the app payload.
pub const HEADER_LEN: usize = 20;
/// Largest app payload of a connect request.
pub const MAX_CONNECT_PAYLOAD: usize = MAX_CONNECT_PRIVATE_DATA - HEADER_LEN;
/// Largest app payload of an accept or reject (what any of them carries, kept small).
pub const MAX_PAYLOAD: usize = 64;
/// Smallest and largest ring (log2).
pub const MIN_RING_LOG: u8 = 12;
/// See [`MIN_RING_LOG`].
pub const MAX_RING_LOG: u8 = 24;
/// Bytes of a control message.
pub const CONTROL_LEN: usize = 48;
/// Largest app payload of REUSE and REUSED (the control message after its first 8 bytes; at
/// least a connect request's [`MAX_CONNECT_PAYLOAD`]).
pub const MAX_REUSE_PAYLOAD: usize = CONTROL_LEN - 8;
const _: () = assert!(MAX_REUSE_PAYLOAD >= MAX_CONNECT_PAYLOAD);
/// Bytes of the binding secret CLAIM carries.
pub const SECRET_LEN: usize = 16;

/// Which CM message the private data belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The active side's connect request.
    Connect,
    /// The passive side's accept.
    Accept,
    /// The passive side's reject.
    Reject,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Connect => 1,
            Kind::Accept => 2,
            Kind::Reject => 3,
        }
    }
}

/// Where the sender's receive ring is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingInfo {
    /// Its address in the sender's memory.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// log2 of its size.
    pub size_log: u8,
    /// Receives the sender posted.
    pub receives: u16,
}

impl RingInfo {
    /// The ring's size in bytes.
    pub fn size(&self) -> u64 {
        1u64 << self.size_log
    }
}

/// Decoded private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateData {
    /// The CM message it came with.
    pub kind: Kind,
    /// The sender's ring (zero in a reject).
    pub ring: RingInfo,
    /// The app's payload.
    pub payload: Vec<u8>,
}

/// Private data that is not ours or is malformed (another RDMA program at that port, or a
/// broken peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadPrivateData {
    /// Shorter than the header.
    #[error("private data too short ({0} bytes)")]
    Short(usize),
    /// Not our magic.
    #[error("not rdma-streams private data")]
    Magic,
    /// Another version.
    #[error("unsupported version {0}")]
    Version(u8),
    /// Unknown kind, or not the one expected.
    #[error("unexpected message kind {0}")]
    Kind(u8),
    /// A ring size or receive count out of range.
    #[error("ring size 2^{0} or {1} receives out of range")]
    Ring(u8, u16),
    /// The payload length points past the data.
    #[error("payload length {0} past the data")]
    Payload(u8),
    /// A payload longer than any message of ours carries ([`MAX_PAYLOAD`]).
    #[error("payload of {0} bytes, longer than {MAX_PAYLOAD}")]
    TooLong(u8),
}

impl PrivateData {
    /// Encodes the header and `payload` (cut at [`MAX_PAYLOAD`]).
    pub fn encode(kind: Kind, ring: RingInfo, payload: &[u8]) -> Vec<u8> {
        let payload = payload.get(..payload.len().min(MAX_PAYLOAD)).unwrap_or(&[]);
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(kind.byte());
        out.extend_from_slice(&ring.addr.to_be_bytes());
        out.extend_from_slice(&ring.rkey.to_be_bytes());
        out.push(ring.size_log);
        out.extend_from_slice(&ring.receives.to_be_bytes());
        out.push(u8::try_from(payload.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(payload);
        out
    }

    /// Decodes private data of the `expected` kind.
    pub fn decode(buf: &[u8], expected: Kind) -> Result<PrivateData, BadPrivateData> {
        let h = buf
            .get(..HEADER_LEN)
            .ok_or(BadPrivateData::Short(buf.len()))?;
        if h[..2] != MAGIC {
            return Err(BadPrivateData::Magic);
        }
        if h[2] != VERSION {
            return Err(BadPrivateData::Version(h[2]));
        }
        if h[3] != expected.byte() {
            return Err(BadPrivateData::Kind(h[3]));
        }
        let word = |r: std::ops::Range<usize>| h.get(r).unwrap_or(&[]);
        let addr = u64::from_be_bytes(word(4..12).try_into().unwrap_or([0; 8]));
        let rkey = u32::from_be_bytes(word(12..16).try_into().unwrap_or([0; 4]));
        let size_log = h[16];
        let receives = u16::from_be_bytes([h[17], h[18]]);
        if expected != Kind::Reject
            && (!(MIN_RING_LOG..=MAX_RING_LOG).contains(&size_log) || receives < 2)
        {
            return Err(BadPrivateData::Ring(size_log, receives));
        }
        let len = h[19];
        if usize::from(len) > MAX_PAYLOAD {
            return Err(BadPrivateData::TooLong(len));
        }
        let payload = buf
            .get(HEADER_LEN..HEADER_LEN + usize::from(len))
            .ok_or(BadPrivateData::Payload(len))?
            .to_vec();
        Ok(PrivateData {
            kind: expected,
            ring: RingInfo {
                addr,
                rkey,
                size_log,
                receives,
            },
            payload,
        })
    }
}

/// Why the peer's engine (not its app) rejected a connect request; carried in the reject's
/// `rkey` field (0: the app decided, its payload says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportReject {
    /// The buffers do not fit the peer's pinned-memory budget.
    Memlock = 1,
    /// A verbs or CM call failed at the peer.
    Resources = 2,
    /// The request's private data is not ours or malformed.
    BadRequest = 3,
    /// The peer's acceptor deferred and never decided.
    Timeout = 4,
    /// Nothing listens for us there any more.
    NoListener = 5,
    /// Too many connections from the requester (or in all) wait for their app: the request
    /// is refused before anything is allocated for it.
    Busy = 6,
}

impl TransportReject {
    /// The code in a reject's `rkey` field.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The reject for `code`, if known.
    pub fn from_code(code: u32) -> Option<TransportReject> {
        Some(match code {
            1 => TransportReject::Memlock,
            2 => TransportReject::Resources,
            3 => TransportReject::BadRequest,
            4 => TransportReject::Timeout,
            5 => TransportReject::NoListener,
            6 => TransportReject::Busy,
            _ => return None,
        })
    }

    /// The private data of this reject.
    pub fn encode(self) -> Vec<u8> {
        PrivateData::encode(
            Kind::Reject,
            RingInfo {
                rkey: self.code(),
                ..RingInfo::default()
            },
            &[],
        )
    }
}

/// The secret the accepting side sends in CLAIM: the connecting side proves it holds it by
/// writing it as the first bytes of its TCP connection, which binds the stream to that
/// connection (docs/shim-protocol.md, "Binding"). Its `Debug` does not show it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh secret from the kernel's random source (`getrandom`); None when it cannot give
    /// one (the caller does not bind, and the connection stays TCP).
    pub fn random() -> Option<Secret> {
        let mut b = [0u8; SECRET_LEN];
        getrandom::fill(&mut b).ok()?;
        Some(Secret(b))
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }
}

/// A control message's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// Only the counters.
    Credit,
    /// The sender will send no more data (half-close).
    Fin,
    /// The accepting process claimed the connection (the shim's server side), with the secret
    /// the connecting side must show on the TCP connection.
    Claim(Secret),
    /// The connecting side moves its bytes to the stream (the shim's client side).
    Confirm,
    /// The byte at this stream position, the first of the next data write, is urgent (TCP's
    /// `MSG_OOB`): the receiver hands it to its app out of band, at its place in the stream.
    Urgent(u64),
    /// The sender offers another ring for the peer's writes (its `receives` field is unused).
    Ring(RingInfo),
    /// From this stream position on, the first byte of the next data write, the sender writes
    /// into the ring the peer offered last.
    Switch(u64),
    /// The accepting side's bytes move to the stream (the shim's server side, once bound): it
    /// sent this many over TCP before; every later one comes on the stream.
    Moved(u64),
    /// The connecting side asks for the next connection on this finished connection's queue
    /// pair, with a connect request's payload (the shim's HELLO).
    Reuse(Payload),
    /// The accepting side took the next connection, with an accept's payload.
    Reused(Payload),
}

/// An app payload carried in a control message ([`MAX_REUSE_PAYLOAD`] bytes at most).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    len: u8,
    bytes: [u8; MAX_REUSE_PAYLOAD],
}

impl Payload {
    /// `bytes` as a payload; None when longer than [`MAX_REUSE_PAYLOAD`].
    pub fn new(bytes: &[u8]) -> Option<Payload> {
        let mut p = Payload {
            len: u8::try_from(bytes.len()).ok()?,
            bytes: [0; MAX_REUSE_PAYLOAD],
        };
        p.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(p)
    }

    /// The payload's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.len)
    }
}

/// One control message: a type and the sender's receive counters (none in REUSE and REUSED:
/// zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// What it says.
    pub kind: ControlKind,
    /// Bytes of the sender's ring consumed.
    pub consumed: u64,
    /// Receives the sender reposted.
    pub reposted: u64,
}

impl Control {
    /// The 48 bytes.
    pub fn encode(&self) -> [u8; CONTROL_LEN] {
        let mut b = [0u8; CONTROL_LEN];
        b[0] = match self.kind {
            ControlKind::Credit => 1,
            ControlKind::Fin => 2,
            ControlKind::Claim(_) => 3,
            ControlKind::Confirm => 4,
            ControlKind::Urgent(_) => 5,
            ControlKind::Ring(_) => 6,
            ControlKind::Switch(_) => 7,
            ControlKind::Moved(_) => 8,
            ControlKind::Reuse(_) => 9,
            ControlKind::Reused(_) => 10,
        };
        if let ControlKind::Reuse(p) | ControlKind::Reused(p) = self.kind {
            b[1] = p.len;
            b[8..].copy_from_slice(&p.bytes);
            return b;
        }
        b[8..16].copy_from_slice(&self.consumed.to_be_bytes());
        b[16..24].copy_from_slice(&self.reposted.to_be_bytes());
        if let ControlKind::Claim(secret) = self.kind {
            b[24..24 + SECRET_LEN].copy_from_slice(secret.bytes());
        }
        if let ControlKind::Urgent(position)
        | ControlKind::Switch(position)
        | ControlKind::Moved(position) = self.kind
        {
            b[24..32].copy_from_slice(&position.to_be_bytes());
        }
        if let ControlKind::Ring(ring) = self.kind {
            b[24..32].copy_from_slice(&ring.addr.to_be_bytes());
            b[32..36].copy_from_slice(&ring.rkey.to_be_bytes());
            b[36] = ring.size_log;
        }
        b
    }

    /// Decodes a received control message; None for an unknown type or a length that is not
    /// [`CONTROL_LEN`].
    pub fn decode(b: &[u8]) -> Option<Control> {
        let b: &[u8; CONTROL_LEN] = b.try_into().ok()?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_be_bytes(w)
        };
        let kind = match b[0] {
            1 => ControlKind::Credit,
            2 => ControlKind::Fin,
            3 => {
                let mut secret = [0u8; SECRET_LEN];
                secret.copy_from_slice(&b[24..24 + SECRET_LEN]);
                ControlKind::Claim(Secret(secret))
            }
            4 => ControlKind::Confirm,
            5 => ControlKind::Urgent(word(24)),
            6 if (MIN_RING_LOG..=MAX_RING_LOG).contains(&b[36]) => ControlKind::Ring(RingInfo {
                addr: word(24),
                rkey: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
                size_log: b[36],
                receives: 0,
            }),
            7 => ControlKind::Switch(word(24)),
            8 => ControlKind::Moved(word(24)),
            9 | 10 => {
                let payload = Payload::new(b[8..].get(..usize::from(b[1]))?)?;
                let kind = if b[0] == 9 {
                    ControlKind::Reuse(payload)
                } else {
                    ControlKind::Reused(payload)
                };
                return Some(Control {
                    kind,
                    consumed: 0,
                    reposted: 0,
                });
            }
            _ => return None,
        };
        Some(Control {
            kind,
            consumed: word(8),
            reposted: word(16),
        })
    }
}

/// The immediate of a data write that ends the stream at `end` (its position after the write):
/// the low 32 bits, which the receiver checks against its own count.
pub fn data_imm(end: u64) -> u32 {
    // The low bits only, by design: a write is at most a ring (2^24 bytes), far below 2^32.
    (end & u64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> RingInfo {
        RingInfo {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            size_log: 18,
            receives: 64,
        }
    }

    #[test]
    fn private_data_round_trips_with_ib_padding() {
        let payload = [7u8; MAX_CONNECT_PAYLOAD];
        let mut b = PrivateData::encode(Kind::Connect, ring(), &payload);
        assert_eq!(b.len(), MAX_CONNECT_PRIVATE_DATA);
        b.resize(92, 0);
        let d = PrivateData::decode(&b, Kind::Connect).unwrap();
        assert_eq!(d.ring, ring());
        assert_eq!(d.payload, payload);
    }

    #[test]
    fn foreign_or_broken_private_data_is_refused() {
        let good = PrivateData::encode(Kind::Accept, ring(), b"x");
        assert_eq!(
            PrivateData::decode(&good, Kind::Connect),
            Err(BadPrivateData::Kind(2))
        );
        assert_eq!(
            PrivateData::decode(&good[..10], Kind::Accept),
            Err(BadPrivateData::Short(10))
        );
        let mut other = good.clone();
        other[0] = b'X';
        assert_eq!(
            PrivateData::decode(&other, Kind::Accept),
            Err(BadPrivateData::Magic)
        );
        // A peer of the first version (32-byte control messages, the byte count as the
        // immediate, no binding): refused, so it stays on TCP.
        let mut v1 = good.clone();
        v1[2] = 1;
        assert_eq!(
            PrivateData::decode(&v1, Kind::Accept),
            Err(BadPrivateData::Version(1))
        );
        let mut huge = good.clone();
        huge[16] = 40;
        assert!(matches!(
            PrivateData::decode(&huge, Kind::Accept),
            Err(BadPrivateData::Ring(..))
        ));
        let mut long = good;
        long[19] = 9;
        assert_eq!(
            PrivateData::decode(&long, Kind::Accept),
            Err(BadPrivateData::Payload(9))
        );
        // A reject carries no ring.
        let rej = PrivateData::encode(Kind::Reject, RingInfo::default(), b"no");
        assert_eq!(
            PrivateData::decode(&rej, Kind::Reject).unwrap().payload,
            b"no"
        );
        // All-zero private data (what a program that sends none gets padded to).
        assert_eq!(
            PrivateData::decode(&[0; 56], Kind::Accept),
            Err(BadPrivateData::Magic)
        );
    }

    #[test]
    fn control_messages_round_trip() {
        for kind in [
            ControlKind::Credit,
            ControlKind::Fin,
            ControlKind::Claim(Secret([7; SECRET_LEN])),
            ControlKind::Confirm,
            ControlKind::Urgent(u64::MAX - 9),
            ControlKind::Ring(RingInfo {
                addr: u64::MAX - 5,
                rkey: 0xfeed_f00d,
                size_log: MAX_RING_LOG,
                receives: 0,
            }),
            ControlKind::Switch(1 << 40),
            ControlKind::Moved(u64::MAX - 1),
        ] {
            let c = Control {
                kind,
                consumed: u64::MAX - 3,
                reposted: 17,
            };
            assert_eq!(Control::decode(&c.encode()), Some(c));
        }
        assert_eq!(Control::decode(&[11; CONTROL_LEN]), None);
        let mut huge = Control {
            kind: ControlKind::Ring(RingInfo::default()),
            consumed: 0,
            reposted: 0,
        }
        .encode();
        for log in [0, MIN_RING_LOG - 1, MAX_RING_LOG + 1, 64] {
            huge[36] = log;
            assert_eq!(Control::decode(&huge), None, "a ring of 2^{log} bytes");
        }
        let claim = Control {
            kind: ControlKind::Claim(Secret([1; SECRET_LEN])),
            consumed: 0,
            reposted: 0,
        }
        .encode();
        assert_eq!(Control::decode(&claim[..CONTROL_LEN - 1]), None, "short");
        let mut long = claim.to_vec();
        long.push(0);
        assert_eq!(Control::decode(&long), None, "long");
    }

    #[test]
    fn reuse_messages_carry_a_payload_instead_of_counters() {
        let hello = Payload::new(&[3; MAX_CONNECT_PAYLOAD]).unwrap();
        let empty = Payload::new(&[]).unwrap();
        let full = Payload::new(&[9; MAX_REUSE_PAYLOAD]).unwrap();
        assert!(Payload::new(&[0; MAX_REUSE_PAYLOAD + 1]).is_none());
        for kind in [
            ControlKind::Reuse(hello),
            ControlKind::Reused(empty),
            ControlKind::Reuse(full),
            ControlKind::Reused(hello),
        ] {
            let c = Control {
                kind,
                consumed: 0,
                reposted: 0,
            };
            assert_eq!(Control::decode(&c.encode()), Some(c));
        }
        assert_eq!(full.bytes(), &[9; MAX_REUSE_PAYLOAD]);
        // A length past the message is refused, not clamped.
        let mut long = Control {
            kind: ControlKind::Reuse(hello),
            consumed: 0,
            reposted: 0,
        }
        .encode();
        long[1] = MAX_REUSE_PAYLOAD as u8 + 1;
        assert_eq!(Control::decode(&long), None);
        long[1] = 255;
        assert_eq!(Control::decode(&long), None);
    }

    #[test]
    fn a_secret_is_random_and_never_printed() {
        let a = Secret::random().expect("getrandom");
        let b = Secret::random().expect("getrandom");
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Secret(..)");
    }

    #[test]
    fn the_immediate_is_the_low_half_of_the_position() {
        assert_eq!(data_imm(5), 5);
        assert_eq!(data_imm((7 << 32) + 9), 9);
        assert_eq!(data_imm(u64::MAX), u32::MAX);
    }
}
