//! The fake's C ABI with no faults, driven in-process through the rlib.
// These tests call the exported `unsafe extern "C"` functions: the surface under test.
#![allow(unsafe_code)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use fakersocket as fake;
use libc::c_int;

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn echo_with_blocking_connect() {
    within(LIMIT, || {
        let before = fake::fake_rsocket_stats();
        let (lfd, addr) = listener();
        assert!(addr.port() != 0);
        let server = thread::spawn(move || {
            let (fd, _) = accept(lfd).expect("raccept");
            let data = recv_to_end(fd);
            send_all(fd, &data);
            close(fd).unwrap();
            close(lfd).unwrap();
            data.len()
        });
        let client = socket(libc::AF_INET).unwrap();
        connect(client, addr).expect("rconnect");
        assert_eq!(peername(client).unwrap(), addr);
        let data = pattern(1 << 20, 1);
        send_all(client, &data);
        shutdown(client, libc::SHUT_WR).unwrap();
        let back = recv_to_end(client);
        assert_eq!(back.len(), data.len());
        assert!(back == data, "echoed bytes differ");
        close(client).unwrap();
        assert_eq!(server.join().unwrap(), data.len());
        let after = fake::fake_rsocket_stats();
        assert!(after.connects > before.connects);
        assert!(after.accepts > before.accepts);
        assert!(after.bytes_sent >= before.bytes_sent + 2 * (1 << 20));
        assert!(after.bytes_received >= before.bytes_received + 2 * (1 << 20));
    });
}

#[test]
fn echo_with_nonblocking_connect() {
    within(LIMIT, || {
        let (lfd, addr) = listener();
        let client = socket(libc::AF_INET).unwrap();
        set_nonblocking(client, true);
        // SAFETY: no pointers.
        let flags = unsafe { fake::rfcntl(client, libc::F_GETFL, 0) };
        assert_eq!(flags & libc::O_NONBLOCK, libc::O_NONBLOCK);
        assert_eq!(connect(client, addr), Err(libc::EINPROGRESS));
        assert_eq!(
            connect(client, addr)
                .err()
                .map(|e| e == libc::EALREADY || e == libc::EISCONN),
            Some(true)
        );
        let mut fds = [pfd(client, libc::POLLOUT)];
        assert_eq!(poll(&mut fds, 5000), Ok(1));
        assert!(fds[0].revents & libc::POLLOUT != 0);
        assert_eq!(so_error(client), 0);
        let (server, peer) = accept(lfd).unwrap();
        assert_eq!(peer, sockname(client).unwrap());
        // Non-blocking: nothing to read yet.
        let mut buf = [0u8; 16];
        assert_eq!(recv(client, &mut buf, 0), Err(libc::EAGAIN));
        send_all(client, b"ping");
        assert_eq!(recv_exact(server, 4), b"ping");
        send_all(server, b"pong");
        assert_eq!(recv_exact(client, 4), b"pong");
        for fd in [client, server, lfd] {
            close(fd).unwrap();
        }
    });
}

#[test]
fn connect_to_a_port_without_listener_is_refused() {
    within(LIMIT, || {
        // A listener bound then closed leaves a port with nothing behind it.
        let (lfd, addr) = listener();
        close(lfd).unwrap();
        let client = socket(libc::AF_INET).unwrap();
        assert_eq!(connect(client, addr), Err(libc::ECONNREFUSED));
        close(client).unwrap();

        let client = socket(libc::AF_INET).unwrap();
        set_nonblocking(client, true);
        assert_eq!(connect(client, addr), Err(libc::EINPROGRESS));
        let mut fds = [pfd(client, libc::POLLOUT)];
        assert_eq!(poll(&mut fds, 5000), Ok(1));
        assert_eq!(so_error(client), libc::ECONNREFUSED);
        close(client).unwrap();
    });
}

