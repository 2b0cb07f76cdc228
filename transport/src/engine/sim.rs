//! A simulated fabric for in-process tests: two queue pairs joined in memory, behind the same
//! [`Post`] and [`Completions`] seams the device's QP and CQ sit behind, so two connections'
//! [`super::link::Link`]s and their [`super::stream::StreamConn`]s run against each other in one
//! test, driven by events and a simulated clock. The Soft-RoCE suite stays the judge of every
//! claim about the real stack; this is for the protocol's logic, in seconds.
//!
//! What it does as an RC queue pair does, and checks as a device would:
//! - Each side's sends are carried in the order posted, and only when the test says so
//!   ([`Fabric::deliver`]): the test picks how many of each side's requests move at each step,
//!   so completions, credits and the TCP path interleave as they may on a real link.
//! - An RDMA write lands in the peer's receive ring only when its key is the ring's and its
//!   range is inside the ring (else a remote access error, status 10); a write with immediate
//!   and a SEND each take one of the peer's posted receives, and wait while none is posted
//!   (RNR, retried without end as `RNR_RETRIES` 7 asks).
//! - A completion is reported for a signaled request and for every request that fails; after
//!   the first failure the queue pair is in error and everything posted on it is flushed
//!   (status 5), as libibverbs reports it.
//! - Faults: [`Fabric::cut`] (the link or the peer's node is gone: every request fails with
//!   retry exceeded, status 12) and [`Fabric::fail_next`] (the next request of one side fails
//!   with a given status).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::wr::{Completions, Post};
use crate::rdma::{Local, Region, WC_RECV, WC_RECV_RDMA_WITH_IMM, Wc};

/// `IBV_WC_SEND` and `IBV_WC_RDMA_WRITE`.
const WC_SEND: u32 = 0;
const WC_RDMA_WRITE: u32 = 1;
/// Work completion statuses.
const REM_ACCESS_ERR: u32 = 10;
const WR_FLUSH_ERR: u32 = 5;
const RETRY_EXC_ERR: u32 = 12;

/// Two queue pairs joined in memory (see the module docs).
#[derive(Clone, Default)]
pub(super) struct Fabric {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    sides: [Side; 2],
    /// Every request fails from now on.
    cut: bool,
}

#[derive(Default)]
struct Side {
    region: Option<Arc<Region>>,
    /// The receive ring: bytes `0..ring` of the region, writable with `rkey`.
    ring: usize,
    rkey: u32,
    recvs: VecDeque<(u64, Local)>,
    sends: VecDeque<Wr>,
    cq: VecDeque<Wc>,
    /// In the error state: everything posted is flushed.
    error: bool,
    /// The next request fails with this status.
    fail_next: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
enum Wr {
    /// An RDMA write (with an immediate, or a zero-length probe without one).
    Write {
        wr_id: u64,
        local: Local,
        remote: (u64, u32),
        imm: Option<u32>,
        signaled: bool,
    },
    Send {
        wr_id: u64,
        local: Local,
        signaled: bool,
    },
}

impl Wr {
    fn id(&self) -> u64 {
        match *self {
            Wr::Write { wr_id, .. } | Wr::Send { wr_id, .. } => wr_id,
        }
    }

    fn opcode(&self) -> u32 {
        match self {
            Wr::Write { .. } => WC_RDMA_WRITE,
            Wr::Send { .. } => WC_SEND,
        }
    }
}

fn completion(wr_id: u64, status: u32, opcode: u32) -> Wc {
    Wc {
        wr_id,
        status,
        opcode,
        ..Wc::default()
    }
}

impl Side {
    /// The queue pair fails: `failed` is reported with `status`, and everything still posted
    /// is flushed.
    fn fail(&mut self, failed: Wr, status: u32) {
        self.error = true;
        self.cq
            .push_back(completion(failed.id(), status, failed.opcode()));
        self.flush();
    }

    fn flush(&mut self) {
        while let Some(wr) = self.sends.pop_front() {
            self.cq
                .push_back(completion(wr.id(), WR_FLUSH_ERR, wr.opcode()));
        }
        while let Some((wr_id, _)) = self.recvs.pop_front() {
            self.cq.push_back(completion(wr_id, WR_FLUSH_ERR, WC_RECV));
        }
    }

