//! The syscalls on raw fd numbers the shim's logic needs, each behind a safe function: the
//! core's only `unsafe` code (its FFI edge; the hooks' C boundary is in the cdylib).

// `unsafe` here: errno access, write(2), fcntl/dup3/socketpair/shutdown/setsockopt
// on the app's fd numbers, getsockname/getpeername into local buffers, reading a caller's
// `struct sockaddr`, the coarse wall clock, and registering exit/fork callbacks.
#![allow(unsafe_code)]

pub use rdma_streams_transport::rdma::SIOCATMARK;
use std::mem::{MaybeUninit, size_of};
use std::net::SocketAddr;

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use libc::{c_int, c_long, sockaddr, sockaddr_storage, socklen_t};
use rdma_streams_transport::sockaddr::{RawSockAddr, from_bytes};

pub mod fdpass;

/// `fcntl(F_SETOWN_EX)`, which sets a socket's owner as `F_SETOWN` does (Linux's value; the
/// `libc` crate has none for glibc).
pub const F_SETOWN_EX: c_int = 15;
/// `ioctl(FIOSETOWN)`: sets the owner.
pub const FIOSETOWN: libc::c_ulong = 0x8901;
/// `ioctl(SIOCSPGRP)`: sets the owner.
pub const SIOCSPGRP: libc::c_ulong = 0x8902;

/// This thread's errno.
#[inline]
pub fn errno() -> c_int {
    // SAFETY: __errno_location always returns this thread's valid errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno.
#[inline]
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Writes `bytes` to fd 2 with write(2) (not hooked, no allocation, no lock), retrying on
/// EINTR and short writes; errors are ignored (there is nowhere to report them).
pub fn write_stderr(mut bytes: &[u8]) {
    let saved = errno();
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe the live slice `bytes`.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(n) {
            Ok(0) => break,
            Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
            Err(_) if errno() == libc::EINTR => {}
            Err(_) => break,
        }
    }
    set_errno(saved);
}

/// Reads an INET socket address from a caller's buffer; None for other families, a null
/// pointer or a short length (the transport's [`from_bytes`]).
///
/// # Safety
/// `addr`, if not null, must point to at least `len` readable bytes.
pub unsafe fn sockaddr_from_raw(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // No INET address is longer than a sockaddr_storage: never look further.
    let len = usize::try_from(len)
        .ok()?
        .min(size_of::<sockaddr_storage>());
    // SAFETY: `len` bytes are readable (the caller's contract, clamped above); bytes need no
    // alignment, and they are only read while the caller's call lasts.
    let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) };
    from_bytes(bytes).ok()
}

type NameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;

fn sock_name(fd: c_int, f: NameFn) -> Option<SocketAddr> {
    let mut raw = RawSockAddr::empty();
    let mut len = raw.capacity();
    // SAFETY: `raw` holds `len` writable bytes, aligned like a sockaddr_storage; the call
    // writes at most that many.
    let rc = unsafe { f(fd, raw.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return None;
    }
    // Clamped to the buffer: a longer (truncated) address is never read past it.
    raw.set_len(len);
    raw.to_addr().ok()
}

/// The socket's local address (getsockname; one syscall).
pub fn local_addr(fd: c_int) -> Option<SocketAddr> {
    sock_name(fd, libc::getsockname)
}

/// The socket's peer address (getpeername; one syscall).
pub fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    sock_name(fd, libc::getpeername)
}

/// Registers `f` to run at `exit()`; false if registration failed.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function of this never-unloaded library.
    unsafe { libc::atexit(f) == 0 }
}

/// Registers `f` to run in the child after `fork()`; false if registration failed.
pub fn at_fork_child(f: unsafe extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function of this never-unloaded library; no prepare/parent hooks.
    unsafe { libc::pthread_atfork(None, None, Some(f)) == 0 }
}

fn last_error() -> std::io::Error {
    std::io::Error::from_raw_os_error(errno())
}

/// The fd's status flags (F_GETFL) and descriptor flags (F_GETFD).
pub fn fd_flags(fd: c_int) -> std::io::Result<(c_int, c_int)> {
    // SAFETY: fcntl with F_GETFL/F_GETFD takes no pointer argument.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(last_error());
    }
    // SAFETY: as above.
    let fdfl = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if fdfl < 0 {
        return Err(last_error());
    }
    Ok((fl, fdfl))
}

/// The `SOL_SOCKET` options of a TCP socket that its app can read back, and that a socketpair
/// end takes with the same meaning: what [`copy_socket_state`] carries over.
const CARRIED_OPTIONS: [c_int; 7] = [
    libc::SO_RCVTIMEO,
    libc::SO_SNDTIMEO,
    libc::SO_LINGER,
    libc::SO_KEEPALIVE,
    libc::SO_OOBINLINE,
    libc::SO_RCVLOWAT,
    libc::SO_PRIORITY,
];

