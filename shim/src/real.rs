//! The table of original libc functions, resolved with `dlsym(RTLD_NEXT, ..)`.
//!
//! [`resolve_all`] runs once from the library's ELF constructor (`.init_array`), before any
//! hook can be called by the program: calling `dlsym` lazily inside a hook has deadlocked real
//! preloads (dlsym -> calloc -> allocator init lock). A hook that runs earlier still (another
//! preloaded library's constructor calling `socket()`) resolves its one entry on the spot.
//!
//! Every hook has one `originals!` line here.

// `unsafe` here: `dlsym` and the conversion of its address to a typed function pointer; the
// rest of the shim calls the originals through the typed getters below.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{c_int, sockaddr, socklen_t};

/// `int socket(int, int, int)`.
pub type SocketFn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
/// `int connect(int, const struct sockaddr *, socklen_t)`.
pub type ConnectFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
/// `int listen(int, int)`.
pub type ListenFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
/// `int accept(int, struct sockaddr *, socklen_t *)`.
pub type AcceptFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
/// `int accept4(int, struct sockaddr *, socklen_t *, int)`.
pub type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
/// `int close(int)`.
pub type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
/// `int getpeername(int, struct sockaddr *, socklen_t *)` (and getsockname).
pub type NameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
/// `int getsockopt(int, int, int, void *, socklen_t *)`.
pub type GetsockoptFn =
    unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
/// `int setsockopt(int, int, int, const void *, socklen_t)`.
pub type SetsockoptFn =
    unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;

/// `int dup(int)`.
pub type DupFn = unsafe extern "C" fn(c_int) -> c_int;
/// `int dup2(int, int)`.
pub type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
/// `int dup3(int, int, int)`.
pub type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
/// `int fcntl(int, int, ...)` (and fcntl64): called variadically, as C callers do.
pub type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
/// `int epoll_ctl(int, int, int, struct epoll_event *)`.
pub type EpollCtlFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;

/// `ssize_t read(int, void *, size_t)`.
pub type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
/// `ssize_t recv(int, void *, size_t, int)`.
pub type RecvFn = unsafe extern "C" fn(c_int, *mut c_void, usize, c_int) -> isize;
/// `ssize_t recvfrom(int, void *, size_t, int, struct sockaddr *, socklen_t *)`.
pub type RecvfromFn =
    unsafe extern "C" fn(c_int, *mut c_void, usize, c_int, *mut sockaddr, *mut socklen_t) -> isize;

/// `ssize_t write(int, const void *, size_t)`.
pub type WriteFn = unsafe extern "C" fn(c_int, *const c_void, usize) -> isize;
/// `ssize_t send(int, const void *, size_t, int)`.
pub type SendFn = unsafe extern "C" fn(c_int, *const c_void, usize, c_int) -> isize;
/// `ssize_t sendto(int, const void *, size_t, int, const struct sockaddr *, socklen_t)`.
pub type SendtoFn =
    unsafe extern "C" fn(c_int, *const c_void, usize, c_int, *const sockaddr, socklen_t) -> isize;

/// `int ioctl(int, unsigned long, ...)`, called with its one argument.
pub type IoctlFn = unsafe extern "C" fn(c_int, libc::c_ulong, *mut c_void) -> c_int;

/// `ssize_t recvmsg(int, struct msghdr *, int)`.
pub type RecvmsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> isize;

/// `ssize_t sendmsg(int, const struct msghdr *, int)`.
pub type SendmsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> isize;

/// `ssize_t writev(int, const struct iovec *, int)`.
pub type WritevFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
/// `int sendmmsg(int, struct mmsghdr *, unsigned int, int)`.
pub type SendmmsgFn = unsafe extern "C" fn(c_int, *mut libc::mmsghdr, libc::c_uint, c_int) -> c_int;
/// `ssize_t sendfile(int, int, off_t *, size_t)` (and sendfile64: off_t is 64 bits here).
pub type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut libc::off_t, usize) -> isize;
/// `ssize_t splice(int, loff_t *, int, loff_t *, size_t, unsigned int)`.
pub type SpliceFn = unsafe extern "C" fn(
    c_int,
    *mut libc::loff_t,
    c_int,
    *mut libc::loff_t,
    usize,
    libc::c_uint,
) -> isize;

