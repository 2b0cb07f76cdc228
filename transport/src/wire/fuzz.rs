//! Fuzzing of what a peer sends the transport: the connection manager's private data of each
//! kind and the control messages, over arbitrary bytes and over mutated valid messages. No
//! panic; an accepted message is within the documented bounds and encodes back to itself.

use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;

use super::*;

const LIMIT: Duration = Duration::from_secs(30);

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Connect), Just(Kind::Accept), Just(Kind::Reject)]
}

fn ring_info() -> impl Strategy<Value = RingInfo> {
    (
        any::<u64>(),
        any::<u32>(),
        MIN_RING_LOG..=MAX_RING_LOG,
        2u16..,
    )
        .prop_map(|(addr, rkey, size_log, receives)| RingInfo {
            addr,
            rkey,
            size_log,
            receives,
        })
}

fn control_kind() -> impl Strategy<Value = ControlKind> {
    prop_oneof![
        Just(ControlKind::Credit),
        Just(ControlKind::Fin),
        any::<[u8; SECRET_LEN]>().prop_map(|s| ControlKind::Claim(Secret(s))),
        Just(ControlKind::Confirm),
        any::<u64>().prop_map(ControlKind::Urgent),
    ]
}

/// What every accepted private data satisfies.
fn check_private_data(bytes: &[u8], k: Kind) -> Result<(), TestCaseError> {
    if let Ok(d) = PrivateData::decode(bytes, k) {
        prop_assert_eq!(d.kind, k);
        prop_assert!(d.payload.len() <= (bytes.len() - HEADER_LEN).min(MAX_PAYLOAD));
        if k != Kind::Reject {
            prop_assert!((MIN_RING_LOG..=MAX_RING_LOG).contains(&d.ring.size_log));
            prop_assert!(d.ring.receives >= 2);
        }
        let again = PrivateData::encode(k, d.ring, &d.payload);
        prop_assert_eq!(PrivateData::decode(&again, k).ok(), Some(d));
    }
    Ok(())
}

#[test]
fn arbitrary_private_data_decodes_or_is_refused() {
    fuzz::run(
        "wire arbitrary private data",
        5_000,
        LIMIT,
        || (proptest::collection::vec(any::<u8>(), 0..256), kind()),
        |(bytes, k)| check_private_data(&bytes, k),
    );
}

#[test]
fn mutated_private_data_decodes_or_is_refused() {
    fuzz::run(
        "wire mutated private data",
        3_000,
        LIMIT,
        || {
            (
                kind(),
                ring_info(),
                proptest::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD),
            )
                .prop_flat_map(|(k, ring, payload)| {
                    let ring = if k == Kind::Reject {
                        RingInfo::default()
                    } else {
                        ring
                    };
                    let valid = PrivateData::encode(k, ring, &payload);
                    (
                        Just(k),
                        Just(valid.clone()),
                        fuzz::mutated(vec![valid], &[]),
                    )
                })
        },
        |(k, valid, mutated)| {
            // The valid one round-trips, also padded with zeros as IB CMs pad it.
            let d =
                PrivateData::decode(&valid, k).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(PrivateData::encode(k, d.ring, &d.payload), valid.clone());
            let mut padded = valid.clone();
            padded.resize(valid.len() + 36, 0);
            prop_assert_eq!(PrivateData::decode(&padded, k).ok(), Some(d));
            check_private_data(&mutated, k)
        },
    );
}

#[test]
fn arbitrary_control_messages_decode_or_are_refused() {
    fuzz::run(
        "wire arbitrary control messages",
        5_000,
        LIMIT,
        || proptest::collection::vec(any::<u8>(), 0..96),
        |bytes| {
            let decoded = Control::decode(&bytes);
            prop_assert!(decoded.is_none() || bytes.len() == CONTROL_LEN);
            if let Some(c) = decoded {
                prop_assert_eq!(Control::decode(&c.encode()), Some(c));
            }
            Ok(())
        },
    );
}

#[test]
fn valid_control_messages_round_trip_and_survive_flips() {
    fuzz::run(
        "wire control messages",
        5_000,
        LIMIT,
        || {
            (
                control_kind(),
                any::<u64>(),
                any::<u64>(),
                any::<(usize, u8)>(),
            )
        },
        |(kind, consumed, reposted, flip)| {
            let c = Control {
                kind,
                consumed,
                reposted,
            };
            let bytes = c.encode();
            prop_assert_eq!(Control::decode(&bytes), Some(c));
            let mut flipped = bytes;
            flipped[flip.0 % CONTROL_LEN] ^= flip.1;
            if let Some(d) = Control::decode(&flipped) {
                prop_assert_eq!(Control::decode(&d.encode()), Some(d));
            }
            Ok(())
        },
    );
}

#[test]
fn reuse_messages_round_trip_and_survive_flips() {
    fuzz::run(
        "wire reuse messages",
        2_000,
        LIMIT,
        || {
            (
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..=MAX_REUSE_PAYLOAD),
                any::<(usize, u8)>(),
            )
        },
        |(reuse, bytes, flip)| {
            let payload = Payload::new(&bytes).expect("within the bound");
            let kind = if reuse {
                ControlKind::Reuse(payload)
            } else {
                ControlKind::Reused(payload)
            };
            let c = Control {
                kind,
                consumed: 0,
                reposted: 0,
            };
            let encoded = c.encode();
            prop_assert_eq!(Control::decode(&encoded), Some(c));
            let mut flipped = encoded;
            flipped[flip.0 % CONTROL_LEN] ^= flip.1;
            if let Some(d) = Control::decode(&flipped) {
                if let ControlKind::Reuse(p) | ControlKind::Reused(p) = d.kind {
                    prop_assert!(p.bytes().len() <= MAX_REUSE_PAYLOAD);
                }
                prop_assert_eq!(Control::decode(&d.encode()), Some(d));
            }
            Ok(())
        },
    );
}
