//! File descriptors passed between the processes of one tree (`SCM_RIGHTS` over `AF_UNIX`
//! `SOCK_SEQPACKET` pairs): how a pre-fork child hands an accepted connection to the listening
//! process's engine and gets the socketpair end back ([`crate::upgrade`]'s delegation).

use std::io;
use std::mem::{size_of, size_of_val};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use libc::c_int;

use super::last_error;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 2;

/// Room for the control message of [`MAX_FDS`] descriptors (`CMSG_SPACE`, 8-byte aligned).
const CONTROL_LEN: usize = 64;

/// A connected `AF_UNIX` `SOCK_SEQPACKET` pair, both ends close-on-exec: one message per
/// request, kept whole, and a peer's close reads as EOF.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    super::socketpair(libc::SOCK_SEQPACKET)
}

/// Sends `data` on the socket `sock` with copies of the open fds `fds` (at most [`MAX_FDS`])
/// as one message, without blocking when `nonblocking` and without `SIGPIPE`. A number that is
/// not open fails the call (`EBADF`); nothing is sent then.
pub fn send(sock: c_int, data: &[u8], fds: &[c_int], nonblocking: bool) -> io::Result<()> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut control = [0u64; CONTROL_LEN / 8];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = u32::try_from(size_of_val(fds)).unwrap_or(0);
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let (space, len) = unsafe { (libc::CMSG_SPACE(payload), libc::CMSG_LEN(payload)) };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = usize::try_from(space)
            .unwrap_or(CONTROL_LEN)
            .min(CONTROL_LEN);
        // SAFETY: `control` holds CONTROL_LEN >= CMSG_SPACE(8) aligned bytes, so the first
        // header and its payload of `fds.len()` ints fit; unaligned writes for the payload.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = usize::try_from(len).unwrap_or(0);
            let out = libc::CMSG_DATA(cmsg).cast::<c_int>();
            for (i, fd) in fds.iter().enumerate() {
                out.add(i).write_unaligned(*fd);
            }
        }
    }
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    loop {
        // SAFETY: `msg` points at `iov` and `control`, both alive for the call.
        let n = unsafe { libc::sendmsg(sock, &raw const msg, flags) };
        if n >= 0 {
            return Ok(());
        }
        let e = last_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One message received: its bytes and the descriptors it carried (close-on-exec, owned).
#[derive(Debug)]
pub struct Received {
    /// Bytes of the message (0: the peer closed).
    pub len: usize,
    /// The descriptors, in order; a message that carried more than [`MAX_FDS`], or whose
    /// control data was cut, is reported with none (every one it carried is closed).
    pub fds: Vec<OwnedFd>,
    /// The message was longer than the buffer (the rest is gone).
    pub truncated: bool,
}

/// Receives one message into `buf`, blocking unless `nonblocking`.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8], nonblocking: bool) -> io::Result<Received> {
    let mut control = [0u64; CONTROL_LEN / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CONTROL_LEN;
    let flags = libc::MSG_CMSG_CLOEXEC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let n = loop {
        // SAFETY: `msg` points at `buf` and `control`, both alive and writable for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, flags) };
        if n >= 0 {
            break usize::try_from(n).unwrap_or(0);
        }
        let e = last_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: recvmsg filled `control` up to msg_controllen with well-formed headers; every fd
    // an SCM_RIGHTS message names is new and ours.
    let mut fds: Vec<OwnedFd> = unsafe { rights(&msg) }
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MAX_FDS {
        fds.clear();
    }
    Ok(Received {
        len: n,
        fds,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
    })
}

/// The descriptors the `SCM_RIGHTS` messages in `msg`'s control data carry.
///
/// # Safety
/// `msg` was filled by a successful `recvmsg`: its control buffer holds `msg_controllen`
/// bytes of well-formed headers.
pub unsafe fn rights(msg: &libc::msghdr) -> Vec<c_int> {
    let mut fds = Vec::new();
    if msg.msg_control.is_null() || msg.msg_controllen == 0 {
        return fds;
    }
    // SAFETY: per the contract, CMSG_FIRSTHDR/NXTHDR walk headers within the control buffer;
    // each SCM_RIGHTS payload is whole ints, read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = (*cmsg).cmsg_len.saturating_sub(header) / size_of::<c_int>();
                let data = libc::CMSG_DATA(cmsg).cast::<c_int>();
                for i in 0..count {
                    fds.push(data.add(i).read_unaligned());
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    fds
}

/// Waits until `fd` is readable (or hung up), at most `bound`; false when it is not by then.
pub fn wait_readable(fd: BorrowedFd<'_>, bound: Duration) -> bool {
    super::poll_within(fd.as_raw_fd(), libc::POLLIN, bound) != 0
}

/// The `sockaddr_un` of the abstract name `name` and its length (no NUL byte at its end:
/// abstract names are counted, not terminated).
fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is a valid empty one.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays 0: the abstract namespace.
    for (to, from) in addr.sun_path[1..].iter_mut().zip(name) {
        *to = *from as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Ok((addr, libc::socklen_t::try_from(len).unwrap_or(0)))
}

/// A fresh `AF_UNIX` `SOCK_SEQPACKET` socket, close-on-exec.
fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `AF_UNIX` `SOCK_SEQPACKET` socket listening (non-blocking, close-on-exec) on the
/// abstract `name`: abstract names belong to the network namespace and go with the socket, so
/// nothing is left behind. `EADDRINUSE` when another socket holds the name.
pub fn listen_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let sock = seqpacket_socket()?;
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a sockaddr_un of `len` meaningful bytes.
    if unsafe { libc::bind(sock.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(last_error());
    }
    // SAFETY: listen(2) on our own socket.
    if unsafe { libc::listen(sock.as_raw_fd(), 16) } != 0 {
        return Err(last_error());
    }
    super::set_nonblocking(sock.as_fd())?;
    Ok(sock)
}

/// Connects a fresh `SOCK_SEQPACKET` socket (close-on-exec) to the abstract `name`; a name
/// nobody listens on fails at once (`ECONNREFUSED`), as does a listener whose backlog is full
/// (`EAGAIN`: the socket is non-blocking for the connect).
pub fn connect_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let sock = seqpacket_socket()?;
    let (addr, len) = abstract_addr(name)?;
    super::set_nonblocking(sock.as_fd())?;
    loop {
        // SAFETY: `addr` is a sockaddr_un of `len` meaningful bytes.
        if unsafe { libc::connect(sock.as_raw_fd(), (&raw const addr).cast(), len) } == 0 {
            return Ok(sock);
        }
        let e = last_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One connection waiting on the non-blocking `listener` (close-on-exec); None: none waits.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    loop {
        // SAFETY: accept4 without an address on a listening socket of ours.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh fd owned by nobody else.
            return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let e = last_error();
        match e.raw_os_error() {
            Some(libc::EINTR | libc::ECONNABORTED) => {}
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// The credentials `SO_PEERCRED` gives for the `AF_UNIX` socket `sock` (of the creator of a
/// socketpair, the listener of a connected socket, the connecting process of an accepted one).
fn peer_cred(sock: c_int) -> Option<libc::ucred> {
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>()).unwrap_or(0);
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which holds that many.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// The process id `SO_PEERCRED` names for `sock`, as this process's pid namespace sees it;
/// None when unknown (0: not visible here).
pub fn peer_pid(sock: c_int) -> Option<libc::pid_t> {
    peer_cred(sock).map(|c| c.pid).filter(|&pid| pid > 0)
}

/// Whether the process `SO_PEERCRED` names for `sock` runs as this process's effective user.
pub fn peer_is_our_user(sock: c_int) -> bool {
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    peer_cred(sock).is_some_and(|c| c.uid == me)
}

/// Waits (at most `bound`; forever when None) until one of `fds` is readable or hung up:
/// which are (all false when none is by then).
pub fn wait_any(fds: &[BorrowedFd<'_>], bound: Option<Duration>) -> Vec<bool> {
    let ms = bound.map_or(-1, |d| {
        c_int::try_from(d.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
    });
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let count = libc::nfds_t::try_from(polled.len()).unwrap_or(0);
    // SAFETY: `polled` holds `count` pollfds for the call.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), count, ms) };
    polled.iter().map(|p| n > 0 && p.revents != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_travel_with_their_message_and_a_close_reads_as_eof() {
        let (a, b) = seqpacket_pair().unwrap();
        let (x, y) = seqpacket_pair().unwrap();
        send(
            a.as_raw_fd(),
            b"\x01",
            &[x.as_raw_fd(), y.as_raw_fd()],
            false,
        )
        .unwrap();
        let mut buf = [0u8; 8];
        let got = recv(b.as_fd(), &mut buf, false).unwrap();
        assert_eq!(
            (got.len, buf[0], got.fds.len(), got.truncated),
            (1, 1, 2, false)
        );
        // The copy of `x` reaches `y`'s peer: a message sent on it arrives at `y`.
        send(got.fds[0].as_raw_fd(), b"\x07", &[], false).unwrap();
        let got2 = recv(y.as_fd(), &mut buf, false).unwrap();
        assert_eq!((got2.len, buf[0], got2.fds.len()), (1, 7, 0));
        assert!(!wait_readable(b.as_fd(), Duration::from_millis(10)));
        drop(a);
        assert!(wait_readable(b.as_fd(), Duration::from_millis(100)));
        assert_eq!(recv(b.as_fd(), &mut buf, true).unwrap().len, 0, "EOF");
        assert!(
            send(b.as_raw_fd(), b"x", &[], true).is_err(),
            "EPIPE, no signal"
        );
    }

    #[test]
    fn a_long_message_is_reported_truncated() {
        let (a, b) = seqpacket_pair().unwrap();
        send(a.as_raw_fd(), b"abcdef", &[], false).unwrap();
        let mut buf = [0u8; 2];
        let got = recv(b.as_fd(), &mut buf, true).unwrap();
        assert!(got.truncated);
        assert!(
            recv(b.as_fd(), &mut buf, true).is_err(),
            "nothing more: EAGAIN"
        );
    }

    #[test]
    fn an_abstract_listener_names_its_process_and_goes_with_its_socket() {
        let name = format!(
            "rdma-streams/test/{}/{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let listener = listen_abstract(name.as_bytes()).unwrap();
        assert_eq!(
            listen_abstract(name.as_bytes()).unwrap_err().raw_os_error(),
            Some(libc::EADDRINUSE)
        );
        assert!(accept(listener.as_fd()).unwrap().is_none(), "nobody yet");
        let client = connect_abstract(name.as_bytes()).unwrap();
        let me = libc::pid_t::try_from(std::process::id()).unwrap();
        assert_eq!(peer_pid(client.as_raw_fd()), Some(me));
        let served = accept(listener.as_fd()).unwrap().expect("a connection");
        assert_eq!(peer_pid(served.as_raw_fd()), Some(me));
        send(client.as_raw_fd(), b"\x05", &[], false).unwrap();
        assert_eq!(
            wait_any(
                &[listener.as_fd(), served.as_fd()],
                Some(Duration::from_secs(1))
            ),
            [false, true]
        );
        drop((served, client, listener));
        assert_eq!(
            connect_abstract(name.as_bytes())
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ECONNREFUSED),
            "the name went with its socket"
        );
    }
}