/// Gives `to` (the app's new socketpair end) what the app set on the TCP socket `from` that
/// the app can read back from its fd: the `SOL_SOCKET` options above (an accepted socket
/// inherits them from its listener), the `F_SETOWN` owner and `O_ASYNC` (from `from`'s status
/// flags `fl`). `untouched`: the app set none of the options nor the owner
/// ([`crate::fdtable::has_defaults`]), so none is read back. Best effort: an option the
/// socketpair refuses keeps its default.
pub fn copy_socket_state(from: c_int, to: BorrowedFd<'_>, fl: c_int, untouched: bool) {
    let to = to.as_raw_fd();
    if !untouched {
        for name in CARRIED_OPTIONS {
            // Both ends start with the kernel's defaults (`sock_init_data`, for either
            // family): only what differs from them is set (a system call per option saved).
            copy_option_unless(from, to, name, fresh_value);
        }
        // SAFETY: F_GETOWN takes no argument.
        let owner = unsafe { libc::fcntl(from, libc::F_GETOWN) };
        if owner != 0 && owner != -1 {
            // SAFETY: F_SETOWN takes an int argument.
            unsafe { libc::fcntl(to, libc::F_SETOWN, owner) };
        }
    }
    if fl & libc::O_ASYNC != 0 {
        // SAFETY: fcntl with F_GETFL/F_SETFL takes an int argument at most.
        unsafe {
            let cur = libc::fcntl(to, libc::F_GETFL);
            if cur >= 0 {
                libc::fcntl(to, libc::F_SETFL, cur | libc::O_ASYNC);
            }
        }
    }
}

/// Whether `value` is what a fresh socket of either family answers for the carried option
/// `name` (`sock_init_data`: no timeouts, no lingering, keep-alive and inline urgent data
/// off, priority 0, a low-water mark of 1 byte).
fn fresh_value(name: c_int, value: &[u8]) -> bool {
    let one = 1i32.to_ne_bytes();
    match name {
        libc::SO_RCVLOWAT => value == one,
        _ => value.iter().all(|&b| b == 0),
    }
}

/// Gives socket `to` the value of `SOL_SOCKET` option `name` of socket `from` (best effort:
/// an option `to` refuses keeps its value).
pub fn copy_option(from: c_int, to: c_int, name: c_int) {
    copy_option_unless(from, to, name, |_, _| false);
}

/// The value of `SOL_SOCKET` option `name` of socket `fd` (at most 16 bytes: the carried
/// options' sizes) and its length; None when it cannot be read.
fn option_bytes(fd: c_int, name: c_int) -> Option<([u8; 16], socklen_t)> {
    let mut value = [0u8; 16];
    let mut len = value.len() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, which holds that many.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            value.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((value, len.min(value.len() as socklen_t)))
}

/// [`copy_option`], except for a value `skip(name, value)` says `to` has already.
fn copy_option_unless(from: c_int, to: c_int, name: c_int, skip: fn(c_int, &[u8]) -> bool) {
    let Some((value, len)) = option_bytes(from, name) else {
        return;
    };
    if !skip(name, &value[..len as usize]) {
        // SAFETY: `value` holds the `len` bytes getsockopt wrote.
        unsafe {
            libc::setsockopt(to, libc::SOL_SOCKET, name, value.as_ptr().cast(), len);
        }
    }
}

/// An int-valued `SOL_SOCKET` option of socket `fd`; None when it cannot be read.
pub fn int_option(fd: c_int, name: c_int) -> Option<c_int> {
    int_option_at(fd, libc::SOL_SOCKET, name)
}

/// `SO_RCVLOWAT` of socket `fd` (1 when it cannot be read).
pub fn rcvlowat(fd: c_int) -> usize {
    int_option(fd, libc::SO_RCVLOWAT)
        .and_then(|v| usize::try_from(v).ok())
        .map_or(1, |v| v.max(1))
}

/// `FIONREAD` of the app's end `fd` of an upgraded stream, answered as TCP's `SIOCINQ` when an
/// urgent byte is pending and not read inline: the bytes before the mark (TCP counts only
/// those; an `AF_UNIX` socket counts all it holds). None otherwise: the kernel's answer is
/// TCP's.
pub fn readable_before_mark(fd: c_int) -> Option<c_int> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one pollfd, which `p` is, for the call; no wait.
    if unsafe { libc::poll(&mut p, 1, 0) } != 1 || p.revents & libc::POLLPRI == 0 {
        return None;
    }
    if int_option(fd, libc::SO_OOBINLINE) != Some(0) {
        return None;
    }
    if rdma_streams_transport::rdma::at_mark(fd).unwrap_or(false) {
        return Some(0);
    }
    // A look at what the queue holds stops at the mark (`AF_UNIX` ends a read there).
    let mut queued: c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points at `queued`.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } < 0 {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(queued).ok()?];
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    c_int::try_from(n).ok().filter(|n| *n >= 0)
}

/// Waits until stream socket `fd` is hung up both ways (`POLLHUP`: the engine ended the app's
/// side), at most `bound`.
pub fn wait_hangup(fd: c_int, bound: std::time::Duration) {
    // With no event asked, poll reports only a hang-up, an error or a closed fd.
    poll_within(fd, 0, bound);
}

/// `fd`'s ready events among `events` (and its errors and hang-ups), waiting at most `bound`
/// for one (a signal does not cut the wait short); 0 when none came by then, `POLLNVAL` when
/// poll itself failed.
pub fn poll_within(fd: c_int, events: i16, bound: std::time::Duration) -> i16 {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Rounded up, so a wait never ends before the bound.
        let ms = c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX);
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one pollfd, which `p` is, for the call.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            n if n > 0 => return p.revents,
            0 if left.is_zero() || std::time::Instant::now() >= deadline => return 0,
            0 => {}
            _ if errno() == libc::EINTR => {}
            _ => return libc::POLLNVAL,
        }
    }
}

/// `fd`'s ready events among `events` (and its errors and hang-ups) now, without waiting.
pub fn poll_now(fd: c_int, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, which `p` is, for the call.
    if unsafe { libc::poll(&mut p, 1, 0) } < 0 {
        return 0;
    }
    p.revents
}

