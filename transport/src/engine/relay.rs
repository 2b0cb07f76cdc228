//! Relaying between two kernel stream sockets, byte for byte: the shim's connection whose app
//! fd was already swapped when the peer turned out to stay on TCP (the app's socketpair end on
//! one side, the kept TCP socket on the other), and every shimmed connection's first bytes,
//! which go over TCP at once while its stream is set up beside it ([`Pipes`], held by the
//! stream until both directions moved: docs/shim-protocol.md, "The move").
//!
//! Each direction has one buffer and one reader and writer over ordered streams, so bytes can
//! be neither reordered nor duplicated. EOF on one side becomes `shutdown(SHUT_WR)` on the other
//! once the buffer is written out; an error on either side tears both down (the TCP side with an
//! RST).
//!
//! A direction that moves to the stream stops reading its source at a byte count
//! ([`Pipes::stop_up`], [`Pipes::stop_down_at`]) and writes out what it holds; the connecting
//! side's proof goes out behind it ([`Pipes::inject_up`]), and the accepting side finds it in
//! the bytes from the TCP side ([`super::proof::Scan`]).
//!
//! A relay that an accepting side starts after it sent CLAIM and gave up waiting for the proof
//! is *guarded* ([`Relay::guarded`]): if the bytes from the TCP side bring that CLAIM's secret,
//! the client moved to the stream after all (its proof came late), and what follows is not the
//! app's: the relay fails (both sides reset) instead of handing it on. Bytes that are the
//! secret's start wait for the rest, at most until the guard's deadline.
//!
//! The app's abortive close (`SO_LINGER {1, 0}`, which the hooks set on the kept socket too)
//! resets the far side once the bytes before it are written, as TCP sends an RST behind them;
//! a far side reset after its FIN (an app that wrote to a peer that had closed) ends the relay
//! at once, so the app's next write fails as TCP's would.
//!
//! Urgent data (`MSG_OOB`) is relayed as urgent: both sides read it inline (`SO_OOBINLINE`),
//! and a read never crosses the mark (TCP and `AF_UNIX` both end a read there), so a side at
//! its mark (`SIOCATMARK`) gives the urgent byte alone; it is written to the other side with
//! `MSG_OOB` at the same place in the stream. The look comes before every read but the first
//! after an event of a side read empty before that reported no urgent data (`EPOLLPRI`): bytes
//! there before the event are ahead of any mark, and an urgent byte that came after it brings
//! an event of its own (two system calls fewer for each message relayed). A byte that arrives
//! between the look (or that event) and the read of an empty side is relayed inline (not
//! lost).

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::early::EarlyWrites;
use super::proof::{Found, Scan};
use crate::fd;
use crate::rdma::unread_by_peer;
use crate::wire::{SECRET_LEN, Secret};

const BUFFER: usize = 64 * 1024;

/// One direction.
#[derive(Debug)]
struct Direction {
    /// `BUFFER` bytes for the source's, and room behind them for the proof.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
    done: bool,
    /// The source was closed with a reset (see [`Toward::reset_if_closed`]).
    reset: bool,
    /// Bytes written to the destination.
    moved: u64,
    /// Bytes read from the source.
    taken: u64,
    /// Where in `buf` the urgent byte not written yet is (only the latest, as TCP keeps one).
    urgent: Option<usize>,
    /// The source is read no further than this many bytes in all (the direction moves to the
    /// stream there).
    stop: Option<u64>,
    /// The source's EOF is not passed on while set (it goes the way the move says).
    hold_eof: bool,
    /// The bytes from the source are searched for the proof.
    scan: Option<Scan>,
    /// The search found the proof: the source's bytes before it are all that come this way.
    found: bool,
}

impl Direction {
    /// The app's thread sent `n` bytes itself, ahead of any it writes to the source later
    /// ([`EarlyWrites`]): counted as read and written.
    fn absorb(&mut self, n: u64) {
        self.taken += n;
        self.moved += n;
    }

    /// `n` buffered bytes were written out.
    fn took(&mut self, n: usize) {
        self.start += n;
        self.moved += n as u64;
    }

