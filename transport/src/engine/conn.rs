//! One connection on the engine thread: its RDMA resources and flows ([`Rdma`]) and what its
//! local side is doing ([`App`]).

use std::collections::VecDeque;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::binding::Binding;
use super::direct::Receiver;
use super::proof::{self, Look};
use super::relay::{Ready, Relay, Step};
use super::sender::{Request, SendState, Sender};
use super::shared::ConnShared;
use super::{Attach, End, EngineConfig, Event, Handshake, SLOT, StreamPath};
use crate::fd;
use crate::flow::{RecvFlow, SendFlow};
use crate::rdma::{
    Access, CmId, Cq, Device, Local, Mr, Pd, Qp, Region, WC_RECV, WC_SUCCESS, Wc, unread_by_peer,
};
use crate::wire::{CONTROL_LEN, Control, ControlKind, RingInfo, Secret};

/// How long a relay that gave up on a proof holds TCP bytes that are the secret's start, for the
/// rest ([`Relay::guarded`]).
const GUARD_WAIT: Duration = Duration::from_secs(2);

const TAG_SHIFT: u32 = 60;
const TAG_CONTROL: u64 = 2 << TAG_SHIFT;
const TAG_PROBE: u64 = 3 << TAG_SHIFT;
const TAG_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// A connection's region, its protection domain and their registrations, ready for the next
/// connection ([`super::pool`]): after its connection ended (its QP destroyed), the receive
/// ring, the one range a peer may write, was zeroed (none of the last peer's bytes) and
/// registered anew (a remote key no earlier peer learned). Done when the region is kept, not
/// when it is taken, so it costs the next connection's setup nothing.
pub(super) struct Buffers {
    // Drop order: the MRs, then their PD, then the memory they register.
    recv_mr: Mr,
    mr: Mr,
    pd: Pd,
    region: Arc<Region>,
}

/// What a finished connection leaves of its region before it is renewed for the next one.
pub(super) struct Leftover {
    mr: Mr,
    pd: Pd,
    region: Arc<Region>,
    ring: usize,
}

impl Leftover {
    /// The region made ready for another peer (see [`Buffers`]); None when that failed (the
    /// caller drops the rest and releases its budget share).
    pub(super) fn renewed(self) -> Option<Buffers> {
        let Leftover {
            mr,
            pd,
            region,
            ring,
        } = self;
        region.zero(0, ring).ok()?;
        let recv_mr = pd.register(&region, 0, ring, Access::RemoteWrite).ok()?;
        Some(Buffers {
            recv_mr,
            mr,
            pd,
            region,
        })
    }
}

/// A connection's verbs resources and stream accounting.
pub(super) struct Rdma {
    qp: Qp,
    // Drop order matters: the QP (the id's) is destroyed first by the loop, then the CQ, the
    // MRs, the PD and the memory, in this field order.
    cq: Cq,
    /// The receive ring's registration, the only remotely writable one (its rkey is the
    /// peer's).
    recv_mr: Mr,
    /// The send ring's and the control slots' registration (local access only).
    mr: Mr,
    /// This connection's own protection domain: no other connection's queue pair can use its
    /// keys.
    pd: Pd,
    region: Arc<Region>,
    pub(super) pinned: u64,
    /// The device's index in the engine (the pool's key).
    pub(super) device: usize,
    ring: usize,
    rq: u32,
    sq: u32,
    reserve: u64,
    max_chunk: u64,
    max_unacked: u64,
    /// The send side and its accounting, shared with the app's direct writes
    /// ([`super::sender`]).
    sender: Arc<Sender>,
    /// Direct writes are on (the engine's copy of [`SendState::direct`]).
    writing: bool,
    /// The receive side, shared with the app's direct reads ([`super::direct`]).
    recv: Arc<Receiver>,
    /// Direct reads are on (the engine's copy of [`super::direct::RecvState::direct`]).
    direct: bool,
    /// Control messages completed (of [`SendState::controls`] posted).
    control_done: u64,
    fin_seq: Option<u64>,
    pending_control: VecDeque<ControlKind>,
    probe_outstanding: bool,
    /// The QP may post sends (the accept was sent, or the connection is established).
    pub(super) ready: bool,
    /// The peer FIN is in and a later work request failed (the peer is gone): nothing more is
    /// posted.
    quiet: bool,
    pub(super) last_rx: Instant,
    /// What the peer may send, by the handshake, and whether its FIN came
    /// ([`super::binding`]).
    pub(super) binding: Binding,
}

/// Why setting a connection up failed.
#[derive(Debug)]
pub(super) enum SetupError {
    Memlock,
    Local(&'static str, io::Error),
}

/// A failed `ibv_reg_mr`: over the memlock limit, or another error.
fn reg_error(e: io::Error) -> SetupError {
    match e.raw_os_error() {
        Some(libc::ENOMEM | libc::EPERM) => SetupError::Memlock,
        _ => SetupError::Local("ibv_reg_mr", e),
    }
}

impl Rdma {
    /// The buffers, CQ and QP for `id` on `device` (index `index`), with every receive posted.
    /// `kept`: a region a finished connection left on this device, with its budget share;
    /// otherwise the budget is asked and a region registered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: &EngineConfig,
        budget: &super::Budget,
        (device, index): (&Device, usize),
        kept: Option<(Buffers, u64)>,
        id: CmId,
        token: u64,
        now: Instant,
        handshake: super::Handshake,
    ) -> Result<Rdma, SetupError> {
        let (buffers, pinned) = match kept {
            Some((buffers, pinned)) => (Some(buffers), pinned),
            None => {
                let pinned = config.pinned_per_connection();
                if !budget.reserve(pinned) {
                    return Err(SetupError::Memlock);
                }
                (None, pinned)
            }
        };
        let made = Rdma::make(
            config,
            (device, index),
            buffers,
            (id, token, handshake),
            now,
            pinned,
        );
        if made.is_err() {
            budget.release(pinned);
        }
        made
    }

