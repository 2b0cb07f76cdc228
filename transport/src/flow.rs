//! Flow control of one stream, as pure arithmetic (no verbs): which bytes may be written into
//! the peer's ring, which received bytes wait for the app, and when credits are owed.
//!
//! Each side owns a receive ring of `ring` bytes that the peer writes into with RDMA WRITE WITH
//! IMMEDIATE (one receive work request consumed per message), and a send ring of the same size
//! that its own writes are posted from. Positions are cumulative byte counts (`u64`, never
//! wrapping in practice); position `p` lives at offset `p % ring` of the peer's ring and
//! `p % local_ring` of the send ring.
//!
//! - **Bytes.** The sender may have at most `ring` bytes that the peer has not consumed
//!   (`sent - peer_consumed <= ring`): the peer's ring can never be overwritten. A send-ring
//!   range is reused only after its write completed locally (the device is done with it), and
//!   at most `max_unacked` bytes are posted and not completed (unacknowledged by the peer's
//!   device) at any time.
//! - **Messages.** Every message (data or control) uses one of the peer's posted receives, which
//!   the peer reposts as soon as it polls the completion. Data messages keep
//!   `msgs_sent - peer_reposted <= rq - reserve`; control messages may use the reserve (and the
//!   QPs retry receiver-not-ready forever, so an overrun only waits).
//! - **Credits.** The receiver reports its cumulative `consumed` bytes and `reposted` receives in
//!   every control message, and sends one (CREDIT) when a quarter of the ring was consumed or a
//!   quarter of the receives reposted since its last report. A sender blocked on bytes has
//!   `ring` unconsumed bytes at the peer, a sender blocked on messages has `rq - reserve`
//!   unreported receives there: either crosses a quarter once the peer catches up, so a credit
//!   always follows and the stream cannot deadlock.
//! - **Urgent data.** The sender marks a byte urgent (TCP's `MSG_OOB`) with a control message
//!   naming its position, sent just before the data write that starts with it; the receiver
//!   takes a mark only at the position the next write starts at, keeps only the latest (as
//!   TCP keeps one urgent pointer: an earlier byte not handed on yet stays in the stream), and
//!   hands bytes on up to the mark, then the urgent byte alone.

/// The sending half's accounting.
#[derive(Debug, Clone)]
pub struct SendFlow {
    /// The peer's ring.
    ring: u64,
    /// Our send ring.
    local_ring: u64,
    max_chunk: u64,
    /// The most bytes posted and not completed locally.
    max_unacked: u64,
    peer_rq: u64,
    reserve: u64,
    /// Bytes posted to the peer's ring.
    sent: u64,
    /// Bytes whose write completed locally (the send ring may reuse them).
    completed: u64,
    /// Bytes the peer reported consumed (its ring may take them again).
    peer_consumed: u64,
    /// Messages that used one of the peer's receives.
    msgs_sent: u64,
    /// Receives the peer reported reposted.
    peer_reposted: u64,
}

/// A credit report that cannot be true (the peer is broken or hostile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid credit report: consumed {consumed} of {sent} sent, reposted {reposted} of {msgs} messages"
)]
pub struct BadCredit {
    consumed: u64,
    sent: u64,
    reposted: u64,
    msgs: u64,
}

/// Where the next write goes: from `local` in the send ring to `remote` in the peer's ring,
/// `len` bytes (0: blocked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Offset in the local send ring.
    pub local: usize,
    /// Offset in the peer's ring.
    pub remote: usize,
    /// Bytes allowed.
    pub len: usize,
}

impl SendFlow {
    /// `ring`: the peer's ring size, `local_ring`: ours, `peer_rq`: the peer's posted receives,
    /// `reserve`: receives kept for control messages, `max_chunk`: the largest single write,
    /// `max_unacked`: the most bytes posted and not completed (at most `local_ring`).
    pub fn new(
        ring: u64,
        local_ring: u64,
        peer_rq: u64,
        reserve: u64,
        (max_chunk, max_unacked): (u64, u64),
    ) -> SendFlow {
        let local_ring = local_ring.max(1);
        SendFlow {
            ring: ring.max(1),
            local_ring,
            max_chunk: max_chunk.max(1),
            max_unacked: max_unacked.clamp(1, local_ring),
            peer_rq,
            reserve: reserve.min(peer_rq.saturating_sub(1)),
            sent: 0,
            completed: 0,
            peer_consumed: 0,
            msgs_sent: 0,
            peer_reposted: 0,
        }
    }

