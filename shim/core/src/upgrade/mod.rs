//! The upgrade itself (docs/shim-protocol.md): TCP connections of a capable process move onto
//! RDMA streams of the process's [`Engine`] when both ends agree.
//!
//! - Client ([`connect`], `client.rs`): before the kernel connect, an RDMA connect to the same
//!   address and port (rdma_cm's `RDMA_PS_IB` port space) whose request carries HELLO. The
//!   server's engine registers the connection under the client's TCP address *before* it
//!   accepts, so once the RDMA connection is established the client makes the app's kernel
//!   connect, then waits (bounded) for the accepting process's CLAIM, answers CONFIRM and swaps
//!   the app's fd onto a socketpair whose other end the engine pumps. Anything else: plain TCP.
//! - Server (`server.rs`): `listen()` adds an RDMA listener on the socket's address and port;
//!   its acceptor checks the policy and registers `pending[client addr:port]`. `accept()` claims
//!   the entry of the accepted peer at once (no waiting) and swaps; the engine sends CLAIM and
//!   pumps after CONFIRM, or relays over the kept TCP socket when the client gave up.
//! - Services (`back.rs`): a client's connection to a virtual IP is made back to it by the
//!   backend that accepted it, whose `accept()` knows the client's own address.
//! - Spares (`spare.rs`): after a connection upgraded, the client's next RDMA connect to the
//!   same peer is made ahead, so a repeat connect only awaits it.
//! - The swap (`swap.rs`) and the per-connection accounting (`events.rs`).
//!
//! Nothing here runs on the pass-through path: every entry point is reached only for a
//! capable process's INET TCP socket (or an fd the fd table marks as swapped / side-listening).

mod back;
mod client;
mod delegate;
mod engine;
mod events;
mod group;
mod handed;
mod server;
mod spare;
mod swap;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::engine::{Conn, Reader, Writer};

use crate::errqueue::ErrQueue;
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::negative_cache::NegativeCache;
use crate::negotiation;
use crate::policy::canonical_ip;
use crate::readiness;
use crate::sys;

pub use back::connect as connect_through_service;
pub use client::{connect, reason_for};
pub use engine::set_reuse;
pub use engine::{config as engine_config, configure, flush_at_exit};
pub use events::record;
pub use handed::adopt;
pub use server::{
    Claim, Found, Group, Pending, PendingTable, claim_and_swap, claim_in_group,
    close_side_listener, copy_grouped, copy_side_listener, forget_grouped, grouped,
    open_side_listener,
};
pub use spare::set_enabled as set_spare;

/// How long a server keeps a registered connection that no TCP connection claimed.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

/// What the shim keeps of a swapped app fd.
#[derive(Clone)]
struct SwappedFd {
    /// The kept kernel TCP socket (shared with the engine, which watches it and relays over it
    /// when needed; it closes when the last holder lets go).
    kept: Arc<OwnedFd>,
    /// Direct reads from the stream's receive ring ([`read_direct`]).
    reader: Option<Arc<Reader>>,
    /// Direct writes into the stream's send ring ([`writer`]).
    writer: Option<Arc<Writer>>,
    /// The stream's halves, for what the hooks tell the engine whatever the switches say.
    halves: Option<Arc<Halves>>,
    /// The stream failed and the app was not told yet ([`take_reset`]).
    broken: Arc<AtomicBool>,
    /// What the app's end of the socketpair is ([`queue_reset`]).
    app_end: Option<sys::FileId>,
    /// A fork child's connection whose stream the listening process runs: where that process
    /// tells of a reset ([`delegate`]).
    notice: Option<Arc<delegate::Notice>>,
    /// The connection's emulated error queue (zero-copy completions).
    errq: Arc<ErrQueue>,
    /// A stream that had no verbs resources yet when the fd was swapped (a connection back:
    /// its peer connects after the attach): the direct handles and the send half are taken
    /// from it once it has them ([`entry`]), or forgotten once it ended without.
    late: Option<Conn>,
}

