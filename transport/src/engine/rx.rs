//! The receive half of one connection (net/smc's `smc_rx.c`): the stream bytes and control
//! receives that arrived, their delivery into the app's socketpair, the credits owed to the
//! peer, and direct reads, where an app thread takes received bytes straight from the receive
//! ring instead of waiting for the engine to copy them into its socketpair end.
//!
//! Its state ([`RecvState`]) is private to this module: the engine and readers change it only
//! through [`Receiver`]'s and [`Reader`]'s methods. The receive lock comes after the send lock
//! in the engine's lock order ([`super::lock_order`]) and nothing is taken under it.
//!
//! Every received byte normally takes two copies to reach the app: the engine writes it from
//! the ring into the socketpair, and the app reads it out. A [`Reader`] lets the shim's `read`,
//! `recv` and `recvfrom` hooks copy it once, from the ring into the app's buffer.
//!
//! Nothing is lost or reordered: the receive state ([`RecvFlow`]) sits behind one lock that the
//! engine holds while it writes ring bytes into the socketpair and a reader holds while it
//! copies. A reader copies only when the app's end of the socketpair holds no byte, so every
//! byte the engine delivered before was read first, and it copies from the flow's consumed
//! position, the next byte in order. The bytes stay the peer's to overwrite only after the
//! consumed position passed them, as for the engine's own deliveries (credits). Every other way
//! of reading (`readv`, `recvmsg`, a child after `fork`, a program calling the kernel itself)
//! reads the socketpair, which the engine keeps filling: those see every byte too, one copy
//! later.
//!
//! A reader that means to take many bytes in a row (`recv` with `MSG_WAITALL`) *holds* the
//! stream ([`Reader::hold`]) between its blocking waits: while any reader holds it, the engine
//! leaves arrived bytes in the ring for the reader instead of copying them into the socketpair.
//! A hold never spans a blocking call (the reader lets go before it waits on the socketpair),
//! and letting go with bytes still in the ring wakes the engine, which then delivers them as
//! usual: no byte waits on a reader that has stopped reading, and a reader blocked on the
//! socketpair is always woken by the engine's next delivery.
//!
//! A holding reader that runs out of bytes *waits* on the socketpair ([`Reader::wait`]). While
//! any reader waits, the engine delivers only a wake-up: the next [`WAKE_BYTES`] bytes, and
//! only when the socketpair holds nothing unread (else what it holds wakes the reader). The
//! woken reader takes the rest from the ring. Whoever reads the wake-up (the waiting reader or
//! any other), the engine hears of it (its end of the socketpair becomes writable) and wakes
//! the next waiter the same way, so a waiting reader is always woken while bytes arrive.
//!
//! A `read` or plain `recv` that cannot copy from the ring at once ([`Reader::read_or_wait`])
//! makes its original call as a waiting reader, without a hold before or after: it returns
//! what the socketpair holds, or, on a blocking fd, blocks until the engine's wake-up, and then
//! copies what arrived after those bytes from the ring into the rest of its buffer. So a
//! blocking reader takes most bytes in one copy, not only when it happens to run between an
//! arrival and the engine's delivery; a poll-driven reader pays no syscall of the shim's.
//!
//! Under a low-water mark (`SO_RCVLOWAT` above 1) readers copy nothing: the socketpair's
//! blocking read honours the mark, and the engine delivers as if no reader held or waited
//! (one-byte wake-ups would reach a reader blocked below the mark one engine round apiece).
//!
//! A reader copies only while the engine allows it ([`Receiver::set_readers`]): the stream runs
//! attached with its handshake done. The engine turns it off before the connection's region can
//! serve another connection, under the same lock, so a reader never copies another stream's
//! bytes; the region itself stays mapped while any reader holds it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Weak};

use super::lock_order::{Guard, Level, OrderedMutex};
use super::relay::Ready;
use super::{Command, Inner};
use crate::fd;
use crate::flow::{Placement, RecvFlow};
use crate::rdma::{Region, unread_by_peer};

