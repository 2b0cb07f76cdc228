//! One connection's life on the engine thread (net/smc's connection state and `smc_close.c`):
//! its CM phase, its [`Link`] once set up, and what its local side does ([`App`]): unattached,
//! relaying its first bytes over TCP while the binding is made and each direction moves to the
//! stream, pumping the stream, relaying over TCP, done. Every transition is here: attach, the
//! proof, the move, relay instead, fail, the orderly finish.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::early::EarlyWrites;
use super::link::Link;
use super::park::Parked;
use super::proof::Scan;
use super::relay::{Pipes, Ready, Relay, Step};
use super::shared::ConnShared;
use super::{Attach, Carried, End, EngineConfig, Event, Handshake, StreamPath};
use crate::fd;
use crate::rdma::CmId;
use crate::wire::{ControlKind, RingInfo, Secret};

/// How long a relay that gave up on a proof holds TCP bytes that are the secret's start, for the
/// rest ([`Relay::guarded`]).
pub(super) const GUARD_WAIT: Duration = Duration::from_secs(2);

/// An attached local side.
pub(super) struct Attached {
    pub(super) local: OwnedFd,
    pub(super) local_ready: Ready,
    pub(super) kept: Option<Arc<OwnedFd>>,
    /// The kept socket is watched (until its FIN).
    pub(super) watch_kept: bool,
    pub(super) kept_ready: Ready,
    /// The accepting side of [`Handshake::Claim`] until its stream is bound.
    pub(super) awaiting: Option<Awaiting>,
    /// The connecting side attached before CLAIM ([`Attach::claim_by`]): until when it waits
    /// for it (then: relay over TCP).
    pub(super) awaiting_claim: Option<Instant>,
    /// The accepting side attached before its connection was established: its CLAIM (the
    /// secret in [`Attached::awaiting`]) goes out once it is.
    pub(super) claim_due: bool,
    /// Attached before the connection was established ([`Attach::claim_by`]).
    pub(super) early: bool,
    pub(super) local_eof: bool,
    /// The app closed with `SO_LINGER {1, 0}`: the stream fails, without FIN, once what was
    /// posted before reached the peer ([`pump`]).
    pub(super) resetting: bool,
    pub(super) local_shut: bool,
    pub(super) sent: u64,
    pub(super) received: u64,
    pub(super) on_event: Box<dyn FnMut(Event) + Send>,
    pub(super) on_bytes: Option<fn(Carried, u64, u64)>,
    /// The shim's connection before both directions moved to the stream: its bytes go over
    /// the kept TCP socket meanwhile (docs/shim-protocol.md, "The move").
    pub(super) handover: Option<Pipes>,
}

impl Attached {
    /// No path is agreed yet: the accepting side waits for the proof and CONFIRM, or the
    /// connecting side for CLAIM.
    fn undecided(&self) -> bool {
        self.awaiting.is_some() || self.awaiting_claim.is_some()
    }

    /// Neither side is committed to the stream: no proof was taken (accepting side) or written
    /// (connecting side), so both are still on TCP and a relay loses nothing.
    fn uncommitted(&self) -> bool {
        self.awaiting.is_some_and(|w| !w.proven) || self.awaiting_claim.is_some()
    }

    /// The pipes of a handover over the kept socket (readiness unknown: both tried once).
    fn pipes(&mut self) -> Option<Pipes> {
        let kept = self.kept.as_ref()?;
        self.kept_ready = Ready::unknown();
        Some(Pipes::new(self.local.as_fd(), kept.as_fd()))
    }

    /// The app's thread may send its first bytes on the kept socket itself until its
    /// direction moves ([`EarlyWrites`]).
    fn let_app_write(&self, pipes: &mut Pipes, early: &Arc<EarlyWrites>) {
        if let Some(kept) = &self.kept {
            pipes.let_app_write(early, kept);
        }
    }

    /// The stream may hand the peer's bytes to the app: every byte the peer sent over TCP
    /// before its move was handed on.
    fn down_on_stream(&self) -> bool {
        self.handover.as_ref().is_none_or(Pipes::down_moved)
    }

    /// The app's bytes go on the stream: its direction moved (what it wrote before still goes
    /// out over TCP, ahead of them at the peer).
    fn up_on_stream(&self) -> bool {
        self.handover.as_ref().is_none_or(Pipes::up_stopped)
    }

    /// The path a relay that starts now is reported as.
    fn relayed_path(&self) -> StreamPath {
        if self.awaiting_claim.is_some() {
            StreamPath::Unclaimed
        } else {
            StreamPath::Tcp
        }
    }
}

/// What an accepting side ([`Handshake::Claim`]) waits for before its stream carries a byte:
/// the proof on the TCP connection ([`super::proof`]) and the peer's CONFIRM.
#[derive(Debug, Clone, Copy)]
pub(super) struct Awaiting {
    /// Until when (then: relay over TCP).
    pub(super) deadline: Instant,
    /// The secret our CLAIM carried.
    pub(super) secret: Secret,
    /// The secret came on the TCP connection and was taken out of it: the client committed to
    /// the stream.
    pub(super) proven: bool,
}

/// What the local side is doing.
pub(super) enum App {
    /// Not attached yet.
    Unattached,
    /// Pumping to and from the stream (or waiting for CONFIRM).
    Stream(Attached),
    /// Relaying over the kept TCP socket.
    Relay(Relay, Box<dyn FnMut(Event) + Send>),
    /// Finished.
    Done,
}

