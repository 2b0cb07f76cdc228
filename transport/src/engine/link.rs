//! One connection's queue pair and what hangs off it (net/smc's link and connection
//! resources): its region, protection domain and registrations, its CQ, its send half
//! ([`super::tx`]) and receive half ([`super::rx`]), and what the binding lets the peer send
//! ([`super::binding`]). [`Link::poll`] takes the completions ([`super::wr`]) and hands each to
//! the half it concerns; control messages go through [`super::cdc`].
//!
//! Everything here runs on the engine thread. The halves' state is behind their own locks
//! ([`super::lock_order`]); this module takes none itself.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::binding::Binding;
use super::cdc;
use super::relay::Ready;
use super::rings::{Activity, SendRing};
use super::rx::{Receiver, RingState};
use super::tx::Sender;
use super::wr::{self, Completion, Completions, Post};
use super::{Budget, EngineConfig, Handshake, SLOT};
use crate::flow::{RecvFlow, SendFlow};
use crate::rdma::{Access, CmId, Device, Local, Mr, Pd, Region, Wc};
use crate::wire::{ControlKind, Payload, RingInfo, Secret};

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

/// A connection's verbs resources and its two halves.
pub(super) struct Link {
    qp: Arc<dyn Post>,
    // Drop order matters: the QP (the id's) is destroyed first by the loop, then the CQ, the
    // MRs, the PD and the memory, in this field order.
    cq: Box<dyn Completions>,
    keys: Keys,
    region: Arc<Region>,
    pinned: u64,
    /// The device's index in the engine (the pool's key).
    device: usize,
    ring: usize,
    rq: u32,
    sq: u32,
    reserve: u64,
    max_chunk: u64,
    max_unacked: u64,
    /// The send half, shared with the app's direct writes.
    sender: Arc<Sender>,
    /// Direct writes are on (the engine's copy, so that it takes the send lock only to change
    /// it).
    writing: bool,
    /// The receive half, shared with the app's direct reads.
    recv: Arc<Receiver>,
    /// Direct reads are on (the engine's copy).
    reading: bool,
    /// The QP may post sends (the accept was sent, or the connection is established).
    ready: bool,
    /// The peer FIN is in and a later work request failed (the peer is gone): nothing more is
    /// posted.
    quiet: bool,
    /// A probe is posted and not completed (only the engine thread probes).
    probe_outstanding: bool,
    /// When the peer was last heard from (a completion of ours or a message of its).
    last_rx: Instant,
    /// What the peer may send, by the handshake, and whether its FIN came.
    binding: Binding,
    /// The busy rings (`super::rings`): their size (0: the rings never change) and where they
    /// start in the region (the receive ring, then the send ring).
    busy: usize,
    busy_off: usize,
    /// The budget the busy rings are pinned against.
    budget: Arc<Budget>,
    /// The busy rings' registrations ([`RECV`], [`SEND`]): the receive ring's while it is
    /// offered, in use or being left, the send ring's while it is made ready, in use or being
    /// left.
    busy_mrs: [Option<Mr>; 2],
    send_ring: SendRing,
    /// A ring the peer offered that our writes have not moved to yet.
    peer_offer: Option<RingInfo>,
    /// A busy ring could not be registered: this connection stays on its start rings.
    busy_failed: bool,
    activity: Activity,
    /// The peer's start ring (from its connect request or accept): where a connection that
    /// reuses this queue pair writes from its first byte.
    peer_start: RingInfo,
    /// The CQ's context (the token of the connection it was made for), which its completion
    /// events name.
    cq_key: u64,
    /// The peer's REUSE (accepting side) or REUSED (connecting side), not taken yet.
    reuse: Option<Payload>,
}

