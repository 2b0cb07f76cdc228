//! The stream engine: RDMA streams over the connection manager and verbs, driven by one event
//! loop thread per process.
//!
//! A connection is one RC queue pair with a receive ring the peer writes into and a send ring
//! its own writes come from ([`crate::flow`] has the arithmetic, [`crate::wire`] the bytes).
//! Its life: connect (or an incoming request the listener's [`Acceptor`] decides on), then
//! [`Conn::attach`] to a local fd, which the engine pumps both ways until both sides finished
//! (FIN each way, then a CM disconnect) or one failed (disconnect at once; the local fd is shut
//! down and a kept TCP socket reset). A peer that vanishes is noticed by a zero-length RDMA
//! WRITE after [`EngineConfig::keepalive`] of silence, which fails after the QP's retries.
//!
//! # Threads
//!
//! An [`Engine`] owns one thread that sleeps in `epoll_wait` on the CM event channel, each
//! device's completion channel, a wake-up eventfd, and every attached connection's local fd
//! (the app's socketpair end, or a TCP socket) and kept TCP socket. That thread makes every CM
//! call, creates and destroys every verbs resource, polls every CQ and moves the bytes the app
//! sends and reads through its socketpair. Other threads talk to it through [`Conn`] and
//! [`Listener`] handles (a command queue plus the eventfd) and wait on a connection's state
//! (`shared`).
//!
//! Two things happen on the app's threads, and only these: a [`Reader`] copies received bytes
//! out of the receive ring (`rx`), and a [`Writer`] copies bytes into the send ring and posts
//! the RDMA write itself (`tx`). Each half keeps its state behind its own lock, private to
//! its module; the locks are taken in one order, written down and checked in debug builds in
//! `lock_order`. The engine turns both off, under those locks, before a connection's queue
//! pair is destroyed or its region serves another connection.
//!
//! # Modules
//!
//! The cut follows the kernel's `net/smc`:
//!
//! | module | concern | net/smc |
//! | --- | --- | --- |
//! | `tx` | the send half: data writes, control messages and probes posted, signalling, direct writes | `smc_tx.c` |
//! | `rx` | the receive half: arrivals, delivery, credits owed, direct reads | `smc_rx.c` |
//! | `cdc` | control messages: queued, posted, completed; a peer's checked | `smc_cdc.c` |
//! | `wr` | work request ids and completions told apart | `smc_wr.c` |
//! | `link` | one queue pair's resources; completions handed to the halves | `smc_core.c` (link) |
//! | `stream` | one connection's life: attach, binding, relay, fail, finish | `smc_close.c`, `af_smc.c` |
//! | `binding`, `proof` | what the peer may send by the handshake; the TCP proof | (SMC's CLC handshake) |
//! | `event_loop` | the thread: epoll, CM events, commands, timers | |
//! | `relay` | a connection that stays on TCP, relayed | |
//! | `park` | finished connections kept for the next one between the same two processes | (SMC-R's link groups) |
//! | `rings` | when a stream's rings move to their busy size and back | (`smc_buf_create`'s sizing) |
//! | `pool`, `budget`, `pin_limits` | kept regions and the pinned-memory budget | |

mod binding;
mod budget;
mod cdc;
mod early;
mod event_loop;
mod link;
mod lock_order;
mod park;
mod pin_limits;
mod pool;
mod proof;
mod relay;
mod rings;
mod rx;
mod shared;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_tests;
mod stream;
mod tx;
mod wr;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};

pub use budget::Budget;
pub use pin_limits::{MEMORY_SHARE, PinLimits};
pub use rx::Reader;
pub use shared::{ConnectError, RejectedBy};
pub use tx::Writer;

use crate::rdma::{Lib, PortSpace};
use lock_order::{Level, OrderedMutex};
use shared::ConnShared;