/// The CM side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmPhase {
    /// Active: resolving the address, then the route; connecting.
    Resolving,
    Connecting,
    /// Passive, made by [`super::Engine::expect`]: no peer came yet (its listener waits).
    Expecting,
    /// Passive: the acceptor deferred its decision (until the deadline).
    Deciding(Instant),
    /// Passive: accepted, not yet established.
    Accepted,
    /// Active: asked for a parked connection with REUSE (until the deadline: then a connect
    /// request instead).
    Reusing(Instant),
    /// Active: waits for a connection to the peer to finish and be parked (until the deadline:
    /// then a connect request).
    Waiting(Instant),
    Established,
    /// Disconnect sent; the id is destroyed at DISCONNECTED or at the deadline.
    Disconnecting(Instant),
}

/// One connection.
pub(super) struct StreamConn {
    pub(super) shared: Arc<ConnShared>,
    pub(super) id: Option<CmId>,
    pub(super) cm: CmPhase,
    pub(super) link: Option<Link>,
    pub(super) app: App,
    /// When an established, unattached connection is dropped.
    pub(super) unattached_deadline: Option<Instant>,
    /// An outgoing connection's own wait for its attach (None: the engine's).
    pub(super) unattached_timeout: Option<Duration>,
    /// Why the stream failed (kept for the end report).
    pub(super) error: Option<String>,
    /// The CM reported the peer's disconnect.
    pub(super) peer_gone: bool,
    /// An incoming connection: what its request said (kept for the accept, which allocates).
    pub(super) offer: Option<Offer>,
    /// When the event loop's live timer for this connection fires (its other entries in the
    /// loop's heap are stale and skipped): one entry per deadline, not one per event.
    pub(super) timer_at: Option<Instant>,
    /// A finished connection kept for the next one (`super::park`).
    pub(super) parked: Option<Parked>,
    /// An incoming connection that came as a REUSE on a parked connection: its accept is a
    /// REUSED, its refusal a disconnect.
    pub(super) reused: bool,
}

/// What an incoming connect request offered: the peer's ring and where it came from, and how
/// the listener's connections start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer {
    pub(super) ring: RingInfo,
    pub(super) from: Option<std::net::IpAddr>,
    pub(super) handshake: Handshake,
    /// The listener whose acceptor judged it (None: an [`super::Engine::expect`] one).
    pub(super) listener: Option<u64>,
}

/// What the loop must do with epoll registrations after a transition.
#[derive(Debug, Default)]
pub(super) struct Fds {
    /// Fds to remove from epoll and let go (closed when no other holder is left).
    pub(super) closing: Vec<Arc<OwnedFd>>,
    /// The kept socket needs no more watching (its FIN came).
    pub(super) unwatch_kept: bool,
}

impl StreamConn {
    pub(super) fn new(shared: Arc<ConnShared>, id: Option<CmId>, cm: CmPhase) -> StreamConn {
        StreamConn {
            shared,
            id,
            cm,
            link: None,
            app: App::Unattached,
            unattached_deadline: None,
            unattached_timeout: None,
            error: None,
            peer_gone: false,
            offer: None,
            timer_at: None,
            parked: None,
            reused: false,
        }
    }

    /// An incoming connection that waits for its decision or its app: state an
    /// unauthenticated peer can make ([`super::EngineConfig::max_unattached`]).
    pub(super) fn unattached_incoming(&self) -> bool {
        self.offer.is_some() && self.id.is_some() && matches!(self.app, App::Unattached)
    }

    /// An [`super::Engine::expect`] connection that may still take its peer: no peer came,
    /// nothing failed, and its local side (if attached) still waits for the stream.
    pub(super) fn expecting(&self) -> bool {
        self.cm == CmPhase::Expecting
            && self.error.is_none()
            && match &self.app {
                App::Unattached => true,
                App::Stream(a) => a.uncommitted(),
                App::Relay(..) | App::Done => false,
            }
    }

    /// True when nothing is left: no id, no resources, no local side (an expecting connection
    /// not attached yet is not finished: its attach is on its way; nor is one whose REUSE is
    /// out or that waits for a queue pair to reuse: its queue pair is on its way).
    pub(super) fn finished(&self) -> bool {
        self.id.is_none()
            && self.link.is_none()
            && match self.app {
                App::Unattached => {
                    !matches!(
                        self.cm,
                        CmPhase::Expecting | CmPhase::Reusing(_) | CmPhase::Waiting(_)
                    ) || self.error.is_some()
                }
                App::Done => true,
                App::Stream(_) | App::Relay(..) => false,
            }
    }

    /// The stream carries bytes (established or accepted, not failing).
    fn stream_usable(&self) -> bool {
        self.error.is_none()
            && !matches!(self.cm, CmPhase::Disconnecting(_))
            && self.link.as_ref().is_some_and(Link::is_ready)
    }

