//! The waiting calls: `poll`, `ppoll`, `select`, `pselect`, `epoll_wait`, `epoll_pwait` and
//! `epoll_pwait2`, which report `POLLERR` for an upgraded fd as TCP would
//! (`streamshim_core::readiness`: a reset the hooks report, a zero-copy completion).
//!
//! Each is libc's own, with its arguments, while no fd has such an error and no wait is
//! sliced (one atomic load), and on the shim's own threads. Otherwise the wait does not
//! block when one of its fds has one (the original is called without a timeout), and
//! `POLLERR` is added to what the original answered: before the wait for errors already
//! pending, after it for one that came during it (a reset ends the wait itself: the
//! socketpair end hangs up). In a process that turned zero-copy sends on for an upgraded fd,
//! a wait over an upgraded fd (every epoll wait: its set is the kernel's) waits in slices of
//! at most [`SLICE`] and asks between them: a completion another thread's send queued wakes
//! no socketpair end, so the wait finds it within a slice where a TCP socket's error queue
//! would have woken it at once.

// `unsafe` here: the exported detours, calls of the originals through raw pointers, and the
// caller's pollfd, fd_set, epoll_event and timeout arguments.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

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

/// How long one call of the original may wait.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// As long as the caller asked.
    Asked,
    /// Not at all.
    No,
    /// At most this long (a slice of what the caller asked).
    AtMost(Duration),
}

/// The longest slice of a wait that waits in slices ([`readiness::slice_waits`]).
const SLICE: Duration = Duration::from_millis(10);

/// A timeout in milliseconds (negative: none) as a duration (None: forever).
fn asked_ms(ms: c_int) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// A `timespec` timeout (null: none) as a duration (None: forever).
///
/// # Safety
/// `t` is null or points to a readable `struct timespec`.
unsafe fn asked_timespec(t: *const libc::timespec) -> Option<Duration> {
    // SAFETY: per this function's contract.
    let t = unsafe { t.as_ref() }?;
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0).min(999_999_999);
    Some(Duration::new(secs, nanos))
}

/// A `timeval` timeout (null: none) as a duration (None: forever).
///
/// # Safety
/// `t` is null or points to a readable `struct timeval`.
unsafe fn asked_timeval(t: *const libc::timeval) -> Option<Duration> {
    // SAFETY: per this function's contract.
    let t = unsafe { t.as_ref() }?;
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u32::try_from(t.tv_usec).unwrap_or(0).min(999_999);
    Some(Duration::new(secs, micros * 1000))
}

/// The timeout in milliseconds of one call, given the caller's `asked`.
fn ms(wait: Wait, asked: c_int) -> c_int {
    match wait {
        Wait::Asked => asked,
        Wait::No => 0,
        Wait::AtMost(d) => c_int::try_from(d.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX),
    }
}

/// The duration of one call that is not the caller's own (None: the caller's).
fn own(wait: Wait) -> Option<Duration> {
    match wait {
        Wait::Asked => None,
        Wait::No => Some(Duration::ZERO),
        Wait::AtMost(d) => Some(d),
    }
}

/// The `timespec` timeout of one call: the caller's `asked`, or one written into `room`.
fn timespec(
    wait: Wait,
    asked: *const libc::timespec,
    room: &mut libc::timespec,
) -> *const libc::timespec {
    let Some(d) = own(wait) else {
        return asked;
    };
    room.tv_sec = libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX);
    room.tv_nsec = libc::c_long::from(d.subsec_nanos());
    room
}

/// The `timeval` timeout of one call: the caller's `asked` (which select updates), or one
/// written into `room`.
fn timeval(wait: Wait, asked: *mut libc::timeval, room: &mut libc::timeval) -> *mut libc::timeval {
    let Some(d) = own(wait) else {
        return asked;
    };
    room.tv_sec = libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX);
    room.tv_usec = libc::suseconds_t::from(d.subsec_micros());
    room
}

