use std::sync::mpsc;
use std::thread;

use super::server::tests_support::{hold_tables, listeners_len};
use super::*;
use crate::sys;

/// A parent thread inside the shim's tables at `fork()` (the engine thread registering a
/// connection, an app thread swapping): the child must still close an inherited listening fd
/// and a swapped fd without waiting for a thread that does not exist there. A hang ends the
/// child by SIGALRM after 5 s.
#[test]
fn a_fork_child_never_waits_for_a_lock_a_parent_thread_held() {
    let (held_tx, held_rx) = mpsc::channel();
    let (forked_tx, forked_rx) = mpsc::channel::<()>();
    let holder = thread::spawn(move || {
        let swapped = SWAPPED_FDS.lock();
        hold_tables(|| {
            held_tx.send(()).unwrap();
            forked_rx.recv().unwrap();
        });
        drop(swapped);
    });
    held_rx.recv().unwrap();
    let child = sys::fork_for_test(|| {
        after_fork_child();
        close_side_listener(900);
        forget_swapped(901);
        assert!(kept(901).is_none());
        assert!(!copy_swapped(901, 902));
        assert_eq!(listeners_len(), 0);
        assert!(engine::engine().is_none(), "a fork child has no engine");
    });
    forked_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(
        sys::wait_for_test(child),
        0,
        "the fork child hung on a shim lock"
    );
}