#[test]
fn rpoll_mixes_rfds_and_pipe_fds() {
    within(LIMIT, || {
        let (client, server) = pair();
        let mut pipe = [0 as c_int; 2];
        // SAFETY: `pipe` has room for two fds.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let [pipe_r, pipe_w] = pipe;

        let mut fds = [pfd(client, libc::POLLIN), pfd(pipe_r, libc::POLLIN)];
        let start = Instant::now();
        assert_eq!(poll(&mut fds, 150), Ok(0));
        assert!(start.elapsed() >= Duration::from_millis(140));

        // SAFETY: writing one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(pipe_w, b"x".as_ptr().cast(), 1) }, 1);
        let mut fds = [pfd(client, libc::POLLIN), pfd(pipe_r, libc::POLLIN)];
        assert_eq!(poll(&mut fds, 1000), Ok(1));
        assert_eq!(fds[0].revents, 0);
        assert_eq!(fds[1].revents, libc::POLLIN);

        send_all(server, b"data");
        let mut fds = [pfd(client, libc::POLLIN), pfd(pipe_r, libc::POLLIN)];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            fds = [pfd(client, libc::POLLIN), pfd(pipe_r, libc::POLLIN)];
            if poll(&mut fds, 1000) == Ok(2) {
                break;
            }
        }
        assert_eq!(fds[0].revents & libc::POLLIN, libc::POLLIN);
        assert_eq!(fds[1].revents, libc::POLLIN);

        // An r-fd that is not open reports POLLNVAL, like a closed fd.
        let mut fds = [pfd(i32::MAX, libc::POLLIN)];
        assert_eq!(poll(&mut fds, 0), Ok(1));
        assert_eq!(fds[0].revents, libc::POLLNVAL);

        // SAFETY: closing our own pipe fds.
        unsafe {
            libc::close(pipe_r);
            libc::close(pipe_w);
        }
        close(client).unwrap();
        close(server).unwrap();
    });
}

