//! The server side: an RDMA listener beside each capable TCP listener, the registrations its
//! acceptor makes, and `accept()`'s claim.
//!
//! The acceptor runs on the engine thread when a client's connect request arrives, before the
//! engine allocates anything for it: HELLO parses, its client address is the request's own
//! source address, the policy allows the client, no live registration holds that address, then
//! `pending[C:c]` is registered and only then is the request accepted. The client makes its
//! kernel connect after its RDMA connection is established, so by the time `accept()` returns
//! the TCP connection its registration exists: the claim is a lookup, never a wait. Only the
//! process whose `accept()` returned the connection claims it (a pre-fork child has no
//! registrations: the client gets no CLAIM within its bound and both stay on TCP).
//!
//! A registration is only a claim on an address: the stream carries the app's bytes only once
//! the TCP client proved it holds the secret of this side's CLAIM ([`Handshake::Claim`]), so an
//! RDMA peer that names another host's connection at most costs that connection its upgrade.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::engine::{
    Acceptor, Attach, Conn, Decision, Handshake, Listener, Request,
};

use super::engine::engine;
use super::events::{count_bytes, on_event, record};
use super::swap::{reset, swap};
use super::{PENDING_TIMEOUT, key, now};
use crate::decision;
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::negotiation::{self, Hello, Message};
use crate::policy::canonical_ip;
use crate::reason::{Path, Reason, Role};
use crate::sys;

/// Backlog of an RDMA listener.
const BACKLOG: i32 = 128;

/// A registered connection waiting for `accept()`.
pub struct Pending<T> {
    /// The connection (the engine's handle).
    pub conn: T,
    /// The HELLO's nonce.
    pub nonce: u64,
    /// When it was registered.
    pub at: Instant,
}

/// What a claim found for a peer.
pub enum Found<T> {
    /// A registration within the bound.
    Fresh(Pending<T>),
    /// One older than the bound: its client gave up.
    Stale,
}

/// Registrations by client TCP address (v4-mapped addresses as IPv4), expiring after a bound.
pub struct PendingTable<T> {
    entries: BTreeMap<SocketAddr, Pending<T>>,
    ttl: Duration,
}

impl<T> PendingTable<T> {
    /// An empty table whose entries live `ttl`.
    pub const fn new(ttl: Duration) -> PendingTable<T> {
        PendingTable {
            entries: BTreeMap::new(),
            ttl,
        }
    }

    /// Registers `conn` for `client`, dropping expired entries and those `alive` says are gone.
    /// False, and nothing registered, when a live registration holds the address: a second
    /// HELLO for it never displaces the first (one whose client gave up is gone by then).
    pub fn register(
        &mut self,
        client: SocketAddr,
        conn: T,
        nonce: u64,
        now: Instant,
        alive: impl Fn(&T) -> bool,
    ) -> bool {
        let ttl = self.ttl;
        self.entries
            .retain(|_, p| now.saturating_duration_since(p.at) < ttl && alive(&p.conn));
        match self.entries.entry(key(client)) {
            std::collections::btree_map::Entry::Occupied(_) => false,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Pending {
                    conn,
                    nonce,
                    at: now,
                });
                true
            }
        }
    }

    /// Takes the registration of `peer`: fresh, or stale (registered longer than the bound ago:
    /// its client gave up and is on TCP; the entry is dropped).
    pub fn claim(&mut self, peer: SocketAddr, now: Instant) -> Option<Found<T>> {
        let p = self.entries.remove(&key(peer))?;
        Some(if now.saturating_duration_since(p.at) < self.ttl {
            Found::Fresh(p)
        } else {
            Found::Stale
        })
    }

    /// Registrations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none are held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every entry without dropping it (a fork child: they are the parent's).
    fn forget_all(&mut self) {
        std::mem::forget(std::mem::take(&mut self.entries));
    }
}

/// The registrations of this process.
static PENDING: ForkSafe<PendingTable<Conn>> =
    ForkSafe::new([const { Mutex::new(PendingTable::new(PENDING_TIMEOUT)) }; SLOTS]);
/// App listening fd -> its RDMA listener (dup'd listening fds share one).
static LISTENERS: ForkSafe<BTreeMap<c_int, Arc<Side>>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);
/// App `SO_REUSEPORT` listening fd whose RDMA listener another process held when it listened
/// -> its address, and the RDMA listener this process took over once that holder closed it
/// ([`super::group`]; the fds of one address share it).
static GROUPED: ForkSafe<BTreeMap<c_int, Grouped>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

/// A [`GROUPED`] listening fd.
#[derive(Clone)]
struct Grouped {
    addr: SocketAddr,
    taken: Option<Arc<Side>>,
}

