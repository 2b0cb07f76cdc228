//! Phase 2: the upgrade itself (docs/shim-protocol.md).
//!
//! - Client ([`connect`]): negotiate on the side channel (rconnect to the same address and port
//!   in the rsocket port space, HELLO, ACCEPT within `STREAMSHIM_NEGOTIATE_MS`) *before* the
//!   real kernel connect; on success, after the real connect, [`swap`] the app's fd onto one
//!   end of a socketpair whose other end a pump thread moves to and from the rsocket.
//! - Server: `listen()` opens a side-channel rsocket listener ([`open_side_listener`]); one
//!   side-channel thread per process accepts rsockets on all of them, reads HELLO, applies the
//!   server policy, registers `pending[client addr:port]` and answers ACCEPT (or REFUSE).
//!   `accept()` takes the pending entry of the accepted peer ([`take_pending`]) and swaps.
//!
//! Nothing here runs on the pass-through path: every entry point is reached only for a capable
//! process's INET TCP socket (or an fd the fd table marks as swapped / side-listening). The
//! shim's threads (side channel, pumps) hold the re-entrancy guard for their whole life, so the
//! provider's and libc's calls they make go straight to the originals.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::handshake::{
    self, Accept, DecodeError, Hello, MAX_MESSAGE_LEN, Message, PENDING_TIMEOUT, Refuse,
};
use rdma_streams_transport::negative_cache::NegativeCache;
use rdma_streams_transport::policy::canonical_ip;
use rdma_streams_transport::reason::{Path, Reason, Role};
use rdma_streams_transport::stats::Stats;
use rdma_streams_transport::{
    Events, PollFd, Provider, PumpOptions, RSocket, RSocketError, poll, pump,
};

use crate::decision;
use crate::fdtable::{self, COUNTED, INET_STREAM, SWAPPED, TCP};
use crate::guard::Guard;
use crate::log::{Level, log_at};
use crate::sys;

/// Backlog of a side-channel listener.
const SIDE_BACKLOG: i32 = 128;
/// Longest sleep of the side-channel thread (a listener added meanwhile waits at most this).
const SIDE_TICK: Duration = Duration::from_millis(20);

/// Swapped app fds -> the kept kernel TCP socket (shared with the connection's pump thread).
static SWAPPED_FDS: Mutex<BTreeMap<c_int, Arc<OwnedFd>>> = Mutex::new(BTreeMap::new());
/// App listening fd -> its side-channel rsocket listener.
static LISTENERS: Mutex<BTreeMap<c_int, Arc<RSocket>>> = Mutex::new(BTreeMap::new());
/// Registered upgrades no TCP connection claimed yet: client TCP address -> rsocket.
static PENDING: Mutex<BTreeMap<SocketAddr, (RSocket, Instant)>> = Mutex::new(BTreeMap::new());
/// Destinations that could not upgrade recently.
static NEGATIVE: NegativeCache = NegativeCache::new(
    rdma_streams_transport::negative_cache::DEFAULT_TTL,
    rdma_streams_transport::negative_cache::DEFAULT_CAPACITY,
);
/// Set once the side-channel thread runs (cleared in a fork child, which has no such thread).
static SIDE_THREAD: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `STREAMSHIM_NEGOTIATE_MS`, read once.
fn negotiate_timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(handshake::negotiate_timeout_from_env)
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
        // The kernel connect failed: the app sees exactly that error; the server drops its
        // pending entry after 10 s.
        return rc;
    }
    if fdtable::add(fd, COUNTED) & COUNTED != 0 {
        return rc;
    }
    match swap(fd, rs) {
        Ok(()) => record(Role::Client, fd, Some(peer), Path::Rdma, Reason::Upgraded),
        Err(e) => {
            // The server already moved its side to the rsocket: a TCP connection here would
            // carry bytes nobody reads. Fail it like a reset instead.
            log_at!(Level::Info, "client fd {fd}: swap failed ({e}): resetting");
            sys::shutdown_both(fd);
            record(Role::Client, fd, Some(peer), Path::Tcp, Reason::RdmaError);
        }
    }
    rc
}