/// A connection's two halves over `qp` and `region`: the start rings of `ring` bytes, `rq`
/// receives and `sq` send queue entries, at most `max_unacked` bytes in flight.
fn halves(
    qp: &Arc<dyn Post>,
    region: &Arc<Region>,
    (ring, rq, sq): (usize, u32, u32),
    lkey: u32,
    max_unacked: u64,
) -> (Arc<Sender>, Arc<Receiver>) {
    let sender = Arc::new(Sender::new(
        Arc::clone(qp),
        Arc::clone(region),
        (ring, ring),
        2 * ring + rq as usize * SLOT,
        lkey,
        sq,
        max_unacked,
    ));
    let recv = Receiver::new(
        Arc::clone(region),
        RecvFlow::new(ring as u64, u64::from(rq)),
    );
    (sender, recv)
}

/// The busy receive ring: the first of the two after the start part.
const RECV: usize = 0;
/// The busy send ring, after the busy receive ring.
const SEND: usize = 1;

/// A connection's registrations.
enum Keys {
    /// The device's.
    Registered {
        /// The receive ring's registration, the only remotely writable one (its rkey is the
        /// peer's).
        recv_mr: Mr,
        /// The send ring's and the control slots' registration (local access only).
        mr: Mr,
        /// This connection's own protection domain: no other connection's queue pair can use
        /// its keys.
        pd: Pd,
    },
    /// The simulated fabric's (in-process tests: `super::sim`).
    #[cfg(test)]
    Simulated { lkey: u32, rkey: u32 },
}

impl Keys {
    /// The protection domain (None on the simulated fabric).
    fn pd(&self) -> Option<&Pd> {
        match self {
            Keys::Registered { pd, .. } => Some(pd),
            #[cfg(test)]
            Keys::Simulated { .. } => None,
        }
    }

    fn lkey(&self) -> u32 {
        match self {
            Keys::Registered { mr, .. } => mr.lkey(),
            #[cfg(test)]
            Keys::Simulated { lkey, .. } => *lkey,
        }
    }

