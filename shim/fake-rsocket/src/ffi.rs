//! The exported C ABI: librdmacm's rsocket functions, plus `fake_rsocket_stats_json`.
//!
//! This is the crate's only `unsafe` code (hence the module-level `allow`, overriding the
//! workspace's `unsafe_code = "deny"`): exporting unmangled C functions, turning the caller's
//! raw pointers into slices and writing results back through them, setting `errno`, calling
//! `poll(2)`/`atexit(3)`. Each function checks its pointers, hands slices to the safe
//! `ops` / `poll` code, and maps `Err(errno)` to `-1` + `errno`.
//!
//! No panic crosses the boundary: every export runs inside `guard`, which turns a panic
//! into `-1` with `errno = EIO`.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_long, c_ulong, c_void};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::panic::{self, AssertUnwindSafe};
use std::slice;
use std::sync::Once;

use libc::{
    c_int, c_short, fd_set, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t,
    timeval,
};

use crate::addr;
use crate::errno::{Errno, Res, err};
use crate::ops;
use crate::poll;
use crate::stats;

/// The largest `iovcnt` accepted (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;
/// The largest `nfds` accepted by `rpoll`.
const MAX_POLL_FDS: usize = 1 << 20;

/// A C return type with a failure value (`-1`).
trait FfiReturn: Copy {
    const FAILED: Self;
}

impl FfiReturn for c_int {
    const FAILED: c_int = -1;
}

impl FfiReturn for isize {
    const FAILED: isize = -1;
}

/// Runs the body of an export: `Ok(v)` returns `v`; `Err(errno)` and panics return `-1` with
/// `errno` set (`EIO` for a panic).
fn guard<T: FfiReturn>(body: impl FnOnce() -> Res<T>) -> T {
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(Errno(code))) => {
            set_errno(code);
            T::FAILED
        }
        Err(_) => {
            set_errno(libc::EIO);
            T::FAILED
        }
    }
}

fn set_errno(code: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = code }
}

/// `poll(2)` on kernel fds, for [`poll::rpoll`].
fn kernel_poll(fds: &mut [pollfd], timeout: c_int) -> Res<usize> {
    let nfds = nfds_t::try_from(fds.len()).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `nfds` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    usize::try_from(n).map_err(|_| Errno::from(std::io::Error::last_os_error()))
}

/// Registers the exit hook that writes the stats file, once, if a stats dir is configured.
fn ensure_exit_hook() {
    static HOOK: Once = Once::new();
    if !stats::configured() {
        return;
    }
    HOOK.call_once(|| {
        // SAFETY: `write_stats_at_exit` is a plain `extern "C" fn()` that never unwinds.
        // Registration can only fail for lack of memory; the rclose-time writes still happen.
        let _ = unsafe { libc::atexit(write_stats_at_exit) };
    });
}

extern "C" fn write_stats_at_exit() {
    let _ = panic::catch_unwind(stats::persist_if_configured);
}

/// The caller's `len` bytes at `ptr` as a slice.
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes for `'a` (or `len` must be 0).
unsafe fn in_bytes<'a>(ptr: *const c_void, len: usize) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: non-null, and the caller guarantees `len` readable bytes.
    Ok(unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// The caller's `len` writable (possibly uninitialised) bytes at `ptr` as a slice.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes for `'a`, not aliased (or `len` must be 0).
unsafe fn out_bytes<'a>(ptr: *mut c_void, len: usize) -> Res<&'a mut [MaybeUninit<u8>]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: non-null, and the caller guarantees `len` writable, unaliased bytes.
    Ok(unsafe { slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), len) })
}

/// Copies `value` to `*val` (truncated to `*len`), then stores its full length in `*len`, the
/// way `getsockopt`/`getsockname` report results.
///
/// # Safety
/// `len` must be null or valid for reads and writes; `val` must be null or valid for writes of
/// `*len` bytes.
unsafe fn write_out(val: *mut c_void, len: *mut socklen_t, value: &[u8]) -> Res<()> {
    if len.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: `len` is non-null and valid per the caller's contract.
    let room = unsafe { *len } as usize;
    // SAFETY: `val` has `room` writable bytes per the caller's contract.
    let out = unsafe { out_bytes(val, room.min(value.len())) }?;
    for (dst, src) in out.iter_mut().zip(value) {
        dst.write(*src);
    }
    let full = socklen_t::try_from(value.len()).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: as above.
    unsafe { *len = full };
    Ok(())
}

