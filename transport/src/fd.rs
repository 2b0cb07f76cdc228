//! Small safe operations on the kernel fds the engine drives (through `nix`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, Shutdown, getsockopt, recv, send, setsockopt, shutdown, sockopt};

pub(crate) fn to_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Sets `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(to_io)?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(to_io)?;
    Ok(())
}

/// Sets the status flags to `O_NONBLOCK` alone, in one call ([`set_nonblocking`] reads them
/// first): for a socket made just now (its flags are `O_RDWR` alone), or one the engine owns
/// alone (its `O_ASYNC` goes too: the app's signals come from its own end, which carries its
/// `O_ASYNC`).
pub fn set_only_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(to_io)?;
    Ok(())
}

/// `shutdown(how)`; errors ignored (the socket may be gone already).
pub fn shutdown_quietly(fd: BorrowedFd<'_>, how: std::net::Shutdown) {
    let how = match how {
        std::net::Shutdown::Read => Shutdown::Read,
        std::net::Shutdown::Write => Shutdown::Write,
        std::net::Shutdown::Both => Shutdown::Both,
    };
    let _ = shutdown(fd.as_raw_fd(), how);
}

/// Makes the next close of a TCP socket send an RST (`SO_LINGER` 0), and shuts it down so
/// every copy of the descriptor sees it.
pub fn reset(fd: BorrowedFd<'_>) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(&fd, sockopt::Linger, &linger);
}

/// Sets whether the next close of a TCP socket sends an RST (`SO_LINGER` on with 0 s) or a FIN
/// (`SO_LINGER` off; never a lingering close, which would block its closer).
pub fn set_reset_on_close(fd: BorrowedFd<'_>, reset: bool) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: i32::from(reset),
        l_linger: 0,
    };
    setsockopt(&fd, sockopt::Linger, &linger).map_err(to_io)
}

/// Whether the next close of a TCP socket sends an RST ([`set_reset_on_close`]).
pub fn resets_on_close(fd: BorrowedFd<'_>) -> bool {
    getsockopt(&fd, sockopt::Linger).is_ok_and(|l| l.l_onoff != 0 && l.l_linger == 0)
}

/// Whether a close of the socket waits for its unsent bytes (`SO_LINGER {1, N}`, N > 0).
pub fn lingers_gracefully(fd: BorrowedFd<'_>) -> bool {
    getsockopt(&fd, sockopt::Linger).is_ok_and(|l| l.l_onoff != 0 && l.l_linger != 0)
}

/// Takes the socket's pending error (`SO_ERROR`, cleared by the call): a TCP socket reset after
/// its peer's FIN reads EOF, and only says so here. None: no error pending.
pub fn take_error(fd: BorrowedFd<'_>) -> Option<io::Error> {
    match getsockopt(&fd, sockopt::SocketError) {
        Ok(0) => None,
        Ok(e) => Some(io::Error::from_raw_os_error(e)),
        Err(e) => Some(to_io(e)),
    }
}

/// Whether `fd` is a local (`AF_UNIX`) socket, such as a socketpair end.
pub fn is_local_socket(fd: BorrowedFd<'_>) -> bool {
    use nix::sys::socket::SockaddrLike;
    nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd.as_raw_fd())
        .is_ok_and(|a| a.family() == Some(nix::sys::socket::AddressFamily::Unix))
}

/// Whether the other end of a socketpair is closed (both directions hung up), not only shut
/// for writing.
pub fn peer_closed(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = [PollFd::new(fd, PollFlags::empty())];
    poll(&mut pfd, PollTimeout::ZERO).is_ok_and(|_| {
        pfd[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
    })
}

/// Sets `SO_OOBINLINE`: urgent data is read in the stream, not with `MSG_OOB`.
pub fn set_urgent_inline(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt(&fd, sockopt::OobInline, &on).map_err(to_io)
}

/// Whether the next byte to read from stream socket `fd` is the urgent one (`SIOCATMARK`).
pub fn at_mark(fd: BorrowedFd<'_>) -> bool {
    crate::rdma::at_mark(fd.as_raw_fd()).unwrap_or(false)
}

/// Whether stream socket `fd` holds an urgent byte not read yet (`POLLPRI`).
pub fn urgent_pending(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = [PollFd::new(fd, PollFlags::POLLPRI)];
    poll(&mut pfd, PollTimeout::ZERO).is_ok_and(|_| {
        pfd[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLPRI))
    })
}

/// `recv` into `buf` (non-blocking fds: `WouldBlock` when empty).
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd, buf).map_err(to_io)
}

/// `send(MSG_NOSIGNAL)` (a closed peer gives EPIPE, not SIGPIPE).
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    send(fd.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL).map_err(to_io)
}

/// `send(MSG_OOB | MSG_NOSIGNAL)`: the peer gets the last byte of `buf` as urgent data (when
/// the whole of it was sent), the rest as ordinary bytes before it.
pub fn write_urgent(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    send(
        fd.as_raw_fd(),
        buf,
        MsgFlags::MSG_OOB | MsgFlags::MSG_NOSIGNAL,
    )
    .map_err(to_io)
}

/// What a look at a stream socket's receive queue found ([`peek`]).
#[derive(Debug)]
pub enum Peeked {
    /// Open, nothing to read.
    Nothing,
    /// Bytes are waiting.
    Bytes,
    /// The peer half-closed (FIN).
    Fin,
    /// Reset or failed.
    Failed(io::Error),
}

/// Looks at `fd`'s receive queue without taking anything or blocking (one byte,
/// `MSG_PEEK | MSG_DONTWAIT`): how the kept TCP socket of an upgraded connection is watched.
pub fn peek(fd: impl AsFd) -> Peeked {
    let mut probe = [0u8; 1];
    match recv(
        fd.as_fd().as_raw_fd(),
        &mut probe,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => Peeked::Fin,
        Ok(_) => Peeked::Bytes,
        Err(nix::Error::EAGAIN | nix::Error::EINTR) => Peeked::Nothing,
        Err(e) => Peeked::Failed(to_io(e)),
    }
}

/// True when the stream socket `fd` (open for the call) has nothing to read and is not at EOF:
/// a one-byte `MSG_PEEK | MSG_DONTWAIT` says EAGAIN. Any other answer (bytes, EOF, an error,
/// even EINTR) is false.
pub fn holds_nothing(fd: RawFd) -> bool {
    let mut probe = [0u8; 1];
    matches!(
        recv(fd, &mut probe, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
        Err(nix::Error::EAGAIN)
    )
}

/// True when the app may still send on the stream socket `fd` (open for the call): a
/// zero-length `send(MSG_DONTWAIT | MSG_NOSIGNAL)` succeeds. After a `shutdown(SHUT_WR)` of
/// its own, or of the peer's reading side, it says EPIPE (and no signal is raised).
pub fn may_send(fd: RawFd) -> bool {
    send(fd, &[], MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL).is_ok()
}

/// True for errors that mean "try again later".
pub fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn peek_sees_bytes_fin_and_nothing_without_taking_them() {
        let (a, mut b) = UnixStream::pair().unwrap();
        assert!(matches!(peek(&a), Peeked::Nothing));
        b.write_all(b"x").unwrap();
        assert!(matches!(peek(&a), Peeked::Bytes));
        assert!(matches!(peek(&a), Peeked::Bytes), "nothing was taken");
        let mut buf = [0u8; 4];
        set_nonblocking(a.as_fd()).unwrap();
        assert_eq!(read(a.as_fd(), &mut buf).unwrap(), 1);
        assert!(transient(&read(a.as_fd(), &mut buf).unwrap_err()));
        drop(b);
        assert!(matches!(peek(&a), Peeked::Fin));
        assert!(write(a.as_fd(), b"y").is_err(), "EPIPE, no SIGPIPE");
    }

    #[test]
    fn may_send_until_either_side_shuts_the_direction() {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(may_send(a.as_raw_fd()));
        shutdown_quietly(b.as_fd(), std::net::Shutdown::Read);
        assert!(!may_send(a.as_raw_fd()), "the peer reads no more");
        let (c, _d) = UnixStream::pair().unwrap();
        shutdown_quietly(c.as_fd(), std::net::Shutdown::Write);
        assert!(!may_send(c.as_raw_fd()), "shut for writing");
    }
}
