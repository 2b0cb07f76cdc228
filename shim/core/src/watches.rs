//! The epoll registrations of sockets that are not connected yet.
//!
//! An app may register a socket with `epoll_ctl` before it calls `connect()` (nginx does for
//! its upstreams, with `EPOLLET`). The kernel keys a registration on the socket's description
//! and the fd number it was added under, so the swap, which puts a socketpair end on that
//! number, would leave it on the kept TCP socket: the app would wait for events that never
//! come. The registrations move with the swap instead: the `epoll_ctl` hook notes each one
//! here ([`note`]), and the swap takes them off the TCP socket while the number still names it
//! (the only way to name that registration: [`unwatch`]), then adds them again, with the app's
//! events and data, on the socketpair end ([`rewatch`]).
//!
//! What cannot be followed keeps the socket on TCP (`UNSUPPORTED`, [`followable`]): more than
//! [`MAX_PER_SOCKET`] registrations, or one made through an epoll fd number the shim did not
//! see it added under. A registration whose epoll instance is gone by the swap is skipped (its
//! removal fails); one an app disarmed with `EPOLLONESHOT` comes back armed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use libc::c_int;

use crate::forksafe::{ForkSafe, SLOTS};
use crate::sys;

/// The most registrations of one socket that the swap moves; a socket with more stays TCP.
pub const MAX_PER_SOCKET: usize = 8;

/// One registration: the epoll fd it was added through, and the app's events and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    pub epfd: c_int,
    pub events: u32,
    pub data: u64,
}

/// What the shim knows of one socket's registrations.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Known {
    /// Every registration, as the app last set it.
    All(Vec<Watch>),
    /// Not every one: the socket stays TCP.
    Unfollowable,
}

/// Unconnected sockets that were registered -> their registrations.
static WATCHES: ForkSafe<BTreeMap<c_int, Known>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

/// A successful `epoll_ctl(epfd, op, fd, event)` on the unconnected socket `fd` (`event`: its
/// events and data; None for `EPOLL_CTL_DEL`).
pub fn note(fd: c_int, epfd: c_int, op: c_int, event: Option<(u32, u64)>) {
    let mut table = WATCHES.lock();
    let known = table.entry(fd).or_insert_with(|| Known::All(Vec::new()));
    let Known::All(watches) = known else {
        return;
    };
    let at = watches.iter().position(|w| w.epfd == epfd);
    let next = match (op, at, event) {
        (libc::EPOLL_CTL_ADD, _, Some((events, data))) => {
            // An ADD through a number already noted: the epoll fd it named was closed (its
            // registrations with it) and the number now names another instance.
            if let Some(i) = at {
                watches.remove(i);
            }
            (watches.len() < MAX_PER_SOCKET).then(|| watches.push(Watch { epfd, events, data }))
        }
        (libc::EPOLL_CTL_MOD, Some(i), Some((events, data))) => {
            watches[i] = Watch { epfd, events, data };
            Some(())
        }
        (libc::EPOLL_CTL_DEL, Some(i), _) => {
            watches.remove(i);
            Some(())
        }
        // Removed through another number of a noted instance: the swap's own removal of the
        // noted one fails, and nothing is added back. Harmless.
        (libc::EPOLL_CTL_DEL, None, _) => Some(()),
        // Changed through a number the shim did not see it added under.
        _ => None,
    };
    if next.is_none() {
        *known = Known::Unfollowable;
    }
}

/// Whether the swap can move every registration of `fd` (none noted: true).
pub fn followable(fd: c_int) -> bool {
    !matches!(WATCHES.lock().get(&fd), Some(Known::Unfollowable))
}

/// `fd` is a copy of a registered socket: the registrations are the original number's, which
/// a swap of `fd` could not move.
pub fn unfollowable(fd: c_int) {
    WATCHES.lock().insert(fd, Known::Unfollowable);
}

/// `fd` was closed, or its number now names another description: its notes go.
pub fn forget(fd: c_int) {
    WATCHES.lock().remove(&fd);
}

/// Before the swap of `fd`, while its number still names the TCP socket: takes every noted
/// registration off it, and returns those that were there.
pub fn unwatch(fd: c_int) -> Vec<Watch> {
    let Some(Known::All(watches)) = WATCHES.lock().remove(&fd) else {
        return Vec::new();
    };
    watches
        .into_iter()
        .filter(|w| sys::epoll_del(w.epfd, fd))
        .collect()
}

/// After the swap of `fd` (or after it failed): adds `watches` back on what the number names
/// now. One that cannot be added (its epoll fd closed meanwhile) is logged and dropped.
pub fn rewatch(fd: c_int, watches: &[Watch]) {
    for w in watches {
        if let Err(e) = sys::epoll_add(w.epfd, fd, w.events, w.data) {
            crate::log::log_at!(
                crate::log::Level::Info,
                "fd {fd}: its registration with epoll fd {} could not follow the swap ({e})",
                w.epfd
            );
        }
    }
}

