//! Fork children upgrade through the process whose engine they were forked from.
//!
//! A fork child (without exec) has no engine of its own: the RDMA libraries its parent
//! initialized cannot be used or rebuilt there. But pre-fork servers (nginx, gunicorn, Apache
//! prefork) accept and connect in their children, and the registrations of a listener live in
//! the engine of the process that called `listen()`. So a process whose engine starts also
//! makes a claim channel: a `SOCK_SEQPACKET` pair, one end served by a small thread of its own
//! ([`serve`]), the other inherited by every child it forks (both close-on-exec: a program it
//! execs decides afresh; the served end is closed in each child, so a gone parent reads as
//! EOF).
//!
//! A child sends a request with the TCP socket and one end of a fresh reply pair; the
//! conversation then runs on that pair:
//! - **accept** ([`accept`]): the connection a child's `accept()` returned is claimed by the
//!   engine's process exactly as one it accepted itself, for the socket's own peer
//!   (`getpeername` of the descriptor it received, never an address the child names);
//! - **connect** ([`connect`]): the engine's process makes the RDMA connect with HELLO for the
//!   child's socket, the child makes its own kernel connect, the engine's process waits for
//!   CLAIM and writes the proof on its copy of the socket.
//!
//! Either way the engine's process makes the socketpair, sends the app's end back and only then
//! attaches the other end with the TCP socket as the kept one; the child puts the app's end on
//! the app's fd number before `accept()`/`connect()` returns, as the swap does. The reply pair
//! then stays open for the connection's life: the engine's process writes to it how the stream
//! ended (a reset, or in order) before it ends the app's side, so the child's hooks report
//! `ECONNRESET` where the socketpair says EOF after a reset; a pair that closes without a word
//! (the engine's process died, and its streams with it) is a reset too.
//!
//! A child's stream runs in the engine's process, which must outlive it (as for an upgraded fd
//! a child inherits). It reads and writes its socketpair end (no direct ring access: the rings
//! are not mapped in the child), and urgent data and `SO_RCVLOWAT` are not told to the engine.

mod accept;
mod connect;

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::engine::{Attach, Conn, Event, Handshake};

use super::events::{count_bytes, on_back_event, on_event};
use super::swap;
use crate::fdtable::{self, SHIM_OWNED};
use crate::guard::Guard;
use crate::log::{Level, log_at};
use crate::negotiation::read_addr;
use crate::reason::Role;
use crate::sys::{self, fdpass};
use crate::watches::Watch;

pub use accept::{Delegated, claim, claim_through};
pub use connect::connect;

/// How much longer than the engine's process's own bound a child waits for its answer (a
/// stopped or overloaded parent costs this much, never a hang).
pub const REPLY_MARGIN: Duration = Duration::from_secs(2);

/// Requests on the channel.
const CLAIM: u8 = 1;
const CONNECT: u8 = 2;
/// At a door only: keep this conversation open, unanswered, while the RDMA listener is.
const WATCH: u8 = 3;
/// Written to the reply pair when the stream ends: in a reset, or in order.
const RESET_NOTICE: u8 = 0xEE;
const ORDERLY_NOTICE: u8 = 0x0D;

/// The children's end of the claim channel (-1: none). Inherited by fork children.
static CHILD_END: AtomicI32 = AtomicI32::new(-1);

/// In a process whose engine started: makes the claim channel and starts the thread that
/// serves it. Once per process; later calls do nothing.
pub fn start() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let (serve_end, child_end) = match fdpass::seqpacket_pair() {
        Ok((s, c)) => (sys::move_high(s), sys::move_high(c)),
        Err(e) => {
            log_at!(Level::Info, "no claim channel for fork children: {e}");
            return;
        }
    };
    // The serving end is closed in every fork child (as the engine's socketpair ends are), so
    // a gone engine's process reads as EOF at its children's ends.
    fdtable::set_pair_end(serve_end.as_raw_fd());
    fdtable::set(child_end.as_raw_fd(), SHIM_OWNED);
    // Named before the thread runs: a question can come as soon as a connection is handed on.
    let handed = super::handed::listener();
    let spawned = std::thread::Builder::new()
        .name(String::from("streamshim-fork"))
        .stack_size(THREAD_STACK)
        .spawn(move || {
            // The thread's calls go straight to libc, as the engine thread's do.
            std::mem::forget(Guard::enter());
            serve(&serve_end, handed.as_ref());
        });
    match spawned {
        Ok(_) => CHILD_END.store(child_end.into_raw_fd(), Ordering::Release),
        Err(e) => log_at!(Level::Info, "no claim thread for fork children: {e}"),
    }
}

