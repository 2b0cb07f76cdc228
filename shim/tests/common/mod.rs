//! Test harness: finds `libstreamshim.so`, runs shell scripts in their own network namespace
//! under a hard timeout, and reads `STREAMSHIM_STATS` files.
//!
//! The shim: `STREAMSHIM_LIB` if set, else the cdylib Cargo built for this test run
//! (`<target>/<profile>/libstreamshim.so` or `.../deps/libstreamshim.so`, the newer one).

// Test support: a panic is how a helper fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Not every test binary uses every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// The hooks `libstreamshim.so` exports, and nothing else.
pub const HOOKS: [&str; 37] = [
    "accept",
    "accept4",
    "close",
    "connect",
    "dup",
    "dup2",
    "dup3",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "fcntl",
    "fcntl64",
    "getpeername",
    "getsockname",
    "getsockopt",
    "ioctl",
    "listen",
    "poll",
    "ppoll",
    "pselect",
    "read",
    "recv",
    "recvfrom",
    "recvmsg",
    "select",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setsockopt",
    "socket",
    "splice",
    "write",
    "writev",
];

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary is not in <target>/<profile>/deps")
        .to_path_buf()
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The shim library under test.
pub fn shim_lib() -> PathBuf {
    if let Some(p) = std::env::var_os("STREAMSHIM_LIB") {
        return PathBuf::from(p);
    }
    let dir = profile_dir();
    let candidates = [
        dir.join("libstreamshim.so"),
        dir.join("deps/libstreamshim.so"),
    ];
    candidates
        .iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| mtime(p))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "libstreamshim.so not found in {} (run through `cargo test -p rdma-streams-shim`)",
                dir.display()
            )
        })
}

/// The real Python interpreter (not a pyenv shell shim), so the shim lands in Python itself.
pub fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by the shim tests");
        assert!(out.status.success(), "python3 failed: {out:?}");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// What a script printed.
