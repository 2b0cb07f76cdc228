//! Which way a data call on an upgraded fd goes, from its arguments alone: the stream's rings
//! directly (one copy), or the original call on the fd (the app's end of the stream's
//! socketpair, which the engine keeps in step), and which socket options belong to the kept
//! TCP socket. The hooks ask here; nothing here touches an fd.

use libc::c_int;

/// How `read`/`recv`/`recvfrom` of an upgraded fd take their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// A direct read from the receive ring when the socketpair holds nothing
    /// ([`crate::ops::read_direct`]); else the original.
    Direct,
    /// `MSG_WAITALL`: on a blocking fd, the buffer filled from direct reads and the original
    /// (called without the flag) in turn ([`crate::direct::wait_all`]); on a non-blocking one,
    /// as [`Recv::Direct`] (it waits for nothing).
    WaitAll,
    /// `MSG_TRUNC`: TCP counts the bytes it takes (or peeks) and copies none into the
    /// caller's buffer; the socketpair would copy them. The original without the flag, into a
    /// scratch buffer ([`DISCARD_CHUNK`] at most: one receive of a stream may return less than
    /// asked).
    Discard,
    /// The original, with the caller's arguments (`MSG_PEEK`, `MSG_OOB`, an address asked
    /// for, ...): it reads the socketpair, which holds every byte in order.
    Original,
}

/// The most buffers one `writev` takes, and messages one `sendmmsg` sends (the kernel's
/// `UIO_MAXIOV`, which glibc calls `IOV_MAX`): the hooks pass a larger count to libc, which
/// refuses it (`writev`) or sends this many (`sendmmsg`).
pub const IOV_MAX: usize = 1024;

/// The most one `MSG_TRUNC` receive of an upgraded fd takes ([`Recv::Discard`]).
pub const DISCARD_CHUNK: usize = 4096;

/// The way for a receive with `flags`; `wants_addr`: `recvfrom` asked for the sender's address.
pub fn recv(flags: c_int, wants_addr: bool) -> Recv {
    const PLAIN: c_int = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    if flags & libc::MSG_TRUNC != 0 && flags & libc::MSG_OOB == 0 {
        Recv::Discard
    } else if wants_addr {
        Recv::Original
    } else if flags & !PLAIN == 0 {
        // None of these changes what a plain read returns.
        Recv::Direct
    } else if flags & !(libc::MSG_WAITALL | libc::MSG_NOSIGNAL) == 0 {
        Recv::WaitAll
    } else {
        Recv::Original
    }
}

/// Whether `write`/`send`/`sendto` with `flags` (and an address, `has_addr`) may copy straight
/// into the send ring: none of the flags changes where or how the bytes go (`MSG_NOSIGNAL` and
/// `MSG_DONTWAIT` apply to the rest, which goes to the socketpair; `MSG_MORE` is a hint, and
/// `MSG_WAITALL` means nothing to a send, as rstream's blocking mode passes it to TCP).
/// `MSG_OOB` and the rest, or an address, go to the original.
pub fn send_direct(flags: c_int, has_addr: bool) -> bool {
    const PLAIN: c_int =
        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | libc::MSG_MORE | libc::MSG_WAITALL;
    !has_addr && flags & !PLAIN == 0
}

/// Whether a send with `flags` may wait for room in the ring (a blocking fd's send, unless
/// `MSG_DONTWAIT`).
pub fn send_dontwait(flags: c_int) -> bool {
    flags & libc::MSG_DONTWAIT != 0
}

/// Whether a socket option of an upgraded fd belongs to the kept TCP socket: every level but
/// `SOL_SOCKET` (`TCP_NODELAY`, `TCP_INFO`, `IP_TOS`, ...), and the `SOL_SOCKET` options that
/// describe the socket's kind. Buffer sizes, timeouts, `SO_ERROR` and the like stay on the
/// app's end.
pub fn option_on_kept(level: c_int, name: c_int) -> bool {
    level != libc::SOL_SOCKET
        || matches!(
            name,
            libc::SO_DOMAIN | libc::SO_PROTOCOL | libc::SO_ZEROCOPY
        )
}

/// Whether a `setsockopt` of (`level`, `name`) with `value` asks for an abortive close
/// (`SO_LINGER` on with 0 s): Some(true); Some(false) for any other `SO_LINGER`; None for
/// another option (or a value too short to be a `struct linger`). An upgraded fd's kept TCP
/// socket is set to match, so that the engine resets the connection when the app closes it
/// (`transport::fd::resets_on_close`).
pub fn linger_resets(level: c_int, name: c_int, value: &[u8]) -> Option<bool> {
    if level != libc::SOL_SOCKET || name != libc::SO_LINGER {
        return None;
    }
    let int = |at: usize| -> Option<i32> {
        Some(i32::from_ne_bytes(value.get(at..at + 4)?.try_into().ok()?))
    };
    Some(int(0)? != 0 && int(4)? == 0)
}

/// Where `struct tcp_info` (Linux's `<linux/tcp.h>`) keeps `tcpi_bytes_acked` (a `u64`, since
/// Linux 4.1).
const TCP_INFO_BYTES_ACKED: usize = 120;
/// ... `tcpi_bytes_received` (since 4.1).
const TCP_INFO_BYTES_RECEIVED: usize = 128;
/// ... `tcpi_bytes_sent` (since 4.19).
const TCP_INFO_BYTES_SENT: usize = 200;