/// What the hooks tell a connection's engine whatever the switches say: urgent data
/// ([`send_urgent`], through the stream's send half) and the app's receive low-water mark
/// ([`set_low_water`], for the stream or the relay that carries the connection).
struct Halves {
    send: Option<Writer>,
    conn: Conn,
}

/// Swapped app fds (and their copies) -> what the shim keeps of them.
static SWAPPED_FDS: ForkSafe<BTreeMap<c_int, SwappedFd>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);
/// Destinations that could not upgrade recently.
static NEGATIVE: NegativeCache = NegativeCache::new(
    crate::negative_cache::DEFAULT_TTL,
    crate::negative_cache::DEFAULT_CAPACITY,
);
/// Set in a fork child: the engine (its thread, its locks) belongs to the parent.
static FORKED: AtomicBool = AtomicBool::new(false);
/// `STREAMSHIM_DIRECT_READ` (set at the decision; off until then).
static DIRECT_READ: AtomicBool = AtomicBool::new(false);
/// `STREAMSHIM_DIRECT_WRITE` (set at the decision; off until then).
static DIRECT_WRITE: AtomicBool = AtomicBool::new(false);

/// A fork child whose connections the process with the engine upgrades ([`delegate`]): it
/// decides about them as that process would.
pub fn through_parent() -> bool {
    FORKED.load(Ordering::Acquire) && delegate::has_channel()
}

/// The most bytes this process's engine pinned at once (its budget's count); None without an
/// engine of its own (none started, or a fork child, whose copy is its parent's).
pub fn pinned_peak() -> Option<u64> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    engine::engine().map(rdma_streams_transport::engine::Engine::pinned_peak)
}

/// The engine's reuse counts (parked, reused, unanswered), if the engine runs in this
/// process.
pub fn reuse_counts() -> Option<(u64, u64, u64)> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    engine::engine().map(rdma_streams_transport::engine::Engine::reuse_counts)
}

/// Whether upgraded fds may be read straight from their rings ([`read_direct`]).
pub fn set_direct_read(on: bool) {
    DIRECT_READ.store(on, Ordering::Release);
}

/// Whether upgraded fds may be written straight into their rings ([`writer`]).
pub fn set_direct_write(on: bool) {
    DIRECT_WRITE.store(on, Ordering::Release);
}

/// The negotiation bound in microseconds (`STREAMSHIM_NEGOTIATE_MS`, set at the decision; 0:
/// not set, the default). An atomic, not a `OnceLock`: a fork child must never wait for an
/// initialisation a parent thread was in the middle of.
static NEGOTIATE_MICROS: AtomicU64 = AtomicU64::new(0);

/// Sets the negotiation bound (the decision of a capable process, from its settings).
pub fn set_negotiate_timeout(bound: Duration) {
    let micros = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX).max(1);
    NEGOTIATE_MICROS.store(micros, Ordering::Release);
}

/// The negotiation bound: the one set at the decision, else the default.
fn negotiate_timeout() -> Duration {
    match NEGOTIATE_MICROS.load(Ordering::Acquire) {
        0 => negotiation::DEFAULT_NEGOTIATE_TIMEOUT,
        micros => Duration::from_micros(micros),
    }
}

/// The key of a connection in `pending`: v4-mapped addresses as IPv4, no flow info or scope.
fn key(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(addr.ip()), addr.port())
}

/// The kept TCP socket behind a swapped app fd.
pub fn kept(fd: c_int) -> Option<Arc<OwnedFd>> {
    SWAPPED_FDS.lock().get(&fd).map(|s| Arc::clone(&s.kept))
}

/// The stream behind the swapped `fd` failed and the app was not told yet: true once (the
/// caller reports `ECONNRESET` where the socketpair says EOF or `EPIPE`, as a TCP socket reports
/// a reset once), false from then on and for any other fd.
pub fn take_reset(fd: c_int) -> bool {
    let notice = {
        let map = SWAPPED_FDS.lock();
        let Some(s) = map.get(&fd) else {
            return false;
        };
        if s.broken.swap(false, Ordering::AcqRel) {
            return true;
        }
        s.notice.clone()
    };
    // A fork child's connection: its parent's engine says (a read, outside the lock).
    notice.is_some_and(|n| n.take_reset())
}

