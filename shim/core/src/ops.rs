//! The hooks' logic, in safe Rust.
//!
//! Each op gets the arguments it needs (already converted from C) and `real`, a closure that
//! performs the original call exactly once and returns its result (the hook layer saves errno
//! right after it and restores it on the way out, so nothing here can clobber it). In a
//! capable process the upgrade sits between the decision and the return (connect: the RDMA
//! connect before `real`, CLAIM and the swap after it; accept: the claim and the swap after it;
//! see [`upgrade`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use libc::c_int;
use rdma_streams_transport::engine::Writer;

use crate::decision::{self, State};
use crate::fdtable::{
    self, COUNTED, INET_STREAM, LISTENING, POLLED, SHIM_OWNED, SIDE, SWAPPED, TCP,
};
use crate::log::{Level, log_at};
use crate::reason::{Path, Reason, Role};
use crate::stats::Stats;
use crate::{direct, errqueue, readiness, services, sys, upgrade, watches};

/// The socket type without SOCK_NONBLOCK / SOCK_CLOEXEC.
fn base_type(ty: c_int) -> c_int {
    ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
}

/// `socket()`: INET stream sockets are tracked (and make the per-process decision the first
/// time); every other fd number the call returns is forgotten.
pub fn socket(
    domain: c_int,
    ty: c_int,
    protocol: c_int,
    register: &dyn Fn(),
    real: &mut dyn FnMut() -> c_int,
) -> c_int {
    let inet_stream =
        matches!(domain, libc::AF_INET | libc::AF_INET6) && base_type(ty) == libc::SOCK_STREAM;
    if inet_stream {
        decision::ensure(register);
    }
    let fd = real();
    if fd >= 0 {
        let flags = if !inet_stream {
            0
        } else if protocol == 0 || protocol == libc::IPPROTO_TCP {
            INET_STREAM | TCP
        } else {
            INET_STREAM
        };
        // A number closed behind the hooks' back (a raw close, exec) may still have notes.
        if fdtable::get(fd) & POLLED != 0 {
            watches::forget(fd);
        }
        fdtable::set(fd, flags);
        if inet_stream {
            fdtable::mark_defaults(fd);
        }
    }
    fd
}

/// Why a connection of this process on a socket with `flags` stays TCP; None while the decision
/// is not made (the connection passes through uncounted).
fn tcp_reason(flags: u8, per_connection: impl FnOnce() -> bool) -> Option<Reason> {
    if flags & TCP == 0 {
        return Some(Reason::NotTcp);
    }
    match decision::settled() {
        State::Undecided | State::Deciding => None,
        // A fork child whose connections its parent's engine upgrades decides as the parent.
        State::PassThrough(r) if !upgrade::through_parent() => Some(r),
        // A capable process: connections the policy refuses are POLICY. An allowed client
        // connect never gets here (it negotiates, see `upgrade::connect`); an allowed accepted
        // connection that found no registered upgrade had a client that did not negotiate:
        // PEER_NOT_SHIMMED.
        State::PassThrough(_) | State::Capable => Some(if per_connection() {
            Reason::PeerNotShimmed
        } else {
            Reason::Policy
        }),
    }
}

fn count(role: Role, fd: c_int, peer: Option<SocketAddr>, reason: Reason) {
    Stats::global().record(role, Path::Tcp, reason);
    log_at!(
        Level::Debug,
        "{role} fd {fd} peer {}: tcp {reason}",
        DisplayPeer(peer)
    );
}

struct DisplayPeer(Option<SocketAddr>);

impl std::fmt::Display for DisplayPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("?"),
        }
    }
}

