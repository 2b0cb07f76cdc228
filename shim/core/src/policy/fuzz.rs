//! Fuzzing of the policy file (`STREAMSHIM_POLICY`), which the pod's author writes and the shim
//! reads in every process: [`Policy::parse`] and [`Policy::load`] over arbitrary text and
//! bytes, over valid policies with bytes mutated and with any value replaced by a hostile one
//! (huge, negative and non-finite numbers, tags, aliases, unicode, long strings, deep
//! nesting); the strings inside it (CIDRs, port ranges, program globs) and the variable itself.
//!
//! Whatever the input: no panic, an error is one line, and a policy that parses is written back
//! (by [`encode`], a test-only writer of the documented format) and parses to the same policy.
//! Deep nesting, alias bombs and a file of the largest size read are answered in bounded time.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;
use serde_json::{Value, json};

use super::*;

const LIMIT: Duration = Duration::from_secs(30);

/// Valid policies in the shapes people write: the documented example, flow and JSON forms,
/// IPv6 and mapped addresses, nulls, anchors and aliases, comments, an explicit document.
const SEEDS: &[&str] = &[
    super::tests::FULL,
    r#"{"version": 1, "programs": ["python3.?"], "loopback": true,
        "client": {"allow": [{"cidr": "::ffff:10.0.0.0/104", "ports": ["1-65535"]}]},
        "server": {"enabled": false, "deny": [{}]}}"#,
    "---\nprograms:\nexclude_programs: ~\nclient:\n  allow:\n  deny: null\nserver:\n",
    "client:\n  allow:\n    - cidr: 2001:db8::/32\n      ports: &p [443, \"8443-8444\"]\n    - cidr: 192.0.2.1\n      ports: *p\n",
    "server: {allow: [{cidr: 0.0.0.0/0}, {cidr: \"::/0\", ports: [0]}]}\n...\n",
    "",
];

/// A policy in the documented format (flow style; strings double-quoted with every
/// non-printable or non-ASCII character escaped), for the round trip.
fn encode(p: &Policy) -> String {
    fn quoted(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                ' '..='~' => out.push(c),
                c if u32::from(c) <= 0xffff => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push_str(&format!("\\U{:08x}", u32::from(c))),
            }
        }
        out.push('"');
        out
    }
    fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
        format!("[{}]", items.iter().map(f).collect::<Vec<_>>().join(", "))
    }
    let rule = |r: &Rule| {
        let cidr = r.cidr.map_or("null".to_owned(), |c| quoted(&c.to_string()));
        let ports = list(&r.ports, |p| quoted(&p.to_string()));
        format!("{{cidr: {cidr}, ports: {ports}}}")
    };
    let role = |r: &RolePolicy| {
        format!(
            "{{enabled: {}, allow: {}, deny: {}}}",
            r.enabled,
            list(&r.allow, rule),
            list(&r.deny, rule)
        )
    };
    format!(
        "version: 1\nprograms: {}\nexclude_programs: {}\nloopback: {}\nclient: {}\nserver: {}\n",
        list(&p.programs, |g| quoted(g.as_str())),
        list(&p.exclude_programs, |g| quoted(g.as_str())),
        p.loopback,
        role(&p.client),
        role(&p.server),
    )
}

/// Addresses and names the checks are asked about.
const PEERS: &[&str] = &[
    "10.0.5.7:5201",
    "10.1.2.3:8050",
    "[::ffff:10.0.5.7]:22",
    "[fd00::1]:443",
    "127.0.0.1:1",
    "[::]:0",
    "255.255.255.255:65535",
];
const NAMES: &[&str] = &[
    "iperf3",
    "qemu-system-x86_64",
    "",
    "/usr/bin/sshd",
    "python3.9",
];

/// The properties every parse result has: an error is one line with a sane location; a policy
/// answers its checks and survives [`encode`] and a second parse unchanged.
fn check(text: &str, parsed: Result<Policy, PolicyError>) -> Result<(), TestCaseError> {
    match parsed {
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(
                !msg.contains(char::is_control),
                "not one clean line: {:?}",
                msg
            );
            if let Some((line, column)) = e.location() {
                prop_assert!(
                    line >= 1 && column >= 1,
                    "{:?} for {:?}",
                    (line, column),
                    text
                );
            }
        }
        Ok(p) => {
            for peer in PEERS {
                let peer: SocketAddr = peer.parse().unwrap();
                let _ = p.client_allows(peer);
                let _ = p.server_allows(peer.port(), peer.ip());
            }
            let _ = p.program_allowed_any(NAMES);
            let again = encode(&p);
            match Policy::parse(&again) {
                Ok(q) => prop_assert_eq!(q, p, "{:?} rewritten as {:?}", text, again),
                Err(e) => prop_assert!(false, "{text:?} rewritten as {again:?}: {e}"),
            }
        }
    }
    Ok(())
}

