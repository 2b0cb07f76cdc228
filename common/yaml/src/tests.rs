//! The options every reader gets: the types serde_yaml read, bounded work on hostile text
//! (nesting, aliases, a mebibyte), one-line errors with their location.

use std::collections::BTreeMap;
use std::time::Duration;

use rdma_streams_testkit::fuzz;
use serde_json::{Value, json};

use super::*;

const BOUND: Duration = Duration::from_secs(10);

#[test]
fn scalars_read_as_yaml_1_2_core_types_as_serde_yaml_read_them() {
    let v: Value = from_str(
        "a: yes\nb: no\nc: on\nd: y\ne: true\nf: False\ng: 0755\nh: 1_000\ni: 0x1F\nj: 12\n\
         k: 1.5\nl: ~\nm: ''\nn: '010'\no: 2001-12-14\n",
    )
    .unwrap();
    assert_eq!(
        v,
        json!({"a": "yes", "b": "no", "c": "on", "d": "y", "e": true, "f": false, "g": "0755",
               "h": "1_000", "i": 31, "j": 12, "k": 1.5, "l": null, "m": "", "n": "010",
               "o": "2001-12-14"})
    );
    // A typed string field takes any scalar's text.
    let m: BTreeMap<String, String> = from_str("a: yes\nb: 0755\nc: 12\n").unwrap();
    assert_eq!(m["a"], "yes");
    assert_eq!(m["b"], "0755");
    assert_eq!(m["c"], "12");
}

#[test]
fn an_empty_text_is_null_and_documents_skip_empty_ones() {
    assert_eq!(from_str::<Option<BTreeMap<String, u32>>>(""), Ok(None));
    assert_eq!(
        from_str::<Option<BTreeMap<String, u32>>>("# only a comment\n"),
        Ok(None)
    );
    let docs: Vec<Value> = documents("---\na: 1\n---\n---\nb: 2\n...\n").unwrap();
    assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
    let e = documents::<Value>("a: 1\n---\nb: [\n").unwrap_err();
    assert_eq!(e.index, 1);
    assert_eq!(e.error.line(), Some(3));
}

#[test]
fn errors_are_one_line_with_their_location() {
    let e = from_str::<BTreeMap<String, u32>>("a: 1\nb: x\n").unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(2), Some(4)));
    let shown = e.to_string();
    assert!(shown.ends_with(" at line 2 column 4"), "{shown}");
    assert!(!shown.contains('\n'), "{shown}");
    assert!(!e.message().contains("line 2"), "{e:?}");
    let dup = from_str::<Value>("a: 1\na: 2\n").unwrap_err();
    assert!(dup.message().contains("duplicate"), "{dup}");
    assert_eq!(dup.line(), Some(2));
}

#[test]
fn nesting_past_the_limits_is_refused_in_linear_time() {
    let mib = 1 << 20;
    let texts = [
        "{a: ".repeat(mib / 4),
        "[".repeat(mib),
        format!("client: {{allow: [{}", "{cidr: ".repeat(mib / 8)),
        "[ \"]\" ,".repeat(mib / 7),
        // Block nesting, one level per line.
        (0..2000)
            .map(|i| format!("{}k:\n", " ".repeat(i)))
            .collect(),
    ];
    for text in texts {
        let head: String = text.chars().take(16).collect();
        let (read, _) = fuzz::timed(&format!("1 MiB of {head:?}"), BOUND, move || {
            from_str::<Value>(&text).map(|_| ())
        });
        assert!(read.is_err(), "{head:?}");
    }
    // As deep as is read, with the rest of the mebibyte inside.
    let depth = MAX_FLOW_DEPTH;
    let items = "10.0.0.1, ".repeat((mib - 2 * depth) / 10);
    let text = format!(
        "{}[{items}]{}",
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    );
    let (read, _) = fuzz::timed("1 MiB at the deepest nesting read", BOUND, move || {
        from_str::<Value>(&text).map(|_| ())
    });
    assert_eq!(read, Ok(()));
    let too_deep = format!("{}{}", "[".repeat(depth + 1), "]".repeat(depth + 1));
    assert!(from_str::<Value>(&too_deep).is_err());
}

#[test]
fn an_alias_bomb_is_refused_quickly() {
    // Nine levels of ten: a billion strings if every alias were expanded.
    let mut text = String::from("a: [&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]");
    for level in 1..9 {
        let prev = level - 1;
        text.push_str(&format!(
            ", &a{level} [{}]",
            vec![format!("*a{prev}"); 10].join(", ")
        ));
    }
    text.push_str("]\n");
    let (read, _) = fuzz::timed("alias bomb", BOUND, move || {
        from_str::<Value>(&text).map(|_| ())
    });
    assert!(read.is_err());
}

#[cfg(feature = "serialize")]
#[test]
fn written_values_read_back_the_same() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "x", "annotations": {"a/b": "true", "n": "1", "o": "0755", "y": "yes"}},
        "spec": {"containers": [{"name": "c", "args": ["--x", "", "0x1", "1_000", "a: b", "- c"],
        "env": [{"name": "A", "value": "on"}, {"name": "L", "value": "x".repeat(300)},
        {"name": "S", "value": "line 1\nline 2\n"}], "resources": {}}]}});
    let text = to_string(&pod).unwrap();
    assert!(!text.starts_with("---"), "{text}");
    assert!(
        text.contains(&format!("value: {}\n", "x".repeat(300))),
        "{text}"
    );
    assert_eq!(from_str::<Value>(&text).unwrap(), pod, "{text}");
}
