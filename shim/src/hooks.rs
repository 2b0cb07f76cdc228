//! The exported `unsafe extern "C"` detours, the ELF constructor/destructor, and the exit and
//! fork callbacks: the shim's whole C boundary.
//!
//! Every detour is a few lines: convert the C arguments, then run the safe op of
//! `streamshim_core::ops` in one of two ways, both written once in `streamshim_core::guard`:
//! [`detour`] when the op calls the original (exactly once on every path: nested, panicked
//! before or after; errno is the original's on return), [`guarded`] when the shim may answer
//! instead of the original (a direct read or write: None sends the caller to the original),
//! and [`read_detour`] for a plain read, which does one or both.
//! Which way a data call goes is `streamshim_core::calls`'s to say, from its flags.
//!
//! getpeername/getsockname/getsockopt/setsockopt answer from the kept TCP socket for upgraded
//! fds (one atomic load otherwise); dup/dup2/dup3/fcntl(F_DUPFD*) copies keep what the shim
//! knows of the fd; epoll_ctl notes the registrations of sockets not connected yet (the swap
//! moves them); writev/sendmmsg/sendfile/splice into an upgraded fd answer a reset as TCP's.
//! A new detour needs a `real.rs` entry, an op, a line in `streamshim.map` and the `HOOKS`
//! list of the tests.

// `unsafe` here: `#[unsafe(no_mangle)]` exports, `.init_array`/`.fini_array` entries, calls of
// the original libc functions through raw pointers, and reading the caller's address buffers.
#![allow(unsafe_code)]

use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};

use std::ffi::c_void;

use libc::{c_int, sockaddr, socklen_t};

use crate::real;
use streamshim_core::calls::{self, Recv};
use streamshim_core::guard::{Guard, detour, guarded, read_detour};
use streamshim_core::{direct, fdtable, ops, sys};

/// The result of a hook whose original cannot be found (never seen with glibc).
fn no_original() -> c_int {
    sys::set_errno(libc::ENOSYS);
    -1
}

/// Registers the exit and fork-child callbacks, once per process (called at the decision).
fn register_callbacks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    let _ = sys::at_exit(on_exit);
    let _ = sys::at_fork_child(on_fork_child);
}

/// `int socket(int domain, int type, int protocol)`.
///
/// # Safety
/// The C contract of `socket(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let Some(orig) = real::socket() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's socket.
    let real = || unsafe { orig(domain, ty, protocol) };
    if Guard::enter().is_none() {
        // The shim's own socket (provider probe, provider internals): the shim's.
        let fd = real();
        fdtable::set(fd, fdtable::SHIM_OWNED);
        return fd;
    }
    detour(&real, |real| {
        ops::socket(domain, ty, protocol, &register_callbacks, real)
    })
}

/// `int connect(int fd, const struct sockaddr *addr, socklen_t len)`.
///
/// # Safety
/// The C contract of `connect(2)`: `addr` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(orig) = real::connect() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's connect.
    let real = || unsafe { orig(fd, addr, len) };
    detour(&real, |_| {
        // SAFETY: per the caller's contract, `addr` holds `len` readable bytes.
        let peer = unsafe { sys::sockaddr_from_raw(addr, len) };
        // The shim may connect another number for the same socket (its kept copy).
        ops::connect(fd, peer, &mut |target| {
            // SAFETY: as above; `target` names the app's socket (the fd or a copy of it).
            let rc = unsafe { orig(target, addr, len) };
            (rc, sys::errno())
        })
    })
}

/// `int listen(int fd, int backlog)`.
///
/// # Safety
/// The C contract of `listen(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(orig) = real::listen() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's listen.
    let real = || unsafe { orig(fd, backlog) };
    detour(&real, |real| ops::listen(fd, real))
}

/// The peer address an accept call wrote into the caller's buffer, if it asked for one.
///
/// # Safety
/// `addr`/`len` are the caller's accept arguments after a successful call; `cap` is `*len`
/// before it.
unsafe fn accepted_peer(
    addr: *mut sockaddr,
    len: *mut socklen_t,
    cap: socklen_t,
) -> Option<std::net::SocketAddr> {
    if addr.is_null() || len.is_null() {
        return None;
    }
    // SAFETY: `len` is the caller's valid length pointer (non-null, checked).
    let written = unsafe { len.read() };
    // SAFETY: the kernel wrote min(cap, written) bytes of the address into `addr`.
    unsafe { sys::sockaddr_from_raw(addr, written.min(cap)) }
}

/// The body of both accept hooks: `real` is the original call with the caller's arguments.
///
/// # Safety
/// `addr`/`len` are the caller's accept arguments (the C contract of `accept(2)`).
unsafe fn accept_detour(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    real: &dyn Fn() -> c_int,
) -> c_int {
    if Guard::enter().is_none() {
        // The provider accepting for the shim: the fd is the shim's.
        let fd = real();
        fdtable::set(fd, fdtable::SHIM_OWNED);
        return fd;
    }
    let cap = if len.is_null() {
        0
    } else {
        // SAFETY: `len`, when non-null, is the caller's valid in/out length.
        unsafe { len.read() }
    };
    detour(real, |real| {
        ops::accept(fd, &mut || {
            let rc = real();
            let errno = sys::errno();
            // SAFETY: after the call, per accept's contract.
            let peer = (rc >= 0).then(|| unsafe { accepted_peer(addr, len, cap) });
            sys::set_errno(errno);
            (rc, peer.flatten())
        })
    })
}

/// `int accept(int fd, struct sockaddr *addr, socklen_t *len)`.
///
/// # Safety
/// The C contract of `accept(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(orig) = real::accept() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's accept.
    let real = || unsafe { orig(fd, addr, len) };
    // SAFETY: the caller's accept arguments.
    unsafe { accept_detour(fd, addr, len, &real) }
}

/// `int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)`.
///
/// # Safety
/// The C contract of `accept4(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(orig) = real::accept4() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's accept4.
    let real = || unsafe { orig(fd, addr, len, flags) };
    // SAFETY: the caller's accept4 arguments.
    unsafe { accept_detour(fd, addr, len, &real) }
}

