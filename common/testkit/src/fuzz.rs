//! Bounded fuzzing for `make test`: property runs over hostile input with a fixed number of
//! cases and a wall-clock limit, and the input generators the decoders' fuzz tests share.
//!
//! - [`run`]: `cases` inputs through a test body under a time limit; a failure is shrunk and
//!   printed in the panic message with the seed that replays it, nothing is written into the
//!   source tree (no failure persistence). The cases are fixed per run name unless
//!   `PROPTEST_RNG_SEED` says otherwise. Each run prints one line with its case count and its
//!   time.
//! - [`mutated`]: a valid input with bytes set, flipped, inserted, removed, repeated (long
//!   strings, deep nesting), hostile tokens spliced in, truncated or extended.
//! - [`hostile_token`]: a scalar or fragment as text (huge, negative and non-finite numbers in
//!   several spellings, YAML tags and aliases, unicode, control characters, very long strings,
//!   nesting thousands deep): what a field of a text format could hold instead of its value.
//! - [`replaced_text`]: a valid JSON document (also the flow form of a YAML file) with one
//!   value anywhere in it replaced by a [`hostile_token`], or a member added with one.
//! - [`hostile_json`] and [`transplanted`]: the same on `serde_json::Value`s, for decoders
//!   that take a parsed value.

use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{Map, Value};

/// Largest input [`mutated`] produces: the repeats stop growing it past this.
pub const MAX_MUTATED_LEN: usize = 1 << 20;

/// Deepest nesting [`hostile_token`] writes (serde_json and serde_yaml stop at 128).
pub const MAX_TOKEN_DEPTH: usize = 20_000;

/// Deepest nesting [`hostile_json`] builds: serde_json's own parser stops at 128, and a
/// `Value` is serialised and dropped recursively, so deeper values could never reach a decoder
/// through JSON text.
pub const MAX_VALUE_DEPTH: usize = 120;

/// Runs `test` on `cases` inputs drawn from the strategy `make` builds, failing the calling test
/// when a case fails or panics (the shrunk input is in the message) or when the whole run takes
/// longer than `limit`. Prints `fuzz <name>: <cases> cases in <time>` to stderr.
///
/// The strategy is built on the thread that runs the cases, so it need not be `Send`.
pub fn run<S, F>(
    name: &str,
    cases: u32,
    limit: Duration,
    make: impl FnOnce() -> S + Send + 'static,
    test: F,
) where
    S: Strategy,
    F: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    let started = Instant::now();
    let seed = seed(name);
    let result = crate::within(limit, move || {
        let config = Config {
            cases,
            failure_persistence: None,
            // Shrinking a failure must not turn it into a timeout.
            max_shrink_time: u32::try_from(limit.as_millis() / 3).unwrap_or(u32::MAX),
            rng_seed: RngSeed::Fixed(seed),
            ..Config::default()
        };
        TestRunner::new(config)
            .run(&make(), test)
            .map_err(|e| e.to_string())
    });
    if let Err(failure) = result {
        panic!("fuzz {name} (PROPTEST_RNG_SEED={seed}): {failure}");
    }
    report(name, cases, seed, started.elapsed());
}

/// The run's seed: `PROPTEST_RNG_SEED` when set (to explore, or to replay a failure), otherwise
/// one fixed per run name, so `make test` draws the same cases every time and a failure
/// reproduces with the seed its message prints.
fn seed(name: &str) -> u64 {
    if let Ok(text) = std::env::var("PROPTEST_RNG_SEED")
        && let Ok(seed) = text.trim().parse()
    {
        return seed;
    }
    // `DefaultHasher::new` has fixed keys: the same seed on every run of one build.
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(name, &mut hasher);
    std::hash::Hasher::finish(&hasher)
}

#[allow(
    clippy::print_stderr,
    reason = "the run's time is the point of the line; cargo test shows it with --nocapture"
)]
fn report(name: &str, cases: u32, seed: u64, elapsed: Duration) {
    eprintln!("fuzz {name}: {cases} cases in {elapsed:.2?} (PROPTEST_RNG_SEED={seed})");
}

/// Arbitrary text for a YAML decoder: anything, text of YAML's own characters (so the parser
/// gets past the first token), and arbitrary bytes read as text.
pub fn yaml_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s).{0,200}",
        "[-a-zA-Z0-9_:{}\\[\\],&*!|>'\"#%@` \n\t./]{0,200}",
        vec(any::<u8>(), 0..200).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// [`mutated`] over text seeds with the shared [`TOKENS`]: files as a user could write them
/// wrong, bytes that are not text included.
pub fn mutated_files(seeds: &[&str]) -> impl Strategy<Value = Vec<u8>> + use<> {
    mutated(
        seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        TOKENS,
    )
}

