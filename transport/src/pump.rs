//! The pump: moves bytes both ways between a local stream socket and an rsocket.
//!
//! In proxy mode the app's fd is one end of an `AF_UNIX` socketpair; the shim hands the other
//! end (`local`) and the upgraded connection's rsocket (`remote`) to [`pump`], on a thread of
//! its own. One thread serves both directions: both sides are switched to non-blocking, each
//! direction has its own buffer, and the thread sleeps in the provider's `rpoll` (which takes
//! the rsocket and the kernel fd together).
//!
//! - **Order**: each direction has one reader and one writer over ordered streams, and a
//!   buffer is written out in order before it is refilled, so bytes can neither be reordered
//!   nor duplicated.
//! - **Half-close**: EOF read on one side becomes `shutdown(SHUT_WR)` on the other once the
//!   buffered bytes are delivered; the other direction keeps flowing. The pump ends when both
//!   directions are finished ([`PumpEnd::Closed`]).
//! - **Errors**: an error or reset on either side tears both down: the local fd gets
//!   `shutdown(SHUT_RDWR)` (the app reads EOF and its writes fail, as after a TCP reset), the
//!   rsocket `rshutdown(SHUT_RDWR)`, and the pump reports which side failed and how.
//! - **Hostile providers**: `EAGAIN` when `rpoll` said ready is retried; `rpoll` never waits
//!   longer than [`PumpOptions::tick`] (at most 100 ms), after which every transfer is retried
//!   anyway, so a provider that misses a wake-up slows the pump down but cannot stall it.
//! - **Stop**: [`PumpOptions::stop`] is checked at least once per tick; raising it ends the
//!   pump with [`PumpEnd::Stopped`] after the same teardown as an error.
//! - **Relay**: [`relay`] runs the same loop with a kernel stream socket as the far side: the
//!   shim uses it for a connection whose app fd it had already swapped when the peer turned out
//!   to have stayed on TCP (docs/shim-protocol.md, "Sequence").
//! - **Watched socket**: [`PumpOptions::watch`] (the shim's kept kernel TCP socket, which
//!   carries no bytes after an upgrade) is polled while the pump waits. A reset or error on it
//!   tears both sides down ([`PumpError::Watched`]), and so do bytes arriving on it (the peer
//!   is not speaking the protocol); a FIN only ends the watch, because a peer that finished
//!   cleanly closes its TCP socket while its last bytes may still be in flight on the stream.

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use socket2::Socket;

use crate::poll::{Events, PollError, PollFd, poll};
use crate::provider::Provider;
use crate::rsocket::RSocket;

/// Default size of each direction's buffer: 256 KiB, rsocket's default registered buffers.
pub const DEFAULT_BUFFER_SIZE: usize = 256 * 1024;
/// The longest the pump sleeps in `rpoll` before re-checking the stop flag and retrying.
pub const MAX_TICK: Duration = Duration::from_millis(100);

/// How a pump runs.
#[derive(Debug, Clone)]
pub struct PumpOptions {
    /// Bytes buffered per direction (default [`DEFAULT_BUFFER_SIZE`]; at least 1).
    pub buffer_size: usize,
    /// Raise to end the pump; checked at least once per tick.
    pub stop: Arc<AtomicBool>,
    /// Longest single wait in `rpoll` (default and maximum [`MAX_TICK`]).
    pub tick: Duration,
    /// A kernel socket that must stay silent while the pump runs (see the module docs).
    pub watch: Option<Arc<OwnedFd>>,
    /// Flush-at-exit control shared with the pump's owner (see [`PumpControl`]).
    pub control: Arc<PumpControl>,
}

/// Lets the owner of a running pump flush it when the process exits: the app will write no
/// more, but what it wrote must still reach the peer (a kernel TCP socket would deliver it
/// after the process is gone; the pump dies with the process).
#[derive(Debug, Default)]
pub struct PumpControl {
    drain: AtomicBool,
    sent_all: AtomicBool,
}

impl PumpControl {
    /// Asks the pump to treat "nothing more to read from the app right now" as the app's
    /// EOF: it delivers what it has, half-closes the rsocket, and reports [`Self::sent_all`].
    pub fn drain(&self) {
        self.drain.store(true, Ordering::Release);
    }