/// Blocks until `fd` may be written (`POLLOUT`, or an error or hang-up the next send reports);
/// `EINTR` when a signal came first, as a blocking send reports it.
pub fn wait_writable(fd: c_int) -> std::io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd, which `p` is, for the call.
    if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// True when a send on the socket `fd` may block without bound: no `O_NONBLOCK`, and no send
/// timeout (`SO_SNDTIMEO`). False on any error.
pub fn send_blocks(fd: c_int) -> bool {
    // SAFETY: fcntl with F_GETFL takes no pointer argument.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 || fl & libc::O_NONBLOCK != 0 {
        return false;
    }
    let mut tv = MaybeUninit::<libc::timeval>::zeroed();
    let mut len = size_of::<libc::timeval>() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `tv`, which holds that many.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            tv.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return false;
    }
    // SAFETY: zero-initialised, and getsockopt filled it on success.
    let tv = unsafe { tv.assume_init() };
    tv.tv_sec == 0 && tv.tv_usec == 0
}

/// The wall clock in nanoseconds since the epoch, at the kernel's tick resolution
/// (`CLOCK_REALTIME_COARSE`, which the vDSO answers without a system call even where the clock
/// source cannot be read from user space); 0 if it cannot be read.
pub fn coarse_wall_clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the pointer, which points at `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Adds O_NONBLOCK to the fd's status flags.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl with F_GETFL/F_SETFL takes an int argument at most.
    let fl = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if fl < 0 {
        return Err(last_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// A new fd number (close-on-exec) for the open file description behind `fd`.
pub fn dup_cloexec(fd: c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes an int argument and returns a new fd we then own.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(last_error());
    }
    // SAFETY: `n` is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// A fresh non-blocking, close-on-exec eventfd.
pub fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with constant arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to the eventfd `fd` (it becomes readable).
pub fn eventfd_signal(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of `one` to an eventfd.
    let _ = unsafe { libc::write(fd, (&raw const one).cast(), size_of::<u64>()) };
}

/// Resets the eventfd `fd` to 0 (not readable), without blocking.
pub fn eventfd_drain(fd: c_int) {
    let mut count: u64 = 0;
    // SAFETY: reads at most 8 bytes into `count`, which holds that many.
    let _ = unsafe { libc::read(fd, (&raw mut count).cast(), size_of::<u64>()) };
}

/// Whether `SO_REUSEPORT` is on for socket `fd`.
pub fn reuse_port(fd: c_int) -> bool {
    int_option(fd, libc::SO_REUSEPORT).is_some_and(|on| on != 0)
}

/// Whether zero-copy sends are on for socket `fd` (`SO_ZEROCOPY`): its `MSG_ZEROCOPY` sends
/// then wait for completions on the socket's error queue, which a socketpair never gives.
pub fn zero_copy(fd: c_int) -> bool {
    int_option(fd, libc::SO_ZEROCOPY).is_some_and(|on| on != 0)
}

/// Whether `fd` is an `AF_UNIX` `SOCK_STREAM` socket (what a socketpair end handed over with
/// `SCM_RIGHTS` is).
pub fn is_unix_stream(fd: c_int) -> bool {
    int_option(fd, libc::SO_DOMAIN) == Some(libc::AF_UNIX)
        && int_option(fd, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
}

/// Whether `fd` is a TCP socket (`SO_PROTOCOL`).
pub fn is_tcp(fd: c_int) -> bool {
    let mut value: c_int = 0;
    let mut len = socklen_t::try_from(size_of::<c_int>()).unwrap_or(0);
    // SAFETY: getsockopt writes at most `len` bytes into `value`, which holds that many.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PROTOCOL,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    rc == 0 && value == libc::IPPROTO_TCP
}

/// The lowest number the shim's own per-connection fds take (kept TCP sockets, the engine's
/// socketpair ends, the claim channel): half the soft `RLIMIT_NOFILE`, between 64 and 32768
/// (below the fd table's end), so the numbers an app gets are the ones it would get without
/// the shim (wrk sizes its event loop for `10 + 3 x connections` fds; `select` stops at
/// 1024). Read once.
pub fn high_floor() -> c_int {
    static FLOOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    let known = FLOOR.load(std::sync::atomic::Ordering::Relaxed);
    if known > 0 {
        return known;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into `lim`.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    let floor = c_int::try_from((soft / 2).clamp(64, 32_768)).unwrap_or(64);
    FLOOR.store(floor, std::sync::atomic::Ordering::Relaxed);
    floor
}

/// A close-on-exec duplicate of `fd` above the app's numbers ([`move_high`] of a duplicate,
/// in one call); anywhere when no number up there is free.
pub fn dup_high(fd: c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes an int argument and returns a new fd we then own.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, high_floor()) };
    if n < 0 {
        return dup_cloexec(fd);
    }
    // SAFETY: `n` is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// `fd` moved to the lowest free number at or above [`high_floor`] (close-on-exec), the old
/// number closed; `fd` itself when no number up there is free.
pub fn move_high(fd: OwnedFd) -> OwnedFd {
    if fd.as_raw_fd() >= high_floor() {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC takes an int argument and returns a new fd we then own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, high_floor()) };
    if n < 0 {
        return fd;
    }
    drop(fd);
    // SAFETY: `n` is a fresh fd owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(n) }
}

/// A connected `AF_UNIX` stream socket pair, both ends close-on-exec.
pub fn socketpair_stream() -> std::io::Result<(OwnedFd, OwnedFd)> {
    socketpair(libc::SOCK_STREAM)
}

/// A connected `AF_UNIX` pair of socket type `ty`, both ends close-on-exec.
fn socketpair(ty: c_int) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: `fds` has room for the two fds socketpair writes.
    let rc =
        unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
    if rc != 0 {
        return Err(last_error());
    }
    // SAFETY: both are fresh fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What names an open file: its device and inode (`fstat`, which the shim does not hook).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The file's inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }
}

/// Whether `fd` is in `set` (False for an fd `select` cannot name).
pub fn fd_isset(fd: c_int, set: &libc::fd_set) -> bool {
    // SAFETY: FD_ISSET reads one bit of `set`, a live fd_set, for an fd below FD_SETSIZE.
    (0..libc::FD_SETSIZE as c_int).contains(&fd) && unsafe { libc::FD_ISSET(fd, set) }
}

/// Puts `fd` in `set` (nothing for an fd `select` cannot name).
pub fn fd_set_add(fd: c_int, set: &mut libc::fd_set) {
    if (0..libc::FD_SETSIZE as c_int).contains(&fd) {
        // SAFETY: FD_SET writes one bit of `set`, a live fd_set, for an fd below FD_SETSIZE.
        unsafe { libc::FD_SET(fd, set) }
    }
}

/// The [`FileId`] of the file `fd` names now; None when `fd` is not open.
pub fn file_id(fd: c_int) -> Option<FileId> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes one `struct stat` into `st`, which holds one.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Closes `fd` with the system call itself (not the hooked `close`).
pub fn close_raw(fd: c_int) {
    // SAFETY: plain integer arguments; `fd` is one this module opened.
    let _ = unsafe { libc::syscall(libc::SYS_close, c_long::from(fd)) };
}

/// Queues one byte from the app's end of a socketpair, `app` (an app fd number that named
/// `end` when the socketpair was made), into the other end's receive queue, so that the other
/// end's close gives `app`'s end `ECONNRESET` (an `AF_UNIX` end closed with unread bytes sets it
/// on its peer). True when the other end holds a byte now (sent, or its queue was full).
///
/// The number is the app's and may name another file by now (closed, or replaced by a `dup2`
/// in another thread): the byte goes through a copy of it, taken atomically and checked to be
/// `end` first, so it can never reach another connection. Every call here is the system call
/// itself, not a hook.
pub fn queue_reset_byte(app: c_int, end: FileId) -> bool {
    if file_id(app) != Some(end) {
        return false;
    }
    // SAFETY: plain integer arguments; the result, when not negative, is a new fd we own.
    let copy = unsafe {
        libc::syscall(
            libc::SYS_fcntl,
            c_long::from(app),
            c_long::from(libc::F_DUPFD_CLOEXEC),
            0 as c_long,
        )
    };
    let Ok(copy) = c_int::try_from(copy) else {
        return false;
    };
    if copy < 0 {
        return false;
    }
    let mut queued = false;
    if file_id(copy) == Some(end) {
        let byte = [0u8; 1];
        // SAFETY: `byte` is readable for its length; the kernel copies it. No address.
        let n = unsafe {
            libc::syscall(
                libc::SYS_sendto,
                c_long::from(copy),
                byte.as_ptr(),
                byte.len(),
                c_long::from(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL),
                std::ptr::null::<sockaddr>(),
                0 as c_long,
            )
        };
        queued = n == 1 || (n < 0 && errno() == libc::EAGAIN);
    }
    close_raw(copy);
    queued
}

/// Takes the pending error of socket `fd` (`SO_ERROR`, read with the system call itself, not
/// the hooked `getsockopt`): 0 when none.
pub fn take_socket_error(fd: c_int) -> c_int {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, which holds that many.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            c_long::from(fd),
            c_long::from(libc::SOL_SOCKET),
            c_long::from(libc::SO_ERROR),
            (&raw mut value).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 { value } else { 0 }
}

/// Raises `SIGPIPE` in the calling thread, as the kernel does for a send on a stream socket
/// that may no longer send (it directs the signal at the sending thread).
pub fn raise_sigpipe() {
    // SAFETY: pthread_kill of this thread's own id with a valid signal number.
    let _ = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}

/// `call`'s result, with the `SIGPIPE` its `EPIPE` raised in this thread taken back: for the
/// calls that cannot be asked for `MSG_NOSIGNAL` (`sendfile`, `splice`) into an upgraded fd,
/// whose hook then decides, as for a send, whether TCP would have raised it
/// ([`raise_sigpipe`]). `SIGPIPE` is blocked for the call (the kernel directs it at the calling
/// thread, so no other thread can take it) and, when the call failed with `EPIPE` and no
/// `SIGPIPE` was pending before, the one it raised is accepted with `sigtimedwait`; the thread's
/// mask and errno are as the call left them.
pub fn without_sigpipe(call: impl FnOnce() -> isize) -> isize {
    let mut pipe = MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = MaybeUninit::<libc::sigset_t>::uninit();
    let mut pending = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: each pointer is to a local sigset_t; sigemptyset initialises `pipe`, and
    // pthread_sigmask fills `old` before it is read (it cannot fail with these arguments).
    let (pipe, old) = unsafe {
        libc::sigemptyset(pipe.as_mut_ptr());
        libc::sigaddset(pipe.as_mut_ptr(), libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, pipe.as_ptr(), old.as_mut_ptr());
        (pipe.assume_init(), old.assume_init())
    };
    // SAFETY: sigpending fills the local `pending`; it cannot fail with a valid pointer.
    let was_pending = unsafe {
        libc::sigpending(pending.as_mut_ptr());
        libc::sigismember(pending.as_ptr(), libc::SIGPIPE) == 1
    };
    let n = call();
    let e = errno();
    if n < 0 && e == libc::EPIPE && !was_pending {
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `pipe` and `now` are initialised locals; no siginfo is asked for. A zero
        // timeout only takes a signal already pending.
        while unsafe { libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now) } < 0
            && errno() == libc::EINTR
        {}
    }
    // SAFETY: `old` is the mask pthread_sigmask returned above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    set_errno(e);
    n
}

/// Closes the socketpair ends fork gave this child of the engine's process
/// ([`fdtable::pair_ends`]): the engine that used them is not in the child, and a copy left
/// open would keep an end the engine closes from closing (its app's side would never hang up).
pub fn close_inherited_pair_ends() {
    for fd in crate::fdtable::pair_ends() {
        crate::fdtable::clear(fd);
        close_raw(fd);
    }
}

/// `dup3(src, dst, flags)`: `dst` now names `src`'s open file description (atomically
/// replacing whatever `dst` named).
pub fn dup3(src: BorrowedFd<'_>, dst: c_int, cloexec: bool) -> std::io::Result<()> {
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    loop {
        // SAFETY: plain integer arguments; `dst` is the caller's fd being replaced on purpose.
        let rc = unsafe { libc::dup3(src.as_raw_fd(), dst, flags) };
        if rc >= 0 {
            return Ok(());
        }
        if errno() != libc::EINTR && errno() != libc::EBUSY {
            return Err(last_error());
        }
    }
}

/// Removes `fd`'s registration from the epoll instance `epfd` (the system call itself: the
/// hooked `epoll_ctl` would note it). False when there was none (or `epfd` is no epoll fd).
pub fn epoll_del(epfd: c_int, fd: c_int) -> bool {
    // SAFETY: plain integer arguments; DEL reads no event.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_epoll_ctl,
            c_long::from(epfd),
            c_long::from(libc::EPOLL_CTL_DEL),
            c_long::from(fd),
            std::ptr::null::<libc::epoll_event>(),
        )
    };
    rc == 0
}

/// Registers `fd` with the epoll instance `epfd` for `events`, reporting `data` (the system
/// call itself, as [`epoll_del`]).
pub fn epoll_add(epfd: c_int, fd: c_int, events: u32, data: u64) -> std::io::Result<()> {
    let mut event = libc::epoll_event { events, u64: data };
    // SAFETY: `event` is a live local epoll_event the kernel reads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_epoll_ctl,
            c_long::from(epfd),
            c_long::from(libc::EPOLL_CTL_ADD),
            c_long::from(fd),
            &raw mut event,
        )
    };
    if rc == 0 { Ok(()) } else { Err(last_error()) }
}

/// Test helper: a new, unconnected IPv4 TCP socket (blocking).
#[cfg(test)]
pub fn tcp_socket_for_test() -> OwnedFd {
    // SAFETY: no pointer arguments; the result, when not negative, is a new fd we own.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket");
    // SAFETY: `fd` is fresh and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Test helper: `connect(fd, addr)`, as a hook's original: (result, errno).
#[cfg(test)]
pub fn connect_for_test(fd: c_int, addr: SocketAddr) -> (c_int, c_int) {
    let raw = RawSockAddr::from_addr(addr);
    // SAFETY: `raw` holds a whole sockaddr_in or sockaddr_in6 of `socklen()` bytes.
    let rc = unsafe { libc::connect(fd, raw.as_ptr(), raw.socklen()) };
    (rc, if rc == 0 { 0 } else { errno() })
}

/// Test helper: sets the `SOL_SOCKET` int option `name` of `fd` to `value`.
#[cfg(test)]
pub fn set_int_option_for_test(fd: c_int, name: c_int, value: c_int) {
    let len = socklen_t::try_from(size_of::<c_int>()).unwrap_or(0);
    // SAFETY: setsockopt reads `len` bytes from `value`, which holds that many.
    let rc =
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, name, (&raw const value).cast(), len) };
    assert_eq!(
        rc,
        0,
        "setsockopt {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// Test helper: a new epoll fd (close it with [`close_raw_for_test`]).
#[cfg(test)]
pub fn test_epoll() -> c_int {
    // SAFETY: no pointer arguments.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1");
    ep
}

/// Test helper: one event of `ep` within 100 ms (its events and data), or None.
#[cfg(test)]
pub fn test_epoll_wait(ep: c_int) -> Option<(u32, u64)> {
    let mut event = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: room for one event in the live local `event`.
    let n = unsafe { libc::epoll_wait(ep, &raw mut event, 1, 100) };
    (n == 1).then_some((event.events, event.u64))
}

/// Test helper: closes `fd` with the system call.
#[cfg(test)]
pub fn close_raw_for_test(fd: c_int) {
    close_raw(fd);
}

/// Sends all of `bytes` on the connected socket `fd` at once, never blocking and never raising
/// SIGPIPE (`MSG_DONTWAIT | MSG_NOSIGNAL`): a few bytes on a connection whose send buffer is
/// empty. Part of them sent, or none, is an error.
#[cfg(test)]
pub fn send_all_now_for_test(fd: c_int, bytes: &[u8]) -> std::io::Result<()> {
    loop {
        // SAFETY: `bytes` is readable for its length; the kernel copies it.
        let n = unsafe {
            libc::send(
                fd,
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(std::io::Error::other(format!(
                    "sent {n} of {} bytes",
                    bytes.len()
                )));
            }
            Err(_) if errno() == libc::EINTR => {}
            Err(_) => return Err(last_error()),
        }
    }
}

/// Moves what can be read now from `from` (non-blocking) to `to`, waiting at most `bound` in
/// all for `to` to take it; the bytes moved, or the first error of `to`.
pub fn forward_unread(
    from: c_int,
    to: c_int,
    bound: std::time::Duration,
) -> std::io::Result<usize> {
    let until = std::time::Instant::now() + bound;
    let mut buf = [0u8; 16 * 1024];
    let mut moved = 0;
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(from, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        let Ok(n) = usize::try_from(n) else {
            if errno() == libc::EINTR {
                continue;
            }
            return Ok(moved);
        };
        if n == 0 {
            return Ok(moved);
        }
        let mut sent = 0;
        while sent < n {
            // SAFETY: `buf[sent..n]` is readable; the kernel copies it.
            let m = unsafe {
                libc::send(
                    to,
                    buf[sent..].as_ptr().cast(),
                    n - sent,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            match usize::try_from(m) {
                Ok(m) => sent += m,
                Err(_) if errno() == libc::EINTR => {}
                Err(_) if errno() == libc::EAGAIN => {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() || poll_within(to, libc::POLLOUT, left) & libc::POLLOUT == 0 {
                        return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
                    }
                }
                Err(_) => return Err(last_error()),
            }
        }
        moved += n;
    }
}

/// `shutdown(fd, SHUT_RDWR)`, errors ignored.
pub fn shutdown_both(fd: c_int) {
    // SAFETY: plain integer arguments.
    let _ = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// SO_LINGER {on, 0}: the next close sends an RST. Errors ignored.
pub fn set_linger_zero(fd: BorrowedFd<'_>) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = socklen_t::try_from(size_of::<libc::linger>()).unwrap_or(0);
    // SAFETY: `l` is a whole `linger` of `len` bytes.
    let _ = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(l).cast(),
            len,
        )
    };
}

/// Runs `f` with every blockable signal blocked in this thread, then restores its mask, so
/// that the threads `f` starts inherit a full mask: the app's process-directed signals are
/// never handled on the shim's threads. (A handler that runs on another thread does not end
/// the main thread's `sigsuspend`: nginx's master waits there for `SIGCHLD` and `SIGQUIT`,
/// and missed its last worker's exit.) A signal that comes meanwhile waits until the mask is
/// restored.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let mut all = MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all` before pthread_sigmask reads it; pthread_sigmask
    // fills `old` when it succeeds, and `old` is read only then.
    let blocked = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), old.as_mut_ptr()) == 0
    };
    let out = f();
    if blocked {
        // SAFETY: `old` was filled by the successful call above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    }
    out
}