    fn new() -> Direction {
        Direction {
            buf: vec![0; BUFFER + SECRET_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            done: false,
            reset: false,
            moved: 0,
            taken: 0,
            urgent: None,
            stop: None,
            hold_eof: false,
            scan: None,
            found: false,
        }
    }

    /// Nothing read is left to write.
    fn drained(&self) -> bool {
        self.start == self.end
    }

    /// The source's bytes written out: an injected proof is not the source's, and comes
    /// after them.
    fn app_moved(&self) -> u64 {
        self.moved.min(self.taken)
    }

    /// Bytes that may be read now (`BUFFER` at most).
    fn room(&self) -> usize {
        let by_stop = self
            .stop
            .map_or(usize::MAX, |s| s.saturating_sub(self.taken) as usize);
        BUFFER.saturating_sub(self.end).min(by_stop)
    }

    /// Bytes that wait for the proof's search.
    fn held(&self) -> usize {
        self.scan.as_ref().map_or(0, Scan::held)
    }

    /// Searches the bytes read since `before` (with those held) for the proof.
    fn search(&mut self, before: usize) -> io::Result<()> {
        let Some(scan) = &mut self.scan else {
            return Ok(());
        };
        let from = before - scan.held();
        match scan.feed(&self.buf[from..self.end]) {
            Found::No => {
                if self.urgent.is_some_and(|u| u + scan.held() >= self.end) {
                    scan.release();
                }
                Ok(())
            }
            Found::At(at) => {
                let at = from + at;
                if scan.guard_until().is_some() {
                    return Err(io::Error::other(
                        "the client moved to the stream after its proof was given up on",
                    ));
                }
                if at + SECRET_LEN != self.end || self.urgent.is_some_and(|u| u >= at) {
                    return Err(io::Error::other(
                        "bytes behind the proof on the TCP connection",
                    ));
                }
                // The secret is not the app's, and the client's bytes go on the stream after it.
                self.end = at;
                self.scan = None;
                self.stop = Some(self.taken);
                self.found = true;
                Ok(())
            }
        }
    }
}

/// Readiness of one fd, edge-triggered: set by epoll events, cleared by `EAGAIN`.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Ready {
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// An urgent byte may be ahead: the source reported one (`EPOLLPRI`), its readiness is
    /// unknown, or the last read filled the room (the next may start at a mark). Until a read
    /// finds the source empty, each read looks for the mark first (see [`pass`]).
    pub(super) urgent: bool,
}

impl Ready {
    /// Unknown readiness: try both ways once.
    pub(super) fn unknown() -> Ready {
        Ready {
            readable: true,
            writable: true,
            urgent: true,
        }
    }

    /// What an event of the source said (`urgent`: `EPOLLPRI`), added.
    pub(super) fn note(&mut self, readable: bool, writable: bool, urgent: bool) {
        self.readable |= readable;
        self.writable |= writable;
        self.urgent |= urgent;
    }
}

/// The two directions between a local side and a far side, without the fds (see the module
/// docs): a [`Relay`]'s, or a stream's before its move.
#[derive(Debug)]
pub(super) struct Pipes {
    /// Local -> far.
    up: Direction,
    /// Far -> local.
    down: Direction,
    /// Stepped at least once ([`Relay::stepped`]).
    stepped: bool,
    /// The app's receive low-water mark ([`Relay::set_low_water`]).
    low_water: usize,
    /// The local side is an `AF_UNIX` socket (the shim's socketpair; [`Toward::urgent_in_one`]).
    local_is_unix: bool,
    /// Set while bytes and the urgent byte behind them are written to the local side
    /// ([`Pipes::tell_urgent_writes`]).
    gate: Option<Arc<AtomicBool>>,
    /// The app's own writes to the far side before the local side's move, while open.
    early: Option<Arc<EarlyWrites>>,
}

impl Drop for Pipes {
    fn drop(&mut self) {
        if let Some(early) = self.early.take() {
            early.close();
        }
    }
}

/// How a relay step ended.
#[derive(Debug)]
pub(super) enum Step {
    /// Waiting for readiness.
    Idle,
    /// Both directions finished.
    Finished,
    /// One side failed: both were torn down.
    Failed(io::Error),
}

impl Pipes {
    /// Pipes between `local`, which reads urgent bytes inline already (`SO_OOBINLINE`: the
    /// stream's attach sets it, [`Relay::new`] for its own), and `far`.
    pub(super) fn new(local: BorrowedFd<'_>, far: BorrowedFd<'_>) -> Pipes {
        // Urgent bytes are read inline and found at the mark (see the module docs).
        let _ = fd::set_urgent_inline(far, true);
        Pipes {
            up: Direction::new(),
            down: Direction::new(),
            stepped: false,
            low_water: 1,
            local_is_unix: fd::is_local_socket(local),
            gate: None,
            early: None,
        }
    }

    /// Until the local side's move, the app's thread may send its bytes on `far` itself,
    /// through `early` ([`EarlyWrites`]): this relay publishes what it holds of them there.
    pub(super) fn let_app_write(&mut self, early: &Arc<EarlyWrites>, far: &Arc<OwnedFd>) {
        if self.up.stop.is_none() && self.early.is_none() {
            early.open(far);
            self.early = Some(Arc::clone(early));
        }
    }

