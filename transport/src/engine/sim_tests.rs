//! The stream protocol in-process: a connecting side ([`Handshake::Confirm`]) and an accepting
//! side ([`Handshake::Claim`]), each a [`StreamConn`] with its [`Link`] on the simulated fabric
//! ([`super::sim`]), their kept "TCP" connection a socketpair, their apps socketpairs too. A
//! test drives both as the event loop would (readiness, progress, timers) on a simulated clock,
//! and picks how the fabric interleaves their work requests with the TCP path at every step.
//!
//! Covered here, in seconds: the binding (CLAIM, the proof on the TCP connection, CONFIRM, in
//! either order across the two paths), bytes both ways through small rings (credits, wraps,
//! signalling), half-closes and FIN, a link cut or any work request failing at any point (both
//! sides end, in bounded time, and each app got a prefix of what the other sent, never a wrong
//! byte), probes finding a silent dead peer, a client that stays on TCP (relayed), and the
//! binding's deadline, and a client attached before its CLAIM (as the shim's `connect()` returns):
//! its engine writes the proof, or relays when no CLAIM comes or the peer speaks TCP first. The
//! Soft-RoCE suite judges the same on the real stack.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;

use super::link::Link;
use super::shared::ConnShared;
use super::sim::Fabric;
use super::stream::{CmPhase, Fds, GUARD_WAIT, StreamConn};
use super::{Attach, End, EngineConfig, Event, Handshake, StreamPath};
use crate::wire::{Payload, Secret};

const CLIENT: usize = 0;
const SERVER: usize = 1;
/// Simulated time per step.
const TICK: Duration = Duration::from_millis(1);
/// How long a client attached before CLAIM waits for it (as the shim's negotiation bound).
const CLAIM_BY: Duration = Duration::from_secs(1);
/// Steps after which a run that has not ended is a hang.
const MAX_STEPS: usize = 60_000;

/// Small rings and queues, so that a few hundred KiB wrap the rings many times and run out of
/// credits, send queue entries and control slots; a short keepalive for the dead-peer cases.
fn config() -> EngineConfig {
    EngineConfig {
        ring_bytes: 16 * 1024,
        send_queue: 8,
        recv_queue: 8,
        keepalive: Duration::from_millis(200),
        claim_timeout: Duration::from_secs(2),
        ..EngineConfig::default()
    }
}

/// One side: its connection, the app's end of its socketpair, what the app sends and got.
struct Peer {
    conn: StreamConn,
    app: UnixStream,
    local: Option<OwnedFd>,
    events: Arc<Mutex<Vec<Event>>>,
    out: Vec<u8>,
    written: usize,
    got: Vec<u8>,
    eof: bool,
    /// The app's read or write failed (the stream failed under it).
    broken: bool,
    /// Bytes the app's thread sent on the kept socket itself ([`super::early`]).
    sent_itself: usize,
}

impl Peer {
    fn new(conn: StreamConn, out: Vec<u8>) -> Peer {
        let (app, local) = UnixStream::pair().expect("socketpair");
        app.set_nonblocking(true).expect("nonblocking");
        local.set_nonblocking(true).expect("nonblocking");
        Peer {
            conn,
            app,
            local: Some(local.into()),
            events: Arc::default(),
            out,
            written: 0,
            got: Vec::new(),
            eof: false,
            broken: false,
            sent_itself: 0,
        }
    }

    fn link(&self) -> &Link {
        self.conn.link.as_ref().expect("a link")
    }

    /// Hands the connection to the engine. `first`: as `Conn::attach` does, the app's thread
    /// may send on the kept socket itself from here on, and sends this many bytes before the
    /// engine takes the connection.
    fn attach(
        &mut self,
        kept: Arc<OwnedFd>,
        handshake: Handshake,
        claim_by: Option<Instant>,
        now: Instant,
        first: usize,
    ) {
        let events = Arc::clone(&self.events);
        let attach = Attach {
            kept: Some(kept),
            handshake,
            on_event: Box::new(move |e| {
                events
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e);
            }),
            on_bytes: None,
            claim_by,
            give_back: None,
        };
        if first > 0 && attach.relays_first_bytes() {
            if let Some(kept) = &attach.kept {
                self.conn.shared.early().open(kept);
            }
            let end = (self.written + first).min(self.out.len());
            if let Ok(n) = send(
                &self.conn,
                &self.app,
                &self.out[self.written..end],
                true,
                &mut self.sent_itself,
            ) {
                self.written += n;
            }
        }
        let local = self.local.take().expect("attached once");
        let mut fds = Fds::default();
        self.conn.attach(local, attach, &config(), now, &mut fds);
    }

    /// The app writes what it can, reads what there is, and closes its sending side once all
    /// was written. `itself`: before its move the app's thread sends on the kept socket
    /// itself when it may, as the shim's `write` does ([`super::early`]).
    fn run_app(&mut self, chunk: usize, close: bool, itself: bool) {
        while self.written < self.out.len() && !self.broken {
            let end = (self.written + chunk).min(self.out.len());
            match send(
                &self.conn,
                &self.app,
                &self.out[self.written..end],
                itself,
                &mut self.sent_itself,
            ) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => self.broken = true,
            }
        }
        if close && self.written == self.out.len() {
            let _ = self.app.shutdown(Shutdown::Write);
        }
        let mut buf = [0u8; 8192];
        while !self.eof && !self.broken {
            match self.app.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => self.broken = true,
            }
        }
    }

    /// The app as `plan` says: the server's (`server`) echoes or sends, the client's sends.
    fn run(&mut self, plan: &Plan, server: bool) {
        if server && plan.echo {
            self.run_echo(plan.app_sends);
        } else {
            self.run_app(plan.chunk, plan.close, plan.app_sends);
        }
    }

    /// An echo server's app: what it read goes back, and its side closes after the peer's EOF
    /// once everything went back. `itself` as for [`Peer::run_app`].
    fn run_echo(&mut self, itself: bool) {
        loop {
            let mut buf = [0u8; 8192];
            let before = (self.got.len(), self.written);
            if !self.eof && !self.broken {
                match self.app.read(&mut buf) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => self.broken = true,
                }
            }
            while self.written < self.got.len() && !self.broken {
                match send(
                    &self.conn,
                    &self.app,
                    &self.got[self.written..],
                    itself,
                    &mut self.sent_itself,
                ) {
                    Ok(n) => self.written += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => self.broken = true,
                }
            }
            if (self.got.len(), self.written) == before {
                break;
            }
        }
        if self.eof && self.written == self.got.len() {
            let _ = self.app.shutdown(Shutdown::Write);
        }
    }

    /// One round of the event loop for this connection: readiness, timers, progress; true
    /// once its stream is over (the loop then disconnects it).
    fn step(&mut self, now: Instant) -> bool {
        let mut fds = Fds::default();
        self.conn.local_event(true, true, true);
        self.conn.kept_event(true, true, true, &mut fds);
        self.conn.timers(now, &mut fds);
        self.conn.progress(now, &config(), false, &mut fds);
        self.conn.settle(&mut fds)
    }

    fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn end(&self) -> Option<End> {
        self.events().into_iter().find_map(|e| match e {
            Event::Ended(end) => Some(end),
            Event::Decided(_) => None,
        })
    }

    fn decided(&self) -> Option<StreamPath> {
        self.events().into_iter().find_map(|e| match e {
            Event::Decided(path) => Some(path),
            Event::Ended(_) => None,
        })
    }

    /// Ended, and the app has read to its end.
    fn done(&self) -> bool {
        self.end().is_some() && (self.eof || self.broken)
    }
}

