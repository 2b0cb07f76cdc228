//! The readiness a socketpair end cannot show: `POLLERR` of an upgraded fd.
//!
//! A TCP socket reports `POLLERR` while it has a pending error or a queued error-queue
//! message. An upgraded fd is a socketpair end, which reports it only for the errors the
//! kernel sets there (the reset byte of [`crate::upgrade::queue_reset`]). Two states have no
//! kernel counterpart the shim can set, so the hooks of `poll`, `ppoll`, `select`, `pselect`
//! and `epoll_wait`/`epoll_pwait`/`epoll_pwait2` add them:
//! - a reset the hooks report because no byte could be queued on the app's end (the app shut
//!   its side for writing before the stream failed);
//! - a zero-copy completion on the connection's emulated error queue ([`crate::errqueue`]).
//!
//! The fd numbers that may have one are marked here ([`mark`]); while none is, every hook
//! costs one atomic load ([`untouched`]). A marked number's state is asked again at each wait (the
//! caller's `state`, None once the error was taken or the number closed, which unmarks it).
//! `epoll` registrations are keyed on data the app chose, so the instance's registrations are
//! read from `/proc/self/fdinfo/<epfd>` ([`parse_fdinfo`]) while a marked fd has an error:
//! level-triggered ones report it at every wait until it is taken, edge-triggered and one-shot
//! ones once per new error ([`EpollReported`]). Once zero-copy sends are on for an upgraded fd,
//! waits over upgraded fds wait in slices ([`slice_waits`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::c_int;

use crate::forksafe::{ForkSafe, SLOTS};

/// The state of a marked fd's error: Some(generation) while one is pending (the generation
/// changes with each new error), None when none is.
pub type State<'a> = &'a dyn Fn(c_int) -> Option<u64>;

/// Numbers that may have an error only the hooks report.
static MARKED: ForkSafe<BTreeSet<c_int>> =
    ForkSafe::new([const { Mutex::new(BTreeSet::new()) }; SLOTS]);
/// The hooks' fast path, one word: how many numbers are marked, and [`SLICING`] once waits
/// are sliced. Written only under the [`MARKED`] lock ([`publish`], [`slice_waits`]).
static WAITS: AtomicUsize = AtomicUsize::new(0);
/// The bit of [`WAITS`] that says waits are sliced ([`slice_waits`]).
const SLICING: usize = 1 << (usize::BITS - 1);

/// Publishes the count of marked numbers `len` (the caller holds the [`MARKED`] lock).
fn publish(len: usize) {
    let slicing = WAITS.load(Ordering::Acquire) & SLICING;
    WAITS.store(len.min(SLICING - 1) | slicing, Ordering::Release);
}

/// An upgraded fd turned zero-copy sends on: from now on, the process's waits over upgraded
/// fds (and its epoll waits, whose sets only the kernel knows) wait in slices and ask between
/// them, so that a completion another thread's send queues is seen within a slice. A TCP
/// socket's error queue wakes its waiters; a socketpair end has nothing to wake them with.
pub fn slice_waits() {
    let _set = MARKED.lock();
    WAITS.fetch_or(SLICING, Ordering::AcqRel);
}

/// Whether waits over upgraded fds wait in slices ([`slice_waits`]; one atomic load).
#[inline]
pub fn slicing() -> bool {
    WAITS.load(Ordering::Acquire) & SLICING != 0
}

/// Whether a wait is libc's own, untouched: no number is marked and waits are not sliced
/// (one atomic load).
#[inline]
pub fn untouched() -> bool {
    WAITS.load(Ordering::Acquire) == 0
}

/// `fd` may have an error only the hooks report.
pub fn mark(fd: c_int) {
    let mut set = MARKED.lock();
    set.insert(fd);
    publish(set.len());
}

/// `fd` was closed: its mark goes.
pub fn forget(fd: c_int) {
    if !any() {
        return;
    }
    let mut set = MARKED.lock();
    if set.remove(&fd) {
        publish(set.len());
        REPORTED.lock().retain(|&(_, f), _| f != fd);
    }
}

