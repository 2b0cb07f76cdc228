//! What a connection's handles and the engine thread share: its phase, the peer's CLAIM (its
//! secret) once it arrived, and a condition variable to wait on both. Its lock is a leaf of
//! the engine's lock order ([`super::lock_order`]): nothing is taken under it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Weak};
use std::time::Instant;

use super::early::EarlyWrites;
use super::lock_order::{Guard, Level, OrderedMutex};
use super::rx::Receiver;
use super::tx::Sender;
use crate::wire::BadPrivateData;

/// Who refused a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectedBy {
    /// The peer's acceptor, with its payload.
    App(Vec<u8>),
    /// The peer's engine (a transport code: see [`crate::wire::TransportReject`]).
    Transport(u32),
    /// Something that is not an rdma-streams engine: nothing listens at that port (the CM's
    /// own reject), or another RDMA program does.
    Foreign {
        /// The CM status (IB CM reject reason).
        status: i32,
    },
}

/// Why a connection was not established.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The peer rejected it.
    #[error("rejected ({0:?})")]
    Rejected(RejectedBy),
    /// No RDMA path to the peer (address, route, or the CM found no one).
    #[error("unreachable over RDMA ({what}, status {status})")]
    Unreachable {
        /// Which step.
        what: &'static str,
        /// The event's status.
        status: i32,
    },
    /// The peer accepted with private data that is not ours.
    #[error("the peer is not an rdma-streams engine: {0}")]
    NotOurPeer(BadPrivateData),
    /// The connection's buffers do not fit the memlock budget.
    #[error("the pinned-memory budget is spent")]
    Memlock,
    /// The device is iWARP (its rdma_cm port space is the kernel's TCP ports).
    #[error("iWARP device")]
    Iwarp,
    /// A local verbs or CM call failed.
    #[error("{what}: {error}")]
    Local {
        /// Which call.
        what: &'static str,
        /// Its error.
        error: String,
    },
    /// Not established by the caller's deadline.
    #[error("not established in time")]
    Timeout,
    /// The connection was closed or aborted.
    #[error("closed")]
    Closed,
    /// The engine thread is not running.
    #[error("the engine is not running")]
    EngineGone,
}

#[derive(Debug, Clone)]
enum Phase {
    Connecting,
    Established(Vec<u8>),
    Failed(ConnectError),
    Closed,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    peer: Option<SocketAddr>,
    /// The connection's receive side, once its verbs resources exist (for direct reads).
    receiver: Weak<Receiver>,
    /// Its send side (for direct writes).
    sender: Weak<Sender>,
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct ConnShared {
    state: OrderedMutex<State>,
    changed: Condvar,
    /// The app's `SO_RCVLOWAT` on its end of the connection ([`Conn::set_low_water`]), for a
    /// relay (a stream's receive side keeps its own).
    ///
    /// [`Conn::set_low_water`]: super::Conn::set_low_water
    low_water: AtomicUsize,
    /// The connection's bytes go over its stream: it bound (`Event::Decided(Rdma)`).
    on_stream: AtomicBool,
    /// A relay's write of bytes and the urgent byte behind them to the app's end is under way
    /// ([`ConnShared::wait_urgent_written`]).
    writing_urgent: Arc<AtomicBool>,
    /// The app's own writes to the kept TCP socket before its direction moves.
    early: Arc<EarlyWrites>,
}

impl ConnShared {
    pub(super) fn connecting(peer: Option<SocketAddr>) -> ConnShared {
        ConnShared {
            state: OrderedMutex::new(
                Level::Shared,
                State {
                    phase: Phase::Connecting,
                    peer,
                    receiver: Weak::new(),
                    sender: Weak::new(),
                },
            ),
            changed: Condvar::new(),
            low_water: AtomicUsize::new(1),
            on_stream: AtomicBool::new(false),
            writing_urgent: Arc::new(AtomicBool::new(false)),
            early: Arc::new(EarlyWrites::new()),
        }
    }

    /// Sets the app's receive low-water mark; true when it is lower than before.
    pub(super) fn set_low_water(&self, bytes: usize) -> bool {
        let bytes = bytes.max(1);
        self.low_water.swap(bytes, Ordering::AcqRel) > bytes
    }

    /// The stream bound: the connection's bytes go over it from now on.
    pub(super) fn set_on_stream(&self) {
        self.on_stream.store(true, Ordering::Release);
    }