    /// Takes the local side: pumped from now on.
    pub(super) fn attach(
        &mut self,
        local: OwnedFd,
        attach: Attach,
        config: &EngineConfig,
        now: Instant,
        fds: &mut Fds,
    ) {
        let Attach {
            kept,
            handshake,
            on_event,
            on_bytes,
            claim_by,
            give_back,
        } = attach;
        // The app's thread may have sent its first bytes on the kept socket already
        // ([`Conn::attach`](super::Conn::attach)): from here on only a relay that publishes
        // what it holds of the app's bytes lets it ([`Attached::let_app_write`]).
        self.shared.early().close();
        // The engine reads an urgent byte inline, so none is ever dropped: one the app sent
        // through `Writer::send_urgent` it finds at the mark (`tx`), one sent past the hooks it
        // carries as an ordinary byte.
        let _ = fd::set_urgent_inline(local.as_fd(), true);
        // The engine never waits on a socket: the kept one is peeked, and relayed when the
        // connection stays TCP. Its description is the engine's alone from the attach on (the
        // app's number names the socketpair; no attached socket goes back to the app).
        if let Some(k) = &kept {
            let _ = fd::set_only_nonblocking(k.as_fd());
        }
        self.unattached_deadline = None;
        let usable = self.error.is_none()
            && !self.peer_gone
            && !matches!(self.cm, CmPhase::Disconnecting(_));
        // Attached before the connection is established ([`Attach::claim_by`]): relayed over
        // the kept socket until then.
        let early = usable
            && kept.is_some()
            && matches!(
                self.cm,
                CmPhase::Resolving | CmPhase::Connecting | CmPhase::Expecting
            )
            && self
                .link
                .as_ref()
                .is_none_or(|r| !r.is_ready() && r.handshake() == handshake)
            && (handshake == Handshake::Claim
                || (handshake == Handshake::Confirm && claim_by.is_some()));
        let alive = early
            || (usable
                && self
                    .link
                    .as_ref()
                    .is_some_and(|r| r.handshake() == handshake));
        let mut attached = Attached {
            local,
            local_ready: Ready::unknown(),
            watch_kept: kept.is_some(),
            kept,
            kept_ready: Ready::default(),
            awaiting: None,
            awaiting_claim: claim_by.filter(|_| handshake == Handshake::Confirm),
            claim_due: false,
            early,
            local_eof: false,
            resetting: false,
            local_shut: false,
            sent: 0,
            received: 0,
            on_event,
            on_bytes,
            handover: None,
        };
        if !alive {
            if attached.kept.is_none()
                && let Some(give_back) = give_back
            {
                // Nothing was read from `local`: its owner carries it another way.
                give_back(attached.local);
                self.app = App::Done;
                return;
            }
            // Gone before the attach. Without CONFIRM neither side moved: relay over TCP.
            match (handshake, attached.kept.take()) {
                (Handshake::Confirm | Handshake::Claim, Some(kept)) => {
                    let path = attached.relayed_path();
                    (attached.on_event)(Event::Decided(path));
                    self.app = App::Relay(Relay::new(attached.local, kept), attached.on_event);
                }
                (_, kept) => {
                    (attached.on_event)(Event::Decided(StreamPath::Broken));
                    (attached.on_event)(Event::Ended(End {
                        path: StreamPath::Broken,
                        sent: 0,
                        received: 0,
                        error: Some(String::from("the connection ended before it was attached")),
                        reset: true,
                    }));
                    if let Some(k) = kept {
                        fd::reset(k.as_fd());
                        fds.closing.push(k);
                    }
                    end_local(attached.local, true, fds);
                    self.app = App::Done;
                }
            }
            return;
        }
        match handshake {
            Handshake::Confirm if attached.awaiting_claim.is_some() => {
                // The app's first bytes go over TCP at once; the proof and CONFIRM once CLAIM
                // came ([`StreamConn::client_moves`]).
                if let Some(mut pipes) = attached.pipes() {
                    pipes.hold_up_eof();
                    pipes.hold_down_eof();
                    attached.let_app_write(&mut pipes, self.shared.early());
                    attached.handover = Some(pipes);
                }
            }
            Handshake::Open | Handshake::Confirm => {
                if handshake == Handshake::Confirm {
                    // CLAIM came before the attach, and the caller wrote the proof: the app's
                    // bytes go on the stream from the start, the server's come over TCP until
                    // its move.
                    if let Some(mut pipes) = attached.pipes() {
                        pipes.stop_up();
                        pipes.hold_down_eof();
                        attached.handover = Some(pipes);
                    }
                    if let Some(r) = &mut self.link {
                        r.confirm();
                    }
                }
                self.shared.set_on_stream();
                (attached.on_event)(Event::Decided(StreamPath::Rdma));
            }
            Handshake::Claim => {
                let Some(secret) = Secret::random() else {
                    // No secret, no binding: the client gets no CLAIM and stays on TCP.
                    self.app = App::Stream(attached);
                    self.relay_instead(fds);
                    return;
                };
                match &mut self.link {
                    Some(r) if r.is_ready() => r.claim(secret),
                    _ => attached.claim_due = true,
                }
                attached.awaiting = Some(Awaiting {
                    deadline: claim_by.unwrap_or(now + config.claim_timeout),
                    secret,
                    proven: false,
                });
                // Both apps' bytes go over TCP until the move; the client's are searched for
                // the proof on the way.
                if let Some(mut pipes) = attached.pipes() {
                    pipes.scan_down(Scan::new(secret));
                    pipes.hold_down_eof();
                    attached.let_app_write(&mut pipes, self.shared.early());
                    attached.handover = Some(pipes);
                }
            }
        }
        self.app = App::Stream(attached);
    }