/// A fault injected at some step.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    /// The link is cut.
    Cut {
        at: usize,
    },
    /// One side's next work request fails with this status.
    Fail {
        at: usize,
        side: usize,
        status: u32,
    },
}

/// Both sides' links, their rings exchanged as the connection manager's private data does:
/// the connection is established.
fn establish(peers: &mut [Peer; 2], fabric: &Fabric, now: Instant) {
    let config = config();
    for (side, handshake) in [(CLIENT, Handshake::Confirm), (SERVER, Handshake::Claim)] {
        peers[side].conn.link = Some(Link::simulated(&config, fabric, side, (now, handshake)));
        peers[side].conn.cm = CmPhase::Established;
    }
    let rings = [
        peers[CLIENT].link().ring_info(),
        peers[SERVER].link().ring_info(),
    ];
    for (side, peer) in peers.iter_mut().enumerate() {
        let link = peer.conn.link.as_mut().expect("a link");
        link.set_peer(rings[1 - side]);
        link.set_ready(now);
        // As the loop does at the accept and at ESTABLISHED.
        peer.conn.binding_starts(now, config.claim_timeout);
    }
}

/// How a run goes: what each app sends, how the fabric and the apps are scheduled, when the
/// proof travels, and the fault.
#[derive(Debug, Clone)]
struct Plan {
    client_out: Vec<u8>,
    server_out: Vec<u8>,
    /// Work requests carried per side per step, cycled.
    carry: Vec<(usize, usize)>,
    /// Bytes an app writes at once.
    chunk: usize,
    /// Steps between the CLAIM's arrival and the client's attach (its CONFIRM) ...
    attach_after: usize,
    /// ... and between the CLAIM's arrival and the proof on the TCP connection.
    proof_after: usize,
    /// The client attaches at once, before CLAIM, as the shim's `connect()` does: its engine
    /// writes the proof when CLAIM comes (`attach_after` and `proof_after` do not apply).
    early: bool,
    fault: Fault,
    /// The apps close their sending side once they wrote everything.
    close: bool,
    /// The server's app echoes what it reads (instead of sending `server_out`) and closes its
    /// side after the client's EOF, as a request/response server does.
    echo: bool,
    /// Steps before the client's app writes its first byte.
    client_waits: usize,
    /// Every this many steps the server's engine runs first (0: never), so that it can act on
    /// a completion before the client's engine polled the message it completes (as two
    /// machines may).
    server_first_every: usize,
    /// The client's engine and app do not run in these steps (a descheduled process), while
    /// the fabric and the server go on.
    client_stalls: std::ops::Range<usize>,
    /// When the connection is established ([`Connect`]).
    connect: Connect,
    /// A side whose stream is over keeps its queue pair for the next connection (parks it,
    /// `super::park`) instead of disconnecting.
    park: bool,
    /// Before their move the apps' threads send on the kept sockets themselves when they may
    /// ([`super::early`]), else through their socketpairs.
    app_sends: bool,
    /// Every this many steps the apps run before their engines (0: never).
    app_first_every: usize,
}

/// The app's write of the start of `buf` on its end `app` of `conn`: `itself`, on the kept
/// socket when the gate allows it ([`super::early`]), else (or then) to the socketpair.
/// `sent_itself` counts what went the first way.
fn send(
    conn: &StreamConn,
    app: &UnixStream,
    buf: &[u8],
    itself: bool,
    sent_itself: &mut usize,
) -> io::Result<usize> {
    if itself && let Some(n) = conn.shared.early().write(app.as_raw_fd(), buf) {
        *sent_itself += n;
        return Ok(n);
    }
    (&*app).write(buf)
}

/// When the two sides' connection is established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connect {
    /// Before anything is attached (the shim's connections to a peer's listener).
    Before,
    /// At this step, both sides attached before (a connection the accepting side makes back
    /// to its TCP client, docs/shim-protocol.md "Services"): the connecting side (here the
    /// accepting side of the RDMA connection) expects it, the other is still connecting.
    At(usize),
    /// Never: the connecting side's connect fails at this step (rejected, unreachable).
    FailsAt(usize),
}

/// The two sides and their fabric.
struct Pair {
    fabric: Fabric,
    now: Instant,
    peers: [Peer; 2],
    /// The client's TCP connection: held here until the client attaches, then the engine's
    /// (the shim resets and closes it when the stream fails).
    client_tcp: Option<Arc<OwnedFd>>,
    client_tcp_weak: Weak<OwnedFd>,
    secret: Option<Secret>,
    /// The step at which the client saw the CLAIM.
    claimed_at: Option<usize>,
    disconnected: [bool; 2],
    /// What the client's app sends itself before its engine takes the connection
    /// ([`Plan::first_sends`]).
    client_first: usize,
}