    fn rkey(&self) -> u32 {
        match self {
            Keys::Registered { recv_mr, .. } => recv_mr.rkey(),
            #[cfg(test)]
            Keys::Simulated { rkey, .. } => *rkey,
        }
    }
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

impl Link {
    /// The buffers, CQ and QP for `id` on `device` (index `index`), with every receive posted.
    /// `kept`: a region a finished connection left on this device, with its budget share;
    /// otherwise the budget is asked and a region registered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: &EngineConfig,
        budget: &Arc<Budget>,
        (device, index): (&Device, usize),
        kept: Option<(Buffers, u64)>,
        id: CmId,
        token: u64,
        now: Instant,
        handshake: super::Handshake,
    ) -> Result<Link, SetupError> {
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
        let made = Link::make(
            config,
            budget,
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
    /// `device`: the start receive ring for the peer's writes, the start send ring and the
    /// control slots for local access only. The busy rings after them are mapped only
    /// (registered while a stream is busy: [`Link::adjust_rings`]).
    fn register(config: &EngineConfig, device: &Device) -> Result<Buffers, SetupError> {
        let ring = config.start_ring();
        let region = Arc::new(
            Region::new(config.region_bytes())
                .map_err(|e| SetupError::Local("mmap of the buffers", e))?,
        );
        let pd = device
            .alloc_pd()
            .map_err(|e| SetupError::Local("ibv_alloc_pd", e))?;
        let mr = pd
            .register(&region, ring, config.start_bytes() - ring, Access::Local)
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
        budget: &Arc<Budget>,
        (device, index): (&Device, usize),
        buffers: Option<Buffers>,
        (id, token, handshake): (CmId, u64, super::Handshake),
        now: Instant,
        pinned: u64,
    ) -> Result<Link, SetupError> {
        let (rq, sq) = (config.recv_queue.max(4), config.send_queue.max(4));
        // A kept region was renewed when it was kept: its ring is zeroed and its key fresh.
        let Buffers {
            recv_mr,
            mr,
            pd,
            region,
        } = match buffers {
            Some(b) => b,
            None => Link::register(config, device)?,
        };
        let mut cq = device
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
        let link = Link::assemble(
            config,
            (Arc::new(qp), Box::new(cq)),
            (Keys::Registered { recv_mr, mr, pd }, Arc::clone(budget)),
            region,
            (index, pinned, token),
            (now, handshake),
        );
        if let Err(e) = link.post_receives() {
            // The QP goes before the CQ it uses (which `link` drops on the way out): a CQ
            // still in use cannot be destroyed.
            id.destroy_qp();
            return Err(SetupError::Local("ibv_post_recv", e));
        }
        Ok(link)
    }

    /// A link on side `side` of the simulated fabric `fabric` (in-process tests), with the
    /// handshake `handshake`, set up at `now`.
    #[cfg(test)]
    pub(super) fn simulated(
        config: &EngineConfig,
        fabric: &super::sim::Fabric,
        side: usize,
        (now, handshake): (Instant, Handshake),
    ) -> Link {
        let region = Arc::new(Region::new(config.region_bytes()).expect("mmap"));
        let (qp, cq, rkey) = fabric.attach(side, &region, config.start_ring());
        let keys = Keys::Simulated { lkey: 1, rkey };
        let budget = Arc::new(Budget::new(None));
        let link = Link::assemble(
            config,
            (qp, cq),
            (keys, budget),
            region,
            (0, 0, 0),
            (now, handshake),
        );
        link.post_receives()
            .expect("the simulated fabric takes receives");
        link
    }

    /// A link over `qp` and `cq` with its halves ([`Link::post_receives`] next); its busy
    /// rings are pinned against `budget`.
    fn assemble(
        config: &EngineConfig,
        (qp, cq): (Arc<dyn Post>, Box<dyn Completions>),
        (keys, budget): (Keys, Arc<Budget>),
        region: Arc<Region>,
        (index, pinned, cq_key): (usize, u64, u64),
        (now, handshake): (Instant, Handshake),
    ) -> Link {
        let ring = config.start_ring();
        let (rq, sq) = (config.recv_queue.max(4), config.send_queue.max(4));
        let max_unacked = config.max_unacked() as u64;
        let (sender, recv) = halves(&qp, &region, (ring, rq, sq), keys.lkey(), max_unacked);
        // Busy rings only where the region has them and the budget can be asked.
        let busy = if matches!(keys, Keys::Registered { .. }) {
            config.busy_ring()
        } else {
            0
        };
        Link {
            qp,
            cq,
            keys,
            recv,
            reading: false,
            region,
            pinned,
            device: index,
            ring,
            rq,
            sq,
            reserve: u64::from(rq / 4).max(1),
            max_chunk: config.max_chunk() as u64,
            max_unacked,
            busy,
            busy_off: config.start_bytes(),
            budget,
            busy_mrs: [None, None],
            send_ring: SendRing::Start,
            peer_offer: None,
            busy_failed: false,
            activity: Activity::new(now),
            sender,
            writing: false,
            ready: false,
            quiet: false,
            probe_outstanding: false,
            last_rx: now,
            binding: Binding::new(handshake),
            peer_start: RingInfo::default(),
            cq_key,
            reuse: None,
        }
    }

    /// Posts every receive (one per control slot).
    fn post_receives(&self) -> io::Result<()> {
        (0..self.rq).try_for_each(|slot| self.post_recv(u64::from(slot)))
    }

    /// What outlives the connection once its QP is destroyed (the caller destroyed it): the
    /// region with its PD and local registration, to be renewed for another connection
    /// ([`Leftover::renewed`]), and its budget share. The CQ and the receive ring's
    /// registration go. None for the region while an app thread still copies from or into it
    /// (a direct read or write): it is not reused, and unmapped when that thread lets go.
    pub(super) fn into_leftover(mut self) -> (Option<Leftover>, u64) {
        let reusable = self.recv.retire() && !self.sender.copying();
        // The busy rings go now (their registrations, their pages and their budget share); a
        // region still copied from or into is not reused, so its pages may stay.
        self.free_busy(RECV, reusable);
        self.free_busy(SEND, reusable);
        let Link {
            cq,
            keys,
            region,
            pinned,
            ring,
            ..
        } = self;
        drop(cq);
        let leftover = match keys {
            Keys::Registered { recv_mr, mr, pd } => {
                drop(recv_mr);
                Some(Leftover {
                    mr,
                    pd,
                    region,
                    ring,
                })
            }
            #[cfg(test)]
            Keys::Simulated { .. } => None,
        };
        (leftover.filter(|_| reusable), pinned)
    }

    fn control_recv_off(&self) -> usize {
        2 * self.ring
    }

    fn post_recv(&self, slot: u64) -> io::Result<()> {
        let off = self.control_recv_off() + slot as usize * SLOT;
        self.qp.recv(
            slot,
            Local {
                addr: self.region.addr(off),
                len: SLOT as u32,
                lkey: self.keys.lkey(),
            },
        )
    }

    /// Where our ring is, for the peer.
    pub(super) fn ring_info(&self) -> RingInfo {
        RingInfo {
            addr: self.region.addr(0),
            rkey: self.keys.rkey(),
            size_log: self.ring.trailing_zeros() as u8,
            receives: u16::try_from(self.rq).unwrap_or(u16::MAX),
        }
    }

    /// The peer's ring: sending may start once the QP is ready.
    pub(super) fn set_peer(&mut self, peer: RingInfo) {
        self.peer_start = peer;
        let max_unacked = self.max_unacked.min(self.ring as u64);
        let flow = SendFlow::new(
            peer.size(),
            self.ring as u64,
            u64::from(peer.receives),
            self.reserve,
            (
                self.max_chunk
                    .min(crate::flow::chunk_for(peer.size(), max_unacked)),
                self.max_unacked,
            ),
        );
        self.sender.set_peer(peer, flow);
    }

    /// The QP may post sends from `now` on (the accept was sent, or the connection is
    /// established).
    pub(super) fn set_ready(&mut self, now: Instant) {
        self.ready = true;
        self.last_rx = now;
    }

    /// The CM heard from the peer at `now`.
    pub(super) fn heard(&mut self, now: Instant) {
        self.last_rx = now;
    }

    /// The QP may post sends.
    pub(super) fn is_ready(&self) -> bool {
        self.ready
    }

    /// The peer is gone after its FIN: nothing more is posted.
    pub(super) fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// Bytes pinned for this connection (its budget share).
    pub(super) fn pinned(&self) -> u64 {
        self.pinned
    }

    /// The device's index in the engine.
    pub(super) fn device(&self) -> usize {
        self.device
    }

    /// The handshake the connection was set up with.
    pub(super) fn handshake(&self) -> Handshake {
        self.binding.handshake()
    }

    /// The peer's CLAIM, once it came (its secret).
    pub(super) fn claim_seen(&self) -> Option<Secret> {
        self.binding.claim()
    }

    /// The peer's CONFIRM came.
    pub(super) fn confirm_seen(&self) -> bool {
        self.binding.confirm_seen()
    }

    /// Keeps the CQ armed (after a completion event was taken for it).
    pub(super) fn note_cq_event(&mut self) {
        self.cq.note_event();
    }

    /// Takes every completion; an error completion is the connection's failure.
    pub(super) fn poll(&mut self, now: Instant) -> Result<(), String> {
        let mut wcs = [Wc::default(); 32];
        while self.take_completions(&mut wcs, now)? == wcs.len() {}
        // Re-arm (when an event was taken since the last arm), then look again: a completion
        // between the last poll and the arm would otherwise raise no event.
        if self.cq.arm_needed() {
            self.cq.arm().map_err(|e| format!("arming the CQ: {e}"))?;
            while self.take_completions(&mut wcs, now)? == wcs.len() {}
        }
        self.flush_control();
        Ok(())
    }

    /// Polls up to `wcs.len()` completions and hands each to the half it concerns; how many
    /// came.
    fn take_completions(&mut self, wcs: &mut [Wc], now: Instant) -> Result<usize, String> {
        let n = self
            .cq
            .poll(wcs)
            .map_err(|e| format!("polling the CQ: {e}"))?;
        for wc in wcs.iter().take(n) {
            self.completion(Completion::of(wc), now)?;
        }
        Ok(n)
    }

    fn completion(&mut self, completion: Completion, now: Instant) -> Result<(), String> {
        match completion {
            Completion::Failed { .. } if self.peer_fin() => {
                // The peer's FIN is in, so every byte of its direction arrived: a failure now
                // (a credit report, a probe, flushed receives) means the peer is gone. Nothing
                // more is posted; what arrived is still delivered, and the stream ends once it
                // was (`super::stream`).
                self.quiet = true;
                Ok(())
            }
            Completion::Failed { status, wr_id } => Err(wr::failure(status, wr_id)),
            Completion::Control { slot, len } => {
                self.last_rx = now;
                self.control_arrived(slot, len)
            }
            Completion::Data { slot, len, imm } => {
                self.last_rx = now;
                self.activity.data(now);
                self.data_arrived(slot, len, imm)
            }
            Completion::Sent { probe } => {
                // A signaled request (data, control or probe): it and every request before it
                // are done.
                self.sender.completed();
                if probe {
                    self.probe_outstanding = false;
                    self.last_rx = now;
                }
                Ok(())
            }
        }
    }

    /// A control message from the peer, `len` bytes in receive `slot`: checked against what
    /// the connection takes now ([`Binding`]) before anything of it is used.
    fn control_arrived(&mut self, slot: u64, len: usize) -> Result<(), String> {
        let mut bytes = [0u8; SLOT];
        let off = self.control_recv_off() + slot as usize * SLOT;
        self.region
            .load(off, &mut bytes)
            .map_err(|e| format!("control slot {slot}: {e}"))?;
        self.post_recv(slot)
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
        self.recv.reposted();
        let control = cdc::decode(&bytes, len)?;
        self.binding
            .on_control(control.kind)
            .map_err(|v| v.to_string())?;
        if let ControlKind::Reuse(payload) | ControlKind::Reused(payload) = control.kind {
            // The connection's last message (the binding takes nothing after it): it carries
            // no counters.
            self.reuse = Some(payload);
            return Ok(());
        }
        self.sender.credit(control.consumed, control.reposted)?;
        if control.kind == ControlKind::Fin {
            self.recv.peer_fin();
        }
        match control.kind {
            ControlKind::Urgent(position) => self.recv.urgent(position)?,
            ControlKind::Switch(position) => self.recv.switch(position)?,
            // Taken when our writes can move (`adjust_rings`); a later offer replaces it.
            ControlKind::Ring(ring) => self.peer_offer = Some(ring),
            _ => {}
        }
        Ok(())
    }

    /// Moves the rings as the stream's traffic asks (`super::rings`): moves our writes to a
    /// ring the peer offered, frees what a move left behind, and offers the peer our busy
    /// receive ring when the stream is busy, or our start ring when it is idle again. Run on
    /// every round of a bound stream.
    pub(super) fn adjust_rings(&mut self, now: Instant) {
        if self.busy == 0 || !self.ready || self.quiet {
            return;
        }
        self.follow_peer();
        let recv = self.recv.ring_state();
        self.free_left_rings(&recv);
        self.offer_ring(now, &recv);
    }

    /// Our writes move to the ring the peer offered, and our send ring with them: busy while
    /// the peer's receive ring is (when the budget has room), the start ring otherwise.
    fn follow_peer(&mut self) {
        let Some(offer) = self.peer_offer else {
            return;
        };
        if self.sender.fin_queued() {
            // Nothing more to write (and a SWITCH after FIN would break the stream).
            self.peer_offer = None;
            return;
        }
        let want_busy = offer.size() > self.ring as u64;
        // The busy send ring's start, from the start send ring's.
        let (busy_start, busy) = (self.busy_off + self.busy - self.ring, self.busy);
        let local = match self.send_ring {
            SendRing::Start if want_busy => {
                self.busy_mr(SEND).map(|mr| (busy_start, busy, mr.lkey()))
            }
            SendRing::Busy if !want_busy => Some((0, self.ring, self.keys.lkey())),
            _ => None,
        };
        let Some(at) = self.sender.switch(&self.recv, offer, local) else {
            return;
        };
        self.peer_offer = None;
        if local.is_some() {
            self.send_ring = match self.send_ring {
                SendRing::Start => SendRing::Busy,
                _ => SendRing::Leaving(at),
            };
        }
    }

    /// Busy ring `which`'s registration ([`RECV`] for remote writes, [`SEND`] for local
    /// access), registered now against the budget if it is not yet; None when the budget has
    /// no room or the registration failed (then this connection stays on its start rings).
    fn busy_mr(&mut self, which: usize) -> Option<&Mr> {
        if self.busy_mrs[which].is_none() {
            if self.busy_failed || !self.budget.reserve(self.busy as u64) {
                return None;
            }
            let access = if which == RECV {
                Access::RemoteWrite
            } else {
                Access::Local
            };
            let off = self.busy_off + which * self.busy;
            let registered = self
                .keys
                .pd()
                .map(|pd| pd.register(&self.region, off, self.busy, access));
            match registered {
                Some(Ok(mr)) => self.busy_mrs[which] = Some(mr),
                failed => {
                    self.budget.release(self.busy as u64);
                    self.busy_failed = failed.is_some();
                    return None;
                }
            }
        }
        self.busy_mrs[which].as_ref()
    }

    /// Busy ring `which` is deregistered if it was registered, its budget share goes back,
    /// and (`discard`) its pages with it.
    fn free_busy(&mut self, which: usize, discard: bool) {
        if self.busy_mrs[which].take().is_none() {
            return;
        }
        if discard {
            let _ = self
                .region
                .discard(self.busy_off + which * self.busy, self.busy);
        }
        self.budget.release(self.busy as u64);
    }

    /// Frees a busy ring a move left: our receive ring once it is neither in use, nor
    /// offered, nor holding bytes before a switch; our send ring once every write from it
    /// completed.
    fn free_left_rings(&mut self, recv: &RingState) {
        if recv.ring.start != self.busy_off as u64 && !recv.moving {
            self.free_busy(RECV, true);
        }
        if let SendRing::Leaving(at) = self.send_ring {
            // The last writes from the busy ring may have asked for no completion: a probe
            // makes sure one comes (`acknowledged`), and this runs again on its event.
            if self.sender.posted_and_acked().1 < at && !self.acknowledged() {
                return;
            }
            self.send_ring = SendRing::Start;
            self.free_busy(SEND, true);
        }
    }

    /// Offers the peer our busy receive ring when the stream is busy, or our start ring
    /// when it is idle again (`super::rings`).
    fn offer_ring(&mut self, now: Instant, recv: &RingState) {
        if recv.moving || self.peer_fin() {
            return;
        }
        let (start, size, rkey) = if recv.ring.size == self.ring as u64 {
            if !self.activity.busy(now, recv.arrived, self.ring as u64) {
                return;
            }
            let Some(rkey) = self.busy_mr(RECV).map(Mr::rkey) else {
                return;
            };
            (self.busy_off, self.busy, rkey)
        } else {
            if !self.activity.idle(now, recv.drained) {
                return;
            }
            (0, self.ring, self.keys.rkey())
        };
        if self.recv.offer(start, size) {
            self.control(ControlKind::Ring(RingInfo {
                addr: self.region.addr(start),
                rkey,
                size_log: size.trailing_zeros() as u8,
                receives: 0,
            }));
        }
    }

    /// Stream bytes from the peer (an RDMA write with immediate into the receive ring): taken
    /// only when the stream may carry them and the write is the next one, whole
    /// ([`crate::flow::RecvFlow::arrived`]).
    fn data_arrived(&mut self, slot: u64, len: u32, imm: Option<u32>) -> Result<(), String> {
        let imm = imm.ok_or_else(|| String::from("a data write without an immediate"))?;
        self.binding.on_data().map_err(|v| v.to_string())?;
        self.recv.arrived(len, imm)?;
        self.post_recv(slot)
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
        self.recv.reposted();
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

    /// Queues our MOVED (the accepting side of the shim, once bound): `count` bytes of ours
    /// went over TCP, every later one goes on the stream.
    pub(super) fn moved(&mut self, count: u64) {
        self.control(ControlKind::Moved(count));
    }

    /// The count of the peer's MOVED, once it came (the connecting side).
    pub(super) fn moved_seen(&self) -> Option<u64> {
        self.binding.moved()
    }

    /// Queues a control message (sent as soon as the send queue has room).
    pub(super) fn control(&mut self, kind: ControlKind) {
        self.sender.queue_control(kind);
        self.flush_control();
    }

    fn flush_control(&mut self) {
        if self.ready && !self.quiet {
            self.sender.flush_controls(&self.recv);
        }
    }

    /// Sends a credit report when one is owed.
    pub(super) fn credit_if_due(&mut self) {
        if self.recv.credit_due() {
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
        if !self.ready || self.quiet {
            return Ok((false, 0));
        }
        self.sender.send_from(local, ready, draining, &self.recv)
    }

    /// Writes what arrived to `local` while it takes it; the byte count.
    pub(super) fn deliver_to(&mut self, local: &OwnedFd, ready: &mut Ready) -> io::Result<u64> {
        self.recv.deliver_to(local, ready)
    }

    /// The stream's state in a few words (for error reports).
    pub(super) fn describe(&self) -> String {
        let (arrived, pending) = self.recv.arrived_total();
        let sent = self.sender.sent();
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

    /// Turns direct reads on or off ([`super::rx`]).
    pub(super) fn set_reading(&mut self, on: bool) {
        if self.reading != on {
            self.recv.set_readers(on);
            self.reading = on;
        }
    }

    /// Turns direct writes on or off ([`super::tx`]); off also before the QP is destroyed, so
    /// no writer posts on it, and a waiting one stops waiting.
    pub(super) fn set_writing(&mut self, on: bool) {
        if self.writing != on {
            self.sender.set_writers(on);
            self.writing = on;
        }
    }

    /// Bytes the app's direct writes posted since the last call.
    pub(super) fn take_written_bytes(&mut self) -> u64 {
        self.sender.take_written()
    }

    /// Bytes the app's direct reads took since the last call.
    pub(super) fn take_read_bytes(&mut self) -> u64 {
        if !self.reading {
            return 0;
        }
        self.recv.take_read()
    }

    /// The send half, for [`super::Writer`]s.
    pub(super) fn sender(&self) -> &Arc<Sender> {
        &self.sender
    }

    /// The receive half, for [`super::Reader`]s.
    pub(super) fn receiver(&self) -> &Arc<Receiver> {
        &self.recv
    }

    /// Bytes that arrived and wait for the local side.
    pub(super) fn has_pending(&self) -> bool {
        self.recv.has_pending()
    }

    /// The peer's FIN came (so every byte of its direction arrived or is on its way in order).
    pub(super) fn peer_fin(&self) -> bool {
        self.binding.peer_fin()
    }

    /// FIN was sent and its completion came back (so every byte before it arrived).
    pub(super) fn fin_done(&self) -> bool {
        self.sender.fin_done()
    }

    /// FIN was queued.
    pub(super) fn fin_queued(&self) -> bool {
        self.sender.fin_queued()
    }

    /// Data bytes posted, acknowledged by the peer's device, and arrived from the peer.
    #[cfg(test)]
    pub(super) fn byte_counts(&self) -> (u64, u64, u64) {
        let (sent, acked) = self.sender.posted_and_acked();
        (sent, acked, self.recv.arrived_total().0)
    }

    /// Sends a liveness probe when the peer has been silent for `keepalive`; the probe fails
    /// (an error completion) when the peer is gone.
    /// Whether every byte posted so far reached the peer's device; when not, a probe (a
    /// signaled zero-length write) makes sure a completion will tell (completions come in
    /// order, so the probe's reports every write before it).
    pub(super) fn acknowledged(&mut self) -> bool {
        if self.sender.all_completed() {
            return true;
        }
        if self.ready && !self.probe_outstanding {
            self.probe_outstanding = self.sender.probe();
        }
        false
    }

    pub(super) fn probe_if_idle(&mut self, now: Instant, keepalive: Duration) {
        if self.ready
            && !self.quiet
            && !self.probe_outstanding
            && now.saturating_duration_since(self.last_rx) >= keepalive
        {
            self.probe_outstanding = self.sender.probe();
        }
    }

    /// When the next probe is due.
    pub(super) fn probe_due(&self, keepalive: Duration) -> Option<Instant> {
        (self.ready && !self.quiet && !self.probe_outstanding).then(|| self.last_rx + keepalive)
    }

    /// The CQ's context: the token of the connection the link was made for.
    pub(super) fn cq_key(&self) -> u64 {
        self.cq_key
    }

    /// The stream finished in order and left this queue pair fit to carry the next connection
    /// (docs/shim-protocol.md, "Reused connections"): both FINs went through, every byte
    /// arrived was handed on, both directions are on their start rings with no ring move
    /// under way, and no app thread copies from or into the region. Direct reads and writes
    /// of the finished stream end here for good.
    pub(super) fn parkable(&mut self) -> bool {
        if !self.ready || self.quiet || !self.peer_fin() || !self.fin_done() {
            return false;
        }
        self.set_reading(false);
        self.set_writing(false);
        let recv = self.recv.ring_state();
        self.recv.retire()
            && !self.sender.copying()
            && !self.recv.has_pending()
            && recv.ring.start == 0
            && recv.ring.size == self.ring as u64
            && !recv.moving
            && self.busy_mrs.iter().all(Option::is_none)
            && matches!(self.send_ring, SendRing::Start)
            && self.peer_offer.is_none()
            && self.sender.writes_into(&self.peer_start)
    }

    /// Whether the send queue is empty; when not, a probe (signaled) makes sure a completion
    /// will report it.
    pub(super) fn quiesce(&mut self) -> bool {
        if self.sender.idle() {
            return true;
        }
        if self.ready && !self.quiet && !self.probe_outstanding {
            self.probe_outstanding = self.sender.probe();
        }
        false
    }

    /// Asks the peer for the next connection on this queue pair (the connecting side of a
    /// parked link), with a connect request's `payload`.
    pub(super) fn request_reuse(&mut self, payload: Payload) {
        self.binding.reuse_sent();
        self.control(ControlKind::Reuse(payload));
    }

    /// The peer's REUSE (accepting side) or REUSED (connecting side) came and was not taken.
    pub(super) fn reuse_pending(&self) -> bool {
        self.reuse.is_some()
    }

    /// The peer's REUSE (accepting side) or REUSED (connecting side), once.
    pub(super) fn take_reuse(&mut self) -> Option<Payload> {
        self.reuse.take()
    }

    /// This queue pair carries the next connection, which starts with `handshake`: new halves
    /// at stream position 0 on the start rings, a binding of its own, and the peer's start
    /// ring as the first place our writes go. The last connection's halves stay off (its
    /// app's handles reach nothing of the next one). Only after [`Link::parkable`] and
    /// [`Link::quiesce`] held, and once the last connection's last message was taken (the
    /// peer's REUSE, or its REUSED: `reused` counts REUSED's receive in the new connection,
    /// whose first message it was).
    pub(super) fn renew(&mut self, handshake: Handshake, now: Instant, reused: bool) {
        let (sender, recv) = halves(
            &self.qp,
            &self.region,
            (self.ring, self.rq, self.sq),
            self.keys.lkey(),
            self.max_unacked,
        );
        if reused {
            recv.reposted();
        }
        self.sender = sender;
        self.recv = recv;
        self.reading = false;
        self.writing = false;
        self.binding = Binding::new(handshake);
        self.activity = Activity::new(now);
        self.last_rx = now;
        self.probe_outstanding = false;
        self.peer_offer = None;
        self.reuse = None;
        self.set_peer(self.peer_start);
    }

    /// Answers the peer's REUSE: the next connection is taken, with an accept's `payload`
    /// (after [`Link::renew`]: REUSED is the new connection's first message).
    pub(super) fn answer_reuse(&mut self, payload: Payload) {
        self.control(ControlKind::Reused(payload));
    }
}