/// A direct read of an upgraded fd ([`ops::read_direct`]), [`guarded`]: Some(n) when the
/// stream's ring gave `n` bytes; None: the caller calls the original. Any other fd costs one
/// atomic load.
fn read_direct(fd: c_int, buf: *mut c_void, len: usize) -> Option<isize> {
    if buf.is_null() || len == 0 || fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return None;
    }
    // SAFETY: read(2)'s contract: `buf` holds `len` writable bytes for the call, and no other
    // reference to them exists while the slice lives (it ends with this call).
    let buf = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let n = guarded(|| ops::read_direct(fd, buf)).flatten()?;
    isize::try_from(n).ok()
}

/// `read`/`recv` of an upgraded fd without flags that change what it returns: a direct read
/// when the ring holds bytes and the socketpair none; else `orig` (the original on a part of
/// the buffer) as a waiting reader and the ring's bytes after what it returned
/// ([`ops::read_or_wait`]). None: the caller calls the original. Any other fd costs one atomic
/// load.
fn read_upgraded(
    fd: c_int,
    (buf, len): (*mut c_void, usize),
    orig: &mut dyn FnMut(*mut c_void, usize) -> isize,
) -> Option<isize> {
    if buf.is_null() || len == 0 || fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return None;
    }
    // SAFETY: read(2)'s contract: `buf` holds `len` writable bytes for the call, and no other
    // reference to them exists while the slice lives (it ends with this call); `orig` only
    // ever gets the sub-slices the op hands it.
    let whole = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let mut real = |b: &mut [u8]| orig(b.as_mut_ptr().cast(), b.len());
    read_detour(&mut real, |real| ops::read_or_wait(fd, whole, real))
}

/// `recv`/`recvfrom` of an upgraded fd, the way [`calls::recv`] says: [`read_upgraded`]; with
/// `MSG_TRUNC`, the bytes counted and discarded as TCP does; with `MSG_WAITALL` on a blocking
/// fd, the buffer filled from direct reads and the original `orig`
/// (called without the flag) in turn ([`direct::wait_all`]). None: the caller calls the
/// original with its arguments.
fn recv_upgraded(
    fd: c_int,
    (buf, len): (*mut c_void, usize),
    (flags, wants_addr): (c_int, bool),
    orig: &mut dyn FnMut(*mut c_void, usize, c_int) -> isize,
) -> Option<isize> {
    match calls::recv(flags, wants_addr) {
        Recv::Original => return None,
        Recv::Direct => {
            let mut plain = |b: *mut c_void, l: usize| orig(b, l, flags);
            return read_upgraded(fd, (buf, len), &mut plain);
        }
        Recv::Discard if fdtable::get(fd) & fdtable::SWAPPED != 0 => {
            let mut scratch = [0u8; calls::DISCARD_CHUNK];
            let n = len.min(scratch.len());
            return Some(orig(
                scratch.as_mut_ptr().cast(),
                n,
                flags & !libc::MSG_TRUNC,
            ));
        }
        Recv::Discard => return None,
        Recv::WaitAll => {}
    }
    if buf.is_null() || len == 0 || fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return None;
    }
    let blocking = guarded(|| sys::fd_flags(fd).ok()).flatten()?.0 & libc::O_NONBLOCK == 0;
    if !blocking {
        // MSG_WAITALL waits for nothing on a non-blocking socket.
        return read_direct(fd, buf, len);
    }
    // While the loop takes bytes, the engine leaves them in the ring for it; never across the
    // blocking wait.
    let hold = guarded(|| ops::hold_stream(fd)).flatten();
    // SAFETY: recv(2)'s contract: `buf` holds `len` writable bytes for the call; the closures
    // below only ever use the sub-slices wait_all hands them.
    let whole = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let rest_flags = flags & !libc::MSG_WAITALL;
    let mut wait = |rest: &mut [u8]| {
        let mut call = || orig(rest.as_mut_ptr().cast(), rest.len(), rest_flags);
        match &hold {
            Some(h) => h.released(call),
            None => call(),
        }
    };
    let n = direct::wait_all(
        whole,
        &mut |rest| read_direct(fd, rest.as_mut_ptr().cast(), rest.len()).map(isize::unsigned_abs),
        &mut wait,
    );
    let errno = sys::errno();
    drop(hold);
    sys::set_errno(errno);
    Some(n)
}

/// Whether the stream behind the upgraded `fd` failed unreported ([`ops::take_reset`]),
/// [`guarded`]. Any other fd costs one atomic load.
fn reset_once(fd: c_int) -> bool {
    fdtable::get(fd) & fdtable::SWAPPED != 0 && guarded(|| ops::take_reset(fd)).unwrap_or(false)
}

/// A read's result: the socketpair's EOF (0 for a non-empty buffer) of an upgraded fd whose
/// stream failed is -1 with `ECONNRESET` instead, once, as a TCP socket reports a reset; an app
/// never takes a broken stream's end for an orderly one.
fn read_result(fd: c_int, len: usize, n: isize) -> isize {
    if n == 0 && len > 0 && reset_once(fd) {
        sys::set_errno(libc::ECONNRESET);
        return -1;
    }
    n
}

/// The flag a write on `fd` adds to the app's: an upgraded fd's socketpair is always written
/// with `MSG_NOSIGNAL`, and [`write_result`] raises `SIGPIPE` where TCP's send would. One
/// atomic load.
fn no_signal(fd: c_int) -> c_int {
    if fdtable::get(fd) & fdtable::SWAPPED != 0 {
        libc::MSG_NOSIGNAL
    } else {
        0
    }
}

/// A write's result, `n`, on an fd [`no_signal`] gave `added` (0: any other fd, untouched).
/// On an upgraded fd an `EPIPE` is a reset the app was not told of yet (`ECONNRESET`, once,
/// without a signal: [`ops::write_error`]), as TCP's send reports it; otherwise `EPIPE`, with
/// `SIGPIPE` to the calling thread unless the app asked for `MSG_NOSIGNAL` (`quiet`), as TCP's
/// send raises it.
fn write_result(fd: c_int, added: c_int, quiet: bool, n: isize) -> isize {
    if n >= 0 || added == 0 || sys::errno() != libc::EPIPE {
        return n;
    }
    match guarded(|| ops::write_error(fd)).flatten() {
        Some(e) => sys::set_errno(e),
        None if !quiet => {
            sys::raise_sigpipe();
            sys::set_errno(libc::EPIPE);
        }
        None => {}
    }
    n
}