/// `connect()`: an INET stream socket's first connect that succeeds or is in progress counts
/// once (client role); failures, retries (EALREADY, EISCONN) and AF_UNSPEC disconnects do not.
/// In a capable process whose policy allows the peer, the connection is negotiated first and
/// upgraded when the peer's shim accepts ([`upgrade::connect`]).
pub fn connect(
    fd: c_int,
    peer: Option<SocketAddr>,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> c_int {
    let flags = fdtable::get(fd);
    if flags & SWAPPED != 0 {
        // Already connected (upgraded): what a connected TCP socket answers.
        sys::set_errno(libc::EISCONN);
        return -1;
    }
    if flags & INET_STREAM == 0 || flags & COUNTED != 0 {
        return real(fd).0;
    }
    let Some(peer) = peer else {
        return real(fd).0;
    };
    // A fork child of a capable process connects through it ([`upgrade::through_parent`]).
    let allowed = flags & TCP != 0
        && (decision::settled() == State::Capable || upgrade::through_parent())
        && decision::policy().is_some_and(|p| p.client_allows(peer));
    // A virtual IP of the cluster: only the kernel's NAT knows the backend.
    let service = allowed && services::is_service_ip(peer.ip());
    // Zero-copy sends (`SO_ZEROCOPY` set before the connect) wait for completions only the
    // kernel's TCP socket gives: that connection stays on it.
    if allowed
        && (flags & POLLED == 0 || watches::followable(fd))
        && (fdtable::has_defaults(fd) || !sys::zero_copy(fd))
    {
        return if service {
            // The backend the NAT picks connects back ([`upgrade::connect_through_service`]).
            upgrade::connect_through_service(fd, peer, real)
        } else {
            upgrade::connect(fd, peer, real)
        };
    }
    let (rc, err) = real(fd);
    if (rc == 0 || err == libc::EINPROGRESS)
        && let Some(reason) = if service {
            Some(Reason::ServiceIp)
        } else if allowed {
            // Registered with epoll before connect in a way the swap cannot follow, or
            // zero-copy sends on.
            Some(Reason::Unsupported)
        } else {
            tcp_reason(flags, || false)
        }
        && fdtable::add(fd, COUNTED) & COUNTED == 0
    {
        count(Role::Client, fd, Some(peer), reason);
    }
    rc
}

/// `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD*)`: `real` makes `new` a copy of `old` (`target`: the
/// number dup2/dup3 asked for, whose previous file is closed by the call). The copy inherits
/// what the shim knows of `old` (a swapped fd's kept TCP socket, a listener's side channel);
/// the replaced number forgets what it was. Untracked fds: two atomic loads and, if the new
/// number had stale flags, one store.
pub fn dup(old: c_int, target: Option<c_int>, real: &mut dyn FnMut() -> c_int) -> c_int {
    if target == Some(old) {
        // dup2(fd, fd) / an error for dup3(fd, fd): nothing changes hands.
        return real();
    }
    let flags = fdtable::get(old);
    let replaced = target.map_or(0, fdtable::get);
    let new = real();
    if new < 0 {
        return new;
    }
    if replaced & SWAPPED != 0 {
        upgrade::forget_swapped(new);
    }
    if replaced & SIDE != 0 {
        upgrade::close_side_listener(new);
    } else if replaced & LISTENING != 0 {
        upgrade::forget_grouped(new);
    }
    if replaced & POLLED != 0 {
        watches::forget(new);
    }
    // The number names another file now.
    upgrade::forget_restored(new);
    readiness::forget(new);
    if flags & POLLED != 0 && flags & COUNTED == 0 {
        // The registrations are the old number's: a swap of the copy could not move them.
        watches::unfollowable(new);
    }
    if replaced & SHIM_OWNED != 0 {
        log_at!(
            Level::Info,
            "dup onto fd {new}, a shim fd: the connection using it breaks"
        );
    }
    // Either number may set an option of the socket both name now.
    fdtable::forget_defaults(old);
    // A copy the app made of a shim fd (a stale number) is the app's.
    let mut copied = flags & !SHIM_OWNED;
    if flags & SWAPPED != 0 && !upgrade::copy_swapped(old, new) {
        copied &= !SWAPPED;
    }
    if flags & SIDE != 0 && !upgrade::copy_side_listener(old, new) {
        copied &= !SIDE;
    } else if flags & (LISTENING | SIDE) == LISTENING {
        upgrade::copy_grouped(old, new);
    }
    if copied == 0 {
        fdtable::clear(new);
    } else {
        fdtable::set(new, copied);
    }
    new
}

/// A successful `epoll_ctl(epfd, op, fd, event)` (`event`: its events and data, None for
/// `EPOLL_CTL_DEL`) on an INET stream socket that is not connected, accepted or listening yet
/// marks it [`POLLED`] and notes the registration, which the swap moves to the socketpair
/// ([`watches`]; one it cannot follow keeps the connection TCP, see [`connect`]).
pub fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: Option<(u32, u64)>) {
    let flags = fdtable::get(fd);
    if flags & (INET_STREAM | COUNTED | LISTENING | SWAPPED) == INET_STREAM {
        fdtable::add(fd, POLLED);
        watches::note(fd, epfd, op, event);
    }
}