/// Tunables of an engine.
#[derive(Clone)]
pub struct EngineConfig {
    /// Bytes of each ring (receive and send; a power of two, 4 KiB..16 MiB) while a stream is
    /// busy.
    pub ring_bytes: usize,
    /// Bytes of each ring when a stream starts, and again once it has been idle
    /// ([`DEFAULT_START_RING`]; at most `ring_bytes`: equal, the rings never change).
    pub start_ring_bytes: usize,
    /// Send queue depth.
    pub send_queue: u32,
    /// Posted receives.
    pub recv_queue: u32,
    /// The QP's local ACK timeout exponent on the connecting side (4.096 us * 2^n per try; 7
    /// tries). 18 (1.07 s): with 16 (0.27 s) a loaded host's Soft-RoCE retransmitted spuriously
    /// and rxe 6.1 broke streams on those retries ([`MAX_UNACKED`]); a dead peer node is found
    /// within the keepalive plus 7 tries.
    pub ack_timeout: u8,
    /// Silence after which a liveness probe is sent.
    pub keepalive: Duration,
    /// How long an established connection may wait for [`Conn::attach`] (and a deferred
    /// request for its decision) before it is dropped.
    pub unattached_timeout: Duration,
    /// How long the accepting side of [`Handshake::Claim`] waits for its stream to be bound
    /// (the client's proof on the TCP connection and its CONFIRM) before it relays over TCP.
    pub claim_timeout: Duration,
    /// How long a disconnect waits for the CM's confirmation before the id is destroyed.
    pub disconnect_timeout: Duration,
    /// The rdma_cm port space of listeners and connects.
    pub port_space: PortSpace,
    /// Bytes the engine may pin (None: unlimited).
    pub memlock_limit: Option<u64>,
    /// Incoming connections not attached yet (deciding, or accepted and waiting for their app:
    /// unauthenticated state) at most, in all ...
    pub max_unattached: usize,
    /// ... and from one peer address. A request past either is refused before anything is
    /// allocated for it ([`crate::wire::TransportReject::Busy`]).
    pub max_unattached_per_peer: usize,
    /// Registered regions of finished connections kept for the next ones (0: none). Each keeps
    /// its pinned memory (and its share of the budget) while it waits.
    pub kept_regions: usize,
    /// How long a kept region waits for a connection before it is given back.
    pub kept_region_idle: Duration,
    /// A connection of the shim's handshakes that finished in order keeps its queue pair for
    /// the next connection between the same two processes (`park`; docs/shim-protocol.md,
    /// "Reused connections").
    pub reuse_links: bool,
    /// Told every long-lived fd the engine or the RDMA libraries open (the shim protects them
    /// from the app's `close()`).
    pub fd_observer: Option<Arc<dyn Fn(RawFd) + Send + Sync>>,
    /// Run first on the engine thread (the shim enters its re-entrancy guard there).
    pub on_thread_start: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The thread's name.
    pub thread_name: String,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("ring_bytes", &self.ring_bytes)
            .field("start_ring_bytes", &self.start_ring_bytes)
            .field("send_queue", &self.send_queue)
            .field("recv_queue", &self.recv_queue)
            .field("port_space", &self.port_space)
            .field("memlock_limit", &self.memlock_limit)
            .field("max_unattached", &self.max_unattached)
            .field("max_unattached_per_peer", &self.max_unattached_per_peer)
            .field("kept_regions", &self.kept_regions)
            .field("kept_region_idle", &self.kept_region_idle)
            .field("reuse_links", &self.reuse_links)
            .finish_non_exhaustive()
    }
}

/// Default ring size: 2 MiB each way, the ring the shim and the gateway use unless told
/// otherwise (`docs/shim.md`: about 4 MiB pinned per connection for a 2 MiB transfer in flight).
pub const DEFAULT_RING: usize = 2 << 20;
/// Default ring when a stream starts (and once it is idle again): 64 KiB each way, so an idle
/// stream pins 200 KiB; a busy one moves to [`EngineConfig::ring_bytes`] (`link::rings`).
pub const DEFAULT_START_RING: usize = 64 << 10;
/// The most bytes a stream keeps posted and not completed (unacknowledged by the peer's device),
/// whatever its ring: the ring beyond it holds what the peer's app has not read yet. The
/// default 2 MiB rings are in flight whole; larger rings stay within what was measured. The
/// more of a stream is unacknowledged, the more an ACK timeout re-sends, and Debian 12's rxe
/// (Linux 6.1) can break on such a retry ("remote invalid request", or a write delivered
/// twice); with the ACK timeout of [`EngineConfig::ack_timeout`] 2 MiB in flight held
/// (`docs/benchmarks.md`, "The 1.07 s ACK timeout").
pub const MAX_UNACKED: usize = 2 << 20;
/// Bytes of one control slot.
const SLOT: usize = crate::wire::CONTROL_LEN;
/// Queue pair and completion queue memory a provider may pin per connection, beyond the
/// buffers (an estimate for the budget; mlx5 pins its queues, rxe does not).
pub const QUEUE_ALLOWANCE: u64 = 64 * 1024;

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            ring_bytes: DEFAULT_RING,
            start_ring_bytes: DEFAULT_START_RING,
            send_queue: 64,
            recv_queue: 64,
            ack_timeout: 18,
            keepalive: Duration::from_secs(5),
            unattached_timeout: Duration::from_secs(10),
            claim_timeout: Duration::from_secs(10),
            disconnect_timeout: Duration::from_secs(1),
            port_space: PortSpace::Ib,
            memlock_limit: None,
            max_unattached: 256,
            max_unattached_per_peer: 64,
            kept_regions: 8,
            kept_region_idle: Duration::from_secs(2),
            reuse_links: true,
            fd_observer: None,
            on_thread_start: None,
            thread_name: String::from("rdma-streams"),
        }
    }
}

impl EngineConfig {
    /// The ring size actually used (a power of two in range).
    pub fn ring(&self) -> usize {
        ring_size(self.ring_bytes)
    }

