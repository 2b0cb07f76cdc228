//! The challenges a target gateway has issued and not yet seen answered: the only state an
//! unauthenticated peer can make a gateway keep.
//!
//! Bounded: at most `total` challenges (the slots are allocated once, when the table is made;
//! issuing never allocates), at most `per_source` of them for one source RDMA address. Expiring:
//! a challenge not answered within `ttl` is gone (its slot is reused). Single-use: answering a
//! challenge removes it, whether the proof verifies or not, so a replayed proof finds nothing
//! and a guesser gets one try per challenge. A full table or source refuses new challenges
//! ([`IssueError`]); the source then relays that connection over TCP.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use super::{
    payload::{Ticket, UidDigest, ticket_of},
    transcript::Nonce,
};

/// Default bound on pending challenges in all.
pub const TOTAL: usize = 1024;
/// Default bound on pending challenges of one source address (a node's migrations open ~10
/// connections each, a few migrations at a time).
pub const PER_SOURCE: usize = 64;
/// Default lifetime of a challenge (the source answers at once; its whole open is bounded by
/// its `--stream-timeout-ms`, 2 s by default).
pub const TTL: Duration = Duration::from_secs(5);

/// One issued challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub source: IpAddr,
    pub migration: UidDigest,
    pub port: u16,
    pub source_nonce: Nonce,
    pub target_nonce: Nonce,
    expires: Instant,
}

impl Pending {
    fn ticket(&self) -> Ticket {
        ticket_of(&self.target_nonce)
    }
}

/// Why no challenge was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    #[error("{0} challenges pending for this source")]
    SourceFull(usize),
    #[error("{0} challenges pending in all")]
    TableFull(usize),
    #[error("no random nonce")]
    Random,
}

/// See the module docs.
#[derive(Debug)]
pub struct Challenges {
    slots: Vec<Option<Pending>>,
    per_source: usize,
    ttl: Duration,
}

impl Challenges {
    pub fn new(total: usize, per_source: usize, ttl: Duration) -> Challenges {
        Challenges {
            slots: vec![None; total],
            per_source,
            ttl,
        }
    }

    /// Issues a challenge to `source` for `migration`/`port` answering `source_nonce`, with a
    /// target nonce from `fresh`; returns that nonce.
    pub fn issue(
        &mut self,
        now: Instant,
        source: IpAddr,
        migration: UidDigest,
        port: u16,
        source_nonce: Nonce,
        mut fresh: impl FnMut() -> Option<Nonce>,
    ) -> Result<Nonce, IssueError> {
        let mut free = None;
        let mut of_source = 0;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.is_some_and(|p| p.expires <= now) {
                *slot = None;
            }
            match slot {
                None => {
                    free.get_or_insert(i);
                }
                Some(p) if p.source == source => of_source += 1,
                Some(_) => {}
            }
        }
        if of_source >= self.per_source {
            return Err(IssueError::SourceFull(of_source));
        }
        let Some(free) = free else {
            return Err(IssueError::TableFull(self.slots.len()));
        };
        // The ticket must name one challenge of this source: draw again on a collision (2^-56
        // for two given challenges).
        let target_nonce = (0..4)
            .filter_map(|_| fresh())
            .find(|n| self.find(source, &ticket_of(n)).is_none())
            .ok_or(IssueError::Random)?;
        self.slots[free] = Some(Pending {
            source,
            migration,
            port,
            source_nonce,
            target_nonce,
            expires: now + self.ttl,
        });
        Ok(target_nonce)
    }

    fn find(&self, source: IpAddr, ticket: &Ticket) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.is_some_and(|p| p.source == source && p.ticket() == *ticket))
    }

    /// Removes and returns the challenge of `source` named `ticket`, unless it expired (an
    /// expired one is removed too).
    pub fn take(&mut self, now: Instant, source: IpAddr, ticket: &Ticket) -> Option<Pending> {
        let i = self.find(source, ticket)?;
        self.slots[i].take().filter(|p| p.expires > now)
    }

    /// Challenges pending (not expired) at `now`.
    #[cfg(test)]
    pub fn pending(&self, now: Instant) -> usize {
        self.slots
            .iter()
            .filter(|s| s.is_some_and(|p| p.expires > now))
            .count()
    }
}

