//! Fuzzing of what a peer or the environment hands the handshake: [`Message::decode`] over
//! arbitrary bytes, over mutated valid messages and over messages built from arbitrary field
//! values, each checked against a model of the documented layout, and the
//! `STREAMSHIM_NEGOTIATE_MS` parser over arbitrary values (also not UTF-8).
//!
//! Every accepted payload starts with the encoding of what it decoded to: the decoder reads
//! exactly the message's bytes, so `encode(decode(x))` is `x` up to the trailing bytes it
//! ignores.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;

use super::*;

const LIMIT: Duration = Duration::from_secs(30);

/// The decoder as the table in the module docs reads: tag, type, then the type's fields in
/// order; a short payload is `Truncated` at the first field that does not fit (an address's
/// family and port come before its family is judged).
fn model(b: &[u8]) -> Result<Message, Invalid> {
    let field = |at: usize, len: usize| b.get(at..at + len).ok_or(Invalid::Truncated);
    let u64_at = |at| field(at, 8).map(|f| u64::from_be_bytes(f.try_into().unwrap()));
    if field(0, 1)?[0] != TAG {
        return Err(Invalid::NotShim);
    }
    match field(1, 1)?[0] {
        TYPE_HELLO => {
            let flags = field(2, 1)?[0];
            let nonce = u64_at(3)?;
            let family = field(11, 1)?[0];
            let port = u16::from_be_bytes(field(12, 2)?.try_into().unwrap());
            let ip = match family {
                FAMILY_V4 => IpAddr::from(<[u8; 4]>::try_from(field(14, 4)?).unwrap()),
                FAMILY_V6 => IpAddr::from(<[u8; 16]>::try_from(field(14, 16)?).unwrap()),
                other => return Err(Invalid::BadFamily(other)),
            };
            Ok(Message::Hello(Hello {
                flags,
                nonce,
                client: SocketAddr::new(ip, port),
            }))
        }
        TYPE_ACCEPT => Ok(Message::Accept { nonce: u64_at(2)? }),
        TYPE_REFUSE => Ok(Message::Refuse {
            nonce: u64_at(2)?,
            code: u16::from_be_bytes(field(10, 2)?.try_into().unwrap()),
        }),
        other => Err(Invalid::UnknownType(other)),
    }
}

/// Decodes `bytes`, checks the answer against [`model`], and that an accepted payload starts
/// with the encoding of its message.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let decoded = Message::decode(bytes);
    prop_assert_eq!(decoded, model(bytes), "{:02x?}", bytes);
    if let Ok(message) = decoded {
        let encoded = message.encode();
        prop_assert!(
            bytes.starts_with(&encoded),
            "{:02x?} decoded to {:?}, which encodes as {:02x?}",
            bytes,
            message,
            encoded
        );
    }
    Ok(())
}

#[test]
fn arbitrary_payloads_decode_as_the_layout_says() {
    fuzz::run(
        "handshake arbitrary payloads",
        10_000,
        LIMIT,
        || {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..64),
                // The shim's tag and a known type, so most cases reach the fields.
                (1u8..=3, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(t, rest)| {
                    let mut b = vec![TAG, t];
                    b.extend(rest);
                    b
                }),
            ]
        },
        |bytes| check(&bytes),
    );
}

/// Valid HELLOs (both families, extreme nonces and ports), ACCEPTs and REFUSEs.
fn seeds() -> Vec<Vec<u8>> {
    let hello = |flags, nonce, client: &str| {
        Message::Hello(Hello {
            flags,
            nonce,
            client: client.parse().unwrap(),
        })
    };
    [
        hello(0, 1, "198.18.0.2:40000"),
        hello(0xff, u64::MAX, "0.0.0.0:0"),
        hello(0, 0, "255.255.255.255:65535"),
        hello(1, 42, "[fd00::1:2:3:4]:5201"),
        hello(0x80, u64::MAX, "[::ffff:10.0.0.1]:1"),
        Message::Accept { nonce: 0 },
        Message::Accept { nonce: u64::MAX },
        Message::refuse(7, Reason::Policy),
        Message::Refuse {
            nonce: u64::MAX,
            code: u16::MAX,
        },
    ]
    .iter()
    .map(Message::encode)
    .collect()
}

/// Bytes that are meaningful in the layout: the tag, the type and family bytes, a nonce of
/// zeros.
const LAYOUT_TOKENS: &[&str] = &[
    "S",
    "\u{1}",
    "\u{2}",
    "\u{3}",
    "\u{4}",
    "\u{5}",
    "\u{6}",
    "\0\0\0\0\0\0\0\0",
    "G",
];

#[test]
fn mutated_messages_decode_as_the_layout_says() {
    fuzz::run(
        "handshake mutated messages",
        5_000,
        LIMIT,
        || fuzz::mutated(seeds(), LAYOUT_TOKENS),
        |bytes| check(&bytes),
    );
}

#[test]
fn messages_of_arbitrary_fields_decode_as_the_layout_says() {
    // Every field of every message at an arbitrary value (a wrong tag, type or family among
    // them), the address cut to an arbitrary length, and trailing bytes.
    fuzz::run(
        "handshake arbitrary fields",
        10_000,
        LIMIT,
        || {
            (
                prop_oneof![Just(TAG), any::<u8>()],
                prop_oneof![1u8..=3, any::<u8>()],
                any::<u8>(),
                any::<u64>(),
                prop_oneof![Just(FAMILY_V4), Just(FAMILY_V6), any::<u8>()],
                any::<u16>(),
                proptest::collection::vec(any::<u8>(), 0..=20),
                proptest::collection::vec(any::<u8>(), 0..4),
            )
                .prop_map(|(tag, ty, flags, nonce, family, port, ip, tail)| {
                    let mut b = vec![tag, ty];
                    if ty == TYPE_HELLO {
                        b.push(flags);
                    }
                    b.extend(nonce.to_be_bytes());
                    if ty == TYPE_HELLO {
                        b.push(family);
                    }
                    b.extend(port.to_be_bytes());
                    if ty == TYPE_HELLO {
                        b.extend(ip);
                    }
                    b.extend(tail);
                    b
                })
        },
        |bytes| check(&bytes),
    );
}

#[test]
fn negotiate_timeouts_of_arbitrary_values_are_bounded() {
    let value = prop_oneof![
        // Anything, also not UTF-8.
        proptest::collection::vec(any::<u8>(), 0..32),
        // Numbers of any size with whitespace, signs, separators and units around them.
        (
            "[ \t\n\u{a0}\u{2003}]{0,2}",
            "[+-]?",
            "[0-9]{1,25}",
            "(|ms|s|_000|\\.5|e3)",
            "[ \t\n]{0,2}",
        )
            .prop_map(|(a, s, n, u, z)| format!("{a}{s}{n}{u}{z}").into_bytes()),
    ];
    fuzz::run(
        "negotiate timeout values",
        5_000,
        LIMIT,
        move || proptest::option::of(value),
        |bytes| {
            let got = negotiate_timeout_from_value(bytes.as_deref().map(OsStr::from_bytes));
            prop_assert!(
                got > Duration::ZERO && got <= MAX_NEGOTIATE_TIMEOUT,
                "{got:?}"
            );
            let plain = bytes
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()));
            match plain.map(str::parse::<u64>) {
                Some(Ok(ms)) if ms > 0 => {
                    prop_assert_eq!(got, Duration::from_millis(ms).min(MAX_NEGOTIATE_TIMEOUT));
                }
                _ => prop_assert_eq!(got, DEFAULT_NEGOTIATE_TIMEOUT),
            }
            Ok(())
        },
    );
}
