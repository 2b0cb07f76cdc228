//! The tables of `docs/` that repeat the code (a binary's flags, the metrics it exports), read
//! so that a test can check them against the code: a flag or a metric added, renamed or
//! dropped without its row fails the test that calls these.

use std::collections::BTreeMap;
use std::path::Path;

/// `docs/<name>` of the workspace.
pub fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The body rows of the first table in `markdown` whose header row's cells are `header`, each
/// row's cells trimmed. Panics when there is no such table.
pub fn table(markdown: &str, header: &[&str]) -> Vec<Vec<String>> {
    let cells = |line: &str| -> Vec<String> {
        let line = line.trim();
        let inner = line.strip_prefix('|').unwrap_or(line);
        let inner = inner.strip_suffix('|').unwrap_or(inner);
        inner.split('|').map(|c| c.trim().to_string()).collect()
    };
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with('|') && cells(line) == header {
            lines.next(); // | --- | --- |
            return lines
                .take_while(|l| l.trim_start().starts_with('|'))
                .map(cells)
                .collect();
        }
    }
    panic!("no table with the header {header:?}");
}

/// The text of the first `code span` in `cell`.
pub fn first_code(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// The metric families of a Prometheus text exposition, each by the name its samples carry
/// (a counter's with `_total`), with its type.
pub fn metric_families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|rest| {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            (name, kind.to_string())
        })
        .collect()
}

/// Checks a metrics table (`| metric | type | ...`, the name as a code span in the first cell,
/// the type in the second) against the code: every family a running binary `exported` (a
/// family shows once it has a sample) has its row with its type, and every row names a metric
/// the code registers: `exported`, or its name without `prefix` (and without a `_total` or
/// `_seconds` suffix) is a string literal in a `.rs` file below one of `sources` (a crate's
/// `src/`).
pub fn check_metrics_table(
    doc: &str,
    rows: &[Vec<String>],
    exported: &BTreeMap<String, String>,
    prefix: &str,
    sources: &[&Path],
) {
    let mut documented = BTreeMap::new();
    for row in rows {
        let name = first_code(&row[0]).unwrap_or_else(|| panic!("{doc}: no metric in {row:?}"));
        documented.insert(name.to_string(), row.clone());
    }
    for (name, kind) in exported {
        let row = documented
            .get(name)
            .unwrap_or_else(|| panic!("{doc}: the metrics table has no row for {name} ({kind})"));
        assert_eq!(&row[1], kind, "{doc}: the type of {name}");
    }
    let code = sources_text(sources);
    for name in documented.keys() {
        assert!(
            registered(name, exported, prefix, &code),
            "{doc}: {name} is in the metrics table, but the code registers no such metric"
        );
    }
}

/// Whether `name` is a metric the code registers: `exported` holds it (a histogram's
/// `_count`, `_sum` and `_bucket` series included), or its name without `prefix` (and
/// without those or a `_total` or `_seconds` suffix) is a string literal in `code` (a family
/// without samples yet does not show in an exposition).
fn registered(name: &str, exported: &BTreeMap<String, String>, prefix: &str, code: &str) -> bool {
    let family = ["_count", "_sum", "_bucket"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|f| exported.get(*f).is_some_and(|k| k == "histogram"))
        .unwrap_or(name);
    if exported.contains_key(family) {
        return true;
    }
    let bare = family.strip_prefix(prefix).unwrap_or(family);
    let bare = ["_count", "_sum", "_bucket"]
        .iter()
        .find_map(|s| bare.strip_suffix(s))
        .unwrap_or(bare);
    let stem = ["_total", "_seconds"]
        .iter()
        .find_map(|s| bare.strip_suffix(s))
        .unwrap_or(bare);
    [bare, stem]
        .iter()
        .any(|n| code.contains(&format!("\"{n}\"")))
}

/// The text of every `.rs` file below each of `dirs`.
fn sources_text(dirs: &[&Path]) -> String {
    let mut code = String::new();
    for dir in dirs {
        read_rs(dir, &mut code);
    }
    code
}

/// Appends the text of every `.rs` file below `dir` to `out`.
fn read_rs(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            read_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("a source file"));
        }
    }
}

