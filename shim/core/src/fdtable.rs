//! What the shim knows about each file descriptor: a lock-free table indexed by fd.
//!
//! One `AtomicU8` per fd below [`MAX_FDS`]; larger fds are "unknown" and always pass through
//! uncounted. `socket()` and `accept()` set an entry, `close()` clears it (before the real
//! close, so a number reused by another thread's `socket()` right after is not wiped), `dup`,
//! `dup2`, `dup3` and `fcntl(F_DUPFD*)` copy it to the new number. Fds received with
//! SCM_RIGHTS or inherited across exec are unknown (they pass through; data works natively).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Fds at or above this are never tracked.
pub const MAX_FDS: usize = 65_536;

/// The fd is an AF_INET/AF_INET6 SOCK_STREAM socket made by a hooked `socket()`/`accept()`.
pub const INET_STREAM: u8 = 1;
/// ... and its protocol is TCP (0 or IPPROTO_TCP); without it: SCTP, MPTCP, ... (`NOT_TCP`).
pub const TCP: u8 = 2;
/// ... and its connection has been counted (connect() started, or accept() returned it).
pub const COUNTED: u8 = 4;
/// ... and `listen()` succeeded on it.
pub const LISTENING: u8 = 8;
/// ... and it was upgraded: the fd is now one end of the engine's socketpair, its kernel TCP
/// socket is kept by the shim.
pub const SWAPPED: u8 = 16;
/// ... and it is a listener with an RDMA listener on the same address and port (the upgrade's
/// side channel).
pub const SIDE: u8 = 32;
/// ... and it was registered with `epoll_ctl` before it was connected: the swap moves its
/// registrations ([`crate::watches`]), or it stays TCP (`UNSUPPORTED`) when they cannot be.
pub const POLLED: u8 = 64;
/// The fd belongs to the shim (a kept TCP socket, the engine's socketpair end, its epoll and
/// eventfd, the connection manager's and the devices' fds): the app's `close()` of this number
/// answers `EBADF` without closing it. Apps that close a number twice (iperf3 does) would
/// otherwise close the shim's fd that reused it, and the shim would later close whatever
/// reused it next.
pub const SHIM_OWNED: u8 = 128;

static TABLE: [AtomicU8; MAX_FDS] = [const { AtomicU8::new(0) }; MAX_FDS];

/// Which [`SHIM_OWNED`] fds are the engine's ends of socketpairs, one bit per fd: a fork child
/// closes its copies of them ([`pair_ends`]). A bit goes when its entry is set or cleared.
static PAIR_ENDS: [AtomicU64; MAX_FDS / 64] = [const { AtomicU64::new(0) }; MAX_FDS / 64];

/// Which INET stream sockets still have a fresh socket's options, one bit per fd: the app set
/// none that the swap carries over or that the upgrade reads (`SOL_SOCKET` options but the
/// address-reuse and buffer sizes, IP-level options such as `IP_TOS`, which sets the priority,
/// the owner for `SIGIO`/`SIGURG`) since `socket()` made it, or since `accept()` took it from
/// a listener of which the same held (an accepted socket inherits its listener's). The swap
/// then reads none of them back (a system call per option saved, [`crate::sys`]). A bit goes
/// when its number changes hands ([`set`], [`clear`]; a bit is only ever set on a number with
/// an entry, so a number without one needs no look), when the app sets such an option
/// ([`option_set`]) and when the number is copied ([`crate::ops::dup`]: the copy shares the
/// socket, and a setting through either would not reach the other's bit).
static DEFAULTS: [AtomicU64; MAX_FDS / 64] = [const { AtomicU64::new(0) }; MAX_FDS / 64];

fn bit_of(map: &'static [AtomicU64; MAX_FDS / 64], fd: i32) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok()?;
    Some((map.get(i / 64)?, 1u64 << (i % 64)))
}

fn pair_bit(fd: i32) -> Option<(&'static AtomicU64, u64)> {
    bit_of(&PAIR_ENDS, fd)
}

fn forget_pair_end(fd: i32) {
    if let Some((word, bit)) = pair_bit(fd) {
        word.fetch_and(!bit, Ordering::AcqRel);
    }
}

/// `fd` was just made by the app's `socket()` (or accepted from a listener with
/// [`has_defaults`]): its options are the kernel's defaults.
pub fn mark_defaults(fd: i32) {
    if let Some((word, bit)) = bit_of(&DEFAULTS, fd) {
        word.fetch_or(bit, Ordering::AcqRel);
    }
}

/// Whether `fd`'s options are still a fresh socket's (see [`DEFAULTS`]).
#[inline]
pub fn has_defaults(fd: i32) -> bool {
    bit_of(&DEFAULTS, fd).is_some_and(|(word, bit)| word.load(Ordering::Acquire) & bit != 0)
}

/// `fd`'s options may differ from a fresh socket's from now on.
#[inline]
pub fn forget_defaults(fd: i32) {
    if let Some((word, bit)) = bit_of(&DEFAULTS, fd)
        && word.load(Ordering::Relaxed) & bit != 0
    {
        word.fetch_and(!bit, Ordering::AcqRel);
    }
}

/// The app set option `name` at `level` on `fd`: unless it is one that changes nothing the
/// swap carries over or the upgrade reads, `fd` no longer has a fresh socket's options.
#[inline]
pub fn option_set(fd: i32, level: i32, name: i32) {
    if !leaves_defaults(level, name) {
        forget_defaults(fd);
    }
}

