//! What two gateways say to each other: the app payloads of the RDMA connection manager's
//! private data (after the transport's own header, `rdma_streams_transport::wire`). Nothing of
//! the gateway travels in-band: when a stream is established, its first byte is already the
//! captured connection's.
//!
//! Version 2 opens a stream in two connect requests, which authenticate both gateways with a
//! pre-shared key ([`super::keys`]) and a fresh nonce from each side
//! ([`super::transcript`]):
//!
//! ```text
//! 1. source -> target  connect request  HELLO: 'G' | 2 | 1 | port u16 BE | uid digest (8) | source nonce (16)   29 bytes
//!    target -> source  reject           'G' | 4 CHALLENGE | target nonce (16)                                   18 bytes
//! 2. source -> target  connect request  PROOF: 'G' | 2 | 2 | port u16 BE | uid digest (8) | ticket (7) | proof tag (16)   36 bytes
//!    target -> source  accept           'G' | 0 OK | accept tag (16)                                           18 bytes
//!    (or a reject   'G' | status, below)
//! ```
//!
//! - The ticket is the first [`TICKET_LEN`] bytes of the target nonce: it names the challenge
//!   among those the target holds for that source (several connections of one migration open
//!   at once, to the same port).
//! - The destination's address is not sent: the target takes it from its own migration (the one
//!   named by the digest and publishing the port), and both tags cover it.
//! - Reject statuses: 1 unknown migration, 2 destination unreachable, 3 bad request, 4
//!   challenge, 5 authentication failed (a proof that does not verify under any key, or no such
//!   challenge: expired, replayed, never issued), 6 no peer key on the target, 7 busy (too many
//!   challenges pending), 8 destination not on the target's node, 9 unsupported version (a
//!   version-1 request: a gateway without peer authentication).
//! - The tag `G` comes first so that a gateway and the shim (whose payloads start with `S`,
//!   `streamshim_core::negotiation`) never take each other's requests or answers for their own.
//! - A connect request leaves the app at most 36 bytes (`wire::MAX_CONNECT_PAYLOAD`), so the
//!   VMI uid (a 36-character UUID) travels as the first 8 bytes of its SHA-256. The target
//!   compares it with the digests of the migrations it carries as target, with the port.
//!
//! Every decoder checks every length before it reads, and bytes after a message are ignored.

use sha2::{Digest, Sha256};

use super::transcript::{NONCE_LEN, Nonce, TAG_LEN, Tag};

/// First byte of every gateway payload.
pub const TAG: u8 = b'G';
/// The connect requests' version.
pub const VERSION: u8 = 2;
/// The version of gateways without peer authentication (refused).
pub const LEGACY_VERSION: u8 = 1;
/// Bytes of the uid digest.
pub const DIGEST_LEN: usize = 8;
/// Bytes of the challenge ticket (a prefix of the target nonce).
pub const TICKET_LEN: usize = 7;
/// Length of a HELLO.
pub const HELLO_LEN: usize = 3 + 2 + DIGEST_LEN + NONCE_LEN;
/// Length of a PROOF.
pub const PROOF_LEN: usize = 3 + 2 + DIGEST_LEN + TICKET_LEN + TAG_LEN;

const KIND_HELLO: u8 = 1;
const KIND_PROOF: u8 = 2;

// Both requests fit the transport's connect request.
const _: () = assert!(HELLO_LEN <= rdma_streams_transport::wire::MAX_CONNECT_PAYLOAD);
const _: () = assert!(PROOF_LEN <= rdma_streams_transport::wire::MAX_CONNECT_PAYLOAD);

/// The first [`DIGEST_LEN`] bytes of the SHA-256 of a VMI uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UidDigest(pub [u8; DIGEST_LEN]);

impl UidDigest {
    pub fn of(uid: &str) -> UidDigest {
        let full = Sha256::digest(uid.as_bytes());
        let mut d = [0u8; DIGEST_LEN];
        d.copy_from_slice(&full[..DIGEST_LEN]);
        UidDigest(d)
    }
}

impl std::fmt::Display for UidDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// A challenge's name: the first [`TICKET_LEN`] bytes of the target nonce.
pub type Ticket = [u8; TICKET_LEN];

