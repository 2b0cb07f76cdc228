//! Every `FAKE_RSOCKET_FAULTS` fault, and the stats file. Faults and settings are read once
//! per process, so each case runs in a child process: this test binary re-executed with only
//! `child_entry` selected and the case named in `FAKE_RSOCKET_TEST_CASE`.
// These tests call the exported `unsafe extern "C"` functions: the surface under test.
#![allow(unsafe_code)]

mod common;

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use fakersocket as fake;

/// Dispatches the case of a child process; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Some(case) = child_case() else { return };
    match case.as_str() {
        "nodev" => case_nodev(),
        "enomem" => case_enomem(),
        "refuse" => case_refuse(),
        "slow_connect" => case_slow_connect(),
        "hang_connect" => case_hang_connect(),
        "eagain_storm" => case_eagain_storm(),
        "reset_after" => case_reset_after(),
        "poll_never_wakes" => case_poll_never_wakes(),
        "unknown_faults" => case_unknown_faults(),
        "stats_file" => case_stats_file(),
        "port_offset" => case_port_offset(),
        other => panic!("unknown child case {other}"),
    }
}

fn faults(spec: &str) -> [(&'static str, &str); 1] {
    [(fake::ENV_FAULTS, spec)]
}

#[test]
fn fault_nodev() {
    child_passes("nodev", &faults("nodev"));
}

fn case_nodev() {
    assert!(fake::fake_rsocket_faults().nodev);
    for family in [libc::AF_INET, libc::AF_INET6] {
        assert_eq!(socket(family), Err(libc::ENODEV));
    }
}

#[test]
fn fault_enomem() {
    child_passes("enomem", &faults("enomem"));
}

fn case_enomem() {
    assert_eq!(socket(libc::AF_INET), Err(libc::ENOMEM));
}

#[test]
fn fault_refuse() {
    child_passes("refuse", &faults("refuse"));
}

fn case_refuse() {
    // Even with a listener in place.
    let (lfd, addr) = listener();
    let client = socket(libc::AF_INET).unwrap();
    assert_eq!(connect(client, addr), Err(libc::ECONNREFUSED));
    set_nonblocking(client, true);
    assert_eq!(connect(client, addr), Err(libc::ECONNREFUSED));
    close(client).unwrap();
    close(lfd).unwrap();
}

#[test]
fn fault_slow_connect() {
    child_passes("slow_connect", &faults("slow_connect=300"));
}

fn case_slow_connect() {
    let (lfd, addr) = listener();
    let client = socket(libc::AF_INET).unwrap();
    let start = Instant::now();
    connect(client, addr).unwrap();
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    let (server, _) = accept(lfd).unwrap();
    send_all(client, b"late");
    assert_eq!(recv_exact(server, 4), b"late");
    for fd in [client, server, lfd] {
        close(fd).unwrap();
    }
}

#[test]
fn fault_hang_connect() {
    child_passes(
        "hang_connect",
        &[
            (fake::ENV_FAULTS, "hang_connect"),
            (fake::ENV_HANG_MS, "300"),
        ],
    );
}

fn case_hang_connect() {
    let (lfd, addr) = listener();
    // Blocking: waits for the cap, then ETIMEDOUT.
    let client = socket(libc::AF_INET).unwrap();
    let start = Instant::now();
    assert_eq!(connect(client, addr), Err(libc::ETIMEDOUT));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    close(client).unwrap();
    // Non-blocking: EINPROGRESS, then never writable.
    let client = socket(libc::AF_INET).unwrap();
    set_nonblocking(client, true);
    assert_eq!(connect(client, addr), Err(libc::EINPROGRESS));
    let mut fds = [pfd(client, libc::POLLOUT | libc::POLLIN)];
    let start = Instant::now();
    assert_eq!(poll(&mut fds, 400), Ok(0));
    assert!(start.elapsed() >= Duration::from_millis(390));
    assert_eq!(so_error(client), 0);
    assert_eq!(connect(client, addr), Err(libc::EALREADY));
    assert_eq!(send(client, b"x"), Err(libc::EAGAIN));
    close(client).unwrap();
    close(lfd).unwrap();
}

#[test]
fn fault_eagain_storm() {
    child_passes("eagain_storm", &faults("eagain_storm=3"));
}

fn case_eagain_storm() {
    // Both sockets are blocking, yet the first three data calls on each fail with EAGAIN.
    let (client, server) = pair();
    for _ in 0..3 {
        assert_eq!(send(client, b"abc"), Err(libc::EAGAIN));
    }
    assert_eq!(send(client, b"abc"), Ok(3));
    let mut buf = [0u8; 8];
    for _ in 0..3 {
        assert_eq!(recv(server, &mut buf, 0), Err(libc::EAGAIN));
    }
    assert_eq!(recv(server, &mut buf, 0), Ok(3));
    assert_eq!(&buf[..3], b"abc");
    close(client).unwrap();
    close(server).unwrap();
}

#[test]
fn fault_reset_after() {
    child_passes("reset_after", &faults("reset_after=1000"));
}

fn case_reset_after() {
    // The peer is a plain kernel TCP client, so only the r-fd side counts bytes.
    let (lfd, addr) = listener();
    let kernel_port = addr.port().wrapping_add(fake::fake_rsocket_port_offset());
    let mut peer = TcpStream::connect(("127.0.0.1", kernel_port)).unwrap();
    let (fd, _) = accept(lfd).unwrap();
    assert_eq!(send(fd, &[7u8; 600]), Ok(600));
    // The budget cuts the next send short, then the connection is reset.
    assert_eq!(send(fd, &[7u8; 600]), Ok(400));
    assert_eq!(send(fd, b"more"), Err(libc::ECONNRESET));
    let mut buf = [0u8; 16];
    assert_eq!(recv(fd, &mut buf, 0), Err(libc::ECONNRESET));
    let mut fds = [pfd(fd, libc::POLLIN)];
    assert_eq!(poll(&mut fds, 1000), Ok(1));
    assert!(fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0);
    // The kernel peer gets at most the 1000 bytes, then a reset (not a clean EOF).
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut total = 0;
    let mut chunk = [0u8; 4096];
    let end = loop {
        match peer.read(&mut chunk) {
            Ok(0) => break None,
            Ok(n) => total += n,
            Err(e) => break Some(e.kind()),
        }
    };
    assert!(total <= 1000, "peer read {total} bytes");
    assert_eq!(end, Some(ErrorKind::ConnectionReset));
    close(fd).unwrap();
    close(lfd).unwrap();
}

#[test]
fn fault_poll_never_wakes() {
    child_passes("poll_never_wakes", &faults("poll_never_wakes"));
}

fn case_poll_never_wakes() {
    let (client, server) = pair();
    send_all(server, b"ready");
    thread::sleep(Duration::from_millis(50));
    let mut fds = [pfd(client, libc::POLLIN | libc::POLLOUT)];
    let start = Instant::now();
    assert_eq!(poll(&mut fds, 200), Ok(0));
    assert!(start.elapsed() >= Duration::from_millis(190));
    // An ordinary fd in the same call still wakes it.
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for two fds; one byte written from a valid buffer.
    unsafe {
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        assert_eq!(libc::write(pipe[1], b"x".as_ptr().cast(), 1), 1);
    }
    let mut fds = [pfd(client, libc::POLLIN), pfd(pipe[0], libc::POLLIN)];
    assert_eq!(poll(&mut fds, 2000), Ok(1));
    assert_eq!((fds[0].revents, fds[1].revents), (0, libc::POLLIN));
    // The data is there for a blocking read all the same.
    assert_eq!(recv_exact(client, 5), b"ready");
    // SAFETY: closing our own pipe fds.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    close(client).unwrap();
    close(server).unwrap();
}

#[test]
fn unknown_faults_are_ignored_silently() {
    let out = child_passes(
        "unknown_faults",
        &faults("bogus,frobnicate=3,slow_connect=x"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("bogus") && !stderr.contains("frobnicate"),
        "the fake printed something: {stderr}"
    );
}

fn case_unknown_faults() {
    assert_eq!(fake::fake_rsocket_faults(), &fake::Faults::default());
    let (client, server) = pair();
    close(client).unwrap();
    close(server).unwrap();
}

#[test]
fn stats_file_is_written_on_rclose_and_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let dir_str = dir.path().to_str().unwrap();
    let out = child_passes("stats_file", &[(fake::ENV_STATS_DIR, dir_str)]);
    // The child reports its pid on stdout (the file is named after it).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid = stdout
        .lines()
        .find_map(|l| l.split_once("child-pid=").map(|(_, pid)| pid.trim()))
        .expect("child pid line");
    let file = dir.path().join(format!("{pid}.json"));
    let stats = read_stats(&file);
    // The last write happened at exit, after the final sends (no rclose followed them).
    assert_eq!(stats.connects, 1);
    assert_eq!(stats.accepts, 1);
    assert_eq!(stats.bytes_sent, 12);
    assert_eq!(stats.bytes_received, 12);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
}

fn read_stats(path: &Path) -> fake::Snapshot {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("stats file {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad stats JSON {text:?}: {e}"))
}

