//! The engine thread: one `epoll` over the CM channel, each device's completion channel, the
//! command eventfd and every attached connection's fds; commands, CM events, completions and
//! timers are handled in turn, then every connection that saw something makes progress.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::link::{Buffers, Link, SetupError};
use super::park::{self, Parked, Side};
use super::pool::Pool;
use super::shared::{ConnShared, ConnectError, RejectedBy};
use super::stream::{App, CmPhase, Fds, Offer, StreamConn};
use super::{Acceptor, Attach, Command, Conn, Decision, EngineError, Handshake, Inner, Request};
use crate::rdma::{CmId, ConnSettings, Context, Device, EventChannel, EventKind, Lib};
use crate::wire::{Kind, Payload, PrivateData, RingInfo, TransportReject};

const KEY_WAKE: u64 = u64::MAX;
const KEY_CM: u64 = u64::MAX - 1;
/// Device `i` has key `KEY_DEVICE - i`.
const KEY_DEVICE: u64 = u64::MAX - 2;
const SUB_LOCAL: u64 = 1;
const SUB_KEPT: u64 = 2;
/// Transport retries: 6, so a vanished peer fails the connection after 7 tries of the ACK
/// timeout (rxe, unlike the IB spec, takes 7 as "retry forever" for this counter too).
const RETRIES: u8 = 6;
/// Receiver-not-ready retries: 7, forever (a peer that has not reposted a receive yet is
/// alive; credits bound how far ahead a sender runs).
const RNR_RETRIES: u8 = 7;

struct ListenerEntry {
    id: CmId,
    acceptor: Arc<dyn Acceptor>,
    handshake: Handshake,
    /// [`super::Engine::expect`]: the connection its accepted request becomes.
    adopt: Option<u64>,
}

struct Loop {
    lib: &'static Lib,
    inner: Arc<Inner>,
    epoll: Epoll,
    channel: EventChannel,
    /// Regions of finished connections (dropped before the devices their MRs are on).
    pool: Pool<Buffers>,
    devices: Vec<Device>,
    conns: HashMap<u64, StreamConn>,
    /// What an active connection asked for, while it resolves (the resolve timeout in ms).
    connecting: HashMap<u64, (super::ConnectRequest, i32)>,
    listeners: HashMap<u64, ListenerEntry>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    dirty: Vec<u64>,
    draining: bool,
    /// The connection a CQ's events are for, where it is not the one the CQ was made for (a
    /// parked or reused connection's: `park`).
    cq_owner: HashMap<u64, u64>,
    /// Connections whose REUSE is out: the parked connection asked, and the request to make
    /// instead when it is not answered.
    reusing: HashMap<u64, (u64, super::ConnectRequest)>,
    /// Connections that wait for a connection to their peer to be parked
    /// ([`super::ConnectRequest::reuse_wait`]), with their request.
    waiting: HashMap<u64, super::ConnectRequest>,
    /// The tokens of parked connections (`park`), and of some that no longer are (pruned at
    /// the next park): what a connect and a park look through instead of every connection.
    parked: BTreeSet<u64>,
}

