//! Proof that a shipped binary carries no test double: the check each binary's
//! `tests/shipped.rs` runs against the binary cargo built for its integration tests (the same
//! crate graph and features as the release build; only the optimisation differs).
//!
//! Three looks, each able to fail:
//! - the package's normal and build dependencies, every feature on (`cargo tree -e
//!   normal,build --all-features`), include no test-only crate ([`TEST_ONLY_CRATES`], or any
//!   crate whose name says `testkit`/`testbed`);
//! - the binary's bytes name no test-only module or crate ([`TEST_ONLY_SYMBOLS`]): a debug
//!   binary keeps the path of every function linked into it;
//! - no flag or environment variable in `--help` (of the binary and each subcommand given)
//!   says `test` or `fake`.

use std::{path::Path, process::Command, time::Duration};

/// Crates that exist for tests only (`tempfile` is not one: prost-build, a build dependency,
/// uses it).
pub const TEST_ONLY_CRATES: &[&str] = &["proptest", "tower-test"];

/// Byte strings that only test-only code leaves in a binary: module paths of test doubles and
/// the test-support crates' names as they appear in symbols.
pub const TEST_ONLY_SYMBOLS: &[&str] = &[
    "::testing::",
    "::test_events",
    "fake_kubelet",
    "FakeKubelet",
    "_testkit::",
    "_testbed::",
];

/// How long one `cargo tree` or `--help` may take.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs every check for the package whose manifest directory is `manifest_dir` and its binary
/// `binary`; `subcommands` are the command lines whose `--help` is read too (`&[]`: the
/// binary's own only). Panics with what it found.
pub fn assert_no_test_code(
    manifest_dir: &str,
    package: &str,
    binary: &str,
    subcommands: &[&[&str]],
) {
    assert_no_test_dependencies(manifest_dir, package);
    assert_no_test_symbols(binary);
    let mut lines: Vec<Vec<&str>> = vec![vec![]];
    lines.extend(subcommands.iter().map(|c| c.to_vec()));
    for args in lines {
        let help = run(Command::new(binary).args(&args).arg("--help"));
        let flags = test_flags(&help);
        assert!(
            flags.is_empty(),
            "`{binary} {} --help` offers test-only flags: {flags:?}",
            args.join(" ")
        );
    }
}

/// The package's normal and build dependencies include no test-only crate.
pub fn assert_no_test_dependencies(manifest_dir: &str, package: &str) {
    let found = dependencies_found(manifest_dir, package);
    assert!(
        found.is_empty(),
        "{package} depends on test-only crates: {found:?}"
    );
}

/// The file (an executable or a shared library) names no test-only module or crate.
pub fn assert_no_test_symbols(binary: &str) {
    let bytes = std::fs::read(binary).unwrap_or_else(|e| panic!("reading {binary}: {e}"));
    let text = String::from_utf8_lossy(&bytes);
    let symbols: Vec<&str> = TEST_ONLY_SYMBOLS
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect();
    assert!(
        symbols.is_empty(),
        "{binary} contains test-only code: {symbols:?}"
    );
}

/// The test-only crates in the package's normal and build dependency tree.
fn dependencies_found(manifest_dir: &str, package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(manifest_dir).join("Cargo.toml");
    let tree = run(Command::new(cargo)
        .args([
            "tree",
            "--all-features",
            "--offline",
            "--edges",
            "normal,build",
            "--prefix",
            "none",
            "--package",
            package,
        ])
        .arg("--manifest-path")
        .arg(&manifest));
    assert!(
        tree.lines().next().is_some_and(|l| l.starts_with(package)),
        "cargo tree printed no tree for {package}:\n{tree}"
    );
    // The first line is the package itself.
    let mut found: Vec<String> = tree
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| is_test_only(name))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Whether a crate exists for tests only.
pub fn is_test_only(name: &str) -> bool {
    TEST_ONLY_CRATES.contains(&name) || name.contains("testkit") || name.contains("testbed")
}

/// The long flags and environment variables in a `--help` text that name a test hook or a
/// fake: a word of the flag (between dashes) or of the variable (between underscores) starts
/// with `test` or `fake`.
pub fn test_flags(help: &str) -> Vec<String> {
    let is_env = |w: &str| {
        w.contains('_')
            && w.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    let mut flags: Vec<String> = help
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '=' | '`'))
        .filter(|w| (w.starts_with("--") && w.len() > 2) || is_env(w))
        .filter(|w| {
            w.trim_start_matches('-')
                .to_ascii_lowercase()
                .split(['-', '_'])
                .any(|part| part.starts_with("test") || part.starts_with("fake"))
        })
        .map(str::to_owned)
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// Runs `cmd` to its end within [`LIMIT`] and returns its standard output; panics on failure.
fn run(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = crate::process::run(cmd, LIMIT);
    assert!(
        out.status.success(),
        "{shown} failed ({}): {}",
        out.status,
        out.stderr
    );
    out.stdout
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_name_a_test_hook_are_found() {
        let help = "Options:\n      --test-events-socket <PATH>  hook\n      --fake-kubelet\n  \
                    --listen <ADDR>  [env: X=] [default: 0.0.0.0:1]\n      --attest=<X>\n  -h, --help";
        // `--attest` is no test hook.
        assert_eq!(test_flags(help), ["--fake-kubelet", "--test-events-socket"]);
        assert!(test_flags("  --log-level <LEVEL>  latest test results").is_empty());
        assert_eq!(
            test_flags("  --run-tests\n  --with_fakes"),
            ["--run-tests", "--with_fakes"]
        );
        assert_eq!(
            test_flags("  --x <X>  [env: RDMA_GW_TEST_EVENTS_SOCKET=]\n  [env: RDMA_GW_LISTEN=]"),
            ["RDMA_GW_TEST_EVENTS_SOCKET"]
        );
    }

    #[test]
    fn a_package_with_a_test_only_dependency_fails_the_check() {
        // This crate's `fuzz` feature uses proptest, its `kube` feature tower-test.
        let failed = std::panic::catch_unwind(|| {
            assert_no_test_dependencies(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
        });
        let message = *failed.unwrap_err().downcast::<String>().unwrap();
        assert!(
            message.contains("[\"proptest\", \"tower-test\"]"),
            "{message}"
        );
    }

    #[test]
    fn test_only_crates_are_named() {
        assert!(is_test_only("rdma-device-plugin-testkit"));
        assert!(is_test_only("rdma-gateway-testbed"));
        assert!(is_test_only("tower-test"));
        assert!(!is_test_only("tokio"));
        assert!(!is_test_only("rdma-streams-common"));
    }

    #[test]
    fn a_binary_with_a_test_module_fails_the_check() {
        let dir = std::env::temp_dir().join(format!("shipped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join("bin");
        std::fs::write(
            &binary,
            b"\x7fELF\0\xff rdma_device_plugin::testing::fixture \0",
        )
        .unwrap();
        let binary = binary.to_str().unwrap().to_owned();
        let failed = std::panic::catch_unwind(|| {
            // A package with no test-only dependency, so the bytes are what fails.
            assert_no_test_code(
                env!("CARGO_MANIFEST_DIR"),
                "rdma-streams-protogen",
                &binary,
                &[],
            )
        });
        std::fs::remove_dir_all(&dir).unwrap();
        let message = *failed.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("contains test-only code"), "{message}");
        assert!(message.contains("::testing::"), "{message}");
    }
}