/// The stack of the channel's threads (they call the engine's handles and libc only).
const THREAD_STACK: usize = 256 << 10;

/// Whether this process can ask an engine's process to upgrade its connections: a fork child
/// of a process whose engine started.
pub fn has_channel() -> bool {
    CHILD_END.load(Ordering::Acquire) >= 0
}

/// The channel's thread: reads requests one at a time. A claim is answered at once (it waits
/// on nothing but the registration table's lock); a connect, which waits on the network, gets
/// a thread of its own ([`connect::serve`]). Between them it answers other processes' questions
/// about connections handed to them (`handed`, on its listener) and the claims and watches of
/// processes of its listeners' `SO_REUSEPORT` groups (`group`, on their doors), and watches
/// the holders of the groups its own listeners joined without an RDMA listener, taking it over
/// when one lets go. Ends when the channel fails (never while the process lives).
fn serve(sock: &OwnedFd, handed: Option<&OwnedFd>) {
    let mut watches = super::group::Watches::default();
    loop {
        // The wake-up only makes the loop read the doors and the groups again (drained by
        // `round`).
        let round = super::group::round();
        let now = Instant::now();
        watches.update(&super::server::held_elsewhere(), now);
        let own: Vec<&OwnedFd> = [Some(sock), handed, round.wake]
            .into_iter()
            .flatten()
            .chain(round.doors.iter().map(|(_, d)| &**d))
            .chain(round.watchers.iter().map(|w| &**w))
            .collect();
        let watching = watches.fds();
        let fds: Vec<_> = own.iter().map(|f| f.as_fd()).chain(watching).collect();
        let ready = fdpass::wait_any(&fds, watches.bound(now));
        drop(fds);
        let (mine, theirs) = ready.split_at(own.len());
        let waiting = |fd: &OwnedFd| {
            own.iter()
                .zip(mine)
                .any(|(f, r)| *r && std::ptr::eq(*f, fd))
        };
        if waiting(sock) && serve_one(sock, true) == Served::Closed {
            log_at!(Level::Info, "claim channel closed");
            return;
        }
        if let Some(listener) = handed.filter(|l| waiting(l)) {
            super::handed::answer(listener);
        }
        for (addr, door) in round.doors.iter().filter(|(_, d)| waiting(d)) {
            super::group::answer(*addr, door.as_fd());
        }
        for watcher in round.watchers.iter().filter(|w| waiting(w)) {
            super::group::drop_watcher(watcher);
        }
        watches.ended(theirs, Instant::now());
    }
}

/// What [`serve_one`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Served {
    /// A request answered, or ignored (malformed, none within the bound).
    Answered,
    /// A watch at a door: the conversation is to be kept open, unanswered
    /// ([`super::group`]).
    Watch,
    /// `on` is closed or failed.
    Closed,
}

/// Reads one request from `on` (the claim channel, or a conversation at a door: a claim or a
/// watch, no connect) and answers it.
pub(super) fn serve_one(on: &OwnedFd, connects: bool) -> Served {
    if !connects && !fdpass::wait_readable(on.as_fd(), REQUEST_BOUND) {
        return Served::Answered;
    }
    let mut buf = [0u8; 32];
    let got = match fdpass::recv(on.as_fd(), &mut buf, true) {
        Ok(got) if got.len == 0 => return Served::Closed,
        Ok(got) => got,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Served::Answered,
        Err(e) => {
            log_at!(Level::Info, "claim channel failed: {e}");
            return Served::Closed;
        }
    };
    if !connects && !got.truncated && got.len == 1 && buf[0] == WATCH && got.fds.is_empty() {
        return Served::Watch;
    }
    let mut fds = got.fds.into_iter();
    let (tcp, reply) = match (got.truncated, fds.next(), fds.next()) {
        (false, Some(tcp), Some(reply)) => (sys::move_high(tcp), sys::move_high(reply)),
        _ => {
            log_at!(Level::Debug, "claim channel: a malformed request ignored");
            return Served::Answered;
        }
    };
    match (got.len, buf[0]) {
        (1, CLAIM) => accept::answer(tcp, reply),
        (n, CONNECT) if connects => match read_addr(&buf[1..n]) {
            Ok(peer) => connect::spawn(tcp, reply, peer),
            Err(_) => log_at!(Level::Debug, "claim channel: a malformed connect ignored"),
        },
        _ => log_at!(Level::Debug, "claim channel: an unknown request ignored"),
    }
    Served::Answered
}