/// A send's result `n` with the app's `flags`: a `MSG_ZEROCOPY` send that took bytes on an
/// upgraded fd queues its completion, as TCP's does when `SO_ZEROCOPY` is on
/// ([`ops::zerocopy_sent`]). A flag test for any other send.
fn zerocopy_result(fd: c_int, flags: c_int, n: isize) -> isize {
    if n > 0 && flags & libc::MSG_ZEROCOPY != 0 && fdtable::get(fd) & fdtable::SWAPPED != 0 {
        let errno = sys::errno();
        let _ = guarded(|| ops::zerocopy_sent(fd));
        sys::set_errno(errno);
    }
    n
}

/// A receive with `MSG_ERRQUEUE` on an upgraded fd, answered from the connection's error
/// queue ([`ops::take_error`]) and never from the socketpair, whose `AF_UNIX` end has no error
/// queue and would hand over the stream's bytes instead: 0 with the oldest completion
/// (written by `fill`: the control bytes, for `room` bytes of room, and whether they were cut
/// short), or -1 with `EAGAIN` when there is none. None: not such a call.
fn recv_error_queue(
    fd: c_int,
    flags: c_int,
    room: usize,
    fill: &mut dyn FnMut(&[u8], bool),
) -> Option<isize> {
    if flags & libc::MSG_ERRQUEUE == 0 || fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return None;
    }
    match guarded(|| ops::take_error(fd, room)).flatten()? {
        Ok((bytes, cut)) => {
            fill(&bytes, cut);
            Some(0)
        }
        Err(e) => {
            sys::set_errno(e);
            Some(-1)
        }
    }
}

/// A read's result `n` for a buffer of `len` bytes, made once more by `again` when it met EOF
/// on a number a failed connect put back on its TCP socket meanwhile: the EOF was the
/// socketpair end's, which the number named when the read began (another thread's read while
/// the connect was under way), and TCP's answer is the TCP socket's ([`ops::read_again`]).
/// That socket answers `ENOTCONN` once the connect took its error; a TCP read that was waiting
/// when its connect failed answers `EPIPE` instead (the kernel's `sk_wait_event` after a
/// disconnect during the wait), and so does this one. One atomic load for any other EOF.
fn again_on_tcp(fd: c_int, len: usize, n: isize, again: impl FnOnce() -> isize) -> isize {
    if n != 0
        || len == 0
        || !ops::any_restored()
        || !guarded(|| ops::read_again(fd)).unwrap_or(false)
    {
        return n;
    }
    let n = again();
    if n < 0 && sys::errno() == libc::ENOTCONN {
        sys::set_errno(libc::EPIPE);
    }
    n
}

/// `ssize_t read(int fd, void *buf, size_t count)`: for an upgraded fd, the stream's bytes
/// straight from its receive ring, after those the engine delivered to the fd, and on a
/// blocking fd after waiting for them ([`read_upgraded`]).
///
/// # Safety
/// The C contract of `read(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    let Some(orig) = real::read() else {
        return no_original() as isize;
    };
    // SAFETY: the caller's fd, with parts of its buffer, as read(2) allows.
    let mut call = |b: *mut c_void, l: usize| unsafe { orig(fd, b, l) };
    if let Some(n) = read_upgraded(fd, (buf, count), &mut call) {
        return read_result(fd, count, n);
    }
    // SAFETY: the caller's arguments, passed on unchanged (once more after a restore).
    let call = || unsafe { orig(fd, buf, count) };
    again_on_tcp(fd, count, read_result(fd, count, call()), call)
}

/// `ssize_t recv(int fd, void *buf, size_t len, int flags)`: as [`read`] when `flags` asks
/// for nothing a plain read would not do, and `MSG_WAITALL` too ([`calls::recv`]); `MSG_PEEK`
/// and the rest go to libc.
///
/// # Safety
/// The C contract of `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    let Some(orig) = real::recv() else {
        return no_original() as isize;
    };
    if let Some(n) = recv_error_queue(fd, flags, 0, &mut |_, _| {}) {
        return n;
    }
    // SAFETY: the caller's fd, with parts of its buffer and its flags, as recv(2) allows.
    let mut call = |b: *mut c_void, l: usize, f: c_int| unsafe { orig(fd, b, l, f) };
    if let Some(n) = recv_upgraded(fd, (buf, len), (flags, false), &mut call) {
        return read_result(fd, len, n);
    }
    // SAFETY: the caller's arguments, passed on unchanged (once more after a restore).
    let call = || unsafe { orig(fd, buf, len, flags) };
    again_on_tcp(fd, len, read_result(fd, len, call()), call)
}

/// `ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
/// socklen_t *addrlen)`: as [`recv`] when no address is asked for.
///
/// # Safety
/// The C contract of `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> isize {
    let Some(orig) = real::recvfrom() else {
        return no_original() as isize;
    };
    // A completion has no address: the kernel says so with a length of 0.
    let no_address = || {
        if !addrlen.is_null() {
            // SAFETY: recvfrom's contract: a non-null `addrlen` points to a writable socklen_t.
            unsafe { addrlen.write(0) };
        }
    };
    if let Some(n) = recv_error_queue(fd, flags, 0, &mut |_, _| no_address()) {
        return n;
    }
    // SAFETY: the caller's fd, with parts of its buffer and its flags, as recvfrom(2) allows
    // (no address is asked for).
    let mut call = |b: *mut c_void, l: usize, f: c_int| unsafe {
        orig(fd, b, l, f, std::ptr::null_mut(), std::ptr::null_mut())
    };
    if let Some(n) = recv_upgraded(fd, (buf, len), (flags, !addr.is_null()), &mut call) {
        return read_result(fd, len, n);
    }
    // SAFETY: the caller's arguments, passed on unchanged (once more after a restore).
    let call = || unsafe { orig(fd, buf, len, flags, addr, addrlen) };
    again_on_tcp(fd, len, read_result(fd, len, call()), call)
}

