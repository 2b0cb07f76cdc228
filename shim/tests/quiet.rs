//! Programs that make no TCP socket never make the decision: no stats file, no output, even
//! with logging on (every shell and `ls` in an opted-in container loads the shim).

mod common;

use std::ffi::OsString;
use std::time::Duration;

use common::*;

#[test]
fn non_socket_programs_leave_no_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path();
    let script = r#"
export LD_PRELOAD="$SHIM" STREAMSHIM_STATS="$W/" STREAMSHIM_LOG=debug
sh -c true
ls / >/dev/null
"$PY" -c 'import socket; socket.socket(socket.AF_UNIX).close(); socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()'
"#;
    let run = run_script(
        script,
        &[("W", OsString::from(w))],
        Duration::from_secs(30),
        false,
    );
    assert!(run.success, "{run:?}");
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr, "");
    let left: Vec<_> = std::fs::read_dir(w)
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "no stats file expected, found {left:?}");
}

/// The harness itself: a script that outlives its bound is killed, and the failure shows what
/// its processes were waiting for.
#[test]
fn a_hung_script_is_killed_and_shows_its_processes() {
    require_netns();
    let started = std::time::Instant::now();
    let panic = std::panic::catch_unwind(|| {
        netns("sleep 300 &\nwait", &[], std::time::Duration::from_secs(2))
    })
    .expect_err("the script must time out");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("script timed out after 2s"), "{msg}");
    assert!(msg.contains("sleep 300"), "the process list: {msg}");
    assert!(
        msg.contains("hrtimer_nanosleep") || msg.contains("do_nanosleep"),
        "{msg}"
    );
}
