//! Fuzzing of the shim's environment values, which the pod's author sets and every shimmed
//! process reads once: `STREAMSHIM_RING_KIB` ([`ring`]), `STREAMSHIM_DIRECT_READ` and
//! `STREAMSHIM_DIRECT_WRITE` ([`direct`]), `STREAMSHIM_LOG` ([`log`]), `STREAMSHIM_STATS` (the
//! stats file template), `STREAMSHIM_PROVIDER` (where the RDMA libraries are loaded from) and
//! `STREAMSHIM_SERVICE_CIDRS` ([`services`]),
//! over arbitrary values, also not UTF-8, each checked against the rule its docs state. An
//! error is one clean line (the shim prints it as one stderr line whatever `STREAMSHIM_LOG`
//! says). `STREAMSHIM_POLICY` and `STREAMSHIM_NEGOTIATE_MS` are fuzzed with their parsers
//! ([`crate::policy`], [`crate::negotiation`]); `STREAMSHIM_DISABLE` and `STREAMSHIM_MODE` are compared after a trim
//! and a lower-casing, with nothing to parse.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;
use rdma_streams_transport::rdma::DEFAULT_PROVIDER;

use crate::settings::{DIRECT_READ_ENV, RING_ENV, SERVICE_CIDRS_ENV, provider_name};
use crate::stats::{DEFAULT_FILE_TEMPLATE, StatsSink};
use crate::{direct, log::Level, ring, services};

const LIMIT: Duration = Duration::from_secs(30);
const CASES: u32 = 5_000;

/// Any value: arbitrary bytes (often not UTF-8), or text close to what the variable expects
/// (numbers of any size, signs, units, whitespace of every kind, case).
fn value(near: &'static [&'static str]) -> impl Strategy<Value = Option<Vec<u8>>> {
    proptest::option::of(prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        (
            "[ \t\n\r\u{b}\u{c}\u{a0}\u{2003}]{0,2}",
            prop_oneof![
                proptest::sample::select(near).prop_map(str::to_owned),
                "[+-]?[0-9]{1,25}",
                "[a-zA-Z0-9%/._-]{0,12}",
            ],
            "(|k|K|KiB|m|\\.5|_0)",
            "[ \t\n]{0,2}",
        )
            .prop_map(|(a, b, c, d)| format!("{a}{b}{c}{d}").into_bytes()),
    ])
}

fn os(value: &Option<Vec<u8>>) -> Option<&OsStr> {
    value.as_deref().map(OsStr::from_bytes)
}

/// The value as the parsers read it: UTF-8 (else a replacement character), trimmed.
fn trimmed(value: &Option<Vec<u8>>) -> Option<String> {
    value.as_deref().map(|b| {
        std::str::from_utf8(b)
            .unwrap_or("\u{fffd}")
            .trim()
            .to_owned()
    })
}

#[test]
fn ring_sizes_of_any_value_are_whole_kib_in_range_or_one_line_errors() {
    fuzz::run(
        "shim env ring size",
        CASES,
        LIMIT,
        || value(&["16", "2048", "16384", "16385", "15", "0"]),
        |v| {
            let got = ring::ring_bytes_from_value(os(&v));
            let want = match trimmed(&v).as_deref() {
                None | Some("") => Some(ring::DEFAULT_RING_KIB),
                Some(t) => t
                    .parse::<usize>()
                    .ok()
                    .filter(|k| (ring::MIN_RING_KIB..=ring::MAX_RING_KIB).contains(k)),
            };
            match (got, want) {
                (Ok(bytes), Some(kib)) => prop_assert_eq!(bytes, kib * 1024),
                (Err(e), None) => {
                    prop_assert!(e.starts_with(RING_ENV), "{:?}", e);
                    prop_assert!(!e.contains(char::is_control), "{:?}", e);
                }
                (got, want) => prop_assert!(false, "{v:?}: {got:?}, want {want:?} KiB"),
            }
            Ok(())
        },
    );
}

#[test]
fn direct_switches_of_any_value_are_on_off_or_one_line_errors() {
    fuzz::run(
        "shim env direct switches",
        CASES,
        LIMIT,
        || value(&["0", "1", "true", "off", "00", "01"]),
        |v| {
            let got = direct::switch_from_value(DIRECT_READ_ENV, os(&v));
            match (trimmed(&v).as_deref(), got) {
                (None | Some("" | "1"), Ok(on)) => prop_assert!(on),
                (Some("0"), Ok(on)) => prop_assert!(!on),
                (Some(_), Err(e)) => {
                    prop_assert!(e.starts_with(DIRECT_READ_ENV), "{:?}", e);
                    prop_assert!(!e.contains(char::is_control), "{:?}", e);
                }
                (t, got) => prop_assert!(false, "{t:?}: {got:?}"),
            }
            Ok(())
        },
    );
}