/// App numbers a failed connect put back on their TCP socket ([`swap::restore_tcp`]), until
/// closed or replaced: a read another thread was blocked in on the socketpair end meanwhile
/// ends with EOF there, and is made again on the TCP socket ([`restored`]).
static RESTORED: ForkSafe<std::collections::BTreeSet<c_int>> =
    ForkSafe::new([const { Mutex::new(std::collections::BTreeSet::new()) }; SLOTS]);
/// How many numbers [`RESTORED`] holds: the read hooks' fast path.
static RESTORED_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `fd` names its TCP socket again after a failed connect.
fn note_restored(fd: c_int) {
    let mut set = RESTORED.lock();
    set.insert(fd);
    RESTORED_COUNT.store(set.len(), Ordering::Release);
}

/// Whether `fd` was put back on its TCP socket by a failed connect (and not closed or
/// replaced since): a read of it that met EOF may have been made on the socketpair end the
/// number named before, and is made again, on the TCP socket, which answers as TCP (the
/// connect's error, `ENOTCONN`, or its bytes once a connect succeeds). A read that met the TCP
/// socket's own EOF meets it again. One atomic load while no number is restored.
pub fn restored(fd: c_int) -> bool {
    any_restored() && RESTORED.lock().contains(&fd)
}

/// Whether any number is restored ([`restored`]'s fast path: one atomic load).
#[inline]
pub fn any_restored() -> bool {
    RESTORED_COUNT.load(Ordering::Acquire) != 0
}

/// `fd` was closed or now names another file: it is not restored any more.
pub fn forget_restored(fd: c_int) {
    if !any_restored() {
        return;
    }
    let mut set = RESTORED.lock();
    if set.remove(&fd) {
        RESTORED_COUNT.store(set.len(), Ordering::Release);
    }
}

/// The stream whose flag is `broken` ended in a reset the hooks report: every number for it
/// reports `POLLERR` until the app takes the reset ([`readiness`]).
pub(crate) fn mark_broken(broken: &Arc<AtomicBool>) {
    for (&fd, _) in SWAPPED_FDS
        .lock()
        .iter()
        .filter(|(_, s)| Arc::ptr_eq(&s.broken, broken))
    {
        readiness::mark(fd);
    }
}

/// The error the swapped `fd` reports with `POLLERR` only through the hooks: Some(its
/// generation, which changes with each new one) while a reset the hooks report or a zero-copy
/// completion is pending, else None ([`readiness`]).
pub fn error_state(fd: c_int) -> Option<u64> {
    let map = SWAPPED_FDS.lock();
    let s = map.get(&fd)?;
    let broken = s.broken.load(Ordering::Acquire);
    (broken || !s.errq.is_empty()).then(|| s.errq.generation() << 1 | u64::from(broken))
}

/// A send with `MSG_ZEROCOPY` took bytes on the swapped `fd`: when `SO_ZEROCOPY` is on (set on
/// the kept TCP socket, as TCP keeps it), its completion is queued and every number for the
/// connection reports `POLLERR` ([`crate::errqueue`]).
pub fn zerocopy_sent(fd: c_int) {
    let Some((kept, errq)) = SWAPPED_FDS
        .lock()
        .get(&fd)
        .map(|s| (Arc::clone(&s.kept), Arc::clone(&s.errq)))
    else {
        return;
    };
    if !sys::zero_copy(std::os::fd::AsRawFd::as_raw_fd(&*kept)) {
        return;
    }
    errq.sent();
    for (&n, _) in SWAPPED_FDS
        .lock()
        .iter()
        .filter(|(_, s)| Arc::ptr_eq(&s.errq, &errq))
    {
        readiness::mark(n);
    }
}