    /// Closes the app's way to the far side (see [`Pipes::let_app_write`]) and counts what it
    /// sent.
    fn end_app_writes(&mut self) {
        if let Some(early) = self.early.take() {
            let sent = early.close_and_take();
            self.up.absorb(sent);
        }
    }

    /// Sets `gate` while a write of bytes and the urgent byte behind them to the local side is
    /// under way, for an app that asks whether it is at the mark
    /// ([`super::shared::ConnShared::wait_urgent_written`]). Kept once given.
    pub(super) fn tell_urgent_writes(&mut self, gate: &Arc<AtomicBool>) {
        if self.gate.is_none() {
            self.gate = Some(Arc::clone(gate));
        }
    }

    /// The connecting side before its move: the app's EOF waits for the move (a proof cannot
    /// follow a FIN, and the stream carries it if the move comes).
    pub(super) fn hold_up_eof(&mut self) {
        self.up.hold_eof = true;
    }

    /// Before the peer's move: the far side's EOF waits. Where the peer moves, its FIN comes on
    /// the stream (an EOF on TCP there is its engine letting go of the socket, which may come
    /// before the stream's word of the move); where it does not, the relay that follows passes
    /// it on ([`Pipes::resume`]).
    pub(super) fn hold_down_eof(&mut self) {
        self.down.hold_eof = true;
    }

    /// The accepting side before its move: the far side's bytes are searched for `secret`.
    pub(super) fn scan_down(&mut self, scan: Scan) {
        self.down.scan = Some(scan);
    }

    /// The proof was found in the far side's bytes (and taken out of them).
    pub(super) fn proof_found(&self) -> bool {
        self.down.found
    }

    /// The local side's bytes move to the stream from here: the local side is read no
    /// further; what was read is written out. The count of bytes read from it.
    pub(super) fn stop_up(&mut self) -> u64 {
        self.end_app_writes();
        self.up.stop = Some(self.up.taken);
        self.up.taken
    }

    /// Writes `bytes` (the proof) to the far side after what was read from the local side,
    /// once the local side is read no further ([`Pipes::stop_up`]).
    pub(super) fn inject_up(&mut self, bytes: &[u8]) {
        let d = &mut self.up;
        if d.end + bytes.len() > d.buf.len() {
            d.buf.copy_within(d.start..d.end, 0);
            d.end -= d.start;
            d.urgent = d.urgent.map(|u| u - d.start);
            d.start = 0;
        }
        // Reads stop BUFFER bytes in, so the room behind them holds the proof.
        if let Some(room) = d.buf.get_mut(d.end..d.end + bytes.len()) {
            room.copy_from_slice(bytes);
            d.end += bytes.len();
        }
    }

    /// The far side's bytes move to the stream after `count` of them: an Err when more came
    /// already (a peer that broke the protocol).
    pub(super) fn stop_down_at(&mut self, count: u64) -> io::Result<()> {
        if self.down.taken > count {
            return Err(io::Error::other(format!(
                "{} bytes came on TCP before the move, {count} announced",
                self.down.taken
            )));
        }
        self.down.stop = Some(count);
        Ok(())
    }

    /// The local side is read no further here: its next bytes go on the stream.
    pub(super) fn up_stopped(&self) -> bool {
        self.up.stop.is_some()
    }

    /// The local side's bytes go on the stream now (it is read no further, everything read
    /// was written out, and no FIN of it is still to write).
    pub(super) fn up_moved(&self) -> bool {
        let d = &self.up;
        d.stop.is_some() && d.drained() && (!d.eof || d.done || d.hold_eof)
    }

    /// The far side's bytes come from the stream now (all those before the move were written
    /// to the local side).
    pub(super) fn down_moved(&self) -> bool {
        let d = &self.down;
        d.stop == Some(d.taken) && d.drained()
    }

    /// The local side ended (read to its EOF).
    pub(super) fn up_eof(&self) -> bool {
        self.up.eof
    }

    /// The far side ended (read to its EOF).
    pub(super) fn down_eof(&self) -> bool {
        self.down.eof
    }

    /// The far side is still read here (not yet at its move).
    pub(super) fn reads_far(&self) -> bool {
        !self.down.eof && self.down.stop != Some(self.down.taken)
    }

    /// Goes on as a plain relay, as TCP: every direction read to its end, the app's EOF
    /// passed on, and a search for the proof kept only as a guard until `guard_until`.
    pub(super) fn resume(&mut self, guard_until: Instant) {
        self.end_app_writes();
        for d in [&mut self.up, &mut self.down] {
            d.stop = None;
            d.hold_eof = false;
            d.scan = d.scan.take().map(|s| s.into_guard(guard_until));
        }
    }