    /// The next write's place and its largest length (contiguous in both rings).
    pub fn window(&self) -> Window {
        let remote = self.sent % self.ring;
        let local = self.sent % self.local_ring;
        let blocked = Window {
            local: local as usize,
            remote: remote as usize,
            len: 0,
        };
        if self.msgs_sent - self.peer_reposted >= self.peer_rq - self.reserve {
            return blocked;
        }
        let remote_free = self.ring - (self.sent - self.peer_consumed);
        let local_free = self.max_unacked - (self.sent - self.completed);
        let len = remote_free
            .min(local_free)
            .min(self.ring - remote)
            .min(self.local_ring - local)
            .min(self.max_chunk);
        Window {
            len: len as usize,
            ..blocked
        }
    }

    /// A data write of `len` bytes at [`SendFlow::window`]'s place was posted; returns the
    /// position after it (the write's completion id).
    pub fn posted_data(&mut self, len: usize) -> u64 {
        self.sent += len as u64;
        self.msgs_sent += 1;
        self.sent
    }

    /// A control message was posted.
    pub fn posted_control(&mut self) {
        self.msgs_sent += 1;
    }

    /// The data write ending at `end` completed (completions arrive in order).
    pub fn completed(&mut self, end: u64) {
        self.completed = self.completed.max(end.min(self.sent));
    }

    /// The peer's report; reports only move forward.
    pub fn credit(&mut self, consumed: u64, reposted: u64) -> Result<(), BadCredit> {
        if consumed > self.sent || reposted > self.msgs_sent {
            return Err(BadCredit {
                consumed,
                sent: self.sent,
                reposted,
                msgs: self.msgs_sent,
            });
        }
        self.peer_consumed = self.peer_consumed.max(consumed);
        self.peer_reposted = self.peer_reposted.max(reposted);
        Ok(())
    }

    /// Bytes posted so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Bytes whose write completed locally: the peer's device acknowledged them (RC completes
    /// a write once the peer's device has it).
    pub fn completed_total(&self) -> u64 {
        self.completed
    }

    /// The smaller of the two rings: the most this stream can have in flight.
    pub fn in_flight_limit(&self) -> u64 {
        self.ring.min(self.local_ring)
    }

    /// True when every posted write completed locally.
    pub fn all_completed(&self) -> bool {
        self.completed == self.sent
    }
}

/// The receiving half's accounting.
#[derive(Debug, Clone)]
pub struct RecvFlow {
    ring: u64,
    rq: u64,
    /// Bytes that arrived (in order).
    arrived: u64,
    /// Bytes handed on: written to the local fd, or claimed by a direct read.
    taken: u64,
    /// Bytes whose ring space is free again (reported to the peer): `taken`, except while a
    /// claimed range is being copied out of the ring.
    consumed: u64,
    /// A claimed range is being copied ([`RecvFlow::claim`]).
    claimed: bool,
    consumed_reported: u64,
    /// Receives reposted.
    reposted: u64,
    reposted_reported: u64,
    /// The position of the urgent byte not handed on yet.
    urgent: Option<u64>,
}

/// An urgent mark the receiver refuses: it names a byte other than the next write's first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an urgent mark at {position}, where the next write starts at {expected}")]
pub struct BadUrgent {
    /// The position it named.
    pub position: u64,
    /// Where the next data write starts.
    pub expected: u64,
}