/// A stream that fails is reported to the app once, as a reset: by the kernel on the app's
/// socketpair end (`POLLERR`, then `ECONNRESET` once, then EOF), or, where the app shut its
/// side for writing and no byte can be queued, by the hooks, through every copy of its fd. One
/// that ends in order never is.
#[test]
fn a_failed_stream_reads_as_one_reset_and_an_orderly_end_as_none() {
    use crate::reason::Role;
    use rdma_streams_transport::engine::{End, Event, StreamPath};
    use std::io::Read;
    use std::os::fd::AsRawFd;

    let end = |error: Option<&str>| {
        Event::Ended(End {
            path: StreamPath::Rdma,
            sent: 1,
            received: 2,
            error: error.map(String::from),
            reset: error.is_some(),
        })
    };
    let revents = |fd: c_int| sys::poll_now(fd, libc::POLLIN);
    for (failed, shut_first) in [(true, false), (true, true), (false, false)] {
        let (app, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = app.as_raw_fd();
        let s = swap::swap(fd).unwrap();
        let copy = sys::dup_cloexec(fd).unwrap();
        assert!(copy_swapped(fd, copy.as_raw_fd()));
        assert!(!take_reset(fd), "nothing failed yet");
        if shut_first {
            app.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut on = events::on_event(Role::Client, fd, None, Arc::clone(&s.broken));
        on(end(failed.then_some("work completion failed")));
        // The engine closes its end after the report, without a shutdown when reset.
        if !failed {
            rdma_streams_transport::fd::shutdown_quietly(
                std::os::fd::AsFd::as_fd(&s.local),
                std::net::Shutdown::Both,
            );
        }
        drop(s.local);
        // A fork child of a test running beside this one may hold a copy of the engine's end
        // until its `after_fork_child` closes it: the end is gone once the app's end hangs up.
        sys::wait_hangup(fd, std::time::Duration::from_secs(5));
        let by_kernel = failed && !shut_first;
        let hooks = failed && shut_first;
        assert_eq!(
            revents(fd) & libc::POLLERR != 0,
            by_kernel,
            "failed {failed}, shut first {shut_first}"
        );
        let mut buf = [0u8; 4];
        let read = (&app).read(&mut buf).map_err(|e| e.raw_os_error());
        if by_kernel {
            assert_eq!(read, Err(Some(libc::ECONNRESET)), "the kernel's report");
            assert_eq!((&app).read(&mut buf).map_err(|e| e.raw_os_error()), Ok(0));
            assert_eq!(revents(fd) & libc::POLLERR, 0, "taken once");
        } else {
            assert_eq!(read, Ok(0));
        }
        // Where the hooks report it, the waits add POLLERR for every number until it is taken.
        let numbers = [fd, copy.as_raw_fd()];
        let marked = crate::readiness::errors_among(&numbers, &error_state);
        assert_eq!(marked.len(), if hooks { 2 } else { 0 }, "{marked:?}");
        assert_eq!(take_reset(copy.as_raw_fd()), hooks, "failed {failed}");
        assert!(error_state(fd).is_none(), "taken: no POLLERR any more");
        assert!(crate::readiness::errors_among(&numbers, &error_state).is_empty());
        assert!(!take_reset(fd), "told once, through any copy");
        assert!(!take_reset(copy.as_raw_fd()));
        forget_swapped(fd);
        forget_swapped(copy.as_raw_fd());
        assert!(!take_reset(fd), "not a swapped fd any more");
        crate::fdtable::set(fd, 0);
    }
}

/// The byte that reports a reset goes only to the socketpair end it names: an app number that
/// names another socket by now (replaced by a `dup2`) gets nothing.
#[test]
fn the_reset_byte_never_reaches_another_socket() {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let id = sys::file_id(a.as_raw_fd()).unwrap();
    let (other, mut other_peer) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(
        !sys::queue_reset_byte(other.as_raw_fd(), id),
        "not that socket"
    );
    assert!(!sys::queue_reset_byte(-1, id));
    assert!(sys::queue_reset_byte(a.as_raw_fd(), id));
    other_peer.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2];
    assert!(
        other_peer.read(&mut buf).is_err(),
        "nothing reached the other socket"
    );
    assert_eq!(
        b.read(&mut buf).unwrap(),
        1,
        "one byte, to the named end's peer"
    );
}

/// A fork child closes its copies of the engine's socketpair ends (the engine is not in the
/// child): the parent's engine closing its end hangs up the app's end while the child lives,
/// and the child keeps the app's fd.
#[test]
fn a_fork_child_lets_go_of_the_engines_socketpair_ends() {
    use std::os::fd::AsRawFd;

    let (app, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = app.as_raw_fd();
    let s = swap::swap(fd).unwrap();
    let end = s.local.as_raw_fd();
    let (closed_tx, closed_rx) = std::os::unix::net::UnixStream::pair().unwrap();
    let child = sys::fork_for_test(|| {
        after_fork_child();
        assert!(sys::file_id(end).is_none(), "the engine's end is closed");
        assert!(sys::file_id(fd).is_some(), "the app's fd stays");
        std::io::Write::write_all(&mut &closed_tx, b"k").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(3));
    });
    let mut b = [0u8; 1];
    std::io::Read::read_exact(&mut &closed_rx, &mut b).unwrap();
    drop(s.local);
    let mut hung_up = false;
    for _ in 0..100 {
        if sys::poll_now(fd, libc::POLLIN) & libc::POLLHUP != 0 {
            hung_up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(sys::wait_for_test(child), 0, "the child's checks");
    assert!(hung_up, "the app's end hung up while the child lived");
    forget_swapped(fd);
    crate::fdtable::set(fd, 0);
}

/// The shim's own fds of a swapped connection (the engine's end, the kept socket) sit at or
/// above [`sys::high_floor`]: the numbers the app's next sockets get are those TCP would give.
#[test]
fn a_swap_keeps_its_own_fds_above_the_apps_numbers() {
    use std::os::fd::AsRawFd;

    let (app, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = app.as_raw_fd();
    let s = swap::swap(fd).unwrap();
    assert!(sys::high_floor() >= 64);
    assert!(
        s.local.as_raw_fd() >= sys::high_floor(),
        "{}",
        s.local.as_raw_fd()
    );
    assert!(
        s.kept.as_raw_fd() >= sys::high_floor(),
        "{}",
        s.kept.as_raw_fd()
    );
    let kept = forget_swapped(fd);
    drop((s, kept));
    crate::fdtable::set(fd, 0);
}

/// A connection that stays TCP after the client's swap gets its TCP socket back on the app's
/// number: the same description, its epoll registrations (noted, for a later swap), the fd's
/// flags as they were, and none of the shim's fds left open or marked.
#[test]
fn an_undone_swap_leaves_the_number_as_it_was() {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let fd = tcp.as_raw_fd();
    let original = sys::file_id(fd);
    let ep = sys::test_epoll();
    let data = 0xbeef_u64;
    // As the socket hook marks it; registered before its connect, as far as the hooks know.
    crate::fdtable::set(fd, crate::fdtable::INET_STREAM | crate::fdtable::TCP);
    sys::epoll_add(ep, fd, libc::EPOLLIN as u32, data).unwrap();
    crate::ops::epoll_ctl(
        ep,
        libc::EPOLL_CTL_ADD,
        fd,
        Some((libc::EPOLLIN as u32, data)),
    );
    let before = crate::fdtable::get(fd);
    let s = swap::swap(fd).unwrap();
    assert_eq!(s.moved.len(), 1, "the registration moved with the number");
    assert_ne!(
        sys::file_id(fd),
        original,
        "the number names the socketpair"
    );
    let (kept_fd, local) = (s.kept.as_raw_fd(), s.local.as_raw_fd());
    // Another app thread writes to the number during the connect.
    sys::send_all_now_for_test(fd, b"early").unwrap();
    swap::unswap(fd, s, before).unwrap();
    let mut got = [0u8; 5];
    std::io::Read::read_exact(&mut server, &mut got).unwrap();
    assert_eq!(&got, b"early", "written during the connect, sent on TCP");
    assert_eq!(
        sys::file_id(fd),
        original,
        "the TCP socket is back on the number"
    );
    assert_eq!(crate::fdtable::get(fd), before);
    assert!(
        [kept_fd, local].iter().all(|&n| sys::file_id(n).is_none()),
        "the shim's fds are closed"
    );
    assert_eq!(crate::fdtable::get(kept_fd), 0);
    assert_eq!(crate::fdtable::get(local), 0);
    assert!(kept(fd).is_none(), "not swapped any more");
    assert!(
        restored(fd),
        "a read that met the socketpair's EOF is made again"
    );
    assert!(!restored(fd + 1));
    assert_eq!(sys::test_epoll_wait(ep), None, "nothing readable yet");
    server.write_all(b"x").unwrap();
    assert_eq!(
        sys::test_epoll_wait(ep),
        Some((libc::EPOLLIN as u32, data)),
        "the app's registration, on the TCP socket"
    );
    assert_eq!(
        crate::watches::unwatch(fd).len(),
        1,
        "noted again: a later swap moves it"
    );
    crate::fdtable::set(fd, 0);
    forget_restored(fd);
    assert!(!restored(fd), "closed: forgotten");
    drop(tcp);
    sys::close_raw_for_test(ep);
}

/// A zero-copy send on an upgraded fd whose kept TCP socket has `SO_ZEROCOPY` on queues its
/// completion at once, which the waits report (`POLLERR`) until `MSG_ERRQUEUE` takes it; with
/// the option off, nothing is queued.
#[test]
fn zero_copy_sends_complete_on_the_connections_error_queue() {
    use std::os::fd::AsRawFd;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let _server = listener.accept().unwrap();
    let fd = tcp.as_raw_fd();
    let s = swap::swap(fd).unwrap();
    zerocopy_sent(fd);
    assert!(
        error_state(fd).is_none(),
        "SO_ZEROCOPY off: the kernel ignores the flag"
    );
    let kept = kept(fd).unwrap();
    sys::set_int_option_for_test(kept.as_raw_fd(), libc::SO_ZEROCOPY, 1);
    zerocopy_sent(fd);
    zerocopy_sent(fd);
    let before = error_state(fd).expect("a completion is queued");
    assert_eq!(
        crate::readiness::errors_among(&[fd], &error_state),
        vec![fd]
    );
    let (errq, family) = error_queue(fd).unwrap();
    assert_eq!(family, libc::AF_INET);
    assert_eq!(
        errq.take(),
        Some(crate::errqueue::Completion { lo: 0, hi: 1 })
    );
    assert!(error_state(fd).is_none(), "taken");
    zerocopy_sent(fd);
    assert_ne!(
        error_state(fd),
        Some(before),
        "a new completion is a new generation"
    );
    assert_eq!(
        errq.take(),
        Some(crate::errqueue::Completion { lo: 2, hi: 2 })
    );
    drop(s);
    forget_swapped(fd);
    crate::fdtable::set(fd, 0);
}