    /// The local side's bytes and the far side's bytes written out (not the proof).
    pub(super) fn moved(&self) -> (u64, u64) {
        (self.up.app_moved(), self.down.app_moved())
    }

    /// Moves what it can without blocking. `draining`: a local side with nothing to read
    /// counts as EOF (the process is exiting).
    pub(super) fn step(
        &mut self,
        local: BorrowedFd<'_>,
        far: BorrowedFd<'_>,
        local_ready: &mut Ready,
        far_ready: &mut Ready,
        draining: bool,
    ) -> Step {
        self.stepped = true;
        if let Some(scan) = &mut self.down.scan
            && scan.guard_until().is_some_and(|t| t <= Instant::now())
        {
            // A guard's end: bytes held for it go on.
            self.down.scan = None;
        }
        if self.down.eof && far_ready.readable {
            // After its FIN the far side is not read: a reset (the local side wrote to a peer
            // that had closed) ends the relay now, not at the next write.
            far_ready.readable = false;
            if let Some(e) = fd::take_error(far) {
                return Step::Failed(e);
            }
        }
        loop {
            // The app's own sends and this pass's reads of its end are ordered by the gate's
            // lock ([`EarlyWrites`]).
            let mut held = self.early.as_deref().map(EarlyWrites::hold);
            if let Some(h) = &mut held {
                self.up.absorb(h.take_sent());
            }
            let a = match pass(
                &mut self.up,
                local,
                local_ready,
                far,
                far_ready,
                Toward {
                    draining,
                    low_water: 1,
                    urgent_in_one: false,
                    reset_if_closed: true,
                    gate: None,
                },
            ) {
                Ok(p) => p,
                Err(e) => return Step::Failed(e),
            };
            if let Some(mut h) = held {
                h.set_relay_holds(!self.up.drained());
            }
            let b = match pass(
                &mut self.down,
                far,
                far_ready,
                local,
                local_ready,
                Toward {
                    draining: false,
                    low_water: self.low_water,
                    urgent_in_one: self.local_is_unix,
                    reset_if_closed: false,
                    gate: self.gate.as_deref(),
                },
            ) {
                Ok(p) => p,
                Err(e) => return Step::Failed(e),
            };
            if self.up.reset {
                // The app's abortive close: an RST behind the bytes, no FIN (the far side is
                // closed with a zero linger when the engine lets go of it).
                fd::reset(far);
                return Step::Failed(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "the app closed with a reset (SO_LINGER 0)",
                ));
            }
            if self.up.done && self.down.done {
                return Step::Finished;
            }
            if !a && !b {
                return Step::Idle;
            }
        }
    }
}

/// A relay between `local` and `far`.
#[derive(Debug)]
pub(super) struct Relay {
    pub(super) local: OwnedFd,
    pub(super) far: Arc<OwnedFd>,
    pub(super) local_ready: Ready,
    pub(super) far_ready: Ready,
    pipes: Pipes,
}

impl Relay {
    pub(super) fn new(local: OwnedFd, far: Arc<OwnedFd>) -> Relay {
        let _ = fd::set_urgent_inline(local.as_fd(), true);
        let pipes = Pipes::new(local.as_fd(), far.as_fd());
        Relay::resume(local, far, pipes)
    }

    /// A relay whose far side's bytes must not bring `secret` (see the module docs); bytes
    /// that are its start wait for the rest until `until`.
    pub(super) fn guarded(
        local: OwnedFd,
        far: Arc<OwnedFd>,
        secret: Secret,
        until: Instant,
    ) -> Relay {
        let mut relay = Relay::new(local, far);
        relay.pipes.scan_down(Scan::guard(secret, until));
        relay
    }

    /// A relay that takes over `pipes` (a stream's first bytes, relayed before its move) with
    /// what they hold. Readiness is unknown: both sides are tried once.
    pub(super) fn resume(local: OwnedFd, far: Arc<OwnedFd>, pipes: Pipes) -> Relay {
        Relay {
            local,
            far,
            local_ready: Ready::unknown(),
            far_ready: Ready::unknown(),
            pipes,
        }
    }

    /// The app's `SO_RCVLOWAT` on its end: fewer bytes from the far side than this (at most
    /// half the buffer) wait here while the app's end holds none unread, as TCP keeps its
    /// socket unreadable below the mark (a socketpair end's `poll` ignores it).
    pub(super) fn set_low_water(&mut self, bytes: usize) {
        self.pipes.low_water = bytes.max(1);
    }

