//! Loading an rsocket provider at run time, and the thin calls into it.
//!
//! The provider is librdmacm (`librdmacm.so.1`) or any library with its rsocket ABI, such as
//! the test double `libfakersocket.so`. It is opened with `dlopen(RTLD_NOW | RTLD_LOCAL)` and
//! every function bound by name with `dlsym`: nothing links against rdma-core, so a binary
//! using this crate starts in an image without it.
//!
//! This module is the crate's only `unsafe` code (hence the module-level `allow`, overriding
//! the workspace's `unsafe_code = "deny"`): `dlopen`/`dlsym`, and one small wrapper per
//! provider function that passes Rust slices and buffers as C pointers. Everything above it
//! ([`crate::rsocket`], [`mod@crate::poll`], [`mod@crate::pump`]) is safe Rust.
//!
//! A loaded library is never `dlclose`d: librdmacm keeps internal threads and state for the
//! life of the process, and [`Provider`] handles are cheap clones of one shared binding.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::io;
use std::sync::Arc;

use libc::{
    c_int, fd_set, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval,
};

use crate::poll::PollFd;
use crate::sockaddr::RawSockAddr;

/// Env var naming the provider library (a soname or a path).
pub const ENV_PROVIDER: &str = "STREAMSHIM_PROVIDER";
/// The provider used when [`ENV_PROVIDER`] is unset or empty.
pub const DEFAULT_PROVIDER: &str = "librdmacm.so.1";

/// `int rsocket(int domain, int type, int protocol)`.
pub type RsocketFn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
/// `int rbind(int s, const struct sockaddr *addr, socklen_t len)`, also `rconnect`.
pub type RbindFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
/// `int rlisten(int s, int backlog)`, also `rshutdown(int s, int how)`.
pub type RlistenFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
/// `int raccept(int s, struct sockaddr *addr, socklen_t *len)`, also `rgetpeername` and
/// `rgetsockname`.
pub type RacceptFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
/// `int rclose(int s)`.
pub type RcloseFn = unsafe extern "C" fn(c_int) -> c_int;
/// `ssize_t rrecv(int s, void *buf, size_t len, int flags)`.
pub type RrecvFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
/// `ssize_t rrecvfrom(int s, void *buf, size_t len, int flags, struct sockaddr *src,
/// socklen_t *len)`.
pub type RrecvfromFn = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    size_t,
    c_int,
    *mut sockaddr,
    *mut socklen_t,
) -> ssize_t;
/// `ssize_t rrecvmsg(int s, struct msghdr *msg, int flags)`.
pub type RrecvmsgFn = unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;
/// `ssize_t rsend(int s, const void *buf, size_t len, int flags)`.
pub type RsendFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
/// `ssize_t rsendto(int s, const void *buf, size_t len, int flags, const struct sockaddr *dst,
/// socklen_t len)`.
pub type RsendtoFn = unsafe extern "C" fn(
    c_int,
    *const c_void,
    size_t,
    c_int,
    *const sockaddr,
    socklen_t,
) -> ssize_t;
/// `ssize_t rsendmsg(int s, const struct msghdr *msg, int flags)`.
pub type RsendmsgFn = unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t;
/// `ssize_t rread(int s, void *buf, size_t count)`.
pub type RreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
/// `ssize_t rwrite(int s, const void *buf, size_t count)`.
pub type RwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
/// `ssize_t rreadv(int s, const struct iovec *iov, int iovcnt)`, also `rwritev`.
pub type RiovFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
/// `int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)`.
pub type RpollFn = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;
/// `int rselect(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *timeout)`.
pub type RselectFn =
    unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
/// `int rsetsockopt(int s, int level, int name, const void *val, socklen_t len)`.
pub type RsetsockoptFn =
    unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
/// `int rgetsockopt(int s, int level, int name, void *val, socklen_t *len)`.
pub type RgetsockoptFn =
    unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
/// `int rfcntl(int s, int cmd, ...)`: called as the C-variadic function it is.
pub type RfcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;

