//! Relaying between two kernel stream sockets, byte for byte: the shim's connection whose app
//! fd was already swapped when the peer turned out to stay on TCP (the app's socketpair end on
//! one side, the kept TCP socket on the other).
//!
//! Each direction has one buffer and one reader and writer over ordered streams, so bytes can
//! be neither reordered nor duplicated. EOF on one side becomes `shutdown(SHUT_WR)` on the other
//! once the buffer is written out; an error on either side tears both down (the TCP side with an
//! RST).
//!
//! A relay that an accepting side starts after it sent CLAIM and gave up waiting for the proof
//! is *guarded* ([`Relay::guarded`]): if the first bytes from the TCP side are that CLAIM's
//! secret, the client moved to the stream after all (its proof came late), and those bytes are
//! not the app's: the relay fails (both sides reset) instead of handing them on. Bytes that are
//! the secret's start wait for the rest, at most until the guard's deadline.
//!
//! The app's abortive close (`SO_LINGER {1, 0}`, which the hooks set on the kept socket too)
//! resets the far side once the bytes before it are written, as TCP sends an RST behind them;
//! a far side reset after its FIN (an app that wrote to a peer that had closed) ends the relay
//! at once, so the app's next write fails as TCP's would.
//!
//! Urgent data (`MSG_OOB`) is relayed as urgent: both sides read it inline (`SO_OOBINLINE`),
//! and a read never crosses the mark (TCP and `AF_UNIX` both end a read there), so a side at
//! its mark (`SIOCATMARK`) gives the urgent byte alone; it is written to the other side with
//! `MSG_OOB` at the same place in the stream. A byte that arrives between the look and the read
//! of an empty side is relayed inline (not lost).

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use super::proof::{self, Look};
use crate::fd;
use crate::rdma::unread_by_peer;
use crate::wire::Secret;

const BUFFER: usize = 64 * 1024;

/// One direction.
#[derive(Debug)]
struct Direction {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
    done: bool,
    /// The source was closed with a reset (see [`Toward::reset_if_closed`]).
    reset: bool,
    moved: u64,
    /// Where in `buf` the urgent byte not written yet is (only the latest, as TCP keeps one).
    urgent: Option<usize>,
}

impl Direction {
    /// `n` buffered bytes were written out.
    fn took(&mut self, n: usize) {
        self.start += n;
        self.moved += n as u64;
    }

    fn new() -> Direction {
        Direction {
            buf: vec![0; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            done: false,
            reset: false,
            moved: 0,
            urgent: None,
        }
    }
}

/// Readiness of one fd, edge-triggered: set by epoll events, cleared by `EAGAIN`.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Ready {
    pub(super) readable: bool,
    pub(super) writable: bool,
}

/// A relay between `local` and `far`.
#[derive(Debug)]
pub(super) struct Relay {
    pub(super) local: OwnedFd,
    pub(super) far: Arc<OwnedFd>,
    pub(super) local_ready: Ready,
    pub(super) far_ready: Ready,
    up: Direction,
    down: Direction,
    /// The far side's first bytes must not be this secret (see the module docs).
    guard: Option<(Secret, Instant)>,
    /// Stepped at least once ([`Relay::stepped`]).
    stepped: bool,
    /// The app's receive low-water mark ([`Relay::set_low_water`]).
    low_water: usize,
    /// The local side is an `AF_UNIX` socket (the shim's socketpair; [`Toward::urgent_in_one`]).
    local_is_unix: bool,
}

/// How a relay step ended.
#[derive(Debug)]
pub(super) enum Step {
    /// Waiting for readiness.
    Idle,
    /// Both directions finished.
    Finished,
    /// One side failed: both were torn down.
    Failed(io::Error),
}

impl Relay {
    pub(super) fn new(local: OwnedFd, far: Arc<OwnedFd>) -> Relay {
        // Urgent bytes are read inline and found at the mark (see the module docs).
        let _ = fd::set_urgent_inline(local.as_fd(), true);
        let _ = fd::set_urgent_inline(far.as_fd(), true);
        let local_is_unix = fd::is_local_socket(local.as_fd());
        Relay {
            local,
            far,
            // Unknown readiness: try both sides once.
            local_ready: Ready {
                readable: true,
                writable: true,
            },
            far_ready: Ready {
                readable: true,
                writable: true,
            },
            up: Direction::new(),
            down: Direction::new(),
            guard: None,
            stepped: false,
            low_water: 1,
            local_is_unix,
        }
    }

