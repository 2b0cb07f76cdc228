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

/// A stream that fails is reported to the app once, as a reset, through every copy of its fd;
/// one that ends in order never is.
#[test]
fn a_failed_stream_reads_as_one_reset_and_an_orderly_end_as_none() {
    use crate::reason::Role;
    use rdma_streams_transport::engine::{End, Event, StreamPath};
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
    for failed in [true, false] {
        let (app, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = app.as_raw_fd();
        let s = swap::swap(fd).unwrap();
        let copy = sys::dup_cloexec(fd).unwrap();
        assert!(copy_swapped(fd, copy.as_raw_fd()));
        assert!(!take_reset(fd), "nothing failed yet");
        let mut on = events::on_event(Role::Client, fd, None, Arc::clone(&s.broken));
        on(end(failed.then_some("work completion failed")));
        assert_eq!(take_reset(copy.as_raw_fd()), failed, "failed: {failed}");
        assert!(!take_reset(fd), "told once, through any copy");
        assert!(!take_reset(copy.as_raw_fd()));
        forget_swapped(fd);
        forget_swapped(copy.as_raw_fd());
        assert!(!take_reset(fd), "not a swapped fd any more");
        crate::fdtable::set(fd, 0);
    }
}
