//! The app's own writes to the kept TCP socket before its direction moves (docs/shim-protocol.md,
//! "The move"): a relayed byte costs two thread hand-offs on the sending side (the app's
//! socketpair, then the engine's write), a byte the app's thread sends itself none.
//!
//! The engine's relay and the app's thread are the direction's two writers to the kept socket,
//! so [`EarlyWrites`] orders them under one lock:
//! - the app's thread sends only while the gate is open, nothing the app wrote to its
//!   socketpair end is unread there ([`unread_by_peer`]), the relay holds none of it
//!   ([`EarlyWrites::relay_holds`], set under the lock in the same pass that read them), and
//!   the app may still send on its end (no `shutdown(SHUT_WR)`: a FIN before the move waits in
//!   the engine, and no byte may follow it); each send is whole or short, never blocking
//!   (`MSG_DONTWAIT`), and what it did not take the caller writes to the socketpair as before;
//! - the relay reads the socketpair and publishes what it holds under the same lock;
//! - the move closes the gate under the lock ([`EarlyWrites::close`]) before the direction's
//!   count is read and the proof (or MOVED's count) goes behind it: every byte the app sent
//!   itself is in the kernel socket's queue ahead of them, and counted.
//!
//! A byte sent here is the app's as much as one it wrote to the socketpair: the engine adds
//! the count to the direction's ([`EarlyWrites::take_sent`]), so MOVED's count, the stream's
//! byte counts and the statistics see it. The lock is a leaf of the engine's lock order
//! ([`super::lock_order`]): nothing is taken under it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use std::io::IoSlice;

use nix::sys::socket::{MsgFlags, sendmsg};

use super::lock_order::{Guard, Level, OrderedMutex};
use crate::fd::may_send;
use crate::rdma::unread_by_peer;

/// See the module docs: one per connection, shared by its handles and its engine.
#[derive(Debug)]
pub(super) struct EarlyWrites {
    /// The gate, for the app's fast path (one atomic load on a connection that moved).
    open: AtomicBool,
    state: OrderedMutex<State>,
}

#[derive(Debug)]
struct State {
    /// The kept TCP socket while the gate is open (the engine owns it: a socket it let go of
    /// is not sent on).
    kept: Weak<OwnedFd>,
    /// The relay read bytes of the app's end that it has not written out yet.
    relay_holds: bool,
    /// Bytes the app's thread sent since the engine last took the count.
    sent: u64,
}

/// The lock, held by the engine around its reads of the app's end (see the module docs).
pub(super) struct Held<'a>(Guard<'a, State>);

impl EarlyWrites {
    pub(super) fn new() -> EarlyWrites {
        EarlyWrites {
            open: AtomicBool::new(false),
            state: OrderedMutex::new(
                Level::Early,
                State {
                    kept: Weak::new(),
                    relay_holds: false,
                    sent: 0,
                },
            ),
        }
    }

    /// Opens the gate onto `kept`: by the app's thread when it hands the connection to the
    /// engine (its first bytes need not wait for the engine to take it), and by the engine's
    /// relay until the direction's move. The count of bytes sent stays for the engine.
    pub(super) fn open(&self, kept: &Arc<OwnedFd>) {
        let mut state = self.state.lock();
        state.kept = Arc::downgrade(kept);
        state.relay_holds = false;
        self.open.store(true, Ordering::Release);
    }

    /// Closes the gate: no byte of the app's thread reaches the kept socket after this
    /// returns. What it sent stays counted for [`EarlyWrites::close_and_take`].
    pub(super) fn close(&self) {
        let mut state = self.state.lock();
        self.open.store(false, Ordering::Release);
        state.kept = Weak::new();
    }

    /// [`EarlyWrites::close`], and the bytes the app's thread sent that the engine has not
    /// counted yet.
    pub(super) fn close_and_take(&self) -> u64 {
        let mut state = self.state.lock();
        self.open.store(false, Ordering::Release);
        state.kept = Weak::new();
        std::mem::take(&mut state.sent)
    }

