//! The first frame of a gateway stream and the peer's one-byte answer.
//!
//! ```text
//! open:   "RSGW" | version u8 (1) | family u8 (4|6) | port u16 BE | ip (4|16) | uid_len u8 | uid
//! answer: "RSGW" | status u8 (0 ok, 1 unknown migration, 2 destination unreachable)
//! ```
//!
//! The source gateway sends `open` right after the rsocket connects and waits for the
//! answer before it reads a byte from the captured connection, so until then it can still
//! fall back to TCP with nothing lost.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const MAGIC: [u8; 4] = *b"RSGW";
pub const VERSION: u8 = 1;
/// Longest `open` frame: header, IPv6, a 255-byte uid.
pub const MAX_OPEN_LEN: usize = 4 + 1 + 1 + 2 + 16 + 1 + 255;
pub const ANSWER_LEN: usize = 5;

/// The first frame: where the captured connection was going, for which migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    pub destination: SocketAddr,
    pub uid: String,
}

/// The peer's answer to [`Open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The destination is connected: pump.
    Ok,
    /// No target migration with that uid and destination on this node.
    UnknownMigration,
    /// The destination could not be dialed.
    Unreachable,
}

/// A frame that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic")]
    Magic,
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("bad address family {0}")]
    Family(u8),
    #[error("uid is not UTF-8 or too long")]
    Uid,
    #[error("unknown answer status {0}")]
    Status(u8),
}

impl Open {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_OPEN_LEN);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
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
        let uid = &self.uid.as_bytes()[..self.uid.len().min(255)];
        out.push(uid.len() as u8);
        out.extend_from_slice(uid);
        out
    }

    /// Decodes a frame from the start of `buf`: `Ok(None)` when more bytes are needed,
    /// else the frame and its length.
    pub fn decode(buf: &[u8]) -> Result<Option<(Open, usize)>, FrameError> {
        if buf.len() < 6 {
            return Ok(None);
        }
        if buf[..4] != MAGIC {
            return Err(FrameError::Magic);
        }
        if buf[4] != VERSION {
            return Err(FrameError::Version(buf[4]));
        }
        let ip_len = match buf[5] {
            4 => 4,
            6 => 16,
            f => return Err(FrameError::Family(f)),
        };
        let head = 6 + 2 + ip_len + 1;
        if buf.len() < head {
            return Ok(None);
        }
        let port = u16::from_be_bytes([buf[6], buf[7]]);
        let ip = &buf[8..8 + ip_len];
        let ip = if ip_len == 4 {
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
        } else {
            let mut o = [0u8; 16];
            o.copy_from_slice(ip);
            IpAddr::V6(Ipv6Addr::from(o))
        };
        let uid_len = buf[head - 1] as usize;
        if buf.len() < head + uid_len {
            return Ok(None);
        }
        let uid = std::str::from_utf8(&buf[head..head + uid_len]).map_err(|_| FrameError::Uid)?;
        Ok(Some((
            Open {
                destination: SocketAddr::new(ip, port),
                uid: uid.to_owned(),
            },
            head + uid_len,
        )))
    }
}

impl Answer {
    pub fn encode(self) -> [u8; ANSWER_LEN] {
        let code = match self {
            Answer::Ok => 0,
            Answer::UnknownMigration => 1,
            Answer::Unreachable => 2,
        };
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], code]
    }

    pub fn decode(buf: &[u8; ANSWER_LEN]) -> Result<Answer, FrameError> {
        if buf[..4] != MAGIC {
            return Err(FrameError::Magic);
        }
        match buf[4] {
            0 => Ok(Answer::Ok),
            1 => Ok(Answer::UnknownMigration),
            2 => Ok(Answer::Unreachable),
            s => Err(FrameError::Status(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_round_trips_v4_and_v6() {
        for dst in ["10.2.0.2:49152", "[fd00::2]:1"] {
            let open = Open {
                destination: dst.parse().unwrap(),
                uid: "6c0e-uid".into(),
            };
            let bytes = open.encode();
            for cut in 0..bytes.len() {
                assert_eq!(Open::decode(&bytes[..cut]), Ok(None), "cut {cut}");
            }
            let mut more = bytes.clone();
            more.extend_from_slice(b"payload");
            assert_eq!(Open::decode(&more), Ok(Some((open, bytes.len()))));
        }
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Open::decode(b"GET / HTTP/1.1"), Err(FrameError::Magic));
        assert_eq!(Open::decode(b"RSGW\x02\x04"), Err(FrameError::Version(2)));
        assert_eq!(Open::decode(b"RSGW\x01\x05"), Err(FrameError::Family(5)));
    }

    #[test]
    fn answers_round_trip() {
        for a in [Answer::Ok, Answer::UnknownMigration, Answer::Unreachable] {
            assert_eq!(Answer::decode(&a.encode()), Ok(a));
        }
        assert!(Answer::decode(b"RSGW\x09").is_err());
    }
}
