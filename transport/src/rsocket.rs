//! [`RSocket`]: an owned rsocket with a `std::net`-like API.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::poll::{Events, PollFd, poll};
use crate::provider::Provider;
use crate::sockaddr::RawSockAddr;

/// rsocket's own option level (`SOL_RDMA`).
pub const SOL_RDMA: c_int = 0x10000;

/// How long a blocking call waits in `rpoll` before retrying a provider that said `EAGAIN`.
/// Short enough that a provider whose `rpoll` misses a wake-up costs at most this much.
const RETRY_TICK: Duration = Duration::from_millis(100);

/// An address family rsockets support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// The family of `addr`.
    pub fn of(addr: &SocketAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    fn raw(self) -> c_int {
        match self {
            Family::V4 => libc::AF_INET,
            Family::V6 => libc::AF_INET6,
        }
    }
}

/// rsocket tuning options at level [`SOL_RDMA`]; set them before connecting or listening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RdmaOption {
    /// `RDMA_SQSIZE`: send queue depth.
    SqSize,
    /// `RDMA_RQSIZE`: receive queue depth.
    RqSize,
    /// `RDMA_INLINE`: largest send that is copied inline into the work request.
    Inline,
    /// `RDMA_IOMAPSIZE`: direct-placement map size.
    IomapSize,
}

impl RdmaOption {
    fn raw(self) -> c_int {
        match self {
            RdmaOption::SqSize => 0,
            RdmaOption::RqSize => 1,
            RdmaOption::Inline => 2,
            RdmaOption::IomapSize => 3,
        }
    }
}

/// What went wrong setting up an rsocket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RSocketError {
    /// `rsocket()` failed (`ENODEV`: no RDMA device; `ENOMEM`: memlock limit).
    #[error("rsocket() failed")]
    Create(#[source] io::Error),
    /// `rbind` failed.
    #[error("rbind to {addr} failed")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The provider's error.
        #[source]
        source: io::Error,
    },
    /// `rlisten` failed.
    #[error("rlisten failed")]
    Listen(#[source] io::Error),
    /// `raccept` failed.
    #[error("raccept failed")]
    Accept(#[source] io::Error),
    /// `rconnect` failed (`ECONNREFUSED`: no rsocket listener there).
    #[error("rconnect to {addr} failed")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The provider's error.
        #[source]
        source: io::Error,
    },
    /// `rconnect` did not complete in time.
    #[error("rconnect to {addr} did not complete within {timeout:?}")]
    ConnectTimeout {
        /// The address.
        addr: SocketAddr,
        /// The time allowed.
        timeout: Duration,
    },
    /// Switching the socket's blocking mode around the connect failed.
    #[error("rfcntl on the rsocket failed")]
    Mode(#[source] io::Error),
}

impl RSocketError {
    /// The `errno` behind the error (`ETIMEDOUT` for [`RSocketError::ConnectTimeout`]), for
    /// mapping to fallback reasons (`ECONNREFUSED` -> peer not shimmed, `ENOMEM` -> memlock).
    pub fn errno(&self) -> Option<i32> {
        match self {
            RSocketError::Create(e)
            | RSocketError::Listen(e)
            | RSocketError::Accept(e)
            | RSocketError::Mode(e)
            | RSocketError::Bind { source: e, .. }
            | RSocketError::Connect { source: e, .. } => e.raw_os_error(),
            RSocketError::ConnectTimeout { .. } => Some(libc::ETIMEDOUT),
        }
    }
}

impl From<RSocketError> for io::Error {
    fn from(e: RSocketError) -> io::Error {
        match e.errno() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::other(e),
        }
    }
}

/// An owned rsocket: closed with `rclose` when dropped.
///
/// Thread-safe like a kernel socket: one thread may read while another writes. Blocking
/// calls stay blocking even when the provider answers `EAGAIN` on a blocking socket (they wait
/// in `rpoll` and retry), so a hostile or buggy provider cannot turn them into spurious
/// `WouldBlock` errors.
pub struct RSocket {
    fd: c_int,
    provider: Provider,
    nonblocking: AtomicBool,
}

impl fmt::Debug for RSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RSocket")
            .field("fd", &self.fd)
            .field("provider", &self.provider.name())
            .field("nonblocking", &self.is_nonblocking())
            .finish()
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        // Nothing useful can be done about a failing close of a socket we own.
        let _ = self.provider.close(self.fd);
    }
}