/// Every rsocket function of the provider, bound by name. Calling them is `unsafe` (raw
/// pointers, r-fd ownership); the safe API is [`crate::RSocket`] and [`crate::poll()`]. These are
/// public for a future direct mode of the shim, whose hooks forward app calls verbatim.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct RawFns {
    pub rsocket: RsocketFn,
    pub rbind: RbindFn,
    pub rlisten: RlistenFn,
    pub raccept: RacceptFn,
    pub rconnect: RbindFn,
    pub rshutdown: RlistenFn,
    pub rclose: RcloseFn,
    pub rrecv: RrecvFn,
    pub rrecvfrom: RrecvfromFn,
    pub rrecvmsg: RrecvmsgFn,
    pub rsend: RsendFn,
    pub rsendto: RsendtoFn,
    pub rsendmsg: RsendmsgFn,
    pub rread: RreadFn,
    pub rwrite: RwriteFn,
    pub rreadv: RiovFn,
    pub rwritev: RiovFn,
    pub rpoll: RpollFn,
    pub rselect: RselectFn,
    pub rgetpeername: RacceptFn,
    pub rgetsockname: RacceptFn,
    pub rsetsockopt: RsetsockoptFn,
    pub rgetsockopt: RgetsockoptFn,
    pub rfcntl: RfcntlFn,
}

/// Why a provider could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The name contains a NUL byte, so it cannot be passed to `dlopen`.
    #[error("rsocket provider name {name:?} contains a NUL byte")]
    InvalidName {
        /// The name as given.
        name: String,
    },
    /// `dlopen` failed: not found, wrong architecture, or a dependency is missing.
    #[error("cannot load rsocket provider {name:?}: {reason}")]
    Open {
        /// The name or path given to `dlopen`.
        name: String,
        /// `dlerror()`'s message.
        reason: String,
    },
    /// The library loaded but lacks a required rsocket function.
    #[error("rsocket provider {name:?} has no `{symbol}` function")]
    MissingSymbol {
        /// The name or path of the library.
        name: String,
        /// The first required symbol that was not found.
        symbol: &'static str,
    },
}

/// The provider loaded, but no RDMA device is usable: `rsocket(AF_INET, SOCK_STREAM, 0)`
/// failed (librdmacm answers `ENODEV` on a machine without RDMA).
#[derive(Debug, thiserror::Error)]
#[error("no usable RDMA device: rsocket() failed")]
pub struct NoDevice {
    /// The error `rsocket()` reported.
    #[source]
    pub source: io::Error,
}

impl NoDevice {
    /// The `errno` `rsocket()` failed with, if any.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// A loaded rsocket provider. Cloning is cheap (a shared binding); the library stays loaded
/// for the life of the process.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    fns: RawFns,
    has_repoll: bool,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.inner.name)
            .field("has_repoll", &self.inner.has_repoll)
            .finish_non_exhaustive()
    }
}

/// The provider name to load given the value of [`ENV_PROVIDER`] (unset or empty: the default).
pub fn provider_name(env_value: Option<&str>) -> &str {
    match env_value {
        Some(v) if !v.trim().is_empty() => v.trim(),
        _ => DEFAULT_PROVIDER,
    }
}

/// The latest `dlerror()` message.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libdl (thread-local in
    // glibc), valid until the next dl* call on this thread; we copy it out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return String::from("unknown dlopen error");
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// A symbol's address in `handle`, or None.
fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is a live dlopen handle (never closed) and `name` is NUL-terminated.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!address.is_null()).then_some(address)
}

/// The address of a required symbol, or the error naming it.
fn required(
    handle: *mut c_void,
    lib: &str,
    name: &'static CStr,
) -> Result<*mut c_void, ProviderError> {
    symbol(handle, name).ok_or_else(|| ProviderError::MissingSymbol {
        name: lib.to_owned(),
        symbol: name.to_str().unwrap_or("?"),
    })
}

/// Binds one required function as the function pointer type `$ty`.
macro_rules! bind {
    ($handle:expr, $lib:expr, $name:literal as $ty:ty) => {{
        let address = required($handle, $lib, $name)?;
        // SAFETY: the symbol is the provider's function of this name, whose C signature is the
        // rsocket ABI that `$ty` spells out; data and function pointers have the same size and
        // representation on the supported (Linux) targets.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(address) }
    }};
}

