//! The pinned-memory budget: a connection registers its buffers only when they fit under the
//! process's `RLIMIT_MEMLOCK` (unless the process may lock any amount: `CAP_IPC_LOCK`, or an
//! unlimited limit). Over budget, a connection stays TCP with reason `MEMLOCK` instead of
//! failing inside `ibv_reg_mr` (or in the provider's queue allocations) half-way.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the process may pin and bytes pinned by the engine.
#[derive(Debug)]
pub struct Budget {
    /// None: no limit.
    limit: Option<u64>,
    used: AtomicU64,
    /// The most ever used at once.
    peak: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes (None: unlimited).
    pub fn new(limit: Option<u64>) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// Takes `bytes` if they fit.
    pub fn reserve(&self, bytes: u64) -> bool {
        let before = match self.limit {
            None => self.used.fetch_add(bytes, Ordering::AcqRel),
            Some(limit) => {
                match self
                    .used
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                        used.checked_add(bytes).filter(|total| *total <= limit)
                    }) {
                    Ok(before) => before,
                    Err(_) => return false,
                }
            }
        };
        self.peak
            .fetch_max(before.saturating_add(bytes), Ordering::AcqRel);
        true
    }

    /// The most bytes pinned at once so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Gives `bytes` back.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// Bytes pinned now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The limit (None: unlimited).
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_limit_and_releases() {
        let b = Budget::new(Some(100));
        assert!(b.reserve(60));
        assert!(!b.reserve(41));
        assert!(b.reserve(40));
        b.release(60);
        assert_eq!(b.used(), 40);
        b.release(1000);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100, "the most held at once");
        let unlimited = Budget::new(None);
        assert!(unlimited.reserve(u64::MAX / 2));
    }
}
