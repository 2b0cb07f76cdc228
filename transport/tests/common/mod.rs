//! Test harness: finds (or builds) the fake provider, runs bodies under timeouts, and runs
//! fault cases in child processes.
//!
//! The fake provider `libfakersocket.so` comes from the workspace crate `shim/fake-rsocket`.
//! Cargo does not build another package's cdylib for this package's tests, so:
//! 1. `FAKE_RSOCKET_LIB=/path/libfakersocket.so` is used as is when set;
//! 2. otherwise the library is expected next to this test binary's profile directory
//!    (`<target>/<profile>/libfakersocket.so`, found from the test executable's path, which
//!    works for any `CARGO_TARGET_DIR`), and `cargo build -p fake-rsocket` is run (with the
//!    same target dir and profile) when it is missing or older than the fake's sources.
// Not every test binary uses every helper.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use rdma_streams_transport::{Provider, RSocket};

/// Env var naming the fake provider library to use.
pub const ENV_FAKE_LIB: &str = "FAKE_RSOCKET_LIB";
/// Env var naming the case a re-executed test binary must run (see [`run_child`]).
pub const CHILD_CASE: &str = "TRANSPORT_TEST_CASE";
/// The fake's faults variable (read once per process by the fake).
pub const ENV_FAULTS: &str = "FAKE_RSOCKET_FAULTS";
/// The fake's default port offset: kernel port = rsocket port + 20000. Child processes run
/// with `FAKE_RSOCKET_PORT_OFFSET` removed, so this holds there.
pub const FAKE_PORT_OFFSET: u16 = 20_000;

/// The fake provider's path, building it first if needed. Panics with instructions if it
/// cannot be found or built.
pub fn fake_lib() -> PathBuf {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match LIB.get_or_init(locate_or_build) {
        Ok(path) => path.clone(),
        Err(msg) => panic!("{msg}"),
    }
}

/// The fake provider, loaded.
pub fn fake() -> Provider {
    let lib = fake_lib();
    Provider::load(lib.to_str().expect("UTF-8 path")).expect("load the fake provider")
}

fn locate_or_build() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(ENV_FAKE_LIB) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{ENV_FAKE_LIB}={} does not exist", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <target>/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("test binary is not in <target>/<profile>/deps")?;
    let target_dir = profile_dir
        .parent()
        .ok_or("test binary is not in <target>/<profile>/deps")?;
    let lib = profile_dir.join("libfakersocket.so");
    let fake_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shim/fake-rsocket");
    if lib.is_file() && !stale(&lib, &fake_dir) {
        return Ok(lib);
    }
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let output = Command::new(&cargo)
        .arg("build")
        .arg("-p")
        .arg("fake-rsocket")
        .arg("--profile")
        .arg(profile)
        .arg("--manifest-path")
        .arg(fake_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {cargo} build -p fake-rsocket: {e}"))?;
    if !output.status.success() || !lib.is_file() {
        return Err(format!(
            "{} is missing and `cargo build -p fake-rsocket` failed ({}); build it first with \
             `cargo build -p fake-rsocket` or point {ENV_FAKE_LIB} at it.\n{}",
            lib.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(lib)
}

/// True if a file under the fake's `src/` or its `Cargo.toml` is newer than `lib`.
fn stale(lib: &Path, fake_dir: &Path) -> bool {
    let Some(built) = mtime(lib) else { return true };
    let mut newest = mtime(&fake_dir.join("Cargo.toml"));
    let mut dirs = vec![fake_dir.join("src")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                newest = newest.max(mtime(&path));
            }
        }
    }
    newest.is_some_and(|n| n > built)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`.
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test timed out after {limit:?}"),
    }
}

/// Re-runs this test binary with only the test `child_entry`, the case named in
/// [`CHILD_CASE`], the fake's path in [`ENV_FAKE_LIB`], and `env` set. The fake reads its
/// faults once per process, so every fault case needs its own process.
pub fn run_child(case: &str, env: &[(&str, &str)], limit: Duration) -> Output {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_CASE, case)
        .env(ENV_FAKE_LIB, fake_lib())
        .env_remove(ENV_FAULTS)
        .env_remove("FAKE_RSOCKET_PORT_OFFSET")
        .env_remove("FAKE_RSOCKET_HANG_MS")
        .env_remove("FAKE_RSOCKET_STATS_DIR")
        .env_remove("STREAMSHIM_PROVIDER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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

/// [`run_child`] with a 60 s limit, asserting that the case passed.
pub fn child_passes(case: &str, env: &[(&str, &str)]) -> Output {
    let out = run_child(case, env, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "child case {case} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// In a child process, the case to run (None in the normal test run).
pub fn child_case() -> Option<String> {
    std::env::var(CHILD_CASE).ok()
}

/// Deterministic pseudo-random bytes (xorshift64), fast enough for tens of MiB in debug.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A listening rsocket on 127.0.0.1 (ephemeral port) and its address.
pub fn rlistener(p: &Provider) -> (RSocket, SocketAddr) {
    let l = RSocket::listen_on(p, "127.0.0.1:0".parse().unwrap(), 16).expect("listen_on");
    let addr = l.local_addr().expect("local_addr");
    (l, addr)
}

/// A connected pair of blocking rsockets: (client, accepted).
pub fn rpair(p: &Provider) -> (RSocket, RSocket) {
    let (l, addr) = rlistener(p);
    let client = RSocket::connect_to(p, addr, Duration::from_secs(5)).expect("connect_to");
    let (server, _) = l.accept().expect("accept");
    (client, server)
}

/// Reads until EOF; an error ends the read too and is returned alongside the bytes.
pub fn read_to_end(mut r: impl Read) -> (Vec<u8>, Option<io::Error>) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (out, Some(e)),
        }
    }
}

/// Writes everything in chunks (so a slow reader interleaves with us).
pub fn write_chunks(mut w: impl Write, data: &[u8]) -> io::Result<()> {
    for chunk in data.chunks(100_000) {
        w.write_all(chunk)?;
    }
    Ok(())
}