/// `ssize_t recvmsg(int fd, struct msghdr *msg, int flags)`: libc's call; then each
/// descriptor it received (`SCM_RIGHTS`) that is the app's end of an upgraded connection
/// another process handed over answers as that connection's TCP socket ([`ops::received`]).
///
/// # Safety
/// The C contract of `recvmsg(2)`: `msg` points to a writable `struct msghdr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    let Some(orig) = real::recvmsg() else {
        return no_original() as isize;
    };
    if flags & libc::MSG_ERRQUEUE != 0 && !msg.is_null() {
        // SAFETY: recvmsg's contract: `msg` points to a readable msghdr.
        let (control, room) = unsafe { ((*msg).msg_control, (*msg).msg_controllen) };
        let room = if control.is_null() { 0 } else { room };
        let mut fill = |bytes: &[u8], cut: bool| {
            // SAFETY: `msg` is the caller's writable msghdr, and `msg_control` has `room`
            // writable bytes, of which `bytes` takes at most that many ([`ops::take_error`]).
            unsafe {
                if !bytes.is_empty() {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        control.cast::<u8>(),
                        bytes.len().min(room),
                    );
                }
                (*msg).msg_controllen = bytes.len().min(room);
                (*msg).msg_namelen = 0;
                (*msg).msg_flags = libc::MSG_ERRQUEUE | if cut { libc::MSG_CTRUNC } else { 0 };
            }
        };
        if let Some(n) = recv_error_queue(fd, flags, room, &mut fill) {
            return n;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged (once more after a restore).
    let call = || unsafe { orig(fd, msg, flags) };
    let n = again_on_tcp(fd, 1, call(), call);
    if n < 0 || msg.is_null() {
        return n;
    }
    // SAFETY: recvmsg succeeded, so `msg` is the caller's msghdr, which the kernel filled.
    let fds = unsafe { sys::fdpass::rights(&*msg) };
    if !fds.is_empty() {
        let _ = guarded(|| ops::received(&fds, &register_callbacks));
    }
    n
}

/// `write`/`send`/`sendto` of an upgraded fd: the start of `buf` straight into the stream's
/// send ring while it takes bytes, then the rest through `orig` (the original call on the
/// socketpair, blocking or not as the fd does), once ([`direct::write_direct_then_rest`]).
/// None: not an upgraded fd with direct writes on; the caller calls the original with its
/// arguments. Any other fd costs one atomic load.
fn write_upgraded(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    dontwait: bool,
    orig: &mut dyn FnMut(*const c_void, usize) -> isize,
) -> Option<isize> {
    if buf.is_null() || len == 0 || fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return None;
    }
    let writer = guarded(|| ops::writer(fd)).flatten()?;
    // SAFETY: write(2)'s contract: `buf` holds `len` readable bytes for the call.
    let whole = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
    // Until when this call may wait for room in the ring: looked up once, when first needed.
    let mut until = None;
    let mut wait_until = || *until.get_or_insert_with(|| ops::write_wait_until(fd, dontwait));
    let mut direct =
        |chunk: &[u8]| guarded(|| ops::write_direct(&writer, fd, chunk, &mut wait_until)).flatten();
    Some(direct::write_direct_then_rest(
        whole,
        &mut direct,
        &mut |rest| orig(rest.as_ptr().cast(), rest.len()),
    ))
}

/// `ssize_t write(int fd, const void *buf, size_t count)`: for an upgraded fd, the bytes
/// straight into the stream's send ring when the fd's socketpair end holds none the engine has
/// not read.
///
/// # Safety
/// The C contract of `write(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: usize) -> isize {
    let (Some(orig), Some(send)) = (real::write(), real::send()) else {
        return no_original() as isize;
    };
    let added = no_signal(fd);
    if added == 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { orig(fd, buf, count) };
    }
    // An upgraded fd is a socket: write(2) is send(2) without flags, here with `added`.
    // SAFETY: the caller's fd with the unwritten tail of its buffer, as write(2) allows.
    let mut call = |b: *const c_void, l: usize| unsafe { send(fd, b, l, added) };
    if let Some(n) = write_upgraded(fd, buf, count, false, &mut call) {
        return write_result(fd, added, false, n);
    }
    write_result(fd, added, false, call(buf, count))
}

/// A send of urgent data (`MSG_OOB`) on an upgraded fd ([`ops::send_urgent`]): the peer's app
/// gets its last byte as TCP's urgent byte. None: not an upgraded fd, or `MSG_OOB` not asked;
/// the caller calls the original.
fn send_urgent_upgraded(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> Option<isize> {
    if flags & libc::MSG_OOB == 0 || buf.is_null() || len == 0 {
        return None;
    }
    let added = no_signal(fd);
    if added == 0 {
        return None;
    }
    // SAFETY: send(2)'s contract: `buf` holds `len` readable bytes for the call.
    let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
    let sent = guarded(|| ops::send_urgent(fd, bytes, flags | added)).flatten()?;
    let quiet = flags & libc::MSG_NOSIGNAL != 0;
    Some(match sent {
        Ok(n) => n as isize,
        Err(e) => {
            sys::set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            write_result(fd, added, quiet, -1)
        }
    })
}

/// `ssize_t send(int fd, const void *buf, size_t len, int flags)`: as [`write`] when `flags`
/// asks for nothing but `MSG_DONTWAIT`, `MSG_NOSIGNAL`, `MSG_MORE` and `MSG_WAITALL`
/// ([`calls::send_direct`]); `MSG_OOB` and the rest go to libc.
///
/// # Safety
/// The C contract of `send(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    let Some(orig) = real::send() else {
        return no_original() as isize;
    };
    let added = no_signal(fd);
    let quiet = flags & libc::MSG_NOSIGNAL != 0;
    // SAFETY: the caller's fd with the unwritten tail of its buffer and its flags.
    let mut call = |b: *const c_void, l: usize| unsafe { orig(fd, b, l, flags | added) };
    if let Some(n) = send_urgent_upgraded(fd, buf, len, flags) {
        return n;
    }
    if calls::send_direct(flags, false)
        && let Some(n) = write_upgraded(fd, buf, len, calls::send_dontwait(flags), &mut call)
    {
        return write_result(fd, added, quiet, n);
    }
    let n = write_result(fd, added, quiet, call(buf, len));
    zerocopy_result(fd, flags, n)
}

