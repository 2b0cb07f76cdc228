//! The shipped `rdma-migration-gateway` (a host-network, host-PID node agent) carries no
//! test-only code: no flag of its own mentions tests, the test bed's `--test-events-socket`
//! is an unknown argument to it, and none of its normal or build dependencies is a test crate
//! (the test bed, `rdma-gateway-testbed`, is a crate of its own that is never shipped).

// An integration test: its helper panics to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs::File,
    io::{Read, Seek},
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-migration-gateway");

/// What a command printed, and how it ended.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` to its end, killed (and the test failed) after `limit`.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut stdout = tempfile::tempfile().unwrap();
    let mut stderr = tempfile::tempfile().unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().unwrap())
        .stderr(stderr.try_clone().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |f: &mut File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Output {
        status,
        stdout: read(&mut stdout),
        stderr: read(&mut stderr),
    }
}

#[test]
fn help_lists_no_test_flag() {
    let out = run(Command::new(BIN).arg("--help"), Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    let flags: Vec<&str> = out
        .stdout
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
        .filter(|word| word.starts_with("--"))
        .collect();
    assert!(flags.contains(&"--listen"), "{}", out.stdout);
    assert!(flags.contains(&"--node-hooks-socket"), "{}", out.stdout);
    let test_flags: Vec<&&str> = flags
        .iter()
        .filter(|f| f.to_ascii_lowercase().contains("test"))
        .collect();
    assert!(test_flags.is_empty(), "test-only flags: {test_flags:?}");
}

#[test]
fn the_test_events_socket_is_an_unknown_argument() {
    let out = run(
        Command::new(BIN).args(["--test-events-socket", "x"]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("unexpected argument '--test-events-socket'"),
        "{}",
        out.stderr
    );
}

#[test]
fn no_test_crate_is_a_dependency() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = run(
        Command::new(env!("CARGO")).args([
            "tree",
            "-p",
            "rdma-migration-gateway",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--offline",
            "--manifest-path",
            manifest,
        ]),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "cargo tree failed:\n{}", out.stderr);
    assert!(
        out.stdout.contains("rdma-migration-gateway v"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("rdma-streams-common v"),
        "{}",
        out.stdout
    );
    let test_crates: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("testbed") || l.contains("testkit"))
        .collect();
    assert!(test_crates.is_empty(), "test crates: {test_crates:?}");
}