impl RSocket {
    /// A new, blocking, unconnected stream rsocket.
    pub fn new(provider: &Provider, family: Family) -> Result<RSocket, RSocketError> {
        let fd = provider
            .socket(family.raw(), libc::SOCK_STREAM, 0)
            .map_err(RSocketError::Create)?;
        Ok(RSocket::from_parts(fd, provider.clone(), false))
    }

    fn from_parts(fd: c_int, provider: Provider, nonblocking: bool) -> RSocket {
        RSocket {
            fd,
            provider,
            nonblocking: AtomicBool::new(nonblocking),
        }
    }

    /// A new rsocket connected to `addr` within `timeout` (blocking afterwards).
    pub fn connect_to(
        provider: &Provider,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<RSocket, RSocketError> {
        let socket = RSocket::new(provider, Family::of(&addr))?;
        socket.connect(addr, timeout)?;
        Ok(socket)
    }

    /// A new rsocket bound to `addr` and listening.
    pub fn listen_on(
        provider: &Provider,
        addr: SocketAddr,
        backlog: i32,
    ) -> Result<RSocket, RSocketError> {
        let socket = RSocket::new(provider, Family::of(&addr))?;
        socket.bind(addr)?;
        socket.listen(backlog)?;
        Ok(socket)
    }

    /// Binds to `addr` (port 0: the provider picks one; see [`RSocket::local_addr`]).
    pub fn bind(&self, addr: SocketAddr) -> Result<(), RSocketError> {
        self.provider
            .bind(self.fd, &RawSockAddr::from_addr(addr))
            .map_err(|source| RSocketError::Bind { addr, source })
    }

    /// Starts listening.
    pub fn listen(&self, backlog: i32) -> Result<(), RSocketError> {
        self.provider
            .listen(self.fd, backlog)
            .map_err(RSocketError::Listen)
    }

    /// Accepts a connection: the new rsocket and its peer's address. Blocks unless the
    /// listener is non-blocking (then `WouldBlock` when none is pending).
    pub fn accept(&self) -> Result<(RSocket, SocketAddr), RSocketError> {
        loop {
            match self.provider.accept(self.fd) {
                Ok((fd, raw)) => {
                    // Accepted rsockets are blocking since rdma-core 2019; ask rather than
                    // assume, older providers let them inherit the listener's flag.
                    let nonblocking = self
                        .provider
                        .get_fl(fd)
                        .is_ok_and(|fl| fl & libc::O_NONBLOCK != 0);
                    let socket = RSocket::from_parts(fd, self.provider.clone(), nonblocking);
                    let peer = raw.to_addr().map_err(RSocketError::Accept)?;
                    return Ok((socket, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(RSocketError::Accept(e)),
            }
        }
    }

    /// Connects to `addr`, giving up after `timeout`.
    ///
    /// The connect itself always runs non-blocking (`rconnect`, then `rpoll` for `POLLOUT`,
    /// then `SO_ERROR`), so the timeout holds whatever the provider does; afterwards the
    /// socket is back in the blocking mode it had before (call
    /// [`set_nonblocking`](RSocket::set_nonblocking) first to keep it non-blocking). After an
    /// error or timeout the socket is unusable: drop it.
    pub fn connect(&self, addr: SocketAddr, timeout: Duration) -> Result<(), RSocketError> {
        let was_nonblocking = self.is_nonblocking();
        if !was_nonblocking {
            self.set_nonblocking(true).map_err(RSocketError::Mode)?;
        }
        let result = self.connect_nonblocking(addr, timeout);
        if !was_nonblocking {
            let restored = self.set_nonblocking(false).map_err(RSocketError::Mode);
            result?;
            return restored;
        }
        result
    }

    fn connect_nonblocking(&self, addr: SocketAddr, timeout: Duration) -> Result<(), RSocketError> {
        let deadline = Instant::now() + timeout;
        let connect_error = |source| RSocketError::Connect { addr, source };
        match self
            .provider
            .connect(self.fd, &RawSockAddr::from_addr(addr))
        {
            Ok(()) => return Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINPROGRESS | libc::EALREADY | libc::EINTR)
                ) => {}
            Err(e) => return Err(connect_error(e)),
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(RSocketError::ConnectTimeout { addr, timeout });
            }
            let mut fds = [PollFd::rsocket(self, Events::WRITABLE)];
            poll(
                &self.provider,
                &mut fds,
                Some((deadline - now).min(RETRY_TICK)),
            )
            .map_err(|e| connect_error(e.into()))?;
            let ready = fds[0].revents();
            if ready.contains(Events::INVALID) {
                return Err(connect_error(io::Error::from_raw_os_error(libc::EBADF)));
            }
            if ready.intersects(Events::WRITABLE | Events::ERROR | Events::HANGUP) {
                return match self.take_error() {
                    Ok(None) => Ok(()),
                    Ok(Some(e)) | Err(e) => Err(connect_error(e)),
                };
            }
        }
    }

    /// Waits up to `timeout` for `events` on this socket.
    fn wait(&self, events: Events, timeout: Duration) -> io::Result<()> {
        let mut fds = [PollFd::rsocket(self, events)];
        poll(&self.provider, &mut fds, Some(timeout))?;
        Ok(())
    }

    /// Retries `op` on `EINTR`, and on `EAGAIN` too when the socket is blocking.
    fn retry<T>(&self, events: Events, mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.is_nonblocking() => {
                    self.wait(events, RETRY_TICK)?;
                }
                result => return result,
            }
        }
    }

    /// Reads into `buf`; `Ok(0)` is end of stream.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.retry(Events::READABLE, || self.provider.recv(self.fd, buf, 0))
    }

    /// Writes some of `buf`.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.retry(Events::WRITABLE, || self.provider.send(self.fd, buf, 0))
    }

    /// Reads into several buffers, in order.
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.retry(Events::READABLE, || self.provider.readv(self.fd, bufs))
    }

    /// Writes from several buffers, in order.
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.retry(Events::WRITABLE, || self.provider.writev(self.fd, bufs))
    }

    /// Writes all of `buf`, waiting in `rpoll` whenever the provider says `EAGAIN`, even on a
    /// non-blocking socket.
    pub fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(Events::WRITABLE, RETRY_TICK)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Shuts down reading, writing or both (`rshutdown`).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        self.provider.shutdown(self.fd, how)
    }

    /// Switches `O_NONBLOCK` (`rfcntl`).
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let flags = self.provider.get_fl(self.fd)?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        self.provider.set_fl(self.fd, flags)?;
        self.nonblocking.store(on, Ordering::Release);
        Ok(())
    }

    /// Whether the socket is in non-blocking mode.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Acquire)
    }

    /// The local address (rsocket port space).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.provider.sockname(self.fd)?.to_addr()
    }

    /// The peer's address (rsocket port space).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.provider.peername(self.fd)?.to_addr()
    }

    /// `IPV6_V6ONLY` (rsockets map it to RDMA CM's AFONLY option); set it before binding.
    pub fn set_only_v6(&self, on: bool) -> io::Result<()> {
        self.provider.set_int_opt(
            self.fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            c_int::from(on),
        )
    }

    /// `TCP_NODELAY` (accepted by rsockets).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.provider.set_int_opt(
            self.fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            c_int::from(on),
        )
    }

    /// `SO_SNDBUF`/`SO_RCVBUF`: for rsockets these size the registered RDMA buffers, so set
    /// them before connecting or listening.
    pub fn set_buffer_sizes(&self, send: usize, recv: usize) -> io::Result<()> {
        let size =
            |n: usize| c_int::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
        self.provider
            .set_int_opt(self.fd, libc::SOL_SOCKET, libc::SO_SNDBUF, size(send)?)?;
        self.provider
            .set_int_opt(self.fd, libc::SOL_SOCKET, libc::SO_RCVBUF, size(recv)?)
    }

    /// Sets an rsocket tuning option ([`SOL_RDMA`] level).
    pub fn set_rdma_option(&self, option: RdmaOption, value: i32) -> io::Result<()> {
        self.provider
            .set_int_opt(self.fd, SOL_RDMA, option.raw(), value)
    }

    /// Reads an rsocket tuning option ([`SOL_RDMA`] level).
    pub fn rdma_option(&self, option: RdmaOption) -> io::Result<i32> {
        self.provider.int_opt(self.fd, SOL_RDMA, option.raw())
    }

    /// Takes the pending error (`SO_ERROR`), if any.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        let code = self
            .provider
            .int_opt(self.fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
        Ok((code != 0).then(|| io::Error::from_raw_os_error(code)))
    }

    /// The rsocket number. Not a kernel fd: only the provider's functions accept it.
    pub fn raw(&self) -> c_int {
        self.fd
    }

    /// The provider this socket belongs to.
    pub fn provider(&self) -> &Provider {
        &self.provider
    }
}

impl Read for &RSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        RSocket::read(self, buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        RSocket::read_vectored(self, bufs)
    }
}

impl Read for RSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        RSocket::read(self, buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        RSocket::read_vectored(self, bufs)
    }
}

impl Write for &RSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        RSocket::write(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        RSocket::write_vectored(self, bufs)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        RSocket::write_all(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for RSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        RSocket::write(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        RSocket::write_vectored(self, bufs)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        RSocket::write_all(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