/// `int poll(struct pollfd *, nfds_t, int)`.
pub type PollFn = unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
/// `int ppoll(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *)`.
pub type PpollFn = unsafe extern "C" fn(
    *mut libc::pollfd,
    libc::nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
/// `int select(int, fd_set *, fd_set *, fd_set *, struct timeval *)`.
pub type SelectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::timeval,
) -> c_int;
/// `int pselect(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *)`.
pub type PselectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
/// `int epoll_wait(int, struct epoll_event *, int, int)`.
pub type EpollWaitFn = unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
/// `int epoll_pwait(int, struct epoll_event *, int, int, const sigset_t *)`.
pub type EpollPwaitFn = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    c_int,
    *const libc::sigset_t,
) -> c_int;
/// `int epoll_pwait2(int, struct epoll_event *, int, const struct timespec *, const sigset_t *)`.
pub type EpollPwait2Fn = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

/// Looks `name` up in the objects after this one and caches the address in `slot`.
fn resolve(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NEXT is a valid pseudo-handle inside a shared object and `name` is
    // NUL-terminated. dlsym may allocate; it is only called from the constructor (or, in the
    // rare early case, from a hook before the constructor ran).
    let addr = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    slot.store(addr, Ordering::Release);
    addr
}

macro_rules! originals {
    ($($slot:ident, $getter:ident, $sym:literal, $ty:ty;)*) => {
        $(
            static $slot: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

            /// The original function, or None if no later object defines it.
            #[inline]
            pub fn $getter() -> Option<$ty> {
                let mut addr = $slot.load(Ordering::Acquire);
                if addr.is_null() {
                    addr = resolve(&$slot, $sym);
                }
                if addr.is_null() {
                    return None;
                }
                // SAFETY: `addr` is libc's function of this name, whose C signature `$ty`
                // spells out; data and function pointers have the same representation on
                // Linux.
                Some(unsafe { std::mem::transmute::<*mut c_void, $ty>(addr) })
            }
        )*

        /// Resolves every original (the constructor's only work).
        pub fn resolve_all() {
            $( resolve(&$slot, $sym); )*
        }
    };
}

originals! {
    SOCKET, socket, c"socket", SocketFn;
    CONNECT, connect, c"connect", ConnectFn;
    LISTEN, listen, c"listen", ListenFn;
    ACCEPT, accept, c"accept", AcceptFn;
    ACCEPT4, accept4, c"accept4", Accept4Fn;
    CLOSE, close, c"close", CloseFn;
    GETPEERNAME, getpeername, c"getpeername", NameFn;
    GETSOCKNAME, getsockname, c"getsockname", NameFn;
    GETSOCKOPT, getsockopt, c"getsockopt", GetsockoptFn;
    SETSOCKOPT, setsockopt, c"setsockopt", SetsockoptFn;
    DUP, dup, c"dup", DupFn;
    DUP2, dup2, c"dup2", Dup2Fn;
    DUP3, dup3, c"dup3", Dup3Fn;
    FCNTL, fcntl, c"fcntl", FcntlFn;
    FCNTL64, fcntl64, c"fcntl64", FcntlFn;
    EPOLL_CTL, epoll_ctl, c"epoll_ctl", EpollCtlFn;
    READ, read, c"read", ReadFn;
    RECV, recv, c"recv", RecvFn;
    RECVFROM, recvfrom, c"recvfrom", RecvfromFn;
    WRITE, write, c"write", WriteFn;
    SEND, send, c"send", SendFn;
    SENDTO, sendto, c"sendto", SendtoFn;
    RECVMSG, recvmsg, c"recvmsg", RecvmsgFn;
    SENDMSG, sendmsg, c"sendmsg", SendmsgFn;
    WRITEV, writev, c"writev", WritevFn;
    SENDMMSG, sendmmsg, c"sendmmsg", SendmmsgFn;
    SENDFILE, sendfile, c"sendfile", SendfileFn;
    SENDFILE64, sendfile64, c"sendfile64", SendfileFn;
    SPLICE, splice, c"splice", SpliceFn;
    IOCTL, ioctl, c"ioctl", IoctlFn;
    POLL, poll, c"poll", PollFn;
    PPOLL, ppoll, c"ppoll", PpollFn;
    SELECT, select, c"select", SelectFn;
    PSELECT, pselect, c"pselect", PselectFn;
    EPOLL_WAIT, epoll_wait, c"epoll_wait", EpollWaitFn;
    EPOLL_PWAIT, epoll_pwait, c"epoll_pwait", EpollPwaitFn;
    EPOLL_PWAIT2, epoll_pwait2, c"epoll_pwait2", EpollPwait2Fn;
}