fn setup_error(what: &'static str) -> impl FnOnce(io::Error) -> EngineError {
    move |source| EngineError::Setup { what, source }
}

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The engine thread's body.
pub(super) fn run(
    lib: &'static Lib,
    inner: Arc<Inner>,
    ready: std::sync::mpsc::SyncSender<Result<(), EngineError>>,
) {
    if let Some(start) = &inner.config.on_thread_start {
        start();
    }
    let setup = (|| {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(nix_io)
            .map_err(setup_error("epoll"))?;
        let channel = EventChannel::new(lib).map_err(setup_error("the rdma_cm event channel"))?;
        epoll
            .add(
                inner.wake.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, KEY_WAKE),
            )
            .map_err(nix_io)
            .map_err(setup_error("epoll_ctl"))?;
        epoll
            .add(channel.fd(), EpollEvent::new(EpollFlags::EPOLLIN, KEY_CM))
            .map_err(nix_io)
            .map_err(setup_error("epoll_ctl"))?;
        if let Some(observe) = &inner.config.fd_observer {
            observe(epoll.0.as_raw_fd());
            observe(channel.fd().as_raw_fd());
        }
        Ok((epoll, channel))
    })();
    let (epoll, channel) = match setup {
        Ok(v) => v,
        Err(e) => {
            inner.stopped.store(true, Ordering::Release);
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let pool = Pool::new(inner.config.kept_regions, inner.config.kept_region_idle);
    let mut l = Loop {
        lib,
        inner,
        epoll,
        channel,
        pool,
        devices: Vec::new(),
        conns: HashMap::new(),
        connecting: HashMap::new(),
        listeners: HashMap::new(),
        timers: BinaryHeap::new(),
        dirty: Vec::new(),
        draining: false,
        cq_owner: HashMap::new(),
        reusing: HashMap::new(),
        waiting: HashMap::new(),
        parked: BTreeSet::new(),
    };
    // A panic must not leave waiters hanging: every handle fails fast from now on (and a
    // flush sees `stopped` and returns: nothing more can be delivered).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.serve()));
    l.inner.stopped.store(true, Ordering::Release);
    for conn in l.conns.values() {
        conn.shared.fail(ConnectError::EngineGone);
    }
}

impl Loop {
    fn serve(&mut self) {
        let mut events = vec![EpollEvent::empty(); 256];
        let mut now = Instant::now();
        loop {
            let timeout = self.timeout(now);
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::Error::EINTR) => 0,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            let mut cm_ready = false;
            let mut devices_ready: Vec<usize> = Vec::new();
            for ev in events.iter().take(n) {
                let key = ev.data();
                let flags = ev.events();
                match key {
                    KEY_WAKE => {
                        let _ = self.inner.wake.read();
                    }
                    KEY_CM => cm_ready = true,
                    k if k <= KEY_DEVICE && k > KEY_DEVICE - 1024 => {
                        devices_ready.push((KEY_DEVICE - k) as usize);
                    }
                    k => self.fd_event(k, flags),
                }
            }
            self.commands();
            if cm_ready {
                self.cm_events();
            }
            for dev in devices_ready {
                self.cq_events(dev);
            }
            if !self.draining && self.inner.draining.load(Ordering::Acquire) {
                self.draining = true;
                // Every local side is read once more: a socketpair the engine emptied earlier
                // (or one the app's direct writes bypassed) raises no event, and "nothing to
                // read" is its EOF now.
                for conn in self.conns.values_mut() {
                    conn.local_event(true, false, true);
                }
                self.dirty.extend(self.conns.keys().copied());
            }
            // One clock read for the round's timers and transitions, and the next wait's (under
            // TCG the guest's clock is an emulated device: each read is a system call and a
            // device access).
            now = Instant::now();
            self.timers_due(now);
            self.expire_kept(now);
            self.settle_dirty(now);
            if self.draining {
                let n = self.conns.values().filter(|c| c.unflushed()).count();
                self.inner.unflushed.store(n, Ordering::Release);
            }
            self.inner
                .connections
                .store(self.conns.len(), Ordering::Release);
        }
    }

    /// How long the next wait may last: until the earliest deadline, counted from `now`, the
    /// last round's clock read (a deadline waits at most that round's work longer).
    fn timeout(&mut self, now: Instant) -> EpollTimeout {
        if !self.dirty.is_empty() {
            // Connections a transition touched are settled before anything else can happen
            // to them: without an event of their own, nothing else would wake the loop.
            return EpollTimeout::ZERO;
        }
        let mut next = self.pool.next_expiry();
        while let Some(Reverse((at, token))) = self.timers.peek().copied() {
            if self
                .conns
                .get(&token)
                .is_none_or(|c| c.timer_at != Some(at))
            {
                // Gone, or a stale entry (its connection's timer moved).
                self.timers.pop();
                continue;
            }
            next = Some(next.map_or(at, |n| n.min(at)));
            break;
        }
        let Some(at) = next else {
            return EpollTimeout::from(60_000u16);
        };
        let left = at.saturating_duration_since(now);
        let ms = u16::try_from(left.as_millis().saturating_add(1)).unwrap_or(u16::MAX);
        EpollTimeout::from(ms.min(60_000))
    }

    /// Gives back the regions no connection took in time.
    fn expire_kept(&mut self, now: Instant) {
        for (buffers, pinned) in self.pool.expire(now) {
            drop(buffers);
            self.inner.budget.release(pinned);
        }
    }

    fn fd_event(&mut self, key: u64, flags: EpollFlags) {
        let token = key >> 2;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let err = flags.intersects(EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP);
        // EPOLLPRI: urgent data, which a TCP socket reports without EPOLLIN when the urgent
        // byte is all it holds.
        let readable = err
            || flags
                .intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLPRI);
        let writable = err || flags.contains(EpollFlags::EPOLLOUT);
        // Urgent data is looked for only when a source says it has some (see `relay::pass`).
        let urgent = err || flags.contains(EpollFlags::EPOLLPRI);
        let mut fds = Fds::default();
        match key & 3 {
            SUB_LOCAL => conn.local_event(readable, writable, urgent),
            SUB_KEPT => {
                conn.kept_event(readable, writable, urgent, &mut fds);
                if fds.unwatch_kept
                    && let App::Stream(a) = &conn.app
                    && let Some(kept) = &a.kept
                {
                    let _ = self.epoll.delete(kept);
                }
            }
            _ => {}
        }
        self.apply(fds);
        self.dirty.push(token);
    }

    /// Closes what a transition gave up (out of epoll first).
    fn apply(&mut self, fds: Fds) {
        for fd in fds.closing {
            let _ = self.epoll.delete(&fd);
            drop(fd);
        }
    }

    fn commands(&mut self) {
        loop {
            let next = self.inner.commands.lock().pop_front();
            let Some(command) = next else { return };
            match command {
                Command::Connect {
                    token,
                    request,
                    shared,
                } => self.connect(token, request, shared),
                Command::Listen {
                    token,
                    addr,
                    only_v6,
                    backlog,
                    acceptor,
                    reply,
                    adopt,
                } => {
                    let adopting = adopt.as_ref().map(|(t, _)| *t);
                    let result = self.listen(token, addr, only_v6, backlog, acceptor, adopting);
                    if result.is_ok()
                        && let Some((conn, shared)) = adopt
                    {
                        self.conns
                            .insert(conn, StreamConn::new(shared, None, CmPhase::Expecting));
                    }
                    let _ = reply.send(result);
                }
                Command::CloseListener { token } => self.close_listener(token),
                Command::Attach {
                    token,
                    local,
                    attach,
                    shared,
                } => self.attach(token, local, attach, shared),
                Command::Consumed { token } => self.dirty.push(token),
                Command::Flush { token } => {
                    if let Some(link) = self.conns.get_mut(&token).and_then(|c| c.link.as_mut()) {
                        // A probe when the last writes asked for no completion: its completion
                        // reports every write before it.
                        let _ = link.acknowledged();
                    }
                }
                Command::Abort { token } => {
                    if let Some(conn) = self.conns.get_mut(&token) {
                        let mut fds = Fds::default();
                        if matches!(conn.app, App::Stream(_)) {
                            conn.fail(String::from("aborted"), &mut fds);
                        } else if conn.error.is_none() {
                            conn.error = Some(String::from("aborted"));
                        }
                        self.apply(fds);
                        self.dirty.push(token);
                    }
                }
                Command::Decide {
                    token,
                    accept,
                    payload,
                } => self.decide(token, accept, &payload),
            }
        }
    }

    /// An outgoing connection: on a parked connection to the same listener from the same
    /// address when there is one (`park`), else with a connect request.
    fn connect(&mut self, token: u64, request: super::ConnectRequest, shared: Arc<ConnShared>) {
        let mut conn = StreamConn::new(shared, None, CmPhase::Resolving);
        conn.unattached_timeout = request.unattached_timeout;
        self.conns.insert(token, conn);
        self.dirty.push(token);
        let request = match self.parked_for(&request) {
            Some(parked) => match self.reuse_or_give_back(token, parked, request) {
                Some(request) => request,
                None => return,
            },
            None => request,
        };
        if let Some(wait) = request.reuse_wait.filter(|_| self.inner.config.reuse_links)
            && request.handshake == Handshake::Confirm
            && let Some(conn) = self.conns.get_mut(&token)
        {
            conn.cm = CmPhase::Waiting(Instant::now() + wait);
            self.waiting.insert(token, request);
            return;
        }
        self.resolve(token, request);
    }

    /// Starts connection `token`'s connect request: its id, then address resolution.
    fn resolve(&mut self, token: u64, request: super::ConnectRequest) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let id = match self.channel.create_id(token, self.inner.config.port_space) {
            Ok(id) => id,
            Err(e) => {
                let error = e.to_string();
                let what = "rdma_create_id";
                return fail_connect(conn, ConnectError::Local { what, error });
            }
        };
        // Older kernels lack the option: their default timeout applies.
        let _ = id.set_ack_timeout(self.inner.config.ack_timeout);
        let ms = i32::try_from(request.resolve_timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1);
        if let Err(e) = id.resolve_addr(request.src, request.dst, ms) {
            id.destroy();
            let status = e.raw_os_error().unwrap_or(0);
            let what = "rdma_resolve_addr";
            return fail_connect(conn, ConnectError::Unreachable { what, status });
        }
        self.connecting.insert(token, (request, ms));
        conn.id = Some(id);
        conn.cm = CmPhase::Resolving;
    }

    /// A parked connection (`park`) that a connect of `request` may take.
    fn parked_for(&self, request: &super::ConnectRequest) -> Option<u64> {
        if !self.inner.config.reuse_links || request.handshake != Handshake::Confirm {
            return None;
        }
        let now = Instant::now();
        let src = request.src.map(|s| s.ip());
        self.parked.iter().copied().find(|t| {
            self.conns.get(t).is_some_and(|c| {
                c.error.is_none()
                    && !c.peer_gone
                    && c.parked.is_some_and(|p| p.takes(request.dst, src, now))
            })
        })
    }

    /// Sends REUSE with `request`'s payload on parked connection `parked` for connection
    /// `token`, which waits for REUSED (at most [`park::REUSE_WAIT`]); false when it cannot.
    fn ask_reuse(&mut self, token: u64, parked: u64, request: &super::ConnectRequest) -> bool {
        let Some(payload) = Payload::new(&request.payload) else {
            return false;
        };
        let Some(p) = self.conns.get_mut(&parked) else {
            return false;
        };
        let (Some(link), Some(state)) = (p.link.as_mut(), p.parked.as_mut()) else {
            return false;
        };
        link.request_reuse(payload);
        state.reuser = Some(token);
        self.dirty.push(parked);
        let deadline = Instant::now() + park::REUSE_WAIT;
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.cm = CmPhase::Reusing(deadline);
        }
        true
    }

    /// Connection `token`'s REUSE went unanswered (its parked connection ended, or the wait
    /// passed): the parked connection goes, and a connect request is made instead.
    fn reuse_instead(&mut self, token: u64, now: Instant) {
        let Some((parked, request)) = self.reusing.remove(&token) else {
            return;
        };
        self.inner.reuse.unanswered.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = self.conns.get_mut(&parked)
            && p.parked.is_some_and(|s| s.reuser == Some(token))
        {
            p.parked = None;
            p.error
                .get_or_insert_with(|| String::from("REUSE unanswered"));
            self.disconnect(parked, now);
            self.dirty.push(parked);
        }
        if self
            .conns
            .get(&token)
            .is_some_and(|c| matches!(c.cm, CmPhase::Reusing(_)) && c.error.is_none())
        {
            self.resolve(token, request);
        }
        self.dirty.push(token);
    }

    /// Keeps connection `token`'s queue pair for the next connection between the same two
    /// processes instead of disconnecting (`park`), when its stream finished in order and left
    /// the queue pair fit for it. True when the connection manager's teardown is to wait: the
    /// connection was parked (under a token of its own), or waits for its send queue's last
    /// completion first.
    fn park(&mut self, token: u64, now: Instant) -> bool {
        if !self.inner.config.reuse_links {
            return false;
        }
        let Some(conn) = self.conns.get(&token) else {
            return false;
        };
        if !conn.stream_done()
            || conn.peer_gone
            || conn.parked.is_some()
            || !matches!(conn.cm, CmPhase::Established | CmPhase::Accepted)
        {
            return false;
        }
        let (Some(id), Some(link)) = (conn.id, conn.link.as_ref()) else {
            return false;
        };
        let side = match (link.handshake(), conn.offer) {
            (Handshake::Confirm, _) => match (id.peer_addr(), id.local_addr()) {
                (Some(dst), Some(src)) => Side::Connecting { dst, src: src.ip() },
                _ => return false,
            },
            (
                Handshake::Claim,
                Some(Offer {
                    listener: Some(listener),
                    from,
                    ..
                }),
            ) => Side::Accepting { listener, from },
            _ => return false,
        };
        let conns = &self.conns;
        self.parked
            .retain(|t| conns.get(t).is_some_and(|c| c.parked.is_some()));
        let parked = self
            .parked
            .iter()
            .filter_map(|t| conns.get(t)?.parked.as_ref());
        if !park::room(parked, side.peer()) {
            return false;
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        let Some(link) = conn.link.as_mut() else {
            return false;
        };
        if !link.parkable() {
            return false;
        }
        if !link.quiesce() {
            // A probe's completion (its event settles the connection again) empties it.
            return true;
        }
        let (Some(id), Some(link)) = (conn.id.take(), conn.link.take()) else {
            return false;
        };
        let p = self.inner.token();
        id.set_token(p);
        self.cq_owner.insert(link.cq_key(), p);
        let mut kept = StreamConn::new(
            Arc::new(ConnShared::connecting(id.peer_addr())),
            Some(id),
            CmPhase::Established,
        );
        kept.app = App::Done;
        kept.link = Some(link);
        kept.parked = Some(Parked::new(side, now));
        self.conns.insert(p, kept);
        self.parked.insert(p);
        self.dirty.push(p);
        self.inner.reuse.parked.fetch_add(1, Ordering::Relaxed);
        self.take_over_resolving(p, now);
        true
    }

    /// A connect to parked connection `parked`'s peer that waits for one
    /// ([`super::ConnectRequest::reuse_wait`]) or is still resolving (its connect request not
    /// sent: the peer knows nothing of it) takes the parked connection instead.
    fn take_over_resolving(&mut self, parked: u64, now: Instant) {
        let Some(state) = self.conns.get(&parked).and_then(|c| c.parked) else {
            return;
        };
        let waiting = self.waiting.iter().find(|(t, r)| {
            state.takes(r.dst, r.src.map(|s| s.ip()), now)
                && self.conns.get(t).is_some_and(|c| c.error.is_none())
        });
        if let Some(token) = waiting.map(|(t, _)| *t)
            && let Some(request) = self.waiting.remove(&token)
        {
            self.reuse_or_resolve(token, parked, request);
            return;
        }
        let found = self.connecting.iter().find(|(t, (r, _))| {
            r.handshake == Handshake::Confirm
                && state.takes(r.dst, r.src.map(|s| s.ip()), now)
                && self
                    .conns
                    .get(t)
                    .is_some_and(|c| c.cm == CmPhase::Resolving && c.error.is_none())
        });
        let Some(token) = found.map(|(t, _)| *t) else {
            return;
        };
        let Some((request, _)) = self.connecting.remove(&token) else {
            return;
        };
        if let Some(id) = self.conns.get_mut(&token).and_then(|c| c.id.take()) {
            id.destroy();
        }
        self.reuse_or_resolve(token, parked, request);
    }

    /// Connection `token`'s `request` goes on parked connection `parked` ([`Loop::ask_reuse`]),
    /// else as a connect request.
    fn reuse_or_resolve(&mut self, token: u64, parked: u64, request: super::ConnectRequest) {
        if let Some(request) = self.reuse_or_give_back(token, parked, request) {
            self.resolve(token, request);
        }
    }

    /// Connection `token`'s `request` goes on parked connection `parked`, which it then waits
    /// for; the request back when it cannot ([`Loop::ask_reuse`]).
    fn reuse_or_give_back(
        &mut self,
        token: u64,
        parked: u64,
        request: super::ConnectRequest,
    ) -> Option<super::ConnectRequest> {
        if self.ask_reuse(token, parked, &request) {
            self.reusing.insert(token, (parked, request));
            None
        } else {
            Some(request)
        }
    }

    /// A parked connection after an event or its timer: disconnected when it failed, its peer
    /// left or nothing took it in time; the peer's REUSE judged (accepting side), or its REUSED
    /// taken (connecting side), once the send queue is empty.
    fn settle_parked(&mut self, token: u64, now: Instant) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(state) = conn.parked else { return };
        let expired = state.until <= now && state.reuser.is_none();
        let failed = conn.error.is_some() || conn.peer_gone;
        // A connection whose REUSE is out and that ended meanwhile (aborted) leaves the
        // peer's answer to nobody.
        let orphaned = state.reuser.is_some_and(|r| !self.conns.contains_key(&r));
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if failed || expired || orphaned {
            conn.parked = None;
            if let Some(reuser) = state.reuser {
                self.reuse_instead(reuser, now);
            }
            self.disconnect(token, now);
            self.dirty.push(token);
            return;
        }
        let ready = conn
            .link
            .as_mut()
            .is_some_and(|l| l.reuse_pending() && l.quiesce());
        if ready {
            match (state.side, state.reuser) {
                (Side::Accepting { listener, from }, _) => {
                    self.reuse_incoming(token, (listener, from), now);
                }
                (Side::Connecting { .. }, Some(reuser)) => self.reused(token, reuser, now),
                (Side::Connecting { .. }, None) => {}
            }
        }
    }

    /// The peer's REUSE on parked connection `parked` (the accepting side of `listener`, the
    /// peer at `from`): judged by the listener's acceptor as a connect request is, before
    /// anything else; taken, the queue pair carries a new incoming connection, which REUSED
    /// accepts. Refused (or past the bounds on unattached connections), it is disconnected.
    fn reuse_incoming(
        &mut self,
        parked: u64,
        (listener, from): (u64, Option<IpAddr>),
        now: Instant,
    ) {
        let Some(mut p) = self.conns.remove(&parked) else {
            return;
        };
        let (Some(id), Some(mut link)) = (p.id, p.link.take()) else {
            return;
        };
        let payload = link.take_reuse();
        let judge = self
            .listeners
            .get(&listener)
            .filter(|l| l.handshake == Handshake::Claim && l.adopt.is_none())
            .map(|l| Arc::clone(&l.acceptor));
        let (Some(acceptor), Some(payload)) = (judge, payload) else {
            p.link = Some(link);
            return self.refuse_reuse(parked, p, "REUSE for a listener that is gone", now);
        };
        if self.too_many_unattached(from) {
            p.link = Some(link);
            let why = "REUSE past the bound on unattached connections";
            return self.refuse_reuse(parked, p, why, now);
        }
        p.shared.closed();
        let token = self.inner.token();
        id.set_token(token);
        self.cq_owner.insert(link.cq_key(), token);
        link.renew(Handshake::Claim, now, false);
        let peer = id.peer_addr();
        let shared = Arc::new(ConnShared::connecting(peer));
        let deadline = now + self.inner.config.unattached_timeout;
        let mut conn = StreamConn::new(Arc::clone(&shared), Some(id), CmPhase::Deciding(deadline));
        conn.offer = Some(Offer {
            ring: RingInfo::default(),
            from,
            handshake: Handshake::Claim,
            listener: Some(listener),
        });
        conn.reused = true;
        conn.shared.set_sides(link.receiver(), link.sender());
        conn.link = Some(link);
        self.conns.insert(token, conn);
        match self.ask(acceptor.as_ref(), (token, shared), id, payload.bytes()) {
            Decision::Accept(payload) => self.accept(token, &payload),
            Decision::Reject(_) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.error = Some(String::from("rejected"));
                }
                self.disconnect(token, now);
            }
            // Decided later with `Conn::accept` or `Conn::reject`, by the deadline.
            Decision::Defer => {}
        }
        self.dirty.push(token);
    }

    /// Refuses the peer's REUSE on parked connection `parked` (`p`, taken out of the table):
    /// it goes back, no longer parked, and is disconnected for `why`.
    fn refuse_reuse(&mut self, parked: u64, mut p: StreamConn, why: &str, now: Instant) {
        p.parked = None;
        p.error = Some(String::from(why));
        self.conns.insert(parked, p);
        self.disconnect(parked, now);
        self.dirty.push(parked);
    }

    /// REUSED on parked connection `parked` for connection `token`: the queue pair carries
    /// `token` from now on, established with REUSED's payload as a connect's accept. With
    /// nobody waiting for it any more, the parked connection goes (and the peer's
    /// registration with it).
    fn reused(&mut self, parked: u64, token: u64, now: Instant) {
        self.reusing.remove(&token);
        let waiting = self
            .conns
            .get(&token)
            .is_some_and(|c| matches!(c.cm, CmPhase::Reusing(_)) && c.error.is_none());
        if !waiting {
            if let Some(p) = self.conns.get_mut(&parked) {
                p.parked = None;
                p.error = Some(String::from("REUSED for a connection that is gone"));
            }
            self.disconnect(parked, now);
            self.dirty.push(parked);
            return;
        }
        let Some(mut p) = self.conns.remove(&parked) else {
            return;
        };
        let (Some(id), Some(mut link)) = (p.id.take(), p.link.take()) else {
            return;
        };
        p.shared.closed();
        let payload = link
            .take_reuse()
            .map(|p| p.bytes().to_vec())
            .unwrap_or_default();
        link.renew(Handshake::Confirm, now, true);
        id.set_token(token);
        self.cq_owner.insert(link.cq_key(), token);
        let timeouts = (
            self.inner.config.unattached_timeout,
            self.inner.config.claim_timeout,
        );
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let unattached_timeout = conn.unattached_timeout.unwrap_or(timeouts.0);
        conn.shared.set_sides(link.receiver(), link.sender());
        conn.link = Some(link);
        conn.id = Some(id);
        connected(conn, id, payload, now, (unattached_timeout, timeouts.1));
        self.inner.reuse.reused.fetch_add(1, Ordering::Relaxed);
        self.dirty.push(token);
    }

    fn listen(
        &mut self,
        token: u64,
        addr: SocketAddr,
        only_v6: Option<bool>,
        backlog: i32,
        acceptor: Arc<dyn Acceptor>,
        adopt: Option<u64>,
    ) -> io::Result<()> {
        let id = self
            .channel
            .create_id(token, self.inner.config.port_space)?;
        let result = (|| {
            if addr.is_ipv6()
                && let Some(on) = only_v6
            {
                id.set_af_only(on)?;
            }
            id.bind(addr)?;
            id.listen(backlog)
        })();
        match result {
            Ok(()) => {
                let handshake = acceptor.handshake();
                self.listeners.insert(
                    token,
                    ListenerEntry {
                        id,
                        acceptor,
                        handshake,
                        adopt,
                    },
                );
                Ok(())
            }
            Err(e) => {
                id.destroy();
                Err(e)
            }
        }
    }

    fn attach(&mut self, token: u64, local: OwnedFd, attach: Attach, shared: Arc<ConnShared>) {
        let now = Instant::now();
        let mut fds = Fds::default();
        let conn = self.conns.entry(token).or_insert_with(|| {
            // Gone already: a local side with no stream (relayed or broken by the handshake).
            let mut c = StreamConn::new(shared, None, CmPhase::Established);
            c.error = Some(String::from("closed"));
            c
        });
        conn.attach(local, attach, &self.inner.config, now, &mut fds);
        let flags = EpollFlags::EPOLLIN
            | EpollFlags::EPOLLPRI
            | EpollFlags::EPOLLOUT
            | EpollFlags::EPOLLRDHUP
            | EpollFlags::EPOLLET;
        let (local, far) = match &conn.app {
            App::Stream(a) => (Some(&a.local), a.kept.as_ref()),
            App::Relay(r, _) => (Some(&r.local), Some(&r.far)),
            _ => (None, None),
        };
        if let Some(fd) = local {
            let _ = self
                .epoll
                .add(fd, EpollEvent::new(flags, (token << 2) | SUB_LOCAL));
        }
        if let Some(fd) = far {
            let _ = self
                .epoll
                .add(fd, EpollEvent::new(flags, (token << 2) | SUB_KEPT));
        }
        self.apply(fds);
        self.dirty.push(token);
    }

    fn decide(&mut self, token: u64, accept: bool, payload: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if !matches!(conn.cm, CmPhase::Deciding(_)) {
            return;
        }
        if accept {
            self.accept(token, payload);
        } else if conn.reused {
            // A refused REUSE is a disconnect: the peer makes a connect request instead, which
            // gets the refusal.
            conn.error = Some(String::from("rejected"));
            self.disconnect(token, Instant::now());
        } else {
            let data = PrivateData::encode(Kind::Reject, RingInfo::default(), payload);
            if let Some(id) = conn.id {
                let _ = id.reject(&data);
            }
            conn.error = Some(String::from("rejected"));
            self.destroy(token);
        }
        self.dirty.push(token);
    }

    /// Accepts an incoming connection: its region, queues and registrations are made now, after
    /// the acceptor said yes (an unauthenticated request gets nothing before).
    fn accept(&mut self, token: u64, payload: &[u8]) {
        let now = Instant::now();
        let timeout = self.inner.config.unattached_timeout;
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let (Some(id), Some(offer)) = (conn.id, conn.offer) else {
            return;
        };
        if conn.link.is_none() {
            match self.setup(id, token, offer.handshake) {
                Ok(mut link) => {
                    link.set_peer(offer.ring);
                    if let Some(conn) = self.conns.get_mut(&token) {
                        conn.shared.set_sides(link.receiver(), link.sender());
                        conn.link = Some(link);
                    }
                }
                Err(e) => {
                    if let SetupError::Local(..) = e {
                        id.destroy_qp();
                    }
                    let why = match e {
                        SetupError::Memlock => TransportReject::Memlock,
                        SetupError::Local(..) => TransportReject::Resources,
                    };
                    let _ = id.reject(&why.encode());
                    if let Some(conn) = self.conns.get_mut(&token) {
                        conn.error = Some(format!("not accepted: {e:?}"));
                        conn.shared.closed();
                    }
                    self.destroy(token);
                    return;
                }
            }
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(link) = conn.link.as_mut() else {
            return;
        };
        if conn.reused {
            // The queue pair is connected: REUSED is the accept.
            let Some(payload) = Payload::new(payload) else {
                conn.error = Some(String::from("an accept payload too long for REUSED"));
                self.disconnect(token, now);
                return;
            };
            link.answer_reuse(payload);
            self.inner.reuse.reused.fetch_add(1, Ordering::Relaxed);
            conn.cm = CmPhase::Established;
            conn.shared.established(Vec::new());
            conn.binding_starts(now, self.inner.config.claim_timeout);
            if matches!(conn.app, App::Unattached) {
                conn.unattached_deadline = Some(now + timeout);
            }
            return;
        }
        let data = PrivateData::encode(Kind::Accept, link.ring_info(), payload);
        let settings = ConnSettings {
            private_data: &data,
            retry_count: RETRIES,
            rnr_retry_count: RNR_RETRIES,
        };
        match id.accept(&settings) {
            Ok(()) => {
                link.set_ready(now);
                conn.cm = CmPhase::Accepted;
                conn.shared.established(Vec::new());
                conn.binding_starts(now, self.inner.config.claim_timeout);
                if matches!(conn.app, App::Unattached) {
                    conn.unattached_deadline = Some(now + timeout);
                }
            }
            Err(e) => {
                conn.error = Some(format!("rdma_accept: {e}"));
                self.destroy(token);
            }
        }
    }

    fn device_for(&mut self, ctx: Option<Context>) -> io::Result<usize> {
        let Some(ctx) = ctx else {
            return Err(io::Error::other("the id has no device"));
        };
        if let Some(i) = self.devices.iter().position(|d| d.context() == ctx) {
            return Ok(i);
        }
        let dev = Device::open(self.lib, ctx)?;
        let i = self.devices.len();
        self.epoll
            .add(
                dev.channel_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, KEY_DEVICE - i as u64),
            )
            .map_err(nix_io)?;
        if let Some(observe) = &self.inner.config.fd_observer {
            observe(dev.channel_fd().as_raw_fd());
            for fd in ctx.fds() {
                if fd >= 0 {
                    observe(fd);
                }
            }
        }
        self.devices.push(dev);
        Ok(i)
    }

    fn setup(&mut self, id: CmId, token: u64, handshake: Handshake) -> Result<Link, SetupError> {
        let dev = self
            .device_for(id.verbs())
            .map_err(|e| SetupError::Local("opening the device", e))?;
        let device = &self.devices[dev];
        let kept = self.pool.take(dev);
        Link::new(
            &self.inner.config,
            &self.inner.budget,
            (device, dev),
            kept,
            id,
            token,
            Instant::now(),
            handshake,
        )
    }

    fn cm_events(&mut self) {
        loop {
            let ev = match self.channel.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) | Err(_) => return,
            };
            let kind = ev.kind();
            let status = ev.status();
            let id = ev.id();
            let listen_id = ev.listen_id();
            let data = ev.private_data();
            // Acked before anything else happens to the id: rdma_destroy_id waits for that.
            drop(ev);
            if kind == EventKind::ConnectRequest {
                self.incoming(listen_id.map(|l| l.token()), id, &data);
                continue;
            }
            let token = id.token();
            if self.listeners.contains_key(&token) {
                if kind == EventKind::DeviceRemoval
                    && let Some(l) = self.listeners.remove(&token)
                {
                    l.id.destroy();
                }
                continue;
            }
            self.conn_event(token, kind, status, &data);
        }
    }

    /// A connect request: refused at once when it is not ours, or when too many unattached
    /// connections wait (from its peer or in all); otherwise the listener's acceptor decides,
    /// before anything is allocated for it.
    fn incoming(&mut self, listener: Option<u64>, id: CmId, data: &[u8]) {
        let refuse = |id: CmId, why: TransportReject| {
            let _ = id.reject(&why.encode());
            id.destroy();
        };
        let Some((acceptor, handshake, adopt)) = listener
            .and_then(|t| self.listeners.get(&t))
            .map(|l| (Arc::clone(&l.acceptor), l.handshake, l.adopt))
        else {
            refuse(id, TransportReject::NoListener);
            return;
        };
        let request = match PrivateData::decode(data, Kind::Connect) {
            Ok(r) => r,
            Err(_) => {
                refuse(id, TransportReject::BadRequest);
                return;
            }
        };
        if id.verbs().is_some_and(Context::is_iwarp) {
            refuse(id, TransportReject::Resources);
            return;
        }
        let peer = id.peer_addr();
        if let (Some(listener), Some(token)) = (listener, adopt) {
            self.adopt((listener, acceptor.as_ref()), token, id, request, handshake);
            return;
        }
        if self.too_many_unattached(peer.map(|p| p.ip())) {
            refuse(id, TransportReject::Busy);
            return;
        }
        let token = self.inner.token();
        id.set_token(token);
        let shared = Arc::new(ConnShared::connecting(peer));
        let deadline = Instant::now() + self.inner.config.unattached_timeout;
        let mut conn = StreamConn::new(Arc::clone(&shared), Some(id), CmPhase::Deciding(deadline));
        conn.offer = Some(Offer {
            ring: request.ring,
            from: peer.map(|p| p.ip()),
            handshake,
            listener,
        });
        self.conns.insert(token, conn);
        match self.ask(acceptor.as_ref(), (token, shared), id, &request.payload) {
            Decision::Accept(payload) => self.accept(token, &payload),
            Decision::Reject(payload) => {
                let data = PrivateData::encode(Kind::Reject, RingInfo::default(), &payload);
                let _ = id.reject(&data);
                if let Some(c) = self.conns.get_mut(&token) {
                    c.error = Some(String::from("rejected"));
                }
                self.destroy(token);
            }
            // Decided later with `Conn::accept` or `Conn::reject`, by the deadline.
            Decision::Defer => {}
        }
        self.dirty.push(token);
    }

    /// A request to an [`super::Engine::expect`] listener: judged by its acceptor before
    /// anything is allocated; accepted, it becomes the expecting connection `token` (the
    /// listener closes: one peer per connection); rejected, the listener stays for the peer
    /// expected.
    fn adopt(
        &mut self,
        (listener, acceptor): (u64, &dyn Acceptor),
        token: u64,
        id: CmId,
        request: crate::wire::PrivateData,
        handshake: Handshake,
    ) {
        let Some(conn) = self.conns.get(&token).filter(|c| c.expecting()) else {
            // The connection ended, or was relayed for good: nothing expects a peer now.
            let _ = id.reject(&TransportReject::NoListener.encode());
            id.destroy();
            self.close_listener(listener);
            return;
        };
        let peer = id.peer_addr();
        let shared = Arc::clone(&conn.shared);
        let decision = self.ask(acceptor, (token, shared), id, &request.payload);
        let Decision::Accept(payload) = decision else {
            let payload = match decision {
                Decision::Reject(p) => p,
                _ => Vec::new(),
            };
            let data = PrivateData::encode(Kind::Reject, RingInfo::default(), &payload);
            let _ = id.reject(&data);
            id.destroy();
            return;
        };
        self.close_listener(listener);
        id.set_token(token);
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.id = Some(id);
            conn.cm = CmPhase::Deciding(Instant::now() + self.inner.config.unattached_timeout);
            conn.offer = Some(Offer {
                ring: request.ring,
                from: peer.map(|p| p.ip()),
                handshake,
                listener: None,
            });
            conn.shared.set_peer(peer);
        }
        self.accept(token, &payload);
        self.dirty.push(token);
    }

    /// What `acceptor` says of connection `token` (its handle's state `shared`), which the peer
    /// of `id` asked for with `payload` (a connect request's, or a REUSE's).
    fn ask(
        &self,
        acceptor: &dyn Acceptor,
        (token, shared): (u64, Arc<ConnShared>),
        id: CmId,
        payload: &[u8],
    ) -> Decision {
        acceptor.on_request(Request {
            local: id.local_addr(),
            peer: id.peer_addr(),
            payload,
            conn: Conn {
                inner: Arc::clone(&self.inner),
                token,
                shared,
            },
        })
    }

    /// Closes the listener `token` (its id destroyed; connections it brought stay).
    fn close_listener(&mut self, token: u64) {
        if let Some(l) = self.listeners.remove(&token) {
            l.id.destroy();
        }
    }

    /// The [`super::Engine::expect`] listener of connection `token`, if it has one.
    fn expect_listener(&self, token: u64) -> Option<u64> {
        self.listeners
            .iter()
            .find(|(_, l)| l.adopt == Some(token))
            .map(|(t, _)| *t)
    }

    /// True when another unattached incoming connection from `from` would pass
    /// [`super::EngineConfig::max_unattached_per_peer`] or, in all,
    /// [`super::EngineConfig::max_unattached`].
    fn too_many_unattached(&self, from: Option<IpAddr>) -> bool {
        let config = &self.inner.config;
        let (mut all, mut theirs) = (0usize, 0usize);
        for c in self.conns.values().filter(|c| c.unattached_incoming()) {
            all += 1;
            if c.offer.is_some_and(|o| o.from == from) {
                theirs += 1;
            }
        }
        all >= config.max_unattached || theirs >= config.max_unattached_per_peer
    }

    /// A CM event for an active or established connection (incoming requests are
    /// [`Self::incoming`]'s): each kind advances its connection one step.
    fn conn_event(&mut self, token: u64, kind: EventKind, status: i32, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(id) = conn.id else { return };
        match kind {
            EventKind::AddrResolved if conn.cm == CmPhase::Resolving => {
                self.addr_resolved(token, id);
            }
            EventKind::RouteResolved if conn.cm == CmPhase::Resolving => {
                self.route_resolved(token, id);
            }
            EventKind::AddrError
            | EventKind::RouteError
            | EventKind::Unreachable
            | EventKind::ConnectError => {
                let what = match kind {
                    EventKind::AddrError => "address resolution",
                    EventKind::RouteError => "route resolution",
                    EventKind::Unreachable => "connect (unreachable)",
                    _ => "connect",
                };
                if conn.error.is_none() {
                    fail_connect(conn, ConnectError::Unreachable { what, status });
                }
            }
            EventKind::Rejected => {
                let by = match PrivateData::decode(data, Kind::Reject) {
                    Ok(r) if r.ring.rkey != 0 => RejectedBy::Transport(r.ring.rkey),
                    Ok(r) => RejectedBy::App(r.payload),
                    Err(_) => RejectedBy::Foreign { status },
                };
                fail_connect(conn, ConnectError::Rejected(by));
            }
            EventKind::Established => {
                let unattached_timeout = conn
                    .unattached_timeout
                    .unwrap_or(self.inner.config.unattached_timeout);
                let timeouts = (unattached_timeout, self.inner.config.claim_timeout);
                established(conn, id, data, Instant::now(), timeouts);
            }
            EventKind::Disconnected => {
                conn.peer_gone = true;
                if matches!(conn.cm, CmPhase::Disconnecting(_)) {
                    self.destroy(token);
                } else if conn.cm != CmPhase::Established && conn.error.is_none() {
                    conn.error = Some(String::from("disconnected before it was established"));
                    conn.shared.fail(ConnectError::Closed);
                }
            }
            EventKind::DeviceRemoval => {
                let mut fds = Fds::default();
                conn.fail(String::from("the RDMA device was removed"), &mut fds);
                self.apply(fds);
            }
            _ => {}
        }
        self.dirty.push(token);
    }

    /// The active side's address resolved: the route next (iWARP is refused: its port space
    /// is the kernel's TCP ports).
    fn addr_resolved(&mut self, token: u64, id: CmId) {
        let ms = self.connecting.get(&token).map_or(1000, |c| c.1);
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if id.verbs().is_some_and(Context::is_iwarp) {
            fail_connect(conn, ConnectError::Iwarp);
        } else if let Err(e) = id.resolve_route(ms) {
            fail_connect(
                conn,
                ConnectError::Unreachable {
                    what: "rdma_resolve_route",
                    status: e.raw_os_error().unwrap_or(0),
                },
            );
        }
    }

    /// The active side's route resolved: its resources are set up and the connect request
    /// sent, with our ring in its private data.
    fn route_resolved(&mut self, token: u64, id: CmId) {
        let (payload, handshake) = self
            .connecting
            .remove(&token)
            .map_or((Vec::new(), Handshake::Open), |(r, _)| {
                (r.payload, r.handshake)
            });
        // `setup` borrows the whole engine, so the connection is looked up after it (`setup`
        // removes none; were it gone, there would be nothing to connect).
        let setup = self.setup(id, token, handshake);
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let link = match setup {
            Ok(link) => link,
            Err(SetupError::Memlock) => return fail_connect(conn, ConnectError::Memlock),
            Err(SetupError::Local(what, error)) => {
                let error = error.to_string();
                return fail_connect(conn, ConnectError::Local { what, error });
            }
        };
        let data = PrivateData::encode(Kind::Connect, link.ring_info(), &payload);
        let settings = ConnSettings {
            private_data: &data,
            retry_count: RETRIES,
            rnr_retry_count: RNR_RETRIES,
        };
        conn.shared.set_sides(link.receiver(), link.sender());
        conn.link = Some(link);
        match id.connect(&settings) {
            Ok(()) => conn.cm = CmPhase::Connecting,
            Err(e) => {
                let error = e.to_string();
                let what = "rdma_connect";
                fail_connect(conn, ConnectError::Local { what, error });
            }
        }
    }

    fn cq_events(&mut self, dev: usize) {
        let Some(device) = self.devices.get(dev) else {
            return;
        };
        loop {
            match device.next_cq_event() {
                Ok(Some(key)) => {
                    let token = self.cq_owner.get(&key).copied().unwrap_or(key);
                    if let Some(link) = self.conns.get_mut(&token).and_then(|c| c.link.as_mut()) {
                        link.note_cq_event();
                    }
                    self.dirty.push(token);
                }
                Ok(None) | Err(_) => return,
            }
        }
    }

    fn timers_due(&mut self, now: Instant) {
        while let Some(Reverse((at, token))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            if conn.timer_at != Some(at) {
                continue;
            }
            conn.timer_at = None;
            match conn.cm {
                CmPhase::Deciding(t) if t <= now => {
                    if let Some(id) = conn.id {
                        let _ = id.reject(&TransportReject::Timeout.encode());
                    }
                    conn.error = Some(String::from("no decision in time"));
                    self.destroy(token);
                    self.dirty.push(token);
                    continue;
                }
                CmPhase::Disconnecting(t) if t <= now => {
                    self.destroy(token);
                    self.dirty.push(token);
                    continue;
                }
                CmPhase::Reusing(t) if t <= now => {
                    self.reuse_instead(token, now);
                    continue;
                }
                CmPhase::Waiting(t) if t <= now => {
                    if let Some(request) = self.waiting.remove(&token) {
                        self.resolve(token, request);
                    }
                    self.dirty.push(token);
                    continue;
                }
                _ => {}
            }
            let mut fds = Fds::default();
            conn.timers(now, &mut fds);
            self.apply(fds);
            self.dirty.push(token);
        }
    }

    /// Settles every connection that saw something, and those their transitions touched (a
    /// connection parked under a token of its own, a parked one a connect asked): a few passes
    /// in this round, the rest at once in the next (see [`Self::timeout`]).
    fn settle_dirty(&mut self, now: Instant) {
        for _ in 0..4 {
            if self.dirty.is_empty() {
                return;
            }
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            dirty.dedup();
            for token in dirty.iter().copied() {
                self.settle(token, now);
            }
            dirty.clear();
            if self.dirty.is_empty() {
                self.dirty = dirty;
            }
        }
    }

    /// Progress, then the CM teardown a connection's state calls for, then its timer.
    fn settle(&mut self, token: u64, now: Instant) {
        let config = &self.inner.config;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let mut fds = Fds::default();
        if conn.parked.is_some() {
            conn.progress(now, config, self.draining, &mut fds);
            conn.settle(&mut fds);
            self.apply(fds);
            self.settle_parked(token, now);
            self.schedule(token);
            return;
        }
        let moved = conn.moved();
        conn.progress(now, config, self.draining, &mut fds);
        let moved = conn.moved().saturating_sub(moved);
        if moved > 0 {
            self.inner.progress.fetch_add(moved, Ordering::Release);
        }
        let mut stream_over = conn.settle(&mut fds);
        if conn.relay_unstepped() {
            // A relay that started in `settle` (the client stayed on TCP): stepped now, as the
            // app may have written before it started (a server's banner) and no event will
            // come for that.
            conn.progress(now, config, self.draining, &mut fds);
            stream_over = conn.settle(&mut fds);
        }
        let teardown =
            stream_over && conn.id.is_some() && !matches!(conn.cm, CmPhase::Disconnecting(_));
        self.apply(fds);
        if teardown && !self.park(token, now) {
            self.disconnect(token, now);
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.cm == CmPhase::Expecting
            && !conn.expecting()
            && let Some(listener) = self.expect_listener(token)
        {
            self.close_listener(listener);
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.finished() {
            conn.shared.closed();
            self.conns.remove(&token);
            self.connecting.remove(&token);
            self.reusing.remove(&token);
            self.waiting.remove(&token);
            return;
        }
        self.schedule(token);
    }

    /// Connection `token`'s timer. One live entry per connection: a new one only when the
    /// deadline came earlier than the live one, or that one fired. A deadline that moved later
    /// (the peer was heard) waits for the live entry, which then finds nothing due and
    /// schedules the next: one wake-up per keepalive period, not one entry and one wake-up
    /// per event.
    fn schedule(&mut self, token: u64) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(at) = conn.next_deadline(&self.inner.config)
            && conn.timer_at.is_none_or(|live| at < live)
        {
            conn.timer_at = Some(at);
            self.timers.push(Reverse((at, token)));
        }
    }

    /// Starts the CM teardown: a connected id disconnects (destroyed at DISCONNECTED or after
    /// the timeout), any other is destroyed now.
    fn disconnect(&mut self, token: u64, now: Instant) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(id) = conn.id else { return };
        if !conn.shared.is_alive() || conn.error.is_some() {
            conn.shared.closed();
        }
        match conn.cm {
            CmPhase::Accepted | CmPhase::Established if !conn.peer_gone => {
                if id.disconnect().is_ok() {
                    conn.cm = CmPhase::Disconnecting(now + self.inner.config.disconnect_timeout);
                } else {
                    self.destroy(token);
                }
            }
            CmPhase::Connecting => {
                // A connect in flight: destroying the id cancels it.
                self.destroy(token);
            }
            _ => {
                let _ = id.disconnect();
                self.destroy(token);
            }
        }
    }

    /// Releases the verbs resources and destroys the id.
    fn destroy(&mut self, token: u64) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(link) = &conn.link {
            self.cq_owner.remove(&link.cq_key());
        }
        if let Some(id) = conn.id.take() {
            if let Some(link) = &mut conn.link {
                // No writer posts on the QP from now on.
                link.set_writing(false);
                id.destroy_qp();
            }
            if let Some(link) = conn.link.take() {
                // The QP is gone: the region may serve the next connection.
                let device = link.device();
                let (leftover, pinned) = link.into_leftover();
                // Renewed (zeroed, its ring registered anew) only when the pool takes it.
                let kept = leftover
                    .filter(|_| self.pool.has_room())
                    .and_then(|l| l.renewed());
                match kept {
                    Some(buffers) => {
                        if let Some((buffers, pinned)) =
                            self.pool.put(device, buffers, pinned, Instant::now())
                        {
                            self.inner.budget.release(pinned);
                            drop(buffers);
                        }
                    }
                    None => self.inner.budget.release(pinned),
                }
            }
            id.destroy();
        } else if let Some(link) = conn.link.take() {
            self.inner.budget.release(link.pinned());
        }
        if matches!(conn.app, App::Unattached) {
            conn.shared.closed();
        }
    }
}