/// Waits in slices of at most [`SLICE`] by `call` until it answers, the caller's `asked`
/// time is over, or `errors` finds an error only the hooks report.
fn sliced(
    asked: Option<Duration>,
    call: &mut dyn FnMut(Wait) -> c_int,
    errors: &mut dyn FnMut() -> bool,
) -> c_int {
    let deadline = asked.map(|d| Instant::now() + d);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let last = left.is_some_and(|l| l <= SLICE);
        let rc = call(Wait::AtMost(left.map_or(SLICE, |l| l.min(SLICE))));
        if rc != 0 || last || errors() {
            return rc;
        }
    }
}

/// Runs a wait over the fds `numbers` by `call` (for `asked`; None: forever), and returns
/// its result and the fds with an error only the hooks report: without waiting when one has
/// one already, in slices while zero-copy sends are on in the process and one is upgraded.
fn wait_over(
    numbers: &[c_int],
    asked: Option<Duration>,
    call: &mut dyn FnMut(Wait) -> c_int,
) -> (c_int, Vec<c_int>) {
    let errors = || guarded(|| ops::errors_among(numbers)).unwrap_or_default();
    let before = errors();
    if !before.is_empty() {
        return (call(Wait::No), before);
    }
    let slice = guarded(|| readiness::slicing() && numbers.iter().any(|&fd| ops::upgraded(fd)))
        .unwrap_or(false);
    let rc = if slice {
        sliced(asked, call, &mut || {
            readiness::any() && !errors().is_empty()
        })
    } else {
        call(Wait::Asked)
    };
    let after = if rc >= 0 && readiness::any() {
        errors()
    } else {
        Vec::new()
    };
    (rc, after)
}

/// `poll` or `ppoll` of `fds` (`nfds` entries) by `call` for `asked` (as in [`wait_over`]).
///
/// # Safety
/// `fds` is null or points to `nfds` writable `struct pollfd`s, not touched by anything else
/// meanwhile.
unsafe fn poll_with_errors(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    asked: Option<Duration>,
    call: &mut dyn FnMut(Wait) -> c_int,
) -> c_int {
    let count = usize::try_from(nfds).unwrap_or(0);
    if readiness::untouched() || fds.is_null() || count == 0 {
        return call(Wait::Asked);
    }
    let numbers: Vec<c_int> = {
        // SAFETY: per this function's contract; the slice is dropped before the call writes.
        let set = unsafe { std::slice::from_raw_parts(fds, count) };
        set.iter().map(|p| p.fd).collect()
    };
    let (rc, errors) = wait_over(&numbers, asked, call);
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
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe { orig(fds, nfds, ms(wait, timeout)) };
    // SAFETY: poll's contract: `fds` holds `nfds` pollfds.
    unsafe { poll_with_errors(fds, nfds, asked_ms(timeout), &mut call) }
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
    let mut room = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe { orig(fds, nfds, timespec(wait, tmo, &mut room), sigmask) };
    // SAFETY: ppoll's contract: `fds` holds `nfds` pollfds; `tmo` is null or a timespec.
    unsafe { poll_with_errors(fds, nfds, asked_timespec(tmo), &mut call) }
}

/// The three sets of a `select` or `pselect` (each null or the caller's writable `fd_set`).
#[derive(Clone, Copy)]
struct Sets {
    read: *mut libc::fd_set,
    write: *mut libc::fd_set,
    except: *mut libc::fd_set,
}