    /// See [`Pipes::tell_urgent_writes`].
    pub(super) fn tell_urgent_writes(&mut self, gate: &Arc<AtomicBool>) {
        self.pipes.tell_urgent_writes(gate);
    }

    /// Whether the relay was stepped since it started. One that was not must be stepped
    /// without waiting for an event: bytes written before it started (a server's banner)
    /// raise none.
    pub(super) fn stepped(&self) -> bool {
        self.pipes.stepped
    }

    /// When the guard stops waiting for the rest of the secret's start (the engine steps the
    /// relay then).
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.pipes.down.scan.as_ref().and_then(Scan::guard_until)
    }

    /// Bytes local -> far and far -> local.
    pub(super) fn moved(&self) -> (u64, u64) {
        self.pipes.moved()
    }

    /// True while bytes the local side wrote are still buffered or unread (for the exit flush).
    pub(super) fn unflushed(&self) -> bool {
        !self.pipes.up.done
    }

    /// The far side's FIN came (all of its bytes were read): a failure after it is not a reset
    /// of the local side's direction, as for TCP after the peer's FIN.
    pub(super) fn far_finished(&self) -> bool {
        self.pipes.down.eof
    }

    /// Moves what it can without blocking. `draining`: a local side with nothing to read
    /// counts as EOF (the process is exiting).
    pub(super) fn step(&mut self, draining: bool) -> Step {
        match self.pipes.step(
            self.local.as_fd(),
            self.far.as_fd(),
            &mut self.local_ready,
            &mut self.far_ready,
            draining,
        ) {
            // The app's abortive close reset the far side already: no FIN before the RST.
            Step::Failed(e) if self.pipes.up.reset => Step::Failed(e),
            Step::Failed(e) => self.fail(e),
            other => other,
        }
    }

    /// The far side is reset at once; the local side is shut down by the caller, after it
    /// reported the failure (`StreamConn::step_relay`).
    fn fail(&mut self, e: io::Error) -> Step {
        fd::reset(self.far.as_fd());
        fd::shutdown_quietly(self.far.as_fd(), Shutdown::Both);
        Step::Failed(e)
    }
}

/// How one direction's pass treats its sides.
struct Toward<'a> {
    /// The source with nothing to read counts as EOF (the process is exiting).
    draining: bool,
    /// The reader's mark on the destination ([`Relay::set_low_water`], 1: none).
    low_water: usize,
    /// The destination is an `AF_UNIX` socket: the bytes before an urgent byte and the byte
    /// go in one send, so its reader never finds the first without the mark. (A partial send
    /// to it takes no urgent byte; TCP's could mark a byte before it, so TCP gets two sends.)
    urgent_in_one: bool,
    /// At the source's EOF, a source closed (not only shut for writing) toward a destination
    /// set to reset on close is an abortive close: the destination is reset, not shut down.
    reset_if_closed: bool,
    /// Set while a write of bytes and the urgent byte behind them is under way.
    gate: Option<&'a AtomicBool>,
}