/// An RDMA listener of this process, and the door its `SO_REUSEPORT` group asks through.
struct Side {
    rdma: Listener,
    _door: Option<super::group::Door>,
}

/// What the acceptor decides for a HELLO (pure): it parses, its client address is `from` (the
/// connect request's own source address; the client binds its RDMA connect to its TCP source
/// address, so the two are one unless someone names another host's connection), and the
/// policy allows the client.
pub fn judge(
    payload: &[u8],
    local_port: u16,
    from: Option<IpAddr>,
    allows: impl Fn(u16, SocketAddr) -> bool,
) -> Result<Hello, Message> {
    match Message::decode(payload) {
        // A connect made back to a client: never one for a listener of the app's port.
        Ok(Message::Hello(h)) if h.flags & negotiation::HELLO_BACK != 0 => {
            Err(Message::refuse(h.nonce, Reason::PeerRefused))
        }
        Ok(Message::Hello(h)) if from.map(canonical_ip) != Some(canonical_ip(h.client.ip())) => {
            Err(Message::refuse(h.nonce, Reason::PeerRefused))
        }
        Ok(Message::Hello(h)) if allows(local_port, h.client) => Ok(h),
        Ok(Message::Hello(h)) => Err(Message::refuse(h.nonce, Reason::Policy)),
        _ => Err(Message::refuse(0, Reason::PeerRefused)),
    }
}

/// The engine's acceptor for this process's listeners (runs on the engine thread, before the
/// engine allocates anything for the request); its connections bind with CLAIM.
struct ShimAcceptor;

impl Acceptor for ShimAcceptor {
    fn on_request(&self, request: Request<'_>) -> Decision {
        let port = request.local.map_or(0, |a| a.port());
        let verdict = judge(
            request.payload,
            port,
            request.peer.map(|p| p.ip()),
            |port, client| decision::policy().is_some_and(|p| p.server_allows(port, client.ip())),
        );
        let hello = match verdict {
            Ok(hello) => hello,
            Err(refuse) => {
                log_at!(
                    Level::Debug,
                    "refused a connect request from {:?} for port {port}: {refuse:?}",
                    request.peer
                );
                return Decision::Reject(refuse.encode());
            }
        };
        let registered = PENDING.lock().register(
            hello.client,
            request.conn,
            hello.nonce,
            now(),
            Conn::is_alive,
        );
        if !registered {
            log_at!(
                Level::Debug,
                "refused a second connect request for {} (port {port}): one is registered",
                hello.client
            );
            return Decision::Reject(Message::refuse(hello.nonce, Reason::PeerRefused).encode());
        }
        log_at!(Level::Debug, "registered {} for port {port}", hello.client);
        Decision::Accept(Message::Accept { nonce: hello.nonce }.encode())
    }

    fn handshake(&self) -> Handshake {
        Handshake::Claim
    }
}

/// Opens the RDMA listener for the app's listening `fd` (same address and port). False when
/// none could be opened (another RDMA program holds the port, say): the socket serves plain
/// TCP only and clients fall back (`PEER_NOT_SHIMMED`).
pub fn open_side_listener(fd: c_int) -> bool {
    let Some(local) = sys::local_addr(fd) else {
        return false;
    };
    let Some(engine) = engine() else {
        return false;
    };
    // A `[::]` listener keeps the app's IPV6_V6ONLY: an app that also listens on 0.0.0.0
    // (QEMU's `-incoming tcp::PORT`) has an IPv6-only one, whose RDMA listener must not
    // collide with the IPv4 one.
    let only_v6 = local.is_ipv6().then(|| sys::only_v6(fd)).flatten();
    // Several listening sockets of this process on one address and port (`SO_REUSEPORT`,
    // one per worker, as nginx's `reuseport` makes them) share one RDMA listener: whichever
    // accepts a connection claims its registration.
    let mut listeners = LISTENERS.lock();
    if let Some(shared) = listeners.values().find(|l| l.rdma.addr() == local).cloned() {
        listeners.insert(fd, shared);
        log_at!(Level::Debug, "RDMA listener on {local} shared with fd {fd}");
        return true;
    }
    let grouped = sys::reuse_port(fd);
    match engine.listen(local, only_v6, BACKLOG, Arc::new(ShimAcceptor)) {
        Ok(listener) => {
            // Other processes listening on the port with SO_REUSEPORT claim through it.
            let door = grouped.then(|| super::group::open(local)).flatten();
            listeners.insert(
                fd,
                Arc::new(Side {
                    rdma: listener,
                    _door: door,
                }),
            );
            drop(listeners);
            log_at!(Level::Debug, "RDMA listener on {local} (fd {fd})");
            true
        }
        Err(e) => {
            drop(listeners);
            if grouped {
                // Another process of its group may hold it: accepts ask that one, and this
                // process takes it over when that one closes it. One this process took over
                // already serves this fd too.
                let mut table = GROUPED.lock();
                let taken = table
                    .values()
                    .find(|g| g.addr == local)
                    .and_then(|g| g.taken.clone());
                let held = taken.is_some();
                table.insert(fd, Grouped { addr: local, taken });
                drop(table);
                super::group::changed();
                if held {
                    log_at!(Level::Debug, "RDMA listener on {local} shared with fd {fd}");
                    return false;
                }
            }
            log_at!(Level::Info, "no RDMA listener on {local}: {e}");
            false
        }
    }
}