    /// The local fd became ready.
    /// `urgent`: it reported urgent data (`EPOLLPRI`).
    pub(super) fn local_event(&mut self, readable: bool, writable: bool, urgent: bool) {
        match &mut self.app {
            App::Stream(a) => a.local_ready.note(readable, writable, urgent),
            App::Relay(r, _) => r.local_ready.note(readable, writable, urgent),
            App::Unattached | App::Done => {}
        }
    }

    /// The kept TCP socket became ready.
    /// `urgent`: it reported urgent data (`EPOLLPRI`).
    pub(super) fn kept_event(
        &mut self,
        readable: bool,
        writable: bool,
        urgent: bool,
        fds: &mut Fds,
    ) {
        match &mut self.app {
            App::Stream(a) => {
                a.kept_ready.note(readable, writable, urgent);
                if a.handover.as_ref().is_some_and(Pipes::reads_far) || !a.watch_kept || !readable {
                    // Before its move the peer's bytes come this way: the handover reads them.
                    return;
                }
                let Some(kept) = &a.kept else { return };
                match fd::peek(kept) {
                    fd::Peeked::Nothing => {}
                    // A peer that finished closes its TCP socket while its last bytes may
                    // still be on the stream: a FIN only ends the watch.
                    fd::Peeked::Fin => {
                        a.watch_kept = false;
                        fds.unwatch_kept = true;
                    }
                    fd::Peeked::Bytes => {
                        self.fail(
                            "bytes arrived on the kept TCP connection after the move".into(),
                            fds,
                        );
                    }
                    fd::Peeked::Failed(e) => {
                        // The peer's RST comes after its last bytes reached this side (it
                        // waits for their acknowledgement): the app reads them first, as
                        // from one TCP connection.
                        self.deliver_arrived();
                        self.fail_reset(format!("the kept TCP connection failed: {e}"), fds);
                    }
                }
            }
            App::Relay(r, _) => r.far_ready.note(readable, writable, urgent),
            App::Unattached | App::Done => {}
        }
    }

    /// Takes the completions that came and hands what arrived to the local side, as far as it
    /// takes it now (before a failure: what the peer sent before it failed is the app's).
    fn deliver_arrived(&mut self) {
        let (Some(link), App::Stream(a)) = (self.link.as_mut(), &mut self.app) else {
            return;
        };
        if a.undecided() || !a.down_on_stream() || link.poll(Instant::now()).is_err() {
            return;
        }
        a.local_ready.writable = true;
        if let Ok(n) = link.deliver_to(&a.local, &mut a.local_ready) {
            a.received += n;
        }
    }

    /// The connection of a side attached before it existed ([`Attach::claim_by`]) is
    /// established now: `claim_by` bounded how long the connection itself could take; the
    /// binding (CLAIM, the proof behind the bytes already on their way, CONFIRM) now gets what
    /// any connection's gets, `claim_timeout` from here, however much of the first bound is
    /// left. An engine busy relaying the first bytes may take longer than that bound to come to
    /// CLAIM, and a binding given up for it keeps the connection on TCP (and a backend's client
    /// out of streams for the negative cache's while).
    pub(super) fn binding_starts(&mut self, now: Instant, claim_timeout: Duration) {
        let App::Stream(a) = &mut self.app else {
            return;
        };
        if !a.early {
            return;
        }
        let until = now + claim_timeout;
        if let Some(t) = a.awaiting_claim.as_mut() {
            *t = (*t).max(until);
        }
        if let Some(w) = a.awaiting.as_mut().filter(|w| !w.proven) {
            w.deadline = w.deadline.max(until);
        }
    }

    /// An accepting side attached before its connection was established: its CLAIM goes out
    /// once it is.
    fn send_due_claim(&mut self) {
        if let (Some(link), App::Stream(a)) = (self.link.as_mut(), &mut self.app)
            && a.claim_due
            && link.is_ready()
            && let Some(w) = a.awaiting
        {
            a.claim_due = false;
            link.claim(w.secret);
        }
    }

    /// Relays the first bytes over the kept TCP socket until both directions moved to the
    /// stream (docs/shim-protocol.md, "The move"); on the accepting side, the search for the
    /// proof among the client's bytes. A failure before either side committed ends the
    /// connection as TCP's would end (it was TCP so far); one after fails it (reset).
    fn step_handover(&mut self, draining: bool, fds: &mut Fds) {
        let App::Stream(a) = &mut self.app else {
            return;
        };
        let (Some(pipes), Some(kept)) = (a.handover.as_mut(), a.kept.as_ref()) else {
            return;
        };
        pipes.tell_urgent_writes(self.shared.urgent_gate());
        let before = pipes.moved();
        let step = pipes.step(
            a.local.as_fd(),
            kept.as_fd(),
            &mut a.local_ready,
            &mut a.kept_ready,
            draining,
        );
        let after = pipes.moved();
        let (up, down) = (after.0 - before.0, after.1 - before.1);
        a.sent += up;
        a.received += down;
        if up + down > 0
            && let Some(count) = a.on_bytes
        {
            count(Carried::BeforeMove, up, down);
        }
        if let Step::Failed(e) = step {
            let why = format!("on TCP before the move: {e}");
            if a.uncommitted() {
                // As a relay's failure: the TCP side is reset, the app told.
                fd::reset(kept.as_fd());
                self.relay_as(Some(StreamPath::Unmoved), fds);
                self.end_relay(Some(why), fds);
            } else {
                self.fail_reset(why, fds);
            }
            return;
        }
        if let Some(w) = &mut a.awaiting
            && pipes.proof_found()
        {
            w.proven = true;
        }
        if a.awaiting.is_some_and(|w| !w.proven) && pipes.down_eof() {
            // The client ended its side on TCP without the proof: it stays there. Attached
            // before its connection came, the peer may simply have finished first.
            let early = a.early;
            self.relay_as(early.then_some(StreamPath::Unmoved), fds);
            return;
        }
        if pipes.up_moved() && pipes.down_moved() {
            a.handover = None;
        }
    }

