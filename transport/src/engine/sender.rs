//! The send side of one connection, and direct writes: an app thread copies its bytes straight
//! into the send ring and posts them, instead of writing them into its socketpair end for the
//! engine to read out and post.
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
//! A writer copies only while the engine allows it ([`SendState::direct`]): the stream runs
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
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use super::{Command, Inner};
use crate::flow::{SendFlow, Window};
use crate::rdma::{Local, Qp, Region, unread_by_peer};
use crate::wire::RingInfo;

/// The wr_id tag of data writes (the rest of the id is the position after the write).
pub(super) const TAG_DATA: u64 = 1 << 60;

/// The smallest in-flight limit (the smaller ring) at which a writer waits for room instead of
/// writing the rest into the socketpair. With smaller rings the socketpair's buffer is a large
/// part of what the stream can hold, and waiting on the ring alone measured slower on
/// Soft-RoCE (four pairs with 256 KiB rings: 0.59 of rsocket's rate, 0.64-0.69 when spilling);
/// with 2 MiB rings waiting measured faster (`docs/benchmarks.md`).
pub const WAIT_MIN_RING: u64 = 2 << 20;

/// The send side of one connection, shared by the engine and its [`Writer`]s.
pub(super) struct Sender {
    qp: Qp,
    /// The connection's region; the send ring starts at `ring_off`.
    region: Arc<Region>,
    ring_off: usize,
    lkey: u32,
    state: Mutex<SendState>,
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
pub(super) enum Request {
    /// A data write of this many bytes.
    Data(usize),
    /// A control message (it uses one of the peer's receives).
    Control,
    /// A liveness probe.
    Probe,
}

/// What the lock guards.
pub(super) struct SendState {
    /// The flow, once the peer's ring is known.
    pub(super) flow: Option<SendFlow>,
    pub(super) peer: RingInfo,
    /// Send work requests posted and not completed, of `sq`.
    pub(super) sq_used: u32,
    pub(super) sq: u32,
    /// Writers may post (see the module docs).
    pub(super) direct: bool,
    /// A writer copies into a claimed window.
    claimed: bool,
    /// The engine left the socketpair unread while a claim was open.
    engine_waits: bool,
    /// Writers waiting for room in the window ([`Writer::write`]).
    waiting: u32,
    /// Bytes writers posted that the engine has not counted yet.
    pub(super) direct_bytes: u64,
    /// Control messages posted.
    pub(super) controls: u64,
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
            sq_used: 0,
            sq,
            direct: false,
            claimed: false,
            engine_waits: false,
            waiting: 0,
            direct_bytes: 0,
            controls: 0,
            signaled: VecDeque::new(),
            unsignaled: 0,
            mark_sent: 0,
            mark_controls: 0,
            half_in_flight: (in_flight / 2).max(1),
        }
    }

    /// Data bytes posted so far.
    fn sent(&self) -> u64 {
        self.flow.as_ref().map_or(0, SendFlow::sent)
    }

    /// Data bytes and control messages posted once `request` is.
    fn after(&self, request: Request) -> (u64, u64) {
        match request {
            Request::Data(n) => (self.sent() + n as u64, self.controls),
            Request::Control => (self.sent(), self.controls + 1),
            Request::Probe => (self.sent(), self.controls),
        }
    }

    /// Whether `request`, posted next, goes signaled (see the module docs): `must` when its
    /// own completion matters.
    pub(super) fn signal_next(&self, request: Request, must: bool) -> bool {
        let half_sq = (self.sq / 2).max(1);
        let (sent, controls) = self.after(request);
        must || self.unsignaled + 1 >= half_sq
            || sent - self.mark_sent >= self.half_in_flight
            || controls - self.mark_controls >= u64::from(half_sq)
    }

    /// `request` was posted, `signaled` or not: the flow, the counts and the send queue take
    /// it.
    pub(super) fn note_posted(&mut self, signaled: bool, request: Request) {
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
        self.controls = controls;
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
    /// queue entries and send ring bytes are free. The control messages completed so far (None
    /// when no signaled request was outstanding).
    pub(super) fn signaled_done(&mut self) -> Option<u64> {
        let done = self.signaled.pop_front()?;
        self.sq_used = self.sq_used.saturating_sub(done.weight);
        if let Some(flow) = &mut self.flow {
            flow.completed(done.sent);
        }
        Some(done.controls)
    }

    /// The engine may post data from the socketpair now: no writer has a window claimed. If
    /// one has, the writer wakes the engine once it posted.
    pub(super) fn engine_may_post(&mut self) -> bool {
        if self.claimed {
            self.engine_waits = true;
        }
        !self.claimed
    }

    /// Room for one more send work request.
    pub(super) fn has_room(&self) -> bool {
        self.sq_used < self.sq
    }
}

