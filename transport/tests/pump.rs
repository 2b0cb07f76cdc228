//! The pump between a UNIX socketpair (the app's side) and an rsocket, over the fake provider.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rdma_streams_transport::{
    Provider, PumpEnd, PumpError, PumpOptions, PumpReport, RSocket, pump, relay,
};
use sha2::{Digest, Sha256};

/// Dispatches the case of a child process; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Some(case) = child_case() else { return };
    match case.as_str() {
        "reset_after" => case_reset_after(),
        "eagain_storm" => case_eagain_storm(),
        "poll_never_wakes" => case_poll_never_wakes(),
        other => panic!("unknown child case {other}"),
    }
}

/// The app's end of a socketpair, and a pump thread serving the other end and `remote`.
fn start_pump(remote: RSocket, opts: PumpOptions) -> (UnixStream, thread::JoinHandle<PumpReport>) {
    let (app, pump_end) = UnixStream::pair().unwrap();
    let handle = thread::spawn(move || pump(OwnedFd::from(pump_end), remote, opts));
    (app, handle)
}

/// Sends `app_data` from the app side and `peer_data` from the peer side at the same time,
/// each writer half-closing when done, and returns what each side received.
fn exchange(
    app: &UnixStream,
    peer: &RSocket,
    app_data: &[u8],
    peer_data: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    thread::scope(|s| {
        s.spawn(|| {
            write_chunks(app, app_data).unwrap();
            app.shutdown(Shutdown::Write).unwrap();
        });
        s.spawn(|| {
            write_chunks(peer, peer_data).unwrap();
            peer.shutdown(Shutdown::Write).unwrap();
        });
        let at_peer = s.spawn(|| read_to_end(peer));
        let (at_app, err) = read_to_end(app);
        assert!(err.is_none(), "app read: {err:?}");
        let (at_peer, err) = at_peer.join().unwrap();
        assert!(err.is_none(), "peer read: {err:?}");
        (at_app, at_peer)
    })
}

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

/// 64 MiB of random bytes each way; the sha256 of what arrives equals what was sent.
#[test]
fn pump_carries_64_mib_both_ways() {
    within(Duration::from_secs(240), || {
        const LEN: usize = 64 << 20;
        let p = fake();
        let (client, peer) = rpair(&p);
        let (app, pump_thread) = start_pump(client, PumpOptions::default());
        let app_data = random_bytes(LEN, 11);
        let peer_data = random_bytes(LEN, 12);
        let (at_app, at_peer) = exchange(&app, &peer, &app_data, &peer_data);
        assert_eq!(at_app.len(), LEN);
        assert_eq!(at_peer.len(), LEN);
        assert_eq!(sha(&at_app), sha(&peer_data), "peer -> app bytes differ");
        assert_eq!(sha(&at_peer), sha(&app_data), "app -> peer bytes differ");
        let report = pump_thread.join().unwrap();
        assert!(report.end.is_clean(), "{report:?}");
        assert_eq!(report.to_remote, LEN as u64);
        assert_eq!(report.to_local, LEN as u64);
    });
}

#[test]
fn half_close_from_the_app_first() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let (mut app, pump_thread) = start_pump(client, PumpOptions::default());
        app.write_all(b"request").unwrap();
        app.shutdown(Shutdown::Write).unwrap();
        // The peer sees the request and then EOF, while its own direction stays open.
        let (got, err) = read_to_end(&peer);
        assert!(err.is_none());
        assert_eq!(got, b"request");
        peer.write_all(b"response").unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        let (got, err) = read_to_end(&app);
        assert!(err.is_none());
        assert_eq!(got, b"response");
        let report = pump_thread.join().unwrap();
        assert!(report.end.is_clean(), "{report:?}");
        assert_eq!((report.to_remote, report.to_local), (7, 8));
    });
}