/// Options that leave a socket's carried options alone: every TCP-level one, the listener's
/// address reuse and buffer sizes, and IPv6-only.
fn leaves_defaults(level: i32, name: i32) -> bool {
    match level {
        libc::IPPROTO_TCP => true,
        libc::SOL_SOCKET => matches!(
            name,
            libc::SO_REUSEADDR | libc::SO_REUSEPORT | libc::SO_SNDBUF | libc::SO_RCVBUF
        ),
        libc::IPPROTO_IPV6 => name == libc::IPV6_V6ONLY,
        _ => false,
    }
}

fn slot(fd: i32) -> Option<&'static AtomicU8> {
    usize::try_from(fd).ok().and_then(|i| TABLE.get(i))
}

/// The fd's flags (0: unknown or not an INET stream socket).
#[inline]
pub fn get(fd: i32) -> u8 {
    slot(fd).map_or(0, |s| s.load(Ordering::Acquire))
}

/// Replaces the fd's flags (a new socket took this number).
#[inline]
pub fn set(fd: i32, flags: u8) {
    if let Some(s) = slot(fd) {
        let old = s.swap(flags, Ordering::AcqRel);
        if old != 0 {
            forget_defaults(fd);
        }
        if old & SHIM_OWNED != 0 {
            forget_pair_end(fd);
        }
    }
}

/// `fd` is the engine's end of a socketpair the shim made (shim-owned).
pub fn set_pair_end(fd: i32) {
    set(fd, SHIM_OWNED);
    if let Some((word, bit)) = pair_bit(fd) {
        word.fetch_or(bit, Ordering::AcqRel);
    }
}

/// The fds [`set_pair_end`] marked and nothing cleared since.
pub fn pair_ends() -> impl Iterator<Item = i32> {
    PAIR_ENDS.iter().enumerate().flat_map(|(w, word)| {
        let bits = word.load(Ordering::Acquire);
        (0..64).filter_map(move |b| {
            let fd = i32::try_from(w * 64 + b).ok()?;
            (bits & (1u64 << b) != 0 && get(fd) & SHIM_OWNED != 0).then_some(fd)
        })
    })
}

/// Adds `flags`; returns the flags before.
#[inline]
pub fn add(fd: i32, flags: u8) -> u8 {
    slot(fd).map_or(0, |s| s.fetch_or(flags, Ordering::AcqRel))
}

/// Forgets the fd (it is being closed). No write when the entry is already clear.
#[inline]
pub fn clear(fd: i32) {
    if let Some(s) = slot(fd)
        && s.load(Ordering::Relaxed) != 0
    {
        forget_defaults(fd);
        if s.swap(0, Ordering::AcqRel) & SHIM_OWNED != 0 {
            forget_pair_end(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_add_clear_and_out_of_range() {
        let fd = 40_000;
        assert_eq!(get(fd), 0);
        set(fd, INET_STREAM | TCP);
        assert_eq!(add(fd, COUNTED), INET_STREAM | TCP);
        assert_eq!(add(fd, COUNTED) & COUNTED, COUNTED, "counted once only");
        clear(fd);
        assert_eq!(get(fd), 0);
        for fd in [-1, 65_536, i32::MAX] {
            set(fd, INET_STREAM);
            assert_eq!(get(fd), 0, "fd {fd} is never tracked");
            assert_eq!(add(fd, COUNTED), 0);
            clear(fd);
        }
    }

    #[test]
    fn pair_ends_are_listed_until_their_number_changes_hands() {
        let (a, b, c) = (40_100, 40_101, 40_163);
        set_pair_end(a);
        set_pair_end(b);
        set_pair_end(c);
        let listed = |fd| pair_ends().any(|p| p == fd);
        assert!(listed(a) && listed(b) && listed(c));
        clear(a);
        set(b, INET_STREAM | TCP);
        assert!(!listed(a), "closed");
        assert!(!listed(b), "reused by a socket of the app");
        assert!(listed(c));
        set(c, SHIM_OWNED);
        assert!(!listed(c), "reused by another shim fd");
        clear(b);
        clear(c);
    }

    #[test]
    fn defaults_last_until_the_app_sets_a_carried_option_or_the_number_changes_hands() {
        let (a, b, c) = (40_200, 40_201, 40_202);
        for fd in [a, b, c] {
            set(fd, INET_STREAM | TCP);
            mark_defaults(fd);
        }
        option_set(a, libc::IPPROTO_TCP, libc::TCP_NODELAY);
        option_set(a, libc::SOL_SOCKET, libc::SO_REUSEADDR);
        option_set(a, libc::SOL_SOCKET, libc::SO_RCVBUF);
        option_set(a, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
        assert!(
            has_defaults(a),
            "options the swap neither carries nor reads"
        );
        option_set(a, libc::SOL_SOCKET, libc::SO_RCVTIMEO);
        assert!(!has_defaults(a), "a carried option");
        option_set(b, libc::IPPROTO_IP, libc::IP_TOS);
        assert!(!has_defaults(b), "IP_TOS sets the priority");
        assert!(has_defaults(c));
        set(c, INET_STREAM | TCP);
        assert!(!has_defaults(c), "a new socket on the number");
        mark_defaults(c);
        clear(c);
        assert!(!has_defaults(c), "closed");
        for fd in [-1, 65_536] {
            mark_defaults(fd);
            assert!(!has_defaults(fd), "fd {fd} is never tracked");
        }
        clear(a);
        clear(b);
    }
}