    /// The connecting side attached before CLAIM ([`Attach::claim_by`]): once CLAIM came (the
    /// link took it), its direction moves to the stream: the app's socketpair is read no
    /// further for TCP, the secret goes out on the kept TCP connection behind the bytes read
    /// so far (the proof), then CONFIRM, and the app's next bytes go on the stream. From the
    /// proof on this side is committed to the stream: a proof that cannot be written whole
    /// fails the connection (reset), never a TCP stream with stray bytes. True when it moved
    /// now.
    fn client_moves(&mut self, fds: &mut Fds) -> bool {
        let (Some(link), App::Stream(a)) = (self.link.as_mut(), &mut self.app) else {
            return false;
        };
        if a.awaiting_claim.is_none() {
            return false;
        }
        let Some(secret) = link.claim_seen() else {
            return false;
        };
        let Some(pipes) = a.handover.as_mut() else {
            self.fail_reset(String::from("writing the proof: no TCP connection"), fds);
            return false;
        };
        pipes.stop_up();
        pipes.inject_up(secret.bytes());
        // An app that ended its side before CLAIM came: its FIN goes on the stream.
        a.local_eof |= pipes.up_eof();
        a.awaiting_claim = None;
        link.confirm();
        self.shared.set_on_stream();
        (a.on_event)(Event::Decided(StreamPath::Rdma));
        true
    }

    /// Gives up the stream of a [`Handshake::Claim`] connection not bound yet: the client
    /// stayed on TCP (or is not the RDMA peer), so the local side is relayed over the kept
    /// socket.
    fn relay_instead(&mut self, fds: &mut Fds) {
        self.relay_as(None, fds);
    }

    /// [`StreamConn::relay_instead`], reported as `path` (None: as [`Attached::relayed_path`]).
    fn relay_as(&mut self, path: Option<StreamPath>, fds: &mut Fds) {
        let App::Stream(a) = std::mem::replace(&mut self.app, App::Done) else {
            return;
        };
        let path = path.unwrap_or_else(|| a.relayed_path());
        let Attached {
            local,
            kept,
            mut on_event,
            awaiting,
            handover,
            ..
        } = a;
        match kept {
            Some(kept) => {
                on_event(Event::Decided(path));
                // A proof that comes after all must not reach the app (the relay's guard).
                let guard_until = Instant::now() + GUARD_WAIT;
                let relay = match (handover, awaiting) {
                    (Some(mut pipes), _) => {
                        pipes.resume(guard_until);
                        Relay::resume(local, kept, pipes)
                    }
                    (None, Some(w)) => Relay::guarded(local, kept, w.secret, guard_until),
                    (None, None) => Relay::new(local, kept),
                };
                self.app = App::Relay(relay, on_event);
            }
            None => {
                on_event(Event::Decided(StreamPath::Broken));
                on_event(Event::Ended(End {
                    path: StreamPath::Broken,
                    sent: 0,
                    received: 0,
                    error: Some(String::from(
                        "no CONFIRM and no TCP connection to fall back on",
                    )),
                    reset: true,
                }));
                end_local(local, true, fds);
            }
        }
        self.error
            .get_or_insert_with(|| String::from("the peer stayed on TCP"));
    }

    /// The stream failed: the local side is shut down and a kept socket reset (the peer's
    /// TCP then fails too); the CM side is torn down by the loop.
    pub(super) fn fail(&mut self, why: String, fds: &mut Fds) {
        if let App::Stream(a) = &self.app
            && a.uncommitted()
        {
            let broken = a
                .kept
                .as_ref()
                .is_some_and(|k| matches!(fd::peek(k), fd::Peeked::Failed(_)));
            if !broken {
                // Not bound: the RDMA peer broke the rules, gave up or never proved it holds
                // the TCP connection, whose client is on TCP; or, on the connecting side, no
                // proof was written: both sides are on TCP.
                self.relay_instead(fds);
                return;
            }
        }
        self.fail_reset(why, fds);
    }

    /// The stream fails whether bound or not: the kept TCP connection failed. Its error was
    /// taken by the look that found it (a second look would say EOF, and relay a reset
    /// connection as one that ended).
    fn fail_reset(&mut self, why: String, fds: &mut Fds) {
        if self.error.is_none() {
            self.error = Some(why.clone());
        }
        if let Some(link) = &mut self.link {
            link.set_writing(false);
        }
        let peer_fin = self.link.as_ref().is_some_and(Link::peer_fin);
        let app = std::mem::replace(&mut self.app, App::Done);
        match app {
            App::Stream(mut a) => {
                let undecided = a.undecided();
                if undecided {
                    (a.on_event)(Event::Decided(StreamPath::Broken));
                }
                let path = if undecided {
                    StreamPath::Broken
                } else {
                    StreamPath::Rdma
                };
                // Reported before the local side ends, so the app's next read after the
                // delivered bytes can tell a broken stream from an orderly end.
                (a.on_event)(Event::Ended(End {
                    path,
                    sent: a.sent,
                    received: a.received,
                    error: Some(why),
                    reset: !peer_fin,
                }));
                if let Some(k) = a.kept.take() {
                    fd::reset(k.as_fd());
                    fds.closing.push(k);
                }
                end_local(a.local, !peer_fin, fds);
            }
            other => self.app = other,
        }
    }