/// Times `f` and fails when it takes longer than `limit` (for single huge or deep inputs that
/// must be refused quickly, not only eventually). Returns `f`'s value and the time it took.
pub fn timed<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let started = Instant::now();
    let value = crate::within(limit, f);
    let elapsed = started.elapsed();
    report_one(what, elapsed);
    (value, elapsed)
}

#[allow(
    clippy::print_stderr,
    reason = "the time is the point of the line; cargo test shows it with --nocapture"
)]
fn report_one(what: &str, elapsed: Duration) {
    eprintln!("fuzz {what}: {elapsed:.2?}");
}

// === Byte-level mutations ===

/// One edit of [`mutated`]; positions are taken modulo the input's length at the time.
#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Token(usize, usize),
    /// Inserts `times` copies of the `len` bytes at the position after them.
    Repeat(usize, usize, usize),
    Truncate(usize),
    Append(Vec<u8>),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        2 => (any::<usize>(), 0u8..8).prop_map(|(i, bit)| Edit::Flip(i, bit)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => any::<usize>().prop_map(Edit::Remove),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(i, t)| Edit::Token(i, t)),
        1 => (any::<usize>(), 1usize..16, prop_oneof![1usize..16, 100usize..5000])
            .prop_map(|(i, len, times)| Edit::Repeat(i, len, times)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        1 => vec(any::<u8>(), 1..32).prop_map(Edit::Append),
    ]
}

/// `raw` as a position in `0..n` (0 when `n` is 0).
fn pos(raw: usize, n: usize) -> usize {
    raw.checked_rem(n).unwrap_or(0)
}

fn apply(bytes: &mut Vec<u8>, edit: &Edit, tokens: &[&str]) {
    let len = bytes.len();
    match edit {
        Edit::Set(i, b) => {
            if let Some(slot) = bytes.get_mut(pos(*i, len)) {
                *slot = *b;
            }
        }
        Edit::Flip(i, bit) => {
            if let Some(slot) = bytes.get_mut(pos(*i, len)) {
                *slot ^= 1 << bit;
            }
        }
        Edit::Insert(i, b) => bytes.insert(pos(*i, len + 1), *b),
        Edit::Remove(i) => {
            if len > 0 {
                bytes.remove(pos(*i, len));
            }
        }
        Edit::Token(i, t) => {
            if let Some(token) = tokens.get(pos(*t, tokens.len())) {
                let at = pos(*i, len + 1);
                bytes.splice(at..at, token.bytes());
            }
        }
        Edit::Repeat(i, n, times) => {
            let start = pos(*i, len + 1);
            let end = start.saturating_add(*n).min(len);
            let unit = bytes[start..end].to_vec();
            if unit.is_empty() {
                return;
            }
            let room = MAX_MUTATED_LEN.saturating_sub(len) / unit.len();
            let grown = unit.repeat((*times).min(room));
            bytes.splice(end..end, grown);
        }
        Edit::Truncate(i) => bytes.truncate(pos(*i, len + 1)),
        Edit::Append(tail) => bytes.extend_from_slice(tail),
    }
}

/// One of `seeds` with 1 to 8 edits: bytes set, bit-flipped, inserted or removed, one of
/// `tokens` spliced in, a short run repeated up to thousands of times (long strings, deep
/// nesting, many list items), truncated, or extended. Repeats stop growing it at
/// [`MAX_MUTATED_LEN`] bytes.
pub fn mutated(
    seeds: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    (select(seeds), vec(edit(), 1..8)).prop_map(move |(seed, edits)| {
        let mut bytes = seed;
        for e in &edits {
            apply(&mut bytes, e, tokens);
        }
        bytes
    })
}

