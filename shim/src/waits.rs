//! The waiting calls: `poll`, `ppoll`, `select`, `pselect`, `epoll_wait`, `epoll_pwait` and
//! `epoll_pwait2`, which report `POLLERR` for an upgraded fd as TCP would
//! (`streamshim_core::readiness`: a reset the hooks report, a zero-copy completion).
//!
//! Each is libc's own, with its arguments, while no fd has such an error (one atomic load),
//! and on the shim's own threads. Otherwise the wait does not block when one of its fds has
//! one (the original is called without a timeout), and `POLLERR` is added to what the
//! original answered: before the wait for errors already pending, after it for one that came
//! during it (a reset ends the wait itself: the socketpair end hangs up).

// `unsafe` here: the exported detours, calls of the originals through raw pointers, and the
// caller's pollfd, fd_set and epoll_event arrays.
#![allow(unsafe_code)]

use libc::c_int;

use crate::real;
use streamshim_core::guard::guarded;
use streamshim_core::readiness::{self, ErrorEvent};
use streamshim_core::{ops, sys};

/// The result of a hook whose original cannot be found (never seen with glibc).
fn no_original() -> c_int {
    sys::set_errno(libc::ENOSYS);
    -1
}

/// A zero timeout, for the calls that take a `timespec`.
const NO_WAIT: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// Runs a wait over the fds `numbers` by `call` (true: with the caller's timeout; false:
/// without waiting), and returns its result and the fds with an error only the hooks report.
fn wait_over(numbers: &[c_int], call: &mut dyn FnMut(bool) -> c_int) -> (c_int, Vec<c_int>) {
    let before = guarded(|| ops::errors_among(numbers)).unwrap_or_default();
    let rc = call(before.is_empty());
    if rc < 0 || !before.is_empty() {
        return (rc, before);
    }
    let after = if rc > 0 && readiness::any() {
        guarded(|| ops::errors_among(numbers)).unwrap_or_default()
    } else {
        Vec::new()
    };
    (rc, after)
}

/// `poll` or `ppoll` of `fds` (`nfds` entries) by `call` (as in [`wait_over`]); the call
/// with the caller's timeout alone while no fd has an error only the hooks report.
///
/// # Safety
/// `fds` is null or points to `nfds` writable `struct pollfd`s, not touched by anything else
/// meanwhile.
unsafe fn poll_with_errors(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    call: &mut dyn FnMut(bool) -> c_int,
) -> c_int {
    let count = usize::try_from(nfds).unwrap_or(0);
    if !readiness::any() || fds.is_null() || count == 0 {
        return call(true);
    }
    let numbers: Vec<c_int> = {
        // SAFETY: per this function's contract; the slice is dropped before the call writes.
        let set = unsafe { std::slice::from_raw_parts(fds, count) };
        set.iter().map(|p| p.fd).collect()
    };
    let (rc, errors) = wait_over(&numbers, call);
    if rc < 0 || errors.is_empty() {
        return rc;
    }
    // SAFETY: as above; the call returned, so the caller's array is ours to update.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, count) };
    readiness::poll_add(set, rc, &errors)
}

/// `int poll(struct pollfd *fds, nfds_t nfds, int timeout)`.
///
/// # Safety
/// The C contract of `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    let Some(orig) = real::poll() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, the timeout 0 when the call must not wait.
    let mut call = |wait: bool| unsafe { orig(fds, nfds, if wait { timeout } else { 0 }) };
    // SAFETY: poll's contract: `fds` holds `nfds` pollfds.
    unsafe { poll_with_errors(fds, nfds, &mut call) }
}

/// `int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *tmo, const sigset_t
/// *sigmask)`.
///
/// # Safety
/// The C contract of `ppoll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    tmo: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(orig) = real::ppoll() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, a zero timeout when the call must not wait.
    let mut call =
        |wait: bool| unsafe { orig(fds, nfds, if wait { tmo } else { &NO_WAIT }, sigmask) };
    // SAFETY: ppoll's contract: `fds` holds `nfds` pollfds.
    unsafe { poll_with_errors(fds, nfds, &mut call) }
}

/// `select` or `pselect` over the sets by `call` (as in [`wait_over`]; the call with the
/// caller's timeout alone while no fd has an error only the hooks report): an fd with an error
/// is readable and writable (TCP's `POLLERR` is in both of select's sets), where the caller
/// asked for either.
///
/// # Safety
/// Each set pointer is null or points to a writable `fd_set`, as select's contract says.
unsafe fn select_with_errors(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    call: &mut dyn FnMut(bool) -> c_int,
) -> c_int {
    if !readiness::any() || nfds <= 0 || (readfds.is_null() && writefds.is_null()) {
        return call(true);
    }
    // SAFETY: per this function's contract; copies of what the caller asked for.
    let asked_read = (!readfds.is_null()).then(|| unsafe { readfds.read() });
    // SAFETY: as above.
    let asked_write = (!writefds.is_null()).then(|| unsafe { writefds.read() });
    let asked =
        |set: &Option<libc::fd_set>, fd: c_int| set.as_ref().is_some_and(|s| sys::fd_isset(fd, s));
    let top = nfds.min(libc::FD_SETSIZE as c_int);
    let numbers: Vec<c_int> = (0..top)
        .filter(|&fd| asked(&asked_read, fd) || asked(&asked_write, fd))
        .collect();
    let (mut rc, errors) = wait_over(&numbers, call);
    if rc < 0 {
        return rc;
    }
    for fd in errors {
        for (asked_set, out) in [(&asked_read, readfds), (&asked_write, writefds)] {
            if asked(asked_set, fd) {
                // SAFETY: `out` is the caller's set (not null: it was asked), which the call
                // wrote and nothing else touches now.
                let out = unsafe { &mut *out };
                if !sys::fd_isset(fd, out) {
                    sys::fd_set_add(fd, out);
                    rc += 1;
                }
            }
        }
    }
    rc
}

