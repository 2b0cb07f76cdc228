//! The swap: the app's fd number moves from its kernel TCP socket to one end of a socketpair,
//! before `accept()` returns it, and on the connecting side before the kernel connect (so
//! before the peer can accept), so no app thread can hold the old description; epoll
//! registrations the app made before `connect()` move with the number ([`crate::watches`]).
//! The TCP socket stays open under a shim-owned number (the kept socket). A connection that
//! stays TCP after the connecting side's swap gets its TCP socket back on the number
//! ([`unswap`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use libc::c_int;

use super::delegate::Notice;
use super::{SWAPPED_FDS, SwappedFd};
use crate::fdtable::{self, COUNTED, INET_STREAM, SHIM_OWNED, SWAPPED, TCP};
use crate::sys;
use crate::watches::{self, Watch};

/// The engine's end of the socketpair and the kept TCP socket of a swapped fd.
pub struct Swapped {
    /// The socketpair end the engine pumps (non-blocking).
    pub local: OwnedFd,
    /// The kernel TCP socket, shared with the fd table (getpeername, TCP options).
    pub kept: Arc<OwnedFd>,
    /// Set when the stream fails ([`super::take_reset`]; the engine's end report sets it).
    pub broken: Arc<AtomicBool>,
    /// The app's epoll registrations that moved with the number ([`unswap`] moves them back).
    pub moved: Vec<Watch>,
}

/// Moves the kernel TCP socket behind the app's `fd` to a kept fd number and puts one end of a
/// fresh socketpair on `fd`, keeping the app's O_NONBLOCK and close-on-exec. An error after
/// the number was taken over leaves the app's fd without a peer: the caller resets it.
pub fn swap(fd: c_int) -> io::Result<Swapped> {
    let flags = sys::fd_flags(fd)?;
    let (app, local) = engine_pair()?;
    let (kept, broken, moved) = install(fd, app, flags, None)?;
    Ok(Swapped {
        local,
        kept,
        broken,
        moved,
    })
}

/// A socketpair for a swap: the app's end, and the engine's (non-blocking, above the app's
/// numbers, closed in fork children).
pub(super) fn engine_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (app, local) = sys::socketpair_stream()?;
    // The shim's own fds sit above the app's numbers; the app's end takes the app's number.
    let local = sys::move_high(local);
    fdtable::set_pair_end(local.as_raw_fd());
    rdma_streams_transport::fd::set_only_nonblocking(local.as_fd())?;
    Ok((app, local))
}

/// Puts the socketpair end `app` on the app's `fd` (whose fcntl flags were `flags`) and keeps
/// a copy of the TCP socket (getpeername, TCP options; the engine's kept socket when it runs
/// in this process); `notice` for a fork child's connection whose engine is its parent's
/// ([`super::delegate`]). Returns the kept socket, the connection's `broken` flag and the
/// epoll registrations that moved.
pub(super) fn install(
    fd: c_int,
    app: OwnedFd,
    (fl, fdfl): (c_int, c_int),
    notice: Option<Arc<Notice>>,
) -> io::Result<(Arc<OwnedFd>, Arc<AtomicBool>, Vec<Watch>)> {
    // Options the app never set are the kernel's defaults on both sockets: not read back.
    let untouched = fdtable::has_defaults(fd);
    fdtable::set(app.as_raw_fd(), SHIM_OWNED);
    let app_end = sys::file_id(app.as_raw_fd());
    if fl & libc::O_NONBLOCK != 0 {
        rdma_streams_transport::fd::set_only_nonblocking(app.as_fd())?;
    }
    // What the app set on its TCP socket (or its listener) and can read back stays set.
    sys::copy_socket_state(fd, app.as_fd(), fl, untouched);
    let kept = Arc::new(sys::dup_high(fd)?);
    // The engine's close of the kept socket never lingers (an app's `SO_LINGER {1, N}` set
    // before the swap is the socketpair's now); an abortive close ({1, 0}) stays set.
    if !untouched && rdma_streams_transport::fd::lingers_gracefully(kept.as_fd()) {
        let _ = rdma_streams_transport::fd::set_reset_on_close(kept.as_fd(), false);
    }
    fdtable::set(kept.as_raw_fd(), SHIM_OWNED);
    let broken = Arc::new(AtomicBool::new(false));
    // Another process the app hands its end to asks this one what it is.
    super::handed::remember(app_end, &kept, &broken);
    SWAPPED_FDS.lock().insert(
        fd,
        SwappedFd {
            kept: Arc::clone(&kept),
            reader: None,
            writer: None,
            halves: None,
            broken: Arc::clone(&broken),
            app_end,
            notice,
            errq: Arc::new(crate::errqueue::ErrQueue::new()),
            late: None,
        },
    );
    // The app's epoll registrations of the TCP socket move to the socketpair end with the
    // number (or back onto the TCP socket when the number stays with it).
    let watches = watches::unwatch(fd);
    if let Err(e) = sys::dup3(app.as_fd(), fd, fdfl & libc::FD_CLOEXEC != 0) {
        SWAPPED_FDS.lock().remove(&fd);
        watches::rewatch(fd, &watches);
        return Err(e);
    }
    watches::rewatch(fd, &watches);
    drop(app);
    fdtable::set(fd, INET_STREAM | TCP | COUNTED | SWAPPED);
    if untouched {
        // The socketpair end has the defaults too (nothing was copied onto it).
        fdtable::mark_defaults(fd);
    }
    Ok((kept, broken, watches))
}