/// Writes what an upgraded connection's stream carried (`sent`, `acked`, `received` bytes)
/// over the kept TCP socket's counts in `info`, the start of a `struct tcp_info` the kernel
/// filled (as long as the app asked for): each field that fits whole.
pub fn patch_tcp_info(info: &mut [u8], sent: u64, acked: u64, received: u64) {
    for (at, value) in [
        (TCP_INFO_BYTES_ACKED, acked),
        (TCP_INFO_BYTES_RECEIVED, received),
        (TCP_INFO_BYTES_SENT, sent),
    ] {
        if let Some(field) = info.get_mut(at..at + 8) {
            field.copy_from_slice(&value.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_info_takes_the_stream_counts_that_fit() {
        let field =
            |info: &[u8], at: usize| u64::from_ne_bytes(info[at..at + 8].try_into().unwrap());
        // The kernel's struct as Linux 6.1 fills it (232 bytes): all three fields.
        let mut info = vec![0xAAu8; 232];
        patch_tcp_info(&mut info, 3000, 2000, 1000);
        assert_eq!(field(&info, 120), 2000, "tcpi_bytes_acked");
        assert_eq!(field(&info, 128), 1000, "tcpi_bytes_received");
        assert_eq!(field(&info, 200), 3000, "tcpi_bytes_sent");
        assert!(
            info[..120].iter().all(|&b| b == 0xAA),
            "the kernel's fields before stay"
        );
        assert!(info[136..200].iter().all(|&b| b == 0xAA), "and between");
        // An app that asked for less (an older struct): only what fits whole.
        let mut short = vec![0u8; 132];
        patch_tcp_info(&mut short, 3, 2, 1);
        assert_eq!(field(&short, 120), 2);
        assert_eq!(&short[128..], &[0; 4], "a field cut short is left alone");
        let mut tiny = vec![7u8; 8];
        patch_tcp_info(&mut tiny, 3, 2, 1);
        assert_eq!(tiny, vec![7u8; 8]);
    }

    #[test]
    fn receives_go_direct_only_when_the_flags_change_nothing_a_read_returns() {
        assert_eq!(recv(0, false), Recv::Direct);
        assert_eq!(recv(libc::MSG_DONTWAIT, false), Recv::Direct);
        assert_eq!(
            recv(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL, false),
            Recv::Direct
        );
        assert_eq!(recv(libc::MSG_WAITALL, false), Recv::WaitAll);
        assert_eq!(
            recv(libc::MSG_WAITALL | libc::MSG_NOSIGNAL, false),
            Recv::WaitAll
        );
        assert_eq!(recv(libc::MSG_TRUNC, false), Recv::Discard);
        assert_eq!(recv(libc::MSG_TRUNC | libc::MSG_PEEK, true), Recv::Discard);
        for other in [
            libc::MSG_PEEK,
            libc::MSG_OOB,
            libc::MSG_OOB | libc::MSG_TRUNC,
            libc::MSG_WAITALL | libc::MSG_PEEK,
            libc::MSG_WAITALL | libc::MSG_DONTWAIT,
            libc::MSG_ERRQUEUE,
        ] {
            assert_eq!(recv(other, false), Recv::Original, "{other:#x}");
        }
        assert_eq!(recv(0, true), Recv::Original, "an address asked for");
    }

    #[test]
    fn sends_go_direct_only_without_an_address_or_a_flag_that_changes_them() {
        for plain in [
            0,
            libc::MSG_DONTWAIT,
            libc::MSG_NOSIGNAL | libc::MSG_MORE,
            libc::MSG_WAITALL,
        ] {
            assert!(send_direct(plain, false), "{plain:#x}");
            assert!(!send_direct(plain, true), "{plain:#x} with an address");
        }
        for other in [libc::MSG_OOB, libc::MSG_ZEROCOPY, libc::MSG_CONFIRM] {
            assert!(!send_direct(other, false), "{other:#x}");
        }
        assert!(send_dontwait(libc::MSG_DONTWAIT | libc::MSG_MORE));
        assert!(!send_dontwait(libc::MSG_MORE));
    }

    #[test]
    fn only_a_linger_of_zero_seconds_asks_for_a_reset() {
        let linger = |on: i32, secs: i32| [on.to_ne_bytes(), secs.to_ne_bytes()].concat();
        let sol = libc::SOL_SOCKET;
        assert_eq!(
            linger_resets(sol, libc::SO_LINGER, &linger(1, 0)),
            Some(true)
        );
        assert_eq!(
            linger_resets(sol, libc::SO_LINGER, &linger(1, 5)),
            Some(false)
        );
        assert_eq!(
            linger_resets(sol, libc::SO_LINGER, &linger(0, 0)),
            Some(false)
        );
        assert_eq!(linger_resets(sol, libc::SO_LINGER, &[1, 0, 0]), None);
        assert_eq!(linger_resets(sol, libc::SO_KEEPALIVE, &linger(1, 0)), None);
        assert_eq!(
            linger_resets(libc::IPPROTO_TCP, libc::SO_LINGER, &linger(1, 0)),
            None
        );
    }

    #[test]
    fn tcp_options_and_the_sockets_kind_come_from_the_kept_socket() {
        assert!(option_on_kept(libc::IPPROTO_TCP, libc::TCP_NODELAY));
        assert!(option_on_kept(libc::IPPROTO_IP, libc::IP_TOS));
        assert!(option_on_kept(libc::SOL_SOCKET, libc::SO_DOMAIN));
        assert!(option_on_kept(libc::SOL_SOCKET, libc::SO_PROTOCOL));
        assert!(
            option_on_kept(libc::SOL_SOCKET, libc::SO_ZEROCOPY),
            "checked and kept as TCP keeps it (errqueue)"
        );
        for own in [
            libc::SO_RCVBUF,
            libc::SO_SNDTIMEO,
            libc::SO_ERROR,
            libc::SO_TYPE,
        ] {
            assert!(!option_on_kept(libc::SOL_SOCKET, own), "{own}");
        }
    }
}