/// Writes a socket address the `accept`/`getsockname` way; a null `addr` skips it.
///
/// # Safety
/// As [`write_out`].
unsafe fn write_addr(addr: *mut sockaddr, len: *mut socklen_t, sa: SocketAddr) -> Res<()> {
    if addr.is_null() {
        return Ok(());
    }
    let (bytes, n) = addr::encode(sa);
    // SAFETY: forwarded caller contract.
    unsafe { write_out(addr.cast(), len, &bytes[..n]) }
}

/// The caller's iovec array as writable slices.
///
/// # Safety
/// `iov` must point to `count` iovecs, each valid for writes of `iov_len` bytes, for `'a`.
unsafe fn iov_out<'a>(iov: *const iovec, count: usize) -> Res<Vec<&'a mut [MaybeUninit<u8>]>> {
    if count > IOV_MAX {
        return err(libc::EINVAL);
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    if iov.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: `iov` is non-null and points to `count` iovecs per the caller's contract.
    let vecs = unsafe { slice::from_raw_parts(iov, count) };
    vecs.iter()
        // SAFETY: each iovec describes `iov_len` writable bytes per the caller's contract.
        .map(|v| unsafe { out_bytes(v.iov_base, v.iov_len) })
        .collect()
}

/// The caller's iovec array as readable slices.
///
/// # Safety
/// `iov` must point to `count` iovecs, each valid for reads of `iov_len` bytes, for `'a`.
unsafe fn iov_in<'a>(iov: *const iovec, count: usize) -> Res<Vec<&'a [u8]>> {
    if count > IOV_MAX {
        return err(libc::EINVAL);
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    if iov.is_null() {
        return err(libc::EFAULT);
    }
    // SAFETY: `iov` is non-null and points to `count` iovecs per the caller's contract.
    let vecs = unsafe { slice::from_raw_parts(iov, count) };
    vecs.iter()
        // SAFETY: each iovec describes `iov_len` readable bytes per the caller's contract.
        .map(|v| unsafe { in_bytes(v.iov_base, v.iov_len) })
        .collect()
}

fn iov_count(count: c_int) -> Res<usize> {
    usize::try_from(count).map_err(|_| Errno(libc::EINVAL))
}

fn ssize(n: usize) -> Res<ssize_t> {
    ssize_t::try_from(n).map_err(|_| Errno(libc::EOVERFLOW))
}

/// Creates an rsocket: only `AF_INET`/`AF_INET6` (`EAFNOSUPPORT`) `SOCK_STREAM` with protocol
/// 0 or `IPPROTO_TCP` (`EPROTONOSUPPORT`). Faults `nodev`/`enomem` fail it.
///
/// # Safety
/// None beyond the C ABI; no pointers are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard(|| {
        ensure_exit_hook();
        ops::socket(domain, ty, protocol)
    })
}

/// Binds an rsocket; port P binds kernel port P + offset.
///
/// # Safety
/// `addr` must be valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `len` readable bytes at `addr`.
        let bytes = unsafe { in_bytes(addr.cast(), len as usize) }?;
        ops::bind(s, bytes).map(|()| 0)
    })
}

/// Listens on an rsocket.
///
/// # Safety
/// None beyond the C ABI; no pointers are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rlisten(s: c_int, backlog: c_int) -> c_int {
    guard(|| ops::listen(s, backlog).map(|()| 0))
}

/// Accepts a connection; the new rsocket is blocking.
///
/// # Safety
/// `addr` must be null, or valid for writes of `*len` bytes with `len` valid for reads and
/// writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn raccept(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    guard(|| {
        ensure_exit_hook();
        if !addr.is_null() && len.is_null() {
            return err(libc::EFAULT);
        }
        let (new_fd, peer) = ops::accept(s)?;
        // SAFETY: forwarded caller contract.
        if let Err(e) = unsafe { write_addr(addr, len, peer) } {
            let _ = ops::close(new_fd);
            return Err(e);
        }
        Ok(new_fd)
    })
}