    /// The connection's own timers at `now`: an established connection not attached in time
    /// is given up; an accepting side whose stream was not bound in time fails (which relays
    /// over TCP when its client is there).
    pub(super) fn timers(&mut self, now: Instant, fds: &mut Fds) {
        if self.unattached_deadline.is_some_and(|t| t <= now) && matches!(self.app, App::Unattached)
        {
            self.unattached_deadline = None;
            self.error
                .get_or_insert_with(|| String::from("not attached in time"));
        }
        if let App::Stream(a) = &self.app
            && a.awaiting.is_some_and(|w| w.deadline <= now)
        {
            self.fail(String::from("no proof and CONFIRM in time"), fds);
        }
        if let App::Stream(a) = &self.app
            && a.awaiting_claim.is_some_and(|t| t <= now)
        {
            self.fail(String::from("no CLAIM in time"), fds);
        }
    }

    /// After [`StreamConn::progress`]: a peer gone before its FIN fails the stream; true once
    /// the stream is over (failed, done, relayed, or its peer gone), so the connection
    /// manager's side is to be torn down.
    pub(super) fn settle(&mut self, fds: &mut Fds) -> bool {
        // A connection attached before it was established that then failed to establish
        // (rejected, unreachable, aborted): nobody committed, its local side is relayed.
        if let Some(why) = &self.error
            && let App::Stream(a) = &self.app
            && a.uncommitted()
        {
            // The peer that ended its side on TCP first may have let go of what it made for the
            // stream: it finished before its stream came.
            let finished = a.early && a.handover.as_ref().is_some_and(Pipes::down_eof);
            let why = why.clone();
            if finished {
                self.relay_as(Some(StreamPath::Unmoved), fds);
            } else {
                self.fail(why, fds);
            }
        }
        // A peer gone before its FIN leaves bytes of its direction missing: the stream fails.
        // One gone after its FIN has sent everything: the stream delivers what arrived and
        // ends when it did (`progress`), not at the disconnect (which would drop bytes the app
        // has not read yet).
        if self.peer_gone
            && self.error.is_none()
            && matches!(self.app, App::Stream(_) | App::Unattached)
            && !self.link.as_ref().is_some_and(Link::peer_fin)
        {
            let state = self.link.as_ref().map(Link::describe).unwrap_or_default();
            self.fail(format!("the peer disconnected ({state})"), fds);
        }
        self.error.is_some()
            || self.stream_done()
            || matches!(self.app, App::Relay(..))
            || (self.peer_gone && !matches!(self.app, App::Stream(_)))
    }

    /// Moves bytes and advances the state after any event. `draining`: the process exits.
    pub(super) fn progress(
        &mut self,
        now: Instant,
        config: &EngineConfig,
        draining: bool,
        fds: &mut Fds,
    ) {
        self.send_due_claim();
        self.step_handover(draining, fds);
        self.step_relay(draining, fds);
        if !self.stream_usable() {
            return;
        }
        let mut stepped = self.step_stream(now, draining);
        if matches!(stepped, Ok(false)) && self.client_moves(fds) {
            // The proof goes out at once, and what the app wrote since on the stream.
            self.step_handover(draining, fds);
            if !self.stream_usable() {
                return;
            }
            stepped = self.step_stream(now, draining);
        }
        if !self.stream_usable() {
            return;
        }
        match stepped {
            Ok(true) => self.finish_stream(fds),
            Ok(false) => {}
            Err(why) => {
                self.fail(why, fds);
                return;
            }
        }
        if let Some(link) = &mut self.link {
            link.probe_if_idle(now, config.keepalive);
        }
    }

    fn step_relay(&mut self, draining: bool, fds: &mut Fds) {
        let App::Relay(relay, _) = &mut self.app else {
            return;
        };
        relay.set_low_water(self.shared.low_water());
        relay.tell_urgent_writes(self.shared.urgent_gate());
        let error = match relay.step(draining) {
            Step::Idle => return,
            Step::Finished => None,
            Step::Failed(e) => Some(e.to_string()),
        };
        self.end_relay(error, fds);
    }

    /// The relay ended (with `error`, or in order): reported as TCP's end, and let go of.
    fn end_relay(&mut self, error: Option<String>, fds: &mut Fds) {
        let App::Relay(relay, on_event) = &mut self.app else {
            return;
        };
        let (sent, received) = relay.moved();
        // As for TCP: a failure after the far side's FIN reads EOF, and a write answers EPIPE.
        let reset = error.is_some() && !relay.far_finished();
        on_event(Event::Ended(End {
            path: StreamPath::Tcp,
            sent,
            received,
            error,
            reset,
        }));
        if let App::Relay(relay, _) = std::mem::replace(&mut self.app, App::Done) {
            // After the report: the app's next read can tell the failure from an end.
            end_local(relay.local, reset, fds);
            fds.closing.push(relay.far);
        }
    }

