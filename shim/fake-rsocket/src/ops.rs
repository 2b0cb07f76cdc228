//! The rsocket operations in safe Rust, on r-fd numbers, byte slices and `SocketAddr`s.
//!
//! Each function is what one exported C function does once [`crate::ffi`] has turned raw
//! pointers into slices. Faults from [`crate::faults`] are applied here.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use libc::c_int;
use socket2::{Domain, MaybeUninitSlice, Protocol, SockAddr, Socket, Type};

use crate::addr::{self, to_kernel, to_rsocket};
use crate::config::config;
use crate::errno::{Errno, Res, err};
use crate::stats;
use crate::table::{Entry, Phase, table};

/// `SOL_RDMA`: rsocket's own option level.
pub(crate) const SOL_RDMA: c_int = 0x10000;
/// `RDMA_ROUTE`: a path record to skip route resolution; accepted and ignored here.
const RDMA_ROUTE: c_int = 4;

/// `rsocket(domain, type, protocol)`.
pub(crate) fn socket(domain: c_int, ty: c_int, protocol: c_int) -> Res<c_int> {
    let kernel_domain = match domain {
        libc::AF_INET => Domain::IPV4,
        libc::AF_INET6 => Domain::IPV6,
        _ => return err(libc::EAFNOSUPPORT),
    };
    let nonblocking = ty & libc::SOCK_NONBLOCK != 0;
    if ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != libc::SOCK_STREAM {
        return err(libc::EPROTONOSUPPORT);
    }
    if protocol != 0 && protocol != libc::IPPROTO_TCP {
        return err(libc::EPROTONOSUPPORT);
    }
    let faults = &config().faults;
    if faults.nodev {
        return err(libc::ENODEV);
    }
    if faults.enomem {
        return err(libc::ENOMEM);
    }
    let socket = Socket::new(kernel_domain, Type::STREAM, Some(Protocol::TCP))?;
    let entry = Entry::new(domain, socket, Phase::Fresh, faults.eagain_storm);
    if nonblocking {
        entry.set_nonblocking(true)?;
    }
    table().insert(entry)
}

/// Rejects an address of the other family than the socket's.
fn check_family(entry: &Entry, addr: SocketAddr) -> Res<()> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if family == entry.domain {
        Ok(())
    } else {
        err(libc::EAFNOSUPPORT)
    }
}

/// `rbind`: rsocket port P binds kernel port P + offset; port 0 lets the kernel choose.
pub(crate) fn bind(rfd: c_int, addr: &[u8]) -> Res<()> {
    let entry = table().get(rfd)?;
    let raddr = addr::decode(addr)?;
    check_family(&entry, raddr)?;
    if entry.phase() != Phase::Fresh {
        return err(libc::EINVAL);
    }
    let kaddr = to_kernel(raddr, config().port_offset)?;
    entry.socket()?.bind(&SockAddr::from(kaddr))?;
    Ok(())
}

/// `rlisten`.
pub(crate) fn listen(rfd: c_int, backlog: c_int) -> Res<()> {
    let entry = table().get(rfd)?;
    if !matches!(entry.phase(), Phase::Fresh | Phase::Listening) {
        return err(libc::EINVAL);
    }
    entry.socket()?.listen(backlog)?;
    entry.set_phase(Phase::Listening);
    Ok(())
}

/// `raccept`: the new r-fd (blocking, as accepted rsockets are) and the peer's rsocket address.
pub(crate) fn accept(rfd: c_int) -> Res<(c_int, SocketAddr)> {
    let entry = table().get(rfd)?;
    if entry.phase() != Phase::Listening {
        return err(libc::EINVAL);
    }
    let listener = entry.socket()?;
    // Blocks (or EAGAIN on a non-blocking listener) with no lock held.
    let (conn, peer) = listener.accept()?;
    let peer = peer.as_socket().ok_or(Errno(libc::EAFNOSUPPORT))?;
    let accepted = Entry::new(
        entry.domain,
        conn,
        Phase::Connected,
        config().faults.eagain_storm,
    );
    let new_rfd = table().insert(accepted)?;
    stats::count_accept();
    Ok((new_rfd, to_rsocket(peer, config().port_offset)))
}

/// Moves a non-blocking connect that the kernel has completed to `Connected`; true if
/// the socket is connected.
fn settle(entry: &Entry) -> bool {
    match entry.phase() {
        Phase::Connected => true,
        Phase::Connecting => {
            let connected = entry.socket().is_ok_and(|s| s.peer_addr().is_ok());
            if connected && entry.transition(Phase::Connecting, Phase::Connected) {
                stats::count_connect();
            }
            connected
        }
        _ => false,
    }
}