fn case_stats_file() {
    let dir = std::path::PathBuf::from(std::env::var(fake::ENV_STATS_DIR).unwrap());
    let file = dir.join(format!("{}.json", std::process::id()));
    // The test harness captures nothing with --nocapture: this goes to the parent.
    let _ = std::io::Write::write_all(
        &mut std::io::stdout(),
        format!("child-pid={}\n", std::process::id()).as_bytes(),
    );
    let (lfd, addr) = listener();
    let client = socket(libc::AF_INET).unwrap();
    connect(client, addr).unwrap();
    let (server, _) = accept(lfd).unwrap();
    send_all(client, b"hello");
    assert_eq!(recv_exact(server, 5), b"hello");
    close(lfd).unwrap();
    // Written at rclose.
    let at_close = read_stats(&file);
    assert_eq!(
        at_close,
        fake::Snapshot {
            connects: 1,
            accepts: 1,
            bytes_sent: 5,
            bytes_received: 5
        }
    );
    // More traffic and no further rclose: only the exit hook can record it.
    send_all(server, b"world!!");
    assert_eq!(recv_exact(client, 7), b"world!!");
    assert_eq!(read_stats(&file).bytes_sent, 5);
}

#[test]
fn port_offset_is_configurable() {
    child_passes("port_offset", &[(fake::ENV_PORT_OFFSET, "1000")]);
}

fn case_port_offset() {
    assert_eq!(fake::fake_rsocket_port_offset(), 1000);
    let (lfd, addr) = listener();
    let _tcp = TcpStream::connect(("127.0.0.1", addr.port().wrapping_add(1000))).unwrap();
    let (fd, _) = accept(lfd).unwrap();
    close(fd).unwrap();
    close(lfd).unwrap();
}
