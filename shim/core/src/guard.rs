//! The per-thread re-entrancy guard, and the two ways every hook runs shim logic under it:
//! [`detour`] (an op that calls the original exactly once) and [`guarded`] (a lookup or copy
//! that may answer instead of the original).
//!
//! While a hook runs the shim's own logic (the decision loads the RDMA libraries with
//! `dlopen`, whose device scan opens files and sockets; stats writing calls `close()`), nested
//! calls of hooked functions on the same thread go straight to the originals. The flag is a
//! `const`-initialised `Cell<bool>` without `Drop`, so touching it never allocates and never
//! registers a TLS destructor (redhook#15); the library is loaded at start-up (LD_PRELOAD), so
//! its TLS lives in the static TLS block and `__tls_get_addr` does not allocate either.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use libc::c_int;

use crate::sys;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Held while the shim's logic runs on this thread.
#[derive(Debug)]
pub struct Guard(());

impl Guard {
    /// Enters the shim; `None` if this thread is already inside it (call the original).
    #[inline]
    pub fn enter() -> Option<Guard> {
        match IN_SHIM.try_with(|c| c.replace(true)) {
            Ok(false) => Some(Guard(())),
            // Already inside, or TLS unavailable (thread teardown): pass through.
            Ok(true) | Err(_) => None,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_SHIM.try_with(|c| c.set(false));
    }
}

/// Runs `op` (safe logic that calls `real`, the original, once) under the guard, panics
/// caught, errno kept. On every path the original is called exactly once: nested (the guard is
/// held) -> straight to it; `op` panicked before calling it -> called afterwards; `op`
/// panicked after -> its result is returned. errno is the original call's on return, unless
/// `op` answered without it (then `op` set errno itself).
pub fn detour(
    real: &dyn Fn() -> c_int,
    op: impl FnOnce(&mut dyn FnMut() -> c_int) -> c_int,
) -> c_int {
    let Some(guard) = Guard::enter() else {
        return real();
    };
    let done: Cell<Option<(c_int, c_int)>> = Cell::new(None);
    let mut tracked = || {
        let rc = real();
        done.set(Some((rc, sys::errno())));
        rc
    };
    let out = catch_unwind(AssertUnwindSafe(|| op(&mut tracked)));
    drop(guard);
    match (out, done.get()) {
        (Ok(rc), Some((_, errno))) => {
            sys::set_errno(errno);
            rc
        }
        (Ok(rc), None) => rc,
        (Err(_), Some((rc, errno))) => {
            sys::set_errno(errno);
            rc
        }
        (Err(_), None) => real(),
    }
}

/// Runs `op` (a read that answers from a ring itself, or calls `real`, the original, at most
/// once and may add to what it read) under the guard, panics caught. None: the caller calls
/// the original, which `op` did not (this thread is already in the shim, `op` declined, or it
/// panicked before calling it). A panic after the call answers the call's result, so no byte
/// it read is read again. errno on return: the original's when it was called, else as it was.
/// The guard is let go while the original runs: it may block, and a signal handler meanwhile
/// gets the shim's hooks as on any other thread.
pub fn read_detour(
    real: &mut dyn FnMut(&mut [u8]) -> isize,
    op: impl FnOnce(&mut dyn FnMut(&mut [u8]) -> isize) -> Option<isize>,
) -> Option<isize> {
    let guard = Cell::new(Some(Guard::enter()?));
    let errno = sys::errno();
    let done: Cell<Option<(isize, c_int)>> = Cell::new(None);
    let mut tracked = |b: &mut [u8]| {
        drop(guard.take());
        let rc = real(b);
        done.set(Some((rc, sys::errno())));
        guard.set(Guard::enter());
        rc
    };
    let out = catch_unwind(AssertUnwindSafe(|| op(&mut tracked)));
    drop(guard.take());
    match (out, done.get()) {
        (Ok(rc), Some((_, e))) => {
            sys::set_errno(e);
            rc
        }
        (Ok(rc), None) => {
            sys::set_errno(errno);
            rc
        }
        (Err(_), Some((rc, e))) => {
            sys::set_errno(e);
            Some(rc)
        }
        (Err(_), None) => {
            sys::set_errno(errno);
            None
        }
    }
}

/// Runs `f` (shim logic that does not call the original: a lookup, a copy out of or into a
/// ring) under the guard, panics caught, errno as it was: None when this thread is already in
/// the shim or `f` panicked; the caller then does what the original would.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let guard = Guard::enter()?;
    let errno = sys::errno();
    let out = catch_unwind(AssertUnwindSafe(f)).ok();
    drop(guard);
    sys::set_errno(errno);
    out
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// An original that counts its calls and sets errno.
    fn original(calls: &Cell<u32>) -> impl Fn() -> c_int + '_ {
        move || {
            calls.set(calls.get() + 1);
            sys::set_errno(libc::EAGAIN);
            7
        }
    }

    #[test]
    fn the_original_runs_exactly_once_on_every_path() {
        let calls = Cell::new(0);
        let real = original(&calls);
        // The op calls it and changes errno after: the original's errno wins.
        let rc = detour(&real, |real| {
            let rc = real();
            sys::set_errno(libc::EBADF);
            rc + 1
        });
        assert_eq!((rc, calls.get(), sys::errno()), (8, 1, libc::EAGAIN));
        // The op panics before calling it: called afterwards.
        let rc = detour(&real, |_| panic!("before"));
        assert_eq!((rc, calls.get(), sys::errno()), (7, 2, libc::EAGAIN));
        // The op panics after calling it: its result.
        let rc = detour(&real, |real| {
            real();
            panic!("after")
        });
        assert_eq!((rc, calls.get()), (7, 3));
        // The op answers without it: its own answer and errno.
        let rc = detour(&real, |_| {
            sys::set_errno(libc::EISCONN);
            -1
        });
        assert_eq!((rc, calls.get(), sys::errno()), (-1, 3, libc::EISCONN));
        // Nested: straight to the original, the op never runs.
        let _held = Guard::enter().expect("not held");
        let rc = detour(&real, |_| unreachable!("nested"));
        assert_eq!((rc, calls.get()), (7, 4));
    }

    #[test]
    fn a_read_detour_calls_the_original_at_most_once_outside_the_guard() {
        let calls = Cell::new(0);
        let mut real = |b: &mut [u8]| -> isize {
            assert!(Guard::enter().is_some(), "the guard is let go meanwhile");
            calls.set(calls.get() + 1);
            b[0] = b'w';
            sys::set_errno(libc::EAGAIN);
            1
        };
        let mut buf = [0u8; 4];
        // The op reads from the original and adds its own bytes: the sum, the original's errno.
        let rc = read_detour(&mut real, |real| {
            let n = real(&mut buf);
            assert!(Guard::enter().is_none(), "held again after");
            sys::set_errno(libc::EBADF);
            Some(n + 2)
        });
        assert_eq!((rc, calls.get(), sys::errno()), (Some(3), 1, libc::EAGAIN));
        assert!(Guard::enter().is_some(), "let go on return");
        // Declined: the caller calls the original, errno as it was.
        sys::set_errno(libc::EINTR);
        assert_eq!(read_detour(&mut real, |_| None), None);
        assert_eq!((calls.get(), sys::errno()), (1, libc::EINTR));
        // A panic after the original: its result, no second read.
        let rc = read_detour(&mut real, |real| {
            real(&mut buf);
            panic!("after")
        });
        assert_eq!((rc, calls.get()), (Some(1), 2));
        // A panic before: the caller calls the original.
        assert_eq!(read_detour(&mut real, |_| panic!("before")), None);
        // Nested: None, the op never runs.
        let held = Guard::enter().expect("not held");
        assert_eq!(read_detour(&mut real, |_| unreachable!("nested")), None);
        drop(held);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn guarded_keeps_errno_and_turns_panics_and_nesting_into_none() {
        sys::set_errno(libc::EINTR);
        let out = guarded(|| {
            sys::set_errno(libc::ENOENT);
            5
        });
        assert_eq!((out, sys::errno()), (Some(5), libc::EINTR));
        assert_eq!(guarded(|| -> u8 { panic!("boom") }), None);
        assert_eq!(sys::errno(), libc::EINTR);
        let held = Guard::enter().expect("not held");
        assert_eq!(guarded(|| 1), None, "nested");
        drop(held);
        assert_eq!(guarded(|| 1), Some(1));
    }
}