/// Steps 2-4 of the sequence: bind if needed, rconnect, HELLO, ACCEPT.
fn negotiate(fd: c_int, peer: SocketAddr, provider: &Provider) -> Result<RSocket, Reason> {
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
    match read_message(&rs, deadline)? {
        Message::Accept(Accept { nonce: n, .. }) if n == nonce => {
            rs.set_nonblocking(false).map_err(|_| Reason::RdmaError)?;
            Ok(rs)
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

/// Moves the kernel TCP socket behind the app's `fd` to a kept fd number, puts one end of a
/// fresh socketpair on `fd` (keeping the app's O_NONBLOCK and close-on-exec), and starts the pump
/// between the other end and `rs`.
pub fn swap(fd: c_int, rs: RSocket) -> io::Result<()> {
    let (fl, fdfl) = sys::fd_flags(fd)?;
    let (a, b) = sys::socketpair_stream()?;
    fdtable::set(a.as_raw_fd(), 0);
    fdtable::set(b.as_raw_fd(), 0);
    if fl & libc::O_NONBLOCK != 0 {
        sys::set_nonblocking(a.as_fd())?;
    }
    let kept = Arc::new(sys::dup_cloexec(fd)?);
    fdtable::set(kept.as_raw_fd(), 0);
    lock(&SWAPPED_FDS).insert(fd, Arc::clone(&kept));
    if let Err(e) = sys::dup3(a.as_fd(), fd, fdfl & libc::FD_CLOEXEC != 0) {
        lock(&SWAPPED_FDS).remove(&fd);
        return Err(e);
    }
    drop(a);
    fdtable::set(fd, INET_STREAM | TCP | COUNTED | SWAPPED);
    let spawned = thread::Builder::new()
        .name("streamshim-pump".into())
        .spawn(move || run_pump(b, rs, kept));
    if let Err(e) = spawned {
        // `b` went with the closure: the app reads EOF.
        log_at!(Level::Info, "cannot start a pump thread: {e}");
    }
    Ok(())
}

fn run_pump(local: OwnedFd, rs: RSocket, kept: Arc<OwnedFd>) {
    let _guard = Guard::enter();
    let report = pump(local, rs, PumpOptions::default());
    let stats = Stats::global();
    stats.add_rdma_bytes_sent(report.to_remote);
    stats.add_rdma_bytes_received(report.to_local);
    let clean = report.end.is_clean();
    stats.record_rdma_close(!clean);
    if !clean {
        // The peer's TCP fails too, so its shim tears its side down the same way.
        sys::set_linger_zero(kept.as_fd());
        sys::shutdown_both(kept.as_raw_fd());
    }
    log_at!(
        Level::Debug,
        "pump ended: {} bytes out, {} in, {:?}",
        report.to_remote,
        report.to_local,
        report.end
    );
    drop(kept);
}

/// The kept TCP socket behind a swapped app fd.
pub fn kept(fd: c_int) -> Option<Arc<OwnedFd>> {
    lock(&SWAPPED_FDS).get(&fd).cloned()
}

/// The app closes a swapped fd: forget its kept socket (the pump keeps its own reference).
pub fn forget_swapped(fd: c_int) {
    let old = lock(&SWAPPED_FDS).remove(&fd);
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
    let rs = match RSocket::listen_on(provider, local, SIDE_BACKLOG) {
        Ok(rs) => rs,
        Err(e) => {
            log_at!(Level::Info, "side-channel listener on {local}: {e}");
            return false;
        }
    };
    if rs.set_nonblocking(true).is_err() {
        return false;
    }
    lock(&LISTENERS).insert(fd, Arc::new(rs));
    if !SIDE_THREAD.swap(true, Ordering::AcqRel) {
        let spawned = thread::Builder::new()
            .name("streamshim-side".into())
            .spawn(move || side_thread(provider));
        if let Err(e) = spawned {
            log_at!(Level::Info, "cannot start the side-channel thread: {e}");
            SIDE_THREAD.store(false, Ordering::Release);
            lock(&LISTENERS).remove(&fd);
            return false;
        }
    }
    log_at!(Level::Debug, "side-channel listener on {local} (fd {fd})");
    true
}

/// The app closes a listening fd: close its side-channel listener.
pub fn close_side_listener(fd: c_int) {
    let old = lock(&LISTENERS).remove(&fd);
    drop(old);
}

/// The pending upgrade registered for this accepted peer, if any.
pub fn take_pending(peer: SocketAddr) -> Option<RSocket> {
    lock(&PENDING).remove(&key(peer)).map(|(rs, _)| rs)
}

/// In a fork child: no side-channel thread there.
pub fn after_fork_child() {
    SIDE_THREAD.store(false, Ordering::Release);
}

fn side_thread(provider: &'static Provider) {
    let _guard = Guard::enter();
    loop {
        let listeners: Vec<Arc<RSocket>> = lock(&LISTENERS).values().cloned().collect();
        let now = Instant::now();
        lock(&PENDING).retain(|_, (_, at)| now.saturating_duration_since(*at) < PENDING_TIMEOUT);
        if listeners.is_empty() {
            thread::sleep(SIDE_TICK);
            continue;
        }
        let mut fds: Vec<PollFd<'_>> = listeners
            .iter()
            .map(|l| PollFd::rsocket(l, Events::READABLE))
            .collect();
        if poll(provider, &mut fds, Some(SIDE_TICK)).is_err() {
            thread::sleep(SIDE_TICK);
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        for (listener, ready) in listeners.iter().zip(ready) {
            if !ready {
                continue;
            }
            while let Ok((conn, from)) = listener.accept() {
                serve(conn, from);
            }
        }
    }
}

/// One side-channel connection: HELLO -> policy -> pending -> ACCEPT, or REFUSE / close.
fn serve(conn: RSocket, from: SocketAddr) {
    let deadline = Instant::now() + negotiate_timeout();
    let hello = match read_message(&conn, deadline) {
        Ok(Message::Hello(h)) => h,
        Ok(_) | Err(_) => {
            log_at!(Level::Debug, "side channel from {from}: no valid HELLO");
            return;
        }
    };
    if conn.set_nonblocking(false).is_err() {
        return;
    }
    let allowed =
        decision::policy().is_some_and(|p| p.server_allows(hello.server.port(), hello.client.ip()));
    if !allowed {
        let refuse = Message::Refuse(Refuse::new(hello.nonce, Reason::Policy));
        let _ = conn.write_all(&refuse.to_bytes());
        return;
    }
    let accept = Message::Accept(Accept {
        nonce: hello.nonce,
        limits: 0,
    });
    let k = key(hello.client);
    // Registered before ACCEPT leaves: the client's SYN follows ACCEPT, so accept() finds it.
    let mut pending = lock(&PENDING);
    pending.insert(k, (conn, Instant::now()));
    let sent = pending
        .get(&k)
        .is_some_and(|(rs, _)| rs.write_all(&accept.to_bytes()).is_ok());
    if !sent {
        pending.remove(&k);
    }
    drop(pending);
    log_at!(
        Level::Debug,
        "side channel: HELLO from {} for {}: {}",
        hello.client,
        hello.server,
        if sent { "ACCEPT" } else { "send failed" }
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
