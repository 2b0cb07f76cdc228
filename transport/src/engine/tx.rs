//! The send half of one connection (net/smc's `smc_tx.c`): the engine's data writes from the
//! app's socketpair, control messages and probes, the signalling of work requests, and direct
//! writes, where an app thread copies its bytes straight into the send ring and posts them
//! instead of writing them into its socketpair end for the engine to read out and post.
//!
//! Its state ([`SendState`]) is private to this module: the engine and writers change it only
//! through [`Sender`]'s and [`Writer`]'s methods, which keep the invariants below. The send lock
//! comes first in the engine's lock order ([`super::lock_order`]): posting a control message
//! takes the receive lock under it, for the credit report the message carries.
//!
//! Every sent byte normally takes two copies before the device reads it: the app writes it into
//! the socketpair, and the engine reads it out into the send ring. A [`Writer`] lets the shim's
//! `write`, `send` and `sendto` hooks copy it once, from the app's buffer into the ring.
//!
//! Nothing is lost or reordered. Everything that posts on the QP (the engine's data writes from
//! the socketpair, its control messages and probes, and writers) does it under one lock, which
//! guards the send accounting ([`SendFlow`], the send-queue count). A writer copies only when
//! the app's end of the socketpair holds no byte the engine has not read yet (`SIOCOUTQ` is
//! zero, looked at under the lock, and the engine reads and posts under the same lock): every
//! byte the app wrote before went out first. It *claims* the next window of the ring under the
//! lock, copies outside it (the engine never waits for a copy), and posts under the lock again.
//! While a claim is open, the engine posts no data (its write would land after the claimed
//! range and announce it to the peer before it was written): it notes that it waited, and the
//! writer wakes it after posting. Control messages carry no stream bytes and go out meanwhile.
//!
//! A writer copies only while the engine allows it ([`Sender::set_writers`]): the stream runs
//! attached with its handshake done and the local side has not ended. The engine turns it off
//! when the stream fails or ends and before the QP is destroyed, under the same lock, so no
//! writer posts on a QP that is gone, and the region of a connection whose writer was copying
//! at the end serves no other connection (it stays mapped while the writer holds it). A writer
//! that finds it off after its copy posts nothing and says so: its caller writes the same bytes
//! into the socketpair, as every other way of writing (`writev`, `sendmsg`, a child after
//! `fork`) does.
//!
//! A blocking write that finds no room (the peer's ring or our send ring full, or the send queue)
//! *waits* for it, when the rings are large enough ([`WAIT_MIN_RING`]): it counts itself in
//! [`SendState`] and sleeps on a condition variable of the send lock, which the engine signals,
//! under the lock, after every credit and signaled completion and when it turns direct writes
//! off; so a wake-up cannot fall between the writer's look and its sleep, and a writer never
//! waits on a stream that ended. The wait is bounded by the caller's deadline; after it the
//! caller writes the rest into the socketpair, as a write that may not wait does at once.
//!
//! *Urgent data* (TCP's `MSG_OOB`) reaches the engine through the socketpair, which carries one
//! urgent byte with TCP's semantics; the engine's end reads it inline (`SO_OOBINLINE`), so none
//! is ever dropped. The shim's send hooks send it with [`Writer::send_urgent`], under the send
//! lock, after telling the engine to look for the mark: before each read the engine asks
//! whether the next byte is the urgent one (`SIOCATMARK`; a read never crosses the mark, the
//! kernel ends it there), and if so reads it alone and posts an URGENT control message with
//! its position, then the byte, as the next data write; once no urgent byte is pending
//! (`POLLPRI`) it stops looking. Since the app's urgent send and the engine's look-and-read
//! both happen under the lock, no urgent byte can arrive between the look and the read. One
//! sent past the hooks (a program making the system call itself) travels as an ordinary byte.
//!
//! Not every send work request asks for a completion: each completion costs the device a CQ
//! entry and the engine a wake-up. A request goes signaled when its completion matters (FIN, a
//! probe), or when, without it, half the send queue, half of what may be in flight (the send
//! ring, at most [`super::MAX_UNACKED`]) or half the control
//! slots would be held by requests no signaled one after them would report. Completions come in
//! order, so a signaled request's completion reports every request before it
//! ([`SendState::signaled_done`]); and once every signaled request completed, less than half of
//! each resource is held, which leaves room for the next request: no window waits for a
//! completion that never comes.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Weak};
use std::time::Instant;

