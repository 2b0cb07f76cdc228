//! Test harness: the fake provider, timeouts, fault cases in child processes, and rsocket
//! helpers. Locating or building `libfakersocket.so`, [`within`] and the child-process runner
//! live in `rdma-streams-testkit`; this file binds them to this crate (case env var, limits).
// Not every test binary uses every helper.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use rdma_streams_testkit::{child, fake_rsocket};
use rdma_streams_transport::{Provider, RSocket};

// Not every test binary uses it.
#[allow(unused_imports)]
pub use rdma_streams_testkit::within;

/// Env var naming the case a re-executed test binary must run (see [`run_child`]).
pub const CHILD_CASE: &str = "TRANSPORT_TEST_CASE";
/// The fake's faults variable (read once per process by the fake).
pub const ENV_FAULTS: &str = "FAKE_RSOCKET_FAULTS";
/// The fake's default port offset: kernel port = rsocket port + 20000. Child processes run
/// with `FAKE_RSOCKET_PORT_OFFSET` removed, so this holds there.
pub const FAKE_PORT_OFFSET: u16 = 20_000;

/// The fake provider's path (`FAKE_RSOCKET_LIB`, else built first if needed). Panics with
/// instructions if it cannot be found or built.
pub fn fake_lib() -> PathBuf {
    fake_rsocket::library()
}

/// The fake provider, loaded.
pub fn fake() -> Provider {
    let lib = fake_lib();
    Provider::load(lib.to_str().expect("UTF-8 path")).expect("load the fake provider")
}

/// Re-runs this test binary with only the test `child_entry`, the case named in
/// [`CHILD_CASE`], the fake's path in `FAKE_RSOCKET_LIB`, the fake's settings and
/// `STREAMSHIM_PROVIDER` removed, and `env` set. The fake reads its faults once per process,
/// so every fault case needs its own process.
pub fn run_child(case: &str, env: &[(&str, &str)], limit: Duration) -> Output {
    with_fake_lib(env, |env| child::run(CHILD_CASE, case, env, limit))
}

/// [`run_child`] with a 60 s limit, asserting that the case passed.
pub fn child_passes(case: &str, env: &[(&str, &str)]) -> Output {
    with_fake_lib(env, |env| {
        child::passes(CHILD_CASE, case, env, Duration::from_secs(60))
    })
}

/// Calls `f` with `FAKE_RSOCKET_LIB` set to the fake's path, followed by `env`.
fn with_fake_lib<R>(env: &[(&str, &str)], f: impl FnOnce(&[(&str, &OsStr)]) -> R) -> R {
    let lib = fake_lib();
    let mut all = vec![(fake_rsocket::ENV_LIB, lib.as_os_str())];
    all.extend(env.iter().map(|&(k, v)| (k, OsStr::new(v))));
    f(&all)
}

/// In a child process, the case to run (None in the normal test run).
pub fn child_case() -> Option<String> {
    child::case(CHILD_CASE)
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