/// A new TCP socket of the shim's own (close-on-exec, blocking), IPv6 when `v6`.
pub fn tcp_socket(v6: bool) -> std::io::Result<OwnedFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: no pointer arguments; the result, when not negative, is a new fd we own.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An int-valued option of socket `fd` at `level`; None when it cannot be read.
fn int_option_at(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, which holds that many.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len) };
    (rc == 0).then_some(value)
}

/// The path MTU the kernel knows for `peer` (the route's MTU until a smaller one was learnt),
/// from an unsent UDP connect in `peer`'s family (no packet leaves).
pub fn path_mtu(peer: SocketAddr) -> Option<u32> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = std::net::UdpSocket::bind(any).ok()?;
    probe.connect(peer).ok()?;
    let (level, name) = match peer {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU),
    };
    int_option_at(probe.as_raw_fd(), level, name).and_then(|m| u32::try_from(m).ok())
}

/// `TCP_MAXSEG` of TCP socket `fd`: before its connect, the MSS it will offer (536 when the
/// app set none).
pub fn tcp_maxseg(fd: c_int) -> Option<c_int> {
    int_option_at(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG)
}

/// Sets `TCP_MAXSEG` of TCP socket `fd` (before its connect: the MSS its SYN offers; 0: none
/// of the app's own).
pub fn set_tcp_maxseg(fd: c_int, mss: c_int) -> std::io::Result<()> {
    set_int_option_at(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, mss)
}