    /// A new region (zeroed by the kernel) in a protection domain of its own, registered on
    /// `device`: the receive ring for the peer's writes, the rest for local access only.
    fn register(config: &EngineConfig, device: &Device) -> Result<Buffers, SetupError> {
        let ring = config.ring();
        let region = Arc::new(
            Region::new(config.region_bytes())
                .map_err(|e| SetupError::Local("mmap of the buffers", e))?,
        );
        let pd = device
            .alloc_pd()
            .map_err(|e| SetupError::Local("ibv_alloc_pd", e))?;
        let mr = pd
            .register(&region, ring, config.region_bytes() - ring, Access::Local)
            .map_err(reg_error)?;
        let recv_mr = pd
            .register(&region, 0, ring, Access::RemoteWrite)
            .map_err(reg_error)?;
        Ok(Buffers {
            recv_mr,
            mr,
            pd,
            region,
        })
    }

    fn make(
        config: &EngineConfig,
        (device, index): (&Device, usize),
        buffers: Option<Buffers>,
        (id, token, handshake): (CmId, u64, super::Handshake),
        now: Instant,
        pinned: u64,
    ) -> Result<Rdma, SetupError> {
        let ring = config.ring();
        let (rq, sq) = (config.recv_queue.max(4), config.send_queue.max(4));
        // A kept region was renewed when it was kept: its ring is zeroed and its key fresh.
        let Buffers {
            recv_mr,
            mr,
            pd,
            region,
        } = match buffers {
            Some(b) => b,
            None => Rdma::register(config, device)?,
        };
        let cq = device
            .create_cq(i32::try_from(rq + sq).unwrap_or(i32::MAX), token)
            .map_err(|e| SetupError::Local("ibv_create_cq", e))?;
        cq.arm()
            .map_err(|e| SetupError::Local("ibv_req_notify_cq", e))?;
        let qp = id
            .create_qp(&pd, &cq, sq, rq)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOMEM) => SetupError::Memlock,
                _ => SetupError::Local("rdma_create_qp", e),
            })?;
        let sender = Arc::new(Sender::new(
            qp,
            Arc::clone(&region),
            (ring, ring),
            mr.lkey(),
            sq,
            config.max_unacked() as u64,
        ));
        let rdma = Rdma {
            qp,
            cq,
            recv_mr,
            mr,
            pd,
            recv: Receiver::new(
                Arc::clone(&region),
                RecvFlow::new(ring as u64, u64::from(rq)),
            ),
            direct: false,
            region,
            pinned,
            device: index,
            ring,
            rq,
            sq,
            reserve: u64::from(rq / 4).max(1),
            max_chunk: config.max_chunk() as u64,
            max_unacked: config.max_unacked() as u64,
            sender,
            writing: false,
            control_done: 0,
            fin_seq: None,
            pending_control: VecDeque::new(),
            probe_outstanding: false,
            ready: false,
            quiet: false,
            last_rx: now,
            binding: Binding::new(handshake),
        };
        for slot in 0..rq {
            rdma.post_recv(u64::from(slot))
                .map_err(|e| SetupError::Local("ibv_post_recv", e))?;
        }
        Ok(rdma)
    }

    /// What outlives the connection once its QP is destroyed (the caller destroyed it): the
    /// region with its PD and local registration, to be renewed for another connection
    /// ([`Leftover::renewed`]), and its budget share. The CQ and the receive ring's
    /// registration go. None for the region while an app thread still copies from or into it
    /// (a direct read or write): it is not reused, and unmapped when that thread lets go.
    pub(super) fn into_leftover(self) -> (Option<Leftover>, u64) {
        let reusable = {
            let mut state = self.recv.lock();
            state.direct = false;
            !state.flow.claim_open()
        } && !self.sender.copying();
        let Rdma {
            cq,
            recv_mr,
            mr,
            pd,
            region,
            pinned,
            ring,
            ..
        } = self;
        drop(cq);
        drop(recv_mr);
        let leftover = Leftover {
            mr,
            pd,
            region,
            ring,
        };
        (reusable.then_some(leftover), pinned)
    }

    fn control_recv_off(&self) -> usize {
        2 * self.ring
    }

    fn control_send_off(&self) -> usize {
        2 * self.ring + self.rq as usize * SLOT
    }

    fn post_recv(&self, slot: u64) -> io::Result<()> {
        let off = self.control_recv_off() + slot as usize * SLOT;
        self.qp.recv(
            slot,
            Local {
                addr: self.region.addr(off),
                len: SLOT as u32,
                lkey: self.mr.lkey(),
            },
        )
    }

    /// Where our ring is, for the peer.
    pub(super) fn ring_info(&self) -> RingInfo {
        RingInfo {
            addr: self.region.addr(0),
            rkey: self.recv_mr.rkey(),
            size_log: self.ring.trailing_zeros() as u8,
            receives: u16::try_from(self.rq).unwrap_or(u16::MAX),
        }
    }

    /// The peer's ring: sending may start once the QP is ready.
    pub(super) fn set_peer(&mut self, peer: RingInfo) {
        let mut state = self.sender.lock();
        state.peer = peer;
        state.flow = Some(SendFlow::new(
            peer.size(),
            self.ring as u64,
            u64::from(peer.receives),
            self.reserve,
            (self.max_chunk, self.max_unacked),
        ));
    }

    /// Keeps the CQ armed (after a completion event was taken for it).
    pub(super) fn note_cq_event(&mut self) {
        self.cq.note_event();
    }

    /// Takes every completion; an error completion is the connection's failure.
    pub(super) fn poll(&mut self, now: Instant) -> Result<(), String> {
        let mut wcs = [Wc::default(); 32];
        loop {
            let n = self
                .cq
                .poll(&mut wcs)
                .map_err(|e| format!("polling the CQ: {e}"))?;
            for wc in wcs.iter().take(n) {
                self.completion(wc, now)?;
            }
            if n < wcs.len() {
                break;
            }
        }
        // Re-arm, then look again: a completion between the last poll and the arm would
        // otherwise raise no event.
        self.cq.arm().map_err(|e| format!("arming the CQ: {e}"))?;
        let n = self
            .cq
            .poll(&mut wcs)
            .map_err(|e| format!("polling the CQ: {e}"))?;
        for wc in wcs.iter().take(n) {
            self.completion(wc, now)?;
        }
        self.flush_control();
        Ok(())
    }

    fn completion(&mut self, wc: &Wc, now: Instant) -> Result<(), String> {
        if wc.status != WC_SUCCESS {
            if self.peer_fin() {
                // The peer's FIN is in, so every byte of its direction arrived: a failure now
                // (a credit report, a probe, flushed receives) means the peer is gone. Nothing
                // more is posted; what arrived is still delivered, and the stream ends once it
                // was (`step_stream`).
                self.quiet = true;
                return Ok(());
            }
            return Err(format!(
                "work completion failed: {} (status {}) on {}",
                status_name(wc.status),
                wc.status,
                request_name(wc)
            ));
        }
        if wc.opcode & WC_RECV != 0 {
            self.last_rx = now;
            if wc.opcode == WC_RECV {
                self.control_arrived(wc)?;
            } else {
                self.data_arrived(wc)?;
            }
            return Ok(());
        }
        // A signaled request (data, control or probe): it and every request before it are done
        // ([`super::sender`]).
        let mut state = self.sender.lock();
        if let Some(controls) = state.signaled_done() {
            self.control_done = self.control_done.max(controls);
            self.sender.room_changed(&state);
        }
        drop(state);
        if wc.wr_id & !TAG_MASK == TAG_PROBE {
            self.probe_outstanding = false;
            self.last_rx = now;
        }
        Ok(())
    }

    /// A control message from the peer, in receive slot `wc.wr_id`: checked against what the
    /// connection takes now ([`Binding`]) before anything of it is used.
    fn control_arrived(&mut self, wc: &Wc) -> Result<(), String> {
        let len = wc.byte_len as usize;
        if len != CONTROL_LEN {
            return Err(format!("a control message of {len} bytes"));
        }
        let mut bytes = [0u8; SLOT];
        let off = self.control_recv_off() + wc.wr_id as usize * SLOT;
        self.region
            .load(off, &mut bytes)
            .map_err(|e| format!("control slot {}: {e}", wc.wr_id))?;
        self.post_recv(wc.wr_id)
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
        self.recv.lock().flow.reposted();
        let control =
            Control::decode(&bytes).ok_or_else(|| String::from("unknown control message"))?;
        self.binding
            .on_control(control.kind)
            .map_err(|v| v.to_string())?;
        let mut state = self.sender.lock();
        if let Some(send) = &mut state.flow {
            send.credit(control.consumed, control.reposted)
                .map_err(|e| e.to_string())?;
        }
        self.sender.room_changed(&state);
        drop(state);
        if control.kind == ControlKind::Fin {
            self.recv.lock().peer_fin = true;
        }
        Ok(())
    }

    /// Stream bytes from the peer (an RDMA write with immediate into the receive ring): taken
    /// only when the stream may carry them and the write is the next one, whole
    /// ([`crate::flow::RecvFlow::arrived`]).
    fn data_arrived(&mut self, wc: &Wc) -> Result<(), String> {
        if !wc.has_imm {
            return Err(String::from("a data write without an immediate"));
        }
        self.binding.on_data().map_err(|v| v.to_string())?;
        self.recv
            .lock()
            .flow
            .arrived(wc.byte_len, wc.imm)
            .map_err(|e| e.to_string())?;
        self.post_recv(wc.wr_id)
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
        self.recv.lock().flow.reposted();
        Ok(())
    }

    /// Queues our CLAIM with `secret` (the accepting side of the shim).
    pub(super) fn claim(&mut self, secret: Secret) {
        self.binding.claim_sent(secret);
        self.control(ControlKind::Claim(secret));
    }

    /// Queues our CONFIRM (the connecting side of the shim): the peer may send stream bytes
    /// from now on.
    pub(super) fn confirm(&mut self) {
        self.binding.confirm_sent();
        self.control(ControlKind::Confirm);
    }

    /// Queues a control message (sent as soon as the send queue has room).
    pub(super) fn control(&mut self, kind: ControlKind) {
        self.pending_control.push_back(kind);
        self.flush_control();
    }

    fn flush_control(&mut self) {
        if !self.ready || self.quiet || self.pending_control.is_empty() {
            return;
        }
        let sender = Arc::clone(&self.sender);
        let mut state = sender.lock();
        while state.has_room()
            && state.controls - self.control_done < u64::from(self.sq)
            && let Some(kind) = self.pending_control.front().copied()
        {
            if self.post_control(&mut state, kind).is_err() {
                // The QP is failing; its error completion reports it.
                return;
            }
            self.pending_control.pop_front();
        }
    }

    /// Posts one control message; the caller holds the send lock (`state`).
    fn post_control(&mut self, state: &mut SendState, kind: ControlKind) -> io::Result<()> {
        let (consumed, reposted) = self.recv.lock().flow.report();
        let bytes = Control {
            kind,
            consumed,
            reposted,
        }
        .encode();
        let seq = state.controls;
        let off = self.control_send_off() + (seq % u64::from(self.sq)) as usize * SLOT;
        self.region.store(off, &bytes)?;
        // FIN's completion says every byte before it arrived; a credit's says nothing needed.
        let signaled = state.signal_next(Request::Control, kind == ControlKind::Fin);
        self.qp.send(
            TAG_CONTROL | seq,
            Local {
                addr: self.region.addr(off),
                len: SLOT as u32,
                lkey: self.mr.lkey(),
            },
            signaled,
        )?;
        if kind == ControlKind::Fin {
            self.fin_seq = Some(seq);
        }
        state.note_posted(signaled, Request::Control);
        Ok(())
    }

    /// Sends a credit report when one is owed.
    pub(super) fn credit_if_due(&mut self) {
        if self.recv.lock().flow.credit_due()
            && !self.pending_control.contains(&ControlKind::Credit)
        {
            self.control(ControlKind::Credit);
        }
    }

    /// Reads from `local` into the send ring and writes it to the peer while the window
    /// allows. Ok(true) at the local side's EOF.
    pub(super) fn send_from(
        &mut self,
        local: &OwnedFd,
        ready: &mut Ready,
        draining: bool,
    ) -> io::Result<(bool, u64)> {
        let mut moved = 0u64;
        if !self.ready || self.quiet {
            return Ok((false, 0));
        }
        // Reading and posting under the send lock: a direct writer sees either none of these
        // bytes read from the socketpair or all of them posted ([`super::sender`]).
        let sender = Arc::clone(&self.sender);
        let mut state = sender.lock();
        while ready.readable && state.has_room() && state.engine_may_post() {
            let Some(w) = state.flow.as_ref().map(SendFlow::window) else {
                break;
            };
            if w.len == 0 {
                break;
            }
            match self
                .region
                .read_from(local.as_raw_fd(), sender.ring_offset(&w), w.len)
            {
                Ok(0) => return Ok((true, moved)),
                Ok(n) => {
                    sender.post_data(&mut state, &w, n)?;
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

    /// Writes what arrived to `local` while it takes it; the byte count.
    pub(super) fn deliver_to(&mut self, local: &OwnedFd, ready: &mut Ready) -> io::Result<u64> {
        let mut moved = 0u64;
        // Held while writing: a direct read never runs between a delivery and its accounting.
        let mut state = self.recv.lock();
        // A reader holding the stream takes the bytes itself (and wakes us when it lets go); a
        // waiting one gets a wake-up ([`super::direct`]).
        let mut budget = state.deliverable(|| unread_by_peer(local.as_raw_fd()).ok());
        while ready.writable && state.flow.has_pending() && budget > 0 {
            let (off, len) = state.flow.pending();
            let len = len.min(budget);
            match self.region.send_to(local.as_raw_fd(), off, len) {
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

    /// The stream's state in a few words (for error reports).
    pub(super) fn describe(&self) -> String {
        // One lock, taken and released before the text is built (it is not re-entrant).
        let (arrived, pending) = {
            let state = self.recv.lock();
            (state.flow.arrived_total(), state.flow.has_pending())
        };
        let sent = self.sender.lock().flow.as_ref().map_or(0, SendFlow::sent);
        format!(
            "peer FIN {}, our FIN {}{}, {} bytes arrived, {} sent, {} pending",
            if self.peer_fin() { "in" } else { "not in" },
            if self.fin_done() {
                "acknowledged"
            } else if self.fin_queued() {
                "sent"
            } else {
                "not sent"
            },
            if self.binding.claim().is_some() {
                ", CLAIM seen"
            } else {
                ""
            },
            arrived,
            sent,
            if pending { "bytes" } else { "nothing" },
        )
    }

    /// Turns direct reads on or off ([`super::direct`]).
    pub(super) fn set_direct(&mut self, on: bool) {
        if self.direct != on {
            self.recv.lock().direct = on;
            self.direct = on;
        }
    }

    /// Turns direct writes on or off ([`super::sender`]).
    pub(super) fn set_writing(&mut self, on: bool) {
        if self.writing != on {
            let mut state = self.sender.lock();
            state.direct = on;
            self.sender.room_changed(&state);
            drop(state);
            self.writing = on;
        }
    }

    /// No direct writer posts from now on (before the QP is destroyed); a waiting one stops
    /// waiting.
    pub(super) fn stop_writers(&self) {
        let mut state = self.sender.lock();
        state.direct = false;
        self.sender.room_changed(&state);
    }

    /// Bytes the app's direct writes posted since the last call.
    fn take_written_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.sender.lock().direct_bytes)
    }

    /// The send side, for [`super::Writer`]s.
    pub(super) fn sender(&self) -> &Arc<Sender> {
        &self.sender
    }

    /// Bytes the app's direct reads took since the last call.
    fn take_direct_bytes(&mut self) -> u64 {
        if !self.direct {
            return 0;
        }
        std::mem::take(&mut self.recv.lock().direct_bytes)
    }

    /// The receive side, for [`super::Reader`]s.
    pub(super) fn receiver(&self) -> &Arc<Receiver> {
        &self.recv
    }

    /// Bytes that arrived and wait for the local side.
    pub(super) fn has_pending(&self) -> bool {
        self.recv.lock().flow.has_pending()
    }

    /// The peer's FIN came (so every byte of its direction arrived or is on its way in order).
    pub(super) fn peer_fin(&self) -> bool {
        self.binding.peer_fin()
    }

    /// FIN was sent and its completion came back (so every byte before it arrived).
    pub(super) fn fin_done(&self) -> bool {
        self.fin_seq.is_some_and(|seq| self.control_done > seq)
    }

    /// FIN was queued.
    pub(super) fn fin_queued(&self) -> bool {
        self.fin_seq.is_some() || self.pending_control.contains(&ControlKind::Fin)
    }

    /// Sends a liveness probe when the peer has been silent for `keepalive`; the probe fails
    /// (an error completion) when the peer is gone.
    pub(super) fn probe_if_idle(&mut self, now: Instant, keepalive: Duration) {
        if !self.ready
            || self.quiet
            || self.probe_outstanding
            || now.saturating_duration_since(self.last_rx) < keepalive
        {
            return;
        }
        let mut state = self.sender.lock();
        if !state.has_room() {
            return;
        }
        if self
            .qp
            .write_probe(TAG_PROBE, state.peer.addr, state.peer.rkey)
            .is_ok()
        {
            self.probe_outstanding = true;
            state.note_posted(true, Request::Probe);
        }
    }

    /// When the next probe is due.
    pub(super) fn probe_due(&self, keepalive: Duration) -> Option<Instant> {
        (self.ready && !self.quiet && !self.probe_outstanding).then(|| self.last_rx + keepalive)
    }
}

/// Which work request a completion is for, in a few words (for error reports), from its id
/// alone (an error completion's opcode is undefined).
fn request_name(wc: &Wc) -> String {
    let n = wc.wr_id & TAG_MASK;
    match wc.wr_id & !TAG_MASK {
        0 => format!("receive {n}"),
        super::sender::TAG_DATA => format!("the data write ending at byte {n}"),
        TAG_CONTROL => format!("control message {n}"),
        TAG_PROBE => String::from("a probe"),
        _ => format!("work request {:#x}", wc.wr_id),
    }
}

/// A readable name for a work completion status.
fn status_name(status: u32) -> &'static str {
    match status {
        1 => "local length error",
        2 => "local QP operation error",
        4 => "local protection error",
        5 => "work request flushed",
        7 => "bad response",
        8 => "local access error",
        9 => "remote invalid request",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "transport retry counter exceeded (peer unreachable)",
        13 => "RNR retry counter exceeded",
        _ => "error",
    }
}

/// An attached local side.
pub(super) struct Attached {
    pub(super) local: OwnedFd,
    pub(super) local_ready: Ready,
    pub(super) kept: Option<Arc<OwnedFd>>,
    /// The kept socket is watched (until its FIN).
    pub(super) watch_kept: bool,
    pub(super) kept_ready: Ready,
    /// The accepting side of [`Handshake::Claim`] until its stream is bound.
    pub(super) awaiting: Option<Awaiting>,
    pub(super) local_eof: bool,
    pub(super) local_shut: bool,
    pub(super) sent: u64,
    pub(super) received: u64,
    pub(super) on_event: Box<dyn FnMut(Event) + Send>,
    pub(super) on_bytes: Option<fn(u64, u64)>,
}

/// What an accepting side ([`Handshake::Claim`]) waits for before its stream carries a byte:
/// the proof on the TCP connection ([`super::proof`]) and the peer's CONFIRM.
#[derive(Debug, Clone, Copy)]
pub(super) struct Awaiting {
    /// Until when (then: relay over TCP).
    pub(super) deadline: Instant,
    /// The secret our CLAIM carried.
    pub(super) secret: Secret,
    /// The secret came first on the TCP connection and was taken off it: the client committed
    /// to the stream.
    pub(super) proven: bool,
}

/// What the local side is doing.
pub(super) enum App {
    /// Not attached yet.
    Unattached,
    /// Pumping to and from the stream (or waiting for CONFIRM).
    Stream(Attached),
    /// Relaying over the kept TCP socket.
    Relay(Relay, Box<dyn FnMut(Event) + Send>),
    /// Finished.
    Done,
}

/// The CM side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmPhase {
    /// Active: resolving the address, then the route; connecting.
    Resolving,
    Connecting,
    /// Passive: the acceptor deferred its decision (until the deadline).
    Deciding(Instant),
    /// Passive: accepted, not yet established.
    Accepted,
    Established,
    /// Disconnect sent; the id is destroyed at DISCONNECTED or at the deadline.
    Disconnecting(Instant),
}

/// One connection.
pub(super) struct StreamConn {
    pub(super) shared: Arc<ConnShared>,
    pub(super) id: Option<CmId>,
    pub(super) cm: CmPhase,
    pub(super) rdma: Option<Rdma>,
    pub(super) app: App,
    /// When an established, unattached connection is dropped.
    pub(super) unattached_deadline: Option<Instant>,
    /// Why the stream failed (kept for the end report).
    pub(super) error: Option<String>,
    /// The CM reported the peer's disconnect.
    pub(super) peer_gone: bool,
    /// An incoming connection: what its request said (kept for the accept, which allocates).
    pub(super) offer: Option<Offer>,
}

/// What an incoming connect request offered: the peer's ring and where it came from, and how
/// the listener's connections start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer {
    pub(super) ring: RingInfo,
    pub(super) from: Option<std::net::IpAddr>,
    pub(super) handshake: Handshake,
}

/// What the loop must do with epoll registrations after a transition.
#[derive(Debug, Default)]
pub(super) struct Fds {
    /// Fds to remove from epoll and let go (closed when no other holder is left).
    pub(super) closing: Vec<Arc<OwnedFd>>,
    /// The kept socket needs no more watching (its FIN came).
    pub(super) unwatch_kept: bool,
}

impl StreamConn {
    pub(super) fn new(shared: Arc<ConnShared>, id: Option<CmId>, cm: CmPhase) -> StreamConn {
        StreamConn {
            shared,
            id,
            cm,
            rdma: None,
            app: App::Unattached,
            unattached_deadline: None,
            error: None,
            peer_gone: false,
            offer: None,
        }
    }

    /// An incoming connection that waits for its decision or its app: state an
    /// unauthenticated peer can make ([`super::EngineConfig::max_unattached`]).
    pub(super) fn unattached_incoming(&self) -> bool {
        self.offer.is_some() && self.id.is_some() && matches!(self.app, App::Unattached)
    }

    /// True when nothing is left: no id, no resources, no local side.
    pub(super) fn finished(&self) -> bool {
        self.id.is_none() && self.rdma.is_none() && matches!(self.app, App::Unattached | App::Done)
    }

    /// The stream carries bytes (established or accepted, not failing).
    fn stream_usable(&self) -> bool {
        self.error.is_none()
            && !matches!(self.cm, CmPhase::Disconnecting(_))
            && self.rdma.as_ref().is_some_and(|r| r.ready)
    }

    /// Takes the local side: pumped from now on.
    pub(super) fn attach(
        &mut self,
        local: OwnedFd,
        attach: Attach,
        config: &EngineConfig,
        now: Instant,
        fds: &mut Fds,
    ) {
        let Attach {
            kept,
            handshake,
            on_event,
            on_bytes,
            give_back,
        } = attach;
        self.unattached_deadline = None;
        let alive = self.error.is_none()
            && !self.peer_gone
            && self
                .rdma
                .as_ref()
                .is_some_and(|r| r.binding.handshake() == handshake)
            && !matches!(self.cm, CmPhase::Disconnecting(_));
        let mut attached = Attached {
            local,
            local_ready: Ready {
                readable: true,
                writable: true,
            },
            watch_kept: kept.is_some(),
            kept,
            kept_ready: Ready::default(),
            awaiting: None,
            local_eof: false,
            local_shut: false,
            sent: 0,
            received: 0,
            on_event,
            on_bytes,
        };
        if !alive {
            if attached.kept.is_none()
                && let Some(give_back) = give_back
            {
                // Nothing was read from `local`: its owner carries it another way.
                give_back(attached.local);
                self.app = App::Done;
                return;
            }
            // Gone before the attach. Without CONFIRM neither side moved: relay over TCP.
            match (handshake, attached.kept.take()) {
                (Handshake::Confirm | Handshake::Claim, Some(kept)) => {
                    (attached.on_event)(Event::Decided(StreamPath::Tcp));
                    self.app = App::Relay(Relay::new(attached.local, kept), attached.on_event);
                }
                (_, kept) => {
                    (attached.on_event)(Event::Decided(StreamPath::Broken));
                    (attached.on_event)(Event::Ended(End {
                        path: StreamPath::Broken,
                        sent: 0,
                        received: 0,
                        error: Some(String::from("the connection ended before it was attached")),
                    }));
                    fd::shutdown_quietly(attached.local.as_fd(), Shutdown::Both);
                    if let Some(k) = kept {
                        fd::reset(k.as_fd());
                        fds.closing.push(k);
                    }
                    fds.closing.push(Arc::new(attached.local));
                    self.app = App::Done;
                }
            }
            return;
        }
        match handshake {
            Handshake::Open | Handshake::Confirm => {
                if handshake == Handshake::Confirm
                    && let Some(r) = &mut self.rdma
                {
                    r.confirm();
                }
                (attached.on_event)(Event::Decided(StreamPath::Rdma));
            }
            Handshake::Claim => {
                let (Some(r), Some(secret)) = (&mut self.rdma, Secret::random()) else {
                    // No secret, no binding: the client gets no CLAIM and stays on TCP.
                    self.app = App::Stream(attached);
                    self.relay_instead(fds);
                    return;
                };
                r.claim(secret);
                attached.awaiting = Some(Awaiting {
                    deadline: now + config.claim_timeout,
                    secret,
                    proven: false,
                });
            }
        }
        self.app = App::Stream(attached);
    }

    /// The local fd became ready.
    pub(super) fn local_event(&mut self, readable: bool, writable: bool) {
        match &mut self.app {
            App::Stream(a) => {
                a.local_ready.readable |= readable;
                a.local_ready.writable |= writable;
            }
            App::Relay(r, _) => {
                r.local_ready.readable |= readable;
                r.local_ready.writable |= writable;
            }
            App::Unattached | App::Done => {}
        }
    }

    /// The kept TCP socket became ready.
    pub(super) fn kept_event(&mut self, readable: bool, writable: bool, fds: &mut Fds) {
        match &mut self.app {
            App::Stream(a) => {
                a.kept_ready.readable |= readable;
                a.kept_ready.writable |= writable;
                if !a.watch_kept || !readable {
                    return;
                }
                let Some(kept) = &a.kept else { return };
                match fd::peek(kept) {
                    fd::Peeked::Nothing => {}
                    // A peer that finished closes its TCP socket while its last bytes may
                    // still be on the stream: a FIN only ends the watch.
                    fd::Peeked::Fin => {
                        a.watch_kept = false;
                        fds.unwatch_kept = true;
                    }
                    fd::Peeked::Bytes => {
                        if a.awaiting.is_some_and(|w| !w.proven) {
                            // The proof, or the client speaking TCP.
                            self.check_proof(fds);
                        } else {
                            self.fail("bytes arrived on the kept TCP connection".into(), fds);
                        }
                    }
                    fd::Peeked::Failed(e) => {
                        self.fail(format!("the kept TCP connection failed: {e}"), fds);
                    }
                }
            }
            App::Relay(r, _) => {
                r.far_ready.readable |= readable;
                r.far_ready.writable |= writable;
            }
            App::Unattached | App::Done => {}
        }
    }

    /// The accepting side waits for the proof: looks at the kept TCP socket's first bytes
    /// ([`super::proof`]). The secret binds (it is taken off the socket); anything else, or the
    /// client's EOF, is the client on TCP (relay); a failed socket fails the connection.
    fn check_proof(&mut self, fds: &mut Fds) {
        let App::Stream(a) = &mut self.app else {
            return;
        };
        let (Some(w), Some(kept)) = (a.awaiting.as_mut(), a.kept.as_ref()) else {
            return;
        };
        if w.proven {
            return;
        }
        match proof::look(kept, &w.secret) {
            Look::Partial => {}
            Look::Whole => match proof::take(kept) {
                Ok(()) => w.proven = true,
                Err(e) => self.fail(format!("taking the proof: {e}"), fds),
            },
            Look::Other | Look::Eof => self.relay_instead(fds),
            Look::Failed(e) => self.fail(format!("the kept TCP connection failed: {e}"), fds),
        }
    }

    /// Gives up the stream of a [`Handshake::Claim`] connection not bound yet: the client
    /// stayed on TCP (or is not the RDMA peer), so the local side is relayed over the kept
    /// socket.
    fn relay_instead(&mut self, fds: &mut Fds) {
        let App::Stream(a) = std::mem::replace(&mut self.app, App::Done) else {
            return;
        };
        let Attached {
            local,
            kept,
            mut on_event,
            awaiting,
            ..
        } = a;
        match kept {
            Some(kept) => {
                on_event(Event::Decided(StreamPath::Tcp));
                // A proof that comes after all must not reach the app (the relay's guard).
                let relay = match awaiting {
                    Some(w) => Relay::guarded(local, kept, w.secret, Instant::now() + GUARD_WAIT),
                    None => Relay::new(local, kept),
                };
                self.app = App::Relay(relay, on_event);
            }
            None => {
                on_event(Event::Decided(StreamPath::Broken));
                on_event(Event::Ended(End {
                    path: StreamPath::Broken,
                    sent: 0,
                    received: 0,
                    error: Some(String::from(
                        "no CONFIRM and no TCP connection to fall back on",
                    )),
                }));
                fd::shutdown_quietly(local.as_fd(), Shutdown::Both);
                fds.closing.push(Arc::new(local));
            }
        }
        self.error
            .get_or_insert_with(|| String::from("the peer stayed on TCP"));
    }

    /// The stream failed: the local side is shut down and a kept socket reset (the peer's
    /// TCP then fails too); the CM side is torn down by the loop.
    pub(super) fn fail(&mut self, why: String, fds: &mut Fds) {
        if let App::Stream(a) = &self.app
            && a.awaiting.is_some_and(|w| !w.proven)
        {
            let broken = a
                .kept
                .as_ref()
                .is_some_and(|k| matches!(fd::peek(k), fd::Peeked::Failed(_)));
            if !broken {
                // Not bound: the RDMA peer broke the rules, gave up or never proved it holds
                // the TCP connection, whose client is on TCP.
                self.relay_instead(fds);
                return;
            }
        }
        if self.error.is_none() {
            self.error = Some(why.clone());
        }
        if let Some(rdma) = &mut self.rdma {
            rdma.set_writing(false);
        }
        let app = std::mem::replace(&mut self.app, App::Done);
        match app {
            App::Stream(mut a) => {
                if a.awaiting.is_some() {
                    (a.on_event)(Event::Decided(StreamPath::Broken));
                }
                let path = if a.awaiting.is_some() {
                    StreamPath::Broken
                } else {
                    StreamPath::Rdma
                };
                // Reported before the local side ends, so the app's next read after the
                // delivered bytes can tell a broken stream from an orderly end.
                (a.on_event)(Event::Ended(End {
                    path,
                    sent: a.sent,
                    received: a.received,
                    error: Some(why),
                }));
                fd::shutdown_quietly(a.local.as_fd(), Shutdown::Both);
                if let Some(k) = a.kept.take() {
                    fd::reset(k.as_fd());
                    fds.closing.push(k);
                }
                fds.closing.push(Arc::new(a.local));
            }
            other => self.app = other,
        }
    }

    /// Moves bytes and advances the state after any event. `draining`: the process exits.
    pub(super) fn progress(
        &mut self,
        now: Instant,
        config: &EngineConfig,
        draining: bool,
        fds: &mut Fds,
    ) {
        if let App::Stream(a) = &self.app
            && a.awaiting.is_some_and(|w| !w.proven)
            && self.stream_usable()
        {
            // Also here, not only on the kept socket's events: the proof may have come before
            // the socket was watched.
            self.check_proof(fds);
        }
        self.step_relay(draining, fds);
        if !self.stream_usable() {
            return;
        }
        match self.step_stream(now, draining) {
            Ok(true) => self.finish_stream(fds),
            Ok(false) => {}
            Err(why) => {
                self.fail(why, fds);
                return;
            }
        }
        if let Some(rdma) = &mut self.rdma {
            rdma.probe_if_idle(now, config.keepalive);
        }
    }

    fn step_relay(&mut self, draining: bool, fds: &mut Fds) {
        let App::Relay(relay, on_event) = &mut self.app else {
            return;
        };
        let error = match relay.step(draining) {
            Step::Idle => return,
            Step::Finished => None,
            Step::Failed(e) => Some(e.to_string()),
        };
        let (sent, received) = relay.moved();
        let failed = error.is_some();
        on_event(Event::Ended(End {
            path: StreamPath::Tcp,
            sent,
            received,
            error,
        }));
        if failed {
            // After the report: the app's next read can tell the failure from an end.
            fd::shutdown_quietly(relay.local.as_fd(), Shutdown::Both);
        }
        if let App::Relay(relay, _) = std::mem::replace(&mut self.app, App::Done) {
            fds.closing.push(Arc::new(relay.local));
            fds.closing.push(relay.far);
        }
    }

    /// One round of the stream: Ok(true) when both directions finished.
    fn step_stream(&mut self, now: Instant, draining: bool) -> Result<bool, String> {
        let StreamConn {
            rdma,
            app,
            shared,
            peer_gone,
            ..
        } = self;
        let Some(rdma) = rdma.as_mut() else {
            return Ok(false);
        };
        rdma.poll(now)?;
        // The connecting side waits for CLAIM before it attaches: told once it came, and
        // nothing to tell after the attach.
        if matches!(app, App::Unattached)
            && let Some(secret) = rdma.binding.claim()
        {
            shared.claimed(secret);
        }
        let App::Stream(a) = app else {
            rdma.credit_if_due();
            return Ok(false);
        };
        if let Some(w) = a.awaiting {
            // Bound once the TCP client proved it holds our CLAIM's secret and the RDMA peer
            // confirmed; until then nothing the peer sent reaches the app.
            if !(w.proven && rdma.binding.confirm_seen()) {
                rdma.credit_if_due();
                return Ok(false);
            }
            a.awaiting = None;
            (a.on_event)(Event::Decided(StreamPath::Rdma));
        }
        pump(rdma, a, draining).map_err(|e| format!("local side: {e}"))?;
        let inbound_done = rdma.peer_fin() && a.local_shut && !rdma.has_pending();
        // A peer gone after its FIN (its process exited, say) ends the stream once the app has
        // every byte it sent and its EOF, as a TCP socket's would: what the app writes from now
        // on has nowhere to go (the closed local side answers EPIPE, or a reset when it held
        // unread bytes of the app).
        let peer_left = *peer_gone || rdma.quiet;
        Ok(inbound_done && (rdma.fin_done() || peer_left))
    }

    /// Both directions finished: the local side is closed and the end reported; the loop
    /// disconnects.
    fn finish_stream(&mut self, fds: &mut Fds) {
        let App::Stream(a) = std::mem::replace(&mut self.app, App::Done) else {
            return;
        };
        let Attached {
            local,
            kept,
            mut on_event,
            sent,
            received,
            ..
        } = a;
        on_event(Event::Ended(End {
            path: StreamPath::Rdma,
            sent,
            received,
            error: None,
        }));
        fds.closing.push(Arc::new(local));
        if let Some(k) = kept {
            fds.closing.push(k);
        }
    }

    /// Bytes moved between the local side and the peer so far (the exit flush's sign of
    /// progress).
    pub(super) fn moved(&self) -> u64 {
        match &self.app {
            App::Stream(a) => a.sent + a.received,
            App::Relay(r, _) => {
                let (up, down) = r.moved();
                up + down
            }
            App::Unattached | App::Done => 0,
        }
    }

    /// The stream's graceful end: both directions done, nothing attached any more.
    pub(super) fn stream_done(&self) -> bool {
        matches!(self.app, App::Done) && self.error.is_none()
    }

    /// True while the local side still has bytes of the app to deliver (the exit flush).
    pub(super) fn unflushed(&self) -> bool {
        match &self.app {
            App::Stream(_) => {
                !self.rdma.as_ref().is_some_and(Rdma::fin_done) && self.error.is_none()
            }
            App::Relay(r, _) => r.unflushed(),
            App::Unattached | App::Done => false,
        }
    }

    /// The earliest moment something must happen without an event.
    pub(super) fn next_deadline(&self, config: &EngineConfig) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut at = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        at(self.unattached_deadline);
        match self.cm {
            CmPhase::Deciding(t) | CmPhase::Disconnecting(t) => at(Some(t)),
            _ => {}
        }
        if let App::Relay(r, _) = &self.app {
            at(r.deadline());
        }
        if let App::Stream(a) = &self.app {
            at(a.awaiting.map(|w| w.deadline));
            if self.stream_usable() {
                at(self
                    .rdma
                    .as_ref()
                    .and_then(|r| r.probe_due(config.keepalive)));
            }
        }
        next
    }
}

