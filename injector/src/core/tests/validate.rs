//! Every patched fixture pod (and every schema-valid input fixture) validated with
//! `kubernetes-validate --strict` against Kubernetes 1.30 and the newest version the tool ships,
//! through `injector/tests/validate/validate_pods.sh`.
//!
//! The tool is `$KUBERNETES_VALIDATE`, else `kubernetes-validate` on PATH. Without it the test
//! passes with a notice, unless `RDMA_REQUIRE_KUBERNETES_VALIDATE=1` (CI sets it, so a missing
//! install cannot silently skip the check).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::support::FIXTURES;
use super::table::{Expect, cases, run_case};

const SCRIPT: &str = include_str!("../../../tests/validate/validate_pods.sh");
const REQUIRE: &str = "RDMA_REQUIRE_KUBERNETES_VALIDATE";
const TOOL_ENV: &str = "KUBERNETES_VALIDATE";

fn find_tool() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(TOOL_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{TOOL_ENV}={} does not exist", path.display()))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("kubernetes-validate"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("kubernetes-validate is not on PATH and {TOOL_ENV} is not set"))
}

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

fn uses_image_volume(pod: &Value) -> bool {
    pod["spec"]["volumes"]
        .as_array()
        .is_some_and(|volumes| volumes.iter().any(|v| v.get("image").is_some()))
}

fn write(dir: &Path, name: &str, pod: &Value) {
    let text = serde_json::to_string_pretty(pod).expect("encode");
    std::fs::write(dir.join(format!("{name}.json")), text).expect("write pod");
}

fn run_script(tool: &Path, script: &Path, min: &str, dir: &Path) {
    let output = Command::new("bash")
        .arg(script)
        .args(["--min", min])
        .arg(dir)
        .env(TOOL_ENV, tool)
        .output()
        .expect("run bash");
    assert!(
        output.status.success(),
        "validate_pods.sh --min {min} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn patched_pods_pass_kubernetes_validate() {
    let tool = match find_tool() {
        Ok(tool) => tool,
        Err(why) => {
            assert!(
                std::env::var(REQUIRE).as_deref() != Ok("1"),
                "{REQUIRE}=1 but the schema check cannot run: {why}. Install it with \
                 `python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate` and \
                 set {TOOL_ENV}=/tmp/kv/bin/kubernetes-validate (or put it on PATH)"
            );
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "skipping the kubernetes-validate check: {why} (set {REQUIRE}=1 to require it)"
                );
            }
            return;
        }
    };

    let temp = tempfile::tempdir().expect("tempdir");
    let v130 = temp.path().join("v1.30");
    let v133 = temp.path().join("v1.33");
    std::fs::create_dir_all(&v130).expect("mkdir");
    std::fs::create_dir_all(&v133).expect("mkdir");

    let mut written = 0;
    for case in cases() {
        if !case.schema_valid || !matches!(case.expect, Expect::Patch(_)) {
            continue;
        }
        let result = run_case(&case).expect("a patch case patches");
        let dir = if uses_image_volume(&result) {
            &v133
        } else {
            &v130
        };
        write(dir, &format!("patched-{}", slug(case.name)), &result);
        written += 1;
    }
    for fixture in FIXTURES.iter().filter(|f| f.name != "future-field") {
        let pod: Value = serde_json::from_str(fixture.json).expect("fixture JSON");
        write(&v130, &format!("input-{}", fixture.name), &pod);
    }
    assert!(written >= 25, "only {written} patched pods");

    let script = temp.path().join("validate_pods.sh");
    std::fs::write(&script, SCRIPT).expect("write script");
    run_script(&tool, &script, "1.30.0", &v130);
    run_script(&tool, &script, "1.33.0", &v133);
}