impl Default for Challenges {
    fn default() -> Challenges {
        Challenges::new(TOTAL, PER_SOURCE, TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Nonces 1, 2, 3, ... (distinct tickets).
    fn counter() -> impl FnMut() -> Option<Nonce> {
        let mut n = 0u8;
        move || {
            n = n.wrapping_add(1);
            Some([n; 16])
        }
    }

    #[test]
    fn a_challenge_is_taken_once_by_its_source_and_ticket() {
        let mut t = Challenges::new(4, 4, TTL);
        let now = Instant::now();
        let (a, b) = (ip("198.18.0.1"), ip("198.18.0.9"));
        let mut fresh = counter();
        let n1 = t
            .issue(now, a, UidDigest::of("u1"), 1, [9; 16], &mut fresh)
            .unwrap();
        let n2 = t
            .issue(now, a, UidDigest::of("u1"), 1, [8; 16], &mut fresh)
            .unwrap();
        assert_ne!(ticket_of(&n1), ticket_of(&n2));
        // Another source does not get a's challenge.
        assert_eq!(t.take(now, b, &ticket_of(&n1)), None);
        let p = t.take(now, a, &ticket_of(&n1)).unwrap();
        assert_eq!((p.source_nonce, p.target_nonce, p.port), ([9; 16], n1, 1));
        // Single use: a replay finds nothing; the other challenge is still there.
        assert_eq!(t.take(now, a, &ticket_of(&n1)), None);
        assert_eq!(t.pending(now), 1);
        assert!(t.take(now, a, &ticket_of(&n2)).is_some());
    }

    #[test]
    fn bounds_per_source_and_in_all_then_expiry_frees_the_slots() {
        let mut t = Challenges::new(3, 2, Duration::from_secs(5));
        let now = Instant::now();
        let mut fresh = counter();
        let d = UidDigest::of("u1");
        let a = ip("198.18.0.1");
        t.issue(now, a, d, 1, [0; 16], &mut fresh).unwrap();
        t.issue(now, a, d, 1, [0; 16], &mut fresh).unwrap();
        assert_eq!(
            t.issue(now, a, d, 1, [0; 16], &mut fresh),
            Err(IssueError::SourceFull(2))
        );
        t.issue(now, ip("10.0.0.2"), d, 1, [0; 16], &mut fresh)
            .unwrap();
        assert_eq!(
            t.issue(now, ip("10.0.0.3"), d, 1, [0; 16], &mut fresh),
            Err(IssueError::TableFull(3))
        );
        assert_eq!(t.slots.capacity(), 3, "no growth");
        // After the lifetime every slot is free again, and an expired challenge is no proof's.
        let later = now + Duration::from_secs(5);
        assert_eq!(t.pending(later), 0);
        let n = t.issue(now, a, d, 1, [0; 16], &mut fresh);
        assert!(n.is_err(), "still full before the expiry");
        let n = t.issue(later, a, d, 1, [0; 16], &mut fresh).unwrap();
        assert_eq!(
            t.take(later + Duration::from_secs(5), a, &ticket_of(&n)),
            None
        );
        assert_eq!(t.pending(later), 0, "the expired one was removed");
    }

    #[test]
    fn no_randomness_no_challenge_and_colliding_tickets_are_drawn_again() {
        let mut t = Challenges::new(4, 4, TTL);
        let now = Instant::now();
        let a = ip("198.18.0.1");
        let d = UidDigest::of("u1");
        assert_eq!(
            t.issue(now, a, d, 1, [0; 16], || None),
            Err(IssueError::Random)
        );
        let first = t.issue(now, a, d, 1, [0; 16], || Some([1; 16])).unwrap();
        let mut draws = [[1u8; 16], [2; 16]].into_iter();
        let second = t.issue(now, a, d, 1, [0; 16], || draws.next()).unwrap();
        assert_eq!((first, second), ([1; 16], [2; 16]));
    }
}