/// After an undone swap of `fd` (its number names the TCP socket again): adds `watches` back
/// on it and notes them, as they were before the swap.
pub fn restore(fd: c_int, watches: &[Watch]) {
    rewatch(fd, watches);
    for w in watches {
        note(fd, w.epfd, libc::EPOLL_CTL_ADD, Some((w.events, w.data)));
    }
}

/// In a fork child: the table, usable (see [`ForkSafe`]); what the parent noted is dropped
/// (a fork child's own connections pass through).
pub fn after_fork_child() {
    if let Some(mut table) = WATCHES.after_fork() {
        table.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD: c_int = libc::EPOLL_CTL_ADD;
    const MOD: c_int = libc::EPOLL_CTL_MOD;
    const DEL: c_int = libc::EPOLL_CTL_DEL;

    fn noted(fd: c_int) -> Option<Known> {
        WATCHES.lock().get(&fd).cloned()
    }

    // Each test uses its own fd numbers: the table is the process's.

    #[test]
    fn add_mod_del_keep_what_the_app_set() {
        let fd = 100_001;
        note(fd, 7, ADD, Some((libc::EPOLLIN as u32, 1)));
        note(fd, 8, ADD, Some((libc::EPOLLOUT as u32, 2)));
        note(
            fd,
            7,
            MOD,
            Some((libc::EPOLLIN as u32 | libc::EPOLLET as u32, 3)),
        );
        assert_eq!(
            noted(fd),
            Some(Known::All(vec![
                Watch {
                    epfd: 7,
                    events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                    data: 3
                },
                Watch {
                    epfd: 8,
                    events: libc::EPOLLOUT as u32,
                    data: 2
                },
            ]))
        );
        note(fd, 8, DEL, None);
        note(fd, 9, DEL, None);
        assert!(followable(fd));
        assert_eq!(
            noted(fd),
            Some(Known::All(vec![Watch {
                epfd: 7,
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                data: 3
            }]))
        );
        forget(fd);
        assert_eq!(noted(fd), None);
        assert!(followable(fd), "nothing noted: nothing to follow");
    }

    #[test]
    fn an_add_through_a_reused_number_replaces_the_old_note() {
        let fd = 100_002;
        note(fd, 7, ADD, Some((1, 1)));
        note(fd, 7, ADD, Some((4, 2)));
        assert_eq!(
            noted(fd),
            Some(Known::All(vec![Watch {
                epfd: 7,
                events: 4,
                data: 2
            }]))
        );
        forget(fd);
    }

    #[test]
    fn what_cannot_be_followed_stays_tcp() {
        let unknown_number = 100_003;
        note(unknown_number, 7, ADD, Some((1, 1)));
        note(unknown_number, 9, MOD, Some((1, 1)));
        assert!(
            !followable(unknown_number),
            "a MOD through an unseen number"
        );
        note(unknown_number, 9, ADD, Some((1, 1)));
        assert!(!followable(unknown_number), "stays unfollowable");
        assert!(unwatch(unknown_number).is_empty());
        assert!(followable(unknown_number), "unwatch took the note");

        let many = 100_004;
        for epfd in 0..MAX_PER_SOCKET as c_int {
            note(many, 1000 + epfd, ADD, Some((1, 1)));
        }
        assert!(followable(many));
        note(many, 2000, ADD, Some((1, 1)));
        assert!(!followable(many), "more than MAX_PER_SOCKET");
        forget(many);
    }

    #[test]
    fn registrations_follow_the_description_on_the_number() {
        // A real epoll set, a TCP socket registered with it, then another description put on
        // the socket's number (as the swap does): the event comes from the new one.
        let ep = sys::test_epoll();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        let data = 0xfeed_u64;
        sys::epoll_add(ep, fd, libc::EPOLLIN as u32, data).unwrap();
        note(fd, ep, ADD, Some((libc::EPOLLIN as u32, data)));
        let moved = unwatch(fd);
        assert_eq!(moved.len(), 1, "the registration was on the TCP socket");
        let (a, b) = sys::socketpair_stream().unwrap();
        sys::dup3(std::os::fd::AsFd::as_fd(&a), fd, true).unwrap();
        rewatch(fd, &moved);
        assert_eq!(sys::test_epoll_wait(ep), None, "nothing readable yet");
        let mut b = std::fs::File::from(b);
        std::io::Write::write_all(&mut b, b"x").unwrap();
        assert_eq!(
            sys::test_epoll_wait(ep),
            Some((libc::EPOLLIN as u32, data)),
            "the app's data, for the new description"
        );
        // A second unwatch finds nothing noted.
        assert!(unwatch(fd).is_empty());
        drop((a, b, tcp));
        sys::close_raw_for_test(ep);
    }
}
