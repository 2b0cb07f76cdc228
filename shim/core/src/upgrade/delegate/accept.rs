//! A fork child's `accept()`: the engine's process claims the registration of the connection's
//! peer, as for a connection it accepted itself ([`super`]).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use libc::c_int;

use super::{CHILD_END, CLAIM, Heard, REPLY_MARGIN, Side, attach, next, reply, take_over};
use crate::log::{Level, log_at};
use crate::reason::{Path, Reason, Role};
use crate::sys::{self, fdpass};
use crate::upgrade::back;
use crate::upgrade::events::record;
use crate::upgrade::now;
use crate::upgrade::server::{Found, take_registration};
use crate::upgrade::swap::reset;

/// Replies.
const NONE: u8 = 0;
const GAVE_UP: u8 = 1;
const SWAPPED: u8 = 2;

/// In the engine's process: answers a child's claim of the accepted TCP socket `tcp` on
/// `answer_on`.
pub(super) fn answer(tcp: OwnedFd, answer_on: OwnedFd) {
    // The peer of the socket itself: a child can claim only the connection it holds.
    let Some(peer) = sys::peer_addr(tcp.as_raw_fd()).filter(|_| sys::is_tcp(tcp.as_raw_fd()))
    else {
        let _ = reply(&answer_on, NONE, None);
        return;
    };
    let (conn, side, claim_by) = match take_registration(peer, now()) {
        // No HELLO: a client that came through a Service's virtual IP is connected back to.
        None => match back::connect_back(tcp.as_raw_fd(), peer) {
            Some(back) => (
                back.conn,
                Side::ConnectedBack(back.cache),
                Some(back.claim_by),
            ),
            None => {
                let _ = reply(&answer_on, NONE, None);
                return;
            }
        },
        Some(Found::Fresh(p)) if p.conn.is_alive() => (p.conn, Side::Accepted, None),
        Some(Found::Fresh(_) | Found::Stale) => {
            let _ = reply(&answer_on, GAVE_UP, None);
            return;
        }
    };
    let (app, local) = match crate::upgrade::swap::engine_pair() {
        Ok(p) => p,
        Err(e) => {
            log_at!(Level::Info, "claim for {peer}: no socketpair ({e})");
            conn.abort();
            let _ = reply(&answer_on, NONE, None);
            return;
        }
    };
    if let Err(e) = reply(&answer_on, SWAPPED, Some(app.as_raw_fd())) {
        // The child is gone or gave up: it resets the connection itself.
        log_at!(
            Level::Debug,
            "claim for {peer}: the child did not take it ({e})"
        );
        conn.abort();
        return;
    }
    drop(app);
    attach(&conn, local, tcp, side, peer, answer_on, claim_by);
}

/// What a child's claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delegated {
    /// The engine's process holds no registration for this peer (or cannot be asked).
    None,
    /// Counted here: swapped, or left on TCP (the client gave up, or the claim failed).
    Done,
}

/// In a fork child: `accept()` returned `fd` from `peer` on a listener with an RDMA listener in
/// the engine's process; asks that process to claim it. Waits at most [`REPLY_MARGIN`] (the
/// answer needs no network); a process that does not answer by then gets the connection
/// reset, never shared: the child cannot know whether it attached the connection, and two
/// readers of one TCP socket would corrupt it.
pub fn claim(fd: c_int, peer: SocketAddr) -> Delegated {
    let channel = CHILD_END.load(std::sync::atomic::Ordering::Acquire);
    if channel < 0 {
        return Delegated::None;
    }
    claim_through(channel, fd, peer)
}