#[test]
fn log_levels_of_any_value_are_a_level() {
    fuzz::run(
        "shim env log level",
        CASES,
        LIMIT,
        || value(&["info", "DEBUG", "Trace", "warn", "İnfo", "debug\u{0}"]),
        |v| {
            // `STREAMSHIM_LOG` is read with `std::env::var`: not UTF-8 reads as unset.
            let text = v
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or_default();
            let want = match text.trim().to_ascii_lowercase().as_str() {
                "info" => Level::Info,
                "debug" | "trace" => Level::Debug,
                _ => Level::Off,
            };
            prop_assert_eq!(Level::parse(text), want);
            Ok(())
        },
    );
}

/// `%p` is the pid, `%%` a `%`, every other byte itself: the documented expansion, byte by
/// byte.
fn expand(template: &[u8], pid: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some((&b, tail)) = rest.split_first() {
        match (b, tail.first()) {
            (b'%', Some(b'p')) => {
                out.extend(pid.to_string().bytes());
                rest = &tail[1..];
            }
            (b'%', Some(b'%')) => {
                out.push(b'%');
                rest = &tail[1..];
            }
            _ => {
                out.push(b);
                rest = tail;
            }
        }
    }
    out
}

#[test]
fn stats_templates_of_any_value_expand_as_documented() {
    fuzz::run(
        "shim env stats template",
        CASES,
        LIMIT,
        || {
            (
                value(&["/tmp/s-%p.json", "/tmp/", "%", "%%p", "%%%p", "/x/%q%"]),
                any::<u32>(),
            )
        },
        |(v, pid)| {
            let sink = StatsSink::from_value(os(&v));
            let Some(bytes) = v.filter(|b| !b.is_empty()) else {
                prop_assert!(sink.is_none());
                return Ok(());
            };
            let sink = sink.expect("a non-empty value names a file");
            let mut template = bytes.clone();
            if template.ends_with(b"/") {
                template.extend(DEFAULT_FILE_TEMPLATE.bytes());
            }
            prop_assert_eq!(sink.template().as_bytes(), &template[..]);
            let path = sink.path_for(pid);
            prop_assert_eq!(path.as_os_str().as_bytes(), &expand(&template, pid)[..]);
            Ok(())
        },
    );
}

#[test]
fn providers_of_any_value_are_that_name_trimmed_or_the_default() {
    fuzz::run(
        "shim env provider",
        CASES,
        LIMIT,
        || value(&["librdmacm.so.1", "/opt/rdma/lib/librdmacm.so.1", "a\0b"]),
        |v| {
            // Read with `std::env::var`: not UTF-8 reads as unset.
            let text = v.as_deref().and_then(|b| std::str::from_utf8(b).ok());
            let name = provider_name(text);
            match text.map(str::trim) {
                Some(t) if !t.is_empty() => prop_assert_eq!(name, t),
                _ => prop_assert_eq!(name, DEFAULT_PROVIDER),
            }
            Ok(())
        },
    );
}

#[test]
fn service_cidrs_of_any_value_are_at_most_16_networks_or_one_line_errors() {
    fuzz::run(
        "shim env service CIDRs",
        CASES,
        LIMIT,
        || {
            value(&[
                "10.96.0.0/12",
                "fd00::/112,10.0.0.0/8",
                "10.96.0.0/33",
                ",",
                "1.2.3.4",
            ])
        },
        |v| {
            let entries = v
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(|t| {
                    t.split(|c: char| c == ',' || c.is_whitespace())
                        .filter(|e| !e.is_empty())
                        .count()
                });
            match services::from_value(os(&v)) {
                Ok(cidrs) => {
                    prop_assert!(
                        v.is_none() || entries.is_some(),
                        "{v:?}: not UTF-8 accepted"
                    );
                    prop_assert!(entries.unwrap_or(0) <= services::MAX_CIDRS);
                    prop_assert_eq!(cidrs.is_empty(), entries.unwrap_or(0) == 0);
                }
                Err(e) => {
                    prop_assert!(e.starts_with(SERVICE_CIDRS_ENV), "{:?}", e);
                    prop_assert!(!e.contains(char::is_control), "{:?}", e);
                }
            }
            Ok(())
        },
    );
}
