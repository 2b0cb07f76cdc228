//! `SO_REUSEPORT` groups of separately started processes: the process that holds the port's
//! RDMA listener claims, for the others, the connections their `accept()` returns.
//!
//! The RDMA listener of an address and port can be held by one process only, and the client's
//! HELLO registers with it; the kernel then hands the TCP connection to whichever process of
//! the group its hash picks (a server started twice for a seamless reload, instances of one
//! server started side by side). So the holder also opens a *door*: an abstract `AF_UNIX`
//! `SOCK_SEQPACKET` socket named by the address and port (`rdma-streams/port/ADDR:PORT`;
//! abstract names belong to the network namespace and go with the socket), served by the
//! thread that serves its fork children. A process whose RDMA listener could not be opened
//! for its `SO_REUSEPORT` listener asks through the door, with the accepted TCP socket, as a
//! fork child asks its parent ([`super::delegate::claim_through`]): the holder claims the
//! registration of that socket's own peer and runs the stream in its engine.
//!
//! A door is believed only when the process behind it runs as this process's user
//! (`SO_PEERCRED`): it gets the TCP connection itself.
//!
//! The others also *watch* the holder: each keeps one conversation open at its door (a WATCH
//! request, which the holder keeps unanswered while its RDMA listener is open and closes with
//! it; the process's exit closes it too). When it closes, each tries to open the RDMA listener
//! itself; the one that gets it opens its door and the rest watch that one. So a group whose
//! holder closed its listener (the old instance of a seamless reload) or exited upgrades its
//! new clients in the process that took over ([`super::server::take_over`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::delegate::{self, Served};
use super::server::{TakeOver, take_over};
use crate::fdtable;
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::sys::{self, fdpass};

/// The abstract socket name of the door of a listener on `addr`.
fn name(addr: SocketAddr) -> Vec<u8> {
    format!("rdma-streams/port/{addr}").into_bytes()
}

/// The open doors (the serving thread polls them).
static DOORS: ForkSafe<Vec<(SocketAddr, Arc<OwnedFd>)>> =
    ForkSafe::new([const { Mutex::new(Vec::new()) }; SLOTS]);
/// The watch conversations taken at each open door, kept unanswered until it closes.
static WATCHERS: ForkSafe<Vec<(SocketAddr, Arc<OwnedFd>)>> =
    ForkSafe::new([const { Mutex::new(Vec::new()) }; SLOTS]);
/// The most watchers a door keeps (more are closed at once: they try to take over, find the
/// listener held, and watch again after [`RETRY`]).
const MAX_WATCHERS: usize = 64;
/// How soon the serving thread tries again to watch, or take over, the holder of an address
/// it could not watch (doubled on each miss up to [`MAX_RETRY`]: a holder that is not a shimmed
/// process, which has no door, costs a try every few seconds).
const RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(8);
/// The eventfd that tells the serving thread the set changed (made with the first door).
static WAKE: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// A door, open while the RDMA listener it belongs to is.
#[derive(Debug)]
pub(super) struct Door {
    fd: Arc<OwnedFd>,
    addr: SocketAddr,
}

impl Drop for Door {
    fn drop(&mut self) {
        DOORS.lock().retain(|(_, d)| !Arc::ptr_eq(d, &self.fd));
        // Its watchers learn that the listener closed (the serving thread may still hold a
        // copy until it wakes).
        WATCHERS.lock().retain(|(a, _)| *a != self.addr);
        wake();
    }
}

/// Opens the door of the RDMA listener on `addr` that this process holds. None when another
/// socket holds the name (logged).
pub(super) fn open(addr: SocketAddr) -> Option<Door> {
    wake_fd()?;
    match fdpass::listen_abstract(&name(addr)) {
        Ok(fd) => {
            let fd = sys::move_high(fd);
            // Closed in fork children: only this process serves it.
            fdtable::set_pair_end(fd.as_raw_fd());
            let fd = Arc::new(fd);
            DOORS.lock().push((addr, Arc::clone(&fd)));
            wake();
            Some(Door { fd, addr })
        }
        Err(e) => {
            log_at!(Level::Info, "no door for {addr}'s SO_REUSEPORT group: {e}");
            None
        }
    }
}

