//! A fork child's `connect()`: the engine's process negotiates for the child's socket, the
//! child makes its own kernel connect, and the engine's process attaches the connection, whose
//! engine takes CLAIM and writes the proof on its copy of the socket ([`super`]; the steps are
//! `client.rs`'s).
//!
//! The conversation, on the request's reply pair:
//!
//! | from | message | when |
//! | --- | --- | --- |
//! | child | CONNECT{peer} with the socket (bound: its address is the HELLO's) | at `connect()` |
//! | engine's process | PLAIN with the reason | the peer is in its negative cache, or the RDMA connect failed: the child connects over TCP |
//! | engine's process | ESTABLISHED with the app's socketpair end | the server registered the connection |
//! | child | CONNECTED | it put the socketpair end on the app's number, then its kernel connect is established (else it puts the socket back and closes the pair) |
//! | engine's process | SWAPPED | it attached the socketpair's other end: the engine waits for CLAIM beside the app, writes the proof, or relays over TCP |
//!
//! The child's number moves to the socketpair before its kernel connect, as in-process
//! (`client.rs`): the server's `accept()` returns while the child still waits, and a thread of
//! the child that waits on the fd from then on must wait on what the stream fills. Nothing
//! reaches the TCP connection before CONNECTED, so every answer before it leaves the child a
//! plain socket; after it, a child that hears nothing it can trust (the engine's process died,
//! or did not answer within a margin) resets the socket rather than hand the app a connection
//! two processes may read.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::c_int;

use super::{
    CHILD_END, CONNECT, Heard, REPLY_MARGIN, Side, THREAD_STACK, attach, next, reply, take_over,
};
use crate::fdtable::{self, COUNTED};
use crate::guard::Guard;
use crate::log::{Level, log_at};
use crate::negotiation::put_addr;
use crate::reason::Reason;
use crate::services;
use crate::sys::{self, fdpass};
use crate::upgrade::back;
use crate::upgrade::client::{count_tcp, ensure_bound, open_stream, plain};
use crate::upgrade::swap::{reset, restore_tcp};
use crate::upgrade::{NEGATIVE, negotiate_timeout, now};

/// Messages (each conversation's own). PLAIN is a flag: its other bits are the fallback
/// reason's code.
const PLAIN: u8 = 0x80;
const ESTABLISHED: u8 = 2;
const CONNECTED: u8 = 3;
const SWAPPED: u8 = 6;

/// Children's connects negotiated at once; more stay TCP (`UNSUPPORTED`) until one ends.
const MAX_IN_FLIGHT: usize = 64;
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// In the engine's process: serves a child's connect of `tcp` to `peer` on a thread of its own
/// (it waits on the network for up to the negotiation bound, and for the child's kernel connect).
pub(super) fn spawn(tcp: OwnedFd, answer_on: OwnedFd, peer: SocketAddr) {
    if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        let _ = plain_reply(&answer_on, Reason::Unsupported);
        return;
    }
    // Started from the channel's thread, whose mask blocks every signal: so does this one's.
    let spawned = std::thread::Builder::new()
        .name(String::from("streamshim-conn"))
        .stack_size(THREAD_STACK)
        .spawn(move || {
            std::mem::forget(Guard::enter());
            serve(tcp, answer_on, peer);
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        log_at!(Level::Info, "connect for a fork child: no thread ({e})");
    }
}

/// PLAIN with `reason`.
fn plain_reply(on: &OwnedFd, reason: Reason) -> std::io::Result<()> {
    let code = u8::try_from(reason.code()).unwrap_or(0) & !PLAIN;
    reply(on, PLAIN | code, None)
}

