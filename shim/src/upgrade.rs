//! Phase 2: the upgrade itself (docs/shim-protocol.md).
//!
//! - Client ([`connect`]): open the side channel (rconnect to the same address and port in the
//!   rsocket port space, HELLO, within `STREAMSHIM_NEGOTIATE_MS`) *before* the real kernel
//!   connect; after the real connect wait (same bound) for the ACCEPT that only the process
//!   whose `accept()` claimed the connection sends, answer CONFIRM and [`swap`] the app's fd onto
//!   one end of a socketpair whose other end a pump thread moves to and from the rsocket. No
//!   ACCEPT in time: close the rsocket, stay TCP.
//! - Server: `listen()` opens a side-channel rsocket listener ([`open_side_listener`]); one
//!   side-channel thread per process accepts rsockets on all of them, reads HELLOs without ever
//!   waiting on one client, applies the server policy and registers `pending[client addr:port]`
//!   (or answers REFUSE). `accept()` claims the pending entry of the accepted peer
//!   ([`claim`]), sends ACCEPT ([`server_accept`]) and swaps at once; the pump thread then
//!   waits for the client's CONFIRM (the stream moves to the rsocket) or its give-up (the
//!   client stayed on TCP: the pump relays over the kept TCP socket instead). No window leaves
//!   one side on the rsocket and the other on TCP.
//!
//! Nothing here runs on the pass-through path: every entry point is reached only for a capable
//! process's INET TCP socket (or an fd the fd table marks as swapped / side-listening). The
//! shim's threads (side channel, pumps) hold the re-entrancy guard for their whole life, so the
//! provider's and libc's calls they make go straight to the originals.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::handshake::{
    self, Accept, CONFIRM_LEN, CONFIRM_TIMEOUT, Confirm, DecodeError, Hello, MAX_MESSAGE_LEN,
    Message, PENDING_TIMEOUT, Refuse,
};
use rdma_streams_transport::negative_cache::NegativeCache;
use rdma_streams_transport::policy::canonical_ip;
use rdma_streams_transport::reason::{Path, Reason, Role};
use rdma_streams_transport::stats::Stats;
use rdma_streams_transport::{
    Events, Peeked, PollFd, Provider, PumpControl, PumpOptions, PumpReport, RSocket, RSocketError,
    peek, poll, pump, relay,
};

use crate::decision;
use crate::fdtable::{self, COUNTED, INET_STREAM, SHIM_OWNED, SWAPPED, TCP};
use crate::forksafe::{ForkSafe, SLOTS};
use crate::guard::Guard;
use crate::log::{Level, log_at};
use crate::sys;

/// Backlog of a side-channel listener.
const SIDE_BACKLOG: i32 = 128;
/// Longest sleep of the side-channel thread while a HELLO is being read (its deadline is
/// checked this often).
const SIDE_TICK: Duration = Duration::from_millis(20);
/// Longest sleep of an idle side-channel thread (expired pending entries are dropped this
/// often). New and closed listeners wake it at once through [`WAKE_WRITER`].
const SIDE_IDLE_TICK: Duration = Duration::from_secs(1);
/// The writer of the side-channel thread's wake-up pair (-1: no thread yet). A plain number,
/// no lock: a fork child that starts its own thread replaces it.
static WAKE_WRITER: AtomicI32 = AtomicI32::new(-1);

/// The running pumps of this process, flushed at exit ([`flush_at_exit`]).
static ACTIVE_PUMPS: ForkSafe<Vec<Arc<PumpControl>>> =
    ForkSafe::new([const { Mutex::new(Vec::new()) }; SLOTS]);
/// The longest an exiting process waits for its pumps to deliver what the app wrote.
const EXIT_FLUSH: Duration = Duration::from_secs(2);