/// Whether a send's address is dropped: on an upgraded fd, which is connected, TCP ignores the
/// address a `sendto` or `sendmsg` names (`tcp_sendmsg` reads no `msg_name`), where the
/// socketpair behind the fd would answer `EISCONN`. One atomic load.
fn drops_address(fd: c_int) -> bool {
    fdtable::get(fd) & fdtable::SWAPPED != 0
}

/// `ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr
/// *addr, socklen_t addrlen)`: as [`send`] when no address is given (a connected stream
/// socket's only use); an upgraded fd ignores the address, as TCP does
/// ([`drops_address`]).
///
/// # Safety
/// The C contract of `sendto(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> isize {
    let Some(orig) = real::sendto() else {
        return no_original() as isize;
    };
    // Only a call that names an address pays the table load (the common sendto names none).
    let (addr, addrlen) = if !addr.is_null() && drops_address(fd) {
        (std::ptr::null(), 0)
    } else {
        (addr, addrlen)
    };
    let added = no_signal(fd);
    let quiet = flags & libc::MSG_NOSIGNAL != 0;
    // SAFETY: the caller's fd with the unwritten tail of its buffer and its flags, no address.
    let mut call =
        |b: *const c_void, l: usize| unsafe { orig(fd, b, l, flags | added, std::ptr::null(), 0) };
    if let Some(n) = send_urgent_upgraded(fd, buf, len, flags) {
        return n;
    }
    if calls::send_direct(flags, !addr.is_null())
        && let Some(n) = write_upgraded(fd, buf, len, calls::send_dontwait(flags), &mut call)
    {
        return write_result(fd, added, quiet, n);
    }
    // SAFETY: the caller's arguments, and `added`.
    let n = unsafe { orig(fd, buf, len, flags | added, addr, addrlen) };
    zerocopy_result(fd, flags, write_result(fd, added, quiet, n))
}

/// Before the move of the upgraded `fd`: the buffers of `msg` (which carries no control data)
/// sent on the kept TCP socket from the app's thread as far as it takes them
/// ([`ops::write_early_vectored`]), what is left with `rest` (the original call on the fd,
/// given `msg` with the iovecs of the rest). The byte count (what went before `rest` failed,
/// as `write` counts); None: not now, the caller calls the original. Any other fd costs one
/// atomic load.
fn sendmsg_early(
    fd: c_int,
    msg: &libc::msghdr,
    rest: &mut dyn FnMut(&libc::msghdr) -> isize,
) -> Option<isize> {
    if fdtable::get(fd) & fdtable::SWAPPED == 0
        || msg.msg_controllen != 0
        || msg.msg_iov.is_null()
        || msg.msg_iovlen == 0
        || msg.msg_iovlen > calls::IOV_MAX
    {
        return None;
    }
    // After the move (the gate closed) nothing is gathered.
    let writer = guarded(|| ops::writer(fd)).flatten()?;
    if !writer.writes_early() {
        return None;
    }
    // SAFETY: sendmsg's contract: `msg_iov` points to `msg_iovlen` readable iovecs for the call.
    let iov = unsafe { std::slice::from_raw_parts(msg.msg_iov, msg.msg_iovlen) };
    if iov.iter().any(|v| v.iov_base.is_null() && v.iov_len > 0) {
        // The kernel answers EFAULT for it.
        return None;
    }
    let bufs: Vec<std::io::IoSlice<'_>> = iov
        .iter()
        .filter(|v| v.iov_len > 0)
        .map(|v| {
            // SAFETY: each non-empty iovec's base holds `iov_len` readable bytes for the call.
            let bytes = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            std::io::IoSlice::new(bytes)
        })
        .collect();
    let total = iov.iter().fold(0usize, |t, v| t.saturating_add(v.iov_len));
    let n = guarded(|| ops::write_early_vectored(&writer, fd, &bufs)).flatten()?;
    if n >= total {
        return isize::try_from(n).ok();
    }
    // The rest, after the `n` bytes that went: the iovecs from that offset on.
    let mut skip = n;
    let mut left = Vec::with_capacity(iov.len());
    for v in iov {
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        left.push(libc::iovec {
            iov_base: v.iov_base.cast::<u8>().wrapping_add(skip).cast(),
            iov_len: v.iov_len - skip,
        });
        skip = 0;
    }
    let mut rest_msg = *msg;
    rest_msg.msg_iov = left.as_mut_ptr();
    rest_msg.msg_iovlen = left.len();
    let m = rest(&rest_msg);
    let done = if m > 0 { n + m.unsigned_abs() } else { n };
    isize::try_from(done).ok()
}

/// `ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)`: the original, with the
/// message's address dropped on an upgraded fd ([`drops_address`]); its ancillary data go to
/// the socketpair, whose engine end reads the bytes and drops the rest (`SCM_RIGHTS` and
/// `SCM_CREDENTIALS` mean nothing to TCP either). Before the connection's move, a message
/// without ancillary data goes on the TCP connection from the app's thread
/// ([`sendmsg_early`]).
///
/// # Safety
/// The C contract of `sendmsg(2)`: `msg` points to a readable `struct msghdr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    let Some(orig) = real::sendmsg() else {
        return no_original() as isize;
    };
    let added = no_signal(fd);
    let quiet = flags & libc::MSG_NOSIGNAL != 0;
    if msg.is_null() || added == 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { orig(fd, msg, flags) };
    }
    // SAFETY: per sendmsg's contract `msg` points to a readable msghdr; the copy shares its
    // buffers, which stay the caller's for the call.
    let mut without_name = unsafe { msg.read() };
    without_name.msg_name = std::ptr::null_mut();
    without_name.msg_namelen = 0;
    // SAFETY: the caller's fd, a message with the caller's buffers (less its address) and
    // flags, and `added`.
    let mut call = |m: &libc::msghdr| unsafe { orig(fd, m, flags | added) };
    if calls::send_direct(flags, false)
        && let Some(n) = sendmsg_early(fd, &without_name, &mut call)
    {
        return write_result(fd, added, quiet, n);
    }
    let n = call(&without_name);
    zerocopy_result(fd, flags, write_result(fd, added, quiet, n))
}