/// Whether any number is marked (one atomic load).
#[inline]
pub fn any() -> bool {
    WAITS.load(Ordering::Acquire) & !SLICING != 0
}

/// The marked numbers among `fds` (all of them when None) whose error is pending, with its
/// generation; marked numbers found without one are unmarked.
fn pending(fds: Option<&[c_int]>, state: State<'_>) -> Vec<(c_int, u64)> {
    let mut set = MARKED.lock();
    let candidates: Vec<c_int> = match fds {
        Some(fds) => fds.iter().copied().filter(|fd| set.contains(fd)).collect(),
        None => set.iter().copied().collect(),
    };
    let mut out = Vec::new();
    for fd in candidates {
        match state(fd) {
            Some(generation) => out.push((fd, generation)),
            None => {
                set.remove(&fd);
            }
        }
    }
    publish(set.len());
    out
}

/// The fds among `fds` with a pending error (for `poll` and `select`).
pub fn errors_among(fds: &[c_int], state: State<'_>) -> Vec<c_int> {
    if !any() {
        return Vec::new();
    }
    pending(Some(fds), state)
        .into_iter()
        .map(|(fd, _)| fd)
        .collect()
}

/// After a `poll` of `fds` that returned `rc` (not negative): `POLLERR` added to each entry
/// whose fd is in `errors`; the count of entries with events.
pub fn poll_add(fds: &mut [libc::pollfd], rc: c_int, errors: &[c_int]) -> c_int {
    let mut rc = rc;
    for p in fds
        .iter_mut()
        .filter(|p| p.fd >= 0 && errors.contains(&p.fd))
    {
        if p.revents == 0 {
            rc += 1;
        }
        p.revents |= libc::POLLERR;
    }
    rc
}

/// One registration of an epoll instance, as `/proc/self/fdinfo/<epfd>` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The fd number it was added under.
    pub fd: c_int,
    /// Its events (the kernel adds `EPOLLERR | EPOLLHUP`; a fired one-shot keeps only its
    /// flags).
    pub events: u32,
    pub data: u64,
    /// The inode of the file it watches.
    pub ino: u64,
}

/// The registrations in the text of an epoll fd's `fdinfo` (lines `tfd: <fd> events: <hex>
/// data: <hex> pos:<n> ino:<hex> sdev:<hex>`); lines of another shape are skipped.
pub fn parse_fdinfo(text: &str) -> Vec<Registration> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let mut field = |name: &str| -> Option<&str> {
                loop {
                    let w = words.next()?;
                    if let Some(v) = w.strip_prefix(name) {
                        return Some(if v.is_empty() { words.next()? } else { v });
                    }
                }
            };
            let fd = field("tfd:")?.parse().ok()?;
            let events = u32::from_str_radix(field("events:")?, 16).ok()?;
            let data = u64::from_str_radix(field("data:")?, 16).ok()?;
            let ino = u64::from_str_radix(field("ino:")?, 16).ok()?;
            Some(Registration {
                fd,
                events,
                data,
                ino,
            })
        })
        .collect()
}

/// (epoll fd, fd) -> the generation of the error an edge-triggered or one-shot registration
/// was last told of.
type EpollReported = BTreeMap<(c_int, c_int), u64>;
static REPORTED: ForkSafe<EpollReported> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

/// The events an epoll instance reports for an error: its data, and the events to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEvent {
    /// The fd with the error.
    pub fd: c_int,
    pub data: u64,
    /// The registration's events (what else to ask the fd for when it is reported alone).
    pub interest: u32,
}