#[test]
fn rselect_watches_ordinary_fds() {
    within(LIMIT, || {
        let mut pipe = [0 as c_int; 2];
        // SAFETY: `pipe` has room for two fds.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let [pipe_r, pipe_w] = pipe;
        // SAFETY: fd_set is plain data; FD_ZERO/FD_SET/FD_ISSET get valid pointers and fds
        // below FD_SETSIZE.
        unsafe {
            let mut rset: libc::fd_set = std::mem::zeroed();
            let mut wset: libc::fd_set = std::mem::zeroed();
            libc::FD_ZERO(&mut rset);
            libc::FD_ZERO(&mut wset);
            libc::FD_SET(pipe_r, &mut rset);
            libc::FD_SET(pipe_w, &mut wset);
            let mut tv = libc::timeval {
                tv_sec: 1,
                tv_usec: 0,
            };
            let n = fake::rselect(
                pipe_r.max(pipe_w) + 1,
                &mut rset,
                &mut wset,
                std::ptr::null_mut(),
                &mut tv,
            );
            assert_eq!(n, 1);
            assert!(!libc::FD_ISSET(pipe_r, &rset));
            assert!(libc::FD_ISSET(pipe_w, &wset));

            // Absurd nfds is EINVAL.
            let n = fake::rselect(
                i32::MAX,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            assert_eq!(n, -1);
            assert_eq!(errno(), libc::EINVAL);
            libc::close(pipe_r);
            libc::close(pipe_w);
        }
    });
}

/// r-fds are far above FD_SETSIZE: select them with caller-sized bitmaps, as select(2)
/// allows for large nfds.
#[test]
fn rselect_watches_rfds_in_large_bitmaps() {
    within(LIMIT, || {
        let (client, server) = pair();
        let nfds = client.max(server) + 1;
        let words = (nfds as usize).div_ceil(64);
        let set = |fds: &[c_int]| {
            let mut bits = vec![0u64; words];
            for &fd in fds {
                bits[fd as usize / 64] |= 1 << (fd as usize % 64);
            }
            bits
        };
        let is_set =
            |bits: &[u64], fd: c_int| bits[fd as usize / 64] & (1 << (fd as usize % 64)) != 0;
        let mut rbits = set(&[client, server]);
        let mut wbits = set(&[client]);
        let mut tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: both bitmaps hold `nfds` bits; the timeval is valid.
        let n = unsafe {
            fake::rselect(
                nfds,
                rbits.as_mut_ptr().cast(),
                wbits.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        assert_eq!(n, 1, "only the client is writable");
        assert!(is_set(&wbits, client));
        assert!(!is_set(&rbits, client) && !is_set(&rbits, server));

        send_all(server, b"x");
        let mut rbits = set(&[client]);
        // SAFETY: as above.
        let n = unsafe {
            fake::rselect(
                nfds,
                rbits.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        assert_eq!(n, 1);
        assert!(is_set(&rbits, client));
        close(client).unwrap();
        close(server).unwrap();
    });
}

#[test]
fn rfds_are_rejected_by_libc() {
    within(LIMIT, || {
        let fd = socket(libc::AF_INET).unwrap();
        assert!(fd >= fake::FIRST_RFD);
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is writable; the fd is deliberately not a kernel fd.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(n, -1);
        assert_eq!(errno(), libc::EBADF);
        // SAFETY: as above.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        assert_eq!(n, -1);
        assert_eq!(errno(), libc::EBADF);
        // SAFETY: no pointers.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFL) }, -1);
        assert_eq!(errno(), libc::EBADF);
        close(fd).unwrap();
        // Numbers are never reused: a closed r-fd stays invalid.
        assert_eq!(close(fd), Err(libc::EBADF));
        assert_eq!(send(fd, b"x"), Err(libc::EBADF));
    });
}

#[test]
fn ports_are_translated_both_ways() {
    within(LIMIT, || {
        let offset = fake::fake_rsocket_port_offset();
        let (lfd, addr) = listener();
        // A kernel TCP client reaches the rsocket listener at kernel port P + offset.
        let kernel_port = addr.port().wrapping_add(offset);
        let mut tcp = TcpStream::connect(("127.0.0.1", kernel_port)).expect("kernel connect");
        let (fd, peer) = accept(lfd).unwrap();
        let tcp_local = tcp.local_addr().unwrap();
        assert_eq!(peer.port(), tcp_local.port().wrapping_sub(offset));
        assert_eq!(sockname(fd).unwrap(), addr);
        tcp.write_all(b"hi").unwrap();
        assert_eq!(recv_exact(fd, 2), b"hi");
        close(fd).unwrap();

        // An rsocket client's own port, seen from both ends, is the same rsocket number.
        let client = socket(libc::AF_INET).unwrap();
        connect(client, addr).unwrap();
        let (fd, peer) = accept(lfd).unwrap();
        assert_eq!(peer, sockname(client).unwrap());
        assert_eq!(peername(fd).unwrap(), peer);
        close(fd).unwrap();
        close(client).unwrap();
        close(lfd).unwrap();

        // Separate port spaces: a kernel listener on port Q and an rsocket listener on rsocket
        // port Q coexist.
        let mut shared = None;
        for _ in 0..20 {
            let kernel = TcpListener::bind("127.0.0.1:0").unwrap();
            let q = kernel.local_addr().unwrap().port();
            let rfd = socket(libc::AF_INET).unwrap();
            match bind(rfd, SocketAddr::from(([127, 0, 0, 1], q))) {
                Ok(()) => {
                    listen(rfd, 4).unwrap();
                    assert_eq!(sockname(rfd).unwrap().port(), q);
                    shared = Some((kernel, rfd, q));
                    break;
                }
                // Kernel port q + offset happened to be taken: try another q.
                Err(libc::EADDRINUSE) | Err(libc::EADDRNOTAVAIL) => close(rfd).unwrap(),
                Err(e) => panic!("rbind: errno {e}"),
            }
        }
        let (kernel, rfd, q) = shared.expect("a port number usable in both spaces");
        let client = socket(libc::AF_INET).unwrap();
        connect(client, SocketAddr::from(([127, 0, 0, 1], q))).unwrap();
        let (fd, _) = accept(rfd).unwrap();
        let mut plain = TcpStream::connect(("127.0.0.1", q)).unwrap();
        let (mut plain_server, _) = kernel.accept().unwrap();
        plain.write_all(b"k").unwrap();
        let mut b = [0u8; 1];
        plain_server.read_exact(&mut b).unwrap();
        send_all(client, b"r");
        assert_eq!(recv_exact(fd, 1), b"r");
        for f in [fd, client, rfd] {
            close(f).unwrap();
        }
    });
}

#[test]
fn half_close_with_rshutdown() {
    within(LIMIT, || {
        let (client, server) = pair();
        send_all(client, b"hello");
        shutdown(client, libc::SHUT_WR).unwrap();
        assert_eq!(recv_to_end(server), b"hello");
        // The other direction still works after the peer's half-close.
        send_all(server, b"world");
        shutdown(server, libc::SHUT_WR).unwrap();
        assert_eq!(recv_to_end(client), b"world");
        assert_eq!(shutdown(client, 42), Err(libc::EINVAL));
        close(client).unwrap();
        close(server).unwrap();
    });
}

#[test]
fn only_inet_stream_sockets_exist() {
    // SAFETY: no pointers.
    unsafe {
        assert_eq!(fake::rsocket(libc::AF_UNIX, libc::SOCK_STREAM, 0), -1);
        assert_eq!(errno(), libc::EAFNOSUPPORT);
        assert_eq!(fake::rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0), -1);
        assert_eq!(errno(), libc::EPROTONOSUPPORT);
        assert_eq!(
            fake::rsocket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_UDP),
            -1
        );
        assert_eq!(errno(), libc::EPROTONOSUPPORT);
        let fd = fake::rsocket(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP);
        assert!(fd >= fake::FIRST_RFD);
        assert_eq!(
            bind(fd, "127.0.0.1:0".parse().unwrap()),
            Err(libc::EAFNOSUPPORT)
        );
        assert_eq!(fake::rfcntl(fd, libc::F_DUPFD, 0), -1);
        assert_eq!(errno(), libc::ENOTSUP);
        assert_eq!(fake::rbind(fd, std::ptr::null(), 16), -1);
        assert_eq!(errno(), libc::EFAULT);
        close(fd).unwrap();
    }
}

#[test]
fn ipv6_echo() {
    within(LIMIT, || {
        let lfd = socket(libc::AF_INET6).unwrap();
        if bind(lfd, "[::1]:0".parse().unwrap()).is_err() {
            // No IPv6 loopback in this environment.
            close(lfd).unwrap();
            return;
        }
        listen(lfd, 4).unwrap();
        let addr = sockname(lfd).unwrap();
        assert!(addr.is_ipv6());
        let client = socket(libc::AF_INET6).unwrap();
        connect(client, addr).unwrap();
        let (server, peer) = accept(lfd).unwrap();
        assert_eq!(peer, sockname(client).unwrap());
        send_all(client, b"six");
        assert_eq!(recv_exact(server, 3), b"six");
        for fd in [client, server, lfd] {
            close(fd).unwrap();
        }
    });
}

#[test]
fn recvmsg_honours_peek_and_vectors_work() {
    within(LIMIT, || {
        let (client, server) = pair();
        let mut a = *b"ab";
        let mut b = *b"cde";
        let iov = [
            libc::iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            },
        ];
        // SAFETY: `iov` describes two live buffers.
        assert_eq!(unsafe { fake::rwritev(client, iov.as_ptr(), 2) }, 5);
        wait(server, libc::POLLIN);
        thread::sleep(Duration::from_millis(20));

        let mut peek = [0u8; 5];
        let mut piov = libc::iovec {
            iov_base: peek.as_mut_ptr().cast(),
            iov_len: peek.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut piov;
        msg.msg_iovlen = 1;
        // SAFETY: `msg` points to one live iovec.
        let n = unsafe { fake::rrecvmsg(server, &mut msg, libc::MSG_PEEK) };
        assert_eq!(n, 5);
        assert_eq!(&peek, b"abcde");

        let mut x = [0u8; 3];
        let mut y = [0u8; 2];
        let riov = [
            libc::iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: x.len(),
            },
            libc::iovec {
                iov_base: y.as_mut_ptr().cast(),
                iov_len: y.len(),
            },
        ];
        // SAFETY: `riov` describes two live buffers.
        assert_eq!(unsafe { fake::rreadv(server, riov.as_ptr(), 2) }, 5);
        assert_eq!((&x, &y), (b"abc", b"de"));
        close(client).unwrap();
        close(server).unwrap();
    });
}

#[test]
fn socket_options() {
    const SOL_RDMA: c_int = 0x10000;
    const RDMA_SQSIZE: c_int = 0;
    const RDMA_INLINE: c_int = 2;
    let fd = socket(libc::AF_INET).unwrap();
    assert_eq!(get_int_opt(fd, SOL_RDMA, RDMA_SQSIZE), Ok(384));
    assert_eq!(get_int_opt(fd, SOL_RDMA, RDMA_INLINE), Ok(64));
    set_int_opt(fd, SOL_RDMA, RDMA_SQSIZE, 100).unwrap();
    assert_eq!(get_int_opt(fd, SOL_RDMA, RDMA_SQSIZE), Ok(100));
    assert_eq!(get_int_opt(fd, SOL_RDMA, 99), Err(libc::ENOPROTOOPT));
    set_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1).unwrap();
    assert_eq!(get_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY), Ok(1));
    set_int_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 1 << 17).unwrap();
    assert!(get_int_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).unwrap() >= 1 << 17);
    assert_eq!(
        get_int_opt(fd, libc::SOL_SOCKET, libc::SO_TYPE),
        Ok(libc::SOCK_STREAM)
    );
    assert_eq!(
        set_int_opt(fd, libc::SOL_SOCKET, libc::SO_BROADCAST, 1),
        Err(libc::ENOPROTOOPT)
    );
    close(fd).unwrap();
}