/// The receive side of one connection, shared by the engine and its [`Reader`]s.
pub(super) struct Receiver {
    /// The connection's region; its receive ring starts at offset 0.
    region: Arc<Region>,
    state: OrderedMutex<RecvState>,
}

/// What the lock guards.
struct RecvState {
    flow: RecvFlow,
    /// Direct reads are allowed (the stream runs attached, the region is this connection's).
    readers_on: bool,
    /// Bytes readers took that the engine has not counted yet.
    read_by_app: u64,
    /// The peer's FIN arrived: once every byte was read, the engine shuts the app's side.
    peer_fin: bool,
    /// Readers holding the stream ([`Reader::hold`]): the engine leaves arrived bytes in the
    /// ring while this is above zero.
    held: u32,
    /// Holding readers now blocked on the socketpair ([`Reader::wait`]).
    waiting: u32,
    /// The app's `SO_RCVLOWAT` ([`Reader::set_low_water`]): fewer arrived bytes than this are
    /// held back from an empty socketpair end, whose `poll` ignores the mark.
    low_water: usize,
}

/// The receive ring as [`Receiver::ring_state`] saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RingState {
    /// The ring the peer writes into now.
    pub(super) ring: Placement,
    /// A ring was offered and not switched to, or the one before still holds bytes.
    pub(super) moving: bool,
    /// Every byte that arrived was consumed.
    pub(super) drained: bool,
    /// Stream bytes arrived so far.
    pub(super) arrived: u64,
}

/// What the engine delivers to a waiting reader to wake it (it takes the rest from the ring).
const WAKE_BYTES: usize = 1;

impl RecvState {
    /// At most how many bytes the engine copies into the socketpair now, given what the app's
    /// end has not read yet (`unread`, None when unknown): none while a reader holds the
    /// stream; a wake-up for a waiting reader, when nothing unread would wake it; else all.
    /// Under a low-water mark readers take nothing from the ring (the socketpair's blocking
    /// read honours the mark), so holds and waits count for nothing: one-byte wake-ups would
    /// hand a reader blocked below the mark its bytes one engine round at a time.
    fn deliverable(&self, unread: impl FnOnce() -> Option<usize>) -> usize {
        let marked = self.low_water > 1;
        if !marked && self.held > 0 {
            0
        } else if marked || self.waiting == 0 {
            if self.below_low_water() && unread() == Some(0) {
                0
            } else {
                usize::MAX
            }
        } else if unread() == Some(0) {
            WAKE_BYTES
        } else {
            0
        }
    }

    /// Fewer bytes wait than the app's low-water mark, and more may come: TCP would not call
    /// the socket readable yet. (At most half the ring is waited for, so the peer never
    /// blocks on a mark the ring cannot reach; the peer's FIN makes what arrived readable.)
    fn below_low_water(&self) -> bool {
        let waiting = self.flow.arrived_total() - self.flow.taken_total();
        self.low_water > 1
            && !self.peer_fin
            && waiting < (self.low_water as u64).min(self.flow.ring() / 2)
    }
}

impl Receiver {
    pub(super) fn new(region: Arc<Region>, flow: RecvFlow) -> Arc<Receiver> {
        Arc::new(Receiver {
            region,
            state: OrderedMutex::new(
                Level::Receive,
                RecvState {
                    flow,
                    readers_on: false,
                    read_by_app: 0,
                    peer_fin: false,
                    held: 0,
                    waiting: 0,
                    low_water: 1,
                },
            ),
        })
    }