/// [`mutated`] as text, invalid UTF-8 replaced (for decoders that take `&str`).
pub fn mutated_text(
    seeds: Vec<String>,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = String> {
    mutated(seeds.into_iter().map(String::into_bytes).collect(), tokens)
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

// === Hostile tokens ===

/// Scalars and fragments that break naive readers of JSON and YAML: integer limits and just
/// past them, negative and non-finite numbers (also in YAML's spellings), other radixes,
/// exponents, booleans and nulls in every YAML 1.1 spelling, tags, anchors and aliases,
/// documents and directives, flow and block indicators, quotes and escapes (also invalid ones),
/// control characters, a byte order mark, bidi controls, non-BMP characters.
pub const TOKENS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "127",
    "128",
    "255",
    "256",
    "65535",
    "65536",
    "-32769",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "1e308",
    "1e309",
    "-1e309",
    "1e-400",
    "4.9e-324",
    "0.1",
    "-0.0",
    "1.5",
    "1.",
    ".5",
    "1e",
    "01",
    "0x10",
    "0o17",
    "0b101",
    "1_000",
    "+1",
    "NaN",
    "nan",
    ".nan",
    ".NaN",
    "inf",
    "Infinity",
    "-Infinity",
    ".inf",
    "-.inf",
    "+.inf",
    "null",
    "~",
    "Null",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "\"\"",
    "''",
    "[]",
    "{}",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ": ",
    "- ",
    "? ",
    "|",
    ">",
    "#",
    "&a ",
    "*a",
    "&a [1, 2]",
    "*b",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!binary ",
    "!!map ",
    "!!set ",
    "!!python/object ",
    "!custom ",
    "!<tag:yaml.org,2002:str> ",
    "<<: ",
    "---",
    "...",
    "%YAML 1.2\n",
    "%TAG ! tag:x,2000:\n",
    "\n",
    "\r\n",
    "\r",
    "\t",
    " ",
    "\\",
    "\"",
    "'",
    "\\u0000",
    "\\ud800",
    "\\udfff\\ud800",
    "\\x",
    "\\uZZZZ",
    "\u{0}",
    "\u{7}",
    "\u{1b}[2J",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{feff}",
    "\u{202e}",
    "\u{fffd}",
    "\u{ffff}",
    "é",
    "ﬁ",
    "İ",
    "ß",
    "𝕏",
    "🦀",
    "/",
    "..",
    "../../../etc/passwd",
    "%",
    "%p",
    "%%",
    "*",
    "?",
    "[!a]",
    "**/*",
    "@",
    "=",
    "a,b",
    "a/b/c",
    "::",
    "::ffff:1.2.3.4",
    "1.2.3.4/33",
    "0.0.0.0/0",
    "-",
    "1-",
    "9-1",
    "0-65535",
];

/// A text fragment a field could hold instead of its value: a [`TOKENS`] entry, an integer or
/// float of any size as Rust prints it (`NaN`, `inf` included), a JSON string of arbitrary
/// unicode, a string of 256 bytes to 64 KiB, or a JSON list or object nested up to
/// [`MAX_TOKEN_DEPTH`] deep.
pub fn hostile_token() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(TOKENS).prop_map(str::to_owned),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<i128>().prop_map(|n| n.to_string()),
        2 => any::<f64>().prop_map(|f| f.to_string()),
        1 => any::<f64>().prop_map(|f| format!("{f:e}")),
        3 => ".{0,40}".prop_map(|s| Value::String(s).to_string()),
        2 => (select(vec![255usize, 256, 4096, 65_536]), any::<char>())
            .prop_map(|(n, c)| Value::String(c.to_string().repeat(n)).to_string()),
        2 => (select(vec![1usize, 2, 127, 128, 129, 1000, MAX_TOKEN_DEPTH]), any::<bool>())
            .prop_map(|(depth, objects)| nested_text(depth, objects)),
    ]
}

/// `[[[...1...]]]` or `{"a":{"a":...1...}}`, `depth` levels.
pub fn nested_text(depth: usize, objects: bool) -> String {
    if objects {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    } else {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }
}

// === Values replaced inside valid documents ===

/// The JSON pointer of every value in `doc` (the root is `""`).
pub fn json_pointers(doc: &Value) -> Vec<String> {
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        out.push(at.to_owned());
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let key = k.replace('~', "~0").replace('/', "~1");
                    walk(child, &format!("{at}/{key}"), out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, "", &mut out);
    out
}