/// A data write the receiver refuses (a broken or hostile peer, or a device that re-sent a
/// write): nothing of it reaches the app, and the stream fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadWrite {
    /// No bytes: an empty write cannot move the stream (one with a large immediate would
    /// announce bytes that are not there).
    #[error("an empty data write (immediate {imm:#x})")]
    Empty {
        /// Its immediate.
        imm: u32,
    },
    /// More than the ring's free space.
    #[error("ring overrun: {len} more bytes with {held} of {ring} held")]
    Overrun {
        /// The write's length.
        len: u64,
        /// Bytes held in the ring.
        held: u64,
        /// The ring.
        ring: u64,
    },
    /// The immediate is not the stream position after this write: a write repeated, lost or
    /// out of place.
    #[error("a write of {len} bytes says the stream ends at {imm:#x}, not {expected:#x}")]
    Position {
        /// The write's length.
        len: u64,
        /// Its immediate.
        imm: u32,
        /// The low 32 bits of the position it should end at.
        expected: u32,
    },
}

impl RecvFlow {
    /// Our ring of `ring` bytes and `rq` posted receives.
    pub fn new(ring: u64, rq: u64) -> RecvFlow {
        RecvFlow {
            ring,
            rq,
            arrived: 0,
            taken: 0,
            consumed: 0,
            claimed: false,
            consumed_reported: 0,
            reposted: 0,
            reposted_reported: 0,
            urgent: None,
        }
    }

    /// The peer marked the byte at `position` urgent: taken only when it is the first byte of
    /// the next write (the mark comes just before it); it replaces a mark not handed on yet.
    pub fn urgent(&mut self, position: u64) -> Result<(), BadUrgent> {
        if position != self.arrived {
            return Err(BadUrgent {
                position,
                expected: self.arrived,
            });
        }
        self.urgent = Some(position);
        Ok(())
    }

    /// The next byte to hand on is the urgent one (it goes alone: [`RecvFlow::delivered`] of
    /// 1 hands it on and clears the mark).
    pub fn at_mark(&self) -> bool {
        self.urgent == Some(self.taken) && self.arrived > self.taken
    }

    /// A data write of `len` bytes (as the device counted them) arrived with immediate `imm`
    /// ([`crate::wire::data_imm`] of the position after it). Refused, without moving anything:
    /// an empty write, one past the ring's free space, or one whose immediate is not the next
    /// position.
    pub fn arrived(&mut self, len: u32, imm: u32) -> Result<(), BadWrite> {
        let len = u64::from(len);
        if len == 0 {
            return Err(BadWrite::Empty { imm });
        }
        let held = self.arrived - self.consumed;
        if held + len > self.ring {
            return Err(BadWrite::Overrun {
                len,
                held,
                ring: self.ring,
            });
        }
        let expected = crate::wire::data_imm(self.arrived + len);
        if imm != expected {
            return Err(BadWrite::Position { len, imm, expected });
        }
        self.arrived += len;
        Ok(())
    }

    /// A receive was reposted.
    pub fn reposted(&mut self) {
        self.reposted += 1;
    }

    /// The next contiguous bytes waiting for the app: `(offset, len)` in our ring. They stop
    /// before an urgent byte; at the mark ([`RecvFlow::at_mark`]), the urgent byte alone.
    pub fn pending(&self) -> (usize, usize) {
        let offset = self.taken % self.ring;
        let mut held = self.arrived - self.taken;
        if let Some(mark) = self.urgent.filter(|&m| m >= self.taken) {
            held = held.min((mark - self.taken).max(1));
        }
        let len = held.min(self.ring - offset);
        (offset as usize, len as usize)
    }

    /// True when bytes wait for the app.
    pub fn has_pending(&self) -> bool {
        self.arrived > self.taken
    }

    /// `n` bytes were delivered to the app (their ring space is free once no claim is open).
    pub fn delivered(&mut self, n: usize) {
        self.taken = (self.taken + n as u64).min(self.arrived);
        self.urgent = self.urgent.filter(|&m| m >= self.taken);
        if !self.claimed {
            self.consumed = self.taken;
        }
    }

    /// The next `n` bytes ([`RecvFlow::pending`]'s) are being copied out of the ring by a
    /// direct read: later bytes may be delivered, but no ring space from them on is freed until
    /// [`RecvFlow::copied`]. False (nothing claimed) while another claim is open.
    pub fn claim(&mut self, n: usize) -> bool {
        if self.claimed {
            return false;
        }
        self.taken = (self.taken + n as u64).min(self.arrived);
        self.urgent = self.urgent.filter(|&m| m >= self.taken);
        self.claimed = true;
        true
    }