impl Pair {
    /// Both sides established (their rings exchanged, as the connection manager's private
    /// data does), the server attached with its kept socket: its CLAIM is on its way.
    fn new(plan: &Plan) -> Pair {
        Pair::with(plan, Fabric::new(), None, Instant::now())
    }

    /// As [`Pair::new`], at `now` on `fabric`, over `links` (both sides' queue pairs, renewed
    /// for this connection) when given.
    fn with(plan: &Plan, fabric: Fabric, links: Option<[Link; 2]>, now: Instant) -> Pair {
        let config = config();
        let later = plan.connect != Connect::Before;
        let conn = |cm| StreamConn::new(Arc::new(ConnShared::connecting(None)), None, cm);
        let (client, mut server) = if later {
            (
                Peer::new(conn(CmPhase::Connecting), plan.client_out.clone()),
                Peer::new(conn(CmPhase::Expecting), plan.server_out.clone()),
            )
        } else {
            let mut client = Peer::new(conn(CmPhase::Established), plan.client_out.clone());
            // As the loop does at ESTABLISHED on the connecting side.
            client.conn.unattached_deadline = Some(now + config.unattached_timeout);
            let server = Peer::new(conn(CmPhase::Established), plan.server_out.clone());
            let mut peers = [client, server];
            match links {
                Some(links) => {
                    for (peer, link) in peers.iter_mut().zip(links) {
                        peer.conn.link = Some(link);
                        peer.conn.binding_starts(now, config.claim_timeout);
                    }
                }
                None => establish(&mut peers, &fabric, now),
            }
            let [client, server] = peers;
            (client, server)
        };
        let (client_tcp, server_tcp) = UnixStream::pair().expect("socketpair");
        client_tcp.set_nonblocking(true).expect("nonblocking");
        server_tcp.set_nonblocking(true).expect("nonblocking");
        // Attached before its connection came, the accepting side waits for it (and then for
        // the proof and CONFIRM) as long as the connecting side waits for CLAIM.
        let bind_by = later.then_some(now + CLAIM_BY);
        server.attach(
            Arc::new(server_tcp.into()),
            Handshake::Claim,
            bind_by,
            now,
            plan.first_sends(),
        );
        let client_tcp = Arc::new(OwnedFd::from(client_tcp));
        let mut pair = Pair {
            fabric,
            now,
            peers: [client, server],
            client_tcp_weak: Arc::downgrade(&client_tcp),
            client_tcp: Some(client_tcp),
            client_first: plan.first_sends(),
            secret: None,
            claimed_at: None,
            disconnected: [false; 2],
        };
        if plan.early || later {
            pair.attach_client(Some(now + CLAIM_BY));
        }
        pair
    }

    fn step(&mut self, n: usize, plan: &Plan) {
        match plan.fault {
            Fault::Cut { at } if at == n => self.fabric.cut(),
            Fault::Fail { at, side, status } if at == n => self.fabric.fail_next(side, status),
            _ => {}
        }
        match plan.connect {
            // Established while both still wait for it; one that gave up by then tears its
            // side down, and the other hears nothing.
            Connect::At(at)
                if at == n
                    && self
                        .peers
                        .iter()
                        .all(|p| matches!(p.conn.app, super::stream::App::Stream(_))) =>
            {
                establish(&mut self.peers, &self.fabric, self.now);
            }
            Connect::FailsAt(at) if at == n => {
                self.peers[CLIENT].conn.error = Some(String::from("rejected"));
            }
            _ => {}
        }
        let (a, b) = plan.carry[n % plan.carry.len()];
        self.fabric.deliver(CLIENT, a);
        self.fabric.deliver(SERVER, b);
        self.now += TICK;
        // The client's upgrade: once CLAIM came, it attaches (CONFIRM) and writes the proof
        // on its TCP connection, each when the plan says (attached early, its engine does).
        if !plan.early
            && plan.connect == Connect::Before
            && self.claimed_at.is_none()
            && let Some(secret) = self.peers[CLIENT].link().claim_seen()
        {
            self.claimed_at = Some(n);
            self.secret = Some(secret);
        }
        if let (Some(at), Some(secret)) = (self.claimed_at, self.secret) {
            if n == at + plan.proof_after
                && let Some(tcp) = self.client_tcp_weak.upgrade()
            {
                let mut tcp = std::fs::File::from(tcp.try_clone().expect("dup"));
                tcp.write_all(secret.bytes()).expect("the proof");
            }
            if n >= at + plan.attach_after {
                self.attach_client(None);
            }
        }
        // A client whose connection failed before its CLAIM came attaches all the same, as
        // the shim does: the engine relays it over TCP.
        if self.peers[CLIENT].conn.error.is_some() && plan.connect == Connect::Before {
            self.attach_client(None);
        }
        let order = if plan.server_first_every > 0 && n.is_multiple_of(plan.server_first_every) {
            [SERVER, CLIENT]
        } else {
            [CLIENT, SERVER]
        };
        for side in order {
            if side == CLIENT && plan.client_stalls.contains(&n) {
                continue;
            }
            let peer = &mut self.peers[side];
            // An app that runs before its engine meets what the engine holds of its bytes,
            // and what it wrote to its socketpair the last time, still ahead of its own sends.
            let app_first = plan.app_first_every > 0 && n.is_multiple_of(plan.app_first_every);
            let app_runs = side == SERVER || n >= plan.client_waits;
            if app_first && app_runs && peer.local.is_none() {
                peer.run(plan, side == SERVER);
            }
            let over = peer.step(self.now);
            if !app_first && app_runs && peer.local.is_none() {
                peer.run(plan, side == SERVER);
            }
            // The loop disconnects a connection whose stream is over: its queue pair goes,
            // with whatever it posted that had not arrived, and the peer hears DISCONNECTED
            // (unless the link is cut: the CM's messages are lost too).
            if over && !self.disconnected[side] && !plan.park {
                self.disconnected[side] = true;
                self.fabric.destroy(side);
                // A connection never established has no peer to tell.
                let established = self.peers.iter().all(|p| p.conn.link.is_some());
                if !self.fabric.is_cut() && established {
                    self.peers[1 - side].conn.peer_gone = true;
                }
            }
        }
    }

