//! The conformance probe of docs/shim-conformance.md (one row per socket behaviour) under the
//! shim on a machine without RDMA: every connection passes through, so every hook, on every
//! call the probe makes (`writev`, `sendmmsg`, `sendfile`, `splice`, urgent data, resets,
//! options, ...), must answer exactly as without the shim. The Soft-RoCE suite runs the same
//! probe upgraded and fallen back.

mod common;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use common::*;

#[test]
fn the_probe_answers_as_without_the_shim_when_it_passes_through() {
    let probe = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/softroce/tests/scenarios/scripts/conformance.py");
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"
"$PY" "$PROBE" 127.0.0.1 20000 upgraded > "$W/plain"
LD_PRELOAD="$SHIM" STREAMSHIM_STATS="$W/probe-%p.json" "$PY" "$PROBE" 127.0.0.1 21000 upgraded > "$W/shim"
"#;
    netns(
        script,
        &[
            ("PROBE", probe.into_os_string()),
            ("W", OsString::from(dir.path())),
        ],
        Duration::from_secs(180),
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("probe output");
    let (plain, shim) = (read("plain"), read("shim"));
    assert!(plain.lines().count() >= 50, "{plain}");
    let differ: Vec<String> = plain
        .lines()
        .zip(shim.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  without the shim: {a}\n  with it:          {b}"))
        .collect();
    assert!(
        differ.is_empty() && plain.lines().count() == shim.lines().count(),
        "rows that answer otherwise under the shim:\n{}\nwithout:\n{plain}\nwith:\n{shim}",
        differ.join("\n")
    );
    // The shim saw the probe's connections, and passed every one through.
    let stats = one_stats(dir.path(), "probe-");
    let rows = plain.lines().count() as u64;
    for role in ["client", "server"] {
        assert_counts(&stats, role, "NO_DEVICE", rows);
    }
}
