//! Mutexes a fork child can always take.
//!
//! `fork()` copies a mutex in whatever state it is in. If another thread of the parent held it
//! at that moment, the child, where that thread does not exist, would wait for it forever: a
//! fork-per-connection server whose child closes the inherited listener (the shim then drops
//! the listener's side-channel entry) would hang whenever the parent's side-channel thread was
//! inside the listener table at the fork.
//!
//! A [`ForkSafe`] keeps [`SLOTS`] copies of a table and uses one at a time. The fork-child
//! handler calls [`ForkSafe::after_fork`] while the child is still single-threaded: when the
//! current slot is held (by a parent thread), the child moves to the next slot, which no
//! process of its line has used yet, so it is unlocked and empty. What the held slot contained
//! is left alone (never dropped: its entries, engine handles among them, belong to the parent). Only
//! a chain of `SLOTS - 1` forks that each hit a held lock exhausts the slots; the last slot is
//! then used as it is.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Copies of each table.
pub const SLOTS: usize = 8;

/// A table behind a mutex that survives `fork()` in another thread (see the module docs).
pub struct ForkSafe<T> {
    slots: [Mutex<T>; SLOTS],
    current: AtomicUsize,
}

impl<T> ForkSafe<T> {
    /// `slots` must all hold the empty table.
    pub const fn new(slots: [Mutex<T>; SLOTS]) -> ForkSafe<T> {
        ForkSafe {
            slots,
            current: AtomicUsize::new(0),
        }
    }

    /// The slot in use (for state kept beside the table per slot, such as a `Condvar`).
    pub fn slot(&self) -> usize {
        self.current.load(Ordering::Acquire).min(SLOTS - 1)
    }

    fn mutex(&self) -> &Mutex<T> {
        &self.slots[self.slot()]
    }

    /// Locks the table (a poisoned lock is recovered: its plain data stays usable).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.mutex().lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the table if no other thread holds it.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.mutex().try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// In a fork child, before it starts any thread: the table, now free for this process.
    /// When the parent's copy was held, that is a fresh empty slot; when it was free, the
    /// inherited table (the caller decides what of it to keep). `None` only when the slots
    /// are exhausted and the last one is held.
    pub fn after_fork(&self) -> Option<MutexGuard<'_, T>> {
        loop {
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
            let i = self.current.load(Ordering::Acquire);
            if i + 1 >= SLOTS {
                return None;
            }
            self.current.store(i + 1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    static TABLE: ForkSafe<BTreeMap<u32, u32>> =
        ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

    #[test]
    fn a_held_slot_is_left_for_a_fresh_one() {
        TABLE.lock().insert(1, 1);
        // What a fork child sees when a parent thread holds the table: a guard it cannot
        // release (here: held by this thread, which a fork child would not have).
        let held = TABLE.lock();
        {
            let fresh = TABLE.after_fork().expect("a fresh slot");
            assert!(fresh.is_empty(), "the fresh slot starts empty");
        }
        assert_eq!(TABLE.slot(), 1);
        TABLE.lock().insert(2, 2);
        assert_eq!(TABLE.lock().get(&2), Some(&2));
        // A free slot is kept, with what it holds.
        let kept = TABLE.after_fork().expect("free");
        assert_eq!(kept.get(&2), Some(&2));
        drop(kept);
        assert_eq!(TABLE.slot(), 1);
        drop(held);
    }
}
