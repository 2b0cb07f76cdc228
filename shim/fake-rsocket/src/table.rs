//! The r-fd table: rsocket numbers -> kernel socket and per-socket state.
//!
//! Locking rule: the table mutex and each entry's state mutex are held only to look up or
//! update fields, never across a syscall that can block. Callers clone the `Arc<Socket>` out,
//! drop the lock, then call into the kernel; the `Arc` keeps the kernel fd open (and its number
//! unused by anyone else) until every in-flight call on it has returned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use socket2::Socket;

use crate::errno::{Res, err};

/// The first number `rsocket()` hands out. Far above any kernel fd a test process opens, so a
/// leaked r-fd passed to libc fails with `EBADF`.
pub const FIRST_RFD: i32 = 1_000_000;

/// Where a socket is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Created (maybe bound), neither listening nor connected.
    Fresh,
    /// `rlisten` succeeded.
    Listening,
    /// A non-blocking `rconnect` is in progress in the kernel.
    Connecting,
    /// A `hang_connect` fault: the connect never completes.
    Hanging,
    /// Connected (by `rconnect` or `raccept`).
    Connected,
    /// Reset by the `reset_after` fault: the kernel socket is closed.
    Reset,
}

/// Per-socket mutable state, behind the entry's mutex.
#[derive(Debug)]
struct State {
    socket: Option<Arc<Socket>>,
    phase: Phase,
    nonblocking: bool,
    /// SOL_RDMA option values (RDMA_SQSIZE .. RDMA_IOMAPSIZE), stored and reported back.
    rdma_opts: [i32; 4],
}

/// One r-fd.
#[derive(Debug)]
pub(crate) struct Entry {
    /// `AF_INET` or `AF_INET6`.
    pub(crate) domain: i32,
    state: Mutex<State>,
    /// Data calls still to fail with `EAGAIN` under `eagain_storm`.
    storm_left: AtomicU64,
    /// Bytes carried in both directions, for `reset_after`.
    moved: AtomicU64,
    /// Send calls so far, for `slow_send`.
    sends: AtomicU64,
}

/// rsocket's defaults for the SOL_RDMA options (sqsize, rqsize, inline, iomap size).
const RDMA_OPT_DEFAULTS: [i32; 4] = [384, 384, 64, 0];

impl Entry {
    /// A new entry around `socket` in `phase`.
    pub(crate) fn new(domain: i32, socket: Socket, phase: Phase, storm: u64) -> Entry {
        Entry {
            domain,
            state: Mutex::new(State {
                socket: Some(Arc::new(socket)),
                phase,
                nonblocking: false,
                rdma_opts: RDMA_OPT_DEFAULTS,
            }),
            storm_left: AtomicU64::new(storm),
            moved: AtomicU64::new(0),
            sends: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the few plain fields inconsistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kernel socket, or `ECONNRESET` once the connection was reset.
    pub(crate) fn socket(&self) -> Res<Arc<Socket>> {
        match &self.state().socket {
            Some(s) => Ok(Arc::clone(s)),
            None => err(libc::ECONNRESET),
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.state().phase
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.state().phase = phase;
    }

    /// Moves from `from` to `to` if the socket is still in `from`; says whether it did.
    pub(crate) fn transition(&self, from: Phase, to: Phase) -> bool {
        let mut st = self.state();
        if st.phase == from {
            st.phase = to;
            true
        } else {
            false
        }
    }

    pub(crate) fn nonblocking(&self) -> bool {
        self.state().nonblocking
    }

    /// Records the O_NONBLOCK flag and applies it to the kernel socket (if any is left).
    pub(crate) fn set_nonblocking(&self, on: bool) -> Res<()> {
        let socket = {
            let mut st = self.state();
            st.nonblocking = on;
            st.socket.clone()
        };
        if let Some(s) = socket {
            s.set_nonblocking(on)?;
        }
        Ok(())
    }

    pub(crate) fn rdma_opt(&self, index: usize) -> Option<i32> {
        self.state().rdma_opts.get(index).copied()
    }

    pub(crate) fn set_rdma_opt(&self, index: usize, value: i32) -> bool {
        match self.state().rdma_opts.get_mut(index) {
            Some(slot) => {
                *slot = value;
                true
            }
            None => false,
        }
    }

    /// Consumes one `EAGAIN` of the storm; true if this call must fail.
    pub(crate) fn take_storm(&self) -> bool {
        self.storm_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Counts a send call; returns its number (the first is 1).
    pub(crate) fn count_send(&self) -> u64 {
        self.sends.fetch_add(1, Ordering::AcqRel).saturating_add(1)
    }

    /// Bytes carried so far (both directions).
    pub(crate) fn moved(&self) -> u64 {
        self.moved.load(Ordering::Acquire)
    }

    /// Adds `n` carried bytes; returns the new total.
    pub(crate) fn add_moved(&self, n: u64) -> u64 {
        self.moved.fetch_add(n, Ordering::AcqRel).saturating_add(n)
    }

    /// Resets the connection: `SO_LINGER` 0, then the kernel socket is closed as soon as no
    /// call is using it any more, so the peer sees an RST. Later calls fail `ECONNRESET`.
    pub(crate) fn reset(&self) {
        let socket = {
            let mut st = self.state();
            st.phase = Phase::Reset;
            st.socket.take()
        };
        if let Some(s) = socket {
            // Best effort: the socket may already be dead, and a reset is what we want anyway.
            let _ = s.set_linger(Some(Duration::ZERO));
        }
    }

    /// Before the entry is dropped by `rclose`: wakes calls still blocked on the socket in
    /// other threads (a kernel `close` would not), so their `Arc` is released and the kernel
    /// socket really closes.
    pub(crate) fn wake_blocked(&self) {
        let socket = self.state().socket.clone();
        if let Some(s) = socket {
            // Two holders: `s` here and the entry itself; more means a call is in flight.
            if Arc::strong_count(&s) > 2 {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// All r-fds of the process.
#[derive(Debug)]
pub(crate) struct Table {
    map: Mutex<HashMap<i32, Arc<Entry>>>,
    next: AtomicI32,
}

impl Table {
    fn map(&self) -> MutexGuard<'_, HashMap<i32, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `entry` under a fresh number. Numbers are never reused, so a stale r-fd fails
    /// with `EBADF` instead of reaching another socket.
    pub(crate) fn insert(&self, entry: Entry) -> Res<i32> {
        let rfd = self
            .next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(1))
            .map_err(|_| crate::errno::Errno(libc::EMFILE))?;
        self.map().insert(rfd, Arc::new(entry));
        Ok(rfd)
    }

    /// The entry for `rfd`, or `EBADF`.
    pub(crate) fn get(&self, rfd: i32) -> Res<Arc<Entry>> {
        match self.map().get(&rfd) {
            Some(e) => Ok(Arc::clone(e)),
            None => err(libc::EBADF),
        }
    }

    /// Removes `rfd` from the table, or `EBADF`.
    pub(crate) fn remove(&self, rfd: i32) -> Res<Arc<Entry>> {
        match self.map().remove(&rfd) {
            Some(e) => Ok(e),
            None => err(libc::EBADF),
        }
    }
}

/// The process-wide table.
pub(crate) fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| Table {
        map: Mutex::new(HashMap::new()),
        next: AtomicI32::new(FIRST_RFD),
    })
}

/// True if `fd` is in the r-fd number range (whether or not it is open).
pub(crate) fn is_rfd(fd: i32) -> bool {
    fd >= FIRST_RFD
}