/// Connects an rsocket (faults `refuse`, `slow_connect`, `hang_connect` apply).
///
/// # Safety
/// `addr` must be valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `len` readable bytes at `addr`.
        let bytes = unsafe { in_bytes(addr.cast(), len as usize) }?;
        ops::connect(s, bytes).map(|()| 0)
    })
}

/// Shuts down one or both directions.
///
/// # Safety
/// None beyond the C ABI; no pointers are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rshutdown(s: c_int, how: c_int) -> c_int {
    guard(|| ops::shutdown(s, how).map(|()| 0))
}

/// Closes an rsocket (and writes the stats file when configured).
///
/// # Safety
/// None beyond the C ABI; no pointers are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rclose(s: c_int) -> c_int {
    guard(|| ops::close(s).map(|()| 0))
}

/// Receives into one buffer.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecv(s: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    guard(|| {
        // SAFETY: the caller guarantees `len` writable bytes at `buf`.
        let out = unsafe { out_bytes(buf, len) }?;
        ssize(ops::recv(s, &mut [out], flags)?)
    })
}

/// Receives into one buffer and reports the peer's address (stream sockets: `rgetpeername`).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes; `src`/`src_len` as for `raccept`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    src_len: *mut socklen_t,
) -> ssize_t {
    guard(|| {
        if !src.is_null() && src_len.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: the caller guarantees `len` writable bytes at `buf`.
        let out = unsafe { out_bytes(buf, len) }?;
        let n = ops::recv(s, &mut [out], flags)?;
        if let Ok(peer) = ops::peername(s) {
            // SAFETY: forwarded caller contract.
            unsafe { write_addr(src, src_len, peer) }?;
        }
        ssize(n)
    })
}

/// Receives into the message's iovecs, honouring `flags` (librspreload drops them).
/// Ancillary data is not supported (`ENOTSUP`), as in rsockets.
///
/// # Safety
/// `msg` must point to a valid `msghdr` whose iovecs are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvmsg(s: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    guard(|| {
        if msg.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: non-null and valid per the caller's contract.
        let hdr = unsafe { &mut *msg };
        if !hdr.msg_control.is_null() && hdr.msg_controllen > 0 {
            return err(libc::ENOTSUP);
        }
        // SAFETY: the header's iovecs are writable per the caller's contract.
        let mut bufs = unsafe { iov_out(hdr.msg_iov, hdr.msg_iovlen) }?;
        let n = ops::recv(s, &mut bufs, flags)?;
        // A connected stream socket reports no source address and no flags.
        hdr.msg_namelen = 0;
        hdr.msg_flags = 0;
        ssize(n)
    })
}

/// Sends one buffer.
///
/// # Safety
/// `buf` must be valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsend(s: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    guard(|| {
        // SAFETY: the caller guarantees `len` readable bytes at `buf`.
        let data = unsafe { in_bytes(buf, len) }?;
        ssize(ops::send(s, &[data], flags)?)
    })
}

/// Sends one buffer; a destination address on a stream socket is `EISCONN`, as in rsockets.
///
/// # Safety
/// `buf` must be valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendto(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dst: *const sockaddr,
    dst_len: socklen_t,
) -> ssize_t {
    guard(|| {
        if !dst.is_null() || dst_len != 0 {
            return err(libc::EISCONN);
        }
        // SAFETY: the caller guarantees `len` readable bytes at `buf`.
        let data = unsafe { in_bytes(buf, len) }?;
        ssize(ops::send(s, &[data], flags)?)
    })
}

/// Sends the message's iovecs. Ancillary data is not supported (`ENOTSUP`), as in rsockets.
///
/// # Safety
/// `msg` must point to a valid `msghdr` whose iovecs are readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendmsg(s: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    guard(|| {
        if msg.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: non-null and valid per the caller's contract.
        let hdr = unsafe { &*msg };
        if !hdr.msg_control.is_null() && hdr.msg_controllen > 0 {
            return err(libc::ENOTSUP);
        }
        // SAFETY: the header's iovecs are readable per the caller's contract.
        let bufs = unsafe { iov_in(hdr.msg_iov, hdr.msg_iovlen) }?;
        ssize(ops::send(s, &bufs, flags)?)
    })
}