#[test]
fn half_close_from_the_peer_first() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let (mut app, pump_thread) = start_pump(client, PumpOptions::default());
        peer.write_all(b"hello").unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        app.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello");
        app.write_all(b"late reply").unwrap();
        drop(app);
        let (got, err) = read_to_end(&peer);
        assert!(err.is_none());
        assert_eq!(got, b"late reply");
        let report = pump_thread.join().unwrap();
        assert!(report.end.is_clean(), "{report:?}");
        assert_eq!((report.to_remote, report.to_local), (10, 5));
    });
}

#[test]
fn stop_flag_ends_an_idle_pump_quickly() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let stop = Arc::new(AtomicBool::new(false));
        let opts = PumpOptions {
            stop: Arc::clone(&stop),
            ..PumpOptions::default()
        };
        let (mut app, pump_thread) = start_pump(client, opts);
        app.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        (&peer).read_exact(&mut b).unwrap();
        thread::sleep(Duration::from_millis(250));
        let raised = Instant::now();
        stop.store(true, Ordering::Release);
        let report = pump_thread.join().unwrap();
        let took = raised.elapsed();
        assert!(
            took < Duration::from_millis(200),
            "pump took {took:?} to stop"
        );
        assert!(matches!(report.end, PumpEnd::Stopped), "{report:?}");
        assert_eq!(report.to_remote, 1);
        // Both sides were torn down: the app reads EOF, the peer EOF or a reset.
        app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        assert_eq!(app.read_to_end(&mut rest).unwrap(), 0);
        let (_, err) = read_to_end(&peer);
        if let Some(e) = err {
            assert_eq!(e.kind(), ErrorKind::ConnectionReset);
        }
    });
}

#[test]
fn app_closing_while_the_peer_sends_tears_down() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let (app, pump_thread) = start_pump(client, PumpOptions::default());
        drop(app);
        // The peer sees the app's EOF, keeps sending into a closed app: the pump's write to
        // the socketpair fails (EPIPE), which tears the rsocket down as well.
        let (got, _) = read_to_end(&peer);
        assert!(got.is_empty());
        let chunk = vec![1u8; 64 * 1024];
        let deadline = Instant::now() + Duration::from_secs(10);
        while peer.write_all(&chunk).is_ok() {
            assert!(Instant::now() < deadline, "peer writes never failed");
        }
        let report = pump_thread.join().unwrap();
        match &report.end {
            PumpEnd::Failed(PumpError::Local(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e:?}");
            }
            other => panic!("expected a local failure, got {other:?}"),
        }
    });
}

#[test]
fn reset_after_fault_tears_both_sides_down() {
    child_passes("reset_after", &[(ENV_FAULTS, "reset_after=1048576")]);
}

/// An rsocket whose peer is a plain kernel TCP client (the fake's listener accepts those at
/// rsocket port + 20000), so only the pump's rsocket counts bytes for the fault.
fn accepted_from_kernel_peer(p: &Provider) -> (RSocket, TcpStream) {
    let (listener, addr) = rlistener(p);
    let kernel_port = addr.port().wrapping_add(FAKE_PORT_OFFSET);
    let peer = TcpStream::connect(("127.0.0.1", kernel_port)).unwrap();
    let (remote, _) = listener.accept().unwrap();
    (remote, peer)
}

fn case_reset_after() {
    let p = fake();
    let (remote, mut peer) = accepted_from_kernel_peer(&p);
    let (app, pump_thread) = start_pump(remote, PumpOptions::default());
    let writer = {
        let mut app = app.try_clone().unwrap();
        // Writes fail (EPIPE) once the pump has torn its end down.
        thread::spawn(move || write_chunks(&mut app, &random_bytes(8 << 20, 5)))
    };
    let report = pump_thread.join().unwrap();
    match &report.end {
        PumpEnd::Failed(PumpError::Remote(e)) => {
            assert!(
                matches!(e.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)),
                "{e:?}"
            );
        }
        other => panic!("expected a remote failure, got {other:?}"),
    }
    assert!(report.to_remote <= 1 << 20, "{report:?}");
    assert!(writer.join().unwrap().is_err(), "app writes must fail");
    // The app sees EOF, or ECONNRESET (AF_UNIX reports that when the pump's end is closed
    // with app bytes still unread in it); the kernel peer at most 1 MiB, then a reset.
    app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (got, err) = read_to_end(&app);
    assert!(got.is_empty());
    if let Some(e) = err {
        assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    }
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (got, err) = read_to_end(&mut peer);
    assert!(got.len() <= 1 << 20);
    assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::ConnectionReset));
}