/// `listen()`: noted; in a capable process a TCP listener also gets an RDMA listener on the
/// same address and port (the connection manager's IB port space: the upgrade's side channel),
/// unless zero-copy sends are on for it (its connections inherit `SO_ZEROCOPY`, whose
/// completions only the kernel's TCP socket gives: clients find no RDMA listener and stay TCP).
pub fn listen(fd: c_int, real: &mut dyn FnMut() -> c_int) -> c_int {
    let rc = real();
    let flags = fdtable::get(fd);
    if rc == 0 && flags & INET_STREAM != 0 {
        fdtable::add(fd, LISTENING);
        upgrade::forget_grouped(fd);
        if flags & (TCP | SIDE) == TCP
            && decision::settled() == State::Capable
            && !sys::zero_copy(fd)
            && upgrade::open_side_listener(fd)
        {
            fdtable::add(fd, SIDE);
        }
    }
    rc
}

/// `accept()`/`accept4()`: every connection accepted on a tracked listener is tracked and
/// counted (server role). `peer` is the address the call returned, if the caller asked for it.
/// On a listener with an RDMA listener, a connection whose client registered an upgrade is
/// swapped onto the engine before the fd is returned.
pub fn accept(listener: c_int, real: &mut dyn FnMut() -> (c_int, Option<SocketAddr>)) -> c_int {
    let flags = fdtable::get(listener);
    let (fd, peer) = real();
    if fd < 0 || flags & INET_STREAM == 0 {
        if fd >= 0 {
            fdtable::set(fd, 0);
        }
        return fd;
    }
    fdtable::set(fd, (flags & (INET_STREAM | TCP)) | COUNTED);
    if fdtable::has_defaults(listener) {
        // The connection inherits its listener's options.
        fdtable::mark_defaults(fd);
    }
    let mut peer = peer;
    if flags & SIDE != 0
        && let Some(p) = peer.or_else(|| sys::peer_addr(fd))
    {
        peer = Some(p);
        // A registered client: swapped now, counted when it answers the engine's CLAIM (or
        // counted now when it gave up before this accept).
        if upgrade::claim_and_swap(fd, p) != upgrade::Claim::None {
            return fd;
        }
    } else if flags & (LISTENING | SIDE) == LISTENING
        // Groups exist in capable processes only: a pass-through accept takes no lock.
        && decision::settled() == State::Capable
        // An SO_REUSEPORT listener whose RDMA listener another process of its group holds
        // (or held, until this process took it over).
        && let Some(group) = upgrade::grouped(listener)
        && let Some(p) = peer.or_else(|| sys::peer_addr(fd))
    {
        peer = Some(p);
        if upgrade::claim_in_group(group, fd, p) {
            return fd;
        }
    }
    // The policy check needs the peer address and the local port: in a capable process only
    // (two syscalls there), never on the pass-through path.
    let reason = tcp_reason(flags, || {
        let Some(p) = peer.or_else(|| sys::peer_addr(fd)) else {
            return false;
        };
        peer = Some(p);
        let local_port = sys::local_addr(fd).map_or(0, |a| a.port());
        decision::policy().is_some_and(|pol| pol.server_allows(local_port, p.ip()))
    });
    if let Some(reason) = reason {
        count(Role::Server, fd, peer, reason);
    }
    fd
}