/// Asks, on a conversation at the door of a process of our `SO_REUSEPORT` group, to be kept
/// waiting while its RDMA listener is open ([`super::group`]).
pub(super) fn ask_watch(conv: &OwnedFd) -> std::io::Result<()> {
    fdpass::send(conv.as_raw_fd(), &[WATCH], &[], true)
}

/// How long a door's conversation may take to send its request once connected.
const REQUEST_BOUND: Duration = Duration::from_millis(200);

/// Tells the other end of a notice pair how its stream ended (`reset`, or in order).
pub(super) fn tell_end(on: &OwnedFd, reset: bool) {
    let word = if reset { RESET_NOTICE } else { ORDERLY_NOTICE };
    let _ = reply(on, word, None);
}

/// Sends `status` (and `fd`) on a conversation's reply pair, without blocking.
fn reply(on: &OwnedFd, status: u8, fd: Option<c_int>) -> std::io::Result<()> {
    let fds: Vec<c_int> = fd.into_iter().collect();
    fdpass::send(on.as_raw_fd(), &[status], &fds, true)
}

/// What the other side of a conversation did next.
#[derive(Debug)]
enum Heard {
    /// A one-byte message, with at most one fd.
    Said(u8, Option<OwnedFd>),
    /// It closed the pair without a word: it gave the conversation up, or died.
    Closed,
    /// Nothing within the bound, or something malformed: nothing it did can be trusted.
    Silent,
}

/// Waits, at most `bound`, for what the other side of a conversation does next.
fn next(on: &OwnedFd, bound: Duration) -> Heard {
    if !fdpass::wait_readable(on.as_fd(), bound) {
        return Heard::Silent;
    }
    let mut buf = [0u8; 4];
    match fdpass::recv(on.as_fd(), &mut buf, true) {
        Ok(got) if got.len == 0 => Heard::Closed,
        Ok(got) if got.len == 1 && !got.truncated && got.fds.len() <= 1 => {
            Heard::Said(buf[0], got.fds.into_iter().next())
        }
        _ => Heard::Silent,
    }
}

/// Attaches a child's connection to its stream with `tcp` as the kept socket; `notice` hears
/// of a reset; `claim_by`: a connect's engine waits for CLAIM until then ([`Attach::claim_by`]).
/// Which side of its binding a delegated connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// A child's accepted connection that a client registered.
    Accepted,
    /// A child's connect.
    Connected,
    /// A child's accepted connection whose client came through a Service: the engine connects
    /// back to it ([`crate::upgrade::back`]); the negative cache's key if it stays TCP.
    ConnectedBack(SocketAddr),
    /// A child's connect to a Service's virtual IP (the key): the backend connects back.
    Expected(SocketAddr),
}