    /// A relay whose far side's first bytes must not be `secret` (see the module docs); bytes
    /// that are its start wait for the rest until `until`.
    pub(super) fn guarded(
        local: OwnedFd,
        far: Arc<OwnedFd>,
        secret: Secret,
        until: Instant,
    ) -> Relay {
        Relay {
            guard: Some((secret, until)),
            ..Relay::new(local, far)
        }
    }

    /// The app's `SO_RCVLOWAT` on its end: fewer bytes from the far side than this (at most
    /// half the buffer) wait here while the app's end holds none unread, as TCP keeps its
    /// socket unreadable below the mark (a socketpair end's `poll` ignores it).
    pub(super) fn set_low_water(&mut self, bytes: usize) {
        self.low_water = bytes.max(1);
    }

    /// Whether the relay was stepped since it started. One that was not must be stepped
    /// without waiting for an event: bytes written before it started (a server's banner)
    /// raise none.
    pub(super) fn stepped(&self) -> bool {
        self.stepped
    }

    /// When the guard stops waiting for the rest of the secret's start (the engine steps the
    /// relay then).
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.guard.map(|(_, until)| until)
    }

    /// Bytes local -> far and far -> local.
    pub(super) fn moved(&self) -> (u64, u64) {
        (self.up.moved, self.down.moved)
    }

    /// True while bytes the local side wrote are still buffered or unread (for the exit flush).
    pub(super) fn unflushed(&self) -> bool {
        !self.up.done
    }

    /// The far side's FIN came (all of its bytes were read): a failure after it is not a reset
    /// of the local side's direction, as for TCP after the peer's FIN.
    pub(super) fn far_finished(&self) -> bool {
        self.down.eof
    }

    /// Moves what it can without blocking. `draining`: a local side with nothing to read
    /// counts as EOF (the process is exiting).
    pub(super) fn step(&mut self, draining: bool) -> Step {
        self.stepped = true;
        if let Some((secret, until)) = self.guard {
            match proof::look(self.far.as_fd(), &secret) {
                Look::Whole => {
                    return self.fail(io::Error::other(
                        "the client moved to the stream after its proof was given up on",
                    ));
                }
                // The secret's start: the far side is not read until the rest comes or the
                // deadline passes (a TCP client whose first bytes happen to match).
                Look::Partial if Instant::now() < until => self.far_ready.readable = false,
                // The look took the far side's error: reading it again would say EOF.
                Look::Failed(e) => return self.fail(e),
                _ => self.guard = None,
            }
        }
        if self.down.eof && self.far_ready.readable {
            // After its FIN the far side is not read: a reset (the local side wrote to a peer
            // that had closed) ends the relay now, not at the next write.
            self.far_ready.readable = false;
            if let Some(e) = fd::take_error(self.far.as_fd()) {
                return self.fail(e);
            }
        }
        loop {
            let a = match pass(
                &mut self.up,
                self.local.as_fd(),
                &mut self.local_ready,
                self.far.as_fd(),
                &mut self.far_ready,
                Toward {
                    draining,
                    low_water: 1,
                    urgent_in_one: false,
                    reset_if_closed: true,
                },
            ) {
                Ok(p) => p,
                Err(e) => return self.fail(e),
            };
            let b = match pass(
                &mut self.down,
                self.far.as_fd(),
                &mut self.far_ready,
                self.local.as_fd(),
                &mut self.local_ready,
                Toward {
                    draining: false,
                    low_water: self.low_water,
                    urgent_in_one: self.local_is_unix,
                    reset_if_closed: false,
                },
            ) {
                Ok(p) => p,
                Err(e) => return self.fail(e),
            };
            if self.up.reset {
                // The app's abortive close: an RST behind the bytes, no FIN (the far side is
                // closed with a zero linger when the engine lets go of it).
                fd::reset(self.far.as_fd());
                return Step::Failed(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "the app closed with a reset (SO_LINGER 0)",
                ));
            }
            if self.up.done && self.down.done {
                return Step::Finished;
            }
            if !a && !b {
                return Step::Idle;
            }
        }
    }

    /// The far side is reset at once; the local side is shut down by the caller, after it
    /// reported the failure (`StreamConn::step_relay`).
    fn fail(&mut self, e: io::Error) -> Step {
        fd::reset(self.far.as_fd());
        fd::shutdown_quietly(self.far.as_fd(), Shutdown::Both);
        Step::Failed(e)
    }
}