/// The app closed (or replaced) a listening fd: its RDMA listener closes with the last copy.
pub fn close_side_listener(fd: c_int) {
    let old = LISTENERS.lock().remove(&fd);
    drop(old);
}

/// The app closed (or replaced, or listens anew on) a listening fd without an RDMA listener of
/// its own. The RDMA listener this process took over for its address closes with the last.
pub fn forget_grouped(fd: c_int) {
    let old = GROUPED.lock().remove(&fd);
    if old.is_some() {
        // Dropped outside the table's lock (closing an RDMA listener waits on the engine).
        drop(old);
        super::group::changed();
    }
}

/// `new` is a copy (dup) of the listening fd `old`, which has no RDMA listener of its own.
pub fn copy_grouped(old: c_int, new: c_int) {
    let mut table = GROUPED.lock();
    if let Some(g) = table.get(&old).cloned() {
        table.insert(new, g);
    }
}

/// Where `accept()` on an `SO_REUSEPORT` listener without an RDMA listener of its own claims
/// ([`claim_in_group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Another process of the group holds the RDMA listener on this address.
    Elsewhere(SocketAddr),
    /// This process took it over: its own registrations.
    Here,
}

/// Where `listener`'s accepted connections are claimed, when it is an `SO_REUSEPORT` socket
/// whose RDMA listener was held by another process of its group when it listened.
pub fn grouped(listener: c_int) -> Option<Group> {
    GROUPED.lock().get(&listener).map(|g| match g.taken {
        Some(_) => Group::Here,
        None => Group::Elsewhere(g.addr),
    })
}

/// `accept()` returned `fd` from `peer` on an `SO_REUSEPORT` listener of `group`: the process
/// that holds the RDMA listener claims the connection's registration, as for a fork child
/// ([`super::group`]), or this process does when it took it over. False when it cannot be
/// asked or holds none (the caller counts the connection as TCP).
pub fn claim_in_group(group: Group, fd: c_int, peer: SocketAddr) -> bool {
    let local = match group {
        Group::Here => return claim_and_swap(fd, peer) != Claim::None,
        Group::Elsewhere(local) => local,
    };
    let Some(door) = super::group::knock(local) else {
        return false;
    };
    let door = std::os::fd::AsRawFd::as_raw_fd(&door);
    super::delegate::claim_through(door, fd, peer) == super::delegate::Delegated::Done
}

/// The addresses of this process's `SO_REUSEPORT` listeners whose RDMA listener another
/// process holds (the serving thread watches those holders).
pub(super) fn held_elsewhere() -> std::collections::BTreeSet<SocketAddr> {
    GROUPED
        .lock()
        .values()
        .filter(|g| g.taken.is_none())
        .map(|g| g.addr)
        .collect()
}

/// What [`take_over`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TakeOver {
    /// This process holds the RDMA listener on the address now (or did already).
    Taken,
    /// Another process holds it.
    HeldElsewhere,
    /// No listener of this process is on the address any more.
    Gone,
}

/// The holder of the RDMA listener on `addr` closed it (or exited): this process, whose
/// `SO_REUSEPORT` listeners on `addr` had none, opens it (with its door) for all of them.
/// Under the table's lock, so the app's close of one of them waits for it and then drops it.
pub(super) fn take_over(addr: SocketAddr) -> TakeOver {
    let mut table = GROUPED.lock();
    let mut fds = table.iter().filter(|(_, g)| g.addr == addr);
    let Some((&fd, first)) = fds.next() else {
        return TakeOver::Gone;
    };
    if first.taken.is_some() {
        return TakeOver::Taken;
    }
    let Some(engine) = engine() else {
        return TakeOver::HeldElsewhere;
    };
    let only_v6 = addr.is_ipv6().then(|| sys::only_v6(fd)).flatten();
    match engine.listen(addr, only_v6, BACKLOG, Arc::new(ShimAcceptor)) {
        Ok(listener) => {
            let side = Arc::new(Side {
                rdma: listener,
                _door: super::group::open(addr),
            });
            for g in table.values_mut().filter(|g| g.addr == addr) {
                g.taken = Some(Arc::clone(&side));
            }
            log_at!(
                Level::Info,
                "RDMA listener on {addr} taken over: its holder closed it"
            );
            TakeOver::Taken
        }
        Err(e) => {
            log_at!(Level::Debug, "RDMA listener on {addr} still held: {e}");
            TakeOver::HeldElsewhere
        }
    }
}