/// At exit: every pump delivers what the app already wrote and half-closes its rsocket, as
/// the kernel would for a TCP socket after the process is gone; at most [`EXIT_FLUSH`] in all
/// (a peer that stopped reading cannot hold the exit longer). Never blocks on a lock another
/// thread holds.
pub fn flush_at_exit() {
    let deadline = Instant::now() + EXIT_FLUSH;
    let pumps: Vec<Arc<PumpControl>> = loop {
        if let Some(p) = ACTIVE_PUMPS.try_lock() {
            break p.clone();
        }
        if Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    };
    if pumps.is_empty() {
        return;
    }
    for p in &pumps {
        p.drain();
    }
    while !pumps.iter().all(|p| p.sent_all()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    if !pumps.iter().all(|p| p.sent_all()) {
        log_at!(
            Level::Info,
            "exit: some upgraded connections could not deliver everything within {EXIT_FLUSH:?}"
        );
    }
}

/// Swapped app fds -> the kept kernel TCP socket (shared with the connection's pump thread).
static SWAPPED_FDS: ForkSafe<BTreeMap<c_int, Arc<OwnedFd>>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);
/// App listening fd -> its side-channel rsocket listener.
static LISTENERS: ForkSafe<BTreeMap<c_int, Arc<RSocket>>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);
/// Registered upgrades no TCP connection claimed yet: client TCP address -> (rsocket, HELLO
/// nonce, registration time).
static PENDING: ForkSafe<BTreeMap<SocketAddr, Pending>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);
/// What the side-channel thread publishes after each service pass (held during the pass, never
/// during its wait): lets `accept()` tell "no HELLO for this peer" from "HELLO not read yet".
static SIDE_STATE: ForkSafe<SideState> = ForkSafe::new(
    [const {
        Mutex::new(SideState {
            generation: 0,
            in_flight: 0,
        })
    }; SLOTS],
);
/// Signalled after each service pass.
static SIDE_PASS: [Condvar; SLOTS] = [const { Condvar::new() }; SLOTS];
/// Destinations that could not upgrade recently.
static NEGATIVE: NegativeCache = NegativeCache::new(
    rdma_streams_transport::negative_cache::DEFAULT_TTL,
    rdma_streams_transport::negative_cache::DEFAULT_CAPACITY,
);
/// Set once the side-channel thread runs (cleared in a fork child, which has no such thread).
static SIDE_THREAD: AtomicBool = AtomicBool::new(false);

/// `STREAMSHIM_NEGOTIATE_MS`, read once (an atomic, not a `OnceLock`: a fork child must never
/// wait for an initialisation a parent thread was in the middle of).
fn negotiate_timeout() -> Duration {
    static MICROS: AtomicU64 = AtomicU64::new(0);
    match MICROS.load(Ordering::Acquire) {
        0 => {
            let t = handshake::negotiate_timeout_from_env();
            let micros = u64::try_from(t.as_micros()).unwrap_or(u64::MAX).max(1);
            MICROS.store(micros, Ordering::Release);
            t
        }
        micros => Duration::from_micros(micros),
    }
}

/// A registered upgrade.
struct Pending {
    rs: RSocket,
    nonce: u64,
    at: Instant,
}

/// See [`SIDE_STATE`].
struct SideState {
    /// Completed service passes.
    generation: u64,
    /// Side-channel connections accepted whose HELLO is not complete yet.
    in_flight: usize,
}

/// A pending upgrade claimed by `accept()`: the server half of the handshake still has to run
/// ([`server_accept`]).
pub struct Claimed {
    rs: RSocket,
    nonce: u64,
}

/// The key of a connection in `pending`: v4-mapped addresses as IPv4, no flow info or scope.
fn key(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(addr.ip()), addr.port())
}

// ---------------------------------------------------------------------------------------------
// Client

/// The client side of `connect()` for a capable process whose policy allows `peer`: negotiate,
/// then the real connect, then the swap. Returns the real connect's result (errno is restored by
/// the hook layer from the real call).
pub fn connect(
    fd: c_int,
    peer: SocketAddr,
    provider: &Provider,
    real: &mut dyn FnMut() -> (c_int, c_int),
) -> c_int {
    let now = Instant::now();
    let negotiated = if NEGATIVE.check(peer, now).is_some() {
        Err(Reason::NegativeCache)
    } else {
        negotiate(fd, peer, provider)
    };
    let rs = match negotiated {
        Ok(rs) => rs,
        Err(reason) => {
            // UNSUPPORTED (the socket's source address could not be learned) is about this
            // socket, not the peer: not cached.
            if !matches!(reason, Reason::NegativeCache | Reason::Unsupported) {
                let _ = NEGATIVE.insert(peer, reason, Instant::now());
            }
            let (rc, err) = real();
            if (rc == 0 || err == libc::EINPROGRESS) && fdtable::add(fd, COUNTED) & COUNTED == 0 {
                record(Role::Client, fd, Some(peer), Path::Tcp, reason);
            }
            return rc;
        }
    };
    let (rc, err) = real();
    if rc != 0 && err != libc::EINPROGRESS {
        // The kernel connect failed: the app sees exactly that error; the rsocket closes here
        // and the server drops its pending entry after 10 s (nobody accepts it).
        return rc;
    }
    // Wait for the accepting process's ACCEPT (after the TCP handshake, for a non-blocking
    // connect), one bound for both.
    let deadline = Instant::now() + negotiate_timeout();
    if rc != 0 {
        match sys::wait_established(fd, negotiate_timeout()) {
            sys::Established::Yes => {}
            sys::Established::Failed => {
                // The app learns the failure from SO_ERROR as without the shim; not counted
                // (a failed connect never is). The rsocket closes: the server's claim, if any,
                // finds EOF and stays TCP.
                return rc;
            }
            sys::Established::Pending => {
                let _ = NEGATIVE.insert(peer, Reason::Timeout, Instant::now());
                if fdtable::add(fd, COUNTED) & COUNTED == 0 {
                    record(Role::Client, fd, Some(peer), Path::Tcp, Reason::Timeout);
                }
                return rc;
            }
        }
    }
    if let Err(reason) = client_confirm(&rs, peer, deadline) {
        // No ACCEPT in time (another process accepted the connection, or the app accepts
        // late) or a refusal: close the rsocket without CONFIRM, so a late claim reads EOF and
        // the server stays TCP too.
        drop(rs);
        let _ = NEGATIVE.insert(peer, reason, Instant::now());
        if fdtable::add(fd, COUNTED) & COUNTED == 0 {
            record(Role::Client, fd, Some(peer), Path::Tcp, reason);
        }
        return rc;
    }
    if fdtable::add(fd, COUNTED) & COUNTED != 0 {
        return rc;
    }
    match swap(fd, Start::Confirmed(rs.0)) {
        Ok(()) => record(Role::Client, fd, Some(peer), Path::Rdma, Reason::Upgraded),
        Err(e) => {
            // CONFIRM is out, so the server moves its side to the rsocket: a TCP connection
            // here would carry bytes nobody reads. Fail it like a reset instead.
            log_at!(Level::Info, "client fd {fd}: swap failed ({e}): resetting");
            sys::shutdown_both(fd);
            record(Role::Client, fd, Some(peer), Path::Tcp, Reason::RdmaError);
        }
    }
    rc
}