    /// The ring a stream starts with (a power of two in range, at most [`EngineConfig::ring`]).
    pub fn start_ring(&self) -> usize {
        ring_size(self.start_ring_bytes).min(self.ring())
    }

    /// The ring a busy stream moves to: [`EngineConfig::ring`], or 0 when it is the start
    /// ring (the rings never change).
    pub fn busy_ring(&self) -> usize {
        if self.ring() > self.start_ring() {
            self.ring()
        } else {
            0
        }
    }

    /// The largest single RDMA write with the busy rings: a quarter of the ring, so the peer's
    /// credits come back while the rest of the ring is still being written, and at most half
    /// of [`EngineConfig::max_unacked`], so two writes are in flight and the next one is posted
    /// while the last one's acknowledgement is on its way.
    pub fn max_chunk(&self) -> usize {
        crate::flow::chunk_for(self.ring() as u64, self.max_unacked() as u64) as usize
    }

    /// The most bytes posted and not completed: the ring, at most [`MAX_UNACKED`].
    pub fn max_unacked(&self) -> usize {
        self.ring().min(MAX_UNACKED)
    }

    /// The control slots' bytes (one per posted receive and per send queue entry).
    pub(crate) fn slot_bytes(&self) -> usize {
        (self.recv_queue.max(4) as usize + self.send_queue.max(4) as usize) * SLOT
    }

    /// Bytes a connection registers when it starts: both start rings and the control slots
    /// (the region's first part, rounded to pages; the busy rings follow it).
    pub fn start_bytes(&self) -> usize {
        (2 * self.start_ring() + self.slot_bytes()).div_ceil(4096) * 4096
    }

    /// Bytes one connection maps: its start part, then a busy receive ring and a busy send
    /// ring (mapped, not touched or pinned until a busy stream registers them).
    pub fn region_bytes(&self) -> usize {
        self.start_bytes() + 2 * self.busy_ring()
    }

    /// Bytes one connection pins when it starts and while it is idle, as the budget counts
    /// them: its start part and [`QUEUE_ALLOWANCE`]. A busy stream pins a busy ring more per
    /// direction it moves bytes in ([`EngineConfig::busy_ring`]), when the budget has room.
    pub fn pinned_per_connection(&self) -> u64 {
        self.start_bytes() as u64 + QUEUE_ALLOWANCE
    }

    /// The most one connection pins: its start part, both busy rings and the allowance.
    pub fn pinned_when_busy(&self) -> u64 {
        self.pinned_per_connection() + 2 * self.busy_ring() as u64
    }
}

/// `bytes` as a ring: in the wire's range, rounded up to a power of two.
fn ring_size(bytes: usize) -> usize {
    bytes
        .clamp(
            1 << crate::wire::MIN_RING_LOG,
            1 << crate::wire::MAX_RING_LOG,
        )
        .next_power_of_two()
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A kernel object (epoll, eventfd, the CM event channel) could not be made.
    #[error("cannot set up the engine: {what}")]
    Setup {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The thread could not be started.
    #[error("cannot start the engine thread")]
    Thread(#[source] io::Error),
}

/// How a connection's stream starts: chosen when it is made ([`ConnectRequest::handshake`],
/// [`Acceptor::handshake`]) and given again to [`Conn::attach`]. It also says what the peer may
/// send before the stream carries bytes; anything else fails the stream
/// (docs/shim-protocol.md, "Binding").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// Pump at once (the gateway, both sides).
    Open,
    /// The connecting side of the shim: takes one CLAIM, writes its secret on the kept TCP
    /// socket (the proof), then sends CONFIRM and pumps ([`Attach::claim_by`]). On a
    /// connection that is already gone, relay over the kept TCP socket instead.
    Confirm,
    /// The accepting side of the shim: at attach sends CLAIM with a fresh secret and binds the
    /// stream once the secret came first on the kept TCP socket (taken off it) and the peer's
    /// CONFIRM arrived; nothing the peer sent reaches the app before. Anything else (other
    /// bytes or EOF on the TCP socket, the peer's disconnect or a message out of place, nothing
    /// within [`EngineConfig::claim_timeout`]) relays over the kept TCP socket, guarded against
    /// a late proof.
    Claim,
}

/// What happened to an attached connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Which path carries the bytes (once per connection, when known).
    Decided(StreamPath),
    /// The connection ended (last event).
    Ended(End),
}