#[derive(Debug)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `script` with bash (`set -eu`, job control on so background jobs get SIGINT) with
/// `SHIM`, `PY` and `env` in the environment, killed after `limit` (with `netns`:
/// every process it started, through its PID namespace).
pub fn run_script(script: &str, env: &[(&str, OsString)], limit: Duration, netns: bool) -> Run {
    let full = format!(
        "set -eu\nset -m\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{}{script}\n",
        if netns { "ip link set lo up\n" } else { "" }
    );
    let mut cmd = if netns {
        // A PID namespace too, with bash as its init: when the timeout kills unshare, the
        // kernel kills bash (--kill-child) and with it every process the script started, so
        // no orphan keeps the output pipes open. Its own /proc (and so a mount namespace),
        // so that the pids the script sees are the ones /proc/PID knows.
        let mut c = Command::new("unshare");
        c.args(["-n", "-p", "-f", "--mount-proc", "--kill-child", "env"])
            .args(DEFAULT_SIGNALS)
            .args(["bash", "-c", &full]);
        c
    } else {
        let mut c = Command::new("env");
        c.args(DEFAULT_SIGNALS).args(["bash", "-c", &full]);
        c
    };
    cmd.env("SHIM", shim_lib())
        .env("PY", python())
        .env_remove("LD_PRELOAD")
        .env_remove("STREAMSHIM_DISABLE")
        .env_remove("STREAMSHIM_POLICY")
        .env_remove("STREAMSHIM_PROVIDER")
        .env_remove("STREAMSHIM_STATS")
        .env_remove("STREAMSHIM_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn bash/unshare");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let tree = process_tree(child.id());
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "script timed out after {limit:?}\nprocesses then (pid state wchan args; \
                 threads; kernel stack):\n{tree}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    Run {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `env` arguments that give the script SIGINT and SIGQUIT back: a test run started in the
/// background of a shell (nohup, `cmd &`) inherits them ignored, a program that finds SIGINT
/// ignored keeps it so (Python does), and a script's `kill -INT` would then hang it.
const DEFAULT_SIGNALS: [&str; 1] = ["--default-signal=INT,QUIT"];

/// `root` and its descendants as they are now: pid, state, where each waits in the kernel, the
/// command line, and every thread's state and kernel stack (what a hung script was waiting
/// for).
fn process_tree(root: u32) -> String {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = read(format!("/proc/{pid}/stat"));
        // After the command name in parentheses: state, then the parent's pid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            parents.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let mut out = String::new();
    for pid in tree {
        let args = read(format!("/proc/{pid}/cmdline")).replace('\0', " ");
        let state = read(format!("/proc/{pid}/status"))
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or_default()
            .to_string();
        let status = read(format!("/proc/{pid}/status"));
        let signals: Vec<&str> = status
            .lines()
            .filter(|l| {
                ["SigBlk:", "SigIgn:", "SigCgt:"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .map(str::trim)
            .collect();
        let wchan = read(format!("/proc/{pid}/wchan"));
        out.push_str(&format!(
            "{pid} [{state}] {wchan} ({}): {}\n",
            signals.join(" ").replace('\t', " "),
            args.trim()
        ));
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let tid = t.file_name().to_string_lossy().into_owned();
            let comm = read(format!("/proc/{pid}/task/{tid}/comm"));
            let stack = read(format!("/proc/{pid}/task/{tid}/stack"));
            let top: Vec<&str> = stack.lines().take(6).collect();
            out.push_str(&format!("    {tid} {}: {}\n", comm.trim(), top.join(" | ")));
        }
    }
    out
}

/// Fails the test unless `unshare -n` works here (root or CAP_SYS_ADMIN is required; the
/// network cases never skip).
pub fn require_netns() {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let r = OK.get_or_init(|| {
        match Command::new("unshare")
            .args(["-n", "sh", "-c", "ip link set lo up"])
            .output()
        {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "`unshare -n` failed ({}): {} -- the shim's network tests need a new network \
                 namespace (run as root or with CAP_SYS_ADMIN)",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("cannot run unshare: {e}")),
        }
    });
    if let Err(msg) = r {
        panic!("{msg}");
    }
}

/// Runs `script` in a fresh network namespace (lo up), asserting it exits 0.
pub fn netns(script: &str, env: &[(&str, OsString)], limit: Duration) -> Run {
    require_netns();
    let run = run_script(script, env, limit, true);
    assert!(
        run.success,
        "script failed\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    run
}

/// Parsed stats files in `dir` whose names start with `prefix`, by file name.
pub fn stats_files(dir: &Path, prefix: &str) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read stats dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && name.ends_with(".json") {
            let text = std::fs::read_to_string(entry.path()).expect("read stats");
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("stats file {name} is not JSON ({e}): {text}"));
            out.insert(name, v);
        }
    }
    out
}

/// The single stats file with this prefix.
pub fn one_stats(dir: &Path, prefix: &str) -> serde_json::Value {
    let files = stats_files(dir, prefix);
    assert_eq!(
        files.len(),
        1,
        "expected one stats file {prefix}*.json in {}, found {:?}",
        dir.display(),
        files.keys().collect::<Vec<_>>()
    );
    files.into_values().next().unwrap_or_default()
}

/// Asserts that `role` counted exactly `{reason: n}` on tcp and nothing on rdma.
pub fn assert_counts(stats: &serde_json::Value, role: &str, reason: &str, n: u64) {
    let tcp = &stats[role]["tcp"];
    let want = serde_json::json!({ reason: n });
    assert_eq!(tcp, &want, "{role} tcp counters in {stats}");
    assert_eq!(stats[role]["total"]["rdma"], 0, "{role} rdma in {stats}");
    assert_eq!(
        stats[role]["total"]["tcp"], n,
        "{role} tcp total in {stats}"
    );
}

/// Asserts that `role` counted nothing at all.
pub fn assert_no_counts(stats: &serde_json::Value, role: &str) {
    assert_eq!(stats[role]["total"]["tcp"], 0, "{role} in {stats}");
    assert_eq!(stats[role]["total"]["rdma"], 0, "{role} in {stats}");
}

/// Wait-for-listener snippet for scripts: `wait_port 5201`.
pub const WAIT_PORT: &str = r#"
wait_port() {
  for _ in $(seq 1 200); do
    ss -ltnH | grep -q ":$1 " && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2; return 1
}
"#;