    fn attach_client(&mut self, claim_by: Option<Instant>) {
        if let Some(kept) = self.client_tcp.take() {
            let first = self.client_first;
            self.peers[CLIENT].attach(kept, Handshake::Confirm, claim_by, self.now, first);
        }
    }

    /// Runs until both sides ended and their apps read to the end; the step count.
    fn run(&mut self, plan: &Plan) -> Result<usize, TestCaseError> {
        for n in 0..MAX_STEPS {
            if self.peers.iter().all(Peer::done) {
                return Ok(n);
            }
            self.step(n, plan);
        }
        Err(TestCaseError::fail(format!(
            "no end after {MAX_STEPS} steps: client {:?} ({} of {} written, {} got, eof {}), \
             server {:?} ({} of {} written, {} got, eof {}), queued {} / {}",
            self.peers[CLIENT].events(),
            self.peers[CLIENT].written,
            self.peers[CLIENT].out.len(),
            self.peers[CLIENT].got.len(),
            self.peers[CLIENT].eof,
            self.peers[SERVER].events(),
            self.peers[SERVER].written,
            self.peers[SERVER].out.len(),
            self.peers[SERVER].got.len(),
            self.peers[SERVER].eof,
            self.fabric.queued(CLIENT),
            self.fabric.queued(SERVER),
        )))
    }
}

impl Plan {
    /// What an app sends itself before its engine takes the connection: a chunk when the
    /// apps send on the kept sockets themselves.
    fn first_sends(&self) -> usize {
        if self.app_sends { self.chunk } else { 0 }
    }

