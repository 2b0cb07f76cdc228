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

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use super::delegate;
use crate::fdtable;
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::sys::{self, fdpass};

/// The abstract socket name of the door of a listener on `addr`.
fn name(addr: SocketAddr) -> Vec<u8> {
    format!("rdma-streams/port/{addr}").into_bytes()
}

/// The open doors (the serving thread polls them).
static DOORS: ForkSafe<Vec<Arc<OwnedFd>>> =
    ForkSafe::new([const { Mutex::new(Vec::new()) }; SLOTS]);
/// The eventfd that tells the serving thread the set changed (made with the first door).
static WAKE: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// A door, open while the RDMA listener it belongs to is.
#[derive(Debug)]
pub(super) struct Door(Arc<OwnedFd>);

impl Drop for Door {
    fn drop(&mut self) {
        DOORS.lock().retain(|d| !Arc::ptr_eq(d, &self.0));
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
            DOORS.lock().push(Arc::clone(&fd));
            wake();
            Some(Door(fd))
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

/// For the serving thread: the wake-up eventfd (made here at the latest, so that the thread
/// waits on it before the first door opens; drained) and the doors open now.
pub(super) fn doors() -> (Option<&'static OwnedFd>, Vec<Arc<OwnedFd>>) {
    let wake = wake_fd();
    if let Some(fd) = wake {
        sys::eventfd_drain(fd.as_raw_fd());
    }
    (wake, DOORS.lock().clone())
}

/// For the serving thread: takes each request waiting at `door` (one claim per conversation)
/// and answers it as a fork child's claim.
pub(super) fn answer(door: BorrowedFd<'_>) {
    while let Ok(Some(conv)) = fdpass::accept(door) {
        delegate::serve_one(&conv, false);
    }
}

/// In a fork child: the doors are the parent's (their fds were closed with the socketpair
/// ends); forgotten, not closed.
pub(super) fn after_fork_child() {
    if let Some(mut doors) = DOORS.after_fork() {
        std::mem::forget(std::mem::take(&mut *doors));
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
        let (wake, open_now) = doors();
        assert!(wake.is_some(), "the serving thread waits on the wake-up");
        assert!(open_now.iter().any(|d| Arc::ptr_eq(d, &door.0)));
        drop(open_now);
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
}