/// `rconnect`. A non-blocking socket always gets `EINPROGRESS` (rdma_cm connects are
/// asynchronous); completion shows as `POLLOUT` in `rpoll` and `SO_ERROR` in `rgetsockopt`.
pub(crate) fn connect(rfd: c_int, addr: &[u8]) -> Res<()> {
    let entry = table().get(rfd)?;
    let cfg = config();
    let raddr = addr::decode(addr)?;
    check_family(&entry, raddr)?;
    match entry.phase() {
        Phase::Fresh => {}
        Phase::Connected => return err(libc::EISCONN),
        Phase::Connecting if settle(&entry) => return err(libc::EISCONN),
        Phase::Connecting | Phase::Hanging => return err(libc::EALREADY),
        Phase::Listening => return err(libc::EINVAL),
        Phase::Reset => return err(libc::ECONNRESET),
    }
    if cfg.faults.refuse {
        return err(libc::ECONNREFUSED);
    }
    if let Some(delay) = cfg.faults.slow_connect {
        thread::sleep(delay);
    }
    let nonblocking = entry.nonblocking();
    if cfg.faults.hang_connect {
        if nonblocking {
            entry.set_phase(Phase::Hanging);
            return err(libc::EINPROGRESS);
        }
        thread::sleep(cfg.hang);
        return err(libc::ETIMEDOUT);
    }
    let kaddr = to_kernel(raddr, cfg.port_offset)?;
    let socket = entry.socket()?;
    if nonblocking {
        // Before the syscall, so an rpoll in another thread already treats it as connecting.
        entry.set_phase(Phase::Connecting);
    }
    match socket.connect(&SockAddr::from(kaddr)) {
        Ok(()) => {
            if !nonblocking || entry.transition(Phase::Connecting, Phase::Connected) {
                entry.set_phase(Phase::Connected);
                stats::count_connect();
            }
            if nonblocking {
                err(libc::EINPROGRESS)
            } else {
                Ok(())
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => err(libc::EINPROGRESS),
        Err(e) => {
            entry.set_phase(Phase::Fresh);
            Err(e.into())
        }
    }
}

/// The kernel socket of a connection that may carry data, after the phase checks.
fn data_socket(entry: &Entry) -> Res<Arc<Socket>> {
    match entry.phase() {
        Phase::Connected => entry.socket(),
        // Let the kernel answer (EAGAIN while the handshake runs, or the connect error).
        Phase::Connecting => {
            settle(entry);
            entry.socket()
        }
        Phase::Hanging if entry.nonblocking() => err(libc::EAGAIN),
        Phase::Fresh | Phase::Listening | Phase::Hanging => err(libc::ENOTCONN),
        Phase::Reset => err(libc::ECONNRESET),
    }
}

/// How many more bytes the connection may carry under `reset_after`; resets it (and fails
/// with `ECONNRESET`) once the budget is spent.
fn reset_budget(entry: &Entry) -> Res<usize> {
    let Some(limit) = config().faults.reset_after else {
        return Ok(usize::MAX);
    };
    let moved = entry.moved();
    if moved >= limit {
        entry.reset();
        return err(libc::ECONNRESET);
    }
    Ok(usize::try_from(limit - moved).unwrap_or(usize::MAX))
}

/// Counts `n` bytes carried by `entry`; resets the connection when `reset_after` is reached.
fn carried(entry: &Entry, n: usize) {
    if let Some(limit) = config().faults.reset_after
        && entry.add_moved(n as u64) >= limit
    {
        entry.reset();
    }
}

/// `bufs` cut down to at most `budget` bytes in total.
fn limit_mut<'a>(
    bufs: &'a mut [&mut [MaybeUninit<u8>]],
    mut budget: usize,
) -> Vec<MaybeUninitSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for buf in bufs.iter_mut() {
        if budget == 0 {
            break;
        }
        let take = buf.len().min(budget);
        budget -= take;
        out.push(MaybeUninitSlice::new(&mut buf[..take]));
    }
    out
}

/// `bufs` cut down to at most `budget` bytes in total.
fn limit_ref<'a>(bufs: &[&'a [u8]], mut budget: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for buf in bufs {
        if budget == 0 {
            break;
        }
        let take = buf.len().min(budget);
        budget -= take;
        out.push(IoSlice::new(&buf[..take]));
    }
    out
}