fn attach(
    conn: &Conn,
    local: OwnedFd,
    tcp: OwnedFd,
    side: Side,
    peer: SocketAddr,
    notice: OwnedFd,
    claim_by: Option<Instant>,
) {
    // The child's install sets the socket's linger as a swap does (one socket, two numbers).
    let kept = Arc::new(tcp);
    let broken = Arc::new(AtomicBool::new(false));
    let (mut inner, handshake) = match side {
        Side::Accepted => (
            on_event(Role::Server, -1, Some(peer), broken),
            Handshake::Claim,
        ),
        Side::Connected => (
            on_event(Role::Client, -1, Some(peer), broken),
            Handshake::Confirm,
        ),
        Side::ConnectedBack(cache) => (
            on_back_event(Role::Server, -1, Some(peer), broken, cache),
            Handshake::Confirm,
        ),
        Side::Expected(cache) => (
            on_back_event(Role::Client, -1, Some(peer), broken, cache),
            Handshake::Claim,
        ),
    };
    let mut notice = Some(notice);
    conn.attach(
        local,
        Attach {
            kept: Some(kept),
            handshake,
            on_event: Box::new(move |event| {
                if let Event::Ended(end) = &event
                    && let Some(n) = notice.take()
                {
                    // Before the engine ends the app's side: the child reads it at that EOF.
                    let word = if end.reset {
                        RESET_NOTICE
                    } else {
                        ORDERLY_NOTICE
                    };
                    let _ = reply(&n, word, None);
                }
                inner(event);
            }),
            on_bytes: Some(count_bytes),
            claim_by,
            give_back: None,
        },
    );
}

/// In the child: puts the socketpair end `app` on the app's `fd` as a swap does
/// ([`swap::install`]), with `notice` for how the stream ended. Returns the kept copy of the
/// TCP socket and the epoll registrations that moved ([`swap::restore_tcp`] puts them back).
fn take_over(
    fd: c_int,
    app: OwnedFd,
    notice: OwnedFd,
    flags: (c_int, c_int),
) -> std::io::Result<(Arc<OwnedFd>, Vec<Watch>)> {
    fdtable::set(notice.as_raw_fd(), SHIM_OWNED);
    let notice = Arc::new(Notice {
        fd: notice,
        settled: AtomicBool::new(false),
    });
    swap::install(fd, app, flags, Some(notice)).map(|(kept, _, moved)| (kept, moved))
}

/// A child's end of a connection's reply pair: how its stream ended.
#[derive(Debug)]
pub struct Notice {
    fd: OwnedFd,
    /// The end was read (reported once).
    settled: AtomicBool,
}

impl Notice {
    /// The notice read from `fd`, one end of a `SOCK_SEQPACKET` pair whose other end the
    /// engine's process writes to ([`tell_end`]).
    pub(super) fn new(fd: OwnedFd) -> Notice {
        fdtable::set(fd.as_raw_fd(), SHIM_OWNED);
        Notice {
            fd,
            settled: AtomicBool::new(false),
        }
    }

    /// Whether the stream ended in a reset, once: true when the engine's process said so or
    /// closed the pair without a word (it died, and the stream with it); false for an orderly
    /// end, while the stream runs, and after the first answer.
    pub fn take_reset(&self) -> bool {
        if self.settled.load(Ordering::Acquire) {
            return false;
        }
        let mut buf = [0u8; 1];
        let reset = match fdpass::recv(self.fd.as_fd(), &mut buf, true) {
            Ok(got) if got.len == 0 => true,
            Ok(_) => buf[0] != ORDERLY_NOTICE,
            Err(_) => return false,
        };
        !self.settled.swap(true, Ordering::AcqRel) && reset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice() -> (Notice, OwnedFd) {
        let (mine, theirs) = fdpass::seqpacket_pair().unwrap();
        let n = Notice {
            fd: mine,
            settled: AtomicBool::new(false),
        };
        (n, theirs)
    }

    #[test]
    fn a_reset_is_noticed_once_and_an_orderly_end_never() {
        let (n, theirs) = notice();
        assert!(!n.take_reset(), "running");
        reply(&theirs, RESET_NOTICE, None).unwrap();
        assert!(n.take_reset());
        assert!(!n.take_reset(), "once");
        drop(theirs);
        assert!(!n.take_reset(), "still once");
        let (n, theirs) = notice();
        reply(&theirs, ORDERLY_NOTICE, None).unwrap();
        drop(theirs);
        assert!(!n.take_reset(), "an orderly end");
        assert!(!n.take_reset());
        // The engine's process died with the stream: no word, the pair closed.
        let (n, theirs) = notice();
        drop(theirs);
        assert!(n.take_reset());
        assert!(!n.take_reset());
    }
}