    /// See [`ConnShared::set_on_stream`].
    pub(super) fn on_stream(&self) -> bool {
        self.on_stream.load(Ordering::Acquire)
    }

    /// The gate of the app's own writes to the kept TCP socket before its move
    /// ([`super::early`]).
    pub(super) fn early(&self) -> &Arc<EarlyWrites> {
        &self.early
    }

    /// What a relay sets while it writes bytes and the urgent byte behind them to the app's
    /// end ([`super::relay::Pipes::tell_urgent_writes`]).
    pub(super) fn urgent_gate(&self) -> &Arc<AtomicBool> {
        &self.writing_urgent
    }

    /// Waits, at most until `until`, for a relay's write of bytes and the urgent byte behind
    /// them to the app's end to finish. An `AF_UNIX` send queues the urgent byte after the
    /// others, so an app that read those in between would find no mark where TCP, which gets
    /// them in one segment, shows it (`SIOCATMARK`). The write is one non-blocking call.
    pub(super) fn wait_urgent_written(&self, until: Instant) {
        while self.writing_urgent.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::yield_now();
        }
    }

    /// The app's receive low-water mark (1: none).
    pub(super) fn low_water(&self) -> usize {
        self.low_water.load(Ordering::Acquire)
    }

    fn lock(&self) -> Guard<'_, State> {
        self.state.lock()
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    pub(super) fn established(&self, payload: Vec<u8>) {
        self.update(|s| {
            if matches!(s.phase, Phase::Connecting) {
                s.phase = Phase::Established(payload);
            }
        });
    }

    pub(super) fn fail(&self, error: ConnectError) {
        self.update(|s| {
            if matches!(s.phase, Phase::Connecting) {
                s.phase = Phase::Failed(error);
            } else {
                s.phase = Phase::Closed;
            }
        });
    }

    pub(super) fn closed(&self) {
        self.update(|s| {
            s.phase = match &s.phase {
                Phase::Connecting => Phase::Failed(ConnectError::Closed),
                Phase::Failed(e) => Phase::Failed(e.clone()),
                _ => Phase::Closed,
            }
        });
    }

    pub(super) fn set_sides(&self, receiver: &Arc<Receiver>, sender: &Arc<Sender>) {
        let mut state = self.lock();
        state.receiver = Arc::downgrade(receiver);
        state.sender = Arc::downgrade(sender);
    }

    pub(super) fn receiver(&self) -> Option<Arc<Receiver>> {
        self.lock().receiver.upgrade()
    }

    pub(super) fn sender(&self) -> Option<Arc<Sender>> {
        self.lock().sender.upgrade()
    }

    pub(super) fn set_peer(&self, peer: Option<SocketAddr>) {
        self.lock().peer = peer;
    }

    pub(super) fn peer(&self) -> Option<SocketAddr> {
        self.lock().peer
    }

    pub(super) fn is_alive(&self) -> bool {
        matches!(self.lock().phase, Phase::Connecting | Phase::Established(_))
    }

    fn wait_until<T>(
        &self,
        deadline: Instant,
        mut done: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        let mut state = self.lock();
        loop {
            if let Some(v) = done(&state) {
                return Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state = state.wait_timeout(&self.changed, left);
        }
    }

    pub(super) fn wait_established(&self, deadline: Instant) -> Result<Vec<u8>, ConnectError> {
        self.wait_until(deadline, |s| match &s.phase {
            Phase::Connecting => None,
            Phase::Established(p) => Some(Ok(p.clone())),
            Phase::Failed(e) => Some(Err(e.clone())),
            Phase::Closed => Some(Err(ConnectError::Closed)),
        })
        .unwrap_or(Err(ConnectError::Timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn waiters_see_establishment_and_failures() {
        let s = Arc::new(ConnShared::connecting(None));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(s.wait_established(soon), Err(ConnectError::Timeout));
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.wait_established(Instant::now() + Duration::from_secs(5)))
        };
        s.established(b"ok".to_vec());
        assert_eq!(t.join().unwrap(), Ok(b"ok".to_vec()));
        s.closed();
        assert!(!s.is_alive());
        let f = ConnShared::connecting(None);
        f.fail(ConnectError::Memlock);
        assert_eq!(
            f.wait_established(Instant::now()),
            Err(ConnectError::Memlock)
        );
    }
}