/// The path a connection's bytes take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPath {
    /// The RDMA stream.
    Rdma,
    /// Relayed over the kept TCP socket (the peer stayed on TCP).
    Tcp,
    /// Relayed over the kept TCP socket because the peer never claimed the connection: a
    /// connecting side attached with [`Attach::claim_by`] got no CLAIM by then, its peer
    /// disconnected first, or the peer's app spoke TCP first (another process accepted it).
    Unclaimed,
    /// Neither: the connection failed before a path was agreed (the kept socket was reset).
    Broken,
    /// The connection ended on TCP, or was reset there, before it moved to its stream: it was
    /// TCP all along (a connection shorter than the stream's setup).
    Unmoved,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// The path it ran on.
    pub path: StreamPath,
    /// Bytes from the local fd to the peer.
    pub sent: u64,
    /// Bytes from the peer to the local fd.
    pub received: u64,
    /// Both directions finished normally; otherwise why not.
    pub error: Option<String>,
    /// The app's side reports the end as a reset (`ECONNRESET`), as TCP does for an RST that
    /// comes before the peer's FIN: the stream failed while bytes of the peer's direction could
    /// still be missing. False for an orderly end, and for a failure after the peer's FIN (TCP
    /// then reads EOF and answers a write with `EPIPE`).
    ///
    /// A reset `AF_UNIX` local side is closed after this report without a shutdown. An owner
    /// that queues a byte into it from the app's end while the report runs makes the kernel
    /// report the reset on the app's end (`ECONNRESET`, `POLLERR`) when it closes, as an
    /// `AF_UNIX` socket whose peer closed with unread bytes does.
    pub reset: bool,
}

/// The path bytes of a connection with a stream took ([`Attach::on_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    /// The stream.
    Stream,
    /// The kept TCP socket, before that direction moved to the stream, or before the
    /// connection turned out to stay on TCP (the first bytes, which never wait for the stream).
    BeforeMove,
}

/// Options of [`Conn::attach`].
pub struct Attach {
    /// A kernel TCP socket of the same connection (the shim's), watched while the stream runs
    /// and used for [`Handshake::Confirm`]/[`Handshake::Claim`]'s relay. Shared: the shim answers
    /// `getpeername` and TCP options from it; it closes when the last holder lets go (reset
    /// first if the stream failed).
    pub kept: Option<Arc<OwnedFd>>,
    /// How to start: the connection's own handshake (another one ends it as broken).
    pub handshake: Handshake,
    /// Called on the engine thread with each [`Event`]; must not block.
    pub on_event: Box<dyn FnMut(Event) + Send>,
    /// Called on the engine thread as bytes move (the path, then sent and received since the
    /// last call), so counts are current even when the process exits before the stream ends.
    pub on_bytes: Option<fn(Carried, u64, u64)>,
    /// [`Handshake::Confirm`] only: the connecting side attached before its CLAIM came (its
    /// app's `connect()` returned with the TCP connection's). The engine reads nothing of
    /// `local` for the stream until CLAIM comes, at the latest by then; it then writes the
    /// CLAIM's secret on `kept` (the proof: behind every byte of the app, the relay's and those
    /// the app's thread sent itself, [`Writer::write_early`]) and only then sends CONFIRM and
    /// pumps. No CLAIM by then, the peer's disconnect, or bytes or EOF from the peer's app on
    /// the kept TCP connection first: no proof is written, and `local` is relayed over `kept`
    /// ([`StreamPath::Unclaimed`]); a reset of that connection fails it as it would fail a TCP
    /// socket. None: the caller took CLAIM off the link and wrote the proof itself, and the engine
    /// sends CONFIRM at once (the in-process tests drive a client this way, CONFIRM and the
    /// proof in either order).
    ///
    /// [`Handshake::Claim`]: until when the stream may bind (the proof and CONFIRM); None:
    /// [`EngineConfig::claim_timeout`] from the attach.
    ///
    /// Either handshake may attach before its connection is established (an active one still
    /// connecting, one made by [`Engine::expect`] before its peer came), with a kept socket:
    /// the local side is relayed over it meanwhile, a CLAIM goes out once the connection is
    /// established, and a connection that fails or does not come by this deadline leaves it
    /// relayed.
    pub claim_by: Option<Instant>,
    /// For a connection that is already gone when the attach comes, without a `kept` socket:
    /// called (on the engine thread) with `local`, untouched (nothing was read from it or
    /// written to it), instead of ending the stream; no [`Event`] follows. The caller may carry
    /// that socket another way (the gateway relays it over TCP). None: the stream ends
    /// [`StreamPath::Broken`] and `local` is shut down.
    pub give_back: Option<Box<dyn FnOnce(OwnedFd) + Send>>,
}

impl Attach {
    /// The connection's first bytes go over `kept` until its move: a connecting side attached
    /// before its CLAIM, or an accepting side.
    pub(super) fn relays_first_bytes(&self) -> bool {
        match self.handshake {
            Handshake::Claim => true,
            Handshake::Confirm => self.claim_by.is_some(),
            Handshake::Open => false,
        }
    }
}