#[test]
fn eagain_storm_is_tolerated() {
    child_passes("eagain_storm", &[(ENV_FAULTS, "eagain_storm=200")]);
}

fn case_eagain_storm() {
    const LEN: usize = 4 << 20;
    let p = fake();
    let (client, peer) = rpair(&p);
    let (app, pump_thread) = start_pump(client, PumpOptions::default());
    let app_data = random_bytes(LEN, 21);
    let peer_data = random_bytes(LEN, 22);
    let (at_app, at_peer) = exchange(&app, &peer, &app_data, &peer_data);
    assert!(sha(&at_app) == sha(&peer_data) && sha(&at_peer) == sha(&app_data));
    let report = pump_thread.join().unwrap();
    assert!(report.end.is_clean(), "{report:?}");
    assert_eq!(
        (report.to_remote, report.to_local),
        (LEN as u64, LEN as u64)
    );
}

#[test]
fn a_poll_that_never_wakes_slows_but_does_not_stall() {
    child_passes("poll_never_wakes", &[(ENV_FAULTS, "poll_never_wakes")]);
}

fn case_poll_never_wakes() {
    const LEN: usize = 256 * 1024;
    let p = fake();
    let (remote, peer) = accepted_from_kernel_peer(&p);
    let (app, pump_thread) = start_pump(remote, PumpOptions::default());
    let app_data = random_bytes(LEN, 31);
    let peer_data = random_bytes(LEN, 32);
    let (at_app, at_peer) = thread::scope(|s| {
        s.spawn(|| {
            write_chunks(&app, &app_data).unwrap();
            app.shutdown(Shutdown::Write).unwrap();
        });
        s.spawn(|| {
            write_chunks(&peer, &peer_data).unwrap();
            peer.shutdown(Shutdown::Write).unwrap();
        });
        let at_peer = s.spawn(|| read_to_end(&peer).0);
        (read_to_end(&app).0, at_peer.join().unwrap())
    });
    assert!(at_app == peer_data && at_peer == app_data);
    let report = pump_thread.join().unwrap();
    assert!(report.end.is_clean(), "{report:?}");
}

/// A connected kernel TCP pair on loopback: (the socket the pump watches, its peer).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

fn watching(kept: TcpStream) -> PumpOptions {
    PumpOptions {
        watch: Some(Arc::new(OwnedFd::from(kept))),
        ..PumpOptions::default()
    }
}

#[test]
fn reset_of_the_watched_socket_tears_both_sides_down() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let (kept, kept_peer) = tcp_pair();
        let (mut app, pump_thread) = start_pump(client, watching(kept));
        app.write_all(b"before").unwrap();
        let mut b = [0u8; 6];
        (&peer).read_exact(&mut b).unwrap();
        // An RST: SO_LINGER 0, then close.
        socket2::SockRef::from(&kept_peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(kept_peer);
        let report = pump_thread.join().unwrap();
        match &report.end {
            PumpEnd::Failed(PumpError::Watched(e)) => {
                assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e:?}");
            }
            other => panic!("expected a watched-socket failure, got {other:?}"),
        }
        app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (got, _) = read_to_end(&app);
        assert!(got.is_empty());
    });
}

