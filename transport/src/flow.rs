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
//! - **Rings that change size.** A ring is a [`Placement`]: from position `base` on, position
//!   `p` lives at `start + (p - base) % size`. The receiver may *offer* another ring (its start
//!   and size; [`RecvFlow::offer`]); the sender moves to it at its own next position
//!   ([`SendFlow::switch`]) and says so with a control message naming that position, sent
//!   just before the first write into the new ring. The receiver takes the switch only there
//!   ([`RecvFlow::switch`]): bytes before it are read from the old ring, bytes from it on from
//!   the new one, and the old ring is free once every byte before the switch was consumed
//!   ([`RecvFlow::moving`] turns false). The two rings are apart, so the sender's free space in the
//!   new ring is `size - (sent - max(peer_consumed, base))`: unconsumed bytes of the old ring
//!   take none of it. The send ring moves the same way, locally ([`SendFlow::switch`]'s
//!   `local`): its old range is free once every write from it completed.

/// Where a ring's bytes live: from stream position `base` on, position `p` at offset
/// `start + (p - base) % size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The first stream position in this ring.
    pub base: u64,
    /// Its first byte's offset (in the region, or from the peer's announced address).
    pub start: u64,
    /// Its size.
    pub size: u64,
}

impl Placement {
    /// A ring of `size` bytes at `start` that holds the stream from position `base` on.
    pub fn new(base: u64, start: u64, size: u64) -> Placement {
        Placement {
            base,
            start,
            size: size.max(1),
        }
    }

    /// Position `p`'s distance from the ring's start.
    fn relative(&self, p: u64) -> u64 {
        (p - self.base) % self.size
    }

    /// Position `p`'s offset.
    pub fn offset(&self, p: u64) -> u64 {
        self.start + self.relative(p)
    }

    /// Bytes from position `p` to the ring's end.
    fn left_from(&self, p: u64) -> u64 {
        self.size - self.relative(p)
    }
}

/// The largest write for rings of these sizes: a quarter of the peer's ring (its credits come
/// back while the rest is written) and half of what may be in flight.
pub fn chunk_for(ring: u64, max_unacked: u64) -> u64 {
    (ring / 4).min(max_unacked / 2).max(1)
}

/// The sending half's accounting.
#[derive(Debug, Clone)]
pub struct SendFlow {
    /// The peer's ring (start 0: offsets from its announced address).
    ring: Placement,
    /// Our send ring.
    local_ring: Placement,
    max_chunk: u64,
    /// The most bytes posted and not completed locally, whatever the send ring.
    unacked_cap: u64,
    /// The most bytes posted and not completed locally with this send ring.
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
            ring: Placement::new(0, 0, ring),
            local_ring: Placement::new(0, 0, local_ring),
            max_chunk: max_chunk.max(1),
            unacked_cap: max_unacked.max(1),
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
        let blocked = Window {
            local: self.local_ring.offset(self.sent) as usize,
            remote: self.ring.offset(self.sent) as usize,
            len: 0,
        };
        if self.msgs_sent - self.peer_reposted >= self.peer_rq - self.reserve {
            return blocked;
        }
        // Bytes before a ring's base are in the ring before it, and take none of its room.
        let remote_held = self.sent - self.peer_consumed.max(self.ring.base);
        let remote_free = self.ring.size.saturating_sub(remote_held);
        let local_held = self.sent - self.completed.max(self.local_ring.base);
        let local_free = self
            .max_unacked
            .saturating_sub(self.sent - self.completed)
            .min(self.local_ring.size.saturating_sub(local_held));
        let len = remote_free
            .min(local_free)
            .min(self.ring.left_from(self.sent))
            .min(self.local_ring.left_from(self.sent))
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
        self.ring.size.min(self.local_ring.size)
    }

    /// The most bytes posted and not completed with the send ring in use.
    pub fn max_unacked(&self) -> u64 {
        self.max_unacked
    }

    /// Moves to other rings from the next byte on (the position returned; no write may be
    /// claimed meanwhile): `remote`, the size of the ring the peer offered (its address is the
    /// caller's), and `local`, our send ring's new start and size. Writes already posted stay
    /// where they are; the window never spans the switch, since it starts at the next byte.
    pub fn switch(&mut self, remote: Option<u64>, local: Option<(u64, u64)>) -> u64 {
        if let Some(size) = remote {
            self.ring = Placement::new(self.sent, 0, size);
        }
        if let Some((start, size)) = local {
            self.local_ring = Placement::new(self.sent, start, size);
            self.max_unacked = self.unacked_cap.clamp(1, self.local_ring.size);
        }
        self.max_chunk = chunk_for(self.ring.size, self.max_unacked);
        self.sent
    }

    /// True when every posted write completed locally.
    pub fn all_completed(&self) -> bool {
        self.completed == self.sent
    }
}