/// `int select(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval
/// *timeout)`.
///
/// # Safety
/// The C contract of `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let Some(orig) = real::select() else {
        return no_original();
    };
    let mut zero = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: the caller's arguments, a zero timeout when the call must not wait.
    let mut call = |wait: bool| unsafe {
        orig(
            nfds,
            readfds,
            writefds,
            exceptfds,
            if wait { timeout } else { &raw mut zero },
        )
    };
    // SAFETY: select's contract: each set is null or a writable fd_set.
    unsafe { select_with_errors(nfds, readfds, writefds, &mut call) }
}

/// `int pselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, const struct
/// timespec *timeout, const sigset_t *sigmask)`.
///
/// # Safety
/// The C contract of `pselect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(orig) = real::pselect() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, a zero timeout when the call must not wait.
    let mut call = |wait: bool| unsafe {
        orig(
            nfds,
            readfds,
            writefds,
            exceptfds,
            if wait { timeout } else { &NO_WAIT },
            sigmask,
        )
    };
    // SAFETY: pselect's contract: each set is null or a writable fd_set.
    unsafe { select_with_errors(nfds, readfds, writefds, &mut call) }
}

/// What `fd` is ready for now among `interest` (epoll and poll share the bits that matter).
fn ready_now(e: &ErrorEvent) -> u32 {
    let asked = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLPRI | libc::EPOLLRDHUP) as u32;
    let events = i16::try_from(e.interest & asked).unwrap_or(0);
    let ready = u32::from(sys::poll_now(e.fd, events) as u16);
    ready & (e.interest | (libc::EPOLLERR | libc::EPOLLHUP) as u32)
}

/// An epoll wait of `epfd` into `events` (`max` entries) by `call` (true: with the caller's
/// timeout; false: without waiting); the call with the caller's timeout alone while no fd has
/// an error only the hooks report.
///
/// # Safety
/// `events` is null or points to `max` writable `struct epoll_event`s.
unsafe fn epoll_with_errors(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    call: &mut dyn FnMut(bool) -> c_int,
) -> c_int {
    if !readiness::any() || events.is_null() || max <= 0 {
        return call(true);
    }
    let before = guarded(|| ops::epoll_errors(epfd)).unwrap_or_default();
    let rc = call(before.is_empty());
    if rc < 0 {
        return rc;
    }
    let errors = if before.is_empty() && rc > 0 && readiness::any() {
        guarded(|| ops::epoll_errors(epfd)).unwrap_or_default()
    } else {
        before
    };
    let (Ok(n), Ok(room)) = (usize::try_from(rc), usize::try_from(max)) else {
        return rc;
    };
    if errors.is_empty() {
        return rc;
    }
    // SAFETY: per this function's contract; the call returned, so the caller's array is ours
    // to update.
    let set = unsafe { std::slice::from_raw_parts_mut(events, room) };
    let added = guarded(|| readiness::epoll_add(set, n, &errors, &ready_now)).unwrap_or(n);
    c_int::try_from(added).unwrap_or(rc)
}

/// `int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout)`.
///
/// # Safety
/// The C contract of `epoll_wait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
) -> c_int {
    let Some(orig) = real::epoll_wait() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, the timeout 0 when the call must not wait.
    let mut call =
        |wait: bool| unsafe { orig(epfd, events, maxevents, if wait { timeout } else { 0 }) };
    // SAFETY: epoll_wait's contract: `events` holds `maxevents` entries.
    unsafe { epoll_with_errors(epfd, events, maxevents, &mut call) }
}

/// `int epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout, const
/// sigset_t *sigmask)`.
///
/// # Safety
/// The C contract of `epoll_pwait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(orig) = real::epoll_pwait() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, the timeout 0 when the call must not wait.
    let mut call = |wait: bool| unsafe {
        orig(
            epfd,
            events,
            maxevents,
            if wait { timeout } else { 0 },
            sigmask,
        )
    };
    // SAFETY: epoll_pwait's contract: `events` holds `maxevents` entries.
    unsafe { epoll_with_errors(epfd, events, maxevents, &mut call) }
}

/// `int epoll_pwait2(int epfd, struct epoll_event *events, int maxevents, const struct
/// timespec *timeout, const sigset_t *sigmask)`.
///
/// # Safety
/// The C contract of `epoll_pwait2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(orig) = real::epoll_pwait2() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, a zero timeout when the call must not wait.
    let mut call = |wait: bool| unsafe {
        orig(
            epfd,
            events,
            maxevents,
            if wait { timeout } else { &NO_WAIT },
            sigmask,
        )
    };
    // SAFETY: epoll_pwait2's contract: `events` holds `maxevents` entries.
    unsafe { epoll_with_errors(epfd, events, maxevents, &mut call) }
}