    /// True once everything the app wrote was written to the rsocket and its write side
    /// half-closed (or the pump ended).
    pub fn sent_all(&self) -> bool {
        self.sent_all.load(Ordering::Acquire)
    }

    /// Says the connection has nothing left to flush without a pump having run (its owner gave
    /// it up, or the pump already ended): [`Self::sent_all`] is true from now on.
    pub fn finished(&self) {
        self.sent_all.store(true, Ordering::Release);
    }
}

impl Default for PumpOptions {
    fn default() -> PumpOptions {
        PumpOptions {
            buffer_size: DEFAULT_BUFFER_SIZE,
            stop: Arc::new(AtomicBool::new(false)),
            tick: MAX_TICK,
            watch: None,
            control: Arc::new(PumpControl::default()),
        }
    }
}

/// Why a pump failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PumpError {
    /// Reading from or writing to the local socket failed (the app side).
    #[error("local side failed")]
    Local(#[source] io::Error),
    /// Reading from or writing to the rsocket failed (`ECONNRESET` and the like: reason
    /// `RDMA_ERROR` for the shim).
    #[error("rsocket side failed")]
    Remote(#[source] io::Error),
    /// `rpoll` itself failed.
    #[error("rpoll failed")]
    Poll(#[source] PollError),
    /// The watched kernel socket was reset, failed, or received bytes.
    #[error("watched socket failed")]
    Watched(#[source] io::Error),
}

/// How a pump ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum PumpEnd {
    /// Both directions reached EOF and were half-closed on the far side: a clean close.
    Closed,
    /// The stop flag was raised; both sides were shut down.
    Stopped,
    /// An error on one side; both sides were shut down.
    Failed(PumpError),
}

impl PumpEnd {
    /// True for [`PumpEnd::Closed`].
    pub fn is_clean(&self) -> bool {
        matches!(self, PumpEnd::Closed)
    }
}

/// What a pump did.
#[derive(Debug)]
pub struct PumpReport {
    /// Bytes written to the rsocket (read from the local side).
    pub to_remote: u64,
    /// Bytes written to the local side (read from the rsocket).
    pub to_local: u64,
    /// How it ended.
    pub end: PumpEnd,
}

/// One side of the pump, as the direction logic sees it.
trait Side {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn send(&self, buf: &[u8]) -> io::Result<usize>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// Wraps an error of this side.
    fn fail(e: io::Error) -> PumpError;
}

impl Side for Socket {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut me = self;
        me.read(buf)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        // MSG_NOSIGNAL: an app that closed its end must not kill the process with SIGPIPE.
        self.send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        Socket::shutdown(self, how)
    }

    fn fail(e: io::Error) -> PumpError {
        PumpError::Local(e)
    }
}

impl Side for RSocket {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.write(buf)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        RSocket::shutdown(self, how)
    }

    fn fail(e: io::Error) -> PumpError {
        PumpError::Remote(e)
    }
}

/// The far side of a pump: how it is polled and made non-blocking.
trait Far: Side {
    fn entry(&self, events: Events) -> PollFd<'_>;
    fn set_nonblocking(&self) -> io::Result<()>;
}

impl Far for RSocket {
    fn entry(&self, events: Events) -> PollFd<'_> {
        PollFd::rsocket(self, events)
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        RSocket::set_nonblocking(self, true)
    }
}

/// A kernel stream socket as the far side ([`relay`]): its errors are the remote side's. Shared
/// (the shim keeps answering `getpeername` from it while the relay runs).
struct KernelFar(Arc<OwnedFd>);

impl KernelFar {
    fn socket(&self) -> socket2::SockRef<'_> {
        socket2::SockRef::from(&*self.0)
    }
}

impl Side for KernelFar {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        Side::recv(&*self.socket(), buf)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        Side::send(&*self.socket(), buf)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        Side::shutdown(&*self.socket(), how)
    }

    fn fail(e: io::Error) -> PumpError {
        PumpError::Remote(e)
    }
}

impl Far for KernelFar {
    fn entry(&self, events: Events) -> PollFd<'_> {
        PollFd::fd(self.0.as_fd(), events)
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        self.socket().set_nonblocking(true)
    }
}

