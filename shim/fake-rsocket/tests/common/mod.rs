//! Helpers for driving the fake's C ABI in-process, with timeouts and child processes.
// These tests call the exported `unsafe extern "C"` functions directly: that is the surface
// under test. Not every test binary uses every helper.
#![allow(unsafe_code, dead_code)]

use std::io;
use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use fakersocket as fake;
use libc::{c_int, pollfd, socklen_t};
use rdma_streams_testkit::child;
use socket2::SockAddr;

// Not every test binary uses it.
#[allow(unused_imports)]
pub use rdma_streams_testkit::within;

/// Env var naming the case a re-executed test binary must run (see [`run_child`]).
pub const CHILD_CASE: &str = "FAKE_RSOCKET_TEST_CASE";

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(ret: c_int) -> Result<c_int, i32> {
    if ret == -1 { Err(errno()) } else { Ok(ret) }
}

fn check_size(ret: isize) -> Result<usize, i32> {
    if ret == -1 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

pub fn socket(family: c_int) -> Result<c_int, i32> {
    // SAFETY: no pointers.
    check(unsafe { fake::rsocket(family, libc::SOCK_STREAM, 0) })
}

pub fn bind(fd: c_int, addr: SocketAddr) -> Result<(), i32> {
    let sa = SockAddr::from(addr);
    // SAFETY: `sa` is a valid sockaddr of `sa.len()` bytes.
    check(unsafe { fake::rbind(fd, sa.as_ptr().cast(), sa.len()) }).map(drop)
}

pub fn listen(fd: c_int, backlog: c_int) -> Result<(), i32> {
    // SAFETY: no pointers.
    check(unsafe { fake::rlisten(fd, backlog) }).map(drop)
}

/// A listening rsocket on 127.0.0.1 with an ephemeral port, and its rsocket address.
pub fn listener() -> (c_int, SocketAddr) {
    let fd = socket(libc::AF_INET).expect("rsocket");
    bind(fd, "127.0.0.1:0".parse().unwrap()).expect("rbind");
    listen(fd, 16).expect("rlisten");
    let addr = sockname(fd).expect("rgetsockname");
    (fd, addr)
}

fn read_addr(
    f: impl FnOnce(*mut libc::sockaddr, *mut socklen_t) -> c_int,
) -> Result<SocketAddr, i32> {
    // SAFETY: try_init hands out a sockaddr_storage and its length to fill.
    let res = unsafe {
        SockAddr::try_init(|storage, len| {
            if f(storage.cast(), len) == -1 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
    };
    match res {
        Ok(((), sa)) => Ok(sa.as_socket().expect("an IP address")),
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
    }
}

pub fn accept(fd: c_int) -> Result<(c_int, SocketAddr), i32> {
    let mut new_fd = -1;
    let peer = read_addr(|sa, len| {
        // SAFETY: `sa`/`len` come from try_init.
        new_fd = unsafe { fake::raccept(fd, sa, len) };
        new_fd
    })?;
    Ok((new_fd, peer))
}

pub fn connect(fd: c_int, addr: SocketAddr) -> Result<(), i32> {
    let sa = SockAddr::from(addr);
    // SAFETY: `sa` is a valid sockaddr of `sa.len()` bytes.
    check(unsafe { fake::rconnect(fd, sa.as_ptr().cast(), sa.len()) }).map(drop)
}

/// A connected (client, accepted server side) pair of blocking rsockets over 127.0.0.1.
pub fn pair() -> (c_int, c_int) {
    let (lfd, addr) = listener();
    let client = socket(libc::AF_INET).expect("rsocket");
    connect(client, addr).expect("rconnect");
    let (server, _) = accept(lfd).expect("raccept");
    close(lfd).expect("rclose");
    (client, server)
}

pub fn sockname(fd: c_int) -> Result<SocketAddr, i32> {
    // SAFETY: the pointers come from try_init.
    read_addr(|sa, len| unsafe { fake::rgetsockname(fd, sa, len) })
}

pub fn peername(fd: c_int) -> Result<SocketAddr, i32> {
    // SAFETY: the pointers come from try_init.
    read_addr(|sa, len| unsafe { fake::rgetpeername(fd, sa, len) })
}

pub fn send(fd: c_int, data: &[u8]) -> Result<usize, i32> {
    // SAFETY: `data` is readable for its length.
    check_size(unsafe { fake::rsend(fd, data.as_ptr().cast(), data.len(), 0) })
}

pub fn send_all(fd: c_int, mut data: &[u8]) {
    while !data.is_empty() {
        match send(fd, data) {
            Ok(n) => data = &data[n..],
            Err(libc::EAGAIN) | Err(libc::EINTR) => wait(fd, libc::POLLOUT),
            Err(e) => panic!("rsend: errno {e}"),
        }
    }
}

pub fn recv(fd: c_int, buf: &mut [u8], flags: c_int) -> Result<usize, i32> {
    // SAFETY: `buf` is writable for its length.
    check_size(unsafe { fake::rrecv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) })
}

/// Reads until EOF (retrying EAGAIN), returning everything read.
pub fn recv_to_end(fd: c_int) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match recv(fd, &mut buf, 0) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(libc::EAGAIN) | Err(libc::EINTR) => wait(fd, libc::POLLIN),
            Err(e) => panic!("rrecv: errno {e}"),
        }
    }
}