/// The engine's side of one child's connect.
fn serve(tcp: OwnedFd, answer_on: OwnedFd, peer: SocketAddr) {
    // The HELLO names the socket's own address (the child bound it), not one the child says.
    let Some(client) =
        sys::local_addr(tcp.as_raw_fd()).filter(|a| a.port() != 0 && sys::is_tcp(tcp.as_raw_fd()))
    else {
        let _ = plain_reply(&answer_on, Reason::Unsupported);
        return;
    };
    // Its children's fallbacks are counted here: a destination that failed for one of them
    // stays TCP at once for all.
    if NEGATIVE.check(peer, now()).is_some() {
        let _ = plain_reply(&answer_on, Reason::NegativeCache);
        return;
    }
    let bound = negotiate_timeout();
    // A Service's virtual IP: the backend connects back ([`back`]).
    let service = services::is_service_ip(peer.ip());
    let made = if service {
        back::expect(tcp.as_raw_fd(), client, peer)
    } else {
        open_stream(peer, client, bound)
    };
    let conn = match made {
        Ok(conn) => conn,
        Err(reason) => {
            let _ = plain_reply(&answer_on, reason);
            return;
        }
    };
    let (app, local) = match crate::upgrade::swap::engine_pair() {
        Ok(p) => p,
        Err(e) => {
            log_at!(Level::Info, "connect for a fork child to {peer}: {e}");
            conn.abort();
            let _ = plain_reply(&answer_on, Reason::RdmaError);
            return;
        }
    };
    if reply(&answer_on, ESTABLISHED, Some(app.as_raw_fd())).is_err() {
        conn.abort();
        return;
    }
    drop(app);
    // The child's swap and kernel connect (a non-blocking one waits up to the bound there).
    // Anything else, or silence (the child resets the socket then), and the stream goes.
    if !matches!(
        next(&answer_on, bound + REPLY_MARGIN),
        Heard::Said(CONNECTED, None)
    ) {
        conn.abort();
        return;
    }
    if reply(&answer_on, SWAPPED, None).is_err() {
        // The child gave up: it resets the socket.
        conn.abort();
        return;
    }
    // The child's `connect()` returns now; the engine waits for CLAIM beside its app (or, to
    // a Service, for the connection back).
    let (side, claim_by) = if service {
        (Side::Expected(peer), now() + bound + back::BACK_WAIT)
    } else {
        (Side::Connected, now() + bound)
    };
    attach(&conn, local, tcp, side, peer, answer_on, Some(claim_by));
}