use super::cdc::Controls;
use super::early::EarlyWrites;
use super::lock_order::{Guard, Level, OrderedMutex};
use super::relay::Ready;
use super::rx::Receiver;
use super::wr::{Post, TAG_CONTROL, TAG_DATA, TAG_PROBE};
use super::{Command, Inner, SLOT};
use crate::fd;
use crate::flow::{SendFlow, Window};
use crate::rdma::{Local, Region, unread_by_peer};
use crate::wire::{Control, ControlKind, RingInfo};
use nix::sys::socket::MsgFlags;

/// The smallest in-flight limit (the smaller ring) at which a writer waits for room instead of
/// writing the rest into the socketpair. With smaller rings the socketpair's buffer is a large
/// part of what the stream can hold, and waiting on the ring alone measured slower on
/// Soft-RoCE; with 2 MiB rings waiting measured faster (`docs/benchmarks.md`, "2 MiB rings,
/// and waiting for room").
pub const WAIT_MIN_RING: u64 = 2 << 20;

/// The send side of one connection, shared by the engine and its [`Writer`]s.
pub(super) struct Sender {
    qp: Arc<dyn Post>,
    /// The connection's region; the send ring starts at `ring_off`, the control slots we send
    /// from at `control_off` (one per send queue entry).
    region: Arc<Region>,
    ring_off: usize,
    control_off: usize,
    lkey: u32,
    state: OrderedMutex<SendState>,
    /// Told when the window may have grown or direct writes ended, while writers wait.
    room: Condvar,
}

/// What the completion of a signaled work request reports: every request up to it is done.
#[derive(Debug, Clone, Copy)]
struct Signaled {
    /// Requests it stands for (itself and the unsignaled ones before it).
    weight: u32,
    /// Data bytes posted up to it ([`SendFlow::sent`]).
    sent: u64,
    /// Control messages posted up to it.
    controls: u64,
}

/// A send work request, for the accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// A data write of this many bytes.
    Data(usize),
    /// A control message (it uses one of the peer's receives).
    Control,
    /// A liveness probe.
    Probe,
}

/// What the lock guards.
struct SendState {
    /// The flow, once the peer's ring is known.
    flow: Option<SendFlow>,
    peer: RingInfo,
    /// The registration data writes go from (the send ring in use).
    data_lkey: u32,
    /// Send work requests posted and not completed, of `sq`.
    sq_used: u32,
    sq: u32,
    /// Writers may post (see the module docs).
    writers_on: bool,
    /// A writer copies into a claimed window.
    claimed: bool,
    /// The engine left the socketpair unread while a claim was open.
    engine_waits: bool,
    /// Writers waiting for room in the window ([`Writer::write`]).
    waiting: u32,
    /// Bytes writers posted that the engine has not counted yet.
    written_by_app: u64,
    /// The app may have sent an urgent byte into the socketpair ([`Writer::send_urgent`]):
    /// the engine looks for the mark before each read until none is pending.
    urgent: bool,
    /// Control messages: queued, posted (their count is the next one's sequence number) and
    /// completed.
    controls: Controls,
    /// Signaled requests not completed yet, oldest first.
    signaled: VecDeque<Signaled>,
    /// Unsignaled requests posted since the last signaled one.
    unsignaled: u32,
    /// Data bytes and control messages posted up to the last signaled request.
    mark_sent: u64,
    mark_controls: u64,
    /// Half of what may be in flight (the send ring, at most `max_unacked`).
    half_in_flight: u64,
}

impl SendState {
    fn new(sq: u32, in_flight: u64) -> SendState {
        SendState {
            flow: None,
            peer: RingInfo::default(),
            data_lkey: 0,
            sq_used: 0,
            sq,
            writers_on: false,
            claimed: false,
            engine_waits: false,
            waiting: 0,
            written_by_app: 0,
            urgent: false,
            controls: Controls::default(),
            signaled: VecDeque::new(),
            unsignaled: 0,
            mark_sent: 0,
            mark_controls: 0,
            half_in_flight: half(in_flight),
        }
    }

    /// Data bytes posted so far.
    fn sent(&self) -> u64 {
        self.flow.as_ref().map_or(0, SendFlow::sent)
    }