/// `rrecv` with no flags.
///
/// # Safety
/// `buf` must be valid for writes of `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rread(s: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: same contract as rrecv.
    unsafe { rrecv(s, buf, count, 0) }
}

/// `rsend` with no flags.
///
/// # Safety
/// `buf` must be valid for reads of `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwrite(s: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: same contract as rsend.
    unsafe { rsend(s, buf, count, 0) }
}

/// Receives into `iovcnt` buffers.
///
/// # Safety
/// `iov` must point to `iovcnt` iovecs describing writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rreadv(s: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    guard(|| {
        // SAFETY: forwarded caller contract.
        let mut bufs = unsafe { iov_out(iov, iov_count(iovcnt)?) }?;
        ssize(ops::recv(s, &mut bufs, 0)?)
    })
}

/// Sends `iovcnt` buffers.
///
/// # Safety
/// `iov` must point to `iovcnt` iovecs describing readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwritev(s: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    guard(|| {
        // SAFETY: forwarded caller contract.
        let bufs = unsafe { iov_in(iov, iov_count(iovcnt)?) }?;
        ssize(ops::send(s, &bufs, 0)?)
    })
}

/// Polls a mix of rsockets and ordinary fds (`poll_never_wakes` applies to rsockets).
///
/// # Safety
/// `fds` must point to `nfds` valid, writable `pollfd` structs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    guard(|| {
        let count = usize::try_from(nfds)
            .ok()
            .filter(|&n| n <= MAX_POLL_FDS)
            .ok_or(Errno(libc::EINVAL))?;
        let fds: &mut [pollfd] = if count == 0 {
            &mut []
        } else if fds.is_null() {
            return err(libc::EFAULT);
        } else {
            // SAFETY: non-null, `count` writable pollfds per the caller's contract.
            unsafe { slice::from_raw_parts_mut(fds, count) }
        };
        let ready = poll::rpoll(fds, timeout, kernel_poll)?;
        c_int::try_from(ready).map_err(|_| Errno(libc::EOVERFLOW))
    })
}

/// The largest `nfds` accepted by `rselect`: room for r-fds plus a million more.
const MAX_SELECT_FDS: usize = crate::FIRST_RFD as usize + (1 << 20);
/// Bits per `fd_set` word.
const WORD_BITS: usize = c_ulong::BITS as usize;

/// A copy of the caller's fd bitmap of `words` words (`fd_set` is an array of
/// `unsigned long`); None for a null set. Copies, rather than borrows, so that a caller passing
/// the same set twice does not create aliasing mutable slices.
///
/// # Safety
/// `set` must be null or valid for reads of `words` `c_ulong`s.
unsafe fn read_bits(set: *const fd_set, words: usize) -> Option<Vec<c_ulong>> {
    if set.is_null() {
        return None;
    }
    // SAFETY: non-null and valid for `words` words per the caller's contract; fd_set is a
    // repr(C) array of c_ulong, so its start is suitably aligned.
    Some(unsafe { slice::from_raw_parts(set.cast::<c_ulong>(), words) }.to_vec())
}

/// Copies `bits` back into the caller's bitmap.
///
/// # Safety
/// `set` must be non-null and valid for writes of `bits.len()` `c_ulong`s.
unsafe fn write_bits(set: *mut fd_set, bits: &[c_ulong]) {
    // SAFETY: per the caller's contract; the source is our own buffer, so no overlap.
    unsafe { std::ptr::copy_nonoverlapping(bits.as_ptr(), set.cast::<c_ulong>(), bits.len()) }
}