impl Sender {
    /// The send ring is `ring` bytes at `ring_off` of `region`, of which at most `max_unacked`
    /// are posted and not completed.
    pub(super) fn new(
        qp: Qp,
        region: Arc<Region>,
        (ring_off, ring): (usize, usize),
        lkey: u32,
        sq: u32,
        max_unacked: u64,
    ) -> Sender {
        Sender {
            qp,
            region,
            ring_off,
            lkey,
            state: Mutex::new(SendState::new(sq, (ring as u64).min(max_unacked))),
            room: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, SendState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The window may have grown (a credit, a signaled completion) or direct writes ended:
    /// wakes the writers waiting for room, if any. The caller changed `state` under the lock.
    pub(super) fn room_changed(&self, state: &SendState) {
        tell_waiting(&self.room, state);
    }

    /// Where the engine reads socketpair bytes for window `w` into.
    pub(super) fn ring_offset(&self, w: &Window) -> usize {
        self.ring_off + w.local
    }

    /// Posts `n` bytes of the send ring at window `w` (already in place) to the peer's ring.
    pub(super) fn post_data(&self, state: &mut SendState, w: &Window, n: usize) -> io::Result<()> {
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
                lkey: self.lkey,
            },
            state.peer.addr + w.remote as u64,
            state.peer.rkey,
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
}

/// Writes a stream's bytes for the app's thread ([`super::Conn::writer`]).
pub struct Writer {
    send: Weak<Sender>,
    inner: Arc<Inner>,
    token: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("token", &self.token)
            .finish()
    }
}

impl Writer {
    pub(super) fn new(send: &Arc<Sender>, inner: Arc<Inner>, token: u64) -> Writer {
        Writer {
            send: Arc::downgrade(send),
            inner,
            token,
        }
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
                if !state.direct || state.claimed {
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
        let posted = stored.is_ok() && state.direct && send.post_data(&mut state, &w, n).is_ok();
        if posted {
            state.direct_bytes += n as u64;
        }
        drop(state);
        if wake {
            self.inner.send(Command::Consumed { token: self.token });
        }
        posted.then_some(n)
    }
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
    mut state: MutexGuard<'a, SendState>,
    until: Instant,
) -> Option<MutexGuard<'a, SendState>> {
    let left = until.checked_duration_since(Instant::now())?;
    if left.is_zero() {
        return None;
    }
    state.waiting += 1;
    let (mut state, _) = room
        .wait_timeout(state, left)
        .unwrap_or_else(PoisonError::into_inner);
    state.waiting -= 1;
    Some(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_waits_while_a_claim_is_open_and_is_told() {
        let mut state = SendState::new(4, 4096);
        state.direct = true;
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
                    state.signaled_done().unwrap();
                    continue;
                }
                let request = if control {
                    Request::Control
                } else {
                    Request::Data(w.len.min(1000 + (step as usize * 37) % 3000))
                };
                let signaled = state.signal_next(request, false);
                state.note_posted(signaled, request);
                if !control {
                    let flow = state.flow.as_mut().unwrap();
                    flow.credit(flow.sent(), 0).unwrap();
                }
                in_flight += 1;
                assert!(state.sq_used <= sq);
            }
            assert!(in_flight > 0);
            // Every signaled request reported: less than half of each resource stays held.
            while state.signaled_done().is_some() {}
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
        let shared = Arc::new((Mutex::new(SendState::new(64, 4096)), Condvar::new()));
        {
            let mut state = shared.0.lock().unwrap();
            state.flow = Some(SendFlow::new(4096, 4096, 64, 1, (1024, 4096)));
            for _ in 0..4 {
                state.note_posted(false, Request::Data(1024));
            }
            state.note_posted(true, Request::Control);
            state.signaled_done().unwrap();
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
                let mut state = shared.0.lock().unwrap();
                while state.flow.as_ref().unwrap().window().len == 0 {
                    state = wait_for_room(&shared.1, state, until).expect("woken before 30 s");
                }
                started.elapsed()
            })
        };
        // The engine reports the credit once the writer waits (as it would at any time).
        loop {
            let mut state = shared.0.lock().unwrap();
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
        let state = shared.0.lock().unwrap();
        assert_eq!(state.waiting, 0);
        assert_eq!(state.flow.as_ref().unwrap().window().len, 1024);
        let until = Instant::now() + Duration::from_millis(20);
        let mut state = Some(state);
        while let Some(s) = state.take() {
            state = wait_for_room(&shared.1, s, until);
        }
        assert!(Instant::now() >= until, "gave up only at the deadline");
        assert_eq!(shared.0.lock().unwrap().waiting, 0);
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
        assert_eq!(state.sq_used, 4);
        assert_eq!(state.signaled_done(), Some(1));
        assert_eq!(state.sq_used, 0);
        assert!(state.flow.as_ref().unwrap().all_completed());
        assert_eq!(state.signaled_done(), None);
    }
}