#[test]
fn stats_json_export() {
    let mut buf = [0 as libc::c_char; 256];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { fake::fake_rsocket_stats_json(buf.as_mut_ptr(), buf.len()) };
    assert!(n > 0 && (n as usize) < buf.len());
    let bytes: Vec<u8> = buf[..n as usize].iter().map(|&c| c as u8).collect();
    assert_eq!(buf[n as usize], 0);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    for key in ["connects", "accepts", "bytes_sent", "bytes_received"] {
        assert!(v[key].is_u64(), "{key} missing in {v}");
    }
    // Too small: truncated and NUL-terminated, full length returned.
    let mut small = [1 as libc::c_char; 4];
    // SAFETY: `small` is writable for its length.
    let m = unsafe { fake::fake_rsocket_stats_json(small.as_mut_ptr(), small.len()) };
    // (Counters of parallel tests may have grown meanwhile, so only a lower bound.)
    assert!(m as usize >= small.len());
    assert_eq!(small[3], 0);
    assert_eq!(small[0] as u8, b'{');
    // SAFETY: null with length 0 is allowed: it only asks for the length.
    assert!(unsafe { fake::fake_rsocket_stats_json(std::ptr::null_mut(), 0) } >= n);
}

#[test]
fn rclose_wakes_a_blocked_raccept() {
    within(LIMIT, || {
        let (lfd, _) = listener();
        let waiter = thread::spawn(move || accept(lfd));
        thread::sleep(Duration::from_millis(100));
        close(lfd).unwrap();
        assert!(waiter.join().unwrap().is_err());
    });
}