/// The ticket of a target nonce.
pub fn ticket_of(nonce: &Nonce) -> Ticket {
    let mut t = [0u8; TICKET_LEN];
    t.copy_from_slice(&nonce[..TICKET_LEN]);
    t
}

/// Round 1: the source asks for a challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub port: u16,
    pub migration: UidDigest,
    pub nonce: Nonce,
}

/// Round 2: the source proves it holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    pub port: u16,
    pub migration: UidDigest,
    pub ticket: Ticket,
    pub tag: Tag,
}

/// A connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    Hello(Hello),
    Proof(Proof),
}

/// The target's answer (accept: [`Answer::Ok`]; reject: any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The destination is connected; the tag proves the target holds a key.
    Ok(Tag),
    /// No target migration with that uid and port on the peer's node.
    UnknownMigration,
    /// The peer could not dial the destination.
    Unreachable,
    /// The request was not a gateway's.
    BadRequest,
    /// Round 1's answer: prove you hold a key, over this nonce.
    Challenge(Nonce),
    /// The proof did not verify, or its challenge is unknown (expired, used, never issued).
    AuthFailed,
    /// The peer has no key: it takes no stream.
    NoKey,
    /// Too many challenges pending (for this source or in all).
    Busy,
    /// The migration's destination is not an address of the target's node.
    NotLocal,
    /// A request of another version (version 1: no peer authentication).
    Version,
}

/// A payload that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("payload too short ({0} bytes)")]
    Short(usize),
    #[error("not a gateway payload (tag {0:#04x})")]
    Tag(u8),
    #[error("a version-1 request: a gateway without peer authentication (upgrade it; refused)")]
    Legacy,
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown request kind {0}")]
    Kind(u8),
    #[error("unknown answer status {0}")]
    Status(u8),
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

impl Open {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PROOF_LEN);
        out.extend_from_slice(&[TAG, VERSION]);
        match self {
            Open::Hello(h) => {
                out.push(KIND_HELLO);
                out.extend_from_slice(&h.port.to_be_bytes());
                out.extend_from_slice(&h.migration.0);
                out.extend_from_slice(&h.nonce);
            }
            Open::Proof(p) => {
                out.push(KIND_PROOF);
                out.extend_from_slice(&p.port.to_be_bytes());
                out.extend_from_slice(&p.migration.0);
                out.extend_from_slice(&p.ticket);
                out.extend_from_slice(&p.tag);
            }
        }
        out
    }

    /// Decodes a connect request (bytes after it are ignored).
    pub fn decode(buf: &[u8]) -> Result<Open, PayloadError> {
        let short = || PayloadError::Short(buf.len());
        let (&tag, rest) = buf.split_first().ok_or_else(short)?;
        if tag != TAG {
            return Err(PayloadError::Tag(tag));
        }
        let (&version, rest) = rest.split_first().ok_or_else(short)?;
        match version {
            VERSION => {}
            LEGACY_VERSION => return Err(PayloadError::Legacy),
            v => return Err(PayloadError::Version(v)),
        }
        let (&kind, rest) = rest.split_first().ok_or_else(short)?;
        let body_len = match kind {
            KIND_HELLO => HELLO_LEN - 3,
            KIND_PROOF => PROOF_LEN - 3,
            k => return Err(PayloadError::Kind(k)),
        };
        let body = rest.get(..body_len).ok_or_else(short)?;
        let (port, body) = body.split_at(2);
        let port = u16::from_be_bytes([port[0], port[1]]);
        let (digest, body) = body.split_at(DIGEST_LEN);
        let migration = UidDigest(array(digest));
        Ok(match kind {
            KIND_HELLO => Open::Hello(Hello {
                port,
                migration,
                nonce: array(body),
            }),
            _ => {
                let (ticket, tag) = body.split_at(TICKET_LEN);
                Open::Proof(Proof {
                    port,
                    migration,
                    ticket: array(ticket),
                    tag: array(tag),
                })
            }
        })
    }
}

impl Answer {
    fn code(self) -> u8 {
        match self {
            Answer::Ok(_) => 0,
            Answer::UnknownMigration => 1,
            Answer::Unreachable => 2,
            Answer::BadRequest => 3,
            Answer::Challenge(_) => 4,
            Answer::AuthFailed => 5,
            Answer::NoKey => 6,
            Answer::Busy => 7,
            Answer::NotLocal => 8,
            Answer::Version => 9,
        }
    }

