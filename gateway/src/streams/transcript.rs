//! What the two gateways' MACs cover: the [`Transcript`] of one stream's opening, and the
//! HMAC-SHA256 tags over it (truncated to [`TAG_LEN`] bytes).
//!
//! ```text
//! HMAC-SHA256(key, label | source nonce (16) | target nonce (16) | port u16 BE | uid digest (8)
//!                  | destination ip | source gateway ip | target gateway ip)[..16]
//! label: "rdma-streams gateway v2 proof\0" (the source's proof)
//!        "rdma-streams gateway v2 accept\0" (the target's accept)
//! ip:    family byte (4 | 6) | 16 bytes (IPv4: its 4 bytes, then 12 zero bytes);
//!        IPv4-mapped IPv6 addresses count as IPv4
//! ```
//!
//! Every field has a fixed length, so no two transcripts encode alike; the labels keep a
//! proof from passing as an accept and the reverse. Both nonces make each tag fresh for both
//! sides (neither can be replayed); the addresses bind the tags to the two gateways' RDMA
//! addresses as each sees them (a proof relayed from another address fails) and to the
//! destination the source captured (which the target takes from its own migration).

use std::net::IpAddr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{
    keys::{PeerKey, PeerKeys},
    payload::UidDigest,
};

/// Bytes of each side's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a tag on the wire (HMAC-SHA256 truncated).
pub const TAG_LEN: usize = 16;

/// A side's fresh random nonce.
pub type Nonce = [u8; NONCE_LEN];

/// A fresh random nonce (`getrandom`); None when the kernel gives none.
pub fn random_nonce() -> Option<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).ok()?;
    Some(n)
}
/// A truncated HMAC.
pub type Tag = [u8; TAG_LEN];

/// Who a tag speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// The source's proof (second connect request).
    Proof,
    /// The target's accept.
    Accept,
}

impl Label {
    fn bytes(self) -> &'static [u8] {
        match self {
            Label::Proof => b"rdma-streams gateway v2 proof\0",
            Label::Accept => b"rdma-streams gateway v2 accept\0",
        }
    }
}

/// One stream opening, as both gateways know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    pub source_nonce: Nonce,
    pub target_nonce: Nonce,
    /// The destination port (one the migration published).
    pub port: u16,
    pub migration: UidDigest,
    /// The destination address (the migration's target address).
    pub destination: IpAddr,
    /// The source gateway's RDMA address.
    pub source_gateway: IpAddr,
    /// The target gateway's RDMA address.
    pub target_gateway: IpAddr,
}

fn put_ip(mac: &mut Hmac<Sha256>, ip: IpAddr) {
    let mut out = [0u8; 17];
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out[0] = 6;
            out[1..].copy_from_slice(&v6.octets());
        }
    }
    mac.update(&out);
}

impl Transcript {
    fn mac(&self, key: &PeerKey, label: Label) -> Hmac<Sha256> {
        #[allow(
            clippy::expect_used,
            reason = "HMAC takes keys of any length: new_from_slice never fails"
        )]
        let mut mac =
            Hmac::<Sha256>::new_from_slice(key.bytes()).expect("HMAC takes any key length");
        mac.update(label.bytes());
        mac.update(&self.source_nonce);
        mac.update(&self.target_nonce);
        mac.update(&self.port.to_be_bytes());
        mac.update(&self.migration.0);
        put_ip(&mut mac, self.destination);
        put_ip(&mut mac, self.source_gateway);
        put_ip(&mut mac, self.target_gateway);
        mac
    }

    /// The tag of `label` under `key`.
    pub fn tag(&self, key: &PeerKey, label: Label) -> Tag {
        let full = self.mac(key, label).finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// The first of `keys` under which `tag` is this transcript's tag of `label`. Every key is
    /// tried (and each comparison is constant-time), whichever matches.
    pub fn verify<'k>(&self, keys: &'k PeerKeys, label: Label, tag: &Tag) -> Option<&'k PeerKey> {
        let mut found = None;
        for key in keys.all() {
            let ok = self.mac(key, label).verify_truncated_left(tag).is_ok();
            if ok && found.is_none() {
                found = Some(key);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PeerKey {
        PeerKey::new(vec![b; 32]).unwrap()
    }

    fn transcript() -> Transcript {
        Transcript {
            source_nonce: [1; NONCE_LEN],
            target_nonce: [2; NONCE_LEN],
            port: 49152,
            migration: UidDigest::of("u1"),
            destination: "10.2.0.2".parse().unwrap(),
            source_gateway: "198.18.0.1".parse().unwrap(),
            target_gateway: "198.18.0.2".parse().unwrap(),
        }
    }

    #[test]
    fn the_tag_is_truncated_hmac_sha256_of_the_documented_layout() {
        let t = transcript();
        let mut input = b"rdma-streams gateway v2 proof\0".to_vec();
        input.extend([1; 16]);
        input.extend([2; 16]);
        input.extend(49152u16.to_be_bytes());
        input.extend(UidDigest::of("u1").0);
        for ip in [[10, 2, 0, 2], [198, 18, 0, 1], [198, 18, 0, 2]] {
            input.push(4);
            input.extend(ip);
            input.extend([0; 12]);
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&[7; 32]).unwrap();
        mac.update(&input);
        let want = mac.finalize().into_bytes();
        assert_eq!(t.tag(&key(7), Label::Proof), want[..16]);
    }

    #[test]
    fn any_listed_key_verifies_and_every_field_counts() {
        let t = transcript();
        let keys = PeerKeys::new(vec![key(1), key(2)]);
        let by_second = t.tag(&key(2), Label::Proof);
        assert_eq!(t.verify(&keys, Label::Proof, &by_second), Some(&key(2)));
        // Another key, the other label, or any field changed: no match.
        assert_eq!(
            t.verify(&keys, Label::Proof, &t.tag(&key(3), Label::Proof)),
            None
        );
        assert_eq!(t.verify(&keys, Label::Accept, &by_second), None);
        let changed = [
            Transcript {
                source_nonce: [9; 16],
                ..t
            },
            Transcript {
                target_nonce: [9; 16],
                ..t
            },
            Transcript { port: 49153, ..t },
            Transcript {
                migration: UidDigest::of("u2"),
                ..t
            },
            Transcript {
                destination: "10.2.0.3".parse().unwrap(),
                ..t
            },
            Transcript {
                source_gateway: "198.18.0.9".parse().unwrap(),
                ..t
            },
            Transcript {
                target_gateway: "198.18.0.9".parse().unwrap(),
                ..t
            },
            // The two gateways swapped.
            Transcript {
                source_gateway: t.target_gateway,
                target_gateway: t.source_gateway,
                ..t
            },
        ];
        for other in changed {
            assert_eq!(
                other.verify(&keys, Label::Proof, &by_second),
                None,
                "{other:?}"
            );
        }
        assert_eq!(
            t.verify(&PeerKeys::default(), Label::Proof, &by_second),
            None
        );
    }

    #[test]
    fn a_mapped_ipv4_address_is_the_same_address() {
        let t = transcript();
        let mapped = Transcript {
            target_gateway: "::ffff:198.18.0.2".parse().unwrap(),
            ..t
        };
        assert_eq!(
            t.tag(&key(1), Label::Accept),
            mapped.tag(&key(1), Label::Accept)
        );
    }
}