/// `new` is a copy (dup) of the listening fd `old`. False if `old` has no RDMA listener.
pub fn copy_side_listener(old: c_int, new: c_int) -> bool {
    let mut map = LISTENERS.lock();
    let Some(l) = map.get(&old).cloned() else {
        return false;
    };
    map.insert(new, l);
    true
}

/// What `accept()`'s claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Swapped: counted when the client answers CLAIM.
    Swapped,
    /// The client registered but gave up before this accept (no CLAIM in its bound): it is on
    /// TCP already, and so is this connection (`TIMEOUT`).
    GaveUp,
    /// Nothing registered for this peer.
    None,
}

/// `accept()` returned `fd` from `peer` on a listener with an RDMA listener: claims its
/// registration and swaps.
pub fn claim_and_swap(fd: c_int, peer: SocketAddr) -> Claim {
    if super::FORKED.load(std::sync::atomic::Ordering::Acquire) {
        // A pre-fork child: the listening process holds the registrations and the engine.
        return match super::delegate::claim(fd, peer) {
            super::delegate::Delegated::None => Claim::None,
            super::delegate::Delegated::Done => Claim::Swapped,
        };
    }
    let found = take_registration(peer, now());
    let pending = match found {
        // No HELLO: a client that came through a Service's virtual IP is connected back to.
        None if super::back::accept(fd, peer) => return Claim::Swapped,
        None => return Claim::None,
        Some(Found::Fresh(p)) if p.conn.is_alive() => p,
        Some(Found::Fresh(_) | Found::Stale) => {
            record(Role::Server, fd, Some(peer), Path::Tcp, Reason::Timeout);
            return Claim::GaveUp;
        }
    };
    match swap(fd) {
        Ok(s) => {
            super::set_direct(fd, &pending.conn);
            pending.conn.attach(
                s.local,
                Attach {
                    kept: Some(s.kept),
                    handshake: Handshake::Claim,
                    on_event: on_event(Role::Server, fd, Some(peer), s.broken),
                    on_bytes: Some(count_bytes),
                    claim_by: None,
                    give_back: None,
                },
            );
        }
        Err(e) => {
            log_at!(Level::Info, "server fd {fd}: swap failed ({e}): resetting");
            pending.conn.abort();
            reset(fd);
            record(Role::Server, fd, Some(peer), Path::Tcp, Reason::RdmaError);
        }
    }
    Claim::Swapped
}

/// Takes the registration of `peer` ([`PendingTable::claim`]).
pub(super) fn take_registration(peer: SocketAddr, now: Instant) -> Option<Found<Conn>> {
    PENDING.lock().claim(peer, now)
}

/// In a fork child: the listeners and registrations are the parent's; forgotten, not closed.
pub(super) fn after_fork_child() {
    if let Some(mut listeners) = LISTENERS.after_fork() {
        std::mem::forget(std::mem::take(&mut *listeners));
    }
    if let Some(mut grouped) = GROUPED.after_fork() {
        std::mem::forget(std::mem::take(&mut *grouped));
    }
    if let Some(mut pending) = PENDING.after_fork() {
        pending.forget_all();
    }
}

/// For the fork test: holds both tables while `f` runs; counts listeners.
#[cfg(test)]
pub(super) mod tests_support {
    use super::{GROUPED, LISTENERS, PENDING};

    pub fn hold_tables(f: impl FnOnce()) {
        let listeners = LISTENERS.lock();
        let pending = PENDING.lock();
        f();
        drop((listeners, pending));
    }

    pub fn listeners_len() -> usize {
        LISTENERS.lock().len()
    }