/// `rrecv`/`rread`/`rreadv`/`rrecvfrom`/`rrecvmsg`: receive into `bufs` (in order).
/// Flags are honoured (`MSG_PEEK`, `MSG_DONTWAIT`, `MSG_WAITALL`), unlike librspreload's
/// `recvmsg`, which drops them.
pub(crate) fn recv(rfd: c_int, bufs: &mut [&mut [MaybeUninit<u8>]], flags: c_int) -> Res<usize> {
    let entry = table().get(rfd)?;
    let socket = data_socket(&entry)?;
    if let Some((delay, nth)) = config().faults.slow_send
        && entry.count_send() == nth
    {
        thread::sleep(delay);
    }
    if entry.take_storm() {
        return err(libc::EAGAIN);
    }
    let budget = reset_budget(&entry)?;
    let mut slices = limit_mut(bufs, budget);
    if slices.iter().all(|s| s.is_empty()) {
        return Ok(0);
    }
    let (n, _) = socket.recv_vectored_with_flags(&mut slices, flags)?;
    if flags & libc::MSG_PEEK == 0 {
        stats::count_received(n);
        carried(&entry, n);
    }
    Ok(n)
}

/// `rsend`/`rwrite`/`rwritev`/`rsendto`/`rsendmsg`: send `bufs` (in order). Never raises
/// SIGPIPE: rsockets are not kernel sockets.
pub(crate) fn send(rfd: c_int, bufs: &[&[u8]], flags: c_int) -> Res<usize> {
    let entry = table().get(rfd)?;
    let socket = data_socket(&entry)?;
    if let Some((delay, nth)) = config().faults.slow_send
        && entry.count_send() == nth
    {
        thread::sleep(delay);
    }
    if entry.take_storm() {
        return err(libc::EAGAIN);
    }
    let budget = reset_budget(&entry)?;
    let slices = limit_ref(bufs, budget);
    if slices.iter().all(|s| s.is_empty()) {
        return Ok(0);
    }
    let n = socket.send_vectored_with_flags(&slices, flags | libc::MSG_NOSIGNAL)?;
    stats::count_sent(n);
    carried(&entry, n);
    Ok(n)
}

/// `rshutdown`.
pub(crate) fn shutdown(rfd: c_int, how: c_int) -> Res<()> {
    let entry = table().get(rfd)?;
    let how = match how {
        libc::SHUT_RD => Shutdown::Read,
        libc::SHUT_WR => Shutdown::Write,
        libc::SHUT_RDWR => Shutdown::Both,
        _ => return err(libc::EINVAL),
    };
    if entry.phase() == Phase::Hanging {
        return err(libc::ENOTCONN);
    }
    entry.socket()?.shutdown(how)?;
    Ok(())
}

/// `rclose`: forgets the r-fd (the kernel socket closes once no call uses it) and writes the
/// stats file if one is configured.
pub(crate) fn close(rfd: c_int) -> Res<()> {
    let entry = table().remove(rfd)?;
    entry.wake_blocked();
    drop(entry);
    stats::persist_if_configured();
    Ok(())
}

/// `rgetsockname`, in rsocket port numbers.
pub(crate) fn sockname(rfd: c_int) -> Res<SocketAddr> {
    let entry = table().get(rfd)?;
    let local = entry.socket()?.local_addr()?;
    let local = local.as_socket().ok_or(Errno(libc::EAFNOSUPPORT))?;
    Ok(to_rsocket(local, config().port_offset))
}

/// `rgetpeername`, in rsocket port numbers.
pub(crate) fn peername(rfd: c_int) -> Res<SocketAddr> {
    let entry = table().get(rfd)?;
    if !settle(&entry) {
        return if entry.phase() == Phase::Reset {
            err(libc::ECONNRESET)
        } else {
            err(libc::ENOTCONN)
        };
    }
    let peer = entry.socket()?.peer_addr()?;
    let peer = peer.as_socket().ok_or(Errno(libc::EAFNOSUPPORT))?;
    Ok(to_rsocket(peer, config().port_offset))
}

/// Reads an `int` option value.
fn int_value(val: &[u8]) -> Res<c_int> {
    let bytes = val.get(..4).ok_or(Errno(libc::EINVAL))?;
    Ok(c_int::from_ne_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3],
    ]))
}

/// A non-negative `int` option value as a size.
fn size_value(val: &[u8]) -> Res<usize> {
    usize::try_from(int_value(val)?).map_err(|_| Errno(libc::EINVAL))
}

