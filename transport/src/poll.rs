//! Waiting on rsockets and ordinary fds together, through the provider's `rpoll`.
//!
//! An rsocket number is not a kernel fd, so `poll(2)` cannot watch it; `rpoll` takes a mix
//! of rsockets and ordinary fds. [`PollFd`] borrows what it watches, so neither an
//! [`RSocket`] nor a [`BorrowedFd`] can be closed while a poll refers to it.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ops::{BitOr, BitOrAssign};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use libc::{c_int, c_short, pollfd};

use crate::provider::Provider;
use crate::rsocket::RSocket;

/// A set of `poll` event bits.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Events(c_short);

impl Events {
    /// No events.
    pub const NONE: Events = Events(0);
    /// `POLLIN`: readable (data, EOF, or a pending connection on a listener).
    pub const READABLE: Events = Events(libc::POLLIN);
    /// `POLLOUT`: writable (also: a non-blocking connect finished).
    pub const WRITABLE: Events = Events(libc::POLLOUT);
    /// `POLLPRI`: urgent data.
    pub const PRIORITY: Events = Events(libc::POLLPRI);
    /// `POLLERR` (reported whether asked for or not).
    pub const ERROR: Events = Events(libc::POLLERR);
    /// `POLLHUP` (reported whether asked for or not).
    pub const HANGUP: Events = Events(libc::POLLHUP);
    /// `POLLNVAL`: not an open fd / rsocket.
    pub const INVALID: Events = Events(libc::POLLNVAL);

    /// The raw bits.
    pub fn bits(self) -> c_short {
        self.0
    }

    /// True if every bit of `other` is set.
    pub fn contains(self, other: Events) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if any bit of `other` is set.
    pub fn intersects(self, other: Events) -> bool {
        self.0 & other.0 != 0
    }

    /// True if nothing is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Events {
    type Output = Events;
    fn bitor(self, rhs: Events) -> Events {
        Events(self.0 | rhs.0)
    }
}

impl BitOrAssign for Events {
    fn bitor_assign(&mut self, rhs: Events) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Events::READABLE, "IN"),
            (Events::WRITABLE, "OUT"),
            (Events::PRIORITY, "PRI"),
            (Events::ERROR, "ERR"),
            (Events::HANGUP, "HUP"),
            (Events::INVALID, "NVAL"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(e, _)| self.contains(*e))
            .map(|(_, n)| *n)
            .collect();
        write!(f, "Events({})", set.join("|"))
    }
}

/// One entry of a poll set: an rsocket or an ordinary fd, the events wanted, and (after
/// [`poll`]) the events that occurred.
///
/// Layout: exactly a C `struct pollfd` (the marker is zero-sized), so a slice of these is
/// passed to `rpoll` as is.
#[repr(transparent)]
pub struct PollFd<'a> {
    raw: pollfd,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> PollFd<'a> {
    /// Watches an rsocket.
    pub fn rsocket(socket: &'a RSocket, events: Events) -> PollFd<'a> {
        PollFd::raw(socket.raw(), events)
    }

    /// Watches an ordinary (kernel) fd.
    pub fn fd(fd: BorrowedFd<'a>, events: Events) -> PollFd<'a> {
        PollFd::raw(fd.as_raw_fd(), events)
    }

    fn raw(fd: c_int, events: Events) -> PollFd<'a> {
        PollFd {
            raw: pollfd {
                fd,
                events: events.0,
                revents: 0,
            },
            _borrow: PhantomData,
        }
    }

    /// The events asked for.
    pub fn events(&self) -> Events {
        Events(self.raw.events)
    }

    /// Changes the events asked for (and clears the last result).
    pub fn set_events(&mut self, events: Events) {
        self.raw.events = events.0;
        self.raw.revents = 0;
    }

    /// The events the last [`poll`] reported.
    pub fn revents(&self) -> Events {
        Events(self.raw.revents)
    }
}

impl fmt::Debug for PollFd<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollFd")
            .field("fd", &self.raw.fd)
            .field("events", &self.events())
            .field("revents", &self.revents())
            .finish()
    }
}

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PollError {
    /// `rpoll` itself failed (`EINVAL`, `ENOMEM`, ...).
    #[error("rpoll failed")]
    Rpoll(#[source] io::Error),
}

impl From<PollError> for io::Error {
    fn from(e: PollError) -> io::Error {
        match e {
            PollError::Rpoll(e) => e,
        }
    }
}

/// A poll timeout in milliseconds: `None` waits forever; sub-millisecond remainders round up
/// so a short wait never turns into a busy poll.
fn timeout_ms(timeout: Option<Duration>) -> c_int {
    match timeout {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            c_int::try_from(ms).unwrap_or(c_int::MAX)
        }
    }
}

/// Waits until an entry of `fds` is ready or `timeout` passes; returns how many entries have
/// events (0 on timeout). An interrupted wait (`EINTR`) also returns 0, like an early timeout.
pub fn poll(
    provider: &Provider,
    fds: &mut [PollFd<'_>],
    timeout: Option<Duration>,
) -> Result<usize, PollError> {
    for fd in fds.iter_mut() {
        fd.raw.revents = 0;
    }
    match provider.poll(fds, timeout_ms(timeout)) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(PollError::Rpoll(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_millis(100))), 100);
        assert_eq!(timeout_ms(Some(Duration::from_secs(u64::MAX))), c_int::MAX);
    }

    #[test]
    fn pollfd_layout_matches_c() {
        assert_eq!(size_of::<PollFd<'_>>(), size_of::<pollfd>());
        assert_eq!(align_of::<PollFd<'_>>(), align_of::<pollfd>());
    }

    #[test]
    fn events_ops() {
        let e = Events::READABLE | Events::HANGUP;
        assert!(e.contains(Events::READABLE));
        assert!(e.intersects(Events::HANGUP | Events::WRITABLE));
        assert!(!e.contains(Events::WRITABLE));
        assert_eq!(format!("{e:?}"), "Events(IN|HUP)");
        assert!(Events::NONE.is_empty());
    }
}