/// The eventfd that wakes the serving thread (made once; None when it could not be).
fn wake_fd() -> Option<&'static OwnedFd> {
    WAKE.get_or_init(|| {
        let made = sys::move_high(sys::eventfd().ok()?);
        // Closed in fork children, as the doors are.
        fdtable::set_pair_end(made.as_raw_fd());
        Some(made)
    })
    .as_ref()
}

fn wake() {
    if let Some(Some(fd)) = WAKE.get() {
        sys::eventfd_signal(fd.as_raw_fd());
    }
}

/// This process's `SO_REUSEPORT` listeners without an RDMA listener of their own changed: the
/// serving thread looks again at whom it watches.
pub(super) fn changed() {
    if wake_fd().is_some() {
        wake();
    }
}

/// What the serving thread polls for the groups, taken afresh on each round.
pub(super) struct Round {
    /// The wake-up eventfd (made here at the latest, so that the thread waits on it before the
    /// first door opens; drained).
    pub wake: Option<&'static OwnedFd>,
    /// The doors open now, with their addresses.
    pub doors: Vec<(SocketAddr, Arc<OwnedFd>)>,
    /// The watchers they keep.
    pub watchers: Vec<Arc<OwnedFd>>,
}

/// For the serving thread: the fds of this round.
pub(super) fn round() -> Round {
    let wake = wake_fd();
    if let Some(fd) = wake {
        sys::eventfd_drain(fd.as_raw_fd());
    }
    Round {
        wake,
        doors: DOORS.lock().clone(),
        watchers: WATCHERS.lock().iter().map(|(_, w)| Arc::clone(w)).collect(),
    }
}

/// For the serving thread: takes each request waiting at the door of `addr` (one claim per
/// conversation) and answers it as a fork child's claim, or keeps a watch conversation open.
/// A conversation of another user's process is closed unread: only our own user's processes
/// share an `SO_REUSEPORT` group (the kernel's rule), so no other has a request to make here,
/// and none gets an answer, a claim or a watcher's place.
pub(super) fn answer(addr: SocketAddr, door: BorrowedFd<'_>) {
    while let Ok(Some(conv)) = fdpass::accept(door) {
        if !fdpass::peer_is_our_user(conv.as_raw_fd()) {
            log_at!(
                Level::Debug,
                "the door of {addr}: another user's process, not served"
            );
            continue;
        }
        if delegate::serve_one(&conv, false) == Served::Watch {
            keep_watcher(addr, conv);
        }
    }
}

/// Keeps the watch conversation `conv` of our own user's process taken at the door of `addr`
/// (closed in fork children, so that only this process's end of it, or its exit, ends the
/// watch).
fn keep_watcher(addr: SocketAddr, conv: OwnedFd) {
    let conv = sys::move_high(conv);
    fdtable::set_pair_end(conv.as_raw_fd());
    let mut watchers = WATCHERS.lock();
    if watchers.iter().filter(|(a, _)| *a == addr).count() < MAX_WATCHERS {
        watchers.push((addr, Arc::new(conv)));
    }
}

/// For the serving thread: a watcher hung up (its process closed its listeners or exited) or
/// sent something it should not: forgotten.
pub(super) fn drop_watcher(watcher: &Arc<OwnedFd>) {
    WATCHERS.lock().retain(|(_, w)| !Arc::ptr_eq(w, watcher));
}

/// The serving thread's watches on the holders of the addresses this process's
/// `SO_REUSEPORT` listeners have no RDMA listener for.
#[derive(Default)]
pub(super) struct Watches {
    /// Address -> the watch conversation at its holder's door, or when to try again.
    by_addr: BTreeMap<SocketAddr, Watch>,
}

enum Watch {
    On(OwnedFd),
    /// When to try again, and the wait after that.
    RetryAt(Instant, Duration),
}