/// Every object key in `doc`, deduplicated, after `x` (an unknown one).
fn keys(doc: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    if !out.contains(k) {
                        out.push(k.clone());
                    }
                    walk(child, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let mut out = vec!["x".to_owned()];
    walk(doc, &mut out);
    out
}

const HOLE: &str = "\u{1}hole\u{1}";

/// A copy of `doc` with `value` at `pointer`, or (when `add` and the place is an object or a
/// list) added there under `key` or at the end.
fn put(doc: &Value, pointer: &str, key: &str, add: bool, value: Value) -> Value {
    let mut doc = doc.clone();
    if let Some(slot) = doc.pointer_mut(pointer) {
        match slot {
            Value::Object(m) if add => {
                m.insert(key.to_owned(), value);
            }
            Value::Array(items) if add => items.push(value),
            _ => *slot = value,
        }
    }
    doc
}

/// `doc` as JSON text with `token` spliced in raw at `pointer` (see [`put`]).
fn splice(doc: &Value, pointer: &str, key: &str, add: bool, token: &str) -> String {
    let holed = put(doc, pointer, key, add, Value::String(HOLE.to_owned()));
    let quoted = Value::String(HOLE.to_owned()).to_string();
    holed.to_string().replacen(&quoted, token, 1)
}

/// `doc` as JSON text with one value (anywhere, the root included) replaced by a
/// [`hostile_token`], or a member or item added with one (under a key used elsewhere in the
/// document, or an unknown one). The text is usually not JSON any more: the tokens are raw.
/// Also the flow form of a YAML document, since JSON is YAML.
pub fn replaced_text(doc: Value) -> impl Strategy<Value = String> {
    let pointers = json_pointers(&doc);
    let keys = keys(&doc);
    (
        select(pointers),
        select(keys),
        prop::bool::weighted(0.25),
        hostile_token(),
    )
        .prop_map(move |(at, key, add, token)| splice(&doc, &at, &key, add, &token))
}

/// An arbitrary JSON value with the extremes a decoder must survive: integer limits, floats
/// (serde_json has no NaN or infinity: they are `null`), strings of arbitrary unicode, shaped
/// like numbers, names or paths, or 64 KiB long, lists and objects a few levels deep with
/// arbitrary keys, and chains nested up to [`MAX_VALUE_DEPTH`].
pub fn hostile_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        select(vec![i64::MIN, -1, 0, 1, i64::MAX]).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_map(Value::from),
        ".{0,24}".prop_map(Value::from),
        select(TOKENS).prop_map(Value::from),
        (any::<char>(), select(vec![256usize, 65_536]))
            .prop_map(|(c, n)| Value::from(c.to_string().repeat(n))),
        (1usize..=MAX_VALUE_DEPTH).prop_map(nested_value),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((".{0,12}", inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// `depth` nested single-element lists around `1`.
pub fn nested_value(depth: usize) -> Value {
    (0..depth).fold(Value::from(1), |inner, _| Value::Array(vec![inner]))
}

/// A copy of `doc` with one value (anywhere, the root included) replaced by a
/// [`hostile_json`] value, or a member or item added with one.
pub fn transplanted(doc: Value) -> impl Strategy<Value = Value> {
    let pointers = json_pointers(&doc);
    let keys = keys(&doc);
    (
        select(pointers),
        select(keys),
        prop::bool::weighted(0.25),
        hostile_json(),
    )
        .prop_map(move |(at, key, add, value)| put(&doc, &at, &key, add, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_reach_every_value() {
        let doc = serde_json::json!({"a": [1, {"b/c": 2}], "d~": null});
        assert_eq!(
            json_pointers(&doc),
            ["", "/a", "/a/0", "/a/1", "/a/1/b~1c", "/d~0"]
        );
    }

    #[test]
    fn tokens_are_spliced_raw() {
        let doc = serde_json::json!({"a": 1, "b": [2]});
        assert_eq!(
            splice(&doc, "/a", "x", false, ".nan"),
            r#"{"a":.nan,"b":[2]}"#
        );
        assert_eq!(
            splice(&doc, "", "x", true, "*a"),
            r#"{"a":1,"b":[2],"x":*a}"#
        );
        assert_eq!(splice(&doc, "/b", "x", true, "[["), r#"{"a":1,"b":[2,[[]}"#);
    }

    #[test]
    fn edits_stay_in_bounds_and_repeats_stop_at_the_size_cap() {
        let mut bytes = vec![b'['; MAX_MUTATED_LEN - 2];
        apply(&mut bytes, &Edit::Repeat(0, 4, 5000), &[]);
        assert_eq!(bytes.len(), MAX_MUTATED_LEN - 2);
        let mut bytes = b"ab".to_vec();
        apply(&mut bytes, &Edit::Repeat(1, 4, 3), &[]);
        assert_eq!(bytes, b"abbbb");
        let mut empty = Vec::new();
        for e in [
            Edit::Set(7, 1),
            Edit::Flip(7, 1),
            Edit::Remove(7),
            Edit::Repeat(7, 3, 3),
            Edit::Truncate(7),
        ] {
            apply(&mut empty, &e, &["t"]);
        }
        assert!(empty.is_empty());
        apply(&mut empty, &Edit::Token(5, 9), &["tok"]);
        assert_eq!(empty, b"tok");
    }

    #[test]
    fn a_run_counts_its_cases_and_reports_failures() {
        run("always-ok", 16, Duration::from_secs(10), any::<u8>, |_| {
            Ok(())
        });
        let failed = std::panic::catch_unwind(|| {
            run("finds-200", 512, Duration::from_secs(10), any::<u8>, |b| {
                prop_assert!(b < 200);
                Ok(())
            });
        });
        let message = failed.expect_err("a failing case fails the run");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.contains("fuzz finds-200") && message.contains("200"),
            "{message}"
        );
    }
}