/// `close()`: the fd number is forgotten before the real close (see [`fdtable`]); a swapped fd
/// drops its kept TCP socket reference (the engine sees EOF and finishes the stream), a
/// side-listening fd closes its RDMA listener.
pub fn close(fd: c_int, real: &mut dyn FnMut() -> c_int) -> c_int {
    let flags = fdtable::get(fd);
    if flags & SHIM_OWNED != 0 {
        // Not the app's fd: its own was closed before (a double close). What the app would
        // see without the shim, had the number not been reused.
        log_at!(Level::Debug, "close({fd}) of a shim fd refused (EBADF)");
        sys::set_errno(libc::EBADF);
        return -1;
    }
    fdtable::clear(fd);
    readiness::forget(fd);
    upgrade::forget_restored(fd);
    if flags & POLLED != 0 {
        watches::forget(fd);
    }
    let kept = if flags & SWAPPED != 0 {
        upgrade::forget_swapped(fd)
    } else {
        None
    };
    if flags & SIDE != 0 {
        upgrade::close_side_listener(fd);
    } else if flags & LISTENING != 0 {
        upgrade::forget_grouped(fd);
    }
    let rc = real();
    if let Some(kept) = kept {
        upgrade::close_abortively(kept, RESET_SETTLE);
    }
    rc
}

/// The kept TCP socket of the upgraded `fd` says it is no longer connected (the peer reset
/// it): waits, at most [`RESET_SETTLE`], for the engine to hand the app what arrived before the
/// reset and end the app's side, so that the app's next read sees those bytes, then the reset,
/// as on a TCP socket (whose `getpeername` fails only once the RST, behind every byte before
/// it, arrived).
pub fn peer_reset_seen(fd: c_int) {
    if fdtable::get(fd) & SWAPPED != 0 {
        sys::wait_hangup(fd, RESET_SETTLE);
    }
}

/// How long [`peer_reset_seen`] and an abortive [`close`] wait for the engine.
pub const RESET_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs `other` on the kept TCP socket of a swapped fd (getpeername, getsockname, TCP
/// options), else `real` on the fd itself.
pub fn redirect(
    fd: c_int,
    real: &mut dyn FnMut() -> c_int,
    other: &mut dyn FnMut(c_int) -> c_int,
) -> c_int {
    // Pass-through path: one atomic load; the swapped-fd map is only consulted for swapped fds.
    let kept = if fdtable::get(fd) & SWAPPED != 0 {
        upgrade::kept(fd)
    } else {
        None
    };
    match kept {
        Some(kept) => {
            let rc = other(std::os::fd::AsRawFd::as_raw_fd(&*kept));
            let errno = sys::errno();
            drop(kept);
            sys::set_errno(errno);
            rc
        }
        None => real(),
    }
}

/// `setsockopt(SO_LINGER)` of the upgraded `fd` succeeded: its kept TCP socket resets on close
/// when `reset` (an abortive close the engine carries to the peer), else closes with a FIN.
pub fn mirror_linger(fd: c_int, reset: bool) {
    if fdtable::get(fd) & SWAPPED == 0 {
        return;
    }
    if let Some(kept) = upgrade::kept(fd) {
        let _ =
            rdma_streams_transport::fd::set_reset_on_close(std::os::fd::AsFd::as_fd(&*kept), reset);
    }
}

/// `read`/`recv` of `fd` into `buf`: for an upgraded fd whose socketpair end holds nothing,
/// the stream's received bytes straight from its ring (one copy instead of two); None: the
/// caller calls the original (which reads what the engine delivered, in order).
pub fn read_direct(fd: c_int, buf: &mut [u8]) -> Option<usize> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    let n = upgrade::read_direct(fd, buf)?;
    crate::stats::Stats::global().add_rdma_bytes_direct(n as u64);
    Some(n)
}

