//! RSocket and poll against the fake provider.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rdma_streams_transport::{Events, PollFd, RSocket, RSocketError, RdmaOption, poll};

const LIMIT: Duration = Duration::from_secs(30);

/// Dispatches the case of a child process; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Some(case) = child_case() else { return };
    match case.as_str() {
        "hang_connect" => case_hang_connect(),
        "refuse" => case_refuse(),
        "eagain_storm" => case_eagain_storm(),
        other => panic!("unknown child case {other}"),
    }
}

#[test]
fn echo_through_rsockets() {
    within(LIMIT, || {
        let p = fake();
        let (listener, addr) = rlistener(&p);
        assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST);
        let server = thread::spawn(move || {
            let (s, peer) = listener.accept().unwrap();
            assert_eq!(s.peer_addr().unwrap(), peer);
            let (data, err) = read_to_end(&s);
            assert!(err.is_none());
            s.write_all(&data).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            peer
        });
        let client = RSocket::connect_to(&p, addr, Duration::from_secs(5)).unwrap();
        assert!(!client.is_nonblocking());
        assert_eq!(client.peer_addr().unwrap(), addr);
        let data = random_bytes(3 << 20, 7);
        thread::scope(|s| {
            s.spawn(|| {
                write_chunks(&client, &data).unwrap();
                client.shutdown(Shutdown::Write).unwrap();
            });
            let (back, err) = read_to_end(&client);
            assert!(err.is_none());
            assert!(back == data, "echo differs");
        });
        let peer = server.join().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
    });
}

#[test]
fn connect_can_leave_the_socket_nonblocking() {
    within(LIMIT, || {
        let p = fake();
        let (listener, addr) = rlistener(&p);
        let client = RSocket::new(&p, rdma_streams_transport::Family::V4).unwrap();
        client.set_nonblocking(true).unwrap();
        client.connect(addr, Duration::from_secs(5)).unwrap();
        assert!(client.is_nonblocking());
        let (server, _) = listener.accept().unwrap();
        assert!(!server.is_nonblocking(), "accepted rsockets are blocking");
        let mut buf = [0u8; 8];
        assert_eq!(
            client.read(&mut buf).unwrap_err().kind(),
            ErrorKind::WouldBlock
        );
        server.write_all(b"hi").unwrap();
        let mut fds = [PollFd::rsocket(&client, Events::READABLE)];
        assert_eq!(poll(&p, &mut fds, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!(client.read(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"hi");
    });
}

#[test]
fn connect_to_nothing_is_refused() {
    within(LIMIT, || {
        let p = fake();
        let (listener, addr) = rlistener(&p);
        drop(listener);
        let err = RSocket::connect_to(&p, addr, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, RSocketError::Connect { .. }), "{err:?}");
        assert_eq!(err.errno(), Some(libc::ECONNREFUSED));
    });
}

#[test]
fn connect_times_out_when_rconnect_hangs() {
    child_passes("hang_connect", &[(ENV_FAULTS, "hang_connect")]);
}

fn case_hang_connect() {
    let p = fake();
    let (_listener, addr) = rlistener(&p);
    let start = Instant::now();
    let err = RSocket::connect_to(&p, addr, Duration::from_millis(300)).unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, RSocketError::ConnectTimeout { .. }),
        "{err:?}"
    );
    assert_eq!(err.errno(), Some(libc::ETIMEDOUT));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
}

#[test]
fn refused_connect_reports_econnrefused() {
    child_passes("refuse", &[(ENV_FAULTS, "refuse")]);
}

fn case_refuse() {
    let p = fake();
    let (_listener, addr) = rlistener(&p);
    let err = RSocket::connect_to(&p, addr, Duration::from_secs(5)).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ECONNREFUSED));
    let io: std::io::Error = err.into();
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused);
}

#[test]
fn blocking_calls_ride_out_an_eagain_storm() {
    child_passes("eagain_storm", &[(ENV_FAULTS, "eagain_storm=25")]);
}

fn case_eagain_storm() {
    let p = fake();
    let (client, server) = rpair(&p);
    let data = random_bytes(1 << 20, 3);
    thread::scope(|s| {
        s.spawn(|| {
            write_chunks(&client, &data).unwrap();
            client.shutdown(Shutdown::Write).unwrap();
        });
        let (got, err) = read_to_end(&server);
        assert!(err.is_none(), "{err:?}");
        assert!(got == data);
    });
}

#[test]
fn options() {
    let p = fake();
    let s = RSocket::new(&p, rdma_streams_transport::Family::V4).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_buffer_sizes(1 << 17, 1 << 17).unwrap();
    assert_eq!(s.rdma_option(RdmaOption::Inline).unwrap(), 64);
    s.set_rdma_option(RdmaOption::SqSize, 128).unwrap();
    assert_eq!(s.rdma_option(RdmaOption::SqSize).unwrap(), 128);
    assert!(s.take_error().unwrap().is_none());
    assert!(s.raw() >= 1_000_000, "fake r-fds are not kernel fds");
    assert!(format!("{s:?}").contains("libfakersocket.so"));
}

#[test]
fn poll_mixes_rsockets_and_kernel_fds() {
    within(LIMIT, || {
        let p = fake();
        let (client, server) = rpair(&p);
        let (mut ux_a, ux_b) = UnixStream::pair().unwrap();
        {
            let mut fds = [
                PollFd::rsocket(&client, Events::READABLE),
                PollFd::fd(ux_b.as_fd(), Events::READABLE),
            ];
            let start = Instant::now();
            assert_eq!(
                poll(&p, &mut fds, Some(Duration::from_millis(100))).unwrap(),
                0
            );
            assert!(start.elapsed() >= Duration::from_millis(90));
        }
        ux_a.write_all(b"u").unwrap();
        {
            let mut fds = [
                PollFd::rsocket(&client, Events::READABLE),
                PollFd::fd(ux_b.as_fd(), Events::READABLE),
            ];
            assert_eq!(poll(&p, &mut fds, Some(Duration::from_secs(5))).unwrap(), 1);
            assert!(fds[0].revents().is_empty());
            assert!(fds[1].revents().contains(Events::READABLE));
        }
        server.write_all(b"r").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut fds = [
                PollFd::rsocket(&client, Events::READABLE),
                PollFd::fd(ux_b.as_fd(), Events::READABLE),
            ];
            if poll(&p, &mut fds, Some(Duration::from_secs(1))).unwrap() == 2 {
                assert!(fds[0].revents().contains(Events::READABLE));
                break;
            }
            assert!(Instant::now() < deadline, "rsocket never became readable");
        }
        let mut b = [0u8; 1];
        (&ux_b).read_exact(&mut b).unwrap();
        assert_eq!(client.read(&mut b).unwrap(), 1);
    });
}

#[test]
fn ipv6_loopback_when_available() {
    within(LIMIT, || {
        let p = fake();
        let Ok(listener) = RSocket::listen_on(&p, "[::1]:0".parse().unwrap(), 4) else {
            return; // no IPv6 loopback here
        };
        let addr: SocketAddr = listener.local_addr().unwrap();
        let client = RSocket::connect_to(&p, addr, Duration::from_secs(5)).unwrap();
        let (server, _) = listener.accept().unwrap();
        client.write_all(b"v6").unwrap();
        let mut b = [0u8; 2];
        (&server).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"v6");
    });
}
