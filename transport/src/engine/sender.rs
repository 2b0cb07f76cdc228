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

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use super::{Command, Inner};
use crate::flow::{SendFlow, Window};
use crate::rdma::{Local, Qp, Region, unread_by_peer};
use crate::wire::RingInfo;

/// The wr_id tag of data writes (the rest of the id is the position after the write).
pub(super) const TAG_DATA: u64 = 1 << 60;

/// The send side of one connection, shared by the engine and its [`Writer`]s.
pub(super) struct Sender {
    qp: Qp,
    /// The connection's region; the send ring starts at `ring_off`.
    region: Arc<Region>,
    ring_off: usize,
    lkey: u32,
    state: Mutex<SendState>,
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
    /// Bytes writers posted that the engine has not counted yet.
    pub(super) direct_bytes: u64,
}

impl SendState {
    /// Room for one more send work request.
    pub(super) fn has_room(&self) -> bool {
        self.sq_used < self.sq
    }
}

impl Sender {
    pub(super) fn new(qp: Qp, region: Arc<Region>, ring_off: usize, lkey: u32, sq: u32) -> Sender {
        Sender {
            qp,
            region,
            ring_off,
            lkey,
            state: Mutex::new(SendState {
                flow: None,
                peer: RingInfo::default(),
                sq_used: 0,
                sq,
                direct: false,
                claimed: false,
                engine_waits: false,
                direct_bytes: 0,
            }),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, SendState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine may post data from the socketpair now: no writer has a window claimed. If
    /// one has, the writer wakes the engine once it posted.
    pub(super) fn engine_may_post(state: &mut SendState) -> bool {
        if state.claimed {
            state.engine_waits = true;
        }
        !state.claimed
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
        let Some(flow) = state.flow.as_mut() else {
            return Err(io::Error::other("no peer ring yet"));
        };
        let end = flow.sent() + n as u64;
        let local = self.ring_off + w.local;
        self.qp.write_imm(
            TAG_DATA | end,
            Local {
                addr: self.region.addr(local),
                len: n as u32,
                lkey: self.lkey,
            },
            state.peer.addr + w.remote as u64,
            state.peer.rkey,
            n as u32,
        )?;
        flow.posted_data(n);
        state.sq_used += 1;
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
    pub fn write(&self, app: RawFd, buf: &[u8]) -> Option<usize> {
        if buf.is_empty() {
            return None;
        }
        let send = self.send.upgrade()?;
        let w = {
            let mut state = send.lock();
            if !state.direct || state.claimed || !state.has_room() {
                return None;
            }
            let w = state.flow.as_ref()?.window();
            if w.len == 0 || unread_by_peer(app).ok() != Some(0) || !crate::fd::may_send(app) {
                return None;
            }
            state.claimed = true;
            w
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_waits_while_a_claim_is_open_and_is_told() {
        let mut state = SendState {
            flow: None,
            peer: RingInfo::default(),
            sq_used: 0,
            sq: 4,
            direct: true,
            claimed: false,
            engine_waits: false,
            direct_bytes: 0,
        };
        assert!(Sender::engine_may_post(&mut state));
        assert!(!state.engine_waits, "nothing to wait for");
        state.claimed = true;
        assert!(!Sender::engine_may_post(&mut state));
        assert!(state.engine_waits, "the writer wakes it after posting");
        state.sq_used = 4;
        assert!(!state.has_room());
    }
}