/// Binds every required rsocket function of `handle` (loaded from `lib`).
fn bind_all(handle: *mut c_void, lib: &str) -> Result<RawFns, ProviderError> {
    Ok(RawFns {
        rsocket: bind!(handle, lib, c"rsocket" as RsocketFn),
        rbind: bind!(handle, lib, c"rbind" as RbindFn),
        rlisten: bind!(handle, lib, c"rlisten" as RlistenFn),
        raccept: bind!(handle, lib, c"raccept" as RacceptFn),
        rconnect: bind!(handle, lib, c"rconnect" as RbindFn),
        rshutdown: bind!(handle, lib, c"rshutdown" as RlistenFn),
        rclose: bind!(handle, lib, c"rclose" as RcloseFn),
        rrecv: bind!(handle, lib, c"rrecv" as RrecvFn),
        rrecvfrom: bind!(handle, lib, c"rrecvfrom" as RrecvfromFn),
        rrecvmsg: bind!(handle, lib, c"rrecvmsg" as RrecvmsgFn),
        rsend: bind!(handle, lib, c"rsend" as RsendFn),
        rsendto: bind!(handle, lib, c"rsendto" as RsendtoFn),
        rsendmsg: bind!(handle, lib, c"rsendmsg" as RsendmsgFn),
        rread: bind!(handle, lib, c"rread" as RreadFn),
        rwrite: bind!(handle, lib, c"rwrite" as RwriteFn),
        rreadv: bind!(handle, lib, c"rreadv" as RiovFn),
        rwritev: bind!(handle, lib, c"rwritev" as RiovFn),
        rpoll: bind!(handle, lib, c"rpoll" as RpollFn),
        rselect: bind!(handle, lib, c"rselect" as RselectFn),
        rgetpeername: bind!(handle, lib, c"rgetpeername" as RacceptFn),
        rgetsockname: bind!(handle, lib, c"rgetsockname" as RacceptFn),
        rsetsockopt: bind!(handle, lib, c"rsetsockopt" as RsetsockoptFn),
        rgetsockopt: bind!(handle, lib, c"rgetsockopt" as RgetsockoptFn),
        rfcntl: bind!(handle, lib, c"rfcntl" as RfcntlFn),
    })
}