/// What a connecting side asks for.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    /// The peer's address (its IP and the rdma_cm port).
    pub dst: SocketAddr,
    /// The local address to connect from (its IP picks the device), or any.
    pub src: Option<SocketAddr>,
    /// Up to [`crate::wire::MAX_CONNECT_PAYLOAD`] bytes for the peer's [`Acceptor`].
    pub payload: Vec<u8>,
    /// Bound on address and route resolution (each).
    pub resolve_timeout: Duration,
    /// [`Handshake::Open`] or [`Handshake::Confirm`].
    pub handshake: Handshake,
    /// How long the connection, once established, waits for its attach before it is torn
    /// down; None: [`EngineConfig::unattached_timeout`].
    pub unattached_timeout: Option<Duration>,
    /// Without a finished connection's queue pair to take at once (`park`), how long to wait
    /// for one to the same peer before making a connect request (None: not at all).
    pub reuse_wait: Option<Duration>,
}

/// An incoming connect request, shown to a listener's [`Acceptor`].
pub struct Request<'a> {
    /// The address the peer connected to.
    pub local: Option<SocketAddr>,
    /// The peer's address.
    pub peer: Option<SocketAddr>,
    /// The peer's payload.
    pub payload: &'a [u8],
    /// The connection, if accepted (a deferred decision is made through it).
    pub conn: Conn,
}

/// An acceptor's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Accept, with a payload for the peer.
    Accept(Vec<u8>),
    /// Reject, with a payload for the peer.
    Reject(Vec<u8>),
    /// Decide later with [`Conn::accept`] or [`Conn::reject`] (within
    /// [`EngineConfig::unattached_timeout`]).
    Defer,
}

/// Decides on a listener's incoming requests. Runs on the engine thread: must not block.
///
/// The engine asks before it allocates anything for a request (its region, queues and
/// registrations come only with an accept), and refuses a request by itself when too many
/// unattached connections wait, from its peer or in all ([`EngineConfig::max_unattached`]).
pub trait Acceptor: Send + Sync {
    /// One request.
    fn on_request(&self, request: Request<'_>) -> Decision;

    /// How accepted connections start: [`Handshake::Open`] (the default) or
    /// [`Handshake::Claim`].
    fn handshake(&self) -> Handshake {
        Handshake::Open
    }
}

/// What a connection's stream carried ([`Conn::counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Data bytes posted to the peer.
    pub sent: u64,
    /// Of those, the bytes the peer's device acknowledged.
    pub acked: u64,
    /// Data bytes that arrived from the peer.
    pub received: u64,
}

impl<F> Acceptor for F
where
    F: Fn(Request<'_>) -> Decision + Send + Sync,
{
    fn on_request(&self, request: Request<'_>) -> Decision {
        self(request)
    }
}

enum Command {
    Connect {
        token: u64,
        request: ConnectRequest,
        shared: Arc<ConnShared>,
    },
    Listen {
        token: u64,
        addr: SocketAddr,
        only_v6: Option<bool>,
        backlog: i32,
        acceptor: Arc<dyn Acceptor>,
        reply: std::sync::mpsc::SyncSender<io::Result<()>>,
        /// [`Engine::expect`]: the connection (its token and shared state) the listener's one
        /// accepted request becomes.
        adopt: Option<(u64, Arc<ConnShared>)>,
    },
    CloseListener {
        token: u64,
    },
    Attach {
        token: u64,
        local: OwnedFd,
        attach: Attach,
        /// The handle's shared state, for a connection gone before the attach (its relay
        /// still reads what the app tells the handle, such as its low-water mark).
        shared: Arc<ConnShared>,
    },
    Abort {
        token: u64,
    },
    /// A direct read took bytes: a credit may be owed, or the app's side may be shut.
    Consumed {
        token: u64,
    },
    /// Someone waits for the peer's device to acknowledge every byte posted so far
    /// ([`Conn::counters`]).
    Flush {
        token: u64,
    },
    Decide {
        token: u64,
        accept: bool,
        payload: Vec<u8>,
    },
}

/// What the engine thread and the handles share.
/// [`Inner::unflushed`] before the engine counted.
const NOT_COUNTED: usize = usize::MAX;

/// See [`Engine::reuse_counts`].
#[derive(Default)]
struct ReuseCounts {
    parked: AtomicU64,
    reused: AtomicU64,
    unanswered: AtomicU64,
}

struct Inner {
    config: EngineConfig,
    commands: OrderedMutex<VecDeque<Command>>,
    wake: EventFd,
    next_token: AtomicU64,
    budget: Arc<Budget>,
    /// Set at exit: "nothing more to read from the app right now" counts as the app's EOF.
    draining: AtomicBool,
    /// Attached connections that still have bytes of the app to deliver (see [`Engine::flush`]);
    /// [`NOT_COUNTED`] until the engine counted them after a flush began.
    unflushed: AtomicUsize,
    /// Bytes the attached connections moved so far (the exit flush's sign of life).
    progress: AtomicU64,
    /// Connections (any state) the engine holds.
    connections: AtomicUsize,
    /// What happened to finished connections' queue pairs (`park`).
    reuse: ReuseCounts,
    /// The engine thread ended (its setup failed or it panicked): handles fail fast.
    stopped: AtomicBool,
}

impl Inner {
    fn send(&self, command: Command) {
        self.commands.lock().push_back(command);
        let _ = self.wake.write(1);
    }

    fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }
}

