//! The scenarios' programs (`tests/scenarios/scripts/`, written into the guest's work folder by
//! the scenario that `include_str!`s them): each parses as Python and each is included by a
//! scenario, so there is no copy and no orphan. Needs no guest (`make check` runs it).

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
        assert!(name.ends_with(".py"), "{name}: only Python programs here");
        let included = format!("include_str!(\"scripts/{name}\")");
        assert_eq!(
            sources.matches(&included).count(),
            1,
            "{name}: a scenario should include it once ({included})"
        );
        let out = process::run(
            Command::new("python3")
                .args([
                    "-c",
                    "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
                ])
                .arg(script),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{name}: {}", out.stderr);
    }
}