/// How one direction's pass treats its sides.
struct Toward {
    /// The source with nothing to read counts as EOF (the process is exiting).
    draining: bool,
    /// The reader's mark on the destination ([`Relay::set_low_water`], 1: none).
    low_water: usize,
    /// The destination is an `AF_UNIX` socket: the bytes before an urgent byte and the byte
    /// go in one send, so its reader never finds the first without the mark. (A partial send
    /// to it takes no urgent byte; TCP's could mark a byte before it, so TCP gets two sends.)
    urgent_in_one: bool,
    /// At the source's EOF, a source closed (not only shut for writing) toward a destination
    /// set to reset on close is an abortive close: the destination is reset, not shut down.
    reset_if_closed: bool,
}

/// One direction's pass: read what fits, write what is buffered, half-close after EOF. True
/// if anything moved.
fn pass(
    d: &mut Direction,
    src: BorrowedFd<'_>,
    src_ready: &mut Ready,
    dst: BorrowedFd<'_>,
    dst_ready: &mut Ready,
    toward: Toward,
) -> io::Result<bool> {
    let Toward {
        draining,
        low_water,
        urgent_in_one,
        reset_if_closed,
    } = toward;
    let mut progressed = false;
    if !d.eof && d.end < d.buf.len() && src_ready.readable {
        // At the mark the read gives the urgent byte alone (see the module docs).
        let urgent = fd::at_mark(src);
        let want = if urgent { d.end + 1 } else { d.buf.len() };
        match fd::read(src, &mut d.buf[d.end..want]) {
            Ok(0) => {
                d.eof = true;
                progressed = true;
            }
            Ok(n) => {
                if urgent {
                    d.urgent = Some(d.end);
                }
                d.end += n;
                progressed = true;
                // An urgent byte right behind these is taken now, so that one send writes
                // them and it (see below): the app never finds the bytes without the mark.
                if !urgent && d.end < d.buf.len() && fd::at_mark(src) {
                    let at = d.end;
                    if let Ok(1) = fd::read(src, &mut d.buf[at..at + 1]) {
                        d.urgent = Some(at);
                        d.end += 1;
                    }
                }
            }
            Err(e) if fd::transient(&e) => {
                src_ready.readable = false;
                if draining {
                    d.eof = true;
                    progressed = true;
                }
            }
            Err(e) => return Err(e),
        }
    }
    // Below the reader's mark, with nothing unread on its side and more to come, bytes wait.
    let held = low_water > 1
        && !d.eof
        && d.urgent.is_none()
        && d.end - d.start < low_water.min(BUFFER / 2)
        && unread_by_peer(dst.as_raw_fd()).ok() == Some(0);
    if d.start < d.end && dst_ready.writable && !held {
        // The bytes before the urgent one, then the urgent byte (`MSG_OOB`): in one send to an
        // AF_UNIX side, in two to TCP, where a partial send of both in one call would mark a
        // byte before it.
        let urgent = d.urgent.filter(|&u| u >= d.start);
        let before = d.moved;
        let mut wrote = Ok(());
        let upto = urgent.unwrap_or(d.end);
        if let Some(u) = urgent
            && urgent_in_one
        {
            wrote = fd::write_urgent(dst, &d.buf[d.start..=u]).map(|n| {
                if n == u + 1 - d.start {
                    d.urgent = None;
                }
                d.took(n);
            });
        } else if d.start < upto {
            wrote = fd::write(dst, &d.buf[d.start..upto]).map(|n| d.took(n));
        }
        if wrote.is_ok() && !urgent_in_one && urgent == Some(d.start) {
            wrote = fd::write_urgent(dst, &d.buf[d.start..=d.start]).map(|n| {
                if n > 0 {
                    d.urgent = None;
                }
                d.took(n);
            });
        }
        match wrote {
            Ok(()) => progressed |= d.moved > before,
            Err(e) if fd::transient(&e) => dst_ready.writable = false,
            Err(e) => return Err(e),
        }
        if d.start == d.end {
            d.start = 0;
            d.end = 0;
            d.urgent = None;
        }
    }
    if d.end == d.buf.len() && d.start > 0 {
        d.buf.copy_within(d.start..d.end, 0);
        d.end -= d.start;
        d.urgent = d.urgent.map(|u| u - d.start);
        d.start = 0;
    }
    if d.eof && d.start == d.end && !d.done {
        if reset_if_closed && fd::resets_on_close(dst) && fd::peer_closed(src) {
            d.reset = true;
            d.done = true;
            return Ok(true);
        }
        fd::shutdown_quietly(dst, Shutdown::Write);
        d.done = true;
        progressed = true;
    }
    Ok(progressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// A relay between a fresh app side and a fresh far side (guarded when `guard` says so),
    /// and the app's and the far peer's ends.
    fn relay(guard: Option<(Secret, Instant)>) -> (Relay, UnixStream, UnixStream) {
        let (app, local) = UnixStream::pair().unwrap();
        let (far, peer) = UnixStream::pair().unwrap();
        local.set_nonblocking(true).unwrap();
        far.set_nonblocking(true).unwrap();
        let far = Arc::new(far.into());
        let r = match guard {
            Some((secret, until)) => Relay::guarded(local.into(), far, secret, until),
            None => Relay::new(local.into(), far),
        };
        (r, app, peer)
    }

    /// Sends "ab", urgent "!", "cd" on `from`; `to` must then hold "ab" before the mark, the
    /// urgent byte out of band, and "cd" after it.
    fn urgent_crosses(r: &mut Relay, from: &UnixStream, to: &mut UnixStream) {
        use nix::sys::socket::{MsgFlags, recv, send};
        let fd = from.as_raw_fd();
        send(fd, b"ab", MsgFlags::empty()).unwrap();
        send(fd, b"!", MsgFlags::MSG_OOB).unwrap();
        send(fd, b"cd", MsgFlags::empty()).unwrap();
        step_until(r, |_, _| fd::urgent_pending(to.as_fd()));
        step_until(r, |_, r| r.moved().0 + r.moved().1 >= 5);
        assert!(fd::urgent_pending(to.as_fd()), "exceptional readiness");
        let mut before = [0u8; 8];
        assert_eq!(to.read(&mut before).unwrap(), 2, "a read ends at the mark");
        assert_eq!(&before[..2], b"ab");
        assert!(fd::at_mark(to.as_fd()));
        let mut oob = [0u8; 1];
        let n = recv(to.as_raw_fd(), &mut oob, MsgFlags::MSG_OOB).unwrap();
        assert_eq!((n, &oob), (1, b"!"));
        let mut after = [0u8; 8];
        assert_eq!(to.read(&mut after).unwrap(), 2);
        assert_eq!(&after[..2], b"cd");
    }

    #[test]
    fn urgent_data_crosses_as_urgent_both_ways() {
        let (mut r, mut app, mut peer) = relay(None);
        urgent_crosses(&mut r, &app, &mut peer);
        urgent_crosses(&mut r, &peer, &mut app);
        assert_eq!(r.moved(), (5, 5));
    }

    #[test]
    fn relays_both_ways_with_half_close() {
        let (mut r, mut app, mut peer) = relay(None);
        app.write_all(b"hello").unwrap();
        app.shutdown(Shutdown::Write).unwrap();
        peer.write_all(b"world").unwrap();
        drop(peer.try_clone().unwrap());
        peer.shutdown(Shutdown::Write).unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Finished));
        assert!(matches!(step, Step::Finished), "{step:?}");
        let mut got = String::new();
        app.read_to_string(&mut got).unwrap();
        assert_eq!(got, "world");
        let mut got = String::new();
        peer.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello");
        assert_eq!(r.moved(), (5, 5));
    }

    #[test]
    fn bytes_below_the_apps_low_water_mark_wait_until_it_is_reached_or_lowered() {
        let (mut r, mut app, mut peer) = relay(None);
        app.set_nonblocking(true).unwrap();
        let mut got = [0u8; 8];
        r.set_low_water(4);
        peer.write_all(b"ab").unwrap();
        step_until(&mut r, |_, _| false);
        assert!(
            app.read(&mut got).is_err(),
            "2 bytes wait below a mark of 4"
        );
        peer.write_all(b"cd").unwrap();
        step_until(&mut r, |_, r| r.moved().1 == 4);
        assert_eq!(app.read(&mut got).unwrap(), 4);
        assert_eq!(&got[..4], b"abcd");
        peer.write_all(b"e").unwrap();
        step_until(&mut r, |_, _| false);
        assert!(app.read(&mut got).is_err(), "1 byte waits");
        r.set_low_water(1);
        step_until(&mut r, |_, r| r.moved().1 == 5);
        assert_eq!(app.read(&mut got).unwrap(), 1, "a lower mark lets it go");
        peer.write_all(b"fg").unwrap();
        r.set_low_water(8);
        drop(peer.try_clone().unwrap());
        peer.shutdown(Shutdown::Write).unwrap();
        step_until(&mut r, |_, r| r.moved().1 == 7);
        assert_eq!(
            app.read(&mut got).unwrap(),
            2,
            "the far side's EOF lets it go"
        );
    }

    #[test]
    fn bytes_written_before_the_relay_started_go_at_its_first_step() {
        // A server's banner, written while the engine still waited for the client's proof:
        // it raises no event once the relay runs, so the loop steps an unstepped relay at once.
        let (mut r, mut app, mut peer) = relay(None);
        app.write_all(b"220 ready").unwrap();
        assert!(!r.stepped());
        assert!(matches!(r.step(false), Step::Idle));
        assert!(r.stepped());
        let mut got = [0u8; 9];
        peer.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"220 ready");
    }

    fn step_until(r: &mut Relay, done: impl Fn(&Step, &Relay) -> bool) -> Step {
        let mut step = Step::Idle;
        for _ in 0..20 {
            r.local_ready = Ready {
                readable: true,
                writable: true,
            };
            r.far_ready = Ready {
                readable: true,
                writable: true,
            };
            step = r.step(false);
            if done(&step, r) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        step
    }

    /// A relay between a fresh app side and a TCP connection, and the app's end and the TCP
    /// peer.
    fn tcp_relay() -> (Relay, UnixStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let far = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        let (app, local) = UnixStream::pair().unwrap();
        local.set_nonblocking(true).unwrap();
        far.set_nonblocking(true).unwrap();
        (Relay::new(local.into(), Arc::new(far.into())), app, peer)
    }

    /// The app's abortive close (the hooks set `SO_LINGER {1, 0}` on the kept socket too): the
    /// TCP peer reads the bytes before it, then the reset.
    #[test]
    fn an_abortive_close_resets_the_tcp_side_behind_the_bytes() {
        let (mut r, mut app, mut peer) = tcp_relay();
        app.write_all(b"last").unwrap();
        step_until(&mut r, |_, r| r.moved().0 == 4);
        fd::reset(r.far.as_fd());
        drop(app);
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        // The engine lets go of the far side after the report; the RST goes then.
        let Relay { far, .. } = r;
        drop(far);
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"last");
        let mut more = [0u8; 4];
        let e = peer.read(&mut more).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        // An orderly close is a FIN.
        let (mut r, app, mut peer) = tcp_relay();
        drop(app);
        let step = step_until(&mut r, |_, r| r.up.done);
        assert!(!matches!(step, Step::Failed(_)), "{step:?}");
        assert_eq!(peer.read(&mut more).unwrap(), 0);
    }

    /// The TCP peer closed, then the app wrote: the peer's RST ends the relay at once (a
    /// failure after the peer's FIN), so the app's next write fails as TCP's would.
    #[test]
    fn a_reset_after_the_far_fin_ends_the_relay_at_once() {
        let (mut r, mut app, peer) = tcp_relay();
        drop(peer);
        step_until(&mut r, |_, r| r.far_finished());
        app.write_all(b"x").unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert!(
            r.far_finished(),
            "after the FIN: not a reset of the app's direction"
        );
    }

    const SECRET: Secret = Secret(*b"0123456789abcdef");

    #[test]
    fn a_guarded_relay_fails_on_a_late_proof_and_hands_on_anything_else() {
        let until = Instant::now() + std::time::Duration::from_secs(10);
        // A late proof: nothing of it reaches the app, both sides fail.
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        peer.write_all(&SECRET.0).unwrap();
        peer.write_all(b"stream bytes").unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Failed(_)));
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert_eq!(r.moved(), (0, 0));
        drop(r);
        let mut got = Vec::new();
        let _ = (&app).read_to_end(&mut got);
        assert!(got.is_empty(), "the app got {got:?}");

        // A TCP client: its bytes go on untouched, even when they start like the secret.
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        peer.write_all(b"0123").unwrap();
        assert!(matches!(r.step(false), Step::Idle));
        assert_eq!(r.moved(), (0, 0), "the secret's start waits for the rest");
        peer.write_all(b"-not-the-secret").unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        drop(app.try_clone().unwrap());
        app.shutdown(Shutdown::Write).unwrap();
        let step = step_until(&mut r, |s, _| matches!(s, Step::Finished));
        assert!(matches!(step, Step::Finished), "{step:?}");
        let mut got = String::new();
        (&app).read_to_string(&mut got).unwrap();
        assert_eq!(got, "0123-not-the-secret");
    }

    #[test]
    fn a_guard_gives_up_waiting_at_its_deadline() {
        let until = Instant::now() + std::time::Duration::from_millis(30);
        let (mut r, app, mut peer) = relay(Some((SECRET, until)));
        assert_eq!(r.deadline(), Some(until));
        peer.write_all(b"01").unwrap();
        assert!(matches!(r.step(false), Step::Idle));
        std::thread::sleep(std::time::Duration::from_millis(40));
        let _ = step_until(&mut r, |_, r| r.moved().1 == 2);
        assert_eq!(r.moved(), (0, 2));
        let mut got = [0u8; 2];
        (&app).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"01");
    }
}