    /// A fixed run for the tests of one case: the apps send `client_out` and `server_out`,
    /// `carry` requests per side per step, the client attaches and proves as soon as CLAIM
    /// came, no fault, and the apps close once they wrote everything. Cases change the rest.
    fn fixed(client_out: Vec<u8>, server_out: Vec<u8>, carry: (usize, usize)) -> Plan {
        Plan {
            client_out,
            server_out,
            carry: vec![carry],
            chunk: 64,
            attach_after: 0,
            proof_after: 0,
            early: false,
            fault: Fault::None,
            close: true,
            echo: false,
            client_waits: 0,
            server_first_every: 0,
            client_stalls: 0..0,
            connect: Connect::Before,
            park: false,
            app_sends: true,
            app_first_every: 0,
        }
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn plan(fault: BoxedStrategy<Fault>) -> impl Strategy<Value = Plan> {
    (
        0usize..200_000,
        0usize..200_000,
        proptest::collection::vec((0usize..4, 0usize..4), 1..8),
        prop_oneof![Just(1usize), 1usize..70_000],
        0usize..40,
        0usize..40,
        (any::<bool>(), any::<bool>(), 0usize..4),
        fault,
    )
        .prop_map(
            |(
                c,
                s,
                carry,
                chunk,
                attach_after,
                proof_after,
                (early, app_sends, app_first_every),
                fault,
            )| Plan {
                client_out: bytes(c, 1),
                server_out: bytes(s, 2),
                // Never a schedule that carries nothing at all.
                carry: carry.into_iter().chain([(1, 1)]).collect::<Vec<_>>(),
                chunk,
                attach_after,
                proof_after,
                early,
                fault,
                close: true,
                echo: false,
                client_waits: 0,
                server_first_every: 2,
                client_stalls: 0..0,
                connect: Connect::Before,
                park: false,
                app_sends,
                app_first_every,
            },
        )
}

/// A run that ended cleanly delivered every byte both ways, on the RDMA stream (or, for a
/// connection established after its attach whose stream failed before either side committed
/// to it, relayed over TCP); any run gave each app a prefix of what the other sent.
fn check(pair: &Pair, plan: &Plan) -> Result<(), TestCaseError> {
    let [client, server] = &pair.peers;
    prop_assert!(
        plan.client_out.starts_with(&server.got),
        "the server's app got bytes the client never sent at {}",
        first_difference(&server.got, &plan.client_out)
    );
    prop_assert!(
        plan.server_out.starts_with(&client.got),
        "the client's app got bytes the server never sent at {}",
        first_difference(&client.got, &plan.server_out)
    );
    let relayed = plan.connect != Connect::Before;
    for (peer, name) in [(client, "client"), (server, "server")] {
        let end = peer.end().ok_or_else(|| TestCaseError::fail("no end"))?;
        if end.error.is_none() && !(relayed && end.path == StreamPath::Tcp) {
            prop_assert_eq!(end.path, StreamPath::Rdma, "{}", name);
        }
    }
    let (c, s) = (
        client.end().unwrap_or_else(unreachable),
        server.end().unwrap_or_else(unreachable),
    );
    if c.error.is_none() && s.error.is_none() {
        prop_assert_eq!(&server.got, &plan.client_out);
        prop_assert_eq!(&client.got, &plan.server_out);
        prop_assert_eq!(c.sent, plan.client_out.len() as u64);
        prop_assert_eq!(c.received, plan.server_out.len() as u64);
        prop_assert_eq!(s.sent, plan.server_out.len() as u64);
        prop_assert_eq!(s.received, plan.client_out.len() as u64);
        if c.path == StreamPath::Rdma {
            prop_assert_eq!(client.decided(), Some(StreamPath::Rdma));
            prop_assert_eq!(server.decided(), Some(StreamPath::Rdma));
        }
    }
    Ok(())
}

fn unreachable() -> End {
    End {
        path: StreamPath::Broken,
        sent: 0,
        received: 0,
        error: Some(String::from("checked above")),
        reset: true,
    }
}

fn first_difference(got: &[u8], sent: &[u8]) -> usize {
    got.iter()
        .zip(sent)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(sent.len()))
}

fn run(plan: &Plan) -> Result<Pair, TestCaseError> {
    let mut pair = Pair::new(plan);
    pair.run(plan)?;
    check(&pair, plan)?;
    Ok(pair)
}

#[test]
fn bytes_both_ways_arrive_whole_whatever_the_interleaving() {
    fuzz::run(
        "in-process streams, no fault",
        48,
        Duration::from_secs(120),
        || plan(Just(Fault::None).boxed()),
        |plan| {
            let pair = run(&plan)?;
            for peer in &pair.peers {
                let end = peer.end().unwrap_or_else(unreachable);
                prop_assert_eq!(end.error, None, "{:?}", plan.fault);
            }
            Ok(())
        },
    );
}

#[test]
fn a_cut_link_or_any_failed_request_ends_both_sides_with_no_wrong_byte() {
    let fault = prop_oneof![
        (0usize..3_000).prop_map(|at| Fault::Cut { at }),
        (
            0usize..3_000,
            0usize..2,
            proptest::sample::select(vec![4u32, 9, 10, 12, 13])
        )
            .prop_map(|(at, side, status)| Fault::Fail { at, side, status }),
    ];
    fuzz::run(
        "in-process streams, faults",
        64,
        Duration::from_secs(120),
        move || plan(fault.boxed()),
        |plan| run(&plan).map(drop),
    );
}

/// A cut while both sides sit idle: nothing is posted, so only the probes after the
/// keepalive find the peer gone, and both ends report it.
#[test]
fn probes_find_a_silent_dead_peer() {
    let plan = Plan {
        chunk: 1,
        close: false,
        ..Plan::fixed(Vec::new(), Vec::new(), (4, 4))
    };
    let mut pair = Pair::new(&plan);
    let mut n = 0;
    while pair.peers[SERVER].decided().is_none() {
        assert!(n < 2_000, "not bound");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[SERVER].decided(), Some(StreamPath::Rdma));
    // Idle for a few keepalives: the probes go and come back, nothing ends.
    for _ in 0..1_000 {
        pair.step(n, &plan);
        n += 1;
    }
    assert!(pair.peers.iter().all(|p| p.end().is_none()));
    pair.fabric.cut();
    let cut_at = pair.now;
    while !pair.peers.iter().all(|p| p.end().is_some()) {
        assert!(n < 20_000, "no end: {:?}", pair.peers[SERVER].events());
        pair.step(n, &plan);
        n += 1;
    }
    let waited = pair.now - cut_at;
    for peer in &pair.peers {
        let error = peer.end().and_then(|e| e.error).unwrap_or_default();
        assert!(error.contains("retry counter exceeded"), "{error}");
    }
    assert!(waited <= config().keepalive * 2, "found after {waited:?}");
}

/// The client never proves: it speaks TCP on its connection (it did not take the upgrade).
/// Its bytes reach the server's app at once, and the reply reaches it, while the server still
/// waits for a proof; at the deadline the server gives its stream up and relays on. CONFIRM
/// never came, so nothing of the RDMA stream reaches the app.
#[test]
fn a_client_that_stays_on_tcp_is_relayed_without_waiting() {
    let plan = Plan {
        attach_after: usize::MAX / 2,
        proof_after: usize::MAX / 2,
        close: false,
        ..Plan::fixed(Vec::new(), b"hello from the server".to_vec(), (2, 2))
    };
    let mut pair = Pair::new(&plan);
    let client_tcp = pair.client_tcp.take().expect("not attached");
    let mut tcp = std::fs::File::from(client_tcp.try_clone().expect("dup"));
    let _ = crate::fd::set_nonblocking(client_tcp.as_fd());
    let request = b"GET / HTTP/1.0\r\n\r\n";
    tcp.write_all(request).expect("write");
    let mut reply = Vec::new();
    let mut n = 0;
    // The server's engine searches the client's bytes for the proof: the end of what arrived
    // waits while it may be the secret's start (at most 15 bytes; some, 1 time in 256).
    while reply.len() < plan.server_out.len()
        || pair.peers[SERVER].got.len() + crate::wire::SECRET_LEN - 1 < request.len()
    {
        assert!(n < 50, "the first bytes waited");
        pair.step(n, &plan);
        let mut buf = [0u8; 256];
        if let Ok(k) = tcp.read(&mut buf) {
            reply.extend_from_slice(&buf[..k]);
        }
        n += 1;
    }
    assert_eq!(
        pair.peers[SERVER].decided(),
        None,
        "still waiting for a proof"
    );
    assert!(request.starts_with(&pair.peers[SERVER].got));
    assert_eq!(reply, plan.server_out);
    while pair.peers[SERVER].decided().is_none() {
        assert!(n < 5_000, "no decision");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[SERVER].decided(), Some(StreamPath::Tcp));
    // Relayed on: more bytes both ways.
    tcp.write_all(b"more").expect("write");
    pair.peers[SERVER].app.write_all(b"back").expect("write");
    let mut back = Vec::new();
    for _ in 0..50 {
        pair.step(n, &plan);
        n += 1;
        let mut buf = [0u8; 16];
        if let Ok(k) = tcp.read(&mut buf) {
            back.extend_from_slice(&buf[..k]);
        }
    }
    assert_eq!(back, b"back");
    // The relay still guards against a late proof: the end of what arrived may wait, as above,
    // until the guard ends.
    let whole = [request.as_slice(), b"more"].concat();
    let until = std::time::Instant::now() + GUARD_WAIT + Duration::from_secs(1);
    while pair.peers[SERVER].got != whole {
        assert!(std::time::Instant::now() < until, "held past the guard");
        std::thread::sleep(Duration::from_millis(10));
        pair.step(n, &plan);
        n += 1;
    }
}

/// CONFIRM came, the proof never does: at the deadline the server gives the stream up and
/// relays over TCP; the bytes the client wrote on the stream never reach the app.
#[test]
fn no_proof_by_the_deadline_relays_and_nothing_of_the_stream_reaches_the_app() {
    let plan = Plan {
        proof_after: usize::MAX / 2,
        ..Plan::fixed(
            b"stream bytes that must not arrive".to_vec(),
            Vec::new(),
            (3, 3),
        )
    };
    let mut pair = Pair::new(&plan);
    let started = pair.now;
    for n in 0..5_000 {
        pair.step(n, &plan);
        if pair.peers[SERVER].decided().is_some() {
            break;
        }
    }
    assert_eq!(pair.peers[SERVER].decided(), Some(StreamPath::Tcp));
    assert!(pair.now - started >= config().claim_timeout);
    assert!(
        pair.peers[SERVER].got.is_empty(),
        "{:?}",
        pair.peers[SERVER].got
    );
}

/// `TCP_INFO`'s counts ([`super::Conn::counters`]): a bound stream says so on both sides, and
/// once the server's app has every byte, the writes that asked for no completion are reported
/// acknowledged only after a flush (the engine's probe, whose completion reports every write
/// before it), within a few steps; the server counts every byte arrived.
#[test]
fn a_flush_reports_every_posted_byte_acknowledged() {
    let plan = Plan {
        chunk: 1000,
        close: false,
        ..Plan::fixed(bytes(3000, 1), Vec::new(), (4, 4))
    };
    let mut pair = Pair::new(&plan);
    let mut n = 0;
    while pair.peers[SERVER].got.len() < plan.client_out.len() {
        assert!(n < MAX_STEPS, "the bytes never arrived");
        pair.step(n, &plan);
        n += 1;
    }
    for side in [CLIENT, SERVER] {
        assert!(
            pair.peers[side].conn.shared.on_stream(),
            "side {side} bound"
        );
    }
    let (sent, acked, _) = pair.peers[CLIENT].link().byte_counts();
    assert_eq!(sent, 3000);
    assert!(
        acked < sent,
        "the last writes asked for no completion ({acked} of {sent})"
    );
    assert_eq!(pair.peers[SERVER].link().byte_counts().2, 3000, "arrived");
    let link = pair.peers[CLIENT].conn.link.as_mut().expect("a link");
    assert!(!link.acknowledged(), "a probe is posted");
    for _ in 0..10 {
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(
        pair.peers[CLIENT].link().byte_counts().1,
        3000,
        "acknowledged after the flush"
    );
    assert!(
        pair.peers[CLIENT]
            .conn
            .link
            .as_mut()
            .expect("a link")
            .acknowledged()
    );
}

/// A client attached before its CLAIM (as the shim's `connect()` returns) whose CLAIM never
/// comes (the server's requests are never carried: it accepted late, or another process did):
/// at its deadline it relays over TCP without a proof, the server gives its stream up too, and
/// every byte goes both ways over TCP.
#[test]
fn a_client_attached_before_its_claim_relays_when_none_comes() {
    let plan = Plan {
        chunk: 700,
        early: true,
        ..Plan::fixed(bytes(5000, 3), bytes(7000, 4), (1, 0))
    };
    let mut pair = Pair::new(&plan);
    let started = pair.now;
    pair.run(&plan).expect("both ended");
    let [client, server] = &pair.peers;
    assert_eq!(client.decided(), Some(StreamPath::Unclaimed));
    assert_eq!(server.decided(), Some(StreamPath::Tcp));
    assert!(
        pair.now - started >= CLAIM_BY,
        "relayed before the deadline"
    );
    assert_eq!(server.got, plan.client_out);
    assert_eq!(client.got, plan.server_out);
    for peer in &pair.peers {
        let end = peer.end().unwrap_or_else(unreachable);
        assert_eq!((end.path, end.error), (StreamPath::Tcp, None));
    }
}

/// The first bytes never wait for the stream: a client attached before its CLAIM gets its
/// server's banner at once, and its answer reaches the server's app at once, over TCP, while
/// CLAIM is still on its way (here it never comes: the server's requests are not carried). At
/// its deadline the client gives the stream up without a proof and both relay on.
#[test]
fn a_banner_and_its_answer_cross_before_the_claim() {
    let plan = Plan {
        early: true,
        close: false,
        ..Plan::fixed(Vec::new(), Vec::new(), (1, 0))
    };
    let mut pair = Pair::new(&plan);
    pair.peers[SERVER]
        .app
        .write_all(b"220 banner\r\n")
        .expect("banner");
    let mut n = 0;
    while pair.peers[CLIENT].got.len() < 12 {
        assert!(n < 20, "the banner waited");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[CLIENT].got, b"220 banner\r\n");
    assert_eq!(
        pair.peers[CLIENT].decided(),
        None,
        "still waiting for CLAIM"
    );
    pair.peers[CLIENT].app.write_all(b"EHLO").expect("write");
    while pair.peers[SERVER].got.len() < 4 {
        assert!(n < 40, "the answer waited");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[SERVER].got, b"EHLO");
    while pair.peers[CLIENT].decided().is_none() {
        assert!(n < 5_000, "no decision");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[CLIENT].decided(), Some(StreamPath::Unclaimed));
    assert!(n as u32 * TICK >= CLAIM_BY, "gave up before the deadline");
    pair.peers[CLIENT].app.write_all(b" more").expect("write");
    for _ in 0..50 {
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[SERVER].got, b"EHLO more");
}

/// The move: both apps write from the start, CLAIM and the proof are held back for a while
/// (the fabric carries nothing), so each direction's first bytes go over TCP and the rest on
/// the stream; each app gets every byte once, in order, and both paths carried some.
#[test]
fn bytes_before_and_after_the_move_arrive_once_and_in_order() {
    let plan = Plan {
        chunk: 3000,
        early: true,
        ..Plan::fixed(bytes(2_000_000, 5), bytes(1_500_000, 6), (4, 4))
    };
    let held = Plan {
        carry: vec![(0, 0)],
        ..plan.clone()
    };
    let mut pair = Pair::new(&plan);
    for n in 0..3 {
        pair.step(n, &held);
    }
    assert_eq!(pair.peers[CLIENT].decided(), None, "no CLAIM yet");
    assert!(
        !pair.peers[SERVER].got.is_empty() && !pair.peers[CLIENT].got.is_empty(),
        "the first bytes went over TCP"
    );
    let steps = pair.run(&plan).expect("both ended");
    check(&pair, &plan).expect("every byte once, in order");
    assert!(steps > 0);
    for (side, out) in [(CLIENT, &plan.client_out), (SERVER, &plan.server_out)] {
        let (on_stream, _, _) = pair.peers[side].link().byte_counts();
        assert!(
            on_stream > 0 && on_stream < out.len() as u64,
            "side {side}: {on_stream} of {} on the stream",
            out.len()
        );
        assert!(
            pair.peers[side].sent_itself > 0,
            "side {side}: the app sent its first bytes itself"
        );
    }
}

/// Request and response, each as short as a connection per request makes them: the client
/// writes its request and ends its side at once, the server echoes and closes after the
/// client's EOF, at random interleavings and sizes (from one byte). The request and the reply
/// may cross entirely over TCP before the move, or partly, or on the stream; the client gets
/// its request back whole every time.
#[test]
fn a_request_and_its_echo_arrive_whole_whatever_the_move_point() {
    fuzz::run(
        "in-process echo across the move",
        48,
        Duration::from_secs(120),
        || {
            (
                1usize..50_000,
                proptest::collection::vec((0usize..4, 0usize..4), 1..8),
                1usize..10_000,
                0usize..30,
                0usize..4,
                (0usize..40, 0usize..40, any::<bool>(), 0usize..4),
            )
                .prop_map(
                    |(
                        len,
                        carry,
                        chunk,
                        client_waits,
                        server_first_every,
                        (at, steps, app_sends, app_first_every),
                    )| Plan {
                        chunk,
                        app_sends,
                        app_first_every,
                        early: true,
                        echo: true,
                        client_waits,
                        server_first_every,
                        client_stalls: at..at + steps,
                        carry: carry.into_iter().chain([(1, 1)]).collect(),
                        ..Plan::fixed(bytes(len, 7), Vec::new(), (1, 1))
                    },
                )
        },
        |plan| {
            let mut pair = Pair::new(&plan);
            pair.run(&plan)?;
            let [client, server] = &pair.peers;
            prop_assert_eq!(&server.got, &plan.client_out);
            prop_assert_eq!(&client.got, &plan.client_out);
            for peer in &pair.peers {
                let end = peer.end().unwrap_or_else(unreachable);
                prop_assert_eq!(end.error, None);
            }
            Ok(())
        },
    );
}

/// The server may finish (its reply and FIN on the stream, acknowledged by the client's
/// device) and let go of its TCP socket while the client's engine has not run yet: the client
/// then finds the TCP connection's EOF before it reads the server's word of the move on the
/// stream. That EOF is not the server app's: the reply comes whole from the stream. Swept over
/// when the client's app writes, when its engine stalls and in which order the engines run.
#[test]
fn an_echo_whose_server_let_go_of_tcp_before_the_client_ran_arrives_whole() {
    let mut bad = Vec::new();
    for client_waits in 0..4 {
        for at in 0..12 {
            for server_first_every in 0..2 {
                let plan = Plan {
                    chunk: 100,
                    early: true,
                    echo: true,
                    client_waits,
                    server_first_every,
                    client_stalls: at..at + 30,
                    ..Plan::fixed(bytes(160, 7), Vec::new(), (1, 1))
                };
                let mut pair = Pair::new(&plan);
                let ran = pair.run(&plan);
                if ran.is_err() || pair.peers[CLIENT].got != plan.client_out {
                    bad.push((
                        client_waits,
                        at,
                        server_first_every,
                        pair.peers[CLIENT].events(),
                    ));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} runs lost the reply: {:?}",
        bad.len(),
        bad.first()
    );
}

/// A connection the accepting side of TCP makes back to its client (a Service's backend,
/// docs/shim-protocol.md "Services"): both sides attach before it is established, relay their
/// apps' first bytes over TCP, and bind once it is (at a random step, with random sizes,
/// schedules and faults after it): each app gets every byte once and in order, and a run
/// without a fault ends on the stream.
#[test]
fn a_connection_established_after_both_attached_moves_every_byte_once() {
    let fault = prop_oneof![
        3 => Just(Fault::None),
        1 => (0usize..3_000).prop_map(|at| Fault::Cut { at }),
        1 => (0usize..3_000, 0usize..2, proptest::sample::select(vec![4u32, 10, 12]))
            .prop_map(|(at, side, status)| Fault::Fail { at, side, status }),
    ];
    fuzz::run(
        "in-process streams established after the attach",
        64,
        Duration::from_secs(120),
        move || {
            (plan(fault.clone().boxed()), 0usize..300).prop_map(|(plan, at)| Plan {
                early: true,
                connect: Connect::At(at),
                ..plan
            })
        },
        |plan| {
            let pair = run(&plan)?;
            if matches!(plan.fault, Fault::None) {
                for peer in &pair.peers {
                    let end = peer.end().unwrap_or_else(unreachable);
                    prop_assert_eq!(end.error, None);
                    prop_assert_eq!(peer.decided(), Some(StreamPath::Rdma));
                }
            }
            Ok(())
        },
    );
}

/// A connection established just before the bound both sides attached with ran out (an engine
/// busy relaying the first bytes comes to it late): the binding gets the claim timeout from
/// there, and every byte moves once, the rest on the stream.
#[test]
fn a_connection_established_at_its_bound_still_binds() {
    let at = usize::try_from(CLAIM_BY.as_millis() / TICK.as_millis()).unwrap_or(0) - 2;
    let plan = Plan {
        chunk: 700,
        early: true,
        client_waits: at,
        connect: Connect::At(at),
        ..Plan::fixed(bytes(50_000, 3), bytes(70_000, 4), (1, 1))
    };
    let mut pair = Pair::new(&plan);
    pair.run(&plan).expect("both ended");
    let [client, server] = &pair.peers;
    assert_eq!(server.got, plan.client_out);
    assert_eq!(client.got, plan.server_out);
    for peer in &pair.peers {
        assert_eq!(peer.decided(), Some(StreamPath::Rdma));
        let end = peer.end().unwrap_or_else(unreachable);
        assert_eq!((end.path, end.error), (StreamPath::Rdma, None));
    }
}

/// Both sides attached before their connection, which never comes (the connect is rejected,
/// or comes after both gave up): each relays over TCP from the start and for good once the
/// connect failed or its deadline passed, and every byte goes both ways, once and in order. A
/// side whose peer ended its side on TCP first reports the connection as one that ended
/// before its stream came; one that gave up while its peer was still there, as not claimed
/// (the connecting side) or as staying on TCP (the accepting side).
#[test]
fn a_connection_that_never_comes_leaves_both_relayed() {
    for connect in [
        Connect::FailsAt(0),
        Connect::FailsAt(30),
        Connect::At(5_000),
    ] {
        let plan = Plan {
            chunk: 700,
            early: true,
            connect,
            ..Plan::fixed(bytes(50_000, 3), bytes(70_000, 4), (1, 1))
        };
        let mut pair = Pair::new(&plan);
        pair.run(&plan).expect("both ended");
        let [client, server] = &pair.peers;
        assert_eq!(server.got, plan.client_out, "{connect:?}");
        assert_eq!(client.got, plan.server_out, "{connect:?}");
        let client_path = client.decided().expect("decided");
        let server_path = server.decided().expect("decided");
        assert!(
            matches!(client_path, StreamPath::Unclaimed | StreamPath::Unmoved),
            "{connect:?}: {client_path:?}"
        );
        assert!(
            matches!(server_path, StreamPath::Tcp | StreamPath::Unmoved),
            "{connect:?}: {server_path:?}"
        );
        for peer in &pair.peers {
            let end = peer.end().unwrap_or_else(unreachable);
            assert_eq!(
                (end.path, end.error),
                (StreamPath::Tcp, None),
                "{connect:?}"
            );
        }
    }
    // Neither app ends its side: the connecting side gives up when its connect fails, the
    // accepting side at its deadline.
    let plan = Plan {
        early: true,
        close: false,
        connect: Connect::FailsAt(0),
        ..Plan::fixed(Vec::new(), Vec::new(), (1, 1))
    };
    let mut pair = Pair::new(&plan);
    let mut n = 0;
    while pair.peers.iter().any(|p| p.decided().is_none()) {
        assert!(n < 5_000, "no decision");
        pair.step(n, &plan);
        n += 1;
    }
    assert_eq!(pair.peers[CLIENT].decided(), Some(StreamPath::Unclaimed));
    assert_eq!(pair.peers[SERVER].decided(), Some(StreamPath::Tcp));
    assert!(
        n as u32 * TICK >= CLAIM_BY,
        "the accepting side gave up early"
    );
}

/// Both engines poll and the fabric carries everything, until `done` holds (a bounded number
/// of rounds).
fn until_links(
    fabric: &Fabric,
    links: &mut [Link; 2],
    now: Instant,
    mut done: impl FnMut(&mut [Link; 2]) -> bool,
) -> Result<(), TestCaseError> {
    for _ in 0..1_000 {
        fabric.deliver(CLIENT, 64);
        fabric.deliver(SERVER, 64);
        for link in links.iter_mut() {
            link.poll(now).map_err(TestCaseError::fail)?;
        }
        if done(links) {
            return Ok(());
        }
    }
    Err(TestCaseError::fail("the links never settled"))
}

/// A connection finished in order on both sides, then its queue pairs carry the next one
/// (docs/shim-protocol.md, "Reused connections"): REUSE and REUSED, each side's halves renewed
/// at its boundary, then the next connection's binding and bytes. At random sizes and
/// interleavings for both, the next connection's apps get exactly what the other sent: no byte
/// of the last connection, no lost or repeated one, credits that add up from the start.
#[test]
fn a_parked_queue_pair_carries_the_next_connection_and_nothing_of_the_last() {
    fuzz::run(
        "in-process reuse of a finished connection's queue pair",
        24,
        Duration::from_secs(120),
        || {
            (
                plan(Just(Fault::None).boxed()),
                plan(Just(Fault::None).boxed()),
            )
        },
        |(first, second)| {
            let first = Plan {
                park: true,
                ..first
            };
            let mut pair = Pair::new(&first);
            pair.run(&first)?;
            check(&pair, &first)?;
            let Pair {
                fabric, peers, now, ..
            } = pair;
            let [mut client, mut server] = peers;
            let (Some(c), Some(s)) = (client.conn.link.take(), server.conn.link.take()) else {
                return Err(TestCaseError::fail("a link went"));
            };
            let mut links = [c, s];
            prop_assert!(links[CLIENT].parkable(), "the client's");
            prop_assert!(links[SERVER].parkable(), "the server's");
            until_links(&fabric, &mut links, now, |l| {
                let client = l[CLIENT].quiesce();
                l[SERVER].quiesce() && client
            })?;
            let hello = Payload::new(b"the next connection").expect("short");
            links[CLIENT].request_reuse(hello);
            until_links(&fabric, &mut links, now, |l| l[SERVER].reuse_pending())?;
            prop_assert!(links[SERVER].quiesce(), "nothing posted since it parked");
            prop_assert_eq!(links[SERVER].take_reuse(), Some(hello));
            links[SERVER].renew(Handshake::Claim, now, false);
            let accept = Payload::new(b"taken").expect("short");
            links[SERVER].answer_reuse(accept);
            until_links(&fabric, &mut links, now, |l| {
                l[CLIENT].reuse_pending() && l[CLIENT].quiesce()
            })?;
            prop_assert_eq!(links[CLIENT].take_reuse(), Some(accept));
            links[CLIENT].renew(Handshake::Confirm, now, true);
            let mut next = Pair::with(&second, fabric, Some(links), now);
            next.run(&second)?;
            check(&next, &second)?;
            for peer in &next.peers {
                let end = peer.end().unwrap_or_else(unreachable);
                prop_assert_eq!(end.error, None);
            }
            Ok(())
        },
    );
}

/// What the binding refuses around a reuse, on the fabric: a REUSE before the peer's FIN, and
/// anything the peer sends after its REUSE, fail the accepting side's link.
#[test]
fn a_reuse_out_of_place_fails_the_link() {
    let plan = Plan {
        park: true,
        ..Plan::fixed(bytes(3000, 1), bytes(2000, 2), (2, 2))
    };
    let mut pair = Pair::new(&plan);
    pair.run(&plan).expect("both ended");
    let Pair {
        fabric, peers, now, ..
    } = pair;
    let [mut client, mut server] = peers;
    let mut links = [
        client.conn.link.take().expect("a link"),
        server.conn.link.take().expect("a link"),
    ];
    let hello = Payload::new(b"x").expect("short");
    links[CLIENT].request_reuse(hello);
    until_links(&fabric, &mut links, now, |l| l[SERVER].reuse_pending()).expect("REUSE");
    // A second REUSE on the same connection: the server's link fails on it.
    links[CLIENT].request_reuse(hello);
    fabric.deliver(CLIENT, 64);
    let failed = (0..100).any(|_| {
        fabric.deliver(CLIENT, 64);
        links[SERVER].poll(now).is_err()
    });
    assert!(failed, "a second REUSE is refused");
}