    /// `local`'s bytes, from this side's region.
    fn read(&self, local: Local) -> Option<Vec<u8>> {
        if local.len == 0 {
            return Some(Vec::new());
        }
        let region = self.region.as_ref()?;
        let off = usize::try_from(local.addr.checked_sub(region.addr(0))?).ok()?;
        let mut bytes = vec![0u8; local.len as usize];
        region.load(off, &mut bytes).ok()?;
        Some(bytes)
    }

    /// Stores `bytes` at `addr` of the receive ring when `rkey` is its key and the range is
    /// inside it.
    fn write_ring(&self, (addr, rkey): (u64, u32), bytes: &[u8]) -> bool {
        let Some(region) = &self.region else {
            return false;
        };
        let Some(off) = addr
            .checked_sub(region.addr(0))
            .and_then(|o| usize::try_from(o).ok())
        else {
            return false;
        };
        rkey == self.rkey
            && off
                .checked_add(bytes.len())
                .is_some_and(|end| end <= self.ring)
            && region.store(off, bytes).is_ok()
    }

    /// Stores `bytes` into the posted receive `local`.
    fn write_recv(&self, local: Local, bytes: &[u8]) -> bool {
        let Some(region) = &self.region else {
            return false;
        };
        let off = local.addr.checked_sub(region.addr(0));
        bytes.len() <= local.len as usize
            && off
                .and_then(|o| usize::try_from(o).ok())
                .is_some_and(|o| region.store(o, bytes).is_ok())
    }
}

impl Fabric {
    pub(super) fn new() -> Fabric {
        Fabric::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Side `side` (0 or 1) gets `region`, whose first `ring` bytes the peer may write: its
    /// queue pair, its completion queue and its ring's key.
    pub(super) fn attach(
        &self,
        side: usize,
        region: &Arc<Region>,
        ring: usize,
    ) -> (Arc<dyn Post>, Box<dyn Completions>, u32) {
        let rkey = 0x100 + side as u32;
        let mut state = self.lock();
        let s = &mut state.sides[side];
        s.region = Some(Arc::clone(region));
        s.ring = ring;
        s.rkey = rkey;
        let qp = SimQp {
            fabric: self.clone(),
            side,
        };
        let cq = SimCq {
            fabric: self.clone(),
            side,
        };
        (Arc::new(qp), Box::new(cq), rkey)
    }

    /// Every request fails from now on (retry exceeded): the link or the peer's node is gone.
    pub(super) fn cut(&self) {
        self.lock().cut = true;
    }

    pub(super) fn is_cut(&self) -> bool {
        self.lock().cut
    }

    /// The next request `side` posts (or the first still queued) fails with `status`.
    pub(super) fn fail_next(&self, side: usize, status: u32) {
        self.lock().sides[side].fail_next = Some(status);
    }

    /// `side`'s queue pair is destroyed (its connection disconnected): what it posted and was
    /// not carried yet never arrives, and the peer's requests fail from now on.
    pub(super) fn destroy(&self, side: usize) {
        let mut state = self.lock();
        let s = &mut state.sides[side];
        s.error = true;
        s.sends.clear();
        s.recvs.clear();
    }

    /// Requests of `side` waiting to be carried.
    pub(super) fn queued(&self, side: usize) -> usize {
        self.lock().sides[side].sends.len()
    }

    /// Carries up to `max` of `side`'s requests, in order; how many moved (fewer when the peer
    /// has no receive posted for the next one).
    pub(super) fn deliver(&self, side: usize, max: usize) -> usize {
        let mut state = self.lock();
        let cut = state.cut;
        let [a, b] = &mut state.sides;
        let (me, peer) = if side == 0 { (a, b) } else { (b, a) };
        let mut moved = 0;
        while moved < max {
            let Some(wr) = me.sends.front().copied() else {
                break;
            };
            if me.error {
                me.flush();
                break;
            }
            if let Some(status) = me.fail_next.take() {
                me.sends.pop_front();
                me.fail(wr, status);
                moved += 1;
                break;
            }
            if cut || peer.error {
                me.sends.pop_front();
                me.fail(wr, RETRY_EXC_ERR);
                moved += 1;
                break;
            }
            let takes_recv = matches!(wr, Wr::Send { .. } | Wr::Write { imm: Some(_), .. });
            if takes_recv && peer.recvs.is_empty() {
                // RNR: retried until the peer posts a receive.
                break;
            }
            me.sends.pop_front();
            moved += 1;
            match wr {
                Wr::Write {
                    wr_id,
                    local,
                    remote,
                    imm,
                    signaled,
                } => {
                    let Some(bytes) = me.read(local) else {
                        me.fail(wr, REM_ACCESS_ERR);
                        break;
                    };
                    if !peer.write_ring(remote, &bytes) {
                        me.fail(wr, REM_ACCESS_ERR);
                        break;
                    }
                    if let Some(imm) = imm
                        && let Some((recv_id, _)) = peer.recvs.pop_front()
                    {
                        peer.cq.push_back(Wc {
                            wr_id: recv_id,
                            status: 0,
                            opcode: WC_RECV_RDMA_WITH_IMM,
                            byte_len: local.len,
                            imm,
                            has_imm: true,
                        });
                    }
                    if signaled {
                        me.cq.push_back(completion(wr_id, 0, WC_RDMA_WRITE));
                    }
                }
                Wr::Send {
                    wr_id,
                    local,
                    signaled,
                } => {
                    let bytes = me.read(local).unwrap_or_default();
                    let Some((recv_id, into)) = peer.recvs.pop_front() else {
                        break;
                    };
                    if !peer.write_recv(into, &bytes) {
                        me.fail(wr, REM_ACCESS_ERR);
                        break;
                    }
                    peer.cq.push_back(Wc {
                        wr_id: recv_id,
                        status: 0,
                        opcode: WC_RECV,
                        byte_len: local.len,
                        ..Wc::default()
                    });
                    if signaled {
                        me.cq.push_back(completion(wr_id, 0, WC_SEND));
                    }
                }
            }
        }
        moved
    }

    fn post(&self, side: usize, wr: Wr) -> io::Result<()> {
        let mut state = self.lock();
        let s = &mut state.sides[side];
        if s.error {
            s.cq.push_back(completion(wr.id(), WR_FLUSH_ERR, wr.opcode()));
        } else {
            s.sends.push_back(wr);
        }
        Ok(())
    }
}

/// One side's queue pair.
struct SimQp {
    fabric: Fabric,
    side: usize,
}

impl Post for SimQp {
    fn write_imm(
        &self,
        wr_id: u64,
        local: Local,
        remote: (u64, u32),
        imm: u32,
        signaled: bool,
    ) -> io::Result<()> {
        let wr = Wr::Write {
            wr_id,
            local,
            remote,
            imm: Some(imm),
            signaled,
        };
        self.fabric.post(self.side, wr)
    }