/// The registrations of epoll instance `epfd` that report an error now, given a reader of its
/// registrations (`/proc/self/fdinfo/<epfd>`, read only while a marked fd has an error) and
/// of a number's inode (a registration counts only for the file that number names now).
pub fn epoll_errors(
    epfd: c_int,
    state: State<'_>,
    registrations: &dyn Fn(c_int) -> Vec<Registration>,
    inode: &dyn Fn(c_int) -> Option<u64>,
) -> Vec<ErrorEvent> {
    if !any() {
        return Vec::new();
    }
    let errors = pending(None, state);
    if errors.is_empty() {
        return Vec::new();
    }
    let regs = registrations(epfd);
    let once = (libc::EPOLLET | libc::EPOLLONESHOT) as u32;
    let mut reported = REPORTED.lock();
    let mut out = Vec::new();
    for (fd, generation) in errors {
        let Some(ino) = inode(fd) else { continue };
        for r in regs.iter().filter(|r| r.fd == fd && r.ino == ino) {
            // Disarmed (a one-shot that fired), or not reporting errors.
            if r.events & libc::EPOLLERR as u32 == 0 {
                continue;
            }
            if r.events & once != 0 {
                if reported.get(&(epfd, fd)) == Some(&generation) {
                    continue;
                }
                reported.insert((epfd, fd), generation);
            }
            out.push(ErrorEvent {
                fd,
                data: r.data,
                interest: r.events,
            });
        }
    }
    out
}

/// After an `epoll_wait` that returned `rc` events into `events` (room for all of it): each
/// error adds `EPOLLERR` to the event with its data, or is appended while there is room, with
/// `EPOLLERR` and what `now` says the fd is ready for among its interest. The new count.
pub fn epoll_add(
    events: &mut [libc::epoll_event],
    rc: usize,
    errors: &[ErrorEvent],
    now: &dyn Fn(&ErrorEvent) -> u32,
) -> usize {
    let mut n = rc.min(events.len());
    for e in errors {
        if let Some(ev) = events[..n].iter_mut().find(|ev| ev.u64 == e.data) {
            ev.events |= libc::EPOLLERR as u32;
        } else if n < events.len() {
            events[n] = libc::epoll_event {
                events: libc::EPOLLERR as u32 | now(e),
                u64: e.data,
            };
            n += 1;
        }
    }
    n
}