/// `ssize_t writev(int fd, const struct iovec *iov, int iovcnt)`: on an upgraded fd,
/// `sendmsg` of the same buffers with `MSG_NOSIGNAL` (what `writev` on a socket is, without the
/// flag), so that a reset answers as TCP's ([`write_result`]), before the connection's move
/// from the app's thread on the TCP connection ([`sendmsg_early`]); any other fd, or a count
/// `writev` refuses, goes to libc unchanged.
///
/// # Safety
/// The C contract of `writev(2)`: `iov` points to `iovcnt` readable `struct iovec`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
    let (Some(orig), Some(sendmsg)) = (real::writev(), real::sendmsg()) else {
        return no_original() as isize;
    };
    // Any other fd, or a count writev refuses: libc's, unchanged (one atomic load).
    let added = no_signal(fd);
    let count = usize::try_from(iovcnt)
        .ok()
        .filter(|&n| added != 0 && !iov.is_null() && n > 0 && n <= calls::IOV_MAX);
    let Some(count) = count else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { orig(fd, iov, iovcnt) };
    };
    // SAFETY: all-zero is a valid msghdr (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.cast_mut();
    msg.msg_iovlen = count;
    // SAFETY: the caller's buffers, which stay theirs for the call; sendmsg only reads them.
    let mut call = |m: &libc::msghdr| unsafe { sendmsg(fd, m, added) };
    let n = match sendmsg_early(fd, &msg, &mut call) {
        Some(n) => n,
        None => call(&msg),
    };
    write_result(fd, added, false, n)
}

/// `int sendmmsg(int fd, struct mmsghdr *msgvec, unsigned int vlen, int flags)`: on an
/// upgraded fd, each message as [`sendmsg`] sends it (its address dropped, as TCP ignores it,
/// with `MSG_NOSIGNAL`), its length written back, until one fails or sends short; what failed
/// after a message went is the next call's, as the kernel's `sendmmsg` leaves it. Any other fd
/// goes to libc unchanged.
///
/// # Safety
/// The C contract of `sendmmsg(2)`: `msgvec` points to `vlen` writable `struct mmsghdr`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: c_int,
) -> c_int {
    let (Some(orig), Some(sendmsg)) = (real::sendmmsg(), real::sendmsg()) else {
        return no_original();
    };
    let added = no_signal(fd);
    if added == 0 || msgvec.is_null() || vlen == 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { orig(fd, msgvec, vlen, flags) };
    }
    let quiet = flags & libc::MSG_NOSIGNAL != 0;
    // The kernel sends at most UIO_MAXIOV messages per call.
    let vlen = usize::try_from(vlen).map_or(calls::IOV_MAX, |v| v.min(calls::IOV_MAX));
    let mut sent: c_int = 0;
    for i in 0..vlen {
        // SAFETY: per sendmmsg's contract, `msgvec` holds `vlen` (at least this many) entries.
        let entry = unsafe { &mut *msgvec.add(i) };
        let mut without_name = entry.msg_hdr;
        without_name.msg_name = std::ptr::null_mut();
        without_name.msg_namelen = 0;
        // SAFETY: the caller's message (less its address), flags and `added`.
        let n = unsafe { sendmsg(fd, &without_name, flags | added) };
        if n < 0 {
            if sent == 0 {
                return write_result(fd, added, quiet, n) as c_int;
            }
            break;
        }
        entry.msg_len = u32::try_from(zerocopy_result(fd, flags, n)).unwrap_or(u32::MAX);
        sent += 1;
    }
    sent
}

/// A `sendfile` or `splice` into `fd` by `call`: on an upgraded fd, whose socketpair raises
/// `SIGPIPE` where TCP's send reports a reset instead, the call's `SIGPIPE` is taken back
/// ([`sys::without_sigpipe`]) and its `EPIPE` answered as a send's ([`write_result`]).
fn write_by_kernel(fd: c_int, call: impl FnOnce() -> isize) -> isize {
    let added = no_signal(fd);
    if added == 0 {
        return call();
    }
    write_result(fd, added, false, sys::without_sigpipe(call))
}

/// `ssize_t sendfile(int out_fd, int in_fd, off_t *offset, size_t count)`: as libc's, with a
/// reset of an upgraded `out_fd` answered as TCP's ([`write_by_kernel`]).
///
/// # Safety
/// The C contract of `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: usize,
) -> isize {
    let Some(orig) = real::sendfile() else {
        return no_original() as isize;
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    write_by_kernel(out_fd, || unsafe { orig(out_fd, in_fd, offset, count) })
}

/// `ssize_t sendfile64(int out_fd, int in_fd, off64_t *offset, size_t count)`: [`sendfile`]'s
/// other name (`off_t` is 64 bits on this target).
///
/// # Safety
/// The C contract of `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: usize,
) -> isize {
    let Some(orig) = real::sendfile64() else {
        return no_original() as isize;
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    write_by_kernel(out_fd, || unsafe { orig(out_fd, in_fd, offset, count) })
}

/// `ssize_t splice(int fd_in, loff_t *off_in, int fd_out, loff_t *off_out, size_t len,
/// unsigned int flags)`: as libc's, with a reset of an upgraded `fd_out` answered as TCP's
/// ([`write_by_kernel`]).
///
/// # Safety
/// The C contract of `splice(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: usize,
    flags: libc::c_uint,
) -> isize {
    let Some(orig) = real::splice() else {
        return no_original() as isize;
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    write_by_kernel(fd_out, || unsafe {
        orig(fd_in, off_in, fd_out, off_out, len, flags)
    })
}

/// `int ioctl(int fd, unsigned long request, ...)`: `FIONREAD` (`SIOCINQ`) of an upgraded fd
/// with an urgent byte pending counts the bytes before the mark, as TCP's does
/// ([`ops::readable`]), and its `SIOCATMARK` answers as TCP's ([`ops::at_mark`]); everything
/// else is the original's. Defined with a fixed third argument, as [`fcntl`] is. Two
/// comparisons for any other request.
///
/// # Safety
/// The C contract of `ioctl(2)`: for `FIONREAD` and `SIOCATMARK`, `arg` points to a writable
/// `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int {
    let Some(orig) = real::ioctl() else {
        return no_original();
    };
    if request == libc::FIONREAD
        && !arg.is_null()
        && let Some(n) = guarded(|| ops::readable(fd)).flatten()
    {
        // SAFETY: FIONREAD's contract: `arg` points to a writable int.
        unsafe { arg.cast::<c_int>().write(n) };
        return 0;
    }
    if request == sys::SIOCATMARK
        && !arg.is_null()
        && let Some(answer) = guarded(|| ops::at_mark(fd)).flatten()
    {
        return match answer {
            Ok(at) => {
                // SAFETY: SIOCATMARK's contract: `arg` points to a writable int.
                unsafe { arg.cast::<c_int>().write(c_int::from(at)) };
                0
            }
            Err(errno) => {
                sys::set_errno(errno);
                -1
            }
        };
    }
    if request == sys::FIOSETOWN || request == sys::SIOCSPGRP {
        // The owner is carried over by the swap.
        fdtable::forget_defaults(fd);
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { orig(fd, request, arg) }
}

/// `int close(int fd)`. Safe in signal handlers and between fork and exec: an atomic store and
/// the original call.
///
/// # Safety
/// The C contract of `close(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let Some(orig) = real::close() else {
        return no_original();
    };
    // SAFETY: the caller's argument, passed on unchanged to libc's close.
    let real = || unsafe { orig(fd) };
    if Guard::enter().is_none() {
        // Nested (the shim's own close): the number is free again either way.
        fdtable::clear(fd);
        return real();
    }
    detour(&real, |real| ops::close(fd, real))
}

