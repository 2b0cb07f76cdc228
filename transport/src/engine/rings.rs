//! When a stream's rings change size (net/smc sizes each connection's buffers to its socket;
//! here they follow the stream's traffic). A stream starts on small rings
//! ([`super::EngineConfig::start_ring`], 64 KiB each way by default), so an idle connection pins
//! little; a receiver whose peer keeps it busy moves to its busy ring
//! ([`super::EngineConfig::busy_ring`]), and back once the stream has been idle. The move
//! itself is [`crate::flow`]'s (an offer, and the sender's switch at a position both ends
//! know); this module only says when.
//!
//! - **Busy**: at least [`GROW_AFTER`] start rings arrived within [`GROW_WINDOW`]: a bulk
//!   transfer moves within its first few hundred KiB, a request/response stream of small
//!   messages never does.
//! - **Idle**: no stream byte arrived for [`IDLE_AFTER`] and every byte was consumed. The engine
//!   looks whenever the connection has an event, and at the latest at its keepalive (5 s of
//!   silence), so an idle stream gives its busy rings back within that.
//! - The sender follows: its send ring is busy while the peer's receive ring is, when its own
//!   budget has room; it moves back with the peer.

use std::time::{Duration, Instant};

/// Start rings that must arrive within [`GROW_WINDOW`] for a stream to count as busy.
pub(super) const GROW_AFTER: u64 = 4;
/// See [`GROW_AFTER`].
pub(super) const GROW_WINDOW: Duration = Duration::from_secs(1);
/// No stream byte for this long (and nothing unconsumed): the stream is idle.
pub(super) const IDLE_AFTER: Duration = Duration::from_secs(2);

/// What the receive side saw of the stream's traffic.
#[derive(Debug, Clone, Copy)]
pub(super) struct Activity {
    /// When the current window began, and the bytes that had arrived then.
    window: (Instant, u64),
    /// When a stream byte last arrived.
    last_data: Instant,
}

impl Activity {
    pub(super) fn new(now: Instant) -> Activity {
        Activity {
            window: (now, 0),
            last_data: now,
        }
    }

    /// Stream bytes arrived at `now`.
    pub(super) fn data(&mut self, now: Instant) {
        self.last_data = now;
    }

    /// Whether a stream on a start ring of `start` bytes, with `arrived` bytes in so far, is
    /// busy now (see the module docs). A window older than [`GROW_WINDOW`] starts over.
    pub(super) fn busy(&mut self, now: Instant, arrived: u64, start: u64) -> bool {
        let (since, mark) = self.window;
        if now.saturating_duration_since(since) > GROW_WINDOW {
            self.window = (now, arrived);
            return false;
        }
        arrived - mark >= GROW_AFTER * start
    }

    /// Whether the stream has been idle at `now` (see the module docs), given that every
    /// byte that arrived was consumed (`drained`).
    pub(super) fn idle(&self, now: Instant, drained: bool) -> bool {
        drained && now.saturating_duration_since(self.last_data) >= IDLE_AFTER
    }
}

/// Which send ring our writes go from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendRing {
    /// The start ring.
    Start,
    /// The busy ring.
    Busy,
    /// The start ring again, from this position on; the busy one is freed once every write
    /// before it completed.
    Leaving(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_busy_after_four_start_rings_within_a_second() {
        let t0 = Instant::now();
        let mut a = Activity::new(t0);
        let start = 64 << 10;
        assert!(!a.busy(t0, 3 * start, start));
        assert!(a.busy(t0 + Duration::from_millis(900), 4 * start, start));
        // A slow trickle: each window starts over from what had arrived.
        let mut slow = Activity::new(t0);
        let mut arrived = 0;
        for s in 1..30 {
            arrived += start;
            let now = t0 + Duration::from_millis(600 * s);
            assert!(!slow.busy(now, arrived, start), "a ring every 0.6 s");
        }
    }

    #[test]
    fn a_stream_is_idle_only_when_drained_and_quiet() {
        let t0 = Instant::now();
        let mut a = Activity::new(t0);
        a.data(t0 + Duration::from_secs(1));
        assert!(!a.idle(t0 + Duration::from_secs(2), true));
        assert!(a.idle(t0 + Duration::from_secs(3), true));
        assert!(!a.idle(t0 + Duration::from_secs(30), false), "bytes unread");
    }
}
