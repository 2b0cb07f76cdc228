//! The shim's environment variables are defined in shim-core's settings, which the Kubernetes
//! binaries do not link; `names::contract` writes them once more for the injector. This test
//! reads the shim's sources and checks that it defines every name the contract lists, so the
//! two cannot drift apart silently (the settings' own test checks the other direction).

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use rdma_streams_common::names::contract::{SHIM_ENV, SHIM_MODE_PROXY};

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_shim_defines_every_env_name_of_the_contract() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["shim/src", "shim/core/src"] {
        rust_sources(&root.join(dir), &mut files);
    }
    let text: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect();
    for name in SHIM_ENV {
        assert!(
            text.contains(&format!("\"{name}\"")),
            "the shim's sources never name {name}"
        );
    }
    assert!(
        text.contains(&format!("\"{SHIM_MODE_PROXY}\"")),
        "the shim's sources never name the mode {SHIM_MODE_PROXY}"
    );
}