#[test]
fn fin_on_the_watched_socket_only_ends_the_watch() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, peer) = rpair(&p);
        let (kept, kept_peer) = tcp_pair();
        let (app, pump_thread) = start_pump(client, watching(kept));
        drop(kept_peer);
        // The FIN is seen, then the pump idles: it must neither end nor spin.
        thread::sleep(Duration::from_millis(300));
        assert!(!pump_thread.is_finished());
        let a = random_bytes(3 << 20, 7);
        let b = random_bytes(2 << 20, 8);
        let (at_app, at_peer) = exchange(&app, &peer, &a, &b);
        assert_eq!(sha(&at_peer), sha(&a));
        assert_eq!(sha(&at_app), sha(&b));
        let report = pump_thread.join().unwrap();
        assert!(report.end.is_clean(), "{report:?}");
    });
}

#[test]
fn bytes_on_the_watched_socket_tear_down() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (client, _peer) = rpair(&p);
        let (kept, mut kept_peer) = tcp_pair();
        let (_app, pump_thread) = start_pump(client, watching(kept));
        kept_peer.write_all(b"stray").unwrap();
        let report = pump_thread.join().unwrap();
        match &report.end {
            PumpEnd::Failed(PumpError::Watched(e)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidData, "{e:?}");
            }
            other => panic!("expected a watched-socket failure, got {other:?}"),
        }
    });
}

/// The app's end of a socketpair, and a relay thread serving the other end and a kernel TCP
/// connection (the peer gets the connection's other end).
fn start_relay(p: &Provider) -> (UnixStream, TcpStream, thread::JoinHandle<PumpReport>) {
    let (app, pump_end) = UnixStream::pair().unwrap();
    let (kept, peer) = tcp_pair();
    let provider = p.clone();
    let handle = thread::spawn(move || {
        relay(
            OwnedFd::from(pump_end),
            Arc::new(OwnedFd::from(kept)),
            &provider,
            PumpOptions::default(),
        )
    });
    (app, peer, handle)
}

/// A relay over a kernel TCP socket: 8 MiB each way at once, both half-closes delivered, a clean
/// end.
#[test]
fn relay_carries_bytes_over_a_kernel_socket_both_ways() {
    within(Duration::from_secs(60), || {
        let p = fake();
        let (app, peer, relay_thread) = start_relay(&p);
        let a = random_bytes(8 << 20, 21);
        let b = random_bytes(8 << 20, 22);
        let (at_app, at_peer) = thread::scope(|s| {
            s.spawn(|| {
                write_chunks(&app, &a).unwrap();
                app.shutdown(Shutdown::Write).unwrap();
            });
            s.spawn(|| {
                write_chunks(&peer, &b).unwrap();
                peer.shutdown(Shutdown::Write).unwrap();
            });
            let at_peer = s.spawn(|| read_to_end(&peer));
            let (at_app, err) = read_to_end(&app);
            assert!(err.is_none(), "app read: {err:?}");
            let (at_peer, err) = at_peer.join().unwrap();
            assert!(err.is_none(), "peer read: {err:?}");
            (at_app, at_peer)
        });
        assert_eq!(sha(&at_peer), sha(&a));
        assert_eq!(sha(&at_app), sha(&b));
        let report = relay_thread.join().unwrap();
        assert!(report.end.is_clean(), "{report:?}");
        assert_eq!((report.to_remote, report.to_local), (8 << 20, 8 << 20));
    });
}

/// A reset of the relayed kernel connection is the far side's failure: the app reads EOF.
#[test]
fn relay_reset_by_the_peer_tears_the_app_side_down() {
    within(Duration::from_secs(30), || {
        let p = fake();
        let (mut app, mut peer, relay_thread) = start_relay(&p);
        app.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        socket2::SockRef::from(&peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(peer);
        let report = relay_thread.join().unwrap();
        match &report.end {
            PumpEnd::Failed(PumpError::Remote(e)) => {
                assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e:?}");
            }
            other => panic!("expected a remote failure, got {other:?}"),
        }
        app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (rest, _) = read_to_end(&app);
        assert!(rest.is_empty());
    });
}
