//! The error queue of an upgraded connection, as TCP's would hold it.
//!
//! An upgraded fd is one end of a socketpair, and `AF_UNIX` has no error queue: there a
//! `recvmsg(MSG_ERRQUEUE)` reads the connection's bytes as if they were the queue's (the app
//! would take them for a notification and lose them), and `SO_ZEROCOPY` is refused. The hooks
//! answer these calls from here instead, as the kernel's TCP socket would:
//! - `SO_ZEROCOPY` is set on the kept TCP socket (which checks it as TCP does); each send with
//!   `MSG_ZEROCOPY` that takes bytes while it is on gets the next id ([`ErrQueue::sent`]), and
//!   its completion is queued at once: the shim copied the bytes before the send returned, so
//!   the app's buffer is free again, which is what the completion says (its code is
//!   `SO_EE_CODE_ZEROCOPY_COPIED`, as the kernel's when it copied: loopback, or a device
//!   without scatter-gather). Consecutive ids merge into one range, as the kernel merges them
//!   while the app has not read them.
//! - `recvmsg(MSG_ERRQUEUE)` takes the oldest completion ([`ErrQueue::take`], encoded by
//!   [`encode`]) or answers `EAGAIN` when there is none, and never touches the stream's bytes.
//! - `poll`/`select`/`epoll` report `POLLERR` while one is queued ([`crate::readiness`]).

use std::collections::VecDeque;
use std::sync::Mutex;

use libc::c_int;

/// `SO_EE_ORIGIN_ZEROCOPY` (`<linux/errqueue.h>`).
pub const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the bytes instead of sending from the
/// app's pages.
pub const CODE_ZEROCOPY_COPIED: u8 = 1;
/// The most completions queued unmerged; one more drops the oldest. Ids are consecutive, so
/// they merge into one range until it spans 2^32 - 1 ids: the queue holds one or two.
const MAX_QUEUED: usize = 64;

/// A completion of the zero-copy sends with ids `lo..=hi` (wrapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub lo: u32,
    pub hi: u32,
}

impl Completion {
    /// How many ids it spans.
    fn len(self) -> u64 {
        u64::from(self.hi.wrapping_sub(self.lo)) + 1
    }
}

#[derive(Debug, Default)]
struct State {
    /// The id of the next zero-copy send (the kernel's `sk_zckey`).
    next: u32,
    queued: VecDeque<Completion>,
    /// Grows with every completion queued (edge-triggered readiness reports each once).
    generation: u64,
}

/// One connection's error queue, shared by the numbers that name its fd.
#[derive(Debug, Default)]
pub struct ErrQueue {
    state: Mutex<State>,
}