/// `int dup(int fd)`: the copy inherits what the shim knows of `fd`.
///
/// # Safety
/// The C contract of `dup(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let Some(orig) = real::dup() else {
        return no_original();
    };
    // SAFETY: the caller's argument, passed on unchanged to libc's dup.
    let real = || unsafe { orig(fd) };
    dup_detour(fd, None, &real)
}

/// `int dup2(int old, int new)`: `new` forgets what it was and inherits what `old` is.
///
/// # Safety
/// The C contract of `dup2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let Some(orig) = real::dup2() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's dup2.
    let real = || unsafe { orig(old, new) };
    dup_detour(old, Some(new), &real)
}

/// `int dup3(int old, int new, int flags)`: as dup2.
///
/// # Safety
/// The C contract of `dup3(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let Some(orig) = real::dup3() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's dup3.
    let real = || unsafe { orig(old, new, flags) };
    dup_detour(old, Some(new), &real)
}

/// `fcntl`/`fcntl64`: F_DUPFD and F_DUPFD_CLOEXEC are dups; every other command goes straight
/// to the original with no shim work at all.
fn fcntl_detour(orig: real::FcntlFn, fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's variadic fcntl: the third
    // argument is read and passed on as the full register the caller filled (an int, a long
    // or a pointer, depending on `cmd`), exactly as glibc's own fcntl reads it with va_arg.
    let real = || unsafe { orig(fd, cmd, arg) };
    if cmd != libc::F_DUPFD && cmd != libc::F_DUPFD_CLOEXEC {
        if cmd == libc::F_SETOWN || cmd == sys::F_SETOWN_EX {
            // The owner is carried over by the swap.
            fdtable::forget_defaults(fd);
        }
        return real();
    }
    dup_detour(fd, None, &real)
}

/// The dup family: when neither `old` nor the number dup2/dup3 replaces is known to the shim
/// (every fd of a pass-through process), the original call and the table loads only: no
/// guard, no op. The new number of a plain `dup` was free; a stale entry there (a number closed
/// by `close_range`, which is not hooked) is cleared.
fn dup_detour(old: c_int, target: Option<c_int>, real: &dyn Fn() -> c_int) -> c_int {
    if fdtable::get(old) == 0 && target.is_none_or(|t| fdtable::get(t) == 0) {
        let new = real();
        if target.is_none() {
            fdtable::clear(new);
        }
        return new;
    }
    detour(real, |real| ops::dup(old, target, real))
}

/// `int fcntl(int fd, int cmd, ...)`. Defined with a fixed third argument (Rust cannot define
/// C-variadic functions on stable): on x86-64 and aarch64 Linux a variadic integer or pointer
/// argument travels in the same register as a fixed one, and commands without an argument
/// leave an unused value there, which the original ignores.
///
/// # Safety
/// The C contract of `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    let Some(orig) = real::fcntl() else {
        return no_original();
    };
    fcntl_detour(orig, fd, cmd, arg)
}

/// `int fcntl64(int fd, int cmd, ...)`: what programs built with `_FILE_OFFSET_BITS=64` call
/// (glibc >= 2.28). As [`fcntl`].
///
/// # Safety
/// The C contract of `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    let Some(orig) = real::fcntl64() else {
        return no_original();
    };
    fcntl_detour(orig, fd, cmd, arg)
}

/// `int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)`: notes INET stream
/// sockets registered before they are connected (they stay TCP). One atomic load for every
/// other fd.
///
/// # Safety
/// The C contract of `epoll_ctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    let Some(orig) = real::epoll_ctl() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's epoll_ctl.
    let real = || unsafe { orig(epfd, op, fd, event) };
    if fdtable::get(fd) & fdtable::INET_STREAM == 0 {
        return real();
    }
    // SAFETY: epoll_ctl's contract: for ADD and MOD, `event` points to a readable epoll_event
    // (DEL ignores it, so it is not read then). Copied out: the struct is packed.
    let event = (op != libc::EPOLL_CTL_DEL && !event.is_null()).then(|| unsafe {
        let e = event.read_unaligned();
        (e.events, e.u64)
    });
    detour(&real, |real| {
        let rc = real();
        if rc == 0 {
            ops::epoll_ctl(epfd, op, fd, event);
        }
        rc
    })
}

/// `int getpeername(int fd, struct sockaddr *addr, socklen_t *len)`: for an upgraded fd,
/// answered from the kept TCP socket.
///
/// # Safety
/// The C contract of `getpeername(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(orig) = real::getpeername() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged (to the fd or the kept socket).
    let call = move |f: c_int| unsafe { orig(f, addr, len) };
    if fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return call(fd);
    }
    detour(&|| call(fd), |real| {
        let rc = ops::redirect(fd, real, &mut |k| call(k));
        if rc != 0 && sys::errno() == libc::ENOTCONN {
            ops::peer_reset_seen(fd);
            sys::set_errno(libc::ENOTCONN);
        }
        rc
    })
}

