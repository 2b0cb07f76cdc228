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