impl Watches {
    /// Brings the watches in line with `wanted` (stops those no longer wanted, tries at once
    /// for new ones) and tries again those whose time came.
    pub fn update(&mut self, wanted: &BTreeSet<SocketAddr>, now: Instant) {
        self.by_addr.retain(|a, _| wanted.contains(a));
        for &addr in wanted {
            let due = match self.by_addr.get(&addr) {
                None => true,
                Some(Watch::RetryAt(at, _)) => *at <= now,
                Some(Watch::On(_)) => false,
            };
            if due {
                self.attempt(addr, now);
            }
        }
    }

    /// The holder of `addr` is gone, or may be: take over or watch the one that did.
    fn attempt(&mut self, addr: SocketAddr, now: Instant) {
        let wait = match self.by_addr.get(&addr) {
            Some(Watch::RetryAt(_, wait)) => *wait,
            _ => RETRY,
        };
        match take_over(addr) {
            TakeOver::Taken | TakeOver::Gone => {
                self.by_addr.remove(&addr);
            }
            TakeOver::HeldElsewhere => {
                let watch = match watch(addr) {
                    Some(conv) => Watch::On(conv),
                    // The holder's door is not open yet (it opens right after its listener),
                    // or is another user's.
                    None => Watch::RetryAt(now + wait, (wait * 2).min(MAX_RETRY)),
                };
                self.by_addr.insert(addr, watch);
            }
        }
    }

    /// The watch conversations to poll.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.by_addr
            .values()
            .filter_map(|w| match w {
                Watch::On(fd) => Some(fd.as_fd()),
                Watch::RetryAt(..) => None,
            })
            .collect()
    }

    /// How long the serving thread may sleep before a retry is due.
    pub fn bound(&self, now: Instant) -> Option<Duration> {
        self.by_addr
            .values()
            .filter_map(|w| match w {
                Watch::RetryAt(at, _) => Some(at.saturating_duration_since(now)),
                Watch::On(_) => None,
            })
            .min()
    }

    /// The watch conversations that `ready` (from [`Self::fds`]'s order) says ended: their
    /// holders closed their listeners or exited.
    pub fn ended(&mut self, ready: &[bool], now: Instant) {
        let on: Vec<SocketAddr> = self
            .by_addr
            .iter()
            .filter(|(_, w)| matches!(w, Watch::On(_)))
            .map(|(a, _)| *a)
            .collect();
        for (addr, _) in on.into_iter().zip(ready).filter(|(_, r)| **r) {
            log_at!(
                Level::Debug,
                "the holder of the RDMA listener on {addr} closed it"
            );
            self.by_addr.remove(&addr);
            self.attempt(addr, now);
        }
    }
}

/// Opens a watch conversation at the door of the holder of `addr`.
fn watch(addr: SocketAddr) -> Option<OwnedFd> {
    let conv = knock(addr)?;
    delegate::ask_watch(&conv).ok()?;
    let conv = sys::move_high(conv);
    fdtable::set_pair_end(conv.as_raw_fd());
    Some(conv)
}

/// In a fork child: the doors and watchers are the parent's (their fds were closed with the
/// socketpair ends); forgotten, not closed.
pub(super) fn after_fork_child() {
    if let Some(mut doors) = DOORS.after_fork() {
        std::mem::forget(std::mem::take(&mut *doors));
    }
    if let Some(mut watchers) = WATCHERS.after_fork() {
        std::mem::forget(std::mem::take(&mut *watchers));
    }
}