/// `int getsockname(int fd, struct sockaddr *addr, socklen_t *len)`: for an upgraded fd,
/// answered from the kept TCP socket.
///
/// # Safety
/// The C contract of `getsockname(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(orig) = real::getsockname() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged (to the fd or the kept socket).
    let call = move |f: c_int| unsafe { orig(f, addr, len) };
    if fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return call(fd);
    }
    detour(&|| call(fd), |real| {
        ops::redirect(fd, real, &mut |k| call(k))
    })
}

/// `int getsockopt(int fd, int level, int name, void *val, socklen_t *len)`.
///
/// # Safety
/// The C contract of `getsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut libc::c_void,
    len: *mut socklen_t,
) -> c_int {
    let Some(orig) = real::getsockopt() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged (to the fd or the kept socket).
    let call = move |f: c_int| unsafe { orig(f, level, name, val, len) };
    if fdtable::get(fd) & fdtable::SWAPPED == 0 {
        return call(fd);
    }
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
        return so_error(fd, val, len, call(fd));
    }
    if !calls::option_on_kept(level, name) {
        return call(fd);
    }
    let rc = detour(&|| call(fd), |real| {
        ops::redirect(fd, real, &mut |k| call(k))
    });
    if rc == 0 && level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
        tcp_info_of_stream(fd, val, len);
    }
    rc
}

/// `TCP_INFO` of an upgraded fd, as the kept TCP socket filled it into `val` (`*len` bytes):
/// its byte counts are the stream's ([`calls::patch_tcp_info`]), which carried the bytes.
fn tcp_info_of_stream(fd: c_int, val: *mut c_void, len: *mut socklen_t) {
    if val.is_null() || len.is_null() {
        return;
    }
    let Some((sent, acked, received)) = guarded(|| ops::stream_counters(fd)).flatten() else {
        return;
    };
    // SAFETY: getsockopt succeeded, so `len` is readable and says how many bytes of `val` the
    // kernel wrote, within what the caller gave it.
    let filled = usize::try_from(unsafe { *len }).unwrap_or(0);
    // SAFETY: as above: `val` holds `filled` bytes the caller lets getsockopt write.
    let info = unsafe { std::slice::from_raw_parts_mut(val.cast::<u8>(), filled) };
    calls::patch_tcp_info(info, sent, acked, received);
}

/// `SO_ERROR` of an upgraded fd, after the socketpair's answer `rc`: a failed stream not
/// reported yet answers `ECONNRESET`, once, as a reset TCP socket's pending error does (a read
/// after it then sees the socketpair's EOF, as a TCP read sees EOF once its error was taken).
fn so_error(fd: c_int, val: *mut libc::c_void, len: *mut socklen_t, rc: c_int) -> c_int {
    if rc != 0 || val.is_null() || len.is_null() {
        return rc;
    }
    // SAFETY: getsockopt's contract: `len` points to the size of `val`, which the original
    // just filled with an int when it has room for one.
    let pending = unsafe {
        (*len as usize >= size_of::<c_int>()).then(|| val.cast::<c_int>().read_unaligned())
    };
    if pending == Some(0) && reset_once(fd) {
        // SAFETY: as above: `val` holds an int.
        unsafe { val.cast::<c_int>().write_unaligned(libc::ECONNRESET) };
    }
    rc
}

/// `int setsockopt(int fd, int level, int name, const void *val, socklen_t len)`.
///
/// # Safety
/// The C contract of `setsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const libc::c_void,
    len: socklen_t,
) -> c_int {
    let Some(orig) = real::setsockopt() else {
        return no_original();
    };
    // SAFETY: the caller's arguments, passed on unchanged (to the fd or the kept socket).
    let call = move |f: c_int| unsafe { orig(f, level, name, val, len) };
    let flags = fdtable::get(fd);
    if flags & fdtable::INET_STREAM != 0 {
        // Before the call: a swap that reads the bit after it reads the new value.
        fdtable::option_set(fd, level, name);
    }
    if flags & fdtable::SWAPPED == 0 {
        return call(fd);
    }
    if !calls::option_on_kept(level, name) {
        let rc = call(fd);
        if rc == 0 && level == libc::SOL_SOCKET && name == libc::SO_LINGER && !val.is_null() {
            let errno = sys::errno();
            // SAFETY: setsockopt's contract: `val` holds `len` readable bytes.
            let value = unsafe {
                std::slice::from_raw_parts(val.cast::<u8>(), usize::try_from(len).unwrap_or(0))
            };
            if let Some(reset) = calls::linger_resets(level, name, value) {
                let _ = guarded(|| ops::mirror_linger(fd, reset));
            }
            sys::set_errno(errno);
        }
        if rc == 0 && level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT {
            // The engine holds back bytes below the mark (the socketpair's poll ignores it).
            let errno = sys::errno();
            let _ = guarded(|| ops::low_water_set(fd));
            sys::set_errno(errno);
        }
        return rc;
    }
    let rc = detour(&|| call(fd), |real| {
        ops::redirect(fd, real, &mut |k| call(k))
    });
    if rc == 0 && level == libc::SOL_SOCKET && name == libc::SO_ZEROCOPY {
        // SAFETY: setsockopt's contract: `val` holds `len` readable bytes; an int is read only
        // when it has room for one.
        let value = (!val.is_null() && len as usize >= size_of::<c_int>())
            .then(|| unsafe { val.cast::<c_int>().read_unaligned() });
        let errno = sys::errno();
        let _ = guarded(|| ops::zero_copy_set(fd, value));
        sys::set_errno(errno);
    }
    rc
}

/// The `atexit` handler: writes the stats file.
extern "C" fn on_exit() {
    let _ = guarded(ops::at_exit);
}

/// The `pthread_atfork` child handler: counters reset.
unsafe extern "C" fn on_fork_child() {
    let _ = catch_unwind(ops::at_fork_child);
}

/// The ELF constructor: resolves the originals and nothing else (no env, no dlopen, no file).
extern "C" fn init() {
    real::resolve_all();
}

/// The ELF destructor: a fallback for the stats file when the atexit handler did not run.
extern "C" fn fini() {
    on_exit();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = fini;