/// Steps 2-4 of the sequence: bind if needed, rconnect, HELLO (no reply is awaited here: the
/// server answers from the process that accepts the TCP connection).
fn negotiate(fd: c_int, peer: SocketAddr, provider: &Provider) -> Result<(RSocket, u64), Reason> {
    let client = ensure_bound(fd, peer).ok_or(Reason::Unsupported)?;
    let timeout = negotiate_timeout();
    let deadline = Instant::now() + timeout;
    let rs = RSocket::connect_to(provider, peer, timeout).map_err(|e| {
        log_at!(Level::Debug, "side channel to {peer}: {e}");
        match e {
            RSocketError::ConnectTimeout { .. } => Reason::Timeout,
            RSocketError::Create(ref io) if io.raw_os_error() == Some(libc::ENOMEM) => {
                Reason::Memlock
            }
            e if e.errno() == Some(libc::ECONNREFUSED) => Reason::PeerNotShimmed,
            _ => Reason::RdmaError,
        }
    })?;
    let nonce = handshake::new_nonce();
    let hello = Message::Hello(Hello {
        flags: 0,
        nonce,
        client,
        server: peer,
    });
    rs.write_all(&hello.to_bytes())
        .map_err(|_| Reason::RdmaError)?;
    if Instant::now() > deadline {
        return Err(Reason::Timeout);
    }
    Ok((rs, nonce))
}

/// After the kernel connect: ACCEPT with our nonce by `deadline`, then CONFIRM. On success the
/// rsocket is blocking again and carries the stream.
fn client_confirm(
    (rs, nonce): &(RSocket, u64),
    peer: SocketAddr,
    deadline: Instant,
) -> Result<(), Reason> {
    let nonce = *nonce;
    match read_message(rs, deadline)? {
        Message::Accept(Accept { nonce: n, .. }) if n == nonce => {
            rs.set_nonblocking(false).map_err(|_| Reason::RdmaError)?;
            let confirm = Message::Confirm(Confirm { nonce });
            rs.write_all(&confirm.to_bytes())
                .map_err(|_| Reason::RdmaError)?;
            Ok(())
        }
        Message::Refuse(r) => {
            log_at!(
                Level::Debug,
                "side channel to {peer}: REFUSE {:?}",
                r.reason()
            );
            Err(Reason::PeerRefused)
        }
        _ => Err(Reason::RdmaError),
    }
}

/// The client's TCP address as the server will see it, binding the app's socket to the
/// route's source address (port 0: the kernel picks the port now) if the app did not bind it.
fn ensure_bound(fd: c_int, peer: SocketAddr) -> Option<SocketAddr> {
    let local = sys::local_addr(fd)?;
    if local.port() != 0 && !local.ip().is_unspecified() {
        return Some(local);
    }
    let src = route_source(peer, local)?;
    if local.port() != 0 {
        return Some(SocketAddr::new(src, local.port()));
    }
    sys::bind(fd, SocketAddr::new(src, 0)).ok()?;
    sys::local_addr(fd).filter(|a| a.port() != 0)
}