/// The emulated error queue of the swapped `fd` and its kept TCP socket's address family;
/// None when `fd` is not swapped.
pub fn error_queue(fd: c_int) -> Option<(Arc<ErrQueue>, c_int)> {
    let (kept, errq) = SWAPPED_FDS
        .lock()
        .get(&fd)
        .map(|s| (Arc::clone(&s.kept), Arc::clone(&s.errq)))?;
    let family = sys::int_option(std::os::fd::AsRawFd::as_raw_fd(&*kept), libc::SO_DOMAIN)
        .unwrap_or(libc::AF_INET);
    Some((errq, family))
}

/// The stream of the swapped fd whose [`SwappedFd::broken`] is `broken` ended in a reset:
/// through one of the app's numbers for its socketpair end, queues the byte that makes the
/// engine's close of the other end report the reset there as a TCP socket reports an RST
/// (`POLLERR`, then `ECONNRESET` once: [`sys::queue_reset_byte`]). Called by the engine while
/// it reports the end, before it closes its end. False when no number could (the app closed
/// them, or shut its side for writing): the hooks then report the reset ([`take_reset`]).
pub fn queue_reset(broken: &Arc<AtomicBool>) -> bool {
    SWAPPED_FDS.lock().iter().any(|(&fd, s)| {
        Arc::ptr_eq(&s.broken, broken)
            && s.app_end.is_some_and(|end| sys::queue_reset_byte(fd, end))
    })
}

/// The stream `conn` behind the swapped `fd` may be read and written directly from now on, as
/// far as the switches allow; a stream without its verbs resources yet gives its handles once
/// it has them ([`SwappedFd::late`]).
fn set_direct(fd: c_int, conn: &Conn) {
    // A mark the app set on its TCP socket, or its listener, before the swap (or since).
    let mark = if crate::fdtable::has_defaults(fd) {
        1
    } else {
        sys::rcvlowat(fd)
    };
    if mark > 1 {
        conn.set_low_water(mark);
    }
    let handles = Handles::of(conn);
    if let Some(s) = SWAPPED_FDS.lock().get_mut(&fd) {
        match handles {
            Some(h) => s.take(h),
            None => {
                s.halves = Some(Handles::without(conn));
                s.late = Some(conn.clone());
            }
        }
    }
}

/// What the hooks use of a stream that has its verbs resources: the direct reader and writer
/// (as far as the switches allow) and the halves.
struct Handles {
    reader: Option<Reader>,
    writer: Option<Writer>,
    halves: Arc<Halves>,
}

impl Handles {
    /// None while `conn` has no verbs resources (its send half is made with them).
    fn of(conn: &Conn) -> Option<Handles> {
        let send = conn.writer()?;
        let reader = DIRECT_READ
            .load(Ordering::Acquire)
            .then(|| conn.reader())
            .flatten();
        let writer = DIRECT_WRITE
            .load(Ordering::Acquire)
            .then(|| conn.writer())
            .flatten();
        Some(Handles {
            reader,
            writer,
            halves: Arc::new(Halves {
                send: Some(send),
                conn: conn.clone(),
            }),
        })
    }

    /// The halves of `conn` without its verbs resources: what the hooks tell it goes to the
    /// engine (the low-water mark to its relay; urgent data is then sent as usual).
    fn without(conn: &Conn) -> Arc<Halves> {
        Arc::new(Halves {
            send: None,
            conn: conn.clone(),
        })
    }
}

impl SwappedFd {
    fn take(&mut self, h: Handles) {
        self.reader = h.reader.map(Arc::new);
        self.writer = h.writer.map(Arc::new);
        self.halves = Some(h.halves);
        self.late = None;
    }
}

