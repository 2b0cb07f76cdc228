//! The scenarios' programs (`tests/scenarios/scripts/`, written into the guest's work folder by
//! the scenario that `include_str!`s them): each parses (as Python, or as Node.js) and each is
//! included by a scenario, so there is no copy and no orphan. Needs no guest (`make check` runs
//! it).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdma_streams_testkit::process;

#[test]
fn every_script_parses_and_a_scenario_includes_it() {
    let scenarios = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut sources = String::new();
    for entry in fs::read_dir(&scenarios).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            sources.push_str(&fs::read_to_string(&path).unwrap());
        }
    }
    let mut scripts: Vec<_> = fs::read_dir(scenarios.join("scripts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    for script in &scripts {
        let name = script.file_name().unwrap().to_str().unwrap();
        // Python programs, and Node.js ones for the scenarios of Node's own servers.
        let check: &[&str] = if name.ends_with(".py") {
            &[
                "python3",
                "-c",
                "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
            ]
        } else if name.ends_with(".js") {
            &["node", "--check"]
        } else {
            panic!("{name}: only Python and Node.js programs here");
        };
        let included = format!("include_str!(\"scripts/{name}\")");
        assert_eq!(
            sources.matches(&included).count(),
            1,
            "{name}: a scenario should include it once ({included})"
        );
        let out = process::run(
            Command::new(check[0]).args(&check[1..]).arg(script),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{name}: {}", out.stderr);
    }
}

/// The conformance probe (`scripts/conformance.py`) on this machine's loopback, without the
/// shim: both of its modes are plain TCP here, so every row answers the same in both (a row
/// whose answer depends on timing would make the guest's comparison flaky), and every row has
/// its line in docs/shim-conformance.md's matrix.
#[test]
fn the_conformance_probe_is_deterministic_on_tcp_and_every_row_is_in_the_matrix() {
    let probe =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/scripts/conformance.py");
    let matrix = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/shim-conformance.md"),
    )
    .unwrap();
    // Both modes at once (the probe mostly waits: its rows' pauses), each row on a port of
    // its own from the mode's first on: a free port is likely followed by free ones on a test
    // machine's loopback.
    let first = rdma_streams_testkit::free_port();
    let runs: Vec<String> = std::thread::scope(|scope| {
        let probe = &probe;
        let runs: Vec<_> = [("upgraded", first), ("fallback", first + 100)]
            .map(|(mode, port)| {
                scope.spawn(move || {
                    let out = process::run(
                        Command::new("python3")
                            .arg(probe)
                            .args(["127.0.0.1", &port.to_string(), mode])
                            // Plain TCP: the accept's delay in fallback mode changes nothing.
                            .env("CONFORMANCE_ACCEPT_AFTER", "0.05"),
                        Duration::from_secs(120),
                    );
                    assert!(out.status.success(), "{mode}: {}", out.stderr);
                    out.stdout
                })
            })
            .into_iter()
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(
        runs[0], runs[1],
        "the probe's answers depend on more than TCP"
    );
    let rows: Vec<&str> = runs[0]
        .lines()
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(rows.len() >= 20, "{}", runs[0]);
    for row in rows {
        assert!(
            matrix.contains(&format!("| `probe: {row}` |")),
            "{row}: no line `| \\`probe: {row}\\` |` in docs/shim-conformance.md"
        );
    }
}