/// The receiving half's accounting.
#[derive(Debug, Clone)]
pub struct RecvFlow {
    /// The ring the peer writes into now.
    ring: Placement,
    /// The ring before it: positions before `ring.base` that were not consumed are there.
    old: Placement,
    /// A ring we offered (start, size) that the peer has not switched to yet.
    offered: Option<(u64, u64)>,
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

/// A ring switch the receiver refuses: none was offered, or it is not where the next write
/// starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a ring switch at {position} (next write at {expected}, a ring offered: {offered})")]
pub struct BadSwitch {
    /// The position it named.
    pub position: u64,
    /// Where the next data write starts.
    pub expected: u64,
    /// Whether a ring was offered.
    pub offered: bool,
}

impl RecvFlow {
    /// Our ring of `ring` bytes and `rq` posted receives.
    pub fn new(ring: u64, rq: u64) -> RecvFlow {
        RecvFlow {
            ring: Placement::new(0, 0, ring),
            old: Placement::new(0, 0, ring),
            offered: None,
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
        let held = self.arrived - self.consumed.max(self.ring.base);
        if held + len > self.ring.size {
            return Err(BadWrite::Overrun {
                len,
                held,
                ring: self.ring.size,
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
        let mut held = self.arrived - self.taken;
        let ring = if self.taken < self.ring.base {
            held = held.min(self.ring.base - self.taken);
            self.old
        } else {
            self.ring
        };
        if let Some(mark) = self.urgent.filter(|&m| m >= self.taken) {
            held = held.min((mark - self.taken).max(1));
        }
        let len = held.min(ring.left_from(self.taken));
        (ring.offset(self.taken) as usize, len as usize)
    }

    /// Offers the peer a ring of `size` bytes at `start`, to write into from a position it
    /// names ([`RecvFlow::switch`]); false (nothing offered) while an offer is open or the
    /// ring before the current one still holds bytes.
    pub fn offer(&mut self, start: u64, size: u64) -> bool {
        if self.moving() {
            return false;
        }
        self.offered = Some((start, size.max(1)));
        true
    }

    /// The peer moved to the offered ring from `position` on: taken only where the next write
    /// starts (the switch comes just before it), and only with a ring offered.
    pub fn switch(&mut self, position: u64) -> Result<(), BadSwitch> {
        let bad = BadSwitch {
            position,
            expected: self.arrived,
            offered: self.offered.is_some(),
        };
        if position != self.arrived {
            return Err(bad);
        }
        let (start, size) = self.offered.take().ok_or(bad)?;
        self.old = self.ring;
        self.ring = Placement::new(position, start, size);
        Ok(())
    }

    /// The ring the peer writes into now.
    pub fn placement(&self) -> Placement {
        self.ring
    }

    /// A ring was offered and not switched to yet, or the one before still holds bytes (its
    /// space is free once this turns false).
    pub fn moving(&self) -> bool {
        self.offered.is_some() || self.consumed < self.ring.base
    }

    /// Every byte that arrived was consumed.
    pub fn is_empty(&self) -> bool {
        self.consumed == self.arrived
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
        self.consumed - self.consumed_reported >= (self.ring.size / 4).max(1)
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
        self.ring.size
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
    fn the_receiver_refuses_a_switch_it_did_not_offer_or_out_of_place() {
        let mut r = RecvFlow::new(4096, 16);
        r.arrived(100, crate::wire::data_imm(100)).unwrap();
        assert!(r.switch(100).is_err(), "no ring offered");
        assert!(r.offer(8192, 16384));
        assert!(!r.offer(0, 4096), "one offer at a time");
        assert!(r.switch(99).is_err(), "a byte that already arrived");
        assert!(r.switch(101).is_err(), "past the next write's start");
        r.switch(100).unwrap();
        assert!(r.switch(100).is_err(), "the offer was taken");
        // The old ring holds 100 unconsumed bytes: they are read from it, then it is free.
        assert_eq!(r.pending(), (0, 100));
        assert!(r.moving(), "the old ring still holds bytes");
        assert!(!r.offer(0, 4096), "not while the old ring holds bytes");
        r.arrived(5000, crate::wire::data_imm(5100)).unwrap();
        r.delivered(100);
        assert!(!r.moving(), "the old ring is free");
        assert_eq!(r.pending(), (8192, 5000), "the new ring, from its start");
        // The new ring's free space does not count the old ring's bytes, and is its own size.
        assert!(
            r.arrived(16384 - 5000 + 1, crate::wire::data_imm(100 + 16385))
                .is_err()
        );
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

        /// Rings that change size while bytes flow: the receiver offers its other ring at
        /// random moments, the sender moves to it at random moments later, the messages of each
        /// direction keep their order (RC) and arrive at random moments. Every byte lands in
        /// a place no unconsumed byte holds, and the app reads every byte once, in order.
        #[test]
        fn rings_that_switch_mid_stream_never_lose_or_overwrite_a_byte(
            actions in proptest::collection::vec(0u8..8, 1..3000),
            small_log in 10u32..13,
            big_log in 12u32..15,
            reads in proptest::collection::vec(1usize..5000, 1..20),
            total in 1u64..300_000,
        ) {
            #[derive(Debug)]
            enum Fwd { Data(u64, u32, u64, u64), Switch(u64) }
            #[derive(Debug)]
            enum Back { Credit(u64, u64), Ring(u64, u64) }
            let (small, big) = (1u64 << small_log, 1u64 << big_log);
            // The receiver's region: the small ring at 0, the big one after it.
            let areas = [(0u64, small), (small, big)];
            let mut memory = vec![0u8; (small + big) as usize];
            let mut owner: Vec<Option<u64>> = vec![None; (small + big) as usize];
            // The sender's send rings, laid out the same way.
            let mut local: Vec<Option<u64>> = vec![None; (small + big) as usize];
            let byte = |p: u64| (p.wrapping_mul(31) ^ (p >> 8)) as u8;
            let rq = 16u64;
            let mut s = SendFlow::new(small, small, rq, 4, (chunk_for(small, small), small));
            let mut r = RecvFlow::new(small, rq);
            let mut peer_start = 0u64;
            let mut offer: Option<(u64, u64)> = None;
            let mut area = 0usize;
            let (mut fwd, mut back) = (std::collections::VecDeque::new(), std::collections::VecDeque::new());
            let mut reads = reads.into_iter().cycle();
            let mut delivered = 0u64;
            let mut switches = 0;
            let drain = [0u8, 2, 4, 5, 7];
            for (step, a) in actions.iter().chain(drain.iter().cycle().take(500_000)).enumerate() {
                match a {
                    0 | 1 => {
                        let w = s.window();
                        if w.len > 0 && s.sent() < total {
                            let n = w.len.min(3000).min((total - s.sent()) as usize);
                            let start = s.sent();
                            for i in 0..n {
                                let o = w.local + i;
                                if let Some(held) = local[o] {
                                    prop_assert!(held < s.completed_total(), "step {step}: send ring byte {held} at {o} reused before its write completed");
                                }
                                local[o] = Some(start + i as u64);
                            }
                            let end = s.posted_data(n);
                            fwd.push_back(Fwd::Data(end, n as u32, peer_start + w.remote as u64, w.local as u64));
                            prop_assert!(start + n as u64 == end);
                        }
                    }
                    2 | 3 => match fwd.pop_front() {
                        Some(Fwd::Data(end, n, at, from)) => {
                            for i in 0..u64::from(n) {
                                let p = end - u64::from(n) + i;
                                prop_assert_eq!(local[(from + i) as usize], Some(p), "the send ring changed under a write");
                                let o = (at + i) as usize;
                                prop_assert!(o < memory.len(), "write past the region at {o}");
                                if let Some(held) = owner[o] {
                                    prop_assert!(held < r.consumed, "step {step}: position {p} overwrote unconsumed {held} at {o}");
                                }
                                memory[o] = byte(p);
                                owner[o] = Some(p);
                            }
                            r.arrived(n, crate::wire::data_imm(end)).map_err(|e| TestCaseError::fail(e.to_string()))?;
                            r.reposted();
                            s.completed(end);
                        }
                        Some(Fwd::Switch(p)) => {
                            r.switch(p).map_err(|e| TestCaseError::fail(e.to_string()))?;
                            r.reposted();
                            switches += 1;
                        }
                        None => {}
                    },
                    4 => match back.pop_front() {
                        Some(Back::Credit(c, p)) => {
                            s.credit(c, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        }
                        Some(Back::Ring(start, size)) => offer = Some((start, size)),
                        None => {}
                    },
                    5 => {
                        if r.has_pending() {
                            let (off, len) = r.pending();
                            let n = len.min(reads.next().unwrap_or(1));
                            for i in 0..n {
                                let p = r.taken_total() + i as u64;
                                prop_assert_eq!(owner[off + i], Some(p), "step {}: position {} read at {}", step, p, off + i);
                                prop_assert_eq!(memory[off + i], byte(p));
                            }
                            r.delivered(n);
                            delivered += n as u64;
                        }
                    }
                    6 => {
                        let next = 1 - area;
                        if r.offer(areas[next].0, areas[next].1) {
                            area = next;
                            back.push_back(Back::Ring(areas[next].0, areas[next].1));
                        }
                    }
                    _ => {
                        if let Some((start, size)) = offer.take() {
                            // The switch message takes one of the peer's receives.
                            s.posted_control();
                            let at = s.switch(Some(size), Some((start, size)));
                            peer_start = start;
                            fwd.push_back(Fwd::Switch(at));
                        }
                    }
                }
                if r.credit_due() {
                    let (c, p) = r.report();
                    back.push_back(Back::Credit(c, p));
                }
                if delivered == total && fwd.is_empty() {
                    break;
                }
                prop_assert!(step < actions.len() + 400_000, "stalled: {s:?} {r:?}");
            }
            prop_assert_eq!(delivered, total);
            prop_assert_eq!(r.arrived_total(), total);
            prop_assert!(switches <= actions.len());
        }
    }
}