    fn lock(&self) -> Guard<'_, RecvState> {
        self.state.lock()
    }

    /// Stream bytes arrived: an RDMA write of `len` bytes whose immediate is `imm` (taken only
    /// when it is the next write, whole: [`RecvFlow::arrived`]).
    pub(super) fn arrived(&self, len: u32, imm: u32) -> Result<(), String> {
        self.lock()
            .flow
            .arrived(len, imm)
            .map_err(|e| e.to_string())
    }

    /// The peer marked the byte at `position` urgent ([`RecvFlow::urgent`]).
    pub(super) fn urgent(&self, position: u64) -> Result<(), String> {
        self.lock().flow.urgent(position).map_err(|e| e.to_string())
    }

    /// Offers the peer a ring of `size` bytes at offset `start` of the region
    /// ([`RecvFlow::offer`]); false while a move is under way.
    pub(super) fn offer(&self, start: usize, size: usize) -> bool {
        self.lock().flow.offer(start as u64, size as u64)
    }

    /// The peer writes into the offered ring from `position` on ([`RecvFlow::switch`]).
    pub(super) fn switch(&self, position: u64) -> Result<(), String> {
        self.lock().flow.switch(position).map_err(|e| e.to_string())
    }

    /// Where the peer writes now and what the ring holds (one look, under the lock).
    pub(super) fn ring_state(&self) -> RingState {
        let state = self.lock();
        RingState {
            ring: state.flow.placement(),
            moving: state.flow.moving(),
            drained: state.flow.is_empty(),
            arrived: state.flow.arrived_total(),
        }
    }

    /// A receive was posted again (the peer may send one more message).
    pub(super) fn reposted(&self) {
        self.lock().flow.reposted();
    }

    /// The peer's FIN arrived.
    pub(super) fn peer_fin(&self) {
        self.lock().peer_fin = true;
    }

    /// The credit report for the next control message (consumed, reposted); it counts as sent.
    pub(super) fn report(&self) -> (u64, u64) {
        self.lock().flow.report()
    }

    /// The peer is owed a credit report.
    pub(super) fn credit_due(&self) -> bool {
        self.lock().flow.credit_due()
    }

    /// Writes what arrived to `local` while it takes it, as far as readers leave it to the
    /// engine (see the module docs); the byte count.
    pub(super) fn deliver_to(&self, local: &OwnedFd, ready: &mut Ready) -> io::Result<u64> {
        let mut moved = 0u64;
        // Held while writing: a direct read never runs between a delivery and its accounting.
        let mut state = self.lock();
        let mut budget = state.deliverable(|| unread_by_peer(local.as_raw_fd()).ok());
        while ready.writable && state.flow.has_pending() && budget > 0 {
            let (off, len) = state.flow.pending();
            let len = len.min(budget);
            // The urgent byte goes alone, out of band: the app's end then answers as TCP's
            // does to urgent data (`POLLPRI`, `SIOCATMARK`, `MSG_OOB`, `SIGURG`).
            let sent = if state.flow.at_mark() {
                self.region.send_urgent_to(local.as_raw_fd(), off)
            } else {
                self.region.send_to(local.as_raw_fd(), off, len)
            };
            match sent {
                Ok(n) => {
                    state.flow.delivered(n);
                    moved += n as u64;
                    budget = budget.saturating_sub(n);
                }
                Err(e) if fd::transient(&e) => ready.writable = false,
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// Whether the app's end `app` is at the urgent mark, as TCP's socket would answer
    /// (`SIOCATMARK`): the kernel's answer, or yes when `app` holds nothing and the next byte
    /// the engine hands on is the urgent one (TCP's socket would hold it, at the mark), as
    /// after a direct read took the bytes before it. Under the lock, so no delivery is half
    /// done.
    pub(super) fn at_mark(&self, app: RawFd) -> io::Result<bool> {
        let state = self.lock();
        if crate::rdma::at_mark(app)? {
            return Ok(true);
        }
        Ok(state.readers_on && state.flow.at_mark() && fd::holds_nothing(app))
    }

    /// Turns direct reads on or off (see the module docs).
    pub(super) fn set_readers(&self, on: bool) {
        self.lock().readers_on = on;
    }

    /// Bytes the app's direct reads took since the last call.
    pub(super) fn take_read(&self) -> u64 {
        std::mem::take(&mut self.lock().read_by_app)
    }

    /// Bytes arrived and wait for the local side.
    pub(super) fn has_pending(&self) -> bool {
        self.lock().flow.has_pending()
    }

    /// Stream bytes arrived so far, and whether some wait for the local side.
    pub(super) fn arrived_total(&self) -> (u64, bool) {
        let state = self.lock();
        (state.flow.arrived_total(), state.flow.has_pending())
    }

    /// Direct reads end for good (the connection is over); true when no reader is copying
    /// from the ring, so the region may serve another connection.
    pub(super) fn retire(&self) -> bool {
        let mut state = self.lock();
        state.readers_on = false;
        !state.flow.claim_open()
    }
}

/// Reads a stream's received bytes for the app's thread ([`super::Conn::reader`]).
pub struct Reader {
    recv: Weak<Receiver>,
    inner: Arc<Inner>,
    token: u64,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("token", &self.token)
            .finish()
    }
}

impl Reader {
    pub(super) fn new(recv: &Arc<Receiver>, inner: Arc<Inner>, token: u64) -> Reader {
        Reader {
            recv: Arc::downgrade(recv),
            inner,
            token,
        }
    }

    /// Copies received bytes into `buf` when `app` (the app's end of the stream's socketpair)
    /// holds none and the ring does; the byte count. None: read `app` as usual (it holds bytes,
    /// the ring is empty, or the stream is not running).
    pub fn read(&self, app: RawFd, buf: &mut [u8]) -> Option<usize> {
        if buf.is_empty() {
            return None;
        }
        let recv = self.recv.upgrade()?;
        let state = recv.lock();
        if !state.flow.has_pending() || !Self::may_take(&state) || !fd::holds_nothing(app) {
            return None;
        }
        Some(self.copy(&recv, state, buf))
    }

    /// A read of `app` into `buf` (`read`, or `recv` without flags that change what it
    /// returns): as [`Reader::read`] when the ring holds bytes and `app` none. Otherwise
    /// `wait(buf)` (the original call on `app`: it returns what `app` holds, or blocks when the
    /// fd does) runs as a *waiting* reader (see the module docs): while it blocks the engine
    /// delivers only a wake-up, and what arrived after the bytes it read is copied from the ring
    /// into the rest of `buf`. The result is `wait`'s when it read nothing (0 at EOF, -1 with
    /// its errno), else the bytes of both. None: call the original as usual (the stream is not
    /// running, a mark is set, another reader is copying).
    pub fn read_or_wait(
        &self,
        app: RawFd,
        buf: &mut [u8],
        wait: &mut dyn FnMut(&mut [u8]) -> isize,
    ) -> Option<isize> {
        if buf.is_empty() {
            return None;
        }
        {
            let recv = self.recv.upgrade()?;
            let mut state = recv.lock();
            if !Self::may_take(&state) {
                return None;
            }
            // The syscall only when the ring holds bytes (a poll-driven reader finds it empty).
            if state.flow.has_pending() && fd::holds_nothing(app) {
                return isize::try_from(self.copy(&recv, state, buf)).ok();
            }
            state.waiting += 1;
        }
        // No strong hold on the receive side across the call, which may block.
        let n = wait(buf);
        let Some(recv) = self.recv.upgrade() else {
            return Some(n);
        };
        {
            let mut state = recv.lock();
            state.waiting = state.waiting.saturating_sub(1);
            state.held += 1;
        }
        let mut total = n;
        if let Some(rest) = usize::try_from(n)
            .ok()
            .filter(|&got| got > 0)
            .and_then(|got| buf.get_mut(got..))
            .filter(|rest| !rest.is_empty())
        {
            let more = self.read(app, rest).unwrap_or(0);
            total = total.saturating_add(isize::try_from(more).unwrap_or(0));
        }
        // Letting go wakes the engine for whatever the ring still holds.
        self.hold(false);
        Some(total)
    }

    /// Whether a reader may take bytes from the ring now, as far as the stream's state says
    /// (the caller checks that `app` holds none).
    fn may_take(state: &RecvState) -> bool {
        // With a low-water mark the socketpair's blocking read honours it.
        // At the mark the engine hands the urgent byte on, out of band.
        state.readers_on
            && !state.flow.claim_open()
            && !state.flow.at_mark()
            && state.low_water <= 1
    }

    /// Claims up to `buf.len()` of the pending bytes under `state` (some are pending) and
    /// copies them into `buf`; the byte count.
    fn copy(&self, recv: &Arc<Receiver>, mut state: Guard<'_, RecvState>, buf: &mut [u8]) -> usize {
        let (off, n) = {
            let (off, len) = state.flow.pending();
            let n = len.min(buf.len());
            state.flow.claim(n);
            drop(state);
            (off, n)
        };
        // Outside the lock, so the engine never waits for a copy: the claimed range is the
        // reader's (the engine delivers after it) and its space is not freed (the peer cannot
        // overwrite it) until `copied`.
        let loaded = recv.region.load(off, &mut buf[..n]);
        let mut state = recv.lock();
        state.flow.copied();
        // The range is inside the region by construction; a failure would lose those bytes, so
        // it cannot go unnoticed.
        assert!(loaded.is_ok(), "ring range {off}+{n} outside the region");
        state.read_by_app += n as u64;
        // The engine owes a credit, or may shut the app's side (the peer's FIN, all read);
        // otherwise it sleeps on.
        let tell = state.flow.credit_due() || (state.peer_fin && !state.flow.has_pending());
        drop(state);
        if tell {
            self.inner.send(Command::Consumed { token: self.token });
        }
        n
    }

    /// The app set `SO_RCVLOWAT` to `bytes` on its end: fewer arrived bytes are held back
    /// from an empty socketpair end (see [`RecvState::below_low_water`]), and the app reads
    /// through the socketpair, whose blocking read honours the mark. A lower mark wakes the
    /// engine, which may deliver what it held.
    pub fn set_low_water(&self, bytes: usize) {
        let Some(recv) = self.recv.upgrade() else {
            return;
        };
        let mut state = recv.lock();
        let lower = bytes < state.low_water;
        state.low_water = bytes.max(1);
        let tell = lower && state.flow.has_pending();
        drop(state);
        if tell {
            self.inner.send(Command::Consumed { token: self.token });
        }
    }

    /// Holds the stream (`on`) or lets go of it (see the module docs): while held, the engine
    /// leaves arrived bytes in the ring for this reader's [`Reader::read`]s. Never hold across
    /// a blocking call. Letting go wakes the engine when bytes wait in the ring.
    pub fn hold(&self, on: bool) {
        let Some(recv) = self.recv.upgrade() else {
            return;
        };
        let mut state = recv.lock();
        if on {
            state.held += 1;
            return;
        }
        state.held = state.held.saturating_sub(1);
        let tell = state.held == 0 && state.flow.has_pending();
        drop(state);
        if tell {
            self.inner.send(Command::Consumed { token: self.token });
        }
    }

    /// A holding reader is about to block on the socketpair (`on`), or is back from it (see
    /// the module docs): its hold turns into a wait and back. Going to wait with bytes in the
    /// ring wakes the engine, which then delivers a wake-up.
    pub fn wait(&self, on: bool) {
        let Some(recv) = self.recv.upgrade() else {
            return;
        };
        let mut state = recv.lock();
        if !on {
            state.waiting = state.waiting.saturating_sub(1);
            state.held += 1;
            return;
        }
        state.held = state.held.saturating_sub(1);
        state.waiting += 1;
        let tell = state.held == 0 && state.flow.has_pending();
        drop(state);
        if tell {
            self.inner.send(Command::Consumed { token: self.token });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

    use nix::sys::eventfd::{EfdFlags, EventFd};

    use super::*;
    use crate::engine::{Budget, EngineConfig, NOT_COUNTED};

    const RING: usize = 4096;

    fn inner() -> Arc<Inner> {
        Arc::new(Inner {
            budget: Arc::new(Budget::new(None)),
            config: EngineConfig::default(),
            commands: OrderedMutex::new(Level::Commands, VecDeque::new()),
            wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap(),
            next_token: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            unflushed: AtomicUsize::new(NOT_COUNTED),
            progress: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            reuse: crate::engine::ReuseCounts::default(),
            stopped: AtomicBool::new(false),
        })
    }

    /// A receiver whose ring holds `bytes` (arrived, not delivered), direct reads on.
    fn receiver(bytes: &[u8]) -> Arc<Receiver> {
        let region = Arc::new(Region::new(RING).unwrap());
        let recv = Receiver::new(Arc::clone(&region), RecvFlow::new(RING as u64, 16));
        region.store(0, bytes).unwrap();
        {
            let mut state = recv.lock();
            let end = state.flow.arrived_total() + bytes.len() as u64;
            state
                .flow
                .arrived(bytes.len() as u32, crate::wire::data_imm(end))
                .unwrap();
            state.readers_on = true;
        }
        recv
    }

    fn pokes(inner: &Inner) -> usize {
        inner.commands.lock().len()
    }

    #[test]
    fn an_empty_socketpair_end_reads_the_ring_in_order_and_the_engine_hears_of_the_drain() {
        let (inner, recv) = (inner(), receiver(b"hello, world"));
        let reader = Reader::new(&recv, Arc::clone(&inner), 7);
        let (app, _engine) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 5];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), Some(5));
        assert_eq!(&buf, b"hello");
        assert_eq!(
            pokes(&inner),
            0,
            "bytes left, no credit owed: the engine sleeps"
        );
        recv.lock().peer_fin = true;
        let mut rest = [0u8; 64];
        assert_eq!(reader.read(app.as_raw_fd(), &mut rest), Some(7));
        assert_eq!(&rest[..7], b", world");
        assert_eq!(
            pokes(&inner),
            1,
            "drained after FIN: the engine shuts the app's side"
        );
        assert!(matches!(
            inner.commands.lock().front(),
            Some(Command::Consumed { token: 7 })
        ));
        assert_eq!(
            recv.lock().read_by_app,
            12,
            "counted for the engine's stats"
        );
        assert_eq!(reader.read(app.as_raw_fd(), &mut rest), None, "ring empty");
    }

    #[test]
    fn bytes_the_engine_delivered_are_read_first() {
        let (inner, recv) = (inner(), receiver(b"later"));
        let reader = Reader::new(&recv, inner, 1);
        let (mut app, mut engine) = UnixStream::pair().unwrap();
        engine.write_all(b"first").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), None);
        assert_eq!(app.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"first");
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), Some(5));
        assert_eq!(&buf[..5], b"later");
    }

    #[test]
    fn nothing_is_read_while_the_engine_forbids_it_or_once_the_connection_is_gone() {
        let (inner, recv) = (inner(), receiver(b"bytes"));
        let reader = Reader::new(&recv, inner, 1);
        let (app, _engine) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        recv.lock().readers_on = false;
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), None);
        recv.lock().readers_on = true;
        assert_eq!(
            reader.read(app.as_raw_fd(), &mut []),
            None,
            "an empty buffer"
        );
        drop(recv);
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), None);
    }

    #[test]
    fn a_quarter_of_the_ring_read_owes_a_credit_and_wraps_at_the_ring_end() {
        let inner = inner();
        let recv = receiver(&[1u8; RING]);
        let reader = Reader::new(&recv, Arc::clone(&inner), 1);
        let (app, _engine) = UnixStream::pair().unwrap();
        let mut buf = vec![0u8; RING / 4];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), Some(RING / 4));
        assert_eq!(pokes(&inner), 1, "a credit is owed");
        let _ = recv.lock().flow.report();
        // The rest of the ring, then bytes that wrapped to its start.
        let mut big = vec![0u8; RING];
        assert_eq!(
            reader.read(app.as_raw_fd(), &mut big),
            Some(RING - RING / 4)
        );
        recv.region.store(0, b"wrapped").unwrap();
        {
            let mut state = recv.lock();
            let end = state.flow.arrived_total() + 7;
            state.flow.arrived(7, crate::wire::data_imm(end)).unwrap();
        }
        assert_eq!(reader.read(app.as_raw_fd(), &mut big), Some(7));
        assert_eq!(&big[..7], b"wrapped");
    }

    #[test]
    fn a_held_stream_keeps_its_bytes_from_the_engine_and_letting_go_wakes_it() {
        let (inner, recv) = (inner(), receiver(b"held bytes"));
        let reader = Reader::new(&recv, Arc::clone(&inner), 3);
        assert!((recv.lock().deliverable(|| Some(0)) == usize::MAX));
        reader.hold(true);
        reader.hold(true);
        assert!(
            recv.lock().deliverable(|| Some(0)) != usize::MAX,
            "held twice"
        );
        reader.hold(false);
        assert!(
            recv.lock().deliverable(|| Some(0)) != usize::MAX,
            "still held once"
        );
        assert_eq!(pokes(&inner), 0);
        reader.hold(false);
        assert!((recv.lock().deliverable(|| Some(0)) == usize::MAX));
        assert_eq!(
            pokes(&inner),
            1,
            "let go with bytes in the ring: the engine is told"
        );
        // Let go with the ring empty: nothing to tell.
        let (app, _engine) = UnixStream::pair().unwrap();
        reader.hold(true);
        let mut buf = [0u8; 64];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), Some(10));
        reader.hold(false);
        assert_eq!(pokes(&inner), 1);
        reader.hold(false);
        assert!(
            (recv.lock().deliverable(|| Some(0)) == usize::MAX),
            "an extra let-go does not underflow"
        );
    }

    #[test]
    fn a_waiting_reader_gets_a_wake_up_only_when_nothing_unread_would_wake_it() {
        let (inner, recv) = (inner(), receiver(b"arrived"));
        let reader = Reader::new(&recv, Arc::clone(&inner), 4);
        let all = |state: &RecvState, unread: Option<usize>| state.deliverable(|| unread);
        assert_eq!(
            all(&recv.lock(), Some(9)),
            usize::MAX,
            "no reader: everything"
        );
        reader.hold(true);
        assert_eq!(all(&recv.lock(), Some(0)), 0, "held: nothing");
        reader.wait(true);
        assert_eq!(
            pokes(&inner),
            1,
            "waiting with bytes in the ring: the engine is told"
        );
        assert_eq!(all(&recv.lock(), Some(0)), WAKE_BYTES, "a wake-up");
        assert_eq!(all(&recv.lock(), Some(1)), 0, "unread bytes will wake it");
        assert_eq!(
            all(&recv.lock(), None),
            0,
            "unknown: wait for the writable edge"
        );
        reader.wait(false);
        assert_eq!(
            all(&recv.lock(), Some(0)),
            0,
            "back from the wait: held again"
        );
        reader.hold(false);
        assert_eq!(all(&recv.lock(), Some(0)), usize::MAX);
        assert_eq!(pokes(&inner), 2, "let go with bytes left");
    }

    /// Bytes arriving in `recv`'s ring after those before (no wrap).
    fn arrive(recv: &Receiver, bytes: &[u8]) {
        let mut state = recv.lock();
        let at = state.flow.arrived_total();
        recv.region.store(at as usize, bytes).unwrap();
        let end = at + bytes.len() as u64;
        state
            .flow
            .arrived(bytes.len() as u32, crate::wire::data_imm(end))
            .unwrap();
    }

    #[test]
    fn a_blocking_read_waits_for_a_wake_up_and_takes_the_rest_from_the_ring() {
        let (inner, recv) = (inner(), receiver(b"ab"));
        let reader = Reader::new(&recv, Arc::clone(&inner), 3);
        let (app, _engine) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        let mut never = |_: &mut [u8]| -> isize { panic!("waited with bytes in the ring") };
        assert_eq!(
            reader.read_or_wait(app.as_raw_fd(), &mut buf, &mut never),
            Some(2),
            "the ring's bytes, without waiting"
        );
        assert_eq!(&buf[..2], b"ab");

        // Nothing anywhere: the call waits as a waiting reader; the engine may deliver only a
        // wake-up, and the reader takes what came after it from the ring.
        let mut wait = |b: &mut [u8]| -> isize {
            assert_eq!(recv.lock().waiting, 1, "a waiting reader");
            arrive(&recv, b"cdefg");
            let mut state = recv.lock();
            assert_eq!(state.deliverable(|| Some(0)), WAKE_BYTES);
            let (off, _) = state.flow.pending();
            recv.region.load(off, &mut b[..1]).unwrap();
            state.flow.delivered(1);
            1
        };
        assert_eq!(
            reader.read_or_wait(app.as_raw_fd(), &mut buf, &mut wait),
            Some(5)
        );
        assert_eq!(&buf[..5], b"cdefg", "the wake-up, then the ring, in order");
        let state = recv.lock();
        assert_eq!((state.waiting, state.held), (0, 0), "nothing left held");
        assert!(!state.flow.has_pending());
        assert_eq!(state.read_by_app, 6);
    }

    #[test]
    fn a_read_takes_the_socketpairs_bytes_first_and_leaves_to_libc_what_it_cannot_take() {
        let (inner, recv) = (inner(), receiver(b"x"));
        let reader = Reader::new(&recv, Arc::clone(&inner), 3);
        let (app, mut engine) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), Some(1));
        // The socketpair holds bytes, the ring more: the original reads the socketpair's, and
        // the ring's follow them in the same call.
        engine.write_all(b"y").unwrap();
        arrive(&recv, b"zz");
        let fd = app.as_raw_fd();
        let mut original =
            |b: &mut [u8]| -> isize { isize::try_from((&app).read(b).unwrap()).unwrap() };
        assert_eq!(reader.read_or_wait(fd, &mut buf, &mut original), Some(3));
        assert_eq!(&buf[..3], b"yzz", "the socketpair's bytes, then the ring's");
        let mut never = |_: &mut [u8]| -> isize { panic!("called the original") };
        recv.lock().low_water = 4;
        assert_eq!(
            reader.read_or_wait(fd, &mut buf, &mut never),
            None,
            "under a mark the socketpair's read honours it"
        );
        recv.lock().low_water = 1;

        // An original that fails (EAGAIN on a non-blocking fd, a signal, a receive timeout) is
        // the call's result, and lets go.
        let mut fails = |_: &mut [u8]| -> isize {
            arrive(&recv, b"late");
            -1
        };
        assert_eq!(reader.read_or_wait(fd, &mut buf, &mut fails), Some(-1));
        let state = recv.lock();
        assert_eq!((state.waiting, state.held), (0, 0));
        assert_eq!(
            state.deliverable(|| Some(0)),
            usize::MAX,
            "all to the socketpair"
        );
        drop(state);
        assert_eq!(
            pokes(&inner),
            1,
            "the engine is told of the bytes it may deliver"
        );
    }

    #[test]
    fn under_a_low_water_mark_holds_and_waits_hold_nothing_back() {
        let recv = receiver(b"abcdef");
        let mut state = recv.lock();
        state.low_water = 4;
        state.held = 1;
        assert_eq!(state.deliverable(|| Some(0)), usize::MAX, "held");
        state.held = 0;
        state.waiting = 1;
        assert_eq!(
            state.deliverable(|| Some(1)),
            usize::MAX,
            "waiting, one byte unread: the rest, not one byte per round"
        );
        state.low_water = 8;
        state.waiting = 0;
        assert_eq!(
            state.deliverable(|| Some(0)),
            0,
            "below the mark: kept back"
        );
    }

    #[test]
    fn a_socket_at_eof_or_not_a_socket_is_left_to_libc() {
        let (inner, recv) = (inner(), receiver(b"bytes"));
        let reader = Reader::new(&recv, inner, 1);
        let (app, engine) = UnixStream::pair().unwrap();
        drop(engine);
        let mut buf = [0u8; 16];
        assert_eq!(reader.read(app.as_raw_fd(), &mut buf), None, "EOF");
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(reader.read(file.as_raw_fd(), &mut buf), None, "ENOTSOCK");
    }
}