    pub fn encode(self) -> Vec<u8> {
        let mut out = vec![TAG, self.code()];
        match self {
            Answer::Ok(tag) => out.extend_from_slice(&tag),
            Answer::Challenge(nonce) => out.extend_from_slice(&nonce),
            _ => {}
        }
        out
    }

    /// Decodes an accept or reject payload (bytes after it are ignored).
    pub fn decode(buf: &[u8]) -> Result<Answer, PayloadError> {
        let short = || PayloadError::Short(buf.len());
        let &[tag, status, ref rest @ ..] = buf else {
            return Err(short());
        };
        if tag != TAG {
            return Err(PayloadError::Tag(tag));
        }
        Ok(match status {
            0 => Answer::Ok(array(rest.get(..TAG_LEN).ok_or_else(short)?)),
            1 => Answer::UnknownMigration,
            2 => Answer::Unreachable,
            3 => Answer::BadRequest,
            4 => Answer::Challenge(array(rest.get(..NONCE_LEN).ok_or_else(short)?)),
            5 => Answer::AuthFailed,
            6 => Answer::NoKey,
            7 => Answer::Busy,
            8 => Answer::NotLocal,
            9 => Answer::Version,
            s => return Err(PayloadError::Status(s)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    use super::*;

    /// What an accept or reject payload may carry (the transport's bound).
    const MAX_ANSWER: usize = 64;

    fn hello() -> Open {
        Open::Hello(Hello {
            port: 49152,
            migration: UidDigest::of("6c0e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"),
            nonce: [0xa5; 16],
        })
    }

    fn proof() -> Open {
        Open::Proof(Proof {
            port: 1,
            migration: UidDigest::of("u1"),
            ticket: [7; TICKET_LEN],
            tag: [9; TAG_LEN],
        })
    }

    #[test]
    fn requests_have_the_documented_layout_and_fit_the_connect_payload() {
        let h = hello().encode();
        assert_eq!(h.len(), 29);
        assert_eq!(&h[..5], &[b'G', 2, 1, 0xc0, 0x00]);
        assert_eq!(&h[13..], &[0xa5; 16]);
        let p = proof().encode();
        assert_eq!(p.len(), 36);
        assert_eq!(&p[..5], &[b'G', 2, 2, 0, 1]);
        assert_eq!(&p[13..20], &[7; 7]);
        assert_eq!(&p[20..], &[9; 16]);
        for open in [hello(), proof()] {
            let bytes = open.encode();
            assert_eq!(Open::decode(&bytes), Ok(open));
            for cut in 0..bytes.len() {
                assert!(Open::decode(&bytes[..cut]).is_err(), "cut {cut}");
            }
            let mut longer = bytes.clone();
            longer.extend_from_slice(b"later");
            assert_eq!(Open::decode(&longer), Ok(open));
        }
    }

    #[test]
    fn answers_round_trip_within_a_reject_payload() {
        for a in [
            Answer::Ok([3; 16]),
            Answer::UnknownMigration,
            Answer::Unreachable,
            Answer::BadRequest,
            Answer::Challenge([4; 16]),
            Answer::AuthFailed,
            Answer::NoKey,
            Answer::Busy,
            Answer::NotLocal,
            Answer::Version,
        ] {
            let bytes = a.encode();
            assert!(bytes.len() <= MAX_ANSWER);
            assert_eq!(Answer::decode(&bytes), Ok(a));
            assert_eq!(bytes[0], TAG);
        }
        assert_eq!(Answer::Challenge([4; 16]).encode().len(), 18);
        assert_eq!(Answer::decode(b"G\x00short"), Err(PayloadError::Short(7)));
        assert_eq!(Answer::decode(b"G\x04"), Err(PayloadError::Short(2)));
    }

    #[test]
    fn old_foreign_or_broken_payloads_are_refused() {
        // A version-1 request (an older gateway): refused as such.
        let v1 = b"G\x01\x04\xc0\x00\x0a\x02\x00\x02\x01\x02\x03\x04\x05\x06\x07\x08";
        assert_eq!(Open::decode(v1), Err(PayloadError::Legacy));
        assert!(PayloadError::Legacy.to_string().contains("version-1"));
        // The shim's HELLO starts with 'S'.
        assert_eq!(
            Open::decode(b"S\x01\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x01\x7f\x00\x00\x01"),
            Err(PayloadError::Tag(b'S'))
        );
        assert_eq!(Open::decode(b"G\x03\x01"), Err(PayloadError::Version(3)));
        assert_eq!(Open::decode(b"G\x02\x07"), Err(PayloadError::Kind(7)));
        assert_eq!(Open::decode(b""), Err(PayloadError::Short(0)));
        assert_eq!(Open::decode(b"G"), Err(PayloadError::Short(1)));
        assert_eq!(Answer::decode(b"S\x03"), Err(PayloadError::Tag(b'S')));
        assert_eq!(Answer::decode(b"G\x0a"), Err(PayloadError::Status(10)));
        assert_eq!(Answer::decode(b"G"), Err(PayloadError::Short(1)));
    }

    #[test]
    fn the_digest_is_the_uids_sha256_prefix() {
        let d = UidDigest::of("u1");
        assert_eq!(d.0, Sha256::digest(b"u1")[..8]);
        assert_ne!(d, UidDigest::of("u2"));
        assert_eq!(d.to_string().len(), 16);
        assert_eq!(ticket_of(&[5; 16]), [5; 7]);
    }

    fn runner() -> TestRunner {
        TestRunner::new(Config {
            cases: 1024,
            failure_persistence: None,
            ..Config::default()
        })
    }

    fn arb_open() -> impl Strategy<Value = Open> {
        let digest = any::<[u8; DIGEST_LEN]>().prop_map(UidDigest);
        prop_oneof![
            (any::<u16>(), digest.clone(), any::<Nonce>()).prop_map(|(port, migration, nonce)| {
                Open::Hello(Hello {
                    port,
                    migration,
                    nonce,
                })
            }),
            (any::<u16>(), digest, any::<Ticket>(), any::<Tag>()).prop_map(
                |(port, migration, ticket, tag)| Open::Proof(Proof {
                    port,
                    migration,
                    ticket,
                    tag,
                })
            ),
        ]
    }

    fn arb_answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            any::<Tag>().prop_map(Answer::Ok),
            any::<Nonce>().prop_map(Answer::Challenge),
            Just(Answer::UnknownMigration),
            Just(Answer::Unreachable),
            Just(Answer::BadRequest),
            Just(Answer::AuthFailed),
            Just(Answer::NoKey),
            Just(Answer::Busy),
            Just(Answer::NotLocal),
            Just(Answer::Version),
        ]
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders() {
        rdma_streams_testkit::within(Duration::from_secs(60), || {
            runner()
                .run(&proptest::collection::vec(any::<u8>(), 0..80), |bytes| {
                    // Whatever parses encodes back to the bytes it read.
                    if let Ok(open) = Open::decode(&bytes) {
                        let again = open.encode();
                        prop_assert_eq!(&bytes[..again.len()], &again[..]);
                    }
                    if let Ok(answer) = Answer::decode(&bytes) {
                        let again = answer.encode();
                        prop_assert_eq!(&bytes[..again.len()], &again[..]);
                    }
                    Ok(())
                })
                .unwrap();
        });
    }

    #[test]
    fn every_message_round_trips_and_no_truncation_parses() {
        rdma_streams_testkit::within(Duration::from_secs(60), || {
            runner()
                .run(&(arb_open(), 0usize..16), |(open, pad)| {
                    let mut bytes = open.encode();
                    for cut in 0..bytes.len() {
                        prop_assert!(Open::decode(&bytes[..cut]).is_err());
                    }
                    bytes.extend(std::iter::repeat_n(0xee, pad));
                    prop_assert_eq!(Open::decode(&bytes), Ok(open));
                    Ok(())
                })
                .unwrap();
            runner()
                .run(&(arb_answer(), 0usize..16), |(answer, pad)| {
                    let mut bytes = answer.encode();
                    for cut in 0..bytes.len() {
                        prop_assert!(Answer::decode(&bytes[..cut]).is_err());
                    }
                    bytes.extend(std::iter::repeat_n(0xee, pad));
                    prop_assert_eq!(Answer::decode(&bytes), Ok(answer));
                    Ok(())
                })
                .unwrap();
        });
    }
}