/// Backlog of an [`Engine::expect`] listener (one peer is expected; a few more requests may
/// come at once, from whoever names the address).
const EXPECT_BACKLOG: i32 = 4;

/// A running engine (a cheap handle; the thread runs for the life of the process).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("connections", &self.connections())
            .field("pinned", &self.pinned())
            .finish()
    }
}

impl Engine {
    /// Starts the engine thread on the loaded libraries.
    pub fn start(lib: &'static Lib, config: EngineConfig) -> Result<Engine, EngineError> {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| EngineError::Setup {
                what: "eventfd",
                source: io::Error::from_raw_os_error(e as i32),
            })?;
        if let Some(observe) = &config.fd_observer {
            observe(std::os::fd::AsRawFd::as_raw_fd(&wake.as_fd()));
        }
        let inner = Arc::new(Inner {
            budget: Arc::new(Budget::new(config.memlock_limit)),
            config,
            commands: OrderedMutex::new(Level::Commands, VecDeque::new()),
            wake,
            next_token: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            unflushed: AtomicUsize::new(NOT_COUNTED),
            progress: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            reuse: ReuseCounts::default(),
            stopped: AtomicBool::new(false),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread_inner = Arc::clone(&inner);
        std::thread::Builder::new()
            .name(inner.config.thread_name.clone())
            .spawn(move || event_loop::run(lib, thread_inner, ready_tx))
            .map_err(EngineError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Engine { inner }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Thread(io::Error::other("engine thread died"))),
        }
    }

    /// Starts connecting; wait with [`Conn::wait_established`].
    pub fn connect(&self, request: ConnectRequest) -> Conn {
        let token = self.inner.token();
        let shared = Arc::new(ConnShared::connecting(Some(request.dst)));
        let conn = Conn {
            inner: Arc::clone(&self.inner),
            token,
            shared: Arc::clone(&shared),
        };
        if self.inner.stopped.load(Ordering::Acquire) {
            shared.fail(ConnectError::EngineGone);
            return conn;
        }
        self.inner.send(Command::Connect {
            token,
            request,
            shared,
        });
        conn
    }

    /// Listens on `addr` (the rdma_cm port space of the config); `only_v6` sets
    /// `RDMA_OPTION_ID_AFONLY` for an IPv6 address. Incoming requests go to `acceptor`.
    pub fn listen(
        &self,
        addr: SocketAddr,
        only_v6: Option<bool>,
        backlog: i32,
        acceptor: Arc<dyn Acceptor>,
    ) -> io::Result<Listener> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(io::Error::other("the engine is not running"));
        }
        let token = self.inner.token();
        let (reply, result) = std::sync::mpsc::sync_channel(1);
        self.inner.send(Command::Listen {
            token,
            addr,
            only_v6,
            backlog,
            acceptor,
            reply,
            adopt: None,
        });
        result
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the engine is not running")))?;
        Ok(Listener {
            inner: Arc::clone(&self.inner),
            token,
            addr,
        })
    }

    /// A connection whose peer connects to us: listens on `addr` for one request, which
    /// `acceptor` judges (before anything is allocated for it; [`Decision::Defer`] counts as a
    /// reject). The first one it accepts becomes this connection, and the listener closes; a
    /// rejected one leaves it listening. The connection may be attached at once, before any
    /// request came ([`Attach`]: with a kept socket, [`Handshake::Claim`] or
    /// [`Handshake::Confirm`] with [`Attach::claim_by`]): its local side is relayed over the
    /// kept socket meanwhile, and the handshake starts once the peer connected. The listener
    /// closes too when the connection ends, or when its local side is relayed for good (a
    /// peer that never came, or the deadline passed).
    pub fn expect(&self, addr: SocketAddr, acceptor: Arc<dyn Acceptor>) -> io::Result<Conn> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(io::Error::other("the engine is not running"));
        }
        let listener = self.inner.token();
        let token = self.inner.token();
        let shared = Arc::new(ConnShared::connecting(None));
        let (reply, result) = std::sync::mpsc::sync_channel(1);
        self.inner.send(Command::Listen {
            token: listener,
            addr,
            only_v6: None,
            backlog: EXPECT_BACKLOG,
            acceptor,
            reply,
            adopt: Some((token, Arc::clone(&shared))),
        });
        result
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the engine is not running")))?;
        Ok(Conn {
            inner: Arc::clone(&self.inner),
            token,
            shared,
        })
    }

    /// At exit: every attached connection delivers what its local fd already holds ("nothing
    /// more to read right now" counts as EOF), sends FIN and waits for its completion. Returns
    /// when none is left, when no byte moved for `stall` (the peers stopped reading, or are
    /// gone), or at `deadline`. True when everything was delivered.
    ///
    /// A slow reader thus holds the exit up for as long as it keeps reading (up to
    /// `deadline`), much as the kernel keeps delivering a closed TCP socket's bytes after the
    /// process is gone.
    pub fn flush(&self, stall: Duration, deadline: Instant) -> bool {
        self.inner.draining.store(true, Ordering::Release);
        let _ = self.inner.wake.write(1);
        let mut seen = self.inner.progress.load(Ordering::Acquire);
        let mut moved = Instant::now();
        loop {
            // Not counted yet means not known: the engine counts in its next turn, which the
            // wake above starts.
            if self.inner.unflushed.load(Ordering::Acquire) == 0 {
                return true;
            }
            if self.inner.stopped.load(Ordering::Acquire) {
                return false;
            }
            let now = Instant::now();
            let progress = self.inner.progress.load(Ordering::Acquire);
            if progress != seen {
                seen = progress;
                moved = now;
            }
            if now >= deadline || now.duration_since(moved) >= stall {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Connections the engine holds (any state).
    pub fn connections(&self) -> usize {
        self.inner.connections.load(Ordering::Acquire)
    }

    /// Bytes pinned by the engine now.
    pub fn pinned(&self) -> u64 {
        self.inner.budget.used()
    }

    /// The most bytes the engine pinned at once so far.
    pub fn pinned_peak(&self) -> u64 {
        self.inner.budget.peak()
    }

    /// Finished connections kept for the next one, connections that took one (either side),
    /// and connects whose REUSE went unanswered so far (docs/shim-protocol.md, "Reused
    /// connections").
    pub fn reuse_counts(&self) -> (u64, u64, u64) {
        let r = &self.inner.reuse;
        (
            r.parked.load(Ordering::Relaxed),
            r.reused.load(Ordering::Relaxed),
            r.unanswered.load(Ordering::Relaxed),
        )
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }
}

/// A listening rdma_cm id; closed when dropped.
pub struct Listener {
    inner: Arc<Inner>,
    token: u64,
    addr: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Listener {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.inner
            .send(Command::CloseListener { token: self.token });
    }
}

/// A handle to one connection (cheap to clone).
#[derive(Clone)]
pub struct Conn {
    inner: Arc<Inner>,
    token: u64,
    shared: Arc<ConnShared>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("token", &self.token).finish()
    }
}

impl Conn {
    /// Waits until the connection is established (the peer's accept payload) or failed, at most
    /// until `deadline` ([`ConnectError::Timeout`]; the connection keeps trying: abort it).
    pub fn wait_established(&self, deadline: Instant) -> Result<Vec<u8>, ConnectError> {
        self.shared.wait_established(deadline)
    }

    /// True while the connection has not failed or closed.
    pub fn is_alive(&self) -> bool {
        self.shared.is_alive()
    }

    /// Whether `other` is a handle to this same connection.
    pub fn same_as(&self, other: &Conn) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Hands `local` (and the options) to the engine, which pumps it from now on and closes
    /// it at the end. On a connection that already ended, the handshake decides (see
    /// [`Handshake`]).
    pub fn attach(&self, local: OwnedFd, attach: Attach) {
        // A connection whose first bytes go over TCP until its move: the app's thread may
        // send them itself from now on, before the engine takes the connection
        // (docs/shim-protocol.md, "The move"; the engine closes the gate again when it does).
        if let Some(kept) = &attach.kept
            && attach.relays_first_bytes()
        {
            self.shared.early().open(kept);
        }
        self.inner.send(Command::Attach {
            token: self.token,
            local,
            attach,
            shared: Arc::clone(&self.shared),
        });
    }

    /// A handle the app's threads read received bytes through, straight from the receive ring
    /// ([`Reader`]); None before the connection has its verbs resources.
    pub fn reader(&self) -> Option<Reader> {
        let recv = self.shared.receiver()?;
        Some(Reader::new(&recv, Arc::clone(&self.inner), self.token))
    }

    /// A handle the app's threads write bytes to the peer through, straight into the send
    /// ring ([`Writer`]); None before the connection has its verbs resources.
    pub fn writer(&self) -> Option<Writer> {
        let send = self.shared.sender()?;
        Some(Writer::new(
            &send,
            Arc::clone(&self.inner),
            self.token,
            Arc::clone(self.shared.early()),
        ))
    }

    /// The app set `SO_RCVLOWAT` to `bytes` on its end: fewer arrived bytes are held back from
    /// an end that holds none unread, by the stream's receive side ([`Reader::set_low_water`])
    /// or by the relay that carries the connection over TCP instead. A lower mark wakes the
    /// engine, which may deliver what it held.
    pub fn set_low_water(&self, bytes: usize) {
        let lower = self.shared.set_low_water(bytes);
        match self.reader() {
            Some(r) => r.set_low_water(bytes),
            None if lower => self.inner.send(Command::Consumed { token: self.token }),
            None => {}
        }
    }

    /// Whether the app's end `app` of the connection is at the urgent mark, as TCP's socket
    /// would answer once every byte sent before the question arrived (`SIOCATMARK`): a write
    /// of bytes and the urgent byte behind them that a relay has under way is waited for (at
    /// most `wait`), and an urgent byte that the stream's receive side is about to hand on
    /// counts as there.
    pub fn at_mark(&self, app: RawFd, wait: Duration) -> io::Result<bool> {
        self.shared.wait_urgent_written(Instant::now() + wait);
        match self.shared.receiver() {
            Some(recv) => recv.at_mark(app),
            None => crate::rdma::at_mark(app),
        }
    }

    /// What the connection's stream carried (`TCP_INFO`'s byte counts): None unless it is
    /// carried by its stream (before it bound, or relayed over TCP, its kept TCP socket's own
    /// counts are the truth). Bytes acknowledged are those whose writes completed (the peer's
    /// device has them); since only some writes ask for a completion, the engine is asked to
    /// make one report the writes posted so far, and this waits for it at most `wait`.
    pub fn counters(&self, wait: Duration) -> Option<Counters> {
        if !self.shared.on_stream() {
            return None;
        }
        let send = self.shared.sender()?;
        let recv = self.shared.receiver()?;
        let (sent, acked) = send.posted_and_acked();
        if acked < sent {
            self.inner.send(Command::Flush { token: self.token });
            send.wait_acked(sent, Instant::now() + wait);
        }
        let (sent, acked) = send.posted_and_acked();
        Some(Counters {
            sent,
            acked,
            received: recv.arrived_total().0,
        })
    }

    /// Tears the connection down (a reset for an attached one).
    pub fn abort(&self) {
        self.inner.send(Command::Abort { token: self.token });
    }

    /// Accepts a deferred request with `payload`.
    pub fn accept(&self, payload: Vec<u8>) {
        self.inner.send(Command::Decide {
            token: self.token,
            accept: true,
            payload,
        });
    }

    /// Rejects a deferred request with `payload`.
    pub fn reject(&self, payload: Vec<u8>) {
        self.inner.send(Command::Decide {
            token: self.token,
            accept: false,
            payload,
        });
    }

    /// The peer's address, when known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.shared.peer()
    }
}