/// One direction: a buffer between a source and a destination.
struct Direction {
    buf: Box<[u8]>,
    /// Bytes `start..end` are read but not yet written.
    start: usize,
    end: usize,
    /// EOF was read from the source.
    eof: bool,
    /// The destination was half-closed after the EOF: this direction is finished.
    done: bool,
    /// Bytes written to the destination.
    moved: u64,
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl Direction {
    fn new(size: usize) -> Direction {
        Direction {
            buf: vec![0; size.max(1)].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            done: false,
            moved: 0,
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    fn wants_read(&self) -> bool {
        !self.eof && self.end < self.buf.len()
    }

    /// Reads, writes and half-closes as far as possible without blocking; true if anything
    /// happened. Errors are attributed to the side they came from.
    fn step<S: Side, D: Side>(&mut self, src: &S, dst: &D) -> Result<bool, PumpError> {
        let mut progressed = false;
        if self.wants_read() {
            match src.recv(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    progressed = true;
                }
                Ok(n) => {
                    self.end += n;
                    progressed = true;
                }
                Err(e) if transient(&e) => {}
                Err(e) => return Err(S::fail(e)),
            }
        }
        if self.pending() {
            match dst.send(&self.buf[self.start..self.end]) {
                Ok(n) => {
                    self.start += n;
                    self.moved += n as u64;
                    progressed |= n > 0;
                    if self.start == self.end {
                        self.start = 0;
                        self.end = 0;
                    } else if self.end == self.buf.len() {
                        // Make room for the next read behind the unsent bytes.
                        self.buf.copy_within(self.start..self.end, 0);
                        self.end -= self.start;
                        self.start = 0;
                    }
                }
                Err(e) if transient(&e) => {}
                Err(e) => return Err(D::fail(e)),
            }
        }
        if self.eof && !self.pending() && !self.done {
            dst.shutdown(Shutdown::Write).map_err(D::fail)?;
            self.done = true;
            progressed = true;
        }
        Ok(progressed)
    }
}

/// Rounds of transfers before the stop flag is checked again while data keeps flowing.
const ROUNDS_PER_CHECK: usize = 64;

/// Moves bytes between `local` (a stream socket, e.g. one end of a `UNIX` socketpair) and
/// `remote` until both directions are closed, one side fails, or `opts.stop` is raised.
/// Both are closed when it returns. See the module docs for the rules.
pub fn pump(local: OwnedFd, remote: RSocket, opts: PumpOptions) -> PumpReport {
    drive(local, &remote, remote.provider(), &opts)
}

/// [`pump`] with a kernel stream socket (`remote`, for example a TCP connection) as the far
/// side instead of an rsocket; `provider`'s `rpoll` does the waiting. Same rules, same report
/// (`to_remote` and `to_local` count the kernel socket's bytes). `opts.watch` should be `None`
/// (the far side is the socket a watch would look at).
pub fn relay(
    local: OwnedFd,
    remote: Arc<OwnedFd>,
    provider: &Provider,
    opts: PumpOptions,
) -> PumpReport {
    drive(local, &KernelFar(remote), provider, &opts)
}

fn drive<R: Far>(
    local: OwnedFd,
    remote: &R,
    provider: &Provider,
    opts: &PumpOptions,
) -> PumpReport {
    let local = Socket::from(local);
    let mut up = Direction::new(opts.buffer_size);
    let mut down = Direction::new(opts.buffer_size);
    let end = match run(&local, remote, provider, &mut up, &mut down, opts) {
        Ok(end) => end,
        Err(e) => PumpEnd::Failed(e),
    };
    if !end.is_clean() {
        // Tear both down; errors here change nothing (the side may already be gone).
        let _ = local.shutdown(Shutdown::Both);
        let _ = remote.shutdown(Shutdown::Both);
    }
    opts.control.sent_all.store(true, Ordering::Release);
    PumpReport {
        to_remote: up.moved,
        to_local: down.moved,
        end,
    }
}

fn run<R: Far>(
    local: &Socket,
    remote: &R,
    provider: &Provider,
    up: &mut Direction,
    down: &mut Direction,
    opts: &PumpOptions,
) -> Result<PumpEnd, PumpError> {
    local.set_nonblocking(true).map_err(PumpError::Local)?;
    remote.set_nonblocking().map_err(PumpError::Remote)?;
    let tick = opts.tick.min(MAX_TICK);
    let mut watch = opts.watch.as_deref().map(AsFd::as_fd);
    loop {
        if opts.stop.load(Ordering::Acquire) {
            return Ok(PumpEnd::Stopped);
        }
        let mut busy = false;
        if opts.control.drain.load(Ordering::Acquire) && !up.eof && !up.pending() {
            // The process is exiting: what the app wrote is in the socketpair now or never.
            let mut probe = [std::mem::MaybeUninit::new(0u8); 1];
            let waiting = local.peek(&mut probe).is_ok_and(|n| n > 0);
            if !waiting {
                up.eof = true;
            }
        }
        for _ in 0..ROUNDS_PER_CHECK {
            let moved_up = up.step(local, remote)?;
            if up.done {
                opts.control.sent_all.store(true, Ordering::Release);
            }
            let moved_down = down.step(remote, local)?;
            if up.done && down.done {
                return Ok(PumpEnd::Closed);
            }
            busy = moved_up || moved_down;
            if !busy {
                break;
            }
        }
        if busy {
            // Still moving data: skip the wait, but look at the stop flag first.
            continue;
        }
        if wait(local, remote, provider, up, down, watch, tick)?
            && let Some(fd) = watch
            && !still_silent(fd)?
        {
            watch = None;
        }
    }
}

/// What a look at a kernel stream socket's receive queue found ([`peek`]).
#[derive(Debug)]
pub enum Peeked {
    /// Open, nothing to read yet.
    Nothing,
    /// Bytes are waiting.
    Bytes,
    /// The peer half-closed (FIN).
    Fin,
    /// Reset or failed.
    Failed(io::Error),
}

/// Looks at `fd`'s receive queue without taking anything or blocking (`MSG_PEEK |
/// MSG_DONTWAIT`, one byte): how the pump watches the shim's kept TCP socket, and how the shim
/// tells whether a client that was offered the rsocket stayed on TCP.
pub fn peek(fd: BorrowedFd<'_>) -> Peeked {
    let sock = socket2::SockRef::from(&fd);
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match sock.recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(0) => Peeked::Fin,
        Ok(_) => Peeked::Bytes,
        Err(e) if transient(&e) => Peeked::Nothing,
        Err(e) => Peeked::Failed(e),
    }
}

/// Looks at the watched socket after `rpoll` flagged it: true while it is open and silent,
/// false after a FIN (stop watching), an error for a reset, an error or stray bytes.
fn still_silent(fd: BorrowedFd<'_>) -> Result<bool, PumpError> {
    match peek(fd) {
        Peeked::Nothing => Ok(true),
        Peeked::Fin => Ok(false),
        Peeked::Bytes => Err(PumpError::Watched(io::Error::new(
            io::ErrorKind::InvalidData,
            "bytes arrived on the kept TCP connection",
        ))),
        Peeked::Failed(e) => Err(PumpError::Watched(e)),
    }
}

/// Sleeps in `rpoll` until a side can make progress or `tick` passes. Sides with nothing to
/// wait for are left out, so a hung-up side with no pending work cannot cause a busy loop.
fn wait<R: Far>(
    local: &Socket,
    remote: &R,
    provider: &Provider,
    up: &Direction,
    down: &Direction,
    watch: Option<BorrowedFd<'_>>,
    tick: Duration,
) -> Result<bool, PumpError> {
    let mut local_events = Events::NONE;
    let mut remote_events = Events::NONE;
    if up.wants_read() {
        local_events |= Events::READABLE;
    }
    if up.pending() {
        remote_events |= Events::WRITABLE;
    }
    if down.wants_read() {
        remote_events |= Events::READABLE;
    }
    if down.pending() {
        local_events |= Events::WRITABLE;
    }
    let mut entries = Vec::with_capacity(3);
    if let Some(fd) = watch {
        entries.push(PollFd::fd(fd, Events::READABLE));
    }
    if !local_events.is_empty() {
        entries.push(PollFd::fd(local.as_fd(), local_events));
    }
    if !remote_events.is_empty() {
        entries.push(remote.entry(remote_events));
    }
    poll(provider, &mut entries, Some(tick)).map_err(PumpError::Poll)?;
    Ok(watch.is_some() && !entries[0].revents().is_empty())
}