/// `rsetsockopt`: the options rsockets support; others fail `ENOPROTOOPT`.
pub(crate) fn setsockopt(rfd: c_int, level: c_int, name: c_int, val: &[u8]) -> Res<()> {
    let entry = table().get(rfd)?;
    if level == SOL_RDMA {
        return match name {
            RDMA_ROUTE => Ok(()),
            _ => {
                let index = usize::try_from(name).map_err(|_| Errno(libc::ENOPROTOOPT))?;
                if entry.set_rdma_opt(index, int_value(val)?) {
                    Ok(())
                } else {
                    err(libc::ENOPROTOOPT)
                }
            }
        };
    }
    let socket = entry.socket()?;
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => socket.set_send_buffer_size(size_value(val)?)?,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => socket.set_recv_buffer_size(size_value(val)?)?,
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => socket.set_reuse_address(int_value(val)? != 0)?,
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => socket.set_keepalive(int_value(val)? != 0)?,
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let on = int_value(val)? != 0;
            let secs = val.get(4..).map(int_value).transpose()?.unwrap_or(0);
            let secs = u64::try_from(secs).map_err(|_| Errno(libc::EINVAL))?;
            socket.set_linger(on.then(|| Duration::from_secs(secs)))?;
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => socket.set_tcp_nodelay(int_value(val)? != 0)?,
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => socket.set_only_v6(int_value(val)? != 0)?,
        _ => return err(libc::ENOPROTOOPT),
    }
    Ok(())
}

fn int_bytes(v: c_int) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

fn size_bytes(v: usize) -> Vec<u8> {
    int_bytes(c_int::try_from(v).unwrap_or(c_int::MAX))
}

/// `rgetsockopt`: the option's value bytes (an `int`, or a `struct linger`).
pub(crate) fn getsockopt(rfd: c_int, level: c_int, name: c_int) -> Res<Vec<u8>> {
    let entry = table().get(rfd)?;
    if level == SOL_RDMA {
        let index = usize::try_from(name).map_err(|_| Errno(libc::ENOPROTOOPT))?;
        return entry
            .rdma_opt(index)
            .map(int_bytes)
            .ok_or(Errno(libc::ENOPROTOOPT));
    }
    if (level, name) == (libc::SOL_SOCKET, libc::SO_ERROR) {
        return Ok(int_bytes(so_error(&entry)));
    }
    if (level, name) == (libc::SOL_SOCKET, libc::SO_TYPE) {
        return Ok(int_bytes(libc::SOCK_STREAM));
    }
    let socket = entry.socket()?;
    let value = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => size_bytes(socket.send_buffer_size()?),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => size_bytes(socket.recv_buffer_size()?),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => int_bytes(socket.reuse_address()?.into()),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => int_bytes(socket.keepalive()?.into()),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let linger = socket.linger()?;
            let secs = linger.map_or(0, |d| c_int::try_from(d.as_secs()).unwrap_or(c_int::MAX));
            let mut v = int_bytes(linger.is_some().into());
            v.extend_from_slice(&secs.to_ne_bytes());
            v
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => int_bytes(socket.tcp_nodelay()?.into()),
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => int_bytes(socket.only_v6()?.into()),
        _ => return err(libc::ENOPROTOOPT),
    };
    Ok(value)
}

/// `SO_ERROR`: the pending error (clearing it), and the end of a non-blocking connect.
fn so_error(entry: &Entry) -> c_int {
    let socket = match entry.socket() {
        Ok(s) => s,
        Err(Errno(e)) => return e,
    };
    match socket.take_error() {
        Ok(Some(e)) => {
            let code = e.raw_os_error().unwrap_or(libc::EIO);
            // A failed connect leaves the socket unconnected.
            entry.transition(Phase::Connecting, Phase::Fresh);
            code
        }
        Ok(None) => {
            settle(entry);
            0
        }
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// `rfcntl`: `F_GETFL` and `F_SETFL` (`O_NONBLOCK`) only, like rsockets.
pub(crate) fn fcntl(rfd: c_int, cmd: c_int, arg: c_int) -> Res<c_int> {
    let entry = table().get(rfd)?;
    match cmd {
        libc::F_GETFL => Ok(libc::O_RDWR
            | if entry.nonblocking() {
                libc::O_NONBLOCK
            } else {
                0
            }),
        libc::F_SETFL => {
            entry.set_nonblocking(arg & libc::O_NONBLOCK != 0)?;
            Ok(0)
        }
        _ => err(libc::ENOTSUP),
    }
}
