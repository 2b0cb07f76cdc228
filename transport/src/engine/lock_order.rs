//! The engine's lock order, written once and checked in debug builds.
//!
//! The engine thread and the app's threads (direct reads and writes, handles waiting on a
//! connection) share five kinds of locks. A thread that holds one may take only a lock of a
//! later [`Level`]:
//!
//! 1. [`Level::Send`]: a connection's send half ([`super::tx`]). Posting a control message
//!    takes the receive lock under it, for the credit report the message carries.
//! 2. [`Level::Receive`]: its receive half ([`super::rx`]).
//! 3. [`Level::Shared`]: its phase as its handles see it ([`super::shared`]): nothing is taken
//!    under it.
//! 4. [`Level::Commands`]: the engine's command queue: nothing is taken under it.
//! 5. [`Level::Early`]: the app's own writes to the kept TCP socket before the move
//!    ([`super::early`]): nothing is taken under it.
//!
//! Two locks of one level are never held at once (no thread holds two connections' send
//! halves), so no cycle can form. [`OrderedMutex::lock`] checks this in debug builds (a
//! thread-local set of the levels held) and panics at the first lock taken out of order,
//! wherever the tests run it; release builds check nothing.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A lock's place in the order (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Send = 1,
    Receive = 2,
    Shared = 3,
    Commands = 4,
    Early = 5,
}

/// A mutex with its [`Level`]; poisoning is ignored (every holder keeps the state consistent
/// before anything that could panic).
#[derive(Debug)]
pub(super) struct OrderedMutex<T> {
    level: Level,
    mutex: Mutex<T>,
}

/// The lock, held; the level is given back after the lock is released (field order).
pub(super) struct Guard<'a, T> {
    guard: MutexGuard<'a, T>,
    _level: Held,
}

/// A level this thread holds, given back when dropped.
struct Held(Level);

impl Drop for Held {
    fn drop(&mut self) {
        held::give_back(self.0);
    }
}

impl<T> OrderedMutex<T> {
    pub(super) const fn new(level: Level, value: T) -> OrderedMutex<T> {
        OrderedMutex {
            level,
            mutex: Mutex::new(value),
        }
    }

    /// Takes the lock; in debug builds, panics when this thread holds a lock of this level or
    /// a later one.
    pub(super) fn lock(&self) -> Guard<'_, T> {
        held::take(self.level);
        let level = Held(self.level);
        Guard {
            guard: self.mutex.lock().unwrap_or_else(PoisonError::into_inner),
            _level: level,
        }
    }
}

impl<'a, T> Guard<'a, T> {
    /// Waits on `changed` for at most `timeout`, the lock released meanwhile (the level stays
    /// held: the waiting thread takes no other lock).
    pub(super) fn wait_timeout(self, changed: &Condvar, timeout: Duration) -> Guard<'a, T> {
        let Guard { guard, _level } = self;
        let (guard, _) = changed
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        Guard { guard, _level }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// The levels this thread holds (debug builds only).
#[cfg(debug_assertions)]
mod held {
    use std::cell::Cell;

    use super::Level;

    thread_local! {
        static HELD: Cell<u8> = const { Cell::new(0) };
    }

    pub(super) fn take(level: Level) {
        HELD.with(|held| {
            let bits = held.get();
            let at_or_after = !((1u8 << level as u8) - 1);
            assert!(
                bits & at_or_after == 0,
                "lock order: {level:?} taken while holding {:?}",
                levels(bits)
            );
            held.set(bits | 1 << level as u8);
        });
    }

    pub(super) fn give_back(level: Level) {
        HELD.with(|held| held.set(held.get() & !(1 << level as u8)));
    }

    fn levels(bits: u8) -> Vec<Level> {
        [
            Level::Send,
            Level::Receive,
            Level::Shared,
            Level::Commands,
            Level::Early,
        ]
        .into_iter()
        .filter(|l| bits & (1 << *l as u8) != 0)
        .collect()
    }
}

#[cfg(not(debug_assertions))]
mod held {
    use super::Level;

    pub(super) fn take(_: Level) {}

    pub(super) fn give_back(_: Level) {}
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn locks_in_order_pass_and_release_their_level() {
        let send = OrderedMutex::new(Level::Send, 1);
        let recv = OrderedMutex::new(Level::Receive, 2);
        let commands = OrderedMutex::new(Level::Commands, 3);
        {
            let s = send.lock();
            let r = recv.lock();
            let c = commands.lock();
            assert_eq!(*s + *r + *c, 6);
        }
        // Released: the receive lock alone, then the send lock again.
        drop(recv.lock());
        let mut s = send.lock();
        *s += 1;
        let changed = Condvar::new();
        let s = s.wait_timeout(&changed, Duration::from_millis(1));
        assert_eq!(*s, 2);
        drop(s);
        drop(send.lock());
    }

    #[test]
    fn a_lock_out_of_order_panics() {
        let send = OrderedMutex::new(Level::Send, ());
        let recv = OrderedMutex::new(Level::Receive, ());
        let result = std::thread::spawn(move || {
            let _r = recv.lock();
            let _s = send.lock();
        })
        .join();
        let message = result.expect_err("panics");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            text.contains("Send taken while holding [Receive]"),
            "{text}"
        );
    }

    #[test]
    fn two_locks_of_one_level_panic() {
        let a = OrderedMutex::new(Level::Send, ());
        let b = OrderedMutex::new(Level::Send, ());
        let result = std::thread::spawn(move || {
            let _a = a.lock();
            let _b = b.lock();
        })
        .join();
        assert!(result.is_err());
    }
}