    fn write_probe(&self, wr_id: u64, remote: (u64, u32)) -> io::Result<()> {
        let local = Local {
            addr: 0,
            len: 0,
            lkey: 0,
        };
        let wr = Wr::Write {
            wr_id,
            local,
            remote,
            imm: None,
            signaled: true,
        };
        self.fabric.post(self.side, wr)
    }

    fn send(&self, wr_id: u64, local: Local, signaled: bool) -> io::Result<()> {
        let wr = Wr::Send {
            wr_id,
            local,
            signaled,
        };
        self.fabric.post(self.side, wr)
    }

    fn recv(&self, wr_id: u64, local: Local) -> io::Result<()> {
        let mut state = self.fabric.lock();
        let s = &mut state.sides[self.side];
        if s.error {
            s.cq.push_back(completion(wr_id, WR_FLUSH_ERR, WC_RECV));
        } else {
            s.recvs.push_back((wr_id, local));
        }
        Ok(())
    }
}

/// One side's completion queue.
struct SimCq {
    fabric: Fabric,
    side: usize,
}

impl Completions for SimCq {
    fn poll(&mut self, out: &mut [Wc]) -> io::Result<usize> {
        let mut state = self.fabric.lock();
        let cq = &mut state.sides[self.side].cq;
        let n = out.len().min(cq.len());
        for (dst, wc) in out.iter_mut().zip(cq.drain(..n)) {
            *dst = wc;
        }
        Ok(n)
    }

    fn arm(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn arm_needed(&self) -> bool {
        // The simulated fabric raises no events: every look is a full one.
        true
    }

    fn note_event(&mut self) {}
}