/// Sets an int-valued option of socket `fd` at `level`.
fn set_int_option_at(fd: c_int, level: c_int, name: c_int, value: c_int) -> std::io::Result<()> {
    // SAFETY: `value` is a live int of the length passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<c_int>() as socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(last_error()) }
}

/// The MSS the peer of connected TCP socket `fd` offered in its SYN, as far as the connection
/// shows it: its send MSS plus the timestamp option's 12 bytes when timestamps are on (equal
/// to the offer when this side's own path allows as much).
pub fn tcp_peer_mss(fd: c_int) -> Option<u32> {
    /// `struct tcp_info` up to `tcpi_snd_mss`: 8 bytes of `u8` fields (`tcpi_options` the
    /// sixth), `tcpi_rto`, `tcpi_ato`, then `tcpi_snd_mss`.
    const SND_MSS: usize = 16;
    const OPTIONS: usize = 5;
    const TCPI_OPT_TIMESTAMPS: u8 = 1;
    let mut info = [0u8; SND_MSS + 4];
    let mut len = info.len() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which holds that many.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 || (len as usize) < info.len() {
        return None;
    }
    let snd_mss = u32::from_ne_bytes(info[SND_MSS..SND_MSS + 4].try_into().ok()?);
    let timestamps = info[OPTIONS] & TCPI_OPT_TIMESTAMPS != 0;
    Some(snd_mss + if timestamps { 12 } else { 0 })
}