/// `select` through the `rpoll` machinery, over ordinary fds and r-fds alike.
///
/// r-fds are numbered from 1,000,000, far beyond `FD_SETSIZE` (1024), so watching one takes
/// what `select(2)` itself allows for large `nfds`: bitmaps the caller allocated with room for
/// `nfds` bits (`(nfds + 63) / 64` words), not a plain `fd_set`. With a plain `fd_set`, keep
/// `nfds <= FD_SETSIZE`, i.e. ordinary fds only, and use `rpoll` for rsockets.
///
/// # Safety
/// Each set must be null or valid for reads and writes of `nfds` bits (rounded up to whole
/// `unsigned long` words); `timeout` null or a valid `timeval`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut fd_set,
    writefds: *mut fd_set,
    exceptfds: *mut fd_set,
    timeout: *mut timeval,
) -> c_int {
    guard(|| {
        let limit = usize::try_from(nfds)
            .ok()
            .filter(|&n| n <= MAX_SELECT_FDS)
            .ok_or(Errno(libc::EINVAL))?;
        let timeout_ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: non-null and valid per the caller's contract.
            timeval_ms(unsafe { *timeout })?
        };
        let words = limit.div_ceil(WORD_BITS);
        let pointers = [readfds, writefds, exceptfds];
        let flags = [libc::POLLIN, libc::POLLOUT, libc::POLLPRI];
        // SAFETY: each non-null set holds `nfds` bits per the caller's contract.
        let mut sets = pointers.map(|set| unsafe { read_bits(set, words) });
        let mut wanted: BTreeMap<c_int, c_short> = BTreeMap::new();
        for (bits, flag) in sets.iter().zip(flags) {
            let Some(bits) = bits else { continue };
            for (w, &word) in bits.iter().enumerate().filter(|(_, w)| **w != 0) {
                for bit in (0..WORD_BITS).filter(|b| word & (1 << b) != 0) {
                    let fd = w * WORD_BITS + bit;
                    if fd >= limit {
                        break;
                    }
                    let fd = c_int::try_from(fd).map_err(|_| Errno(libc::EINVAL))?;
                    *wanted.entry(fd).or_default() |= flag;
                }
            }
        }
        let mut fds: Vec<pollfd> = wanted
            .into_iter()
            .map(|(fd, events)| pollfd {
                fd,
                events,
                revents: 0,
            })
            .collect();
        poll::rpoll(&mut fds, timeout_ms, kernel_poll)?;
        if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
            return err(libc::EBADF);
        }
        for bits in sets.iter_mut().flatten() {
            bits.fill(0);
        }
        let mut count: c_int = 0;
        for p in &fds {
            let (read, write, except) = poll::select_ready(p.events, p.revents);
            let index = usize::try_from(p.fd).unwrap_or(0);
            for (bits, hit) in sets.iter_mut().zip([read, write, except]) {
                if let (Some(bits), true) = (bits, hit) {
                    bits[index / WORD_BITS] |= 1 << (index % WORD_BITS);
                    count += 1;
                }
            }
        }
        for (set, bits) in pointers.into_iter().zip(&sets) {
            if let Some(bits) = bits {
                // SAFETY: `bits` came from this non-null set, `words` long.
                unsafe { write_bits(set, bits) };
            }
        }
        Ok(count)
    })
}

/// A `select` timeout in poll milliseconds, rounded up.
fn timeval_ms(tv: timeval) -> Res<c_int> {
    if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
        return err(libc::EINVAL);
    }
    // time_t and suseconds_t are both 64-bit on the 64-bit Linux targets.
    let ms = tv
        .tv_sec
        .saturating_mul(1000)
        .saturating_add((tv.tv_usec + 999) / 1000);
    Ok(c_int::try_from(ms).unwrap_or(c_int::MAX))
}

/// The peer's address, in rsocket port numbers.
///
/// # Safety
/// `addr` must be valid for writes of `*len` bytes; `len` valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetpeername(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    guard(|| {
        let peer = ops::peername(s)?;
        if addr.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: forwarded caller contract.
        unsafe { write_addr(addr, len, peer) }.map(|()| 0)
    })
}

/// The local address, in rsocket port numbers.
///
/// # Safety
/// `addr` must be valid for writes of `*len` bytes; `len` valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockname(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    guard(|| {
        let local = ops::sockname(s)?;
        if addr.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: forwarded caller contract.
        unsafe { write_addr(addr, len, local) }.map(|()| 0)
    })
}