/// [`claim`] through `channel`: the claim channel of a fork child, or a conversation at the
/// door of the process that holds the RDMA listener of this listener's `SO_REUSEPORT` group
/// ([`crate::upgrade::group`]).
pub fn claim_through(channel: c_int, fd: c_int, peer: SocketAddr) -> Delegated {
    let Ok((mine, theirs)) = fdpass::seqpacket_pair() else {
        return Delegated::None;
    };
    let mine = sys::move_high(mine);
    let Ok(flags) = sys::fd_flags(fd) else {
        return Delegated::None;
    };
    // The channel end is the shim's (the fd table refuses an app's close of it).
    if fdpass::send(channel, &[CLAIM], &[fd, theirs.as_raw_fd()], false).is_err() {
        // The engine's process is gone: plain TCP.
        return Delegated::None;
    }
    drop(theirs);
    match next(&mine, REPLY_MARGIN) {
        // No registration; or the engine's process dropped the request (it died) before it
        // attached anything.
        Heard::Said(NONE, None) | Heard::Closed => Delegated::None,
        Heard::Said(GAVE_UP, None) => {
            record(Role::Server, fd, Some(peer), Path::Tcp, Reason::Timeout);
            Delegated::Done
        }
        Heard::Said(SWAPPED, Some(app)) => {
            if let Err(e) = take_over(fd, app, mine, flags).map(drop) {
                log_at!(
                    Level::Info,
                    "server fd {fd}: delegated swap failed ({e}): resetting"
                );
                reset(fd);
                record(Role::Server, fd, Some(peer), Path::Tcp, Reason::RdmaError);
            }
            Delegated::Done
        }
        Heard::Said(..) | Heard::Silent => {
            log_at!(
                Level::Info,
                "server fd {fd} peer {peer}: no answer to trust from the engine's process in \
                 {REPLY_MARGIN:?}: resetting"
            );
            reset(fd);
            record(Role::Server, fd, Some(peer), Path::Tcp, Reason::RdmaError);
            Delegated::Done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::start;
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use std::time::Instant;

    /// A connected loopback pair: (client, accepted, the client's address).
    fn tcp_pair() -> (TcpStream, TcpStream, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        (c, s, peer)
    }

    fn reply_of(tcp: OwnedFd) -> (u8, usize) {
        let (mine, theirs) = fdpass::seqpacket_pair().unwrap();
        answer(tcp, theirs);
        let mut buf = [9u8; 4];
        let got = fdpass::recv(mine.as_fd(), &mut buf, true).unwrap();
        assert_eq!(got.len, 1);
        (buf[0], got.fds.len())
    }

    #[test]
    fn a_claim_is_for_the_sent_sockets_own_peer_and_only_a_tcp_one() {
        let (_c, s, _) = tcp_pair();
        assert_eq!(reply_of(OwnedFd::from(s)), (NONE, 0), "no registration");
        let (u, _v) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(reply_of(OwnedFd::from(u)), (NONE, 0), "not a TCP socket");
    }

    /// In a fork child: `claim` against a listening process that is this test's thread
    /// (`start`), one that is gone, one that drops the request, and one that never answers.
    #[test]
    fn a_childs_claim_ends_in_tcp_at_once_or_a_reset_never_a_shared_socket() {
        start();
        let (mut c1, s1, peer1) = tcp_pair();
        let (mut c2, s2, peer2) = tcp_pair();
        let (fd1, fd2) = (s1.as_raw_fd(), s2.as_raw_fd());
        let child = sys::fork_for_test(|| {
            crate::upgrade::after_fork_child();
            // The listening process's thread: no registration, plain TCP at once.
            let t = Instant::now();
            assert_eq!(claim(fd1, peer1), Delegated::None);
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "{:?}",
                t.elapsed()
            );
            // A listening process that is gone.
            let (gone, theirs) = fdpass::seqpacket_pair().unwrap();
            drop(theirs);
            CHILD_END.store(gone.as_raw_fd(), Ordering::Release);
            assert_eq!(claim(fd1, peer1), Delegated::None);
            // One that takes the request and drops it (it died while answering).
            let (chan, server) = fdpass::seqpacket_pair().unwrap();
            CHILD_END.store(chan.as_raw_fd(), Ordering::Release);
            let dropper = std::thread::spawn(move || {
                let mut buf = [0u8; 4];
                let got = fdpass::recv(server.as_fd(), &mut buf, false).unwrap();
                assert_eq!(got.fds.len(), 2);
                server
            });
            assert_eq!(claim(fd1, peer1), Delegated::None);
            // One that keeps the request and never answers: the connection is reset.
            let server = dropper.join().unwrap();
            let t = Instant::now();
            assert_eq!(claim(fd2, peer2), Delegated::Done);
            assert!(t.elapsed() >= REPLY_MARGIN);
            drop(server);
        });
        assert_eq!(sys::wait_for_test(child), 0, "the child's checks");
        // The connection that went through TCP is untouched; the one reset reads EOF.
        std::io::Write::write_all(&mut &s1, b"ok").unwrap();
        let mut b = [0u8; 2];
        c1.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ok");
        c2.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(
            c2.read(&mut b).unwrap_or(0),
            0,
            "the reset connection ended"
        );
        drop(s2);
    }
}