/// A `read`/`recv` of `fd` into `buf` ([`upgrade::read_or_wait`]): for an upgraded fd, the
/// stream's bytes from its ring, after those `wait` (the original call, made at most once)
/// returns when the ring cannot be read at once. None: the caller calls the original.
pub fn read_or_wait(
    fd: c_int,
    buf: &mut [u8],
    wait: &mut dyn FnMut(&mut [u8]) -> isize,
) -> Option<isize> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    let mut waited = 0isize;
    let mut counted = |b: &mut [u8]| {
        let n = wait(b);
        waited = n.max(0);
        n
    };
    let n = upgrade::read_or_wait(fd, buf, &mut counted)?;
    let direct = n.saturating_sub(waited).max(0).unsigned_abs();
    if direct > 0 {
        crate::stats::Stats::global().add_rdma_bytes_direct(direct as u64);
    }
    Some(n)
}

/// The direct writer of the upgraded `fd` ([`upgrade::writer`]); None for any other fd, or
/// with direct writes off: the caller writes to the fd as usual.
pub fn writer(fd: c_int) -> Option<Arc<Writer>> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    upgrade::writer(fd)
}

/// One direct write of the start of `chunk` for the upgraded `fd` behind `writer`: before its
/// move, on the kept TCP socket ([`Writer::write_early`]), after it into the send ring
/// ([`Writer::write`]). The byte count, None when neither takes any now (the caller writes the
/// rest to the fd, in order behind these). `wait_until`: until when the write may
/// wait for room in the ring ([`write_wait_until`]), asked only when there is none.
pub fn write_direct(
    writer: &Writer,
    fd: c_int,
    chunk: &[u8],
    wait_until: &mut dyn FnMut() -> Option<Instant>,
) -> Option<usize> {
    if let Some(n) = writer.write_early(fd, chunk) {
        Stats::global().add_before_move_direct(n as u64);
        return Some(n);
    }
    let n = writer.write(fd, chunk, wait_until)?;
    Stats::global().add_rdma_bytes_direct_written(n as u64);
    Some(n)
}

/// Before the move of the upgraded `fd` behind `writer`: the start of `bufs` sent on the kept
/// TCP socket from the app's thread ([`Writer::write_early_vectored`]); None: the caller writes
/// to the fd.
pub fn write_early_vectored(
    writer: &Writer,
    fd: c_int,
    bufs: &[std::io::IoSlice<'_>],
) -> Option<usize> {
    let n = writer.write_early_vectored(fd, bufs)?;
    Stats::global().add_before_move_direct(n as u64);
    Some(n)
}

/// The app set `SO_RCVLOWAT` on the upgraded `fd`: the engine learns the mark it now has
/// ([`upgrade::set_low_water`]).
pub fn low_water_set(fd: c_int) {
    if fdtable::get(fd) & SWAPPED != 0 {
        upgrade::set_low_water(fd, sys::rcvlowat(fd));
    }
}

/// `ioctl(fd, FIONREAD)` on an upgraded `fd`, answered as TCP's when an urgent byte is pending
/// ([`sys::readable_before_mark`]); None: the caller calls the original.
pub fn readable(fd: c_int) -> Option<c_int> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    sys::readable_before_mark(fd)
}

/// `ioctl(fd, SIOCATMARK)` on an upgraded `fd`, answered as TCP's ([`upgrade::at_mark`]):
/// `Some(Ok(at the mark))`, `Some(Err(errno))`; None: the caller calls the original.
pub fn at_mark(fd: c_int) -> Option<Result<bool, c_int>> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    Some(upgrade::at_mark(fd)?.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)))
}

