//! Test harness: finds `libstreamshim.so` and the fake provider, runs shell scripts in their
//! own network namespace under a hard timeout, and reads `STREAMSHIM_STATS` files.
//!
//! - The shim: `STREAMSHIM_LIB` if set, else the cdylib Cargo built for this test run
//!   (`<target>/<profile>/libstreamshim.so` or `.../deps/libstreamshim.so`, the newer one).
//! - The fake provider `libfakersocket.so`: `rdma_streams_testkit::fake_rsocket::library`
//!   (`FAKE_RSOCKET_LIB`, else next to the test binary's profile dir, built with
//!   `cargo build -p fake-rsocket` when missing or older than its sources).
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
pub const HOOKS: [&str; 16] = [
    "accept",
    "accept4",
    "close",
    "connect",
    "dup",
    "dup2",
    "dup3",
    "epoll_ctl",
    "fcntl",
    "fcntl64",
    "getpeername",
    "getsockname",
    "getsockopt",
    "listen",
    "setsockopt",
    "socket",
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

/// The fake rsocket provider, built if needed.
pub fn fake_lib() -> PathBuf {
    rdma_streams_testkit::fake_rsocket::library()
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
/// `SHIM`, `FAKE`, `PY` and `env` in the environment, killed after `limit` (with `netns`:
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
        c.args([
            "-n",
            "-p",
            "-f",
            "--mount-proc",
            "--kill-child",
            "bash",
            "-c",
            &full,
        ]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", &full]);
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
        .env_remove("FAKE_RSOCKET_FAULTS")
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
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "script timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
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

/// Asserts that `role` counted exactly `n` upgraded (rdma UPGRADED) connections and no tcp.
pub fn assert_upgraded(stats: &serde_json::Value, role: &str, n: u64) {
    assert_eq!(
        stats[role]["rdma"],
        serde_json::json!({ "UPGRADED": n }),
        "{role} rdma counters in {stats}"
    );
    assert_eq!(stats[role]["total"]["tcp"], 0, "{role} tcp in {stats}");
}

/// The fake provider's per-process counters (`FAKE_RSOCKET_STATS_DIR`): the largest
/// `bytes_sent` and `bytes_received` of any process, and the number of files.
pub fn fake_bytes(dir: &Path) -> (u64, u64, usize) {
    let mut sent = 0;
    let mut received = 0;
    let mut files = 0;
    for entry in std::fs::read_dir(dir)
        .expect("read fake stats dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("read fake stats");
        let v: serde_json::Value = serde_json::from_str(&text).expect("fake stats JSON");
        sent = sent.max(v["bytes_sent"].as_u64().unwrap_or(0));
        received = received.max(v["bytes_received"].as_u64().unwrap_or(0));
        files += 1;
    }
    (sent, received, files)
}

/// Sums `role`'s tcp counters (by reason) and its rdma total over every stats file with
/// `prefix` (a forking program writes one file per process).
pub fn sum_counts(
    w: &Path,
    prefix: &str,
    role: &str,
) -> (serde_json::Map<String, serde_json::Value>, u64) {
    let mut tcp = serde_json::Map::new();
    let mut rdma = 0;
    for v in stats_files(w, prefix).values() {
        if let Some(m) = v[role]["tcp"].as_object() {
            for (k, n) in m {
                let old = tcp.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                tcp.insert(k.clone(), (old + n.as_u64().unwrap_or(0)).into());
            }
        }
        rdma += v[role]["total"]["rdma"].as_u64().unwrap_or(0);
    }
    (tcp, rdma)
}

/// Script snippet: two hosts, network namespaces `$NSA` (198.18.0.1, `$A`) and `$NSB`
/// (198.18.0.2, `$B`) joined by a veth pair, deleted on exit with every background job;
/// `on_a`/`on_b` run a command on a host, `wait_port_on NS PORT` waits for a listener there.
pub const TWO_HOSTS: &str = r#"
R=$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')
NSA=rs${R}a
NSB=rs${R}b
A=198.18.0.1
B=198.18.0.2
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  ip netns del "$NSA" 2>/dev/null || true
  ip netns del "$NSB" 2>/dev/null || true
}
trap cleanup EXIT
ip netns del "$NSA" 2>/dev/null || true
ip netns del "$NSB" 2>/dev/null || true
ip netns add "$NSA"
ip netns add "$NSB"
ip link add "${NSA}v" type veth peer name "${NSB}v"
ip link set "${NSA}v" netns "$NSA"
ip link set "${NSB}v" netns "$NSB"
ip -n "$NSA" addr add "$A/24" dev "${NSA}v"
ip -n "$NSB" addr add "$B/24" dev "${NSB}v"
for ns in "$NSA" "$NSB"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${ns}v" up
done
on_a() { ip netns exec "$NSA" "$@"; }
on_b() { ip netns exec "$NSB" "$@"; }
wait_port_on() {
  for _ in $(seq 1 200); do
    ip netns exec "$1" ss -ltnH | grep -q ":$2 " && return 0
    sleep 0.05
  done
  echo "nothing listens on port $2 in $1" >&2; return 1
}
"#;