    /// One round of the stream: Ok(true) when both directions finished.
    fn step_stream(&mut self, now: Instant, draining: bool) -> Result<bool, String> {
        let StreamConn {
            link,
            app,
            shared,
            peer_gone,
            ..
        } = self;
        let Some(link) = link.as_mut() else {
            return Ok(false);
        };
        link.poll(now)?;
        let App::Stream(a) = app else {
            link.credit_if_due();
            return Ok(false);
        };
        if a.awaiting_claim.is_some() {
            // Nothing moves before the proof ([`StreamConn::give_proof`]).
            link.credit_if_due();
            return Ok(false);
        }
        if let Some(w) = a.awaiting {
            // Bound once the TCP client proved it holds our CLAIM's secret and the RDMA peer
            // confirmed; until then nothing the peer sent reaches the app.
            if !(w.proven && link.confirm_seen()) {
                link.credit_if_due();
                return Ok(false);
            }
            a.awaiting = None;
            // The server's own bytes move to the stream here: the client reads this many
            // over TCP first (an app that ended its side on TCP: its FIN follows on the
            // stream).
            if let Some(pipes) = a.handover.as_mut() {
                let count = pipes.stop_up();
                a.local_eof |= pipes.up_eof();
                link.moved(count);
            } else {
                link.moved(0);
            }
            shared.set_on_stream();
            (a.on_event)(Event::Decided(StreamPath::Rdma));
        }
        if let (Some(count), Some(pipes)) = (link.moved_seen(), a.handover.as_mut()) {
            // The server's bytes come over TCP up to its move, then on the stream.
            pipes.stop_down_at(count).map_err(|e| e.to_string())?;
        }
        link.adjust_rings(now);
        pump(link, a, draining).map_err(|e| format!("local side: {e}"))?;
        let inbound_done = link.peer_fin() && a.local_shut && !link.has_pending();
        // A peer gone after its FIN (its process exited, say) ends the stream once the app has
        // every byte it sent and its EOF, as a TCP socket's would: what the app writes from now
        // on has nowhere to go (the closed local side answers EPIPE, or a reset when it held
        // unread bytes of the app).
        let peer_left = *peer_gone || link.is_quiet();
        Ok(inbound_done && (link.fin_done() || peer_left) && a.handover.is_none())
    }

    /// Both directions finished: the local side is closed and the end reported; the loop
    /// disconnects.
    fn finish_stream(&mut self, fds: &mut Fds) {
        let App::Stream(a) = std::mem::replace(&mut self.app, App::Done) else {
            return;
        };
        let Attached {
            local,
            kept,
            mut on_event,
            sent,
            received,
            ..
        } = a;
        on_event(Event::Ended(End {
            path: StreamPath::Rdma,
            sent,
            received,
            error: None,
            reset: false,
        }));
        fds.closing.push(Arc::new(local));
        if let Some(k) = kept {
            fds.closing.push(k);
        }
    }

    /// Bytes moved between the local side and the peer so far (the exit flush's sign of
    /// progress).
    pub(super) fn moved(&self) -> u64 {
        match &self.app {
            App::Stream(a) => a.sent + a.received,
            App::Relay(r, _) => {
                let (up, down) = r.moved();
                up + down
            }
            App::Unattached | App::Done => 0,
        }
    }

    /// A relay started and not stepped yet ([`Relay::stepped`]): the loop steps it at once.
    pub(super) fn relay_unstepped(&self) -> bool {
        matches!(&self.app, App::Relay(r, _) if !r.stepped())
    }

    /// The stream's graceful end: both directions done, nothing attached any more.
    pub(super) fn stream_done(&self) -> bool {
        matches!(self.app, App::Done) && self.error.is_none()
    }

    /// True while the local side still has bytes of the app to deliver (the exit flush).
    pub(super) fn unflushed(&self) -> bool {
        match &self.app {
            App::Stream(_) => {
                !self.link.as_ref().is_some_and(Link::fin_done) && self.error.is_none()
            }
            App::Relay(r, _) => r.unflushed(),
            App::Unattached | App::Done => false,
        }
    }

    /// The earliest moment something must happen without an event.
    pub(super) fn next_deadline(&self, config: &EngineConfig) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut at = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        at(self.unattached_deadline);
        at(self.parked.map(|p| p.until));
        match self.cm {
            CmPhase::Deciding(t)
            | CmPhase::Disconnecting(t)
            | CmPhase::Reusing(t)
            | CmPhase::Waiting(t) => at(Some(t)),
            _ => {}
        }
        if let App::Relay(r, _) = &self.app {
            at(r.deadline());
        }
        if let App::Stream(a) = &self.app {
            at(a.awaiting.map(|w| w.deadline));
            at(a.awaiting_claim);
            if self.stream_usable() {
                at(self
                    .link
                    .as_ref()
                    .and_then(|r| r.probe_due(config.keepalive)));
            }
        }
        next
    }
}

/// Whether the app's end of the local side is closed (not only shut for writing) and the kept
/// TCP socket is set to reset on close: the hooks set that when the app asks for an abortive
/// close (`SO_LINGER` on with 0 s).
fn closed_with_reset(a: &Attached) -> bool {
    a.kept
        .as_ref()
        .is_some_and(|k| fd::resets_on_close(k.as_fd()))
        && fd::peer_closed(a.local.as_fd())
}