/// Every metric name with `prefix` that any page of `docs/` mentions (a bare prefix such as
/// `rdma_dp_` left out), with the pages that mention it.
pub fn metrics_mentioned(prefix: &str) -> BTreeMap<String, Vec<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let page = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("a page");
        for (at, _) in text.match_indices(prefix) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.ends_with('_') {
                out.entry(name).or_default().push(page.clone());
            }
        }
    }
    out
}

/// Checks that every metric name with `prefix` the docs mention is one the code registers
/// (see [`check_metrics_table`]: exported, or named in `sources`).
pub fn check_metrics_mentioned(
    prefix: &str,
    exported: &BTreeMap<String, String>,
    sources: &[&Path],
) {
    let code = sources_text(sources);
    for (name, pages) in metrics_mentioned(prefix) {
        assert!(
            registered(&name, exported, prefix, &code),
            "{pages:?} mention {name}, which the code does not register"
        );
    }
}

/// One command-line flag as a flags table states it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flag {
    /// `--name`.
    pub long: String,
    /// The environment variable that sets it.
    pub env: Option<String>,
    /// The default the table gives in a code span; `None` where it gives none (required,
    /// unset, off, described in words).
    pub default: Option<String>,
}

/// The flags of `cmd` (not `--help` and `--version`), each with its environment variable and
/// its default value; a switch (a flag that takes no value) and an empty default count as
/// none.
#[cfg(feature = "docs")]
pub fn flags_of(cmd: &clap::Command) -> Vec<Flag> {
    let mut out: Vec<Flag> = cmd
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .filter_map(|a| {
            let long = a.get_long()?;
            let switch = matches!(
                a.get_action(),
                clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
            );
            Some(Flag {
                long: format!("--{long}"),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                default: a
                    .get_default_values()
                    .first()
                    .filter(|v| !switch && !v.is_empty())
                    .map(|v| v.to_string_lossy().into_owned()),
            })
        })
        .collect();
    out.sort();
    out
}

/// The flags a flags table states (`| flag | env | default | ...`: the flag, its variable and
/// its default each as the cell's first code span; `-o, --output FMT` is `--output`), sorted
/// as [`flags_of`] sorts them, `--help` and `--version` left out as there.
pub fn flags_in_table(rows: &[Vec<String>]) -> Vec<Flag> {
    let mut out: Vec<Flag> = rows
        .iter()
        .map(|row| {
            let flag = first_code(&row[0]).unwrap_or_else(|| panic!("no flag in {row:?}"));
            let long = flag
                .split_whitespace()
                .map(|w| w.trim_end_matches(','))
                .find(|w| w.starts_with("--"))
                .unwrap_or_else(|| panic!("no --flag in {row:?}"));
            Flag {
                long: long.to_string(),
                env: first_code(&row[1]).map(str::to_string),
                default: first_code(&row[2]).map(str::to_string),
            }
        })
        .filter(|f| !matches!(f.long.as_str(), "--help" | "--version"))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "text\n\n| flag | env | default | meaning |\n| --- | --- | --- | --- |\n\
        | `--a N` | `X_A` | `3` (three) | a |\n| `-b, --b` | none | off | b |\n\
        | `-V, --version` | | | v |\n\nafter\n| x |\n";

    #[test]
    fn a_table_is_found_by_its_header_and_ends_with_it() {
        let rows = table(DOC, &["flag", "env", "default", "meaning"]);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1], ["`-b, --b`", "none", "off", "b"]);
        assert_eq!(
            flags_in_table(&rows),
            [
                Flag {
                    long: "--a".into(),
                    env: Some("X_A".into()),
                    default: Some("3".into())
                },
                Flag {
                    long: "--b".into(),
                    env: None,
                    default: None
                },
            ]
        );
    }

    #[test]
    fn counters_are_named_as_their_samples() {
        let text = "# HELP x_c C.\n# TYPE x_c counter\nx_c_total 1\n# TYPE x_g gauge\n\
            # TYPE x_h histogram\n# EOF\n";
        let families = metric_families(text);
        assert_eq!(
            families.into_iter().collect::<Vec<_>>(),
            [
                ("x_c_total".to_string(), "counter".to_string()),
                ("x_g".to_string(), "gauge".to_string()),
                ("x_h".to_string(), "histogram".to_string()),
            ]
        );
    }
}