    /// The open claim's copy is done: its space and everything delivered after it is free.
    pub fn copied(&mut self) {
        self.claimed = false;
        self.consumed = self.taken;
    }

    /// A claimed range is being copied.
    pub fn claim_open(&self) -> bool {
        self.claimed
    }

    /// True when a credit report is owed (see the module docs).
    pub fn credit_due(&self) -> bool {
        self.consumed - self.consumed_reported >= (self.ring / 4).max(1)
            || self.reposted - self.reposted_reported >= (self.rq / 4).max(1)
    }

    /// The counters to report now (they count as reported).
    pub fn report(&mut self) -> (u64, u64) {
        self.consumed_reported = self.consumed;
        self.reposted_reported = self.reposted;
        (self.consumed, self.reposted)
    }

    /// Bytes that arrived so far.
    pub fn arrived_total(&self) -> u64 {
        self.arrived
    }

    /// Bytes handed on so far (delivered or claimed).
    pub fn taken_total(&self) -> u64 {
        self.taken
    }

    /// The ring's size.
    pub fn ring(&self) -> u64 {
        self.ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn w(local: usize, remote: usize, len: usize) -> Window {
        Window { local, remote, len }
    }

    #[test]
    fn an_urgent_byte_is_handed_on_alone_at_its_place() {
        let mut r = RecvFlow::new(1024, 16);
        r.arrived(3, crate::wire::data_imm(3)).unwrap();
        assert_eq!(
            r.urgent(2),
            Err(BadUrgent {
                position: 2,
                expected: 3
            }),
            "a mark on a byte that already arrived"
        );
        assert!(r.urgent(4).is_err(), "a mark past the next write's start");
        r.urgent(3).unwrap();
        r.arrived(4, crate::wire::data_imm(7)).unwrap();
        assert_eq!(r.pending(), (0, 3), "up to the mark");
        assert!(!r.at_mark());
        r.delivered(3);
        assert!(r.at_mark());
        assert_eq!(r.pending(), (3, 1), "the urgent byte alone");
        r.delivered(1);
        assert!(!r.at_mark());
        assert_eq!(r.pending(), (4, 3), "then the rest");
        // A later mark replaces one not handed on: the earlier byte stays in the stream.
        r.urgent(7).unwrap();
        r.arrived(1, crate::wire::data_imm(8)).unwrap();
        r.urgent(8).unwrap();
        r.arrived(2, crate::wire::data_imm(10)).unwrap();
        assert_eq!(r.pending(), (4, 4));
        assert!(r.claim(4));
        r.copied();
        assert!(r.at_mark());
        r.delivered(1);
        assert_eq!(r.pending(), (9, 1));
        assert!(!r.at_mark());
    }

    #[test]
    fn the_window_stops_at_the_ring_ends_and_at_free_space() {
        let mut s = SendFlow::new(1024, 1024, 16, 4, (4096, u64::MAX));
        assert_eq!(s.window(), w(0, 0, 1024));
        let end = s.posted_data(1000);
        assert_eq!(s.window(), w(1000, 1000, 24), "to the ring's end");
        s.credit(600, 1).unwrap();
        assert_eq!(s.window(), w(1000, 1000, 24));
        s.posted_data(24);
        assert_eq!(
            s.window(),
            w(0, 0, 0),
            "consumed by the peer, not completed locally"
        );
        s.completed(end);
        assert_eq!(s.window(), w(0, 0, 600), "the peer's 600 bound it");
        s.completed(1024);
        s.credit(1024, 2).unwrap();
        assert_eq!(s.window(), w(0, 0, 1024));
    }

    #[test]
    fn rings_of_different_sizes_keep_both_offsets() {
        let mut s = SendFlow::new(4096, 1024, 16, 4, (1 << 20, u64::MAX));
        assert_eq!(s.window(), w(0, 0, 1024), "our smaller send ring");
        let end = s.posted_data(1000);
        assert_eq!(s.window(), w(1000, 1000, 24));
        s.completed(end);
        s.posted_data(24);
        s.completed(1024);
        assert_eq!(s.window(), w(0, 1024, 1024), "local wraps, remote does not");
    }

    #[test]
    fn data_messages_leave_the_reserve_for_control() {
        let mut s = SendFlow::new(1 << 20, 1 << 20, 8, 2, (1, u64::MAX));
        for _ in 0..6 {
            assert_eq!(s.window().len, 1);
            s.posted_data(1);
        }
        assert_eq!(s.window().len, 0, "6 = 8 - 2 outstanding");
        s.posted_control();
        s.credit(0, 3).unwrap();
        assert_eq!(s.window().len, 1, "7 sent, 3 reposted: 4 < 6");
    }

    #[test]
    fn no_more_than_max_unacked_bytes_wait_for_their_completion() {
        // A 4 KiB ring with at most 1 KiB posted and not completed.
        let mut s = SendFlow::new(4096, 4096, 16, 4, (4096, 1024));
        assert_eq!(s.window(), w(0, 0, 1024));
        s.posted_data(600);
        assert_eq!(s.window(), w(600, 600, 424));
        let end = s.posted_data(424);
        assert_eq!(
            s.window().len,
            0,
            "1 KiB in flight: blocked though both rings have room"
        );
        s.completed(end);
        assert_eq!(s.window(), w(1024, 1024, 1024), "completed: the next KiB");
        // The peer's ring still binds: nothing consumed there yet.
        for _ in 0..3 {
            let end = s.posted_data(s.window().len);
            s.completed(end);
        }
        assert_eq!(s.window().len, 0, "the peer's ring is full");
        s.credit(4096, 5).unwrap();
        assert_eq!(s.window(), w(0, 0, 1024));
        // A cap above the send ring is the send ring.
        let s = SendFlow::new(4096, 2048, 16, 4, (4096, 1 << 20));
        assert_eq!(s.window(), w(0, 0, 2048));
    }

    #[test]
    fn impossible_credits_are_refused() {
        let mut s = SendFlow::new(1024, 1024, 16, 4, (4096, u64::MAX));
        s.posted_data(10);
        assert!(s.credit(11, 0).is_err());
        assert!(s.credit(10, 2).is_err());
        assert!(s.credit(10, 1).is_ok());
        // Old reports never move the counters back.
        s.credit(5, 0).unwrap();
        s.completed(10);
        assert_eq!(s.window(), w(10, 10, 1014));
    }

    /// `len` bytes arriving as the next write of `r`, with the right immediate.
    fn next(r: &mut RecvFlow, len: u32) -> Result<(), BadWrite> {
        let imm = crate::wire::data_imm(r.arrived_total() + u64::from(len));
        r.arrived(len, imm)
    }

    #[test]
    fn the_receiver_refuses_empty_repeated_and_misplaced_writes() {
        let mut r = RecvFlow::new(1024, 16);
        assert_eq!(r.arrived(0, 500), Err(BadWrite::Empty { imm: 500 }));
        next(&mut r, 100).unwrap();
        // The same write again (what Debian 12's rxe re-sent after an ACK timeout retry, as an
        // empty write or a whole one): refused, nothing counted.
        assert!(matches!(
            r.arrived(100, 100),
            Err(BadWrite::Position { .. })
        ));
        assert!(matches!(r.arrived(0, 100), Err(BadWrite::Empty { .. })));
        // A write that claims more than it carries.
        assert!(matches!(r.arrived(10, 900), Err(BadWrite::Position { .. })));
        assert_eq!(r.arrived_total(), 100);
        assert_eq!(r.pending(), (0, 100));
        r.arrived(24, 124).unwrap();
        // The position wraps at 2^32 like the immediate.
        let mut far = RecvFlow::new(1 << 20, 16);
        far.arrived = (1 << 32) - 8;
        far.consumed = far.arrived;
        far.taken = far.arrived;
        far.arrived(16, 8).unwrap();
        assert_eq!(far.arrived_total(), (1 << 32) + 8);
    }

    #[test]
    fn the_receiver_refuses_an_overrun_and_owes_credits_by_quarters() {
        let mut r = RecvFlow::new(1024, 16);
        next(&mut r, 1000).unwrap();
        assert!(matches!(next(&mut r, 25), Err(BadWrite::Overrun { .. })));
        assert_eq!(r.pending(), (0, 1000));
        r.delivered(255);
        assert!(!r.credit_due());
        r.delivered(1);
        assert!(r.credit_due(), "a quarter consumed");
        assert_eq!(r.report(), (256, 0));
        assert!(!r.credit_due());
        for _ in 0..4 {
            r.reposted();
        }
        assert!(r.credit_due(), "a quarter of the receives");
        next(&mut r, 280).unwrap();
        r.delivered(744);
        assert_eq!(r.pending(), (1000, 24), "to the ring's end");
        r.delivered(24);
        assert_eq!(r.pending(), (0, 256), "wrapped");
    }

    #[test]
    fn a_claimed_range_keeps_its_space_until_copied_while_later_bytes_go_on() {
        let mut r = RecvFlow::new(1024, 16);
        next(&mut r, 300).unwrap();
        assert_eq!(r.pending(), (0, 300));
        assert!(r.claim(100));
        assert!(!r.claim(10), "one claim at a time");
        assert_eq!(
            r.pending(),
            (100, 200),
            "later bytes are next for the local fd"
        );
        r.delivered(200);
        assert!(!r.has_pending());
        assert_eq!(r.report().0, 0, "nothing freed while the claim is copied");
        next(&mut r, 724).unwrap();
        assert!(
            next(&mut r, 1).is_err(),
            "the claimed range still holds its space"
        );
        r.copied();
        assert_eq!(r.report().0, 300, "the claim and what followed it");
        next(&mut r, 300).unwrap();
    }

    proptest! {
        /// A sender and a receiver exchanging arbitrary chunks over a model link never overrun
        /// the ring, deliver every byte in order, and never deadlock while the app reads.
        #[test]
        fn model_stream_is_lossless_and_never_stalls(
            writes in proptest::collection::vec(1usize..5000, 1..60),
            reads in proptest::collection::vec(1usize..3000, 1..60),
            ring_log in 10u32..14,
            unacked_log in 8u32..15,
        ) {
            let ring = 1u64 << ring_log;
            let rq = 8u64;
            let mut s = SendFlow::new(ring, ring, rq, 2, (1500, 1 << unacked_log));
            let mut r = RecvFlow::new(ring, rq);
            let total: usize = writes.iter().sum();
            let mut offered = 0usize;
            let mut delivered = 0usize;
            let mut in_flight: Vec<(u64, u32)> = Vec::new();
            let mut reads = reads.into_iter().cycle();
            let mut steps = 0;
            while delivered < total {
                steps += 1;
                prop_assert!(steps < 100_000, "stalled: {s:?} {r:?}");
                // Post what the window allows of the app's outstanding bytes.
                let w = s.window().len;
                let want = total - offered;
                if w > 0 && want > 0 {
                    let n = w.min(want);
                    let end = s.posted_data(n);
                    in_flight.push((end, n as u32));
                    offered += n;
                    prop_assert!(s.sent - s.completed <= 1 << unacked_log, "unacked over the cap");
                }
                // Deliver one message: arrival, repost, local completion.
                if let Some((end, n)) = (!in_flight.is_empty()).then(|| in_flight.remove(0)) {
                    r.arrived(n, crate::wire::data_imm(end))
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    r.reposted();
                    s.completed(end);
                }
                // The app reads some.
                if r.has_pending() {
                    let (_, len) = r.pending();
                    let n = len.min(reads.next().unwrap_or(1));
                    r.delivered(n);
                    delivered += n;
                }
                // Credits only when owed: a stall here is a deadlock of the real protocol.
                if r.credit_due() {
                    let (c, p) = r.report();
                    s.credit(c, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            prop_assert_eq!(r.arrived_total(), total as u64);
        }
    }
}
