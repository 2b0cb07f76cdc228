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