    /// Notes `fd` as an `SO_REUSEPORT` listener on `addr` whose RDMA listener is held
    /// elsewhere.
    pub fn group_fd(fd: libc::c_int, addr: std::net::SocketAddr) {
        GROUPED
            .lock()
            .insert(fd, super::Grouped { addr, taken: None });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::negotiation::Message;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_table_finds_v4_mapped_clients_and_expires_entries() {
        let t0 = Instant::now();
        let mut t: PendingTable<u32> = PendingTable::new(Duration::from_secs(10));
        assert!(t.register(sa("[::ffff:10.0.0.2]:4000"), 1, 7, t0, |_| true));
        let Some(Found::Fresh(p)) = t.claim(sa("10.0.0.2:4000"), t0) else {
            panic!("not found by its IPv4 form");
        };
        assert_eq!((p.conn, p.nonce), (1, 7));
        assert!(t.claim(sa("10.0.0.2:4000"), t0).is_none(), "claimed once");
        t.register(sa("10.0.0.3:1"), 2, 0, t0, |_| true);
        assert!(
            matches!(
                t.claim(sa("10.0.0.3:1"), t0 + Duration::from_secs(11)),
                Some(Found::Stale)
            ),
            "an expired registration: its client gave up"
        );
        assert!(t.claim(sa("10.0.0.3:1"), t0).is_none(), "and it is gone");
        t.register(sa("10.0.0.4:1"), 3, 0, t0, |_| true);
        t.register(sa("10.0.0.5:1"), 4, 0, t0 + Duration::from_secs(20), |_| {
            true
        });
        assert_eq!(t.len(), 1, "a registration drops expired ones");
        t.register(sa("10.0.0.6:1"), 5, 0, t0 + Duration::from_secs(20), |c| {
            *c != 4
        });
        assert_eq!(t.len(), 1, "and dead ones");
    }

    #[test]
    fn a_second_registration_for_a_live_address_never_displaces_the_first() {
        let t0 = Instant::now();
        let mut t: PendingTable<u32> = PendingTable::new(Duration::from_secs(10));
        assert!(t.register(sa("10.0.0.2:4000"), 1, 7, t0, |_| true));
        // The attacker's HELLO for the same address, before or after the victim's.
        assert!(!t.register(sa("10.0.0.2:4000"), 2, 8, t0, |_| true));
        assert!(!t.register(sa("[::ffff:10.0.0.2]:4000"), 3, 9, t0, |_| true));
        let Some(Found::Fresh(p)) = t.claim(sa("10.0.0.2:4000"), t0) else {
            panic!("the first registration is gone");
        };
        assert_eq!((p.conn, p.nonce), (1, 7));
        // A registration whose client gave up (dead) or expired makes room.
        assert!(t.register(sa("10.0.0.3:1"), 4, 0, t0, |_| true));
        assert!(t.register(sa("10.0.0.3:1"), 5, 0, t0, |c| *c != 4));
        assert!(t.register(sa("10.0.0.4:1"), 6, 0, t0, |_| true));
        assert!(
            t.register(sa("10.0.0.4:1"), 7, 0, t0 + Duration::from_secs(11), |_| {
                true
            })
        );
    }

    #[test]
    fn judge_checks_the_hello_its_source_and_the_policy() {
        let hello = Message::Hello(Hello {
            flags: 0,
            nonce: 42,
            client: sa("198.18.0.2:5000"),
        })
        .encode();
        let from = Some(IpAddr::from([198, 18, 0, 2]));
        assert_eq!(
            judge(&hello, 80, from, |_, _| true).map(|h| h.nonce),
            Ok(42)
        );
        let mapped = Some(IpAddr::V6(
            std::net::Ipv4Addr::new(198, 18, 0, 2).to_ipv6_mapped(),
        ));
        assert_eq!(
            judge(&hello, 80, mapped, |_, _| true).map(|h| h.nonce),
            Ok(42),
            "a v4-mapped source is the same address"
        );
        assert_eq!(
            judge(&hello, 80, from, |port, c| port != 80 || c.port() != 5000),
            Err(Message::refuse(42, Reason::Policy))
        );
        // A HELLO naming another host's connection, or from an unknown source.
        for other in [Some(IpAddr::from([198, 18, 0, 1])), None] {
            assert_eq!(
                judge(&hello, 80, other, |_, _| true),
                Err(Message::refuse(42, Reason::PeerRefused)),
                "{other:?}"
            );
        }
        assert_eq!(
            judge(b"junk", 80, from, |_, _| true),
            Err(Message::refuse(0, Reason::PeerRefused))
        );
        let back = Message::Hello(Hello {
            flags: negotiation::HELLO_BACK,
            nonce: 43,
            client: sa("198.18.0.2:5000"),
        })
        .encode();
        assert_eq!(
            judge(&back, 80, from, |_, _| true),
            Err(Message::refuse(43, Reason::PeerRefused)),
            "a connect made back to a client is not for the app's port"
        );
    }
}