/// Lets go of the local side once its end was reported ([`Event::Ended`]). An orderly end is
/// shut down both ways, so that every copy of the fd sees it. A reset of an `AF_UNIX` local
/// side (the shim's socketpair) is only closed: when its last reference goes, the kernel hangs
/// up the app's end and, if the owner queued a byte into this end while the report ran
/// ([`End::reset`]), sets `ECONNRESET` on it, which `poll` reports as `POLLERR` and a read or
/// `SO_ERROR` takes once, as a TCP socket reports an RST. A shutdown first would let a read in
/// between take an EOF. Any other local side (the gateway's TCP sockets) is shut down.
fn end_local(local: OwnedFd, reset: bool, fds: &mut Fds) {
    if !reset || !fd::is_local_socket(local.as_fd()) {
        fd::shutdown_quietly(local.as_fd(), Shutdown::Both);
    }
    fds.closing.push(Arc::new(local));
}

/// The stream's pump: what arrived to the local side, the local side's bytes to the peer, the
/// half-closes and the credits.
fn pump(link: &mut Link, a: &mut Attached, draining: bool) -> io::Result<()> {
    // Each direction once it moved (before, its bytes go over TCP: [`StreamConn::step_handover`]).
    let down = a.down_on_stream();
    let up = a.up_on_stream();
    link.set_reading(down);
    let mut received = 0;
    if down {
        received = link.deliver_to(&a.local, &mut a.local_ready)? + link.take_read_bytes();
        if link.peer_fin() && !link.has_pending() && !a.local_shut {
            fd::shutdown_quietly(a.local.as_fd(), Shutdown::Write);
            a.local_shut = true;
        }
    }
    link.credit_if_due();
    let mut sent = link.take_written_bytes();
    if up && !a.local_eof {
        let (eof, moved) = link.send_from(&a.local, &mut a.local_ready, draining)?;
        sent += moved;
        a.local_eof = eof;
        a.resetting = eof && closed_with_reset(a);
    }
    if a.resetting && link.acknowledged() {
        // The app closed with SO_LINGER {1, 0}: TCP sends an RST, not a FIN, behind what it
        // had sent; the peer's app reads what arrived, then ECONNRESET. The stream fails
        // without its FIN once the bytes written before the close reached the peer (the
        // kept socket is reset, the peer's with it: the RST comes after the bytes, as on one
        // TCP connection).
        a.sent += sent;
        return Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "the app closed with a reset (SO_LINGER 0)",
        ));
    }
    // The app may write straight into the send ring until its side ended.
    link.set_writing(up && link.is_ready() && !link.is_quiet() && !a.local_eof);
    a.sent += sent;
    a.received += received;
    if (sent > 0 || received > 0)
        && let Some(count) = a.on_bytes
    {
        count(Carried::Stream, sent, received);
    }
    if up && a.local_eof && !a.resetting && !link.fin_queued() {
        link.control(ControlKind::Fin);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;

    /// A connection that ended before anything was attached (as the event loop makes one for
    /// an attach to an unknown token).
    fn gone() -> StreamConn {
        let mut c = StreamConn::new(
            Arc::new(ConnShared::connecting(None)),
            None,
            CmPhase::Established,
        );
        c.error = Some(String::from("closed"));
        c
    }

    fn attach(
        events: Arc<Mutex<Vec<String>>>,
        give_back: Option<Box<dyn FnOnce(OwnedFd) + Send>>,
    ) -> Attach {
        Attach {
            kept: None,
            handshake: Handshake::Open,
            on_bytes: None,
            claim_by: None,
            give_back,
            on_event: Box::new(move |e| {
                let text = match e {
                    Event::Decided(p) => format!("decided {p:?}"),
                    Event::Ended(end) => format!("ended {:?}", end.path),
                };
                events.lock().unwrap().push(text);
            }),
        }
    }

    #[test]
    fn a_socket_attached_to_a_gone_connection_comes_back_untouched() {
        let (mut app, local) = UnixStream::pair().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let returned = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&returned);
        let mut conn = gone();
        let mut fds = Fds::default();
        conn.attach(
            OwnedFd::from(local),
            attach(
                Arc::clone(&events),
                Some(Box::new(move |fd| *slot.lock().unwrap() = Some(fd))),
            ),
            &EngineConfig::default(),
            Instant::now(),
            &mut fds,
        );
        assert!(
            events.lock().unwrap().is_empty(),
            "no event after a give-back"
        );
        assert!(fds.closing.is_empty(), "nothing of it is closed");
        let back = returned
            .lock()
            .unwrap()
            .take()
            .expect("the socket came back");
        // Still connected and unread: what the app writes is there to read.
        app.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        UnixStream::from(back).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn without_a_give_back_the_stream_ends_broken_and_the_socket_is_closed() {
        let (mut app, local) = UnixStream::pair().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let mut conn = gone();
        let mut fds = Fds::default();
        conn.attach(
            OwnedFd::from(local),
            attach(Arc::clone(&events), None),
            &EngineConfig::default(),
            Instant::now(),
            &mut fds,
        );
        assert_eq!(*events.lock().unwrap(), ["decided Broken", "ended Broken"]);
        // A reset end is closed, not shut down: the loop closes what the attach gave up.
        drop(fds);
        let mut rest = Vec::new();
        assert_eq!(app.read_to_end(&mut rest).unwrap(), 0, "EOF for the app");
    }
}