#[cfg(test)]
mod tests {
    use super::{EngineConfig, MAX_UNACKED};

    /// The pinned memory per connection the docs state (idle, and busy both ways with the
    /// default rings and the two smaller ones they name) is what the budget counts.
    #[test]
    fn the_docs_state_the_pinned_memory_the_budget_counts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let config = |ring_kib: usize| EngineConfig {
            ring_bytes: ring_kib * 1024,
            ..EngineConfig::default()
        };
        let idle = config(2048).pinned_per_connection() / 1024;
        assert_eq!(idle, 200);
        assert_eq!(config(256).pinned_per_connection() / 1024, idle);
        let busy = [2048, 1024, 256].map(|k| config(k).pinned_when_busy() / 1024);
        assert_eq!(busy, [4296, 2248, 712]);
        assert_eq!(
            config(64).pinned_when_busy(),
            config(64).pinned_per_connection(),
            "rings of the start size never change"
        );
        for doc in [
            "docs/shim-protocol.md",
            "docs/shim.md",
            "docs/operations.md",
        ] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            for f in std::iter::once(idle).chain(busy) {
                assert!(
                    text.contains(&format!("{f} KiB")),
                    "{doc} does not say {f} KiB"
                );
            }
        }
    }

    #[test]
    fn a_chunk_is_a_quarter_of_the_ring_and_half_of_what_may_be_in_flight() {
        let config = |ring_bytes| EngineConfig {
            ring_bytes,
            ..EngineConfig::default()
        };
        let chunk = |ring_bytes| config(ring_bytes).max_chunk();
        assert_eq!(chunk(1024 * 1024), 256 * 1024);
        assert_eq!(chunk(256 * 1024), 64 * 1024);
        assert_eq!(chunk(16 * 1024), 4096);
        // Rounded up to a power of two first.
        assert_eq!(chunk(300 * 1024), 128 * 1024);
        // The default 2 MiB ring is in flight whole; larger rings stay at MAX_UNACKED, two
        // writes of it.
        assert_eq!(config(2 << 20).max_unacked(), 2 << 20);
        assert_eq!(chunk(2 << 20), 512 * 1024);
        assert_eq!(config(16 << 20).max_unacked(), MAX_UNACKED);
        assert_eq!(chunk(16 << 20), MAX_UNACKED / 2);
        assert_eq!(config(256 * 1024).max_unacked(), 256 * 1024);
    }
}