/// The active side's connection is established (its accept, or REUSED on a parked
/// connection, carried `payload`): it waits for its attach until `unattached_timeout`.
fn connected(
    conn: &mut StreamConn,
    id: CmId,
    payload: Vec<u8>,
    now: Instant,
    (unattached_timeout, claim_timeout): (Duration, Duration),
) {
    if let Some(link) = conn.link.as_mut() {
        link.set_ready(now);
    }
    conn.cm = CmPhase::Established;
    conn.shared.set_peer(id.peer_addr());
    conn.shared.established(payload);
    if matches!(conn.app, App::Unattached) {
        conn.unattached_deadline = Some(now + unattached_timeout);
    }
    conn.binding_starts(now, claim_timeout);
}

/// The connection was not established: its handles are told why.
fn fail_connect(conn: &mut StreamConn, e: ConnectError) {
    conn.error = Some(e.to_string());
    conn.shared.fail(e);
}

/// ESTABLISHED: the active side takes the peer's ring from its accept (private data that is
/// not ours fails the connect) and waits for its attach until `unattached_timeout`; the
/// passive side, which sent its accept, just hears the peer.
/// `timeouts`: the engine's unattached and claim timeouts.
fn established(
    conn: &mut StreamConn,
    id: CmId,
    data: &[u8],
    now: Instant,
    (unattached_timeout, claim_timeout): (Duration, Duration),
) {
    match conn.cm {
        CmPhase::Connecting => match PrivateData::decode(data, Kind::Accept) {
            Ok(accept) => {
                if let Some(link) = conn.link.as_mut() {
                    link.set_peer(accept.ring);
                }
                connected(
                    conn,
                    id,
                    accept.payload,
                    now,
                    (unattached_timeout, claim_timeout),
                );
            }
            Err(bad) => fail_connect(conn, ConnectError::NotOurPeer(bad)),
        },
        CmPhase::Accepted => {
            conn.cm = CmPhase::Established;
            if let Some(link) = conn.link.as_mut() {
                link.heard(now);
            }
        }
        _ => {}
    }
}
