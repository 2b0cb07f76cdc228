//! What two gateways say to each other: the app payloads of the RDMA connection manager's
//! private data (after the transport's own header, `rdma_streams_transport::wire`). Nothing of
//! the gateway travels in-band: when a stream is established, its first byte is already the
//! captured connection's.
//!
//! ```text
//! connect request: 'G' | version u8 (1) | family u8 (4|6) | port u16 BE | ip (4|16) | uid digest (8)
//!                  17 bytes (IPv4), 29 (IPv6)
//! accept:          'G' | status 0
//! reject:          'G' | status (1 unknown migration, 2 destination unreachable, 3 bad request)
//! ```
//!
//! - The tag `G` comes first so that a gateway and the shim (whose payloads start with `S`,
//!   `transport::handshake`) never take each other's requests or answers for their own: each
//!   refuses the other's request, and a refusal or acceptance without our tag is not ours.
//! - The request names the captured connection's original destination, which the peer gateway
//!   dials, and the migration (the VMI's uid) it belongs to, which the peer must be carrying as
//!   target. A connect request leaves the app at most 36 bytes
//!   (`wire::MAX_CONNECT_PAYLOAD`: 56 bytes of RC private data minus the transport's 20-byte
//!   header), and a VMI uid is a 36-character UUID, so the uid travels as the first 8 bytes of
//!   its SHA-256. The peer compares it with the digests of the migrations it carries as target,
//!   together with the destination address and port, so a mismatch needs a 64-bit collision
//!   among the few migrations a node carries at once *and* a destination they both name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use sha2::{Digest, Sha256};

/// First byte of every gateway payload.
pub const TAG: u8 = b'G';
/// The connect request's version.
pub const VERSION: u8 = 1;
/// Bytes of the uid digest.
pub const DIGEST_LEN: usize = 8;
/// Longest connect request (IPv6).
pub const MAX_OPEN_LEN: usize = 3 + 2 + 16 + DIGEST_LEN;

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

/// The connect request's payload: where the captured connection was going, for which
/// migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    pub destination: SocketAddr,
    pub migration: UidDigest,
}

/// The peer's answer to [`Open`] (accept: [`Answer::Ok`]; reject: any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The destination is connected: the stream carries the connection.
    Ok,
    /// No target migration with that uid and destination on the peer's node.
    UnknownMigration,
    /// The peer could not dial the destination.
    Unreachable,
    /// The request was not a gateway's (or not this version's).
    BadRequest,
}

/// A payload that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("payload too short ({0} bytes)")]
    Short(usize),
    #[error("not a gateway payload (tag {0:#04x})")]
    Tag(u8),
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("bad address family {0}")]
    Family(u8),
    #[error("unknown answer status {0}")]
    Status(u8),
}

impl Open {
    pub fn new(destination: SocketAddr, uid: &str) -> Open {
        Open {
            destination,
            migration: UidDigest::of(uid),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_OPEN_LEN);
        out.extend_from_slice(&[TAG, VERSION]);
        match self.destination.ip() {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&self.destination.port().to_be_bytes());
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&self.destination.port().to_be_bytes());
                out.extend_from_slice(&ip.octets());
            }
        }
        out.extend_from_slice(&self.migration.0);
        out
    }

    /// Decodes a whole payload (bytes after the request are ignored: room for later versions'
    /// additions).
    pub fn decode(buf: &[u8]) -> Result<Open, PayloadError> {
        let short = || PayloadError::Short(buf.len());
        let &[tag, version, family, ref rest @ ..] = buf else {
            return Err(short());
        };
        if tag != TAG {
            return Err(PayloadError::Tag(tag));
        }
        if version != VERSION {
            return Err(PayloadError::Version(version));
        }
        let ip_len = match family {
            4 => 4,
            6 => 16,
            f => return Err(PayloadError::Family(f)),
        };
        let body = rest.get(..2 + ip_len + DIGEST_LEN).ok_or_else(short)?;
        let (port, body) = body.split_at(2);
        let (ip, digest) = body.split_at(ip_len);
        let port = u16::from_be_bytes([port[0], port[1]]);
        let ip = match <[u8; 4]>::try_from(ip) {
            Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
            Err(_) => {
                let mut v6 = [0u8; 16];
                v6.copy_from_slice(ip);
                IpAddr::V6(Ipv6Addr::from(v6))
            }
        };
        let mut d = [0u8; DIGEST_LEN];
        d.copy_from_slice(digest);
        Ok(Open {
            destination: SocketAddr::new(ip, port),
            migration: UidDigest(d),
        })
    }
}