/// The source address the kernel would pick for `peer` (a connected UDP socket; no packet is
/// sent), in the family of the app's socket (`local`).
fn route_source(peer: SocketAddr, local: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let udp = UdpSocket::bind(any).ok()?;
    udp.connect(peer).ok()?;
    let ip = udp.local_addr().ok()?.ip();
    Some(match (local, ip) {
        // An AF_INET6 app socket reaching an IPv4 peer (v4-mapped): bind the mapped form.
        (SocketAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
        (_, ip) => ip,
    })
}

/// Reads one side-channel message by `deadline`, never more bytes than it holds. Leaves the
/// socket non-blocking.
fn read_message(rs: &RSocket, deadline: Instant) -> Result<Message, Reason> {
    rs.set_nonblocking(true).map_err(|_| Reason::RdmaError)?;
    let mut buf = [0u8; MAX_MESSAGE_LEN];
    let mut have = 0usize;
    loop {
        let want = match handshake::decode(buf.get(..have).unwrap_or_default()) {
            Ok((msg, _)) => return Ok(msg),
            Err(DecodeError::Incomplete { needed }) => needed.min(MAX_MESSAGE_LEN),
            Err(DecodeError::Invalid(_)) => return Err(Reason::RdmaError),
        };
        let Some(dst) = buf.get_mut(have..want) else {
            return Err(Reason::RdmaError);
        };
        match rs.read(dst) {
            Ok(0) => return Err(Reason::PeerRefused),
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Reason::Timeout);
                }
                let mut fds = [PollFd::rsocket(rs, Events::READABLE)];
                poll(rs.provider(), &mut fds, Some(deadline - now))
                    .map_err(|_| Reason::RdmaError)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Reason::RdmaError),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The swap and the pump

/// What the pump thread of a swapped fd starts from.
pub enum Start {
    /// The client: CONFIRM is out, the rsocket carries the stream.
    Confirmed(RSocket),
    /// The server: ACCEPT is out. The client's CONFIRM moves the stream to the rsocket; its
    /// give-up (it closed the rsocket, or bytes arrive on TCP) leaves it on TCP, relayed.
    Accepted {
        accepted: Accepted,
        peer: Option<SocketAddr>,
    },
}

/// Moves the kernel TCP socket behind the app's `fd` to a kept fd number, puts one end of a
/// fresh socketpair on `fd` (keeping the app's O_NONBLOCK and close-on-exec), and starts the pump
/// thread between the other end and the connection's far side (see [`Start`]). An error after
/// the fd number was taken over (no pump thread) leaves the app's fd without a peer: the
/// caller resets it.
pub fn swap(fd: c_int, start: Start) -> io::Result<()> {
    let (fl, fdfl) = sys::fd_flags(fd)?;
    let (a, b) = sys::socketpair_stream()?;
    fdtable::set(a.as_raw_fd(), SHIM_OWNED);
    fdtable::set(b.as_raw_fd(), SHIM_OWNED);
    if fl & libc::O_NONBLOCK != 0 {
        sys::set_nonblocking(a.as_fd())?;
    }
    let kept = Arc::new(sys::dup_cloexec(fd)?);
    fdtable::set(kept.as_raw_fd(), SHIM_OWNED);
    SWAPPED_FDS.lock().insert(fd, Arc::clone(&kept));
    if let Err(e) = sys::dup3(a.as_fd(), fd, fdfl & libc::FD_CLOEXEC != 0) {
        SWAPPED_FDS.lock().remove(&fd);
        return Err(e);
    }
    drop(a);
    fdtable::set(fd, INET_STREAM | TCP | COUNTED | SWAPPED);
    thread::Builder::new()
        .name("streamshim-pump".into())
        // `b` goes with the closure: if the thread cannot start, the app reads EOF.
        .spawn(move || run_pump(fd, b, start, kept))
        .map(drop)
}

fn run_pump(fd: c_int, local: OwnedFd, start: Start, kept: Arc<OwnedFd>) {
    let _guard = Guard::enter();
    let control = Arc::new(PumpControl::default());
    ACTIVE_PUMPS.lock().push(Arc::clone(&control));
    let report = match start {
        Start::Confirmed(rs) => Some(pump_rsocket(local, rs, &kept, &control)),
        Start::Accepted { accepted, peer } => {
            let provider = accepted.rs.provider().clone();
            match await_confirm(&accepted, kept.as_fd(), CONFIRM_TIMEOUT) {
                Confirmation::Confirmed => {
                    record(Role::Server, fd, peer, Path::Rdma, Reason::Upgraded);
                    Some(pump_rsocket(local, accepted.rs, &kept, &control))
                }
                Confirmation::StayedTcp(reason) => {
                    record(Role::Server, fd, peer, Path::Tcp, reason);
                    log_at!(
                        Level::Debug,
                        "server fd {fd}: the client stayed on TCP after ACCEPT: relaying"
                    );
                    drop(accepted);
                    Some(relay_tcp(local, &kept, &provider, &control))
                }
                Confirmation::Broken(reason) => {
                    record(Role::Server, fd, peer, Path::Tcp, reason);
                    drop(accepted);
                    // The app reads EOF, the peer's TCP gets an RST.
                    sys::shutdown_both(local.as_raw_fd());
                    reset_tcp(&kept);
                    None
                }
            }
        }
    };
    ACTIVE_PUMPS.lock().retain(|c| !Arc::ptr_eq(c, &control));
    // Nothing of this connection is left to flush at exit (a pump that ran already said so).
    control.finished();
    if let Some(report) = report {
        log_at!(
            Level::Debug,
            "pump ended: {} bytes out, {} in, {:?}",
            report.to_remote,
            report.to_local,
            report.end
        );
    }
}

/// The upgraded connection: app socketpair <-> rsocket, the kept TCP socket watched.
fn pump_rsocket(
    local: OwnedFd,
    rs: RSocket,
    kept: &Arc<OwnedFd>,
    control: &Arc<PumpControl>,
) -> PumpReport {
    let opts = PumpOptions {
        // A reset of the peer's kernel connection ends the pump.
        watch: Some(Arc::clone(kept)),
        control: Arc::clone(control),
        ..PumpOptions::default()
    };
    let report = pump(local, rs, opts);
    let stats = Stats::global();
    stats.add_rdma_bytes_sent(report.to_remote);
    stats.add_rdma_bytes_received(report.to_local);
    let clean = report.end.is_clean();
    stats.record_rdma_close(!clean);
    if !clean {
        reset_tcp(kept);
    }
    report
}

/// A server connection whose client stayed on TCP after the app's fd was swapped: app
/// socketpair <-> the kept TCP socket, byte for byte.
fn relay_tcp(
    local: OwnedFd,
    kept: &Arc<OwnedFd>,
    provider: &Provider,
    control: &Arc<PumpControl>,
) -> PumpReport {
    let opts = PumpOptions {
        control: Arc::clone(control),
        ..PumpOptions::default()
    };
    let report = relay(local, Arc::clone(kept), provider, opts);
    if !report.end.is_clean() {
        reset_tcp(kept);
    }
    report
}

/// The peer's TCP connection gets an RST, so its shim tears its side down the same way.
fn reset_tcp(kept: &OwnedFd) {
    sys::set_linger_zero(kept.as_fd());
    sys::shutdown_both(kept.as_raw_fd());
}

/// How the client answered the server's ACCEPT.
#[derive(Debug, PartialEq, Eq)]
enum Confirmation {
    /// CONFIRM with our nonce: the client swapped, the rsocket carries the stream.
    Confirmed,
    /// The client gave up before CONFIRM (its rsocket closed or failed, bytes on TCP, or
    /// nothing at all within [`CONFIRM_TIMEOUT`]): it stays on TCP.
    StayedTcp(Reason),
    /// Something other than CONFIRM came, or the TCP connection was reset: the connection
    /// fails on both paths.
    Broken(Reason),
}

/// Waits for the client's answer to ACCEPT without ever reading past CONFIRM (what follows is
/// the stream). The kept TCP socket is watched too: a client that stayed on TCP may send its
/// first bytes there before its rsocket's close arrives. A FIN there decides nothing (a client
/// that upgraded and finished closes its TCP socket too), it only ends that watch.
fn await_confirm(accepted: &Accepted, kept: BorrowedFd<'_>, bound: Duration) -> Confirmation {
    let rs = &accepted.rs;
    if rs.set_nonblocking(true).is_err() {
        return Confirmation::StayedTcp(Reason::RdmaError);
    }
    let deadline = Instant::now() + bound;
    let mut buf = [0u8; CONFIRM_LEN];
    let mut have = 0usize;
    let mut watch_tcp = true;
    loop {
        match rs.read(buf.get_mut(have..).unwrap_or_default()) {
            // EOF or an error before a whole CONFIRM: the client closed its rsocket (it gave
            // up, and it only swaps after sending CONFIRM).
            Ok(0) => return Confirmation::StayedTcp(Reason::Timeout),
            Ok(n) => {
                have += n;
                if have == CONFIRM_LEN {
                    return match handshake::decode(&buf) {
                        Ok((Message::Confirm(Confirm { nonce }), _)) if nonce == accepted.nonce => {
                            Confirmation::Confirmed
                        }
                        _ => Confirmation::Broken(Reason::RdmaError),
                    };
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Confirmation::StayedTcp(Reason::Timeout),
        }
        if watch_tcp {
            match peek(kept) {
                Peeked::Nothing => {}
                Peeked::Fin => watch_tcp = false,
                // A client that swapped never writes to TCP.
                Peeked::Bytes => return Confirmation::StayedTcp(Reason::Timeout),
                Peeked::Failed(_) => return Confirmation::Broken(Reason::RdmaError),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            log_at!(
                Level::Info,
                "no CONFIRM within {bound:?} after ACCEPT: the connection stays on TCP"
            );
            return Confirmation::StayedTcp(Reason::Timeout);
        }
        let mut fds = [
            PollFd::rsocket(rs, Events::READABLE),
            PollFd::fd(kept, Events::READABLE),
        ];
        let watched = if watch_tcp { 2 } else { 1 };
        // A provider that misses a wake-up costs at most one tick.
        let wait = (deadline - now).min(Duration::from_millis(100));
        if poll(rs.provider(), &mut fds[..watched], Some(wait)).is_err() {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The kept TCP socket behind a swapped app fd.
pub fn kept(fd: c_int) -> Option<Arc<OwnedFd>> {
    SWAPPED_FDS.lock().get(&fd).cloned()
}

/// The app closes a swapped fd: forget its kept socket (the pump keeps its own reference).
/// `new` is a copy (dup) of the swapped fd `old`: it answers from the same kept TCP socket.
/// False if `old` is not in the table (closed meanwhile by another thread).
pub fn copy_swapped(old: c_int, new: c_int) -> bool {
    let mut map = SWAPPED_FDS.lock();
    let Some(kept) = map.get(&old).cloned() else {
        return false;
    };
    map.insert(new, kept);
    true
}

/// `new` is a copy (dup) of the side-listening fd `old`: the side channel stays open until
/// the last copy is closed. False if `old` has no side listener (closed meanwhile).
pub fn copy_side_listener(old: c_int, new: c_int) -> bool {
    let mut map = LISTENERS.lock();
    let Some(rs) = map.get(&old).cloned() else {
        return false;
    };
    map.insert(new, rs);
    true
}

pub fn forget_swapped(fd: c_int) {
    let old = SWAPPED_FDS.lock().remove(&fd);
    drop(old);
}

// ---------------------------------------------------------------------------------------------
// Server

/// Opens the side-channel listener for the app's listening `fd` and makes sure the side-channel
/// thread runs. False when no listener could be opened (the socket serves plain TCP only).
pub fn open_side_listener(fd: c_int, provider: &'static Provider) -> bool {
    let Some(local) = sys::local_addr(fd) else {
        return false;
    };
    // A `[::]` listener keeps the app's IPV6_V6ONLY: an app that also listens on 0.0.0.0
    // (QEMU's `-incoming tcp::PORT`) has an IPv6-only one, whose side listener must not
    // collide with the IPv4 side listener.
    let only_v6 = local.is_ipv6().then(|| sys::only_v6(fd)).flatten();
    let rs =
        match RSocket::new(provider, rdma_streams_transport::Family::of(&local)).and_then(|rs| {
            if let Some(on) = only_v6 {
                // A provider without the option: bind decides, as before.
                let _ = rs.set_only_v6(on);
            }
            rs.bind(local)?;
            rs.listen(SIDE_BACKLOG)?;
            Ok(rs)
        }) {
            Ok(rs) => rs,
            Err(e) => {
                log_at!(Level::Info, "side-channel listener on {local}: {e}");
                return false;
            }
        };
    if rs.set_nonblocking(true).is_err() {
        return false;
    }
    LISTENERS.lock().insert(fd, Arc::new(rs));
    if !SIDE_THREAD.swap(true, Ordering::AcqRel) {
        let spawned = sys::wake_pair().and_then(|(reader, writer)| {
            fdtable::set(reader.as_raw_fd(), SHIM_OWNED);
            fdtable::set(writer.as_raw_fd(), SHIM_OWNED);
            // The writer stays open for the life of the process (one fd).
            WAKE_WRITER.store(writer.into_raw_fd(), Ordering::Release);
            thread::Builder::new()
                .name("streamshim-side".into())
                .spawn(move || side_thread(provider, reader))
        });
        if let Err(e) = spawned {
            log_at!(Level::Info, "cannot start the side-channel thread: {e}");
            SIDE_THREAD.store(false, Ordering::Release);
            LISTENERS.lock().remove(&fd);
            return false;
        }
    }
    wake_side_thread();
    log_at!(Level::Debug, "side-channel listener on {local} (fd {fd})");
    true
}

/// Wakes the side-channel thread so that it polls the current set of listeners.
fn wake_side_thread() {
    let writer = WAKE_WRITER.load(Ordering::Acquire);
    if writer >= 0 {
        sys::wake(writer);
    }
}

/// The app closes a listening fd: close its side-channel listener.
pub fn close_side_listener(fd: c_int) {
    let old = LISTENERS.lock().remove(&fd);
    drop(old);
    wake_side_thread();
}

/// The pending upgrade registered for this accepted peer, if any.
fn take_pending(peer: SocketAddr) -> Option<Claimed> {
    PENDING.lock().remove(&key(peer)).map(|p| Claimed {
        rs: p.rs,
        nonce: p.nonce,
    })
}

/// `accept()` on a side-listening fd returned a connection from `peer`: claim its pending
/// upgrade. When this process runs the side-channel thread and that thread has side-channel
/// work not yet done (an rsocket waiting on a listener, or a HELLO not completely read), waits
/// for its passes (at most `STREAMSHIM_NEGOTIATE_MS`) so a HELLO that arrived before the SYN is
/// found; with no such work (a plain client) it returns at once.
pub fn claim(peer: SocketAddr) -> Option<Claimed> {
    // Only the process running the side-channel thread holds pending upgrades (a fork child
    // forgot its parent's; and a lock the parent's thread held at fork would never be
    // released in the child).
    if !SIDE_THREAD.load(Ordering::Acquire) {
        return None;
    }
    if let Some(c) = take_pending(peer) {
        return Some(c);
    }
    let deadline = Instant::now() + negotiate_timeout();
    let mut state = SIDE_STATE.lock();
    loop {
        if let Some(c) = take_pending(peer) {
            return Some(c);
        }
        if state.in_flight == 0 && !side_listeners_readable() {
            return None;
        }
        let generation = state.generation;
        while state.generation == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state = SIDE_PASS[SIDE_STATE.slot()]
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The open side-channel listeners, each once (dup'd listening fds share one).
fn side_listeners() -> Vec<Arc<RSocket>> {
    let mut out: Vec<Arc<RSocket>> = Vec::new();
    for l in LISTENERS.lock().values() {
        if !out.iter().any(|o| Arc::ptr_eq(o, l)) {
            out.push(Arc::clone(l));
        }
    }
    out
}

/// Whether any side-channel listener has a connection waiting (no wait).
fn side_listeners_readable() -> bool {
    let listeners = side_listeners();
    let Some(first) = listeners.first() else {
        return false;
    };
    let mut fds: Vec<PollFd<'_>> = listeners
        .iter()
        .map(|l| PollFd::rsocket(l, Events::READABLE))
        .collect();
    match poll(first.provider(), &mut fds, Some(Duration::ZERO)) {
        Ok(_) => fds.iter().any(|f| !f.revents().is_empty()),
        Err(_) => false,
    }
}

/// A claimed upgrade whose ACCEPT was sent: the pump thread waits for the answer.
pub struct Accepted {
    rs: RSocket,
    nonce: u64,
}

/// The server half after a claim: ACCEPT. Ok: the caller swaps at once with
/// [`Start::Accepted`] and the pump thread waits for CONFIRM, so `accept()` returns without a
/// round trip. Err: the ACCEPT could not be written (the client gave up and closed its
/// rsocket, so it cannot swap): the accepted fd stays plain TCP.
pub fn server_accept(claimed: Claimed) -> Result<Accepted, Reason> {
    let Claimed { rs, nonce } = claimed;
    rs.set_nonblocking(false).map_err(|_| Reason::RdmaError)?;
    let accept = Message::Accept(Accept { nonce, limits: 0 });
    rs.write_all(&accept.to_bytes())
        .map_err(|_| Reason::Timeout)?;
    Ok(Accepted { rs, nonce })
}

/// In a fork child: no side-channel thread there, and the parent's pending upgrades are not
/// the child's to claim (their rsockets are forgotten, not closed: the parent still owns them).
/// Runs while the child is single-threaded; a table a parent thread held at the fork is
/// replaced by a fresh one ([`ForkSafe::after_fork`]), so no later call in the child waits for
/// a thread that does not exist here.
pub fn after_fork_child() {
    SIDE_THREAD.store(false, Ordering::Release);
    // The side listeners belong to the parent: an rclose here would reach the parent's
    // listener through the shared RDMA CM file. The child forgets them without closing.
    if let Some(mut listeners) = LISTENERS.after_fork() {
        std::mem::forget(std::mem::take(&mut *listeners));
    }
    // The parent's pump threads do not exist here: nothing to flush at this child's exit.
    if let Some(mut pumps) = ACTIVE_PUMPS.after_fork() {
        pumps.clear();
    }
    if let Some(mut pending) = PENDING.after_fork() {
        std::mem::forget(std::mem::take(&mut *pending));
    }
    if let Some(mut state) = SIDE_STATE.after_fork() {
        state.in_flight = 0;
    }
    // Kept as inherited when free: the child's copies of swapped fds still answer
    // getpeername from their kept sockets (a fresh slot answers from the socketpair).
    drop(SWAPPED_FDS.after_fork());
}

/// A side-channel connection whose HELLO is being read.
struct Incoming {
    conn: RSocket,
    from: SocketAddr,
    buf: [u8; MAX_MESSAGE_LEN],
    have: usize,
    deadline: Instant,
}

/// What one non-blocking read step on an [`Incoming`] gave.
enum Step {
    More,
    Hello(Hello),
    Drop,
}

impl Incoming {
    fn step(&mut self) -> Step {
        loop {
            let want = match handshake::decode(self.buf.get(..self.have).unwrap_or_default()) {
                Ok((Message::Hello(h), _)) => return Step::Hello(h),
                Ok(_) | Err(DecodeError::Invalid(_)) => return Step::Drop,
                Err(DecodeError::Incomplete { needed }) => needed.min(MAX_MESSAGE_LEN),
            };
            let Some(dst) = self.buf.get_mut(self.have..want) else {
                return Step::Drop;
            };
            match self.conn.read(dst) {
                Ok(0) => return Step::Drop,
                Ok(n) => self.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::More,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Drop,
            }
        }
    }
}

fn side_thread(provider: &'static Provider, wake: OwnedFd) {
    let _guard = Guard::enter();
    let mut incoming: Vec<Incoming> = Vec::new();
    loop {
        let listeners = side_listeners();
        // Wait (not holding SIDE_STATE) for a listener, a HELLO being read, or a wake-up
        // (a listener opened or closed).
        let tick = if incoming.is_empty() {
            SIDE_IDLE_TICK
        } else {
            SIDE_TICK
        };
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::fd(wake.as_fd(), Events::READABLE))
            .chain(
                listeners
                    .iter()
                    .map(|l| PollFd::rsocket(l, Events::READABLE)),
            )
            .chain(
                incoming
                    .iter()
                    .map(|i| PollFd::rsocket(&i.conn, Events::READABLE)),
            )
            .collect();
        if poll(provider, &mut fds, Some(tick)).is_err() {
            thread::sleep(SIDE_TICK);
        }
        drop(fds);
        sys::drain_wakes(wake.as_fd());
        // One non-blocking pass, published to `claim` as a whole.
        let mut state = SIDE_STATE.lock();
        let now = Instant::now();
        PENDING
            .lock()
            .retain(|_, p| now.saturating_duration_since(p.at) < PENDING_TIMEOUT);
        for listener in &listeners {
            while let Ok((conn, from)) = listener.accept() {
                if conn.set_nonblocking(true).is_ok() {
                    incoming.push(Incoming {
                        conn,
                        from,
                        buf: [0u8; MAX_MESSAGE_LEN],
                        have: 0,
                        deadline: now + negotiate_timeout(),
                    });
                }
            }
        }
        let mut i = 0;
        while let Some(inc) = incoming.get_mut(i) {
            match inc.step() {
                Step::More if Instant::now() < inc.deadline => i += 1,
                Step::More | Step::Drop => {
                    let gone = incoming.swap_remove(i);
                    log_at!(
                        Level::Debug,
                        "side channel from {}: no valid HELLO",
                        gone.from
                    );
                }
                Step::Hello(hello) => {
                    let gone = incoming.swap_remove(i);
                    register(gone.conn, hello);
                }
            }
        }
        state.in_flight = incoming.len();
        state.generation = state.generation.wrapping_add(1);
        drop(state);
        SIDE_PASS[SIDE_STATE.slot()].notify_all();
    }
}

/// A complete HELLO: policy -> pending (no answer: ACCEPT comes from the process that accepts
/// the TCP connection), or REFUSE.
fn register(conn: RSocket, hello: Hello) {
    let allowed =
        decision::policy().is_some_and(|p| p.server_allows(hello.server.port(), hello.client.ip()));
    if !allowed {
        let refuse = Message::Refuse(Refuse::new(hello.nonce, Reason::Policy));
        // 16 bytes on a fresh connection: never blocks; a failure just closes.
        let _ = conn.write(&refuse.to_bytes());
        return;
    }
    PENDING.lock().insert(
        key(hello.client),
        Pending {
            rs: conn,
            nonce: hello.nonce,
            at: Instant::now(),
        },
    );
    log_at!(
        Level::Debug,
        "side channel: HELLO from {} for {}: pending",
        hello.client,
        hello.server
    );
}

// ---------------------------------------------------------------------------------------------

/// Counts one connection and logs it (one debug line per connection).
pub fn record(role: Role, fd: c_int, peer: Option<SocketAddr>, path: Path, reason: Reason) {
    Stats::global().record(role, path, reason);
    match peer {
        Some(p) => log_at!(Level::Debug, "{role} fd {fd} peer {p}: {path} {reason}"),
        None => log_at!(Level::Debug, "{role} fd {fd} peer ?: {path} {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A parent thread inside the shim's tables at `fork()` (the side-channel thread between
    /// two passes, a pump thread registering): the child must still close an inherited
    /// listening fd, a swapped fd, and start listening itself, without waiting for a thread
    /// that does not exist there. A hang ends the child by SIGALRM after 5 s.
    #[test]
    fn a_fork_child_never_waits_for_a_lock_a_parent_thread_held() {
        let (held_tx, held_rx) = mpsc::channel();
        let (forked_tx, forked_rx) = mpsc::channel::<()>();
        let holder = thread::spawn(move || {
            let listeners = LISTENERS.lock();
            let swapped = SWAPPED_FDS.lock();
            let pumps = ACTIVE_PUMPS.lock();
            let pending = PENDING.lock();
            let state = SIDE_STATE.lock();
            held_tx.send(()).unwrap();
            forked_rx.recv().unwrap();
            drop((listeners, swapped, pumps, pending, state));
        });
        held_rx.recv().unwrap();
        let child = sys::fork_for_test(|| {
            after_fork_child();
            close_side_listener(900);
            forget_swapped(901);
            assert!(kept(901).is_none());
            assert!(!copy_swapped(901, 902));
            PENDING.lock().clear();
            ACTIVE_PUMPS.lock().clear();
            SIDE_STATE.lock().in_flight = 0;
        });
        forked_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(
            sys::wait_for_test(child),
            0,
            "the fork child hung on a shim lock"
        );
    }
}