/// `SO_REUSEADDR` of socket `fd`; None when it cannot be read.
pub fn reuse_addr(fd: c_int) -> Option<bool> {
    int_option(fd, libc::SO_REUSEADDR).map(|v| v != 0)
}

/// Sets `SO_REUSEADDR` of socket `fd`.
pub fn set_reuse_addr(fd: c_int, on: bool) -> std::io::Result<()> {
    set_int_option_at(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, c_int::from(on))
}

/// Binds `fd` to `addr` (the real bind; bind is not hooked).
pub fn bind(fd: c_int, addr: SocketAddr) -> std::io::Result<()> {
    let raw = RawSockAddr::from_addr(addr);
    // SAFETY: `raw` holds a whole sockaddr_in or sockaddr_in6 of `socklen()` bytes.
    let rc = unsafe { libc::bind(fd, raw.as_ptr(), raw.socklen()) };
    if rc != 0 {
        return Err(last_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    use libc::{sockaddr_in, sockaddr_in6};

    use super::*;

    /// The defaults [`copy_socket_state`] does not set are what fresh sockets of both kinds
    /// answer, and what an app set is carried.
    #[test]
    fn fresh_sockets_answer_the_defaults_and_set_options_are_carried() {
        let read = |fd: c_int, name: c_int| {
            let (value, len) = option_bytes(fd, name).expect("getsockopt");
            value[..len as usize].to_vec()
        };
        let tcp = tcp_socket(false).unwrap();
        let tcp6 = tcp_socket(true).unwrap();
        let (end, _other) = socketpair_stream().unwrap();
        for fd in [tcp.as_raw_fd(), tcp6.as_raw_fd(), end.as_raw_fd()] {
            for name in CARRIED_OPTIONS {
                assert!(fresh_value(name, &read(fd, name)), "fd {fd}, option {name}");
            }
        }
        let on = 1i32;
        let low = 7i32;
        // SAFETY: int-valued options, with their size.
        unsafe {
            for (name, value) in [(libc::SO_KEEPALIVE, &on), (libc::SO_RCVLOWAT, &low)] {
                let p: *const i32 = value;
                libc::setsockopt(tcp.as_raw_fd(), libc::SOL_SOCKET, name, p.cast(), 4);
            }
        }
        copy_socket_state(tcp.as_raw_fd(), std::os::fd::AsFd::as_fd(&end), 0, false);
        assert_eq!(int_option(end.as_raw_fd(), libc::SO_KEEPALIVE), Some(1));
        assert_eq!(int_option(end.as_raw_fd(), libc::SO_RCVLOWAT), Some(7));
        assert_eq!(int_option(end.as_raw_fd(), libc::SO_OOBINLINE), Some(0));
    }

    #[test]
    fn threads_started_with_signals_blocked_take_no_signal_and_the_mask_comes_back() {
        let mask = || {
            let mut now = MaybeUninit::<libc::sigset_t>::uninit();
            // SAFETY: a null new set only reads the mask into `now`.
            unsafe {
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), now.as_mut_ptr());
                now.assume_init()
            }
        };
        // SAFETY: `set` is a live sigset_t.
        let has = |set: &libc::sigset_t, sig| unsafe { libc::sigismember(set, sig) == 1 };
        let before = mask();
        let theirs = with_signals_blocked(|| std::thread::spawn(mask).join().unwrap());
        for sig in [
            libc::SIGTERM,
            libc::SIGQUIT,
            libc::SIGCHLD,
            libc::SIGINT,
            libc::SIGHUP,
        ] {
            assert!(has(&theirs, sig), "signal {sig} reaches the thread");
            assert_eq!(
                has(&mask(), sig),
                has(&before, sig),
                "signal {sig}: mask restored"
            );
        }
    }

    #[test]
    fn sockaddr_parsing() {
        let sin = sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 5201u16.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(Ipv4Addr::new(198, 18, 0, 2)).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = socklen_t::try_from(size_of::<sockaddr_in>()).unwrap_or(0);
        let p = std::ptr::addr_of!(sin).cast::<sockaddr>();
        // SAFETY: `p` points to a whole sockaddr_in of `len` bytes.
        let a = unsafe { sockaddr_from_raw(p, len) };
        assert_eq!(a, Some("198.18.0.2:5201".parse().unwrap()));
        // SAFETY: fewer bytes than the pointer holds.
        let short = unsafe { sockaddr_from_raw(p, len - 1) };
        assert_eq!(short, None, "short length");
        // SAFETY: a null pointer is accepted.
        assert_eq!(unsafe { sockaddr_from_raw(std::ptr::null(), len) }, None);
        let un = libc::sockaddr_un {
            sun_family: libc::AF_UNIX as libc::sa_family_t,
            sun_path: [0; 108],
        };
        let ulen = socklen_t::try_from(size_of::<libc::sockaddr_un>()).unwrap_or(0);
        // SAFETY: points to a whole sockaddr_un of `ulen` bytes.
        let u = unsafe { sockaddr_from_raw(std::ptr::addr_of!(un).cast(), ulen) };
        assert_eq!(u, None, "not INET");

        for ip in [
            "fe80::1".parse::<Ipv6Addr>().unwrap(),
            Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped(),
        ] {
            let sin6 = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: 443u16.to_be(),
                sin6_flowinfo: 7,
                sin6_addr: libc::in6_addr {
                    s6_addr: ip.octets(),
                },
                sin6_scope_id: 2,
            };
            let len = socklen_t::try_from(size_of::<sockaddr_in6>()).unwrap_or(0);
            let p = std::ptr::addr_of!(sin6).cast::<sockaddr>();
            // SAFETY: `p` points to a whole sockaddr_in6 of `len` bytes.
            let a = unsafe { sockaddr_from_raw(p, len) };
            assert_eq!(a, Some(SocketAddr::V6(SocketAddrV6::new(ip, 443, 7, 2))));
            // SAFETY: fewer bytes than the pointer holds.
            let short = unsafe { sockaddr_from_raw(p, len - 1) };
            assert_eq!(short, None, "short length");
        }
    }

    #[test]
    fn sock_names_of_a_tcp_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(local_addr(listener.as_raw_fd()), listener.local_addr().ok());
        assert_eq!(peer_addr(client.as_raw_fd()), client.peer_addr().ok());
        assert_eq!(local_addr(-1), None);
    }

    /// In a forked child with `SIGPIPE` at its default (death), a write of one byte into a
    /// socketpair end whose other end is closed, by `write` wrapped as `wrap` says. The exit
    /// code: 0, or 128 + 13 when the `SIGPIPE` killed the child.
    fn write_to_a_closed_pair(wrap: fn(&dyn Fn() -> isize) -> isize, check: fn(isize)) -> i32 {
        let child = fork_for_test(move || {
            let mut ends = [0; 2];
            // SAFETY: the child's own calls: default SIGPIPE, a socketpair into `ends`, the
            // peer end closed, one byte written from a live local.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                assert_eq!(
                    libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, ends.as_mut_ptr()),
                    0
                );
                libc::close(ends[1]);
            }
            let byte = [1u8];
            // SAFETY: `byte` is readable for its length.
            let n = wrap(&|| unsafe { libc::write(ends[0], byte.as_ptr().cast(), 1) });
            check(n);
        });
        wait_for_test(child)
    }

    fn blocked_sigpipe() -> bool {
        let mut now = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: a null new mask only reads the thread's mask into `now`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), now.as_mut_ptr());
            libc::sigismember(now.as_ptr(), libc::SIGPIPE) == 1
        }
    }

    #[test]
    fn without_sigpipe_takes_back_the_signal_of_an_epipe() {
        let plain = write_to_a_closed_pair(|write| write(), |_| {});
        assert_eq!(plain, 128 + libc::SIGPIPE, "the write alone raises SIGPIPE");
        let quiet = write_to_a_closed_pair(
            |write| without_sigpipe(write),
            |n| {
                assert_eq!(
                    (n, errno()),
                    (-1, libc::EPIPE),
                    "the call's result and errno"
                );
                assert!(!blocked_sigpipe(), "the thread's mask is as it was");
            },
        );
        assert_eq!(quiet, 0, "no SIGPIPE reached the thread");
    }

    #[test]
    fn without_sigpipe_leaves_a_pending_sigpipe_pending() {
        // A SIGPIPE the app blocked and had pending before the call is the app's: it stays.
        let pending = write_to_a_closed_pair(
            |write| {
                let mut pipe = MaybeUninit::<libc::sigset_t>::uninit();
                // SAFETY: a local set with SIGPIPE, blocked for this thread, then raised at it.
                unsafe {
                    libc::sigemptyset(pipe.as_mut_ptr());
                    libc::sigaddset(pipe.as_mut_ptr(), libc::SIGPIPE);
                    libc::pthread_sigmask(libc::SIG_BLOCK, pipe.as_ptr(), std::ptr::null_mut());
                    libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE);
                }
                without_sigpipe(write)
            },
            |n| {
                assert_eq!(n, -1);
                assert!(blocked_sigpipe(), "the app's block stays");
                let mut pipe = MaybeUninit::<libc::sigset_t>::uninit();
                // SAFETY: unblocking SIGPIPE delivers the pending one: the child dies of it.
                unsafe {
                    libc::sigemptyset(pipe.as_mut_ptr());
                    libc::sigaddset(pipe.as_mut_ptr(), libc::SIGPIPE);
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, pipe.as_ptr(), std::ptr::null_mut());
                }
            },
        );
        assert_eq!(
            pending,
            128 + libc::SIGPIPE,
            "the app's pending SIGPIPE was kept"
        );
    }
}