/// The stream's pump: what arrived to the local side, the local side's bytes to the peer, the
/// half-closes and the credits.
fn pump(rdma: &mut Rdma, a: &mut Attached, draining: bool) -> io::Result<()> {
    rdma.set_direct(true);
    let received = rdma.deliver_to(&a.local, &mut a.local_ready)? + rdma.take_direct_bytes();
    if rdma.peer_fin() && !rdma.has_pending() && !a.local_shut {
        fd::shutdown_quietly(a.local.as_fd(), Shutdown::Write);
        a.local_shut = true;
    }
    rdma.credit_if_due();
    let mut sent = rdma.take_written_bytes();
    if !a.local_eof {
        let (eof, moved) = rdma.send_from(&a.local, &mut a.local_ready, draining)?;
        sent += moved;
        a.local_eof = eof;
    }
    // The app may write straight into the send ring until its side ended.
    rdma.set_writing(rdma.ready && !rdma.quiet && !a.local_eof);
    a.sent += sent;
    a.received += received;
    if (sent > 0 || received > 0)
        && let Some(count) = a.on_bytes
    {
        count(sent, received);
    }
    if a.local_eof && !rdma.fin_queued() {
        rdma.control(ControlKind::Fin);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;

    /// A connection that ended before anything was attached (as the event loop makes one for
    /// an attach to an unknown token).
    fn gone() -> StreamConn {
        let mut c = StreamConn::new(
            Arc::new(ConnShared::connecting(None)),
            None,
            CmPhase::Established,
        );
        c.error = Some(String::from("closed"));
        c
    }

    fn attach(
        events: Arc<Mutex<Vec<String>>>,
        give_back: Option<Box<dyn FnOnce(OwnedFd) + Send>>,
    ) -> Attach {
        Attach {
            kept: None,
            handshake: Handshake::Open,
            on_bytes: None,
            give_back,
            on_event: Box::new(move |e| {
                let text = match e {
                    Event::Decided(p) => format!("decided {p:?}"),
                    Event::Ended(end) => format!("ended {:?}", end.path),
                };
                events.lock().unwrap().push(text);
            }),
        }
    }

    #[test]
    fn a_socket_attached_to_a_gone_connection_comes_back_untouched() {
        let (mut app, local) = UnixStream::pair().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let returned = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&returned);
        let mut conn = gone();
        let mut fds = Fds::default();
        conn.attach(
            OwnedFd::from(local),
            attach(
                Arc::clone(&events),
                Some(Box::new(move |fd| *slot.lock().unwrap() = Some(fd))),
            ),
            &EngineConfig::default(),
            Instant::now(),
            &mut fds,
        );
        assert!(
            events.lock().unwrap().is_empty(),
            "no event after a give-back"
        );
        assert!(fds.closing.is_empty(), "nothing of it is closed");
        let back = returned
            .lock()
            .unwrap()
            .take()
            .expect("the socket came back");
        // Still connected and unread: what the app writes is there to read.
        app.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        UnixStream::from(back).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn without_a_give_back_the_stream_ends_broken_and_the_socket_is_shut() {
        let (mut app, local) = UnixStream::pair().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let mut conn = gone();
        let mut fds = Fds::default();
        conn.attach(
            OwnedFd::from(local),
            attach(Arc::clone(&events), None),
            &EngineConfig::default(),
            Instant::now(),
            &mut fds,
        );
        assert_eq!(*events.lock().unwrap(), ["decided Broken", "ended Broken"]);
        let mut rest = Vec::new();
        assert_eq!(app.read_to_end(&mut rest).unwrap(), 0, "EOF for the app");
    }
}
