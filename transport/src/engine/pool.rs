//! Registered buffers kept for the next connection: registering a connection's region (pinning
//! and mapping every page of both rings) is most of what a connect costs beyond the connection
//! manager's round trips, and a program that opens short connections one after another pays
//! it each time. A connection that ends gives its region here, with its protection domain and
//! registrations (its QP is already destroyed, so no work request can touch them), once its
//! receive ring was zeroed and registered anew (`link::Leftover::renewed`): the next connection
//! on the same device takes it as it is (every region of an engine has its configuration's
//! size), and no key or byte of the last peer's reaches the next one.
//!
//! At most `max` entries, each kept at most `idle`: a process that stops connecting gives its
//! pinned memory back after that. An entry keeps its share of the pinned-memory budget (the
//! caller releases it for what comes back out of [`Pool::put`] and [`Pool::expire`]).

use std::time::{Duration, Instant};

/// Kept buffers of type `T` (the engine's registered regions).
pub(super) struct Pool<T> {
    entries: Vec<Entry<T>>,
    max: usize,
    idle: Duration,
}

struct Entry<T> {
    device: usize,
    item: T,
    pinned: u64,
    since: Instant,
}

impl<T> Pool<T> {
    /// At most `max` entries (0: nothing is kept), each for at most `idle`.
    pub(super) fn new(max: usize, idle: Duration) -> Pool<T> {
        Pool {
            entries: Vec::new(),
            max,
            idle,
        }
    }

    /// The most recently kept entry for `device`, with its budget share.
    pub(super) fn take(&mut self, device: usize) -> Option<(T, u64)> {
        let i = self.entries.iter().rposition(|e| e.device == device)?;
        let e = self.entries.remove(i);
        Some((e.item, e.pinned))
    }

    /// True when [`Pool::put`] would keep an entry.
    pub(super) fn has_room(&self) -> bool {
        self.entries.len() < self.max && !self.idle.is_zero()
    }

    /// Keeps `item`; gives it back when there is no room (the caller drops it).
    pub(super) fn put(
        &mut self,
        device: usize,
        item: T,
        pinned: u64,
        now: Instant,
    ) -> Option<(T, u64)> {
        if !self.has_room() {
            return Some((item, pinned));
        }
        self.entries.push(Entry {
            device,
            item,
            pinned,
            since: now,
        });
        None
    }

    /// Takes out every entry kept for `idle` or longer (allocates nothing when none is).
    pub(super) fn expire(&mut self, now: Instant) -> Vec<(T, u64)> {
        let idle = self.idle;
        self.entries
            .extract_if(.., |e| now.saturating_duration_since(e.since) >= idle)
            .map(|e| (e.item, e.pinned))
            .collect()
    }

    /// When the oldest entry expires.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.since + self.idle).min()
    }

    /// Entries kept now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(2);

    #[test]
    fn a_kept_entry_serves_the_same_device_only() {
        let now = Instant::now();
        let mut p = Pool::new(4, IDLE);
        assert!(p.put(0, "a", 10, now).is_none());
        assert!(p.take(1).is_none(), "another device");
        assert_eq!(p.take(0), Some(("a", 10)));
        assert!(p.take(0).is_none(), "taken once");
    }

    #[test]
    fn the_most_recent_entry_goes_first() {
        let now = Instant::now();
        let mut p = Pool::new(4, IDLE);
        p.put(0, "old", 1, now);
        p.put(0, "new", 2, now + Duration::from_millis(5));
        assert_eq!(p.take(0), Some(("new", 2)));
        assert_eq!(p.take(0), Some(("old", 1)));
    }

    #[test]
    fn a_full_or_disabled_pool_gives_the_entry_back() {
        let now = Instant::now();
        let mut p = Pool::new(2, IDLE);
        assert!(p.put(0, 'a', 1, now).is_none());
        assert!(p.put(0, 'b', 1, now).is_none());
        assert!(!p.has_room());
        assert_eq!(p.put(0, 'c', 7, now), Some(('c', 7)));
        assert_eq!(p.len(), 2);
        let mut none = Pool::new(0, IDLE);
        assert!(!none.has_room());
        assert_eq!(none.put(0, 'x', 3, now), Some(('x', 3)));
        let mut no_time = Pool::new(8, Duration::ZERO);
        assert!(!no_time.has_room());
        assert_eq!(no_time.put(0, 'y', 4, now), Some(('y', 4)));
    }

    #[test]
    fn entries_expire_after_idle_and_say_when() {
        let t0 = Instant::now();
        let mut p = Pool::new(4, IDLE);
        assert_eq!(p.next_expiry(), None);
        p.put(0, "first", 5, t0);
        p.put(0, "second", 6, t0 + Duration::from_secs(1));
        assert_eq!(p.next_expiry(), Some(t0 + IDLE));
        assert!(p.expire(t0 + Duration::from_millis(1999)).is_empty());
        assert_eq!(p.expire(t0 + IDLE), vec![("first", 5)]);
        assert_eq!(p.next_expiry(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(p.expire(t0 + Duration::from_secs(60)), vec![("second", 6)]);
        assert_eq!(p.len(), 0);
        assert_eq!(p.next_expiry(), None);
    }
}
