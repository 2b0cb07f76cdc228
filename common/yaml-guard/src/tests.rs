//! The check against libyaml: real nesting is always seen (also behind quotes, comments,
//! anchors, tags and plain scalars that hide brackets), ordinary documents pass, and the check
//! itself is linear.

use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;

use super::*;

const BOUND: Duration = Duration::from_secs(10);

/// The depth the check sees: the smallest limit it lets `text` through with.
fn seen(text: &str) -> usize {
    // A limit that lets the text through lets it through with more room too.
    let (mut lo, mut hi) = (0usize, text.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if check_with_limit(text, mid).is_ok() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Nesting of sequences and mappings in a parsed document.
fn value_depth(v: &serde_yaml::Value) -> usize {
    match v {
        serde_yaml::Value::Sequence(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        serde_yaml::Value::Mapping(m) => 1 + m.values().map(value_depth).max().unwrap_or(0),
        serde_yaml::Value::Tagged(t) => value_depth(&t.value),
        _ => 0,
    }
}

#[test]
fn plain_nesting_is_counted_exactly() {
    rdma_streams_testkit::within(BOUND, || {
        assert_eq!(seen(""), 0);
        assert_eq!(seen("a: b\nc: [1, 2]\n"), 1);
        assert_eq!(seen("[[[1]]]"), 3);
        assert_eq!(seen("{a: {b: [c, {d: e}]}}"), 4);
        assert_eq!(seen("- [1]\n- [2]\n- {a: [3]}"), 2);
        assert_eq!(
            seen("[]]]]]]]\n[[1]]"),
            2,
            "closers past zero do not go negative"
        );
        // Where no node may start, a bracket is text (or the parser fails within the line).
        assert_eq!(seen("a: b[[[[\nc: 'd [[[[[[[[[['\ne: \"[[[\""), 0);
        assert_eq!(
            seen("a: &x [[1]]\nb: !!seq [[2]]\nc: ? [[3]]\n--- [[4]]"),
            2
        );
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        assert_eq!(
            check(&deep),
            Err(TooDeep {
                line: 1,
                column: 257,
                limit: 256
            })
        );
        assert_eq!(
            check(&format!("a: 1\nb: {}", "{x: ".repeat(257))),
            Err(TooDeep {
                line: 2,
                column: 4 + 4 * 256,
                limit: 256
            })
        );
        assert!(check(&format!("{}{}", "[".repeat(256), "]".repeat(256))).is_ok());
    });
}

/// Where a flow collection may start in block context, and how many levels of sequences and
/// mappings that place adds.
const PLACES: [&str; 6] = ["", "k: ", "- ", "a:\n  k: &anchor ", "k: !!seq ", "--- "];

fn place_depth(place: &str) -> usize {
    usize::from(!place.is_empty() && place != "--- ") + usize::from(place.starts_with("a:"))
}

#[test]
fn brackets_hidden_from_a_naive_count_still_count() {
    rdma_streams_testkit::within(BOUND, || {
        // Each line opens a real level and hides a closer where libyaml does not see one.
        let hiders = [
            "[ \"]\" ,",
            "[ '] '' ]' ,",
            "[ # ]\n",
            "[ a\"b, '] ' ,",
            "[ !<tag:x,[]]> a ,",
            "[ !t \"]\" ,",
            "[ &a '}' ,",
            "[ \"\\\"]\" ,",
            "[ 'x'\n# ]]]\n ,",
            "[ a\u{2028}# ]\u{2028},",
            "[ a\u{85}# ]\u{85},",
            "[ ? k : [v] ,",
        ];
        // At the root, and where a block mapping or sequence holds the node.
        for (hider, place) in hiders
            .iter()
            .flat_map(|h| PLACES.iter().map(move |p| (h, p)))
        {
            let text = format!("{place}{}", hider.repeat(300));
            assert_eq!(
                check(&text).map_err(|e| e.limit),
                Err(MAX_FLOW_DEPTH),
                "{place:?} {hider:?} x 300 passed"
            );
        }
    });
}

#[test]
fn brackets_that_libyaml_reads_as_text_count_only_generously() {
    rdma_streams_testkit::within(BOUND, || {
        // Block context: plain scalars, quoted strings, comments and block scalars with brackets.
        let text = "\
programs: [a, \"b]\"]   # a comment ]]]]
pattern: x[y
quoted: \"[[\"
script: |
  if [ -f x ]; then [ y ]; fi
after: {k: [v]}
";
        assert!(serde_yaml::from_str::<serde_yaml::Value>(text).is_ok());
        let depth = seen(text);
        assert!((2..=8).contains(&depth), "{depth}");
    });
}

#[test]
fn programs_embedded_in_block_scalars_count_little() {
    rdma_streams_testkit::within(BOUND, || {
        // A ConfigMap as `inject -f` may read it: brackets, braces and quotes that libyaml
        // reads as text, many of them unbalanced within a line, a thousand times over.
        let script = [
            "    const f = (x) => { if (x['{'] || x[\"[\"]) { return `${x}}`; } return '{' + x; };",
            "    server { location / { proxy_pass http://[::1]:80; } } # '{{",
            "    if [ -f /x ]; then echo '[[[' \"{{\"; fi; awk '{ print $1 }' <<< \"${A:-{}}\"",
            "",
        ]
        .join("\n");
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  app.js: |\n{}  k: {{a: [1]}}\n",
            script.repeat(1_000)
        );
        let parsed: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
        assert_eq!(value_depth(&parsed), 4);
        let depth = seen(&text);
        assert!(depth <= 16, "{depth}");
    });
}

#[test]
fn the_check_is_linear() {
    // A mebibyte of every shape that is slow for libyaml, and of ordinary text.
    let mib = 1 << 20;
    let shapes = [
        "{a: ".repeat(mib / 4),
        "[".repeat(mib),
        "[ \"]\" ,".repeat(mib / 7),
        "- {k: [v, \"w\"], j: 'x'} # c\n".repeat(mib / 28),
        "a".repeat(mib),
    ];
    for text in shapes {
        let head: String = text.chars().take(12).collect();
        fuzz::timed(
            &format!("yaml-guard check of 1 MiB of {head:?}"),
            Duration::from_secs(10),
            move || {
                let _ = check(&text);
            },
        );
    }
}

// === Generated flow documents of known depth ===

/// A scalar as libyaml reads it in flow context; with `decoys`, its text holds brackets,
/// quotes, `#` and line breaks that a naive count would take for structure.
fn scalar(decoys: bool) -> impl Strategy<Value = String> {
    let text = if decoys {
        "[a-z\\[\\]{},#\"' \n]{0,8}"
    } else {
        "[a-z ,#\"'\n]{0,8}"
    };
    let plain = if decoys {
        "[a-z][a-z0-9\"'.#-]{0,6}"
    } else {
        "[a-z][a-z0-9\"'.-]{0,6}"
    };
    let body = prop_oneof![
        plain.prop_map(|p: String| p),
        text.prop_map(|t: String| format!("'{}'", t.replace('\'', "''"))),
        text.prop_map(|t: String| format!("\"{}\"", t.replace('"', "\\\"").replace('\n', "\\n"))),
    ];
    let prefix = prop_oneof![
        3 => Just(String::new()),
        1 => "[a-z]{1,4}".prop_map(|a| format!("&{a} ")),
        1 => "[a-z]{1,4}".prop_map(|t| format!("!{t} ")),
        1 => Just("!<tag:x.org,2000:[]> ".to_owned()),
    ];
    (prefix, body).prop_map(|(p, b)| format!("{p}{b}"))
}

/// Between tokens: nothing, blanks, a line break, or a comment (with decoys in it).
fn gap(decoys: bool) -> impl Strategy<Value = String> {
    let comment = if decoys {
        " # ]]} [{ '\"\n"
    } else {
        " # note\n"
    };
    prop_oneof![
        3 => Just(String::new()),
        2 => Just(" ".to_owned()),
        1 => Just("\n  ".to_owned()),
        1 => Just(comment.to_owned()),
    ]
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// A flow collection nested exactly `depth` deep (a chain of `depth` levels, each with scalar
/// siblings around it).
fn document(depth: usize, decoys: bool) -> impl Strategy<Value = String> {
    let level = (
        any::<bool>(),
        proptest::collection::vec(scalar(decoys), 0..3),
        scalar(decoys),
        gap(decoys),
        gap(decoys),
    );
    proptest::collection::vec(level, depth).prop_map(|levels| {
        levels
            .into_iter()
            .rev()
            .fold(String::from("x"), |inner, (map, siblings, key, g1, g2)| {
                let mut items: Vec<String> = siblings
                    .into_iter()
                    // Unique keys, the scalars as values.
                    .enumerate()
                    .map(|(n, s)| if map { format!("_k{n}: {s}") } else { s })
                    .collect();
                let inner = if map {
                    format!("{}: {g2}{inner}", one_line(&key))
                } else {
                    inner
                };
                items.insert(items.len() / 2, inner);
                let (open, close) = if map { ("{", "}") } else { ("[", "]") };
                format!("{open}{g1}{}{g2}{close}", items.join(&format!(",{g2}")))
            })
    })
}

#[test]
fn generated_documents_are_seen_at_least_as_deep_as_libyaml_nests_them() {
    fuzz::run(
        "yaml-guard generated documents",
        500,
        Duration::from_secs(60),
        || {
            (
                1usize..64,
                any::<bool>(),
                proptest::sample::select(PLACES.to_vec()),
            )
                .prop_flat_map(|(d, decoys, place)| {
                    let text = document(d, decoys).prop_map(move |doc| format!("{place}{doc}"));
                    (Just(d), Just(decoys), Just(place), text)
                })
        },
        |(depth, decoys, place, text)| {
            let parsed: serde_yaml::Value = match serde_yaml::from_str(&text) {
                Ok(v) => v,
                Err(e) => return Err(TestCaseError::fail(format!("{text:?} is not YAML: {e}"))),
            };
            prop_assert_eq!(
                value_depth(&parsed),
                depth + place_depth(place),
                "{:?}",
                text
            );
            let seen = seen(&text);
            prop_assert!(seen >= depth, "{:?}: seen {} < {}", text, seen, depth);
            if !decoys {
                prop_assert_eq!(seen, depth, "{:?}", text);
            }
            Ok(())
        },
    );
}

#[test]
fn arbitrary_text_is_checked_without_panic() {
    fuzz::run(
        "yaml-guard arbitrary text",
        3_000,
        Duration::from_secs(30),
        || {
            prop_oneof![
                "(?s).{0,300}",
                "[\\[\\]{}'\"#:,!&*<> \n\ta-c-]{0,300}",
                proptest::collection::vec(any::<u8>(), 0..300)
                    .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            ]
        },
        |text| {
            let _ = check(&text);
            // A limit that lets the text through also lets it through with more room.
            let seen = seen(&text);
            prop_assert!(check_with_limit(&text, seen).is_ok());
            prop_assert!(check_with_limit(&text, seen + 1).is_ok());
            if seen > 0 {
                prop_assert!(check_with_limit(&text, seen - 1).is_err());
            }
            Ok(())
        },
    );
}