/// Sets an option: `SOL_RDMA` (0x10000) sizes, `SO_SNDBUF`/`SO_RCVBUF`/`SO_REUSEADDR`/
/// `SO_KEEPALIVE`/`SO_LINGER`, `TCP_NODELAY`, `IPV6_V6ONLY`; others `ENOPROTOOPT`.
///
/// # Safety
/// `val` must be valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `len` readable bytes at `val`.
        let bytes = unsafe { in_bytes(val, len as usize) }?;
        ops::setsockopt(s, level, name, bytes).map(|()| 0)
    })
}

/// Reads an option (the `rsetsockopt` set, plus `SO_ERROR` and `SO_TYPE`).
///
/// # Safety
/// `val` must be valid for writes of `*len` bytes; `len` valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    guard(|| {
        let value = ops::getsockopt(s, level, name)?;
        // SAFETY: forwarded caller contract.
        unsafe { write_out(val, len, &value) }.map(|()| 0)
    })
}

/// `F_GETFL` / `F_SETFL` (`O_NONBLOCK`) on an rsocket; other commands `ENOTSUP`.
///
/// C declares `int rfcntl(int socket, int cmd, ... /* arg */)`. Defining a C-variadic
/// function needs nightly Rust, so the optional argument is declared as a `c_long`. That is
/// ABI-compatible for these commands on the two Linux targets we build:
/// - x86_64 SysV: variadic integer arguments travel in the same registers as named ones
///   (here `rdx`); the caller's `al` vector-register count is simply ignored by a
///   non-variadic callee.
/// - aarch64 Linux (AAPCS64; not Apple's variant, which puts variadics on the stack): variadic
///   arguments are assigned like named ones, so the third argument is in `x2`.
///
/// A C caller passes `F_SETFL`'s flags as an `int`, so only the low 32 bits of the register
/// are defined: the value is truncated to `c_int` before use. `F_GETFL` passes nothing and
/// the register's content is ignored.
///
/// # Safety
/// None beyond the C ABI; no pointers are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rfcntl(s: c_int, cmd: c_int, arg: c_long) -> c_int {
    // Truncation intended: see above.
    let flags = arg as c_int;
    guard(|| ops::fcntl(s, cmd, flags))
}

/// Writes this process's counters as JSON (`{"connects":..,"accepts":..,"bytes_sent":..,
/// "bytes_received":..}`) into `buf`, like `snprintf`: at most `len - 1` bytes plus a NUL.
/// Returns the JSON's full length (a result `>= len` means it was truncated), or -1 with
/// `EFAULT` for a null `buf` with a non-zero `len`.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_rsocket_stats_json(buf: *mut c_char, len: usize) -> isize {
    guard(|| {
        let json = stats::json();
        // SAFETY: the caller guarantees `len` writable bytes at `buf`.
        let out = unsafe { out_bytes(buf.cast(), len) }?;
        if let Some((nul, body)) = out.split_last_mut() {
            let n = body.len().min(json.len());
            for (dst, src) in body.iter_mut().zip(&json.as_bytes()[..n]) {
                dst.write(*src);
            }
            // With room to spare the NUL goes right after the JSON, otherwise in the last byte.
            match body.get_mut(n) {
                Some(slot) => {
                    slot.write(0);
                }
                None => {
                    nul.write(0);
                }
            }
        }
        isize::try_from(json.len()).map_err(|_| Errno(libc::EOVERFLOW))
    })
}

/// Lowest number [`high_fd`] moves a file to.
const HIGH_FD: c_int = 512;

/// The same open file on a number at or above [`HIGH_FD`] (the low one closed), or the file
/// as it was if that is not possible (a low RLIMIT_NOFILE).
pub(crate) fn high_fd(file: std::fs::File) -> std::fs::File {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: F_DUPFD_CLOEXEC on an open fd of ours; the result, when valid, is a new fd that
    // nothing else owns.
    let high = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, HIGH_FD) };
    if high < 0 {
        return file;
    }
    // SAFETY: `high` was just created and is owned by nobody else.
    unsafe { std::fs::File::from_raw_fd(high) }
}

/// Closes `file` ignoring errors (a number the program closed under us is not a reason to
/// abort it).
pub(crate) fn close_quietly(file: std::fs::File) {
    use std::os::fd::IntoRawFd;
    let fd = file.into_raw_fd();
    // SAFETY: `fd` was ours; the result does not matter.
    unsafe {
        libc::close(fd);
    }
}