/// `send` of urgent data (`MSG_OOB` in `flags`) on the upgraded `fd`: sent so that the peer's
/// app gets its last byte as urgent data at its place ([`upgrade::send_urgent`]), blocking as
/// the fd and `flags` ask. None for any other fd: the caller sends it as usual.
pub fn send_urgent(fd: c_int, buf: &[u8], flags: c_int) -> Option<std::io::Result<usize>> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    let blocks = flags & libc::MSG_DONTWAIT == 0 && sys::send_blocks(fd);
    loop {
        match upgrade::send_urgent(fd, buf, flags)? {
            Err(e) if blocks && e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Err(e) = sys::wait_writable(fd) {
                    return Some(Err(e));
                }
            }
            done => return Some(done),
        }
    }
}

/// Until when a write of `fd` (the app's end of an upgraded stream) may wait for room in the
/// send ring: [`direct::WRITE_WAIT`] from now for a blocking send without a send timeout; None
/// for `MSG_DONTWAIT` (`dontwait`), a non-blocking fd or one with `SO_SNDTIMEO` (those queue
/// the rest in the socketpair at once, which then blocks or not as they asked).
pub fn write_wait_until(fd: c_int, dontwait: bool) -> Option<Instant> {
    (!dontwait && sys::send_blocks(fd)).then(|| Instant::now() + direct::WRITE_WAIT)
}

/// A hold on the stream behind the upgraded `fd` for a run of direct reads
/// ([`upgrade::hold`]); None for any other fd.
pub fn hold_stream(fd: c_int) -> Option<upgrade::Hold> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    upgrade::hold(fd)
}

/// The stream behind the upgraded `fd` failed and the app was not told yet (once): the caller
/// answers `ECONNRESET` where the socketpair answered EOF or `EPIPE` ([`upgrade::take_reset`]).
pub fn take_reset(fd: c_int) -> bool {
    if fdtable::get(fd) & SWAPPED == 0 {
        return false;
    }
    upgrade::take_reset(fd)
}

/// Whether any number was put back on its TCP socket by a failed connect (one atomic load:
/// the read hooks ask it at every EOF before [`read_again`]).
#[inline]
pub fn any_restored() -> bool {
    upgrade::any_restored()
}

/// Whether a read of `fd` that met EOF is made again: the number was put back on its TCP
/// socket by a failed connect ([`upgrade::restored`]).
pub fn read_again(fd: c_int) -> bool {
    upgrade::restored(fd)
}

/// The pending error only the hooks report for the upgraded `fd` (its generation), if any
/// ([`readiness`]).
pub fn error_state(fd: c_int) -> Option<u64> {
    upgraded(fd).then(|| upgrade::error_state(fd)).flatten()
}

/// The fds among `fds` with an error only the hooks report (`poll`, `select`).
pub fn errors_among(fds: &[c_int]) -> Vec<c_int> {
    readiness::errors_among(fds, &error_state)
}

/// The events epoll instance `epfd` reports now for errors only the hooks report (its
/// registrations are read from `/proc/self/fdinfo` only while one is pending).
pub fn epoll_errors(epfd: c_int) -> Vec<readiness::ErrorEvent> {
    let registrations = |epfd: c_int| {
        std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}"))
            .map(|text| readiness::parse_fdinfo(&text))
            .unwrap_or_default()
    };
    let inode = |fd: c_int| sys::file_id(fd).map(|f| f.ino());
    readiness::epoll_errors(epfd, &error_state, &registrations, &inode)
}

/// Whether `fd` is upgraded (one atomic load).
pub fn upgraded(fd: c_int) -> bool {
    fdtable::get(fd) & SWAPPED != 0
}