pub fn recv_exact(fd: c_int, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match recv(fd, &mut out[got..], 0) {
            Ok(0) => panic!("EOF after {got} of {len} bytes"),
            Ok(n) => got += n,
            Err(libc::EAGAIN) | Err(libc::EINTR) => wait(fd, libc::POLLIN),
            Err(e) => panic!("rrecv: errno {e}"),
        }
    }
    out
}

pub fn shutdown(fd: c_int, how: c_int) -> Result<(), i32> {
    // SAFETY: no pointers.
    check(unsafe { fake::rshutdown(fd, how) }).map(drop)
}

pub fn close(fd: c_int) -> Result<(), i32> {
    // SAFETY: no pointers.
    check(unsafe { fake::rclose(fd) }).map(drop)
}

pub fn set_nonblocking(fd: c_int, on: bool) {
    // SAFETY: no pointers.
    let flags = check(unsafe { fake::rfcntl(fd, libc::F_GETFL, 0) }).expect("F_GETFL");
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: no pointers.
    check(unsafe { fake::rfcntl(fd, libc::F_SETFL, flags.into()) }).expect("F_SETFL");
}

pub fn get_int_opt(fd: c_int, level: c_int, name: c_int) -> Result<c_int, i32> {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `value` and `len` are valid for writes.
    check(unsafe { fake::rgetsockopt(fd, level, name, (&raw mut value).cast(), &mut len) })?;
    assert_eq!(len as usize, size_of::<c_int>());
    Ok(value)
}

pub fn set_int_opt(fd: c_int, level: c_int, name: c_int, value: c_int) -> Result<(), i32> {
    // SAFETY: `value` is readable for its size.
    check(unsafe {
        fake::rsetsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<c_int>() as socklen_t,
        )
    })
    .map(drop)
}

pub fn so_error(fd: c_int) -> c_int {
    get_int_opt(fd, libc::SOL_SOCKET, libc::SO_ERROR).expect("SO_ERROR")
}

pub fn poll(fds: &mut [pollfd], timeout_ms: c_int) -> Result<usize, i32> {
    // SAFETY: `fds` is a valid, writable pollfd array.
    check(unsafe { fake::rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) })
        .map(|n| n as usize)
}

pub fn pfd(fd: c_int, events: i16) -> pollfd {
    pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits up to 1 s for `events` on one r-fd.
pub fn wait(fd: c_int, events: i16) {
    let mut fds = [pfd(fd, events)];
    let _ = poll(&mut fds, 1000);
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Re-runs this test binary with only the test `child_entry`, with `case` in
/// [`CHILD_CASE`], the fake's settings removed and `env` set, and returns its output. Fails
/// on timeout. Faults are parsed once per process, so every fault case needs its own process.
pub fn run_child(case: &str, env: &[(&str, &str)], limit: Duration) -> Output {
    assert_settings_cleared();
    child::run(CHILD_CASE, case, env, limit)
}

/// [`run_child`] with a 30 s limit, asserting that the case passed.
pub fn child_passes(case: &str, env: &[(&str, &str)]) -> Output {
    assert_settings_cleared();
    child::passes(CHILD_CASE, case, env, Duration::from_secs(30))
}

/// The shared runner clears the fake's settings by name: keep it in step with the fake.
fn assert_settings_cleared() {
    for var in [
        fake::ENV_FAULTS,
        fake::ENV_STATS_DIR,
        fake::ENV_HANG_MS,
        fake::ENV_PORT_OFFSET,
    ] {
        assert!(
            child::CLEARED.contains(&var),
            "testkit does not clear {var}"
        );
    }
}

/// In a child process, the case to run (None in the normal test run).
pub fn child_case() -> Option<String> {
    child::case(CHILD_CASE)
}