    /// Data bytes and control messages posted once `request` is.
    fn after(&self, request: Request) -> (u64, u64) {
        let controls = self.controls.posted();
        match request {
            Request::Data(n) => (self.sent() + n as u64, controls),
            Request::Control => (self.sent(), controls + 1),
            Request::Probe => (self.sent(), controls),
        }
    }

    /// Whether `request`, posted next, goes signaled (see the module docs): `must` when its
    /// own completion matters.
    fn signal_next(&self, request: Request, must: bool) -> bool {
        let half_sq = (self.sq / 2).max(1);
        let (sent, controls) = self.after(request);
        must || self.unsignaled + 1 >= half_sq
            || sent - self.mark_sent >= self.half_in_flight
            || controls - self.mark_controls >= u64::from(half_sq)
    }

    /// `request` was posted, `signaled` or not: the flow, the counts and the send queue take
    /// it (a control message's own count is the caller's: [`Controls::posted_one`]).
    fn note_posted(&mut self, signaled: bool, request: Request) {
        let (sent, controls) = self.after(request);
        if let Some(flow) = &mut self.flow {
            match request {
                Request::Data(n) => {
                    flow.posted_data(n);
                }
                Request::Control => flow.posted_control(),
                Request::Probe => {}
            }
        }
        self.sq_used += 1;
        if !signaled {
            self.unsignaled += 1;
            return;
        }
        self.signaled.push_back(Signaled {
            weight: self.unsignaled + 1,
            sent,
            controls,
        });
        self.unsignaled = 0;
        self.mark_sent = sent;
        self.mark_controls = controls;
    }

    /// The oldest signaled request completed, and with it every request before it: their send
    /// queue entries, send ring bytes and control slots are free. False when no signaled
    /// request was outstanding.
    fn signaled_done(&mut self) -> bool {
        let Some(done) = self.signaled.pop_front() else {
            return false;
        };
        self.sq_used = self.sq_used.saturating_sub(done.weight);
        if let Some(flow) = &mut self.flow {
            flow.completed(done.sent);
        }
        self.controls.completed_up_to(done.controls);
        true
    }

    /// The engine may post data from the socketpair now: no writer has a window claimed. If
    /// one has, the writer wakes the engine once it posted.
    fn engine_may_post(&mut self) -> bool {
        if self.claimed {
            self.engine_waits = true;
        }
        !self.claimed
    }

    /// Room for one more send work request.
    fn has_room(&self) -> bool {
        self.sq_used < self.sq
    }
}

impl Sender {
    /// The send ring is `ring` bytes at `ring_off` of `region`, of which at most `max_unacked`
    /// are posted and not completed; control messages go from `sq` slots at `control_off`.
    pub(super) fn new(
        qp: Arc<dyn Post>,
        region: Arc<Region>,
        (ring_off, ring): (usize, usize),
        control_off: usize,
        lkey: u32,
        sq: u32,
        max_unacked: u64,
    ) -> Sender {
        let mut state = SendState::new(sq, (ring as u64).min(max_unacked));
        state.data_lkey = lkey;
        Sender {
            qp,
            region,
            ring_off,
            control_off,
            lkey,
            state: OrderedMutex::new(Level::Send, state),
            room: Condvar::new(),
        }
    }

    /// Moves our writes to the ring the peer offered (`peer`) and, with `local` (its start from
    /// the send ring's, its size and its registration's lkey), our own to another send ring,
    /// from the next byte on: posts SWITCH with that position, the first byte of the next
    /// write (see [`SendFlow::switch`]). None when it cannot now (a writer has a window
    /// claimed, or no room for the message): the caller tries again later.
    pub(super) fn switch(
        &self,
        recv: &Receiver,
        peer: RingInfo,
        local: Option<(usize, usize, u32)>,
    ) -> Option<u64> {
        let mut state = self.lock();
        if state.claimed
            || state.flow.is_none()
            || !state.has_room()
            || state.controls.in_flight() >= u64::from(state.sq)
        {
            return None;
        }
        let position = state.sent();
        self.post_control(&mut state, recv, ControlKind::Switch(position))
            .ok()?;
        let flow = state.flow.as_mut()?;
        let at = flow.switch(
            Some(peer.size()),
            local.map(|(start, size, _)| (start as u64, size as u64)),
        );
        state.half_in_flight = half(flow.in_flight_limit().min(flow.max_unacked()));
        state.peer = peer;
        if let Some((_, _, lkey)) = local {
            state.data_lkey = lkey;
        }
        tell_waiting(&self.room, &state);
        Some(at)
    }