/// `select` or `pselect` over `sets` by `call` for `asked` (as in [`wait_over`]): an fd with
/// an error is readable and writable (TCP's `POLLERR` is in both of select's sets), where the
/// caller asked for either. Each call of the original gets the sets as the caller asked.
///
/// # Safety
/// Each set pointer is null or points to a writable `fd_set`, as select's contract says.
unsafe fn select_with_errors(
    nfds: c_int,
    sets: Sets,
    asked: Option<Duration>,
    call: &mut dyn FnMut(Wait) -> c_int,
) -> c_int {
    if readiness::untouched() || nfds <= 0 || (sets.read.is_null() && sets.write.is_null()) {
        return call(Wait::Asked);
    }
    // SAFETY: per this function's contract; copies of what the caller asked for.
    let copy = |p: *mut libc::fd_set| (!p.is_null()).then(|| unsafe { p.read() });
    let (asked_read, asked_write, asked_except) =
        (copy(sets.read), copy(sets.write), copy(sets.except));
    let asked_in =
        |set: &Option<libc::fd_set>, fd: c_int| set.as_ref().is_some_and(|s| sys::fd_isset(fd, s));
    let top = nfds.min(libc::FD_SETSIZE as c_int);
    let numbers: Vec<c_int> = (0..top)
        .filter(|&fd| asked_in(&asked_read, fd) || asked_in(&asked_write, fd))
        .collect();
    // A call that timed out cleared the sets: the next slice asks again.
    let mut again = |wait: Wait| {
        for (p, asked_set) in [
            (sets.read, &asked_read),
            (sets.write, &asked_write),
            (sets.except, &asked_except),
        ] {
            if let Some(set) = asked_set {
                // SAFETY: `p` is the caller's writable set (not null: it was copied).
                unsafe { p.write(*set) };
            }
        }
        call(wait)
    };
    let (mut rc, errors) = wait_over(&numbers, asked, &mut again);
    if rc < 0 {
        return rc;
    }
    for fd in errors {
        for (asked_set, out) in [(&asked_read, sets.read), (&asked_write, sets.write)] {
            if asked_in(asked_set, fd) {
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
    let mut room = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe {
        orig(
            nfds,
            readfds,
            writefds,
            exceptfds,
            timeval(wait, timeout, &mut room),
        )
    };
    let sets = Sets {
        read: readfds,
        write: writefds,
        except: exceptfds,
    };
    // SAFETY: select's contract: each set is null or a writable fd_set, the timeout null or a
    // timeval.
    unsafe { select_with_errors(nfds, sets, asked_timeval(timeout), &mut call) }
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
    let mut room = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe {
        orig(
            nfds,
            readfds,
            writefds,
            exceptfds,
            timespec(wait, timeout, &mut room),
            sigmask,
        )
    };
    let sets = Sets {
        read: readfds,
        write: writefds,
        except: exceptfds,
    };
    // SAFETY: pselect's contract: each set is null or a writable fd_set, the timeout null or
    // a timespec.
    unsafe { select_with_errors(nfds, sets, asked_timespec(timeout), &mut call) }
}

/// What `fd` is ready for now among `interest` (epoll and poll share the bits that matter).
fn ready_now(e: &ErrorEvent) -> u32 {
    let asked = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLPRI | libc::EPOLLRDHUP) as u32;
    let events = i16::try_from(e.interest & asked).unwrap_or(0);
    let ready = u32::from(sys::poll_now(e.fd, events) as u16);
    ready & (e.interest | (libc::EPOLLERR | libc::EPOLLHUP) as u32)
}

/// An epoll wait of `epfd` into `events` (`max` entries) by `call` for `asked` (None:
/// forever): without waiting when a registered fd has an error only the hooks report, in
/// slices while zero-copy sends are on in the process.
///
/// # Safety
/// `events` is null or points to `max` writable `struct epoll_event`s.
unsafe fn epoll_with_errors(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    asked: Option<Duration>,
    call: &mut dyn FnMut(Wait) -> c_int,
) -> c_int {
    if readiness::untouched() || events.is_null() || max <= 0 {
        return call(Wait::Asked);
    }
    let errors = || guarded(|| ops::epoll_errors(epfd)).unwrap_or_default();
    let mut found = errors();
    let rc = if !found.is_empty() {
        call(Wait::No)
    } else if guarded(readiness::slicing).unwrap_or(false) {
        sliced(asked, call, &mut || {
            if readiness::any() {
                found = errors();
            }
            !found.is_empty()
        })
    } else {
        call(Wait::Asked)
    };
    if rc < 0 {
        return rc;
    }
    if found.is_empty() && rc > 0 && readiness::any() {
        found = errors();
    }
    let (Ok(n), Ok(room)) = (usize::try_from(rc), usize::try_from(max)) else {
        return rc;
    };
    if found.is_empty() {
        return rc;
    }
    // SAFETY: per this function's contract; the call returned, so the caller's array is ours
    // to update.
    let set = unsafe { std::slice::from_raw_parts_mut(events, room) };
    let added = guarded(|| readiness::epoll_add(set, n, &found, &ready_now)).unwrap_or(n);
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
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe { orig(epfd, events, maxevents, ms(wait, timeout)) };
    // SAFETY: epoll_wait's contract: `events` holds `maxevents` entries.
    unsafe { epoll_with_errors(epfd, events, maxevents, asked_ms(timeout), &mut call) }
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
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call =
        |wait: Wait| unsafe { orig(epfd, events, maxevents, ms(wait, timeout), sigmask) };
    // SAFETY: epoll_pwait's contract: `events` holds `maxevents` entries.
    unsafe { epoll_with_errors(epfd, events, maxevents, asked_ms(timeout), &mut call) }
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
    let mut room = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the caller's arguments, with the timeout of this call.
    let mut call = |wait: Wait| unsafe {
        orig(
            epfd,
            events,
            maxevents,
            timespec(wait, timeout, &mut room),
            sigmask,
        )
    };
    // SAFETY: epoll_pwait2's contract: `events` holds `maxevents` entries; the timeout is null
    // or a timespec.
    unsafe { epoll_with_errors(epfd, events, maxevents, asked_timespec(timeout), &mut call) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_convert_both_ways() {
        assert_eq!(asked_ms(-1), None);
        assert_eq!(asked_ms(1500), Some(Duration::from_millis(1500)));
        assert_eq!(ms(Wait::Asked, -1), -1);
        assert_eq!(ms(Wait::No, -1), 0);
        assert_eq!(
            ms(Wait::AtMost(Duration::from_micros(10_001)), -1),
            11,
            "rounded up"
        );
        let t = libc::timespec {
            tv_sec: 2,
            tv_nsec: 5,
        };
        // SAFETY: a live timespec, and a null pointer.
        unsafe {
            assert_eq!(asked_timespec(&t), Some(Duration::new(2, 5)));
            assert_eq!(asked_timespec(std::ptr::null()), None);
        }
        let mut room = libc::timespec {
            tv_sec: 9,
            tv_nsec: 9,
        };
        assert_eq!(timespec(Wait::Asked, &t, &mut room), &raw const t);
        let p = timespec(Wait::AtMost(Duration::from_millis(10)), &t, &mut room);
        assert_eq!(p, &raw const room);
        assert_eq!((room.tv_sec, room.tv_nsec), (0, 10_000_000));
        let mut tv_room = libc::timeval {
            tv_sec: 9,
            tv_usec: 9,
        };
        let p = timeval(Wait::No, std::ptr::null_mut(), &mut tv_room);
        assert_eq!(p, &raw mut tv_room);
        assert_eq!((tv_room.tv_sec, tv_room.tv_usec), (0, 0));
    }

    #[test]
    fn a_sliced_wait_ends_at_an_answer_an_error_or_the_time_asked() {
        // Answers at the third slice.
        let mut calls = Vec::new();
        let rc = sliced(
            None,
            &mut |w| {
                calls.push(w);
                if calls.len() == 3 { 1 } else { 0 }
            },
            &mut || false,
        );
        assert_eq!((rc, calls.len()), (1, 3));
        assert!(
            calls
                .iter()
                .all(|w| matches!(w, Wait::AtMost(d) if *d == SLICE))
        );
        // An error found after the second slice.
        let mut n = 0;
        let mut asks = 0;
        let rc = sliced(
            None,
            &mut |_| {
                n += 1;
                0
            },
            &mut || {
                asks += 1;
                asks == 2
            },
        );
        assert_eq!((rc, n), (0, 2));
        // The time asked is over: 25 ms takes three slices (10, 10, the rest).
        let start = Instant::now();
        let mut slices = 0;
        let rc = sliced(
            Some(Duration::from_millis(25)),
            &mut |w| {
                slices += 1;
                if let Wait::AtMost(d) = w {
                    std::thread::sleep(d);
                }
                0
            },
            &mut || false,
        );
        assert_eq!(rc, 0);
        assert!(slices >= 3, "{slices}");
        assert!(start.elapsed() >= Duration::from_millis(25));
    }
}