#[test]
fn the_seeds_are_valid_policies_and_survive_the_rewrite() {
    rdma_streams_testkit::within(BOUND, || {
        for seed in SEEDS {
            let p = Policy::parse(seed).unwrap_or_else(|e| panic!("{seed:?}: {e}"));
            assert_eq!(Policy::parse(&encode(&p)).unwrap(), p, "{seed:?}");
            assert!(
                rdma_streams_yaml::from_str::<Value>(seed).is_ok(),
                "{seed:?}"
            );
        }
    });
}

#[test]
fn arbitrary_text_is_a_policy_or_a_one_line_error() {
    fuzz::run(
        "policy arbitrary text",
        2_000,
        LIMIT,
        fuzz::yaml_text,
        |text| check(&text, Policy::parse(&text)),
    );
}

#[test]
fn mutated_policies_parse_or_fail_in_one_line() {
    fuzz::run(
        "policy mutated files",
        2_000,
        LIMIT,
        || {
            fuzz::mutated_text(
                SEEDS.iter().map(|s| (*s).to_owned()).collect(),
                fuzz::TOKENS,
            )
        },
        |text| check(&text, Policy::parse(&text)),
    );
}

#[test]
fn policies_with_a_hostile_value_anywhere_parse_or_fail_in_one_line() {
    let seeds: Vec<Value> = SEEDS
        .iter()
        .filter_map(|s| rdma_streams_yaml::from_str::<Value>(s).ok())
        .filter(|v| !v.is_null())
        .collect();
    assert_eq!(seeds.len(), 5, "every seed but the empty one is a document");
    fuzz::run(
        "policy hostile values",
        1_000,
        LIMIT,
        move || proptest::sample::select(seeds).prop_flat_map(fuzz::replaced_text),
        |text| check(&text, Policy::parse(&text)),
    );
}

#[test]
fn policy_files_of_arbitrary_bytes_load_or_fail_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    fuzz::run(
        "policy files",
        300,
        LIMIT,
        || fuzz::mutated_files(SEEDS),
        move |bytes| {
            std::fs::write(&path, &bytes).unwrap();
            let loaded = Policy::load(&path);
            if std::str::from_utf8(&bytes).is_err() {
                prop_assert!(
                    matches!(loaded, Err(PolicyError::Read { .. })),
                    "{loaded:?}"
                );
            }
            check(&String::from_utf8_lossy(&bytes), loaded)
        },
    );
}