    fn lock(&self) -> Guard<'_, SendState> {
        self.state.lock()
    }

    /// The peer's ring is known: data may be posted from now on, within `flow`.
    pub(super) fn set_peer(&self, peer: RingInfo, flow: SendFlow) {
        let mut state = self.lock();
        state.peer = peer;
        state.flow = Some(flow);
    }

    /// A signaled request completed, and with it every request before it: writers waiting for
    /// room are told.
    pub(super) fn completed(&self) {
        let mut state = self.lock();
        if state.signaled_done() {
            tell_waiting(&self.room, &state);
        }
    }

    /// The peer's credit report (from a control message): what it consumed of our writes and
    /// the receives it posted again. Writers waiting for room are told.
    pub(super) fn credit(&self, consumed: u64, reposted: u64) -> Result<(), String> {
        let mut state = self.lock();
        if let Some(flow) = &mut state.flow {
            flow.credit(consumed, reposted).map_err(|e| e.to_string())?;
        }
        tell_waiting(&self.room, &state);
        Ok(())
    }

    /// Queues a control message (a credit only when none is queued); [`Sender::flush_controls`]
    /// posts it.
    pub(super) fn queue_control(&self, kind: ControlKind) {
        self.lock().controls.queue(kind);
    }

    /// Posts the queued control messages while the send queue and the peer's control slots
    /// have room, each with `recv`'s credit report.
    pub(super) fn flush_controls(&self, recv: &Receiver) {
        let mut state = self.lock();
        while state.has_room()
            && state.controls.in_flight() < u64::from(state.sq)
            && let Some(kind) = state.controls.next()
        {
            if self.post_control(&mut state, recv, kind).is_err() {
                // The QP is failing; its error completion reports it.
                return;
            }
        }
    }

    /// Posts control message `kind`, the next queued one.
    fn post_control(
        &self,
        state: &mut SendState,
        recv: &Receiver,
        kind: ControlKind,
    ) -> io::Result<()> {
        let (consumed, reposted) = recv.report();
        let bytes = Control {
            kind,
            consumed,
            reposted,
        }
        .encode();
        let seq = state.controls.posted();
        let off = self.control_off + (seq % u64::from(state.sq)) as usize * SLOT;
        self.region.store(off, &bytes)?;
        // FIN's completion says every byte before it arrived, REUSE's that the connection's
        // send queue is empty for the next one; a credit's says nothing needed.
        let must = matches!(kind, ControlKind::Fin | ControlKind::Reuse(_));
        let signaled = state.signal_next(Request::Control, must);
        self.qp.send(
            TAG_CONTROL | seq,
            Local {
                addr: self.region.addr(off),
                len: SLOT as u32,
                lkey: self.lkey,
            },
            signaled,
        )?;
        state.note_posted(signaled, Request::Control);
        state.controls.posted_one(kind);
        Ok(())
    }

    /// FIN was queued.
    pub(super) fn fin_queued(&self) -> bool {
        self.lock().controls.fin_queued()
    }

    /// FIN was sent and its completion came back (so every byte before it arrived).
    pub(super) fn fin_done(&self) -> bool {
        self.lock().controls.fin_done()
    }

    /// Posts a liveness probe (a zero-length write, signaled) unless the send queue is full;
    /// true when one was posted (the engine keeps one outstanding at most).
    pub(super) fn probe(&self) -> bool {
        let mut state = self.lock();
        if !state.has_room() {
            return false;
        }
        let posted = self
            .qp
            .write_probe(TAG_PROBE, (state.peer.addr, state.peer.rkey))
            .is_ok();
        if posted {
            state.note_posted(true, Request::Probe);
        }
        posted
    }

    /// Reads from `local` into the send ring and writes it to the peer while the window
    /// allows: whether the local side reached its EOF (or, `draining`, has nothing more now),
    /// and the bytes posted.
    pub(super) fn send_from(
        &self,
        local: &OwnedFd,
        ready: &mut Ready,
        draining: bool,
        recv: &Receiver,
    ) -> io::Result<(bool, u64)> {
        let mut moved = 0u64;
        // Reading and posting under the send lock: a direct writer sees either none of these
        // bytes read from the socketpair or all of them posted (see the module docs).
        let mut state = self.lock();
        while ready.readable && state.has_room() && state.engine_may_post() {
            let Some(w) = state.flow.as_ref().map(SendFlow::window) else {
                break;
            };
            if w.len == 0 {
                break;
            }
            // Urgent data (see the module docs): a read never crosses the mark, so it is
            // found before a read that would start with it.
            let mut len = w.len;
            let mut urgent = false;
            if state.urgent {
                if fd::at_mark(local.as_fd()) {
                    // The mark, then the byte: two requests, one of the peer's control slots.
                    if state.sq_used + 2 > state.sq
                        || state.controls.in_flight() >= u64::from(state.sq)
                    {
                        break;
                    }
                    (len, urgent) = (1, true);
                } else if !fd::urgent_pending(local.as_fd()) {
                    state.urgent = false;
                }
            }
            match self
                .region
                .read_from(local.as_raw_fd(), self.ring_offset(&w), len)
            {
                Ok(1) if urgent => {
                    let position = state.sent();
                    self.post_control(&mut state, recv, ControlKind::Urgent(position))?;
                    self.post_data(&mut state, &w, 1)?;
                    moved += 1;
                }
                Ok(0) => return Ok((true, moved)),
                Ok(n) => {
                    self.post_data(&mut state, &w, n)?;
                    moved += n as u64;
                }
                Err(e) if fd::transient(&e) => {
                    ready.readable = false;
                    if draining {
                        return Ok((true, moved));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok((false, moved))
    }

    /// Turns direct writes on or off (see the module docs); waiting writers are told.
    pub(super) fn set_writers(&self, on: bool) {
        let mut state = self.lock();
        state.writers_on = on;
        tell_waiting(&self.room, &state);
    }

    /// Bytes the app's direct writes posted since the last call.
    pub(super) fn take_written(&self) -> u64 {
        std::mem::take(&mut self.lock().written_by_app)
    }

    /// Data bytes posted so far.
    pub(super) fn sent(&self) -> u64 {
        self.lock().sent()
    }

    /// Data bytes posted, and those the peer's device acknowledged (their writes completed).
    pub(super) fn posted_and_acked(&self) -> (u64, u64) {
        self.lock()
            .flow
            .as_ref()
            .map_or((0, 0), |f| (f.sent(), f.completed_total()))
    }

    /// Waits, at most until `until`, until the peer's device acknowledged `bytes` posted bytes
    /// (the engine tells waiters of every signaled completion: [`tell_waiting`]).
    pub(super) fn wait_acked(&self, bytes: u64, until: Instant) {
        let mut state = self.lock();
        while state
            .flow
            .as_ref()
            .is_some_and(|f| f.completed_total() < bytes)
        {
            match wait_for_room(&self.room, state, until) {
                Some(s) => state = s,
                None => return,
            }
        }
    }

    /// Every data byte posted so far was reported completed (the peer's device took it).
    pub(super) fn all_completed(&self) -> bool {
        self.lock()
            .flow
            .as_ref()
            .is_none_or(SendFlow::all_completed)
    }

    /// Where the engine reads socketpair bytes for window `w` into.
    fn ring_offset(&self, w: &Window) -> usize {
        self.ring_off + w.local
    }

    /// Posts `n` bytes of the send ring at window `w` (already in place) to the peer's ring.
    fn post_data(&self, state: &mut SendState, w: &Window, n: usize) -> io::Result<()> {
        if !state.has_room() {
            // Control messages took the room since the window was claimed.
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        if state.flow.is_none() {
            return Err(io::Error::other("no peer ring yet"));
        }
        let end = state.sent() + n as u64;
        let local = self.ring_off + w.local;
        let signaled = state.signal_next(Request::Data(n), false);
        self.qp.write_imm(
            TAG_DATA | end,
            Local {
                addr: self.region.addr(local),
                len: n as u32,
                lkey: state.data_lkey,
            },
            (state.peer.addr + w.remote as u64, state.peer.rkey),
            crate::wire::data_imm(end),
            signaled,
        )?;
        state.note_posted(signaled, Request::Data(n));
        Ok(())
    }

    /// True while a writer copies into the region (it must not serve another connection).
    pub(super) fn copying(&self) -> bool {
        self.lock().claimed
    }

    /// Nothing is queued, posted and not completed, or claimed: the send queue is empty (a
    /// connection's next one on this queue pair starts its accounting from nothing).
    pub(super) fn idle(&self) -> bool {
        let state = self.lock();
        state.sq_used == 0 && state.controls.queued() == 0 && !state.claimed
    }

    /// Our writes go into `ring` (the peer's start ring: no switch moved them elsewhere).
    pub(super) fn writes_into(&self, ring: &RingInfo) -> bool {
        let state = self.lock();
        state.peer.addr == ring.addr && state.peer.size_log == ring.size_log
    }
}

/// Writes a stream's bytes for the app's thread ([`super::Conn::writer`]).
pub struct Writer {
    send: Weak<Sender>,
    inner: Arc<Inner>,
    token: u64,
    early: Arc<EarlyWrites>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("token", &self.token)
            .finish()
    }
}

impl Writer {
    pub(super) fn new(
        send: &Arc<Sender>,
        inner: Arc<Inner>,
        token: u64,
        early: Arc<EarlyWrites>,
    ) -> Writer {
        Writer {
            send: Arc::downgrade(send),
            inner,
            token,
            early,
        }
    }

    /// Before the app's direction moves to the stream: sends the start of `buf` on the kept
    /// TCP socket from the app's thread, when nothing the app wrote to `app` (its end of the
    /// socketpair) is still ahead of it (docs/shim-protocol.md, "The move"). The byte count;
    /// None: not now (the direction moved, or bytes wait ahead): write to `app`, or into the
    /// ring ([`Writer::write`]).
    pub fn write_early(&self, app: RawFd, buf: &[u8]) -> Option<usize> {
        self.early.write(app, buf)
    }

    /// Whether the connection's first bytes may still go on the kept TCP socket from the app's
    /// thread (one atomic load: a caller asks before it gathers buffers for
    /// [`Writer::write_early_vectored`]).
    pub fn writes_early(&self) -> bool {
        self.early.is_open()
    }

    /// [`Writer::write_early`] of the buffers `bufs` in turn (`writev`, `sendmsg`).
    pub fn write_early_vectored(&self, app: RawFd, bufs: &[std::io::IoSlice<'_>]) -> Option<usize> {
        self.early.write_vectored(app, bufs)
    }

    /// Copies the start of `buf` into the send ring and posts it when `app` (the app's end of
    /// the stream's socketpair) holds nothing the engine has not read, the app may still send
    /// on it, and the window and send queue have room; the byte count (at most one window).
    /// None: write to `app` as usual.
    ///
    /// When the window or the send queue has no room, `wait_until` is asked (once per call)
    /// until when a blocking write may wait for room: the writer then waits for the engine to
    /// report a credit or a completion (`Sender::room_changed`), or for direct writes to end,
    /// at most until then. None: it does not wait (a non-blocking write, or one with a send
    /// timeout), and the caller writes the rest to the socketpair.
    pub fn write(
        &self,
        app: RawFd,
        buf: &[u8],
        wait_until: &mut dyn FnMut() -> Option<Instant>,
    ) -> Option<usize> {
        if buf.is_empty() {
            return None;
        }
        let send = self.send.upgrade()?;
        let mut deadline: Option<Option<Instant>> = None;
        let w = {
            let mut state = send.lock();
            loop {
                if !state.writers_on || state.claimed {
                    return None;
                }
                let w = state.flow.as_ref()?.window();
                if w.len > 0 && state.has_room() {
                    if unread_by_peer(app).ok() != Some(0) || !crate::fd::may_send(app) {
                        return None;
                    }
                    state.claimed = true;
                    break w;
                }
                // No room: a blocking write waits for it, unless the rings are small (the
                // socketpair then adds buffering that matters), the socketpair holds bytes the
                // engine must send first, or the app may not send at all.
                if state.flow.as_ref()?.in_flight_limit() < WAIT_MIN_RING {
                    return None;
                }
                let until = (*deadline.get_or_insert_with(&mut *wait_until))?;
                if unread_by_peer(app).ok() != Some(0) || !crate::fd::may_send(app) {
                    return None;
                }
                state = wait_for_room(&send.room, state, until)?;
            }
        };
        let n = w.len.min(buf.len());
        // Outside the lock: the claimed range is this writer's (the engine posts no data until
        // the claim is posted or given up, and the device is done with the range: the window
        // only spans completed bytes).
        let stored = send.region.store(send.ring_offset(&w), &buf[..n]);
        let mut state = send.lock();
        state.claimed = false;
        let wake = std::mem::take(&mut state.engine_waits);
        let posted =
            stored.is_ok() && state.writers_on && send.post_data(&mut state, &w, n).is_ok();
        if posted {
            state.written_by_app += n as u64;
        }
        drop(state);
        if wake {
            self.inner.send(Command::Consumed { token: self.token });
        }
        posted.then_some(n)
    }

    /// Sends `buf` into `app` (the app's end of the socketpair) as urgent data (`MSG_OOB`
    /// added to `flags`; its last byte is the urgent one), without blocking: the answer is the
    /// kernel's. Done under the send lock, with the engine told to look for the mark before
    /// its reads, so the engine finds the urgent byte at its place and carries it as urgent
    /// (see the module docs).
    pub fn send_urgent(&self, app: RawFd, buf: &[u8], flags: i32) -> io::Result<usize> {
        let send = self.send.upgrade();
        let mut state = send.as_ref().map(|s| s.lock());
        if let Some(state) = &mut state {
            state.urgent = true;
        }
        let flags = MsgFlags::from_bits_retain(flags) | MsgFlags::MSG_OOB | MsgFlags::MSG_DONTWAIT;
        nix::sys::socket::send(app, buf, flags).map_err(|e| io::Error::from_raw_os_error(e as i32))
    }
}

/// Half of what may be in flight, at least 1 (see [`SendState::signal_next`]).
fn half(in_flight: u64) -> u64 {
    (in_flight / 2).max(1)
}

/// Wakes the writers waiting on `room`, if `state` counts any.
fn tell_waiting(room: &Condvar, state: &SendState) {
    if state.waiting > 0 {
        room.notify_all();
    }
}

/// Waits on `room` until it is told or `until` passes; the lock again, None once `until` has
/// passed (the caller stops waiting). Counted in `waiting` meanwhile, so the engine tells it.
fn wait_for_room<'a>(
    room: &Condvar,
    mut state: Guard<'a, SendState>,
    until: Instant,
) -> Option<Guard<'a, SendState>> {
    let left = until.checked_duration_since(Instant::now())?;
    if left.is_zero() {
        return None;
    }
    state.waiting += 1;
    let mut state = state.wait_timeout(room, left);
    state.waiting -= 1;
    Some(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_waits_while_a_claim_is_open_and_is_told() {
        let mut state = SendState::new(4, 4096);
        state.writers_on = true;
        assert!(state.engine_may_post());
        assert!(!state.engine_waits, "nothing to wait for");
        state.claimed = true;
        assert!(!state.engine_may_post());
        assert!(state.engine_waits, "the writer wakes it after posting");
        state.sq_used = 4;
        assert!(!state.has_room());
    }

    /// Posts data and control messages as the engine and writers do (every window the flow
    /// allows, controls when the queue has room), completing only what the device would
    /// report: whenever the flow blocks on local resources (send ring, send queue, control
    /// slots) a signaled request is outstanding, so its completion comes and frees them.
    #[test]
    fn a_blocked_sender_always_has_a_signaled_completion_coming() {
        for (ring, sq, chunk, unacked) in [
            (4096u64, 4u32, 1024u64, 4096u64),
            (1 << 20, 64, 1 << 18, 1 << 20),
            (8192, 16, 8192, 8192),
            (2 << 20, 64, 1 << 19, 1 << 20),
            (1 << 16, 16, 1 << 14, 5000),
        ] {
            let mut state = SendState::new(sq, ring.min(unacked));
            // The peer consumes and reposts at once: only local resources can block.
            state.flow = Some(SendFlow::new(ring, ring, 1 << 20, 1, (chunk, unacked)));
            let mut in_flight = 0u32;
            for step in 0..10_000u64 {
                let control = step % 7 == 3;
                let w = state.flow.as_ref().unwrap().window();
                let blocked = !state.has_room() || (!control && w.len == 0);
                if blocked {
                    assert!(
                        !state.signaled.is_empty(),
                        "ring {ring}, sq {sq}: blocked with nothing signaled in flight (step {step})"
                    );
                    // The device completes the oldest signaled request.
                    assert!(state.signaled_done());
                    continue;
                }
                let request = if control {
                    Request::Control
                } else {
                    Request::Data(w.len.min(1000 + (step as usize * 37) % 3000))
                };
                let signaled = state.signal_next(request, false);
                state.note_posted(signaled, request);
                if control {
                    state.controls.queue(ControlKind::Credit);
                    let kind = state.controls.next().unwrap();
                    state.controls.posted_one(kind);
                } else {
                    let flow = state.flow.as_mut().unwrap();
                    flow.credit(flow.sent(), 0).unwrap();
                }
                in_flight += 1;
                assert!(state.sq_used <= sq);
            }
            assert!(in_flight > 0);
            // Every signaled request reported: less than half of each resource stays held.
            while state.signaled_done() {}
            assert!(
                state.sq_used < sq.max(2) / 2 + 1,
                "sq_used {}",
                state.sq_used
            );
            let w = state.flow.as_ref().unwrap().window();
            assert!(w.len > 0, "room for the next write");
        }
    }

    /// A writer waiting for room wakes when the engine reports a credit, long before its
    /// deadline, and one that nobody tells gives up at its deadline; neither stays counted.
    #[test]
    fn a_waiting_writer_wakes_on_a_credit_and_gives_up_at_its_deadline() {
        use std::time::Duration;
        let shared = Arc::new((
            OrderedMutex::new(Level::Send, SendState::new(64, 4096)),
            Condvar::new(),
        ));
        {
            let mut state = shared.0.lock();
            state.flow = Some(SendFlow::new(4096, 4096, 64, 1, (1024, 4096)));
            for _ in 0..4 {
                state.note_posted(false, Request::Data(1024));
            }
            state.note_posted(true, Request::Control);
            assert!(state.signaled_done());
            assert_eq!(
                state.flow.as_ref().unwrap().window().len,
                0,
                "the peer's ring is full"
            );
        }
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let started = Instant::now();
                let until = started + Duration::from_secs(30);
                let mut state = shared.0.lock();
                while state.flow.as_ref().unwrap().window().len == 0 {
                    state = wait_for_room(&shared.1, state, until).expect("woken before 30 s");
                }
                started.elapsed()
            })
        };
        // The engine reports the credit once the writer waits (as it would at any time).
        loop {
            let mut state = shared.0.lock();
            if state.waiting == 1 {
                state.flow.as_mut().unwrap().credit(2048, 4).unwrap();
                tell_waiting(&shared.1, &state);
                break;
            }
            drop(state);
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited = writer.join().unwrap();
        assert!(
            waited < Duration::from_secs(20),
            "woken by the credit, not the deadline: {waited:?}"
        );
        let state = shared.0.lock();
        assert_eq!(state.waiting, 0);
        assert_eq!(state.flow.as_ref().unwrap().window().len, 1024);
        let until = Instant::now() + Duration::from_millis(20);
        let mut state = Some(state);
        while let Some(s) = state.take() {
            state = wait_for_room(&shared.1, s, until);
        }
        assert!(Instant::now() >= until, "gave up only at the deadline");
        assert_eq!(shared.0.lock().waiting, 0);
    }

    #[test]
    fn a_signaled_completion_reports_everything_before_it() {
        let mut state = SendState::new(64, 1 << 20);
        state.flow = Some(SendFlow::new(1 << 20, 1 << 20, 64, 1, (1 << 18, 1 << 20)));
        for _ in 1..=3 {
            state.note_posted(false, Request::Data(1000));
        }
        assert!(
            state.signal_next(Request::Control, true),
            "a FIN or probe must be signaled"
        );
        state.note_posted(true, Request::Control);
        state.controls.queue(ControlKind::Fin);
        let kind = state.controls.next().unwrap();
        state.controls.posted_one(kind);
        assert_eq!(state.sq_used, 4);
        assert!(!state.controls.fin_done());
        assert!(state.signaled_done());
        assert_eq!(state.sq_used, 0);
        assert!(state.controls.fin_done(), "the FIN's completion came");
        assert!(state.flow.as_ref().unwrap().all_completed());
        assert!(!state.signaled_done());
    }
}