impl Answer {
    fn code(self) -> u8 {
        match self {
            Answer::Ok => 0,
            Answer::UnknownMigration => 1,
            Answer::Unreachable => 2,
            Answer::BadRequest => 3,
        }
    }

    pub fn encode(self) -> Vec<u8> {
        vec![TAG, self.code()]
    }

    pub fn decode(buf: &[u8]) -> Result<Answer, PayloadError> {
        let &[tag, status, ..] = buf else {
            return Err(PayloadError::Short(buf.len()));
        };
        if tag != TAG {
            return Err(PayloadError::Tag(tag));
        }
        match status {
            0 => Ok(Answer::Ok),
            1 => Ok(Answer::UnknownMigration),
            2 => Ok(Answer::Unreachable),
            3 => Ok(Answer::BadRequest),
            s => Err(PayloadError::Status(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_streams_transport::wire::MAX_CONNECT_PAYLOAD;

    #[test]
    fn open_round_trips_v4_and_v6_within_the_connect_payload() {
        for (dst, len) in [("10.2.0.2:49152", 17), ("[fd00::2]:1", 29)] {
            let open = Open::new(dst.parse().unwrap(), "6c0e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b");
            let bytes = open.encode();
            assert_eq!(bytes.len(), len);
            assert!(bytes.len() <= MAX_CONNECT_PAYLOAD && MAX_OPEN_LEN <= MAX_CONNECT_PAYLOAD);
            assert_eq!(Open::decode(&bytes), Ok(open));
            for cut in 0..bytes.len() {
                assert_eq!(
                    Open::decode(&bytes[..cut]),
                    Err(PayloadError::Short(cut)),
                    "cut {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.extend_from_slice(b"later");
            assert_eq!(Open::decode(&longer), Ok(open));
        }
    }

    #[test]
    fn the_digest_is_the_uids_sha256_prefix() {
        let d = UidDigest::of("u1");
        assert_eq!(d.0, Sha256::digest(b"u1")[..8]);
        assert_ne!(d, UidDigest::of("u2"));
        assert_eq!(d.to_string().len(), 16);
    }

    #[test]
    fn foreign_or_broken_payloads_are_refused() {
        // The shim's HELLO starts with 'S'.
        assert_eq!(
            Open::decode(b"S\x01\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x01\x7f\x00\x00\x01"),
            Err(PayloadError::Tag(b'S'))
        );
        assert_eq!(Open::decode(b"G\x02\x04"), Err(PayloadError::Version(2)));
        assert_eq!(Open::decode(b"G\x01\x05"), Err(PayloadError::Family(5)));
        assert_eq!(Open::decode(b""), Err(PayloadError::Short(0)));
        assert_eq!(Answer::decode(b"S\x03"), Err(PayloadError::Tag(b'S')));
        assert_eq!(Answer::decode(b"G\x09"), Err(PayloadError::Status(9)));
        assert_eq!(Answer::decode(b"G"), Err(PayloadError::Short(1)));
    }

    #[test]
    fn answers_round_trip() {
        for a in [
            Answer::Ok,
            Answer::UnknownMigration,
            Answer::Unreachable,
            Answer::BadRequest,
        ] {
            assert_eq!(Answer::decode(&a.encode()), Ok(a));
            assert_eq!(a.encode()[0], TAG);
        }
    }
}