impl ErrQueue {
    pub fn new() -> ErrQueue {
        ErrQueue::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One send with `MSG_ZEROCOPY` took bytes while `SO_ZEROCOPY` was on: its completion is
    /// queued, merged with the newest one when the ids follow on (as the kernel's
    /// `skb_zerocopy_notify_extend`).
    pub fn sent(&self) {
        let mut s = self.lock();
        let id = s.next;
        s.next = id.wrapping_add(1);
        s.generation += 1;
        match s.queued.back_mut() {
            Some(c) if c.hi.wrapping_add(1) == id && c.len() + 1 < 1 << 32 => c.hi = id,
            _ => {
                if s.queued.len() == MAX_QUEUED {
                    s.queued.pop_front();
                }
                s.queued.push_back(Completion { lo: id, hi: id });
            }
        }
    }

    /// The oldest completion, taken off the queue.
    pub fn take(&self) -> Option<Completion> {
        self.lock().queued.pop_front()
    }

    /// Whether a completion is queued (the fd reports `POLLERR`).
    pub fn is_empty(&self) -> bool {
        self.lock().queued.is_empty()
    }

    /// Changes with each completion queued.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }
}

/// The size of `struct cmsghdr` on this target, and the alignment of its data.
const CMSG_HDR: usize = size_of::<libc::cmsghdr>();
const CMSG_ALIGN: usize = size_of::<usize>();

fn align(n: usize) -> usize {
    n.div_ceil(CMSG_ALIGN) * CMSG_ALIGN
}

/// What `recvmsg(MSG_ERRQUEUE)` of a TCP socket of address family `family` writes into a
/// control buffer of `room` bytes for `c`: the bytes, and whether they were cut short
/// (`MSG_CTRUNC`). One `IP_RECVERR` (IPv4) or `IPV6_RECVERR` (IPv6) message: a
/// `sock_extended_err` and a zeroed offender address, as the kernel's `put_cmsg` writes it
/// (a room shorter than the message gets what fits, a room shorter than a `cmsghdr` nothing).
pub fn encode(family: c_int, c: Completion, room: usize) -> (Vec<u8>, bool) {
    let (level, ty, offender) = if family == libc::AF_INET6 {
        (
            libc::SOL_IPV6,
            libc::IPV6_RECVERR,
            size_of::<libc::sockaddr_in6>(),
        )
    } else {
        (
            libc::SOL_IP,
            libc::IP_RECVERR,
            size_of::<libc::sockaddr_in>(),
        )
    };
    // struct sock_extended_err: ee_errno, ee_origin, ee_type, ee_code, ee_pad, ee_info,
    // ee_data; then the offender's address, all zero (no address for a completion).
    let mut data = Vec::with_capacity(16 + offender);
    data.extend_from_slice(&0u32.to_ne_bytes());
    data.extend_from_slice(&[ORIGIN_ZEROCOPY, 0, CODE_ZEROCOPY_COPIED, 0]);
    data.extend_from_slice(&c.lo.to_ne_bytes());
    data.extend_from_slice(&c.hi.to_ne_bytes());
    data.resize(16 + offender, 0);

    if room < CMSG_HDR {
        return (Vec::new(), true);
    }
    let full = CMSG_HDR + data.len();
    let truncated = room < full;
    let len = full.min(room);
    let mut out = Vec::with_capacity(align(full));
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&level.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    debug_assert_eq!(out.len(), CMSG_HDR);
    out.extend_from_slice(&data[..len - CMSG_HDR]);
    out.resize(align(full).min(room), 0);
    (out, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_on_and_merge_until_read() {
        let q = ErrQueue::new();
        assert!(q.is_empty());
        q.sent();
        q.sent();
        q.sent();
        assert!(!q.is_empty());
        assert_eq!(q.take(), Some(Completion { lo: 0, hi: 2 }));
        assert_eq!(q.take(), None);
        let g = q.generation();
        q.sent();
        assert!(q.generation() > g, "a new completion is a new generation");
        assert_eq!(q.take(), Some(Completion { lo: 3, hi: 3 }));
    }

    #[test]
    fn ids_wrap_and_a_full_range_starts_another() {
        let q = ErrQueue::new();
        q.lock().next = u32::MAX;
        q.sent();
        q.sent();
        assert_eq!(
            q.take(),
            Some(Completion {
                lo: u32::MAX,
                hi: 0
            })
        );
        // A range spanning 2^32 - 1 ids takes no more (the kernel's bound).
        q.lock().queued.push_back(Completion {
            lo: 1,
            hi: 0xffff_ffff,
        });
        q.lock().next = 0;
        q.sent();
        assert_eq!(q.lock().queued.len(), 2);
    }

    #[test]
    fn the_queue_is_bounded() {
        let q = ErrQueue::new();
        for i in 0..MAX_QUEUED as u32 + 5 {
            // Ids that do not follow on never merge.
            q.lock().next = i * 2;
            q.sent();
        }
        assert_eq!(q.lock().queued.len(), MAX_QUEUED);
        assert_eq!(
            q.take(),
            Some(Completion { lo: 10, hi: 10 }),
            "the oldest went"
        );
    }

    #[test]
    fn a_completion_is_encoded_as_the_kernel_writes_it() {
        let c = Completion { lo: 7, hi: 9 };
        let (v4, cut) = encode(libc::AF_INET, c, 256);
        assert!(!cut);
        // cmsghdr (16) + sock_extended_err (16) + sockaddr_in (16), aligned.
        assert_eq!(v4.len(), 48);
        assert_eq!(usize::from_ne_bytes(v4[..8].try_into().unwrap()), 48);
        assert_eq!(
            i32::from_ne_bytes(v4[8..12].try_into().unwrap()),
            libc::SOL_IP
        );
        assert_eq!(
            i32::from_ne_bytes(v4[12..16].try_into().unwrap()),
            libc::IP_RECVERR
        );
        assert_eq!(v4[20], ORIGIN_ZEROCOPY);
        assert_eq!(v4[22], CODE_ZEROCOPY_COPIED);
        assert_eq!(u32::from_ne_bytes(v4[24..28].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(v4[28..32].try_into().unwrap()), 9);
        assert!(v4[32..].iter().all(|&b| b == 0), "no offender");

        let (v6, cut) = encode(libc::AF_INET6, c, 256);
        assert!(!cut);
        // 16 + 16 + 28 = 60, aligned to 64; the length says 60.
        assert_eq!(v6.len(), 64);
        assert_eq!(usize::from_ne_bytes(v6[..8].try_into().unwrap()), 60);
        assert_eq!(
            i32::from_ne_bytes(v6[8..12].try_into().unwrap()),
            libc::SOL_IPV6
        );
        assert_eq!(
            i32::from_ne_bytes(v6[12..16].try_into().unwrap()),
            libc::IPV6_RECVERR
        );
    }

    #[test]
    fn a_short_control_buffer_gets_what_fits() {
        let c = Completion { lo: 1, hi: 1 };
        assert_eq!(encode(libc::AF_INET, c, 8), (Vec::new(), true));
        let (part, cut) = encode(libc::AF_INET, c, 24);
        assert!(cut);
        assert_eq!(part.len(), 24);
        assert_eq!(usize::from_ne_bytes(part[..8].try_into().unwrap()), 24);
    }
}