/// In a fork child: the tables, usable; the parent's marks stay (its numbers are the
/// child's), their state is asked again at each wait.
pub fn after_fork_child() {
    drop(MARKED.after_fork());
    drop(REPORTED.after_fork());
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tables are the process's: each test uses its own fd numbers.

    #[test]
    fn marks_go_when_their_error_is_taken() {
        mark(200_001);
        mark(200_002);
        assert!(any());
        let state = |fd: c_int| (fd == 200_001).then_some(3);
        assert_eq!(errors_among(&[200_001, 200_002, 5], &state), vec![200_001]);
        assert!(!MARKED.lock().contains(&200_002), "no error: unmarked");
        forget(200_001);
        assert!(!MARKED.lock().contains(&200_001));
    }

    #[test]
    fn the_fast_path_word_keeps_the_slicing_bit_through_marks() {
        // Sticky for the process: no other test of this crate waits through the hooks.
        slice_waits();
        mark(200_101);
        assert!(slicing() && any() && !untouched());
        forget(200_101);
        assert!(slicing(), "the count's store keeps the bit");
        assert!(!MARKED.lock().contains(&200_101));
        assert!(!untouched(), "sliced waits are not libc's own");
    }

    #[test]
    fn poll_gets_pollerr_and_the_count_follows() {
        let mut fds = [
            libc::pollfd {
                fd: 7,
                events: libc::POLLIN,
                revents: libc::POLLIN,
            },
            libc::pollfd {
                fd: 8,
                events: 0,
                revents: 0,
            },
            libc::pollfd {
                fd: -8,
                events: 0,
                revents: 0,
            },
        ];
        assert_eq!(poll_add(&mut fds, 1, &[7, 8]), 2);
        assert_eq!(fds[0].revents, libc::POLLIN | libc::POLLERR);
        assert_eq!(fds[1].revents, libc::POLLERR);
        assert_eq!(fds[2].revents, 0, "a negative fd is ignored");
    }

    #[test]
    fn fdinfo_lines_parse() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
            tfd:        5 events:       19 data:             feed  pos:0 ino:2a1f sdev:8\n\
            tfd:       12 events: 4000001d data:                c  pos:0 ino:2b00 sdev:8\n\
            tfd: garbage\n";
        assert_eq!(
            parse_fdinfo(text),
            vec![
                Registration {
                    fd: 5,
                    events: 0x19,
                    data: 0xfeed,
                    ino: 0x2a1f
                },
                Registration {
                    fd: 12,
                    events: 0x4000_001d,
                    data: 0xc,
                    ino: 0x2b00
                },
            ]
        );
    }

    #[test]
    fn fdinfo_of_a_real_epoll_instance_lists_its_registration() {
        let ep = crate::sys::test_epoll();
        let (a, _b) = crate::sys::socketpair_stream().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&a);
        crate::sys::epoll_add(ep, fd, libc::EPOLLIN as u32, 0xabc).unwrap();
        let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{ep}")).unwrap();
        let regs = parse_fdinfo(&text);
        crate::sys::close_raw_for_test(ep);
        assert_eq!(regs.len(), 1, "{text}");
        assert_eq!(regs[0].fd, fd);
        assert_eq!(regs[0].data, 0xabc);
        assert_ne!(
            regs[0].events & libc::EPOLLERR as u32,
            0,
            "the kernel adds EPOLLERR"
        );
        assert_eq!(Some(regs[0].ino), crate::sys::file_id(fd).map(|f| f.ino()));
    }

    #[test]
    fn edge_triggered_registrations_hear_of_each_error_once() {
        let (epfd, fd) = (300_001, 300_002);
        mark(fd);
        let generation = std::cell::Cell::new(1u64);
        let state = |f: c_int| (f == fd).then(|| generation.get());
        let regs = |_: c_int| {
            vec![
                Registration {
                    fd,
                    events: (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLET) as u32,
                    data: 1,
                    ino: 9,
                },
                // The same number, another file: not this one.
                Registration {
                    fd,
                    events: libc::EPOLLERR as u32,
                    data: 2,
                    ino: 10,
                },
            ]
        };
        let inode = |_: c_int| Some(9);
        let first = epoll_errors(epfd, &state, &regs, &inode);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].data, 1);
        assert!(
            epoll_errors(epfd, &state, &regs, &inode).is_empty(),
            "told once"
        );
        generation.set(2);
        assert_eq!(
            epoll_errors(epfd, &state, &regs, &inode).len(),
            1,
            "a new error"
        );
        forget(fd);
    }

    #[test]
    fn level_triggered_registrations_hear_of_it_until_taken_and_disarmed_ones_not() {
        let (epfd, fd) = (300_011, 300_012);
        mark(fd);
        let state = |f: c_int| (f == fd).then_some(1);
        let regs = |_: c_int| {
            vec![
                Registration {
                    fd,
                    events: (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32,
                    data: 5,
                    ino: 1,
                },
                Registration {
                    fd,
                    events: libc::EPOLLONESHOT as u32,
                    data: 6,
                    ino: 1,
                },
            ]
        };
        let inode = |_: c_int| Some(1);
        for _ in 0..3 {
            let got = epoll_errors(epfd, &state, &regs, &inode);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].data, 5);
        }
        forget(fd);
    }

    #[test]
    fn epoll_errors_join_their_event_or_come_after_the_rest() {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 3];
        events[0] = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 5,
        };
        let errors = [
            ErrorEvent {
                fd: 1,
                data: 5,
                interest: libc::EPOLLIN as u32,
            },
            ErrorEvent {
                fd: 2,
                data: 6,
                interest: libc::EPOLLOUT as u32,
            },
        ];
        let n = epoll_add(&mut events, 1, &errors, &|_| libc::EPOLLOUT as u32);
        assert_eq!(n, 2);
        let (e0, e1) = (events[0].events, events[1].events);
        assert_eq!(e0, (libc::EPOLLIN | libc::EPOLLERR) as u32);
        assert_eq!(e1, (libc::EPOLLOUT | libc::EPOLLERR) as u32);
        assert_eq!({ events[1].u64 }, 6);
        // No room: nothing is appended.
        let mut one = [libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 9,
        }];
        assert_eq!(epoll_add(&mut one, 1, &errors, &|_| 0), 1);
    }
}