/// The way to the holder of the RDMA listener on `addr` for a process of its group: a
/// connection to its door, when one is open and its process runs as our user.
pub(super) fn knock(addr: SocketAddr) -> Option<OwnedFd> {
    let conv = fdpass::connect_abstract(&name(addr)).ok()?;
    if !fdpass::peer_is_our_user(conv.as_raw_fd()) {
        log_at!(
            Level::Info,
            "the door of {addr} is another user's: not used"
        );
        return None;
    }
    Some(conv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_door_is_open_while_its_listener_is_and_only_for_our_user() {
        let addr: SocketAddr = "127.0.0.9:9".parse().unwrap();
        let door = open(addr).expect("the name is free");
        let now = round();
        assert!(
            now.wake.is_some(),
            "the serving thread waits on the wake-up"
        );
        assert!(now.doors.iter().any(|(_, d)| Arc::ptr_eq(d, &door.fd)));
        drop(now);
        assert!(open(addr).is_none(), "one door per address");
        let conv = knock(addr).expect("our own user's door");
        drop(conv);
        drop(door);
        // The serving thread (when a test started one) lets go of its copy once woken.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while knock(addr).is_some() {
            assert!(
                std::time::Instant::now() < until,
                "the name stayed after the door"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Whether `cond` holds within 2 s.
    fn settles(cond: impl Fn() -> bool) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while !cond() {
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[test]
    fn a_watch_is_kept_while_its_door_is_open_and_ends_with_it() {
        let addr: SocketAddr = "127.0.0.9:10".parse().unwrap();
        let door = open(addr).expect("the name is free");
        let conv = watch(addr).expect("our own user's door");
        // What the serving thread does when the door is readable (a serving thread another
        // test started may take it first: the end is the same).
        answer(addr, door.fd.as_fd());
        let kept = || WATCHERS.lock().iter().filter(|(a, _)| *a == addr).count();
        assert!(settles(|| kept() == 1), "the watch is kept, unanswered");
        assert_eq!(
            fdpass::wait_any(&[conv.as_fd()], Some(Duration::from_millis(50))),
            vec![false],
            "nothing ends the watch while the door is open"
        );
        drop(door);
        assert_eq!(kept(), 0);
        assert_eq!(
            fdpass::wait_any(&[conv.as_fd()], Some(Duration::from_secs(2))),
            vec![true],
            "the watcher learns that the listener closed"
        );
    }

    #[test]
    fn a_door_keeps_at_most_its_share_of_watchers() {
        let addr: SocketAddr = "127.0.0.9:12".parse().unwrap();
        let door = open(addr).expect("the name is free");
        // Taken in batches, as the serving thread takes them (the door's backlog is 16).
        let mut convs: Vec<OwnedFd> = Vec::new();
        while convs.len() <= MAX_WATCHERS {
            for _ in 0..8.min(MAX_WATCHERS + 1 - convs.len()) {
                convs.push(watch(addr).expect("our own user's door"));
            }
            answer(addr, door.fd.as_fd());
        }
        let kept = || WATCHERS.lock().iter().filter(|(a, _)| *a == addr).count();
        let ended = || {
            convs
                .iter()
                .filter(|c| fdpass::wait_any(&[c.as_fd()], Some(Duration::ZERO))[0])
                .count()
        };
        assert!(
            settles(|| kept() == MAX_WATCHERS && ended() == 1),
            "{} kept, {} closed: the one over the bound is closed at once (it retries later)",
            kept(),
            ended()
        );
        drop(door);
    }

    #[test]
    fn watches_retry_a_holder_without_a_door_ever_less_often() {
        let addr: SocketAddr = "127.0.0.9:11".parse().unwrap();
        // A listening fd of this process on `addr` whose RDMA listener is held elsewhere (no
        // door: nobody answers there; the RDMA listen fails, or there is no engine).
        super::super::server::tests_support::group_fd(900_011, addr);
        let mut w = Watches::default();
        let mut now = Instant::now();
        let wanted = BTreeSet::from([addr]);
        w.update(&wanted, now);
        assert!(w.fds().is_empty(), "no door to watch");
        let mut wait = RETRY;
        for _ in 0..8 {
            assert_eq!(w.bound(now), Some(wait));
            now += wait;
            w.update(&wanted, now);
            wait = (wait * 2).min(MAX_RETRY);
        }
        assert_eq!(
            w.bound(now),
            Some(MAX_RETRY),
            "tries stay at most this far apart"
        );
        super::super::server::forget_grouped(900_011);
        w.update(&BTreeSet::new(), now);
        assert_eq!(
            w.bound(now),
            None,
            "an address no listener is on any more is dropped"
        );
    }
}
