//! A process that connects, forks, and connects in both parent and child: the child starts
//! with fresh counters and writes its own stats file (`%p`).

mod common;

use std::ffi::OsString;
use std::time::Duration;

use common::*;

const SCRIPT: &str = r#"
import os, socket, sys
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(16)
addr = ls.getsockname()

def dial():
    c = socket.socket()
    c.connect(addr)
    return c

keep = [dial()]
pid = os.fork()
if pid == 0:
    keep.append(dial())
    print("child", os.getpid(), flush=True)
    sys.exit(0)
keep.append(dial())
keep.append(dial())
_, status = os.waitpid(pid, 0)
print("parent", os.getpid(), flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

#[test]
fn fork_child_counts_separately() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path();
    std::fs::write(w.join("fork.py"), SCRIPT).expect("write script");
    let run = netns(
        r#"LD_PRELOAD="$SHIM" STREAMSHIM_STATS="$W/st-%p.json" "$PY" "$W/fork.py""#,
        &[("W", OsString::from(w))],
        Duration::from_secs(30),
    );
    assert_eq!(run.stderr, "", "silent by default");
    let pid_of = |who: &str| -> String {
        run.stdout
            .lines()
            .find_map(|l| l.strip_prefix(who)?.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no {who} pid in {:?}", run.stdout))
            .to_string()
    };
    let (parent, child) = (pid_of("parent "), pid_of("child "));
    let files = stats_files(w, "st-");
    assert_eq!(files.len(), 2, "{files:?}");
    let p = &files[&format!("st-{parent}.json")];
    let c = &files[&format!("st-{child}.json")];
    assert_counts(p, "client", "NO_DEVICE", 3);
    assert_counts(c, "client", "NO_DEVICE", 1);
    assert_eq!(c["pid"].to_string(), child);
}