#[test]
fn the_policy_variable_of_any_value_names_that_file_or_none() {
    fuzz::run(
        "policy variable",
        2_000,
        LIMIT,
        || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        |value| {
            let source = PolicySource::from_value(value.as_deref().map(OsStr::from_bytes));
            match value.as_deref() {
                None | Some([]) => prop_assert_eq!(source, PolicySource::Default),
                Some(bytes) => {
                    prop_assert_eq!(
                        &source,
                        &PolicySource::File(OsStr::from_bytes(bytes).into())
                    );
                    // A path that cannot be opened (or is not a policy) is a one-line error.
                    if let Err(e) = source.load() {
                        let msg = e.to_string();
                        prop_assert!(
                            !msg.contains(char::is_control),
                            "not one clean line: {:?}",
                            msg
                        );
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn cidr_and_port_texts_round_trip_or_fail() {
    let text = prop_oneof![
        "(?s).{0,40}",
        // Address-shaped: digits, hex, dots, colons, brackets, signs, a prefix of any size.
        (
            "[0-9a-fA-F:.\\[\\]%+ -]{0,40}",
            proptest::option::of("[0-9+ -]{0,6}")
        )
            .prop_map(|(a, p)| p.map_or(a.clone(), |p| format!("{a}/{p}"))),
        (any::<IpAddr>(), any::<u16>()).prop_map(|(ip, p)| format!("{ip}/{p}")),
        (any::<u32>(), any::<u32>()).prop_map(|(a, b)| format!("{a}-{b}")),
        any::<i64>().prop_map(|n| n.to_string()),
    ];
    fuzz::run(
        "policy cidr and ports",
        5_000,
        LIMIT,
        move || text,
        |s| {
            if let Ok(c) = s.parse::<Cidr>() {
                prop_assert_eq!(c.to_string().parse::<Cidr>(), Ok(c), "{:?}", s);
                prop_assert!(c.contains(c.network()), "{}", c);
            }
            if let Ok(r) = s.parse::<PortRange>() {
                prop_assert!(r.lo <= r.hi, "{:?}", r);
                prop_assert_eq!(r.to_string().parse::<PortRange>(), Ok(r), "{:?}", s);
            }
            Ok(())
        },
    );
}

/// Whether `pat` matches all of `s` (`*` any run of bytes, `?` one byte): the textbook table.
fn glob_model(pat: &[u8], s: &[u8]) -> bool {
    // m[i][j]: pat[i..] matches s[j..].
    let mut m = vec![vec![false; s.len() + 1]; pat.len() + 1];
    m[pat.len()][s.len()] = true;
    for i in (0..pat.len()).rev() {
        for j in (0..=s.len()).rev() {
            m[i][j] = match pat[i] {
                b'*' => m[i + 1][j] || (j < s.len() && m[i][j + 1]),
                c => j < s.len() && (c == b'?' || c == s[j]) && m[i + 1][j + 1],
            };
        }
    }
    m[0][0]
}

#[test]
fn program_globs_match_as_the_textbook_says() {
    fuzz::run(
        "policy program globs",
        5_000,
        LIMIT,
        || ("[ab*?/]{0,10}", "[ab]{0,12}"),
        |(pattern, name)| {
            match ProgramPattern::new(&pattern) {
                Err(_) => prop_assert!(pattern.is_empty() || pattern.contains('/')),
                Ok(p) => prop_assert_eq!(
                    p.matches(&name),
                    glob_model(pattern.as_bytes(), name.as_bytes()),
                    "{:?} against {:?}",
                    pattern,
                    name
                ),
            }
            Ok(())
        },
    );
}

// === Inputs that must be refused (or read) in bounded time ===

const BOUND: Duration = Duration::from_secs(10);

#[test]
fn nesting_ten_thousand_deep_is_refused_quickly() {
    let deep = 10_000;
    let texts = [
        format!("programs: {}", fuzz::nested_text(deep, false)),
        format!("client: {{allow: {}}}", fuzz::nested_text(deep, true)),
        fuzz::nested_text(deep, false),
        fuzz::nested_text(deep, true),
        format!("programs: {}x", "- ".repeat(deep)),
        // Block style: a sequence in a sequence in ..., one level per line (the text grows with
        // the square of the depth, so fewer levels).
        (0..1_000).fold("programs:\n".to_owned(), |mut s, level| {
            s.push_str(&" ".repeat(level));
            s.push_str("-\n");
            s
        }),
    ];
    for text in texts {
        let head: String = text.chars().take(24).collect();
        let (parsed, _) = fuzz::timed(&format!("policy nested {head:?}"), BOUND, move || {
            Policy::parse(&text).map(|_| ())
        });
        assert!(parsed.is_err(), "{head:?}");
    }
}

/// unsafe-libyaml (behind serde_yaml, the parser before serde-saphyr) scanned flow collections
/// nested n deep in O(n²) time and worse: 320 KiB of `{a: ` took 32.5 s in a release build (the
/// shim parses the policy in every process it is loaded into, at the first socket call). The
/// parser now refuses such nesting as it scans.
#[test]
fn regression_deeply_nested_flow_mappings_took_minutes_to_refuse() {
    let mib = MAX_POLICY_BYTES as usize;
    let texts = [
        "{a: ".repeat(mib / 4),
        format!("client: {{allow: [{}", "{cidr: ".repeat(mib / 8)),
        "[{a: ".repeat(mib / 5),
        // Hidden from a count of brackets that skips strings: `"]"` is a string here.
        "[ \"]\" ,".repeat(mib / 7),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (n, text) in texts.into_iter().enumerate() {
        let path = dir.path().join(format!("policy-{n}.yaml"));
        std::fs::write(&path, &text).unwrap();
        let head: String = text.chars().take(16).collect();
        let (loaded, _) = fuzz::timed(&format!("policy of 1 MiB of {head:?}"), BOUND, move || {
            Policy::load(&path).map(|_| ()).map_err(|e| e.to_string())
        });
        let e = loaded.unwrap_err();
        assert!(e.contains("recursion limit exceeded"), "{e}");
    }
    // As deep as is let through, with the rest of the mebibyte inside: slower than a flat
    // file, but linear.
    let depth = rdma_streams_yaml::MAX_FLOW_DEPTH;
    let items = "10.0.0.1, ".repeat((mib - 8 * depth) / 10);
    let text = format!(
        "programs: {}[{items}]{}",
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    );
    assert!(text.len() <= mib);
    let (parsed, _) = fuzz::timed(
        "policy of 1 MiB at the deepest nesting let through",
        BOUND,
        move || Policy::parse(&text).map(|_| ()).map_err(|e| e.to_string()),
    );
    assert!(parsed.is_err(), "a list of lists is not a program name");
}

#[test]
fn regression_a_policy_path_with_a_line_break_was_reported_on_two_lines() {
    rdma_streams_testkit::within(BOUND, || {
        // The shim prints the error as one stderr line; a `STREAMSHIM_POLICY` with a line break
        // (or an escape sequence) in it split it, or reached the terminal.
        for value in ["/etc/policy\n.yaml", "/etc/\u{1b}[2Jpolicy.yaml", "\r"] {
            let e = PolicySource::from_value(Some(OsStr::new(value)))
                .load()
                .unwrap_err();
            let msg = e.to_string();
            assert!(!msg.contains(char::is_control), "{msg:?}");
            assert!(
                msg.starts_with("policy /etc/") || msg.starts_with("policy \\r"),
                "{msg:?}"
            );
        }
        // The same for a control character spelled in the policy and quoted back in the error.
        let e = Policy::parse("\"\\e[2Jx\": 1\n").unwrap_err().to_string();
        assert!(!e.contains(char::is_control), "{e:?}");
        assert!(e.contains("\\u{1b}[2Jx"), "{e:?}");
    });
}

#[test]
fn an_alias_bomb_is_refused_quickly() {
    // Nine levels of ten: a billion strings if every alias were expanded.
    let mut text =
        String::from("programs: [&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]");
    for level in 1..9 {
        let prev = level - 1;
        text.push_str(&format!(
            ", &a{level} [{}]",
            vec![format!("*a{prev}"); 10].join(", ")
        ));
    }
    text.push_str("]\n");
    let (parsed, _) = fuzz::timed("policy alias bomb", BOUND, move || {
        Policy::parse(&text).map(|_| ())
    });
    assert!(parsed.is_err());
}

#[test]
fn a_policy_of_the_largest_size_read_loads_in_bounded_time() {
    // Rules up to just under MAX_POLICY_BYTES: every one is read and checked.
    let mut text = String::from("client:\n  deny:\n");
    let mut n = 0u32;
    let rule = |n: u32| {
        format!(
            "    - {{cidr: 10.{}.{}.0/24, ports: [{}, \"{}-65535\"]}}\n",
            n / 256 % 256,
            n % 256,
            n % 65_536,
            n % 65_536
        )
    };
    while text.len() + rule(n).len() <= MAX_POLICY_BYTES as usize {
        text.push_str(&rule(n));
        n += 1;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, &text).unwrap();
    let (loaded, _) = fuzz::timed(
        &format!("policy of {} bytes, {n} rules", text.len()),
        BOUND,
        move || {
            let p = Policy::load(&path).map_err(|e| e.to_string())?;
            // Every check walks every rule.
            Ok::<_, String>((
                p.client.deny.len(),
                p.client_allows("192.0.2.1:80".parse().unwrap()),
            ))
        },
    );
    assert_eq!(loaded, Ok((n as usize, true)));
}

#[test]
fn a_value_of_json_null_everywhere_reads_as_absent() {
    rdma_streams_testkit::within(BOUND, || {
        // Nulls are the one hostile value every field takes (as "absent"), so spell it out.
        let doc = json!({"programs": null, "exclude_programs": null, "client": null, "server": {"allow": null, "deny": null}, "version": null});
        assert_eq!(
            Policy::parse(&doc.to_string()).unwrap(),
            Policy::allow_all()
        );
    });
}
