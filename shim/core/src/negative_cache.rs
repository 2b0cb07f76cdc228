//! Per-destination negative cache: a peer `S:P` that could not upgrade (no shim, refused, timed
//! out) is not asked again for a TTL (60 s, docs/shim-protocol.md "Timeouts and bounds"), so a
//! plain peer costs at most one bounded negotiation per TTL.
//!
//! The clock is a parameter (`now: Instant`), so tests need no sleeping. The map is bounded
//! (default 1024 entries): inserting into a full cache first drops expired entries, then the
//! oldest one.
//!
//! Thread safety: a `Mutex` around a `BTreeMap` (`const`-constructible, so a cache can be a
//! `static`). [`NegativeCache::check`] never allocates; [`NegativeCache::insert`] may (a tree node)
//! and runs only on a fallback. A poisoned lock is recovered, never a panic. The lock is taken with
//! a bounded `try_lock` spin, never a blocking wait: if it cannot be had (for example in a `fork`
//! child whose parent had another thread inside the lock at fork time, where a blocking lock would
//! hang forever) `check` answers "not cached" and `insert` is dropped — the cost is one more
//! bounded negotiation, never a hang.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::reason::Reason;

/// How long a failed peer stays cached.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// Most peers kept.
pub const DEFAULT_CAPACITY: usize = 1024;

/// `try_lock` attempts that spin before the rest yield.
const LOCK_SPINS: u32 = 64;
/// How long `try_lock` is retried before giving up. A time, not a count of yields: on a busy
/// machine each yield can cost a whole time slice of another thread, and 2000 of them took
/// seconds (the lock itself is only ever held for a map operation).
const LOCK_PATIENCE: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, Copy)]
struct Entry {
    reason: Reason,
    at: Instant,
}

/// Recently failed destinations.
#[derive(Debug)]
pub struct NegativeCache {
    ttl: Duration,
    capacity: usize,
    map: Mutex<BTreeMap<SocketAddr, Entry>>,
}

impl Default for NegativeCache {
    fn default() -> Self {
        NegativeCache::new(DEFAULT_TTL, DEFAULT_CAPACITY)
    }
}

impl NegativeCache {
    /// An empty cache. A `capacity` of 0 is treated as 1.
    pub const fn new(ttl: Duration, capacity: usize) -> NegativeCache {
        NegativeCache {
            ttl,
            capacity: if capacity == 0 { 1 } else { capacity },
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The size bound.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> Option<MutexGuard<'_, BTreeMap<SocketAddr, Entry>>> {
        let mut since: Option<Instant> = None;
        for attempt in 0u32.. {
            match self.map.try_lock() {
                Ok(g) => return Some(g),
                Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(TryLockError::WouldBlock) if attempt < LOCK_SPINS => std::hint::spin_loop(),
                Err(TryLockError::WouldBlock) => {
                    let start = *since.get_or_insert_with(Instant::now);
                    if start.elapsed() >= LOCK_PATIENCE {
                        return None;
                    }
                    std::thread::yield_now();
                }
            }
        }
        None
    }

    fn live(&self, e: &Entry, now: Instant) -> bool {
        // A `now` before the insertion (clock passed in out of order) counts as age 0.
        now.saturating_duration_since(e.at) < self.ttl
    }

    /// Remembers that `peer` failed for `reason` at `now` (replacing an older entry for it).
    /// Returns `false` only when the lock could not be taken (the entry is dropped).
    pub fn insert(&self, peer: SocketAddr, reason: Reason, now: Instant) -> bool {
        let Some(mut map) = self.lock() else {
            return false;
        };
        if !map.contains_key(&peer) && map.len() >= self.capacity {
            map.retain(|_, e| self.live(e, now));
            while map.len() >= self.capacity {
                let oldest = map.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| *k);
                match oldest {
                    Some(k) => {
                        map.remove(&k);
                    }
                    None => break,
                }
            }
        }
        map.insert(peer, Entry { reason, at: now });
        true
    }

    /// The reason `peer` is cached for, if its entry is younger than the TTL at `now`. An expired
    /// entry is removed. Never allocates.
    pub fn check(&self, peer: SocketAddr, now: Instant) -> Option<Reason> {
        let mut map = self.lock()?;
        let e = *map.get(&peer)?;
        if self.live(&e, now) {
            Some(e.reason)
        } else {
            map.remove(&peer);
            None
        }
    }