/// One direction's pass: read what fits, write what is buffered, half-close after EOF. True
/// if anything moved.
fn pass(
    d: &mut Direction,
    src: BorrowedFd<'_>,
    src_ready: &mut Ready,
    dst: BorrowedFd<'_>,
    dst_ready: &mut Ready,
    toward: Toward<'_>,
) -> io::Result<bool> {
    let Toward {
        draining,
        low_water,
        urgent_in_one,
        reset_if_closed,
        gate,
    } = toward;
    let mut progressed = false;
    let room = d.room();
    if !d.eof && room > 0 && src_ready.readable {
        // At the mark the read gives the urgent byte alone (see the module docs). The first
        // read after an event that said nothing of urgent data (`EPOLLPRI`), of a source read
        // empty before, skips the look: its bytes came before any mark (a read stops at one:
        // TCP and AF_UNIX both end it there).
        let look = src_ready.urgent;
        let urgent = look && fd::at_mark(src);
        let want = d.end + if urgent { 1 } else { room };
        let before = d.end;
        match fd::read(src, &mut d.buf[d.end..want]) {
            Ok(0) => {
                d.eof = true;
                progressed = true;
                if let Some(scan) = &mut d.scan {
                    scan.release();
                }
            }
            Ok(n) => {
                if urgent {
                    d.urgent = Some(d.end);
                }
                d.end += n;
                d.taken += n as u64;
                progressed = true;
                // The read may have stopped at a mark whose byte came after the source's
                // event: the next read looks first (it finds the source empty, its EOF or
                // that byte).
                src_ready.urgent = true;
                // An urgent byte right behind these is taken now, so that one send writes
                // them and it (see below): the app never finds the bytes without the mark.
                if look && !urgent && d.room() > 0 && fd::at_mark(src) {
                    let at = d.end;
                    if let Ok(1) = fd::read(src, &mut d.buf[at..at + 1]) {
                        d.urgent = Some(at);
                        d.end += 1;
                        d.taken += 1;
                    }
                }
                d.search(before)?;
            }
            Err(e) if fd::transient(&e) => {
                src_ready.readable = false;
                // Empty: an urgent byte from now on comes with its own event.
                src_ready.urgent = false;
                if draining {
                    d.eof = true;
                    progressed = true;
                }
            }
            Err(e) => return Err(e),
        }
    }
    // What may be written: not the bytes held for the proof's search.
    let end = d.end - d.held();
    // Below the reader's mark, with nothing unread on its side and more to come, bytes wait.
    let held = low_water > 1
        && !d.eof
        && d.urgent.is_none()
        && end - d.start < low_water.min(BUFFER / 2)
        && unread_by_peer(dst.as_raw_fd()).ok() == Some(0);
    if d.start < end && dst_ready.writable && !held {
        // The bytes before the urgent one, then the urgent byte (`MSG_OOB`): in one send to an
        // AF_UNIX side, in two to TCP, where a partial send of both in one call would mark a
        // byte before it.
        let urgent = d.urgent.filter(|&u| u >= d.start);
        let before = d.moved;
        let mut wrote = Ok(());
        let upto = urgent.unwrap_or(end);
        if let Some(u) = urgent
            && urgent_in_one
        {
            if let Some(g) = gate {
                g.store(true, Ordering::Release);
            }
            wrote = fd::write_urgent(dst, &d.buf[d.start..=u]).map(|n| {
                if n == u + 1 - d.start {
                    d.urgent = None;
                }
                d.took(n);
            });
            if let Some(g) = gate {
                g.store(false, Ordering::Release);
            }
        } else if d.start < upto {
            wrote = fd::write(dst, &d.buf[d.start..upto]).map(|n| d.took(n));
        }
        if wrote.is_ok() && !urgent_in_one && urgent == Some(d.start) {
            wrote = fd::write_urgent(dst, &d.buf[d.start..=d.start]).map(|n| {
                if n > 0 {
                    d.urgent = None;
                }
                d.took(n);
            });
        }
        match wrote {
            Ok(()) => progressed |= d.moved > before,
            Err(e) if fd::transient(&e) => dst_ready.writable = false,
            Err(e) => return Err(e),
        }
        if d.start == d.end {
            d.start = 0;
            d.end = 0;
            d.urgent = None;
        }
    }
    if d.end >= BUFFER && d.start > 0 {
        d.buf.copy_within(d.start..d.end, 0);
        d.end -= d.start;
        d.urgent = d.urgent.map(|u| u - d.start);
        d.start = 0;
    }
    if d.eof && d.start == d.end && !d.done {
        if reset_if_closed && fd::resets_on_close(dst) && fd::peer_closed(src) {
            d.reset = true;
            d.done = true;
            return Ok(true);
        }
        if d.hold_eof {
            return Ok(progressed);
        }
        fd::shutdown_quietly(dst, Shutdown::Write);
        d.done = true;
        progressed = true;
    }
    Ok(progressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// A relay between a fresh app side and a fresh far side (guarded when `guard` says so),
    /// and the app's and the far peer's ends.
    fn relay(guard: Option<(Secret, Instant)>) -> (Relay, UnixStream, UnixStream) {
        let (app, local) = UnixStream::pair().unwrap();
        let (far, peer) = UnixStream::pair().unwrap();
        local.set_nonblocking(true).unwrap();
        far.set_nonblocking(true).unwrap();
        let far = Arc::new(far.into());
        let r = match guard {
            Some((secret, until)) => Relay::guarded(local.into(), far, secret, until),
            None => Relay::new(local.into(), far),
        };
        (r, app, peer)
    }

    /// Sends "ab", urgent "!", "cd" on `from`; `to` must then hold "ab" before the mark, the
    /// urgent byte out of band, and "cd" after it.
    fn urgent_crosses(r: &mut Relay, from: &UnixStream, to: &mut UnixStream) {
        use nix::sys::socket::{MsgFlags, recv, send};
        let fd = from.as_raw_fd();
        send(fd, b"ab", MsgFlags::empty()).unwrap();
        send(fd, b"!", MsgFlags::MSG_OOB).unwrap();
        send(fd, b"cd", MsgFlags::empty()).unwrap();
        step_until(r, |_, _| fd::urgent_pending(to.as_fd()));
        step_until(r, |_, r| r.moved().0 + r.moved().1 >= 5);
        assert!(fd::urgent_pending(to.as_fd()), "exceptional readiness");
        let mut before = [0u8; 8];
        assert_eq!(to.read(&mut before).unwrap(), 2, "a read ends at the mark");
        assert_eq!(&before[..2], b"ab");
        assert!(fd::at_mark(to.as_fd()));
        let mut oob = [0u8; 1];
        let n = recv(to.as_raw_fd(), &mut oob, MsgFlags::MSG_OOB).unwrap();
        assert_eq!((n, &oob), (1, b"!"));
        let mut after = [0u8; 8];
        assert_eq!(to.read(&mut after).unwrap(), 2);
        assert_eq!(&after[..2], b"cd");
    }

    #[test]
    fn a_question_at_the_mark_waits_out_an_urgent_write_under_way() {
        // The relay's one send of "ab" and the urgent "!" is queued by AF_UNIX as two: an app
        // that read "ab" in between waits out the gate (as `SIOCATMARK` on its end does:
        // `Conn::at_mark`) and finds the mark, as TCP, which gets all three in one segment,
        // shows it. The send is stretched here to 50 ms.
        use nix::sys::socket::{MsgFlags, send};
        let shared = super::super::shared::ConnShared::connecting(None);
        let gate = Arc::clone(shared.urgent_gate());
        let (mut app, local) = UnixStream::pair().unwrap();
        gate.store(true, Ordering::Release);
        send(local.as_raw_fd(), b"ab", MsgFlags::empty()).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            send(local.as_raw_fd(), b"!", MsgFlags::MSG_OOB).unwrap();
            gate.store(false, Ordering::Release);
            local
        });
        let mut got = [0u8; 2];
        app.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ab");
        shared.wait_urgent_written(Instant::now() + std::time::Duration::from_secs(5));
        assert!(fd::at_mark(app.as_fd()), "the mark, once the write is done");
        drop(writer.join().unwrap());
    }

    #[test]
    fn urgent_data_crosses_as_urgent_both_ways() {
        let (mut r, mut app, mut peer) = relay(None);
        let gate = Arc::new(AtomicBool::new(false));
        r.tell_urgent_writes(&gate);
        urgent_crosses(&mut r, &app, &mut peer);
        urgent_crosses(&mut r, &peer, &mut app);
        assert_eq!(r.moved(), (5, 5));
        assert!(!gate.load(Ordering::Acquire), "open again after the write");
    }

    #[test]
    fn relays_both_ways_with_half_close() {
        let (mut r, mut app, mut peer) = relay(None);
        app.write_all(b"hello").unwrap();
        app.shutdown(Shutdown::Write).unwrap();
        peer.write_all(b"world").unwrap();
        drop(peer.try_clone().unwrap());
        peer.shutdown(Shutdown::Write).unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Finished));
        assert!(matches!(step, Step::Finished), "{step:?}");
        let mut got = String::new();
        app.read_to_string(&mut got).unwrap();
        assert_eq!(got, "world");
        let mut got = String::new();
        peer.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello");
        assert_eq!(r.moved(), (5, 5));
    }

    #[test]
    fn bytes_below_the_apps_low_water_mark_wait_until_it_is_reached_or_lowered() {
        let (mut r, mut app, mut peer) = relay(None);
        app.set_nonblocking(true).unwrap();
        let mut got = [0u8; 8];
        r.set_low_water(4);
        peer.write_all(b"ab").unwrap();
        step_until(&mut r, |_, _| false);
        assert!(
            app.read(&mut got).is_err(),
            "2 bytes wait below a mark of 4"
        );
        peer.write_all(b"cd").unwrap();
        step_until(&mut r, |_, r| r.moved().1 == 4);
        assert_eq!(app.read(&mut got).unwrap(), 4);
        assert_eq!(&got[..4], b"abcd");
        peer.write_all(b"e").unwrap();
        step_until(&mut r, |_, _| false);
        assert!(app.read(&mut got).is_err(), "1 byte waits");
        r.set_low_water(1);
        step_until(&mut r, |_, r| r.moved().1 == 5);
        assert_eq!(app.read(&mut got).unwrap(), 1, "a lower mark lets it go");
        peer.write_all(b"fg").unwrap();
        r.set_low_water(8);
        drop(peer.try_clone().unwrap());
        peer.shutdown(Shutdown::Write).unwrap();
        step_until(&mut r, |_, r| r.moved().1 == 7);
        assert_eq!(
            app.read(&mut got).unwrap(),
            2,
            "the far side's EOF lets it go"
        );
    }

    #[test]
    fn bytes_written_before_the_relay_started_go_at_its_first_step() {
        // A server's banner, written while the engine still waited for the client's proof:
        // it raises no event once the relay runs, so the loop steps an unstepped relay at once.
        let (mut r, mut app, mut peer) = relay(None);
        app.write_all(b"220 ready").unwrap();
        assert!(!r.stepped());
        assert!(matches!(r.step(false), Step::Idle));
        assert!(r.stepped());
        let mut got = [0u8; 9];
        peer.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"220 ready");
    }

    fn step_until(r: &mut Relay, done: impl Fn(&Step, &Relay) -> bool) -> Step {
        let mut step = Step::Idle;
        for _ in 0..20 {
            r.local_ready = Ready::unknown();
            r.far_ready = Ready::unknown();
            step = r.step(false);
            if done(&step, r) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        step
    }

    /// A relay between a fresh app side and a TCP connection, and the app's end and the TCP
    /// peer.
    fn tcp_relay() -> (Relay, UnixStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let far = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        let (app, local) = UnixStream::pair().unwrap();
        local.set_nonblocking(true).unwrap();
        far.set_nonblocking(true).unwrap();
        (Relay::new(local.into(), Arc::new(far.into())), app, peer)
    }

    /// The app's abortive close (the hooks set `SO_LINGER {1, 0}` on the kept socket too): the
    /// TCP peer reads the bytes before it, then the reset.
    #[test]
    fn an_abortive_close_resets_the_tcp_side_behind_the_bytes() {
        let (mut r, mut app, mut peer) = tcp_relay();
        app.write_all(b"last").unwrap();
        step_until(&mut r, |_, r| r.moved().0 == 4);
        fd::reset(r.far.as_fd());
        drop(app);
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        // The engine lets go of the far side after the report; the RST goes then.
        let Relay { far, .. } = r;
        drop(far);
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"last");
        let mut more = [0u8; 4];
        let e = peer.read(&mut more).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        // An orderly close is a FIN.
        let (mut r, app, mut peer) = tcp_relay();
        drop(app);
        let step = step_until(&mut r, |_, r| r.pipes.up.done);
        assert!(!matches!(step, Step::Failed(_)), "{step:?}");
        assert_eq!(peer.read(&mut more).unwrap(), 0);
    }

    /// The TCP peer closed, then the app wrote: the peer's RST ends the relay at once (a
    /// failure after the peer's FIN), so the app's next write fails as TCP's would.
    #[test]
    fn a_reset_after_the_far_fin_ends_the_relay_at_once() {
        let (mut r, mut app, peer) = tcp_relay();
        drop(peer);
        step_until(&mut r, |_, r| r.far_finished());
        app.write_all(b"x").unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert!(
            r.far_finished(),
            "after the FIN: not a reset of the app's direction"
        );
    }

    const SECRET: Secret = Secret(*b"0123456789abcdef");

    #[test]
    fn a_guarded_relay_fails_on_a_late_proof_and_hands_on_anything_else() {
        let until = Instant::now() + std::time::Duration::from_secs(10);
        // A late proof: nothing of it reaches the app, both sides fail.
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        peer.write_all(&SECRET.0).unwrap();
        peer.write_all(b"stream bytes").unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert_eq!(r.moved(), (0, 0));
        drop(r);
        let mut got = Vec::new();
        let _ = (&app).read_to_end(&mut got);
        assert!(got.is_empty(), "the app got {got:?}");

        // A TCP client: its bytes go on untouched, even when they start like the secret.
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        peer.write_all(b"0123").unwrap();
        assert!(matches!(r.step(false), Step::Idle));
        assert_eq!(r.moved(), (0, 0), "the secret's start waits for the rest");
        peer.write_all(b"-not-the-secret").unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        drop(app.try_clone().unwrap());
        app.shutdown(Shutdown::Write).unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Finished));
        assert!(matches!(step, Step::Finished), "{step:?}");
        let mut got = String::new();
        (&app).read_to_string(&mut got).unwrap();
        assert_eq!(got, "0123-not-the-secret");
    }

    #[test]
    fn a_guard_gives_up_waiting_at_its_deadline() {
        let until = Instant::now() + std::time::Duration::from_millis(30);
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        assert_eq!(r.deadline(), Some(until));
        peer.write_all(b"01").unwrap();
        assert!(matches!(r.step(false), Step::Idle));
        std::thread::sleep(std::time::Duration::from_millis(40));
        let _ = step_until(&mut r, |_, r| r.moved().1 == 2);
        assert_eq!(r.moved(), (0, 2));
        let mut got = [0u8; 2];
        (&app).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"01");
    }
}