impl Provider {
    /// Loads a provider by soname (searched like any `dlopen` name) or path, and binds every
    /// rsocket function. `repoll_*` (rdma-core after v64) are optional.
    pub fn load(name_or_path: &str) -> Result<Provider, ProviderError> {
        let c_name = CString::new(name_or_path).map_err(|_| ProviderError::InvalidName {
            name: name_or_path.to_owned(),
        })?;
        // SAFETY: `c_name` is NUL-terminated. Loading runs the library's constructors, which is
        // what loading a provider means; RTLD_LOCAL keeps its symbols out of the global scope.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(ProviderError::Open {
                name: name_or_path.to_owned(),
                reason: dl_error(),
            });
        }
        let fns = match bind_all(handle, name_or_path) {
            Ok(fns) => fns,
            Err(e) => {
                // SAFETY: nothing from this handle is in use (no function pointer escaped), so
                // unloading the library we just loaded is sound. A failure changes nothing.
                let _ = unsafe { libc::dlclose(handle) };
                return Err(e);
            }
        };
        let has_repoll = [c"repoll_create", c"repoll_ctl", c"repoll_wait"]
            .iter()
            .all(|name| symbol(handle, name).is_some());
        // The handle is deliberately leaked (never dlclose'd): see the module docs.
        Ok(Provider {
            inner: Arc::new(Inner {
                name: name_or_path.to_owned(),
                fns,
                has_repoll,
            }),
        })
    }

    /// Loads the provider named by `STREAMSHIM_PROVIDER`, or `librdmacm.so.1` when unset.
    pub fn from_env() -> Result<Provider, ProviderError> {
        let value = std::env::var(ENV_PROVIDER).ok();
        Provider::load(provider_name(value.as_deref()))
    }

    /// Whether an RDMA device is usable: one `rsocket(AF_INET, SOCK_STREAM, 0)`, closed at
    /// once. Any failure (`ENODEV` without a device, `ENOMEM`, ...) means no device. Decide
    /// once per process and cache the answer; librspreload's per-socket re-probe is the
    /// anti-pattern.
    pub fn probe(&self) -> Result<(), NoDevice> {
        let s = self
            .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
            .map_err(|source| NoDevice { source })?;
        // A failing close of a socket nobody used changes nothing about the device.
        let _ = self.close(s);
        Ok(())
    }

    /// The name or path the provider was loaded from.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True if the provider also exports `repoll_create`/`repoll_ctl`/`repoll_wait` (rdma-core
    /// after v64). They are not bound: nothing here uses them yet.
    pub fn has_repoll(&self) -> bool {
        self.inner.has_repoll
    }

    /// The raw function table, for callers that forward C calls verbatim.
    pub fn raw_fns(&self) -> &RawFns {
        &self.inner.fns
    }

    fn fns(&self) -> &RawFns {
        &self.inner.fns
    }

    // ---- Thin safe wrappers, one per call, used by the rest of the crate. ----
    // None of them touches memory it was not given; an r-fd number that is wrong or closed is
    // the provider's to reject (EBADF), never undefined behaviour on our side.

    pub(crate) fn socket(&self, domain: c_int, ty: c_int, protocol: c_int) -> io::Result<c_int> {
        // SAFETY: no pointers are passed.
        cvt(unsafe { (self.fns().rsocket)(domain, ty, protocol) })
    }

    pub(crate) fn bind(&self, s: c_int, addr: &RawSockAddr) -> io::Result<()> {
        // SAFETY: `addr` holds an initialised, suitably aligned sockaddr of `addr.len()` bytes.
        cvt(unsafe { (self.fns().rbind)(s, addr.as_ptr(), addr.len()) }).map(drop)
    }

    pub(crate) fn listen(&self, s: c_int, backlog: c_int) -> io::Result<()> {
        // SAFETY: no pointers are passed.
        cvt(unsafe { (self.fns().rlisten)(s, backlog) }).map(drop)
    }

    pub(crate) fn accept(&self, s: c_int) -> io::Result<(c_int, RawSockAddr)> {
        let mut addr = RawSockAddr::empty();
        let mut len = addr.capacity();
        // SAFETY: `addr` is writable for `len` bytes; `len` is a valid socklen_t.
        let fd = cvt(unsafe { (self.fns().raccept)(s, addr.as_mut_ptr(), &mut len) })?;
        addr.set_len(len);
        Ok((fd, addr))
    }

    pub(crate) fn connect(&self, s: c_int, addr: &RawSockAddr) -> io::Result<()> {
        // SAFETY: `addr` holds an initialised, suitably aligned sockaddr of `addr.len()` bytes.
        cvt(unsafe { (self.fns().rconnect)(s, addr.as_ptr(), addr.len()) }).map(drop)
    }

    pub(crate) fn shutdown(&self, s: c_int, how: c_int) -> io::Result<()> {
        // SAFETY: no pointers are passed.
        cvt(unsafe { (self.fns().rshutdown)(s, how) }).map(drop)
    }

    pub(crate) fn close(&self, s: c_int) -> io::Result<()> {
        // SAFETY: no pointers are passed.
        cvt(unsafe { (self.fns().rclose)(s) }).map(drop)
    }

    pub(crate) fn recv(&self, s: c_int, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
        // SAFETY: `buf` is writable for `buf.len()` bytes for the duration of the call.
        cvt_size(unsafe { (self.fns().rrecv)(s, buf.as_mut_ptr().cast(), buf.len(), flags) })
    }

    pub(crate) fn send(&self, s: c_int, buf: &[u8], flags: c_int) -> io::Result<usize> {
        // SAFETY: `buf` is readable for `buf.len()` bytes for the duration of the call.
        cvt_size(unsafe { (self.fns().rsend)(s, buf.as_ptr().cast(), buf.len(), flags) })
    }

    pub(crate) fn readv(&self, s: c_int, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        let count = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        // SAFETY: std guarantees IoSliceMut is ABI-compatible with `struct iovec` on Unix; each
        // describes a live, writable buffer borrowed for the call.
        cvt_size(unsafe { (self.fns().rreadv)(s, bufs.as_ptr().cast(), count) })
    }

    pub(crate) fn writev(&self, s: c_int, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let count = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        // SAFETY: std guarantees IoSlice is ABI-compatible with `struct iovec` on Unix; each
        // describes a live, readable buffer borrowed for the call.
        cvt_size(unsafe { (self.fns().rwritev)(s, bufs.as_ptr().cast(), count) })
    }

    pub(crate) fn poll(&self, fds: &mut [PollFd<'_>], timeout_ms: c_int) -> io::Result<usize> {
        let nfds = nfds_t::try_from(fds.len()).unwrap_or(nfds_t::MAX);
        // SAFETY: PollFd is #[repr(transparent)] over `struct pollfd` (plus a zero-sized
        // lifetime marker), so the slice is a valid, exclusively borrowed pollfd array.
        let n = cvt(unsafe {
            (self.fns().rpoll)(fds.as_mut_ptr().cast::<pollfd>(), nfds, timeout_ms)
        })?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    pub(crate) fn sockname(&self, s: c_int) -> io::Result<RawSockAddr> {
        let mut addr = RawSockAddr::empty();
        let mut len = addr.capacity();
        // SAFETY: `addr` is writable for `len` bytes; `len` is a valid socklen_t.
        cvt(unsafe { (self.fns().rgetsockname)(s, addr.as_mut_ptr(), &mut len) })?;
        addr.set_len(len);
        Ok(addr)
    }

    pub(crate) fn peername(&self, s: c_int) -> io::Result<RawSockAddr> {
        let mut addr = RawSockAddr::empty();
        let mut len = addr.capacity();
        // SAFETY: `addr` is writable for `len` bytes; `len` is a valid socklen_t.
        cvt(unsafe { (self.fns().rgetpeername)(s, addr.as_mut_ptr(), &mut len) })?;
        addr.set_len(len);
        Ok(addr)
    }

    pub(crate) fn set_int_opt(
        &self,
        s: c_int,
        level: c_int,
        name: c_int,
        value: c_int,
    ) -> io::Result<()> {
        let len = socklen_t::try_from(size_of::<c_int>()).unwrap_or(4);
        // SAFETY: `value` is a live c_int, readable for `len` bytes.
        cvt(unsafe { (self.fns().rsetsockopt)(s, level, name, (&raw const value).cast(), len) })
            .map(drop)
    }

    pub(crate) fn int_opt(&self, s: c_int, level: c_int, name: c_int) -> io::Result<c_int> {
        let mut value: c_int = 0;
        let mut len = socklen_t::try_from(size_of::<c_int>()).unwrap_or(4);
        // SAFETY: `value` is writable for `len` bytes; `len` is a valid socklen_t.
        cvt(unsafe {
            (self.fns().rgetsockopt)(s, level, name, (&raw mut value).cast(), &mut len)
        })?;
        Ok(value)
    }

    pub(crate) fn get_fl(&self, s: c_int) -> io::Result<c_int> {
        // SAFETY: F_GETFL takes no argument; the variadic call passes none.
        cvt(unsafe { (self.fns().rfcntl)(s, libc::F_GETFL) })
    }

    pub(crate) fn set_fl(&self, s: c_int, flags: c_int) -> io::Result<()> {
        // SAFETY: F_SETFL takes one `int` argument, passed as such through the variadic call.
        cvt(unsafe { (self.fns().rfcntl)(s, libc::F_SETFL, flags) }).map(drop)
    }
}

/// `-1` -> the thread's `errno` as an `io::Error`.
fn cvt(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `-1` -> the thread's `errno` as an `io::Error`; otherwise the byte count.
fn cvt_size(ret: ssize_t) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_name_defaults() {
        assert_eq!(provider_name(None), DEFAULT_PROVIDER);
        assert_eq!(provider_name(Some("")), DEFAULT_PROVIDER);
        assert_eq!(provider_name(Some("  ")), DEFAULT_PROVIDER);
        assert_eq!(provider_name(Some("/x/libfake.so")), "/x/libfake.so");
    }

    #[test]
    fn nul_in_name_is_rejected() {
        assert!(matches!(
            Provider::load("lib\0x.so"),
            Err(ProviderError::InvalidName { .. })
        ));
    }
}