/// The swapped `fd`'s entry, given to `f` under the table's lock; first, for a stream that had
/// no verbs resources when it was swapped, its handles once it has them (asked outside the
/// table's lock: the stream's own lock is never taken under it; never in a fork child, where
/// that lock may have been held by a thread of the parent at the fork).
fn entry<T>(fd: c_int, f: impl FnOnce(&SwappedFd) -> Option<T>) -> Option<T> {
    let late = {
        let map = SWAPPED_FDS.lock();
        let s = map.get(&fd)?;
        match &s.late {
            Some(conn) if !FORKED.load(Ordering::Acquire) => conn.clone(),
            _ => return f(s),
        }
    };
    let handles = Handles::of(&late);
    let alive = handles.is_some() || late.is_alive();
    let mut map = SWAPPED_FDS.lock();
    let s = map.get_mut(&fd)?;
    if s.late.as_ref().is_some_and(|c| c.same_as(&late)) {
        match handles {
            Some(h) => s.take(h),
            None if !alive => s.late = None,
            None => {}
        }
    }
    f(s)
}

/// The app set `SO_RCVLOWAT` on the swapped `fd` ([`Conn::set_low_water`]).
pub fn set_low_water(fd: c_int, bytes: usize) {
    if FORKED.load(Ordering::Acquire) {
        return;
    }
    let halves = entry(fd, |s| s.halves.clone());
    if let Some(h) = halves {
        h.conn.set_low_water(bytes);
    }
}

/// `send` of urgent data (`MSG_OOB`) on the swapped `fd`, once and without blocking, so that
/// the engine carries its last byte as urgent ([`Writer::send_urgent`]); None when `fd` has no
/// stream to tell (a relayed fd, a fork child): the caller sends it as usual.
pub fn send_urgent(fd: c_int, buf: &[u8], flags: c_int) -> Option<std::io::Result<usize>> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let halves = entry(fd, |s| s.halves.clone())?;
    Some(halves.send.as_ref()?.send_urgent(fd, buf, flags))
}

/// How long a `SIOCATMARK` waits for a relay's write of bytes and the urgent byte behind them
/// to the app's end ([`Conn::at_mark`]): one non-blocking call on the engine thread.
const AT_MARK_WAIT: Duration = Duration::from_millis(50);

/// `SIOCATMARK` of the swapped `fd`, as TCP's socket would answer ([`Conn::at_mark`]); None
/// when no engine of this process carries it (a fork child's connection): the kernel's answer.
pub fn at_mark(fd: c_int) -> Option<std::io::Result<bool>> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let halves = entry(fd, |s| s.halves.clone())?;
    Some(halves.conn.at_mark(fd, AT_MARK_WAIT))
}

/// How long a `TCP_INFO` read waits for the peer's device to acknowledge the bytes posted so
/// far ([`Conn::counters`]): a round trip, and more only when the peer is gone.
const COUNTERS_WAIT: Duration = Duration::from_millis(20);

/// What the stream behind the swapped `fd` carried, as `TCP_INFO` counts it: bytes sent,
/// acknowledged by the peer's device, and received ([`Conn::counters`]). None when no stream
/// carries it (relayed over TCP, not bound yet, a fork child): the kept TCP socket's counts are
/// the connection's then.
pub fn stream_counters(fd: c_int) -> Option<(u64, u64, u64)> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let halves = entry(fd, |s| s.halves.clone())?;
    let c = halves.conn.counters(COUNTERS_WAIT)?;
    Some((c.sent, c.acked, c.received))
}

/// The direct writer of the stream behind the swapped `fd` (`write`/`send` copy into its send
/// ring, [`Writer::write`]); None: write to the fd as usual. Never in a fork child (the ring is
/// not mapped there).
pub fn writer(fd: c_int) -> Option<Arc<Writer>> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    entry(fd, |s| s.writer.clone())
}

/// `read`/`recv` of a swapped fd: the stream's received bytes copied straight from its ring
/// into `buf` when the fd's socketpair end holds none ([`Reader::read`]); None: call the
/// original. Never in a fork child (the ring is not mapped there).
pub fn read_direct(fd: c_int, buf: &mut [u8]) -> Option<usize> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let reader = entry(fd, |s| s.reader.clone())?;
    reader.read(fd, buf)
}

