//! Fault cases in child processes. The fake reads its faults and settings once per process,
//! so every fault case runs in its own process: the current test binary re-executed with only
//! the test `child_entry` selected and the case's name in a per-crate env var.
//!
//! A harness dispatches in its `child_entry` test on [`case`] and starts cases with [`run`]
//! or [`passes`].

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Env vars removed from every child's environment before the case's own are set: the
/// fake's settings (`FAKE_RSOCKET_FAULTS`, `_PORT_OFFSET`, `_HANG_MS`, `_STATS_DIR`) and the
/// provider selection (`STREAMSHIM_PROVIDER`), so only what a case sets applies.
pub const CLEARED: [&str; 5] = [
    "FAKE_RSOCKET_FAULTS",
    "FAKE_RSOCKET_PORT_OFFSET",
    "FAKE_RSOCKET_HANG_MS",
    "FAKE_RSOCKET_STATS_DIR",
    "STREAMSHIM_PROVIDER",
];

/// Re-runs this test binary with only the test `child_entry` (`--exact`, one thread,
/// `--nocapture`), `case` in the env var `case_var`, the vars in [`CLEARED`] removed, and
/// `env` set (later entries win), and returns its output. Kills the child and fails the test
/// if it takes longer than `limit`.
pub fn run<K, V>(case_var: &str, case: &str, env: &[(K, V)], limit: Duration) -> Output
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(case_var, case)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in CLEARED {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn child test");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("child output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("child output");
            panic!(
                "child case {case} timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// [`run`], asserting that the case passed (exit status 0); returns its output.
pub fn passes<K, V>(case_var: &str, case: &str, env: &[(K, V)], limit: Duration) -> Output
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let out = run(case_var, case, env, limit);
    assert!(
        out.status.success(),
        "child case {case} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// In a child process started by [`run`] with `case_var`, the case to run; `None` in the
/// normal test run.
pub fn case(case_var: &str) -> Option<String> {
    std::env::var(case_var).ok()
}