/// In a fork child: `connect(fd, peer)` for a capable ancestor's policy. Returns the kernel
/// connect's result (errno is the real call's), as `client::connect` does.
pub fn connect(
    fd: c_int,
    peer: SocketAddr,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> c_int {
    if NEGATIVE.check(peer, now()).is_some() {
        return plain(fd, peer, Reason::NegativeCache, real);
    }
    let channel = CHILD_END.load(Ordering::Acquire);
    if channel < 0 || ensure_bound(fd, peer).is_none() {
        return plain(fd, peer, Reason::Unsupported, real);
    }
    let Ok(flags) = sys::fd_flags(fd) else {
        return plain(fd, peer, Reason::Unsupported, real);
    };
    let Ok((mine, theirs)) = fdpass::seqpacket_pair() else {
        return plain(fd, peer, Reason::RdmaError, real);
    };
    let mine = sys::move_high(mine);
    let mut request = vec![CONNECT];
    put_addr(&mut request, peer);
    if fdpass::send(channel, &request, &[fd, theirs.as_raw_fd()], false).is_err() {
        return plain(fd, peer, Reason::RdmaError, real);
    }
    drop(theirs);
    let bound = negotiate_timeout();
    let app = match next(&mine, bound + REPLY_MARGIN) {
        Heard::Said(ESTABLISHED, Some(app)) => app,
        Heard::Said(said, None) if said & PLAIN != 0 => {
            let reason = Reason::from_code(u16::from(said & !PLAIN)).unwrap_or(Reason::RdmaError);
            return plain(fd, peer, reason, real);
        }
        // Nothing has touched the TCP connection: it stays a plain one.
        _ => return plain(fd, peer, Reason::Timeout, real),
    };
    let before = fdtable::get(fd);
    if before & COUNTED != 0 {
        // Another thread's connect of this fd counted it meanwhile: this one is the kernel's.
        return plain(fd, peer, Reason::Unsupported, real);
    }
    let (rc, err) = upgrade(fd, peer, app, &mine, flags, before, bound, real);
    // What the kernel connect answered, whatever the shim's own calls after it left in errno.
    sys::set_errno(err);
    rc
}

/// The child's steps after ESTABLISHED: the swap onto `app`, the kernel connect, the engine's
/// process's attach. Returns the kernel connect's (result, errno).
#[allow(clippy::too_many_arguments)]
fn upgrade(
    fd: c_int,
    peer: SocketAddr,
    app: OwnedFd,
    mine: &OwnedFd,
    flags: (c_int, c_int),
    before: u8,
    bound: std::time::Duration,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> (c_int, c_int) {
    // The reply pair is the stream's notice from here on (a copy: the conversation goes on
    // on `mine`).
    let notice = match sys::dup_cloexec(mine.as_raw_fd()) {
        Ok(n) => sys::move_high(n),
        Err(_) => {
            let rc = plain(fd, peer, Reason::RdmaError, real);
            return (rc, sys::errno());
        }
    };
    let (kept, moved) = match take_over(fd, app, notice, flags) {
        Ok(installed) => installed,
        Err(e) => {
            // The number still names the TCP socket (the swap failed before it moved); the
            // engine's process hears the pair close.
            log_at!(
                Level::Info,
                "client fd {fd}: delegated swap failed ({e}): plain TCP"
            );
            let rc = plain(fd, peer, Reason::RdmaError, real);
            return (rc, sys::errno());
        }
    };
    // The TCP socket back on the app's number: the connection stays TCP.
    let give_up = || {
        if let Err(e) = restore_tcp(fd, &kept, &moved, before) {
            log_at!(Level::Info, "client fd {fd}: undoing the swap failed ({e})");
        }
        fdtable::clear(kept.as_raw_fd());
    };
    let tcp = kept.as_raw_fd();
    let (rc, err) = real(tcp);
    if rc != 0 && err != libc::EINPROGRESS {
        // The kernel connect failed: the app sees exactly that error; not counted. Closing the
        // pair (at return) tells the engine's process.
        give_up();
        return (rc, err);
    }
    if rc != 0 {
        match sys::wait_established(tcp, bound) {
            sys::Established::Yes => {}
            sys::Established::Failed => {
                give_up();
                return (rc, err);
            }
            sys::Established::Pending => {
                give_up();
                let _ = NEGATIVE.insert(peer, Reason::Timeout, now());
                count_tcp(fd, peer, Reason::Timeout);
                return (rc, err);
            }
        }
    }
    if reply(mine, CONNECTED, None).is_err() {
        // Nothing was written on the connection: it stays TCP.
        give_up();
        count_tcp(fd, peer, Reason::RdmaError);
        return (rc, err);
    }
    match next(mine, REPLY_MARGIN) {
        // Attached: the number names the socketpair already.
        Heard::Said(SWAPPED, None) => {}
        // A gone or silent engine's process: it may have attached the socket.
        _ => {
            log_at!(
                Level::Info,
                "client fd {fd} peer {peer}: the engine's process failed the upgrade: resetting"
            );
            give_up();
            reset(fd);
            count_tcp(fd, peer, Reason::RdmaError);
        }
    }
    (rc, err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    /// What the double of the engine's process answers.
    #[derive(Clone, Copy, Debug)]
    enum Engine {
        Plain,
        GoneAfterConnected,
        Swapped,
    }

    /// The engine's side of the conversation, as `serve` speaks it, with a scripted outcome;
    /// returns the engine's socketpair end when it swapped.
    fn engine_double(server: OwnedFd, peer: SocketAddr, how: Engine, fd: c_int) -> Option<OwnedFd> {
        let mut buf = [0u8; 32];
        let got = fdpass::recv(server.as_fd(), &mut buf, false).unwrap();
        let mut want = vec![CONNECT];
        put_addr(&mut want, peer);
        assert_eq!(&buf[..got.len], &want[..], "CONNECT names the peer");
        let mut fds = got.fds.into_iter();
        let (tcp, answer_on) = (fds.next().unwrap(), fds.next().unwrap());
        assert!(
            sys::local_addr(tcp.as_raw_fd()).unwrap().port() != 0,
            "bound"
        );
        if let Engine::Plain = how {
            plain_reply(&answer_on, Reason::PeerNotShimmed).unwrap();
            return None;
        }
        let (app, local) = sys::socketpair_stream().unwrap();
        reply(&answer_on, ESTABLISHED, Some(app.as_raw_fd())).unwrap();
        drop(app);
        assert!(matches!(
            next(&answer_on, Duration::from_secs(2)),
            Heard::Said(CONNECTED, None)
        ));
        // The child's kernel connect is done, its `connect()` not yet: its number names the
        // socketpair already (a thread that waits on it from now on waits on the stream).
        assert!(fdtable::get(fd) & fdtable::SWAPPED != 0, "{how:?}: swapped");
        assert_eq!(sys::peer_addr(fd), None, "{how:?}: a socketpair end");
        match how {
            Engine::GoneAfterConnected => None,
            _ => {
                reply(&answer_on, SWAPPED, None).unwrap();
                std::mem::forget(answer_on);
                Some(local)
            }
        }
    }

    /// In a fork child (the channel is the child's own): every outcome of the conversation
    /// leaves the app a plain TCP connection, a reset one, or its socketpair end on the fd.
    #[test]
    fn a_childs_connect_follows_the_engines_answer() {
        // A listener per case: a fallback puts its destination in the negative cache.
        let listeners: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let child = sys::fork_for_test(|| {
            for (how, l) in [Engine::Plain, Engine::GoneAfterConnected, Engine::Swapped]
                .into_iter()
                .zip(&listeners)
            {
                let addr = l.local_addr().unwrap();
                let (chan, server) = fdpass::seqpacket_pair().unwrap();
                CHILD_END.store(chan.as_raw_fd(), Ordering::Release);
                let sock = std::net::TcpStream::from(sys::tcp_socket_for_test());
                let fd = sock.as_raw_fd();
                let double = std::thread::spawn(move || engine_double(server, addr, how, fd));
                let t = Instant::now();
                let rc = connect(fd, addr, &mut |n| sys::connect_for_test(n, addr));
                assert_eq!(rc, 0, "{how:?}");
                assert!(t.elapsed() < Duration::from_secs(3), "{how:?}");
                let local = double.join().unwrap();
                let swapped = fdtable::get(fd) & fdtable::SWAPPED != 0;
                let mut b = [0u8; 1];
                match how {
                    Engine::Plain => {
                        assert!(!swapped && sys::peer_addr(fd) == Some(addr), "{how:?}");
                    }
                    Engine::GoneAfterConnected => {
                        // Reset: the socket reads EOF at once.
                        assert_eq!(sys::poll_now(fd, libc::POLLIN) & libc::POLLIN, libc::POLLIN);
                        assert_eq!((&sock).read(&mut b).unwrap(), 0, "{how:?}");
                    }
                    Engine::Swapped => {
                        assert!(swapped);
                        std::io::Write::write_all(&mut &sock, b"x").unwrap();
                        let mut local = std::fs::File::from(local.unwrap());
                        local.read_exact(&mut b).unwrap();
                        assert_eq!(&b, b"x", "the app's fd is the socketpair end");
                        assert_eq!(sys::peer_addr(fd), None, "a socketpair end");
                        assert!(
                            crate::upgrade::kept(fd)
                                .is_some_and(|k| { sys::peer_addr(k.as_raw_fd()) == Some(addr) }),
                            "the kept socket answers getpeername"
                        );
                        crate::upgrade::forget_swapped(fd);
                    }
                }
                fdtable::set(fd, 0);
                drop(chan);
            }
        });
        assert_eq!(sys::wait_for_test(child), 0, "the child's checks");
        drop(listeners);
    }
}