    /// Forgets `peer` (for example after it upgraded). Returns whether it was cached.
    pub fn remove(&self, peer: SocketAddr) -> bool {
        self.lock().is_some_and(|mut m| m.remove(&peer).is_some())
    }

    /// Drops every entry expired at `now`; returns how many were dropped.
    pub fn purge_expired(&self, now: Instant) -> usize {
        let Some(mut map) = self.lock() else {
            return 0;
        };
        let before = map.len();
        map.retain(|_, e| self.live(e, now));
        before.saturating_sub(map.len())
    }

    /// Entries currently stored (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.lock().map_or(0, |m| m.len())
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry.
    pub fn clear(&self) {
        if let Some(mut m) = self.lock() {
            m.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn insert_check_expire() {
        let c = NegativeCache::default();
        assert_eq!(c.ttl(), Duration::from_secs(60));
        assert_eq!(c.capacity(), 1024);
        let t0 = Instant::now();
        let p = sa("10.0.0.1:5201");
        assert_eq!(c.check(p, t0), None);
        assert!(c.insert(p, Reason::Timeout, t0));
        assert_eq!(c.check(p, t0), Some(Reason::Timeout));
        assert_eq!(
            c.check(p, t0 + Duration::from_secs(59)),
            Some(Reason::Timeout)
        );
        // Other port, other address: not cached.
        assert_eq!(c.check(sa("10.0.0.1:5202"), t0), None);
        assert_eq!(c.check(sa("10.0.0.2:5201"), t0), None);
        // Expired exactly at the TTL, and removed.
        assert_eq!(c.check(p, t0 + Duration::from_secs(60)), None);
        assert_eq!(c.len(), 0);
        assert!(c.is_empty());
    }

    #[test]
    fn reinsert_refreshes_and_replaces_reason() {
        let c = NegativeCache::new(Duration::from_secs(10), 4);
        let t0 = Instant::now();
        let p = sa("[fd00::1]:80");
        c.insert(p, Reason::PeerNotShimmed, t0);
        c.insert(p, Reason::PeerRefused, t0 + Duration::from_secs(8));
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.check(p, t0 + Duration::from_secs(15)),
            Some(Reason::PeerRefused)
        );
        assert_eq!(c.check(p, t0 + Duration::from_secs(18)), None);
    }

    #[test]
    fn out_of_order_clock_is_fresh() {
        let c = NegativeCache::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(5);
        let p = sa("1.2.3.4:5");
        c.insert(p, Reason::Timeout, later);
        assert_eq!(c.check(p, t0), Some(Reason::Timeout));
    }

    #[test]
    fn bounded_evicts_oldest() {
        let c = NegativeCache::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        c.insert(sa("1.1.1.1:1"), Reason::Timeout, at(3));
        c.insert(sa("1.1.1.1:2"), Reason::Timeout, at(1)); // oldest
        c.insert(sa("1.1.1.1:3"), Reason::Timeout, at(2));
        assert_eq!(c.len(), 3);
        c.insert(sa("1.1.1.1:4"), Reason::PeerRefused, at(4));
        assert_eq!(c.len(), 3);
        assert_eq!(c.check(sa("1.1.1.1:2"), at(4)), None);
        assert_eq!(c.check(sa("1.1.1.1:1"), at(4)), Some(Reason::Timeout));
        assert_eq!(c.check(sa("1.1.1.1:3"), at(4)), Some(Reason::Timeout));
        assert_eq!(c.check(sa("1.1.1.1:4"), at(4)), Some(Reason::PeerRefused));
        // Re-inserting a present key never evicts.
        c.insert(sa("1.1.1.1:3"), Reason::NoDevice, at(5));
        assert_eq!(c.len(), 3);
        assert_eq!(c.check(sa("1.1.1.1:1"), at(5)), Some(Reason::Timeout));
    }

    #[test]
    fn full_cache_prefers_dropping_expired() {
        let c = NegativeCache::new(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        c.insert(sa("2.2.2.2:1"), Reason::Timeout, at(0));
        c.insert(sa("2.2.2.2:2"), Reason::Timeout, at(1));
        c.insert(sa("2.2.2.2:3"), Reason::Timeout, at(9));
        // At 12 s the first two expired: both go, the live one stays.
        c.insert(sa("2.2.2.2:4"), Reason::Timeout, at(12));
        assert_eq!(c.len(), 2);
        assert_eq!(c.check(sa("2.2.2.2:3"), at(12)), Some(Reason::Timeout));
    }

    #[test]
    fn many_inserts_stay_bounded() {
        let c = NegativeCache::new(Duration::from_secs(60), 1024);
        let t0 = Instant::now();
        for i in 0..5000u32 {
            let p = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 80));
            c.insert(p, Reason::Timeout, t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(c.len(), 1024);
        // The newest 1024 survived.
        let newest = SocketAddr::from(([10, 0, (4999u32 >> 8) as u8, 4999u32 as u8], 80));
        assert_eq!(
            c.check(newest, t0 + Duration::from_secs(5)),
            Some(Reason::Timeout)
        );
        let oldest = SocketAddr::from(([10, 0, 0, 0], 80));
        assert_eq!(c.check(oldest, t0 + Duration::from_secs(5)), None);
    }

    #[test]
    fn zero_capacity_is_one() {
        let c = NegativeCache::new(Duration::from_secs(1), 0);
        assert_eq!(c.capacity(), 1);
        let t0 = Instant::now();
        c.insert(sa("3.3.3.3:1"), Reason::Timeout, t0);
        c.insert(sa("3.3.3.3:2"), Reason::Timeout, t0);
        assert_eq!(c.len(), 1);
        assert_eq!(c.check(sa("3.3.3.3:2"), t0), Some(Reason::Timeout));
    }

    #[test]
    fn remove_purge_clear() {
        let c = NegativeCache::new(Duration::from_secs(10), 8);
        let t0 = Instant::now();
        c.insert(sa("4.4.4.4:1"), Reason::Timeout, t0);
        c.insert(
            sa("4.4.4.4:2"),
            Reason::Timeout,
            t0 + Duration::from_secs(5),
        );
        assert!(c.remove(sa("4.4.4.4:1")));
        assert!(!c.remove(sa("4.4.4.4:1")));
        c.insert(sa("4.4.4.4:3"), Reason::Timeout, t0);
        assert_eq!(c.purge_expired(t0 + Duration::from_secs(11)), 1);
        assert_eq!(c.len(), 1);
        c.clear();
        assert!(c.is_empty());
    }

    #[test]
    fn static_cache_works() {
        static CACHE: NegativeCache = NegativeCache::new(DEFAULT_TTL, DEFAULT_CAPACITY);
        let t0 = Instant::now();
        CACHE.insert(sa("5.5.5.5:5"), Reason::NegativeCache, t0);
        assert_eq!(
            CACHE.check(sa("5.5.5.5:5"), t0),
            Some(Reason::NegativeCache)
        );
    }

    #[test]
    fn poisoned_lock_is_recovered() {
        let c = Arc::new(NegativeCache::default());
        let t0 = Instant::now();
        c.insert(sa("6.6.6.6:6"), Reason::Timeout, t0);
        let c2 = Arc::clone(&c);
        let r = std::thread::spawn(move || {
            let _g = c2.map.lock();
            panic!("poison the lock");
        })
        .join();
        assert!(r.is_err());
        assert!(c.map.is_poisoned());
        assert_eq!(c.check(sa("6.6.6.6:6"), t0), Some(Reason::Timeout));
        assert!(c.insert(sa("6.6.6.6:7"), Reason::Timeout, t0));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn held_lock_gives_up_instead_of_hanging() {
        let c = NegativeCache::default();
        let t0 = Instant::now();
        c.insert(sa("7.7.7.7:7"), Reason::Timeout, t0);
        let g = c.map.lock().unwrap();
        let start = Instant::now();
        assert_eq!(c.check(sa("7.7.7.7:7"), t0), None);
        assert!(!c.insert(sa("7.7.7.7:8"), Reason::Timeout, t0));
        assert!(!c.remove(sa("7.7.7.7:7")));
        assert_eq!(c.len(), 0);
        assert_eq!(c.purge_expired(t0), 0);
        c.clear();
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(g);
        assert_eq!(c.check(sa("7.7.7.7:7"), t0), Some(Reason::Timeout));
    }

    #[test]
    fn concurrent_use() {
        let c = NegativeCache::new(Duration::from_secs(60), 64);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..2000u16 {
                        let p = SocketAddr::from(([9, 9, t, (i % 100) as u8], i));
                        c.insert(p, Reason::Timeout, t0);
                        // A concurrent thread may have evicted it already; it must not panic.
                        let _ = c.check(p, t0);
                    }
                });
            }
        });
        assert!(c.len() <= 64);
    }
}