/// A `read`/`recv` of a swapped fd ([`Reader::read_or_wait`]): the ring's bytes, or `wait`
/// (the original call) as a waiting reader and the ring's bytes after it. None: call the
/// original. Never in a fork child (the ring is not mapped there).
pub fn read_or_wait(
    fd: c_int,
    buf: &mut [u8],
    wait: &mut dyn FnMut(&mut [u8]) -> isize,
) -> Option<isize> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let reader = entry(fd, |s| s.reader.clone())?;
    reader.read_or_wait(fd, buf, wait)
}

/// A hold on the stream behind the swapped `fd` for a run of direct reads (`recv` with
/// `MSG_WAITALL`): the engine leaves arrived bytes in the ring meanwhile ([`Reader::hold`]).
/// None when `fd` reads no stream directly. Dropping it lets go.
pub fn hold(fd: c_int) -> Option<Hold> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let reader = entry(fd, |s| s.reader.clone())?;
    reader.hold(true);
    Some(Hold(reader))
}

/// See [`hold`].
#[derive(Debug)]
pub struct Hold(Arc<Reader>);

impl Hold {
    /// Runs `wait` (a blocking call on the socketpair) as a waiting reader, the hold let go
    /// meanwhile ([`Reader::wait`]), and holds again after.
    pub fn released<T>(&self, wait: impl FnOnce() -> T) -> T {
        self.0.wait(true);
        let out = wait();
        self.0.wait(false);
        out
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.hold(false);
    }
}

/// `new` is a copy (dup) of the swapped fd `old`: it answers from the same kept TCP socket.
/// False if `old` is not in the table (closed meanwhile by another thread).
pub fn copy_swapped(old: c_int, new: c_int) -> bool {
    let mut map = SWAPPED_FDS.lock();
    let Some(swapped) = map.get(&old).cloned() else {
        return false;
    };
    map.insert(new, swapped);
    true
}

/// The app closed a swapped fd (or replaced it): its reference to the kept socket goes.
pub fn forget_swapped(fd: c_int) -> Option<Arc<OwnedFd>> {
    let old = SWAPPED_FDS.lock().remove(&fd);
    spare::closed(fd);
    old.map(|s| s.kept)
}

/// After the app closed the last copy of a swapped fd whose kept socket `kept` resets on close
/// (`SO_LINGER {1, 0}`): waits, at most `bound`, for the engine to end the stream (it lets go
/// of the kept socket once the bytes written before reached the peer), so that the RST leaves
/// with the app's `close`, as TCP's does. Then lets go of `kept`: its close sends the RST.
pub fn close_abortively(kept: Arc<OwnedFd>, bound: Duration) {
    let abortive = !FORKED.load(Ordering::Acquire)
        && Arc::strong_count(&kept) == 2
        && rdma_streams_transport::fd::resets_on_close(std::os::fd::AsFd::as_fd(&*kept));
    if !abortive {
        return;
    }
    let until = Instant::now() + bound;
    while Arc::strong_count(&kept) > 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// In a fork child (still single-threaded): the engine, its listeners and the registrations
/// belong to the parent and are forgotten without a call into the engine (whose queue lock a
/// parent thread may hold). A table a parent thread held at the fork is replaced by a fresh one
/// ([`ForkSafe::after_fork`]). Swapped fds keep answering from their kept sockets.
pub fn after_fork_child() {
    FORKED.store(true, Ordering::Release);
    sys::close_inherited_pair_ends();
    server::after_fork_child();
    spare::after_fork_child();
    handed::after_fork_child();
    group::after_fork_child();
    drop(SWAPPED_FDS.after_fork());
    drop(RESTORED.after_fork());
}

/// Logs a connection that failed to negotiate, once per reason at `debug`.
fn note(peer: SocketAddr, what: &str) {
    log_at!(Level::Debug, "upgrade to {peer}: {what}");
}

/// Now, for deadlines.
fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests;