/// How long [`unswap`] waits for the TCP socket to take bytes written during the connect.
const FORWARD_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// Undoes [`swap`] of `fd` (whose fdtable flags were `before`) before anything reached the
/// engine: the kept TCP socket goes back on the number, with the epoll registrations, bytes
/// written to the socketpair meanwhile are sent on it, and the socketpair is closed (a thread
/// that waited on its app end meanwhile sees it hang up; a read it was blocked in is made
/// again on the TCP socket by the hooks, [`super::restored`], and its next call on the number
/// reaches the TCP socket).
pub fn unswap(fd: c_int, s: Swapped, before: u8) -> io::Result<()> {
    let moved = restore_tcp(fd, &s.kept, &s.moved, before);
    // What another app thread wrote to the number meanwhile goes out on the TCP connection
    // (a connection that failed takes nothing: there is nobody to send it to).
    forward_written(fd, &s.local, &s.kept);
    // Their entries go before the numbers are closed: a number reused at once is not ours.
    fdtable::clear(s.kept.as_raw_fd());
    fdtable::clear(s.local.as_raw_fd());
    drop(s);
    moved
}

/// The first half of [`unswap`], all of it in a fork child (whose socketpair's other end is in
/// the engine's process): the TCP socket `kept` goes back on the app's `fd` with the app's
/// `SO_LINGER` and the epoll registrations `moved`, and the fd table says what it said before
/// (`before`). The caller lets go of its copy of `kept`.
pub(super) fn restore_tcp(
    fd: c_int,
    kept: &OwnedFd,
    moved: &[Watch],
    before: u8,
) -> io::Result<()> {
    let cloexec = sys::fd_flags(fd).is_ok_and(|(_, fdfl)| fdfl & libc::FD_CLOEXEC != 0);
    for w in moved {
        sys::epoll_del(w.epfd, fd);
    }
    // The swap turned lingering off on the TCP socket (the app's setting went to the
    // socketpair end, which still names it): the app's setting comes back.
    sys::copy_option(fd, kept.as_raw_fd(), libc::SO_LINGER);
    let back = sys::dup3(kept.as_fd(), fd, cloexec);
    SWAPPED_FDS.lock().remove(&fd);
    if back.is_ok() {
        fdtable::set(fd, before);
        super::note_restored(fd);
    }
    // Back on the TCP socket, and noted again: a later swap of the number moves them.
    watches::restore(fd, moved);
    back
}

/// Sends what is unread in the engine's socketpair end `local` on the TCP socket `kept`: what
/// the app wrote to `fd` while it named the socketpair, once it names the TCP socket again.
pub(super) fn forward_written(fd: c_int, local: &OwnedFd, kept: &OwnedFd) {
    if let Ok(n) = sys::forward_unread(local.as_raw_fd(), kept.as_raw_fd(), FORWARD_BOUND)
        && n > 0
    {
        crate::log::log_at!(
            crate::log::Level::Debug,
            "fd {fd}: {n} bytes written during the connect went out on TCP"
        );
    }
}

/// The peer's TCP connection gets an RST (a failed swap after CONFIRM or CLAIM).
pub fn reset(fd: c_int) {
    sys::shutdown_both(fd);
}