    /// Whether the gate is open (a hint: [`EarlyWrites::write`] checks again under the lock).
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The engine's hold of the lock, around a read of the app's end and what it publishes.
    pub(super) fn hold(&self) -> Held<'_> {
        Held(self.state.lock())
    }

    /// For the app's thread: sends the start of `buf` on the kept socket if the gate allows
    /// it now, for the app's end `app` (see the module docs). The byte count (at least 1);
    /// None: write to `app` as usual.
    pub(super) fn write(&self, app: RawFd, buf: &[u8]) -> Option<usize> {
        self.write_vectored(app, &[IoSlice::new(buf)])
    }

    /// [`EarlyWrites::write`] of the buffers `bufs` in turn (`writev`, `sendmsg`).
    pub(super) fn write_vectored(&self, app: RawFd, bufs: &[IoSlice<'_>]) -> Option<usize> {
        if bufs.iter().all(|b| b.is_empty()) || !self.is_open() {
            return None;
        }
        let mut state = self.state.lock();
        if !self.is_open() || state.relay_holds {
            return None;
        }
        if unread_by_peer(app).ok() != Some(0) || !may_send(app) {
            return None;
        }
        let kept = state.kept.upgrade()?;
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        // A full socket, an error or a reset: the bytes go to the socketpair, and the relay
        // meets the same condition there and answers for it as it always did.
        let n = sendmsg::<()>(kept.as_raw_fd(), bufs, &[], flags, None)
            .ok()
            .filter(|&n| n > 0)?;
        state.sent += n as u64;
        Some(n)
    }
}

impl Held<'_> {
    /// The relay holds bytes of the app's end that it has not written out (or holds none).
    pub(super) fn set_relay_holds(&mut self, holds: bool) {
        self.0.relay_holds = holds;
    }

    /// The bytes the app's thread sent since the last take.
    pub(super) fn take_sent(&mut self) -> u64 {
        std::mem::take(&mut self.0.sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::Shutdown;
    use std::os::unix::net::UnixStream;

    fn kept_pair() -> (Arc<OwnedFd>, UnixStream) {
        let (kept, far) = UnixStream::pair().unwrap();
        (Arc::new(kept.into()), far)
    }

    #[test]
    fn the_app_sends_only_through_an_open_gate_with_nothing_ahead_of_it() {
        let gate = EarlyWrites::new();
        let (kept, mut far) = kept_pair();
        let (mut app, _local) = UnixStream::pair().unwrap();
        assert_eq!(gate.write(app.as_raw_fd(), b"x"), None, "closed");
        gate.open(&kept);
        assert_eq!(gate.write(app.as_raw_fd(), b"abc"), Some(3));
        let bufs = [IoSlice::new(b"xy"), IoSlice::new(b""), IoSlice::new(b"z")];
        assert_eq!(gate.write_vectored(app.as_raw_fd(), &bufs), Some(3));
        assert_eq!(
            gate.write_vectored(app.as_raw_fd(), &[IoSlice::new(b"")]),
            None
        );
        gate.hold().set_relay_holds(true);
        assert_eq!(gate.write(app.as_raw_fd(), b"d"), None, "the relay's first");
        gate.hold().set_relay_holds(false);
        app.write_all(b"e").unwrap();
        assert_eq!(
            gate.write(app.as_raw_fd(), b"f"),
            None,
            "unread on the socketpair"
        );
        assert_eq!(gate.hold().take_sent(), 6);
        assert_eq!(gate.close_and_take(), 0);
        let mut got = [0u8; 6];
        far.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcxyz");
    }

    #[test]
    fn a_shut_end_or_a_closed_gate_or_a_dropped_socket_sends_nothing() {
        let gate = EarlyWrites::new();
        let (kept, _far) = kept_pair();
        let (app, _local) = UnixStream::pair().unwrap();
        gate.open(&kept);
        assert_eq!(gate.write(app.as_raw_fd(), b"a"), Some(1));
        gate.close();
        assert_eq!(gate.write(app.as_raw_fd(), b"b"), None);
        gate.open(&kept);
        assert_eq!(
            gate.close_and_take(),
            1,
            "kept across a close, counted once"
        );
        assert_eq!(gate.close_and_take(), 0);
        gate.open(&kept);
        app.shutdown(Shutdown::Write).unwrap();
        assert_eq!(
            gate.write(app.as_raw_fd(), b"c"),
            None,
            "after the app's FIN"
        );
        let (app, _local) = UnixStream::pair().unwrap();
        drop(kept);
        assert_eq!(gate.write(app.as_raw_fd(), b"d"), None, "the engine let go");
    }
}