/// `SO_ZEROCOPY` was set to `value` on the upgraded `fd`: turned on, the process's waits over
/// upgraded fds wait in slices ([`readiness::slice_waits`]).
pub fn zero_copy_set(fd: c_int, value: Option<c_int>) {
    if upgraded(fd) && value.is_some_and(|v| v != 0) {
        readiness::slice_waits();
    }
}

/// A send with `MSG_ZEROCOPY` on `fd` took bytes: an upgraded fd queues its completion
/// ([`upgrade::zerocopy_sent`]).
pub fn zerocopy_sent(fd: c_int) {
    if upgraded(fd) {
        upgrade::zerocopy_sent(fd);
    }
}

/// `recvmsg(MSG_ERRQUEUE)` of the upgraded `fd` with `room` bytes for control data: its
/// oldest zero-copy completion, encoded as TCP's ([`errqueue::encode`]: the bytes, and whether
/// they were cut short), or `Err(EAGAIN)` when its queue is empty. None: not upgraded (the
/// original answers).
pub fn take_error(fd: c_int, room: usize) -> Option<Result<(Vec<u8>, bool), c_int>> {
    if !upgraded(fd) {
        return None;
    }
    let (errq, family) = upgrade::error_queue(fd)?;
    Some(match errq.take() {
        Some(c) => Ok(errqueue::encode(family, c, room)),
        None => Err(libc::EAGAIN),
    })
}

/// The error a write of the upgraded `fd` that the socketpair answered `EPIPE` reports instead,
/// as a TCP socket's send reports a reset it did not report yet: the socketpair end's pending
/// error (the kernel's report of the reset, taken as TCP's send takes it), else `ECONNRESET`
/// once when the hooks report it ([`take_reset`]). None: `EPIPE` it is.
pub fn write_error(fd: c_int) -> Option<c_int> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    match sys::take_socket_error(fd) {
        0 => upgrade::take_reset(fd).then_some(libc::ECONNRESET),
        e => Some(e),
    }
}

/// The byte counts of the upgraded `fd`'s stream that its `TCP_INFO` answers with (sent,
/// acknowledged, received: [`calls::patch_tcp_info`]); None: the kept TCP socket's stand.
pub fn stream_counters(fd: c_int) -> Option<(u64, u64, u64)> {
    if fdtable::get(fd) & SWAPPED == 0 {
        return None;
    }
    upgrade::stream_counters(fd)
}

/// `recvmsg()` received the descriptors `fds` (`SCM_RIGHTS`): the app's end of an upgraded
/// connection another process (or this one) handed over answers as its TCP socket from now on
/// ([`upgrade::adopt`]). Any other descriptor costs a `getsockopt` or two.
pub fn received(fds: &[c_int], register: &dyn Fn()) {
    for &fd in fds {
        let flags = fdtable::get(fd);
        if flags & SHIM_OWNED != 0 {
            continue;
        }
        if flags != 0 {
            // The kernel just gave this number out: what the table says of it is about a file
            // closed behind the hooks' back (libuv closes with a raw `syscall(SYS_close)`).
            forget_stale(fd, flags);
        }
        if !sys::is_unix_stream(fd) {
            continue;
        }
        decision::ensure(register);
        if decision::settled() == State::PassThrough(Reason::Disabled) {
            return;
        }
        upgrade::adopt(fd);
    }
}

/// Forgets what the table says of `fd` (`flags`), a number closed behind the hooks' back.
fn forget_stale(fd: c_int, flags: u8) {
    fdtable::clear(fd);
    if flags & POLLED != 0 {
        watches::forget(fd);
    }
    if flags & SWAPPED != 0 {
        drop(upgrade::forget_swapped(fd));
    }
}

/// At exit (atexit handler or the destructor fallback).
pub fn at_exit() {
    upgrade::flush_at_exit();
    decision::write_stats_once();
}

/// In the child after fork.
pub fn at_fork_child() {
    decision::after_fork_child();
    crate::negotiation::after_fork_child();
    upgrade::after_fork_child();
    watches::after_fork_child();
    readiness::after_fork_child();
}