/// What a bounded wait for a non-blocking connect's TCP handshake saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Established {
    /// Writable with no error or hang-up: the handshake completed.
    Yes,
    /// Error or hang-up: the connect failed (the error stays pending for the app's SO_ERROR).
    Failed,
    /// Neither within the bound.
    Pending,
}

/// Waits (real `poll`, at most `timeout`) for a connecting TCP socket to become writable.
/// Does not read `SO_ERROR`, so a failure is still reported to the app.
pub fn wait_established(fd: c_int, timeout: std::time::Duration) -> Established {
    let revents = poll_within(fd, libc::POLLOUT, timeout);
    if revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
        Established::Failed
    } else if revents & libc::POLLOUT != 0 {
        Established::Yes
    } else {
        Established::Pending
    }
}

/// The `IPV6_V6ONLY` setting of a socket (None: not IPv6, or unreadable).
pub fn only_v6(fd: c_int) -> Option<bool> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for getsockopt to write an int option into.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    (rc == 0).then_some(v != 0)
}

/// Test helper: forks; the child runs `child` with a 5 s `alarm` (a hang dies by SIGALRM) and
/// exits 0, or 101 if `child` panicked. Returns the child's pid.
#[cfg(test)]
pub fn fork_for_test(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child only runs `child` (the shim's own code under test) and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain calls in the single-threaded child.
        unsafe { libc::alarm(5) };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).is_ok();
        // SAFETY: ends the child at once, without the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 101 }) }
    }
    pid
}

/// Test helper: SIGKILL to our child `pid`.
#[cfg(test)]
pub fn kill_for_test(pid: libc::pid_t) {
    // SAFETY: kill(2) of a child of ours.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Test helper: the exit code of `pid`, or 128 + the signal that killed it.
#[cfg(test)]
pub fn wait_for_test(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer; `pid` is our child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid");
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}
